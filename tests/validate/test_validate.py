"""`prefdata validate`: exit codes on clean, dirty and broken inputs; raw and prepared input; the
tokenizer's token-level checks; --baseline (only regressions fail); --against (prompt_leak); output."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.validate.command import validate

REPO = Path(__file__).resolve().parents[2]
PR_POLICY = str(REPO / "checks" / "pr.toml")


def clean_rows(n: int = 30) -> list[dict]:
    # Alternate which half is longer: no length bias, so pr.toml's limits hold.
    return [
        {
            "prompt": f"Question {i}: how do I {topic}?",
            "chosen": f"Here is a careful answer about {topic}, number {i}." + (" More detail." if i % 2 else ""),
            "rejected": f"No idea about {topic} {i}." + ("" if i % 2 else " Really none at all, sorry."),
        }
        for i, topic in enumerate(["bake bread", "fix a bike", "learn chess", "plant roses", "paint walls", "sail"] * (n // 6 + 1))
    ][:n]


def write_jsonl(path: Path, rows: list, extra_lines: list[str] = ()) -> Path:
    lines = [json.dumps(r) for r in rows] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def run(path, **kwargs):
    kwargs.setdefault("progress", False)
    return validate(str(path), **kwargs)


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.rglob("*")) if p.is_file()}


# ----------------------------------------------------------------------------- exit codes


def test_clean_input_exits_0(tmp_path, capsys):
    data = write_jsonl(tmp_path / "clean.jsonl", clean_rows())
    for policy in (None, PR_POLICY):
        result = run(data, policy=policy)
        assert result.exit_code == 0, result.report["findings"]
        assert result.report["status"] == "pass" and result.report["accounting"]["rows_in"] == 30
    assert "PASS" in capsys.readouterr().out


def test_dirty_input_exits_1_at_error_severity(tmp_path):
    rows = clean_rows()
    rows.insert(4, {"prompt": "Say hi", "chosen": "Hi!", "rejected": "Hi!"})  # line 5
    data = write_jsonl(tmp_path / "dirty.jsonl", rows)
    # The default policy drops identical pairs (prepare would): not an error, exit 0.
    default = run(data)
    assert default.exit_code == 0 and default.report["flags"][F.IDENTICAL]["severity"] == "drop"
    # pr.toml makes it an error: exit 1, pointing at the line.
    strict = run(data, policy=PR_POLICY)
    assert strict.exit_code == 1 and strict.report["status"] == "fail"
    assert strict.report["flags"][F.IDENTICAL]["examples"][0]["source_line"] == 5
    assert main(["validate", str(data), "--policy", PR_POLICY, "--no-progress"]) == 1


def test_unreadable_record_exits_1_with_its_line(tmp_path):
    data = write_jsonl(tmp_path / "bad.jsonl", clean_rows(10), ['{"prompt": "x", "chosen": '])
    result = run(data)
    assert result.exit_code == 1
    (reason,) = result.report["quarantine"]["reasons"]
    assert reason["rows"] == [{"source_file": str(data), "source_line": 11}] or reason["rows"][0]["source_line"] == 11


@pytest.mark.parametrize(
    "make_args",
    [
        lambda t: [str(t / "missing.jsonl")],
        lambda t: [str(write_jsonl(t / "kto.jsonl", [{"prompt": "p", "completion": "c", "label": True}] * 3))],
        lambda t: [str(t / "empty.jsonl")],
        lambda t: [str(write_jsonl(t / "ok.jsonl", clean_rows(3))), "--policy", str(t / "nope.toml")],
        lambda t: [str(write_jsonl(t / "ok.jsonl", clean_rows(3))), "--policy", str(_bad_policy(t))],
        lambda t: [str(write_jsonl(t / "ok.jsonl", clean_rows(3))), "--baseline", str(t / "missing.json")],
        lambda t: [str(write_jsonl(t / "ok.jsonl", clean_rows(3))), "--baseline", str(_not_a_report(t))],
        lambda t: [str(write_jsonl(t / "ok.jsonl", clean_rows(3))), "--against", str(t / "missing-eval.jsonl")],
    ],
    ids=["missing", "not-preference-data", "empty", "missing-policy", "unknown-flag", "missing-baseline", "bad-baseline", "missing-against"],
)
def test_broken_input_exits_2_with_one_line(tmp_path, capsys, make_args):
    (tmp_path / "empty.jsonl").write_text("")
    assert main(["validate", *make_args(tmp_path), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("prefdata validate: error:") and "\n" not in err and "Traceback" not in err


def _bad_policy(tmp: Path) -> Path:
    path = tmp / "bad.toml"
    path.write_text('[flags]\nnot_a_flag = "error"\n')
    return path


def _not_a_report(tmp: Path) -> Path:
    path = tmp / "baseline.json"
    path.write_text('{"hello": 1}')
    return path


def test_bad_format_is_a_usage_error(tmp_path):
    with pytest.raises(PrefdataError):
        run(write_jsonl(tmp_path / "ok.jsonl", clean_rows(3)), format="yaml")


# ----------------------------------------------------------------------------- token-level checks


def test_tokenizer_adds_token_level_checks(tmp_path, tiny_tokenizer_dir):
    data = write_jsonl(tmp_path / "d.jsonl", clean_rows(12))
    text_only = run(data).report
    assert text_only["lengths"]["unit"] == "characters" and not text_only["truncation"]["available"]
    assert not set(text_only["flags"]) & F.TOKEN_FLAGS
    tokens = run(data, tokenizer=tiny_tokenizer_dir, max_length=24, max_prompt_length=16, policy=PR_POLICY)
    report = tokens.report
    assert report["lengths"]["unit"] == "tokens" and report["truncation"]["available"]
    assert report["truncation"]["any_rate"] > 0
    assert F.COMPLETION_TRUNCATED in report["flags"]  # answers lose their EOS at 24 tokens
    roomy = run(data, tokenizer=tiny_tokenizer_dir, policy=PR_POLICY)
    assert roomy.exit_code == 0 and roomy.report["truncation"]["any_rate"] == 0


def test_identical_after_truncation_fails_the_pr_policy(tmp_path, tiny_tokenizer_dir):
    long = "word " * 60
    rows = clean_rows(12) + [{"prompt": "Tell me a story", "chosen": long + "happy end", "rejected": long + "sad end"}]
    data = write_jsonl(tmp_path / "d.jsonl", rows)
    assert run(data, policy=PR_POLICY).exit_code == 0  # text differs: fine without a tokenizer
    result = run(data, tokenizer=tiny_tokenizer_dir, max_length=40, policy=PR_POLICY)
    assert result.report["flags"][F.IDENTICAL_AFTER_TRUNCATION]["examples"][0]["source_line"] == 13
    assert result.exit_code == 1


# ----------------------------------------------------------------------------- prepared OUT/


def test_prepared_out_is_rechecked_and_left_untouched(tmp_path, tiny_tokenizer_dir):
    from prefdata.prepare import prepare

    rows = clean_rows(20)
    rows.append(dict(rows[3]))  # duplicate pair: warn, kept
    rows.append({"prompt": "Same?", "chosen": "Yes", "rejected": "Yes"})  # identical: dropped by prepare
    raw = write_jsonl(tmp_path / "raw.jsonl", rows)
    out = tmp_path / "OUT"
    prepare(str(raw), str(out), tokenizer=tiny_tokenizer_dir, progress=False)
    before = tree_digest(out)

    result = run(out)
    report = result.report
    assert report["meta"]["input_kind"] == "prepared"
    assert report["accounting"]["rows_in"] == 21  # the stored rows; the identical pair was dropped
    assert report["flags"][F.DUPLICATE_PAIR]["count"] == 1
    assert report["lengths"]["unit"] == "tokens" and not report["truncation"]["available"]
    assert result.exit_code == 0
    # Strict policy: still no error (duplicate_pair is a warning), but limits are checked.
    assert run(out, policy=PR_POLICY).exit_code == 0
    assert tree_digest(out) == before  # validate never modifies INPUT


def test_prepared_out_against_other_split(tmp_path, tiny_tokenizer_dir):
    from prefdata.prepare import prepare

    rows = clean_rows(12)
    raw = write_jsonl(tmp_path / "raw.jsonl", rows)
    eval_raw = write_jsonl(tmp_path / "eval.jsonl", [rows[2], {"prompt": "unrelated", "chosen": "a", "rejected": "b"}])
    prepare(str(raw), str(tmp_path / "OUT"), tokenizer=tiny_tokenizer_dir, progress=False)
    prepare(str(eval_raw), str(tmp_path / "EVAL"), tokenizer=tiny_tokenizer_dir, progress=False)
    for other in (eval_raw, tmp_path / "EVAL"):
        report = run(tmp_path / "OUT", against=str(other)).report
        assert report["flags"][F.PROMPT_LEAK]["count"] == 1
        assert report["flags"][F.PROMPT_LEAK]["examples"][0]["source_line"] == 3


# ----------------------------------------------------------------------------- --against, --baseline


def test_against_flags_prompt_leak(tmp_path):
    rows = clean_rows(12)
    train = write_jsonl(tmp_path / "train.jsonl", rows)
    evals = write_jsonl(tmp_path / "eval.jsonl", [{"prompt": "  " + rows[5]["prompt"], "chosen": "x", "rejected": "y"}])
    result = run(train, against=str(evals))
    leak = result.report["flags"][F.PROMPT_LEAK]
    assert leak["count"] == 1 and leak["examples"][0]["source_line"] == 6 and leak["severity"] == "warn"
    assert result.exit_code == 0
    assert run(train, against=str(evals), policy=PR_POLICY).exit_code == 1
    assert F.PROMPT_LEAK not in run(train).report["flags"]


def test_baseline_only_regressions_fail(tmp_path, capsys):
    base_rows = clean_rows(30)
    base_rows.insert(2, {"prompt": "Old problem", "chosen": "same", "rejected": "same"})
    base = write_jsonl(tmp_path / "base.jsonl", base_rows)
    base_report = tmp_path / "base-report.json"
    first = run(base, policy=PR_POLICY, format="json", output=str(base_report))
    assert first.exit_code == 1  # the known problem fails without a baseline
    assert json.loads(base_report.read_text())["flagged_rows"]

    # Head: the same rows reordered plus a clean new row: no regression, exit 0.
    head_rows = list(reversed(base_rows)) + [{"prompt": "New clean question", "chosen": "A long good answer.", "rejected": "Bad."}]
    head = write_jsonl(tmp_path / "head.jsonl", head_rows)
    same = run(head, policy=PR_POLICY, baseline=str(base_report))
    assert same.exit_code == 0 and same.report["baseline"]["regressions"] == 0
    assert same.report["baseline"]["new_flagged_rows"] == 0

    # Head with a new identical pair: exit 1, and the annotations point only at the new line.
    head_rows.append({"prompt": "New problem", "chosen": "dup", "rejected": "dup"})
    head = write_jsonl(tmp_path / "head.jsonl", head_rows)
    capsys.readouterr()
    worse = run(head, policy=PR_POLICY, baseline=str(base_report), format="github")
    assert worse.exit_code == 1 and worse.report["baseline"]["regressions"] == 1
    annotations = [line for line in capsys.readouterr().out.splitlines() if line.startswith("::")]
    assert annotations == [
        f"::notice title=prefdata::FAIL (2 of {len(head_rows)} rows with errors, 0 with warnings)",  # the verdict, counts as everywhere
        f"::error file={_gh(head)},line={len(head_rows)},title=prefdata%3A identical::"
        "chosen and rejected are identical (prompt: New problem)"
    ]
    assert worse.report["baseline"]["flag_deltas"][F.IDENTICAL] == {"before": 1, "after": 2, "delta": 1}


def _gh(path: Path) -> str:
    from prefdata.report.render_github import _workspace_path

    return _workspace_path(str(path)).replace(":", "%3A").replace(",", "%2C")


# ----------------------------------------------------------------------------- output


def test_github_format_writes_annotations_and_step_summary_only(tmp_path, monkeypatch, capsys):
    work = tmp_path / "repo"
    work.mkdir()
    rows = clean_rows(12)
    rows.append({"prompt": "p", "chosen": "x", "rejected": "x"})
    data = write_jsonl(work / "train.jsonl", rows)
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    monkeypatch.setenv("GITHUB_WORKSPACE", str(work))
    before = tree_digest(work)
    result = run(data, policy=PR_POLICY, format="github")
    out = capsys.readouterr().out
    assert result.exit_code == 1
    assert "::error file=train.jsonl,line=13,title=prefdata%3A identical::" in out
    assert summary.read_text(encoding="utf-8").startswith("## ❌ prefdata validate: FAIL")
    assert tree_digest(work) == before  # nothing written next to the data


@pytest.mark.parametrize("fmt", ["json", "markdown", "html", "text"])
def test_output_file_in_each_format(tmp_path, fmt, capsys):
    data = write_jsonl(tmp_path / "d.jsonl", clean_rows(8))
    target = tmp_path / f"report.{fmt}"
    result = run(data, format=fmt, output=str(target))
    text = target.read_text(encoding="utf-8")
    assert text == result.rendered
    if fmt == "json":
        loaded = json.loads(text)
        assert loaded["schema_version"] == 1 and loaded["accounting"]["rows_in"] == 8
    elif fmt == "html":
        assert text.startswith("<!doctype html>")
    elif fmt == "markdown":
        assert text.startswith("## ✅ prefdata validate: PASS")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["d.jsonl", target.name])


def test_output_into_input_is_refused(tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", clean_rows(3))
    with pytest.raises(PrefdataError):
        run(data, format="json", output=str(data))
    with pytest.raises(PrefdataError):
        run(tmp_path, format="json", output=str(tmp_path / "report.json"))


def test_annotations_name_files_of_a_directory_input_from_the_repo_root(tmp_path, monkeypatch, capsys):
    (tmp_path / "data").mkdir()
    write_jsonl(tmp_path / "data" / "train.jsonl", clean_rows(6) + [{"prompt": "p", "chosen": "x", "rejected": "x"}])
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GITHUB_WORKSPACE", str(tmp_path))
    monkeypatch.delenv("GITHUB_STEP_SUMMARY", raising=False)
    run("data", policy=PR_POLICY, format="github")
    assert "::error file=data/train.jsonl,line=7,title=prefdata%3A identical::" in capsys.readouterr().out


def test_prepared_out_keeps_flags_only_the_original_tokenization_knows(tmp_path, tiny_tokenizer_dir):
    from datasets import load_from_disk

    from prefdata.prepare import prepare

    raw = write_jsonl(tmp_path / "raw.jsonl", clean_rows(12))
    out = tmp_path / "OUT"
    prepare(str(raw), str(out), tokenizer=tiny_tokenizer_dir, max_length=24, progress=False)
    stored = sum(F.COMPLETION_TRUNCATED in flags for flags in load_from_disk(str(out))["flags"])
    assert stored > 0
    report = run(out).report
    assert report["flags"][F.COMPLETION_TRUNCATED]["count"] == stored


def test_scored_records_are_named_once_in_the_flag_examples(tmp_path, capsys):
    """all-pairs makes three pairs per record, each flagged: the summary lists :1, :2, :3, not :1, :1, :1."""
    rows = [{"prompt": f"Question {i}?", "completions": [f"It is {i}.", f"It is  {i}.", f"It is {i}. "], "scores": [3, 2, 1]}
            for i in range(4)]
    data = write_jsonl(tmp_path / "scored.jsonl", rows)
    assert main(["validate", str(data), "--pairing", "all-pairs", "--no-progress"]) == 1
    line = next(x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("whitespace_only"))
    assert line.endswith(f"e.g. {data}:1, :2, :3"), line


def test_no_readable_record_is_an_input_error_in_validate_and_prepare_alike(tmp_path, tiny_tokenizer_dir, capsys):
    """Exit 2 (input error) from both commands when every record is unreadable; one unreadable record
    among readable ones is a finding: validate 1 (quarantine is an error there), prepare 0."""
    broken = write_jsonl(tmp_path / "broken.jsonl", [], ['{"prompt": "x", "chosen": ', "not json"])
    codes = {}
    for command, argv in (("validate", []), ("prepare", [str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir])):
        codes[command] = main([command, str(broken), *argv, "--no-progress"])
        captured = capsys.readouterr()
        err = [line for line in captured.err.splitlines() if line.strip()]
        assert len(err) == 1 and err[0].startswith(f"prefdata {command}: error: no record of {broken} could be read: "
                                                    "all 2 were quarantined, e.g. invalid JSON"), err
        if command == "validate":
            assert "quarantined 1×: invalid JSON" in captured.out  # the report still shows every reason
    assert codes == {"validate": 2, "prepare": 2}
    result = run(broken, format="json", output=str(tmp_path / "r.json"))  # Python: the report, exit_code 2, the line
    assert result.exit_code == 2 and result.report["outcomes"]["quarantined"] == 2 and "no record" in result.problem

    mixed = write_jsonl(tmp_path / "mixed.jsonl", clean_rows(6), ["not json"])
    assert main(["validate", str(mixed), "--no-progress"]) == 1
    assert main(["prepare", str(mixed), str(tmp_path / "out-mixed"), "--tokenizer", tiny_tokenizer_dir, "--no-progress"]) == 0


@pytest.mark.parametrize("suffix, starts", [(".json", "{"), (".md", "## ✅ prefdata validate: PASS"),
                                            (".html", "<!doctype html>"), (".txt", "prefdata validate")])
def test_output_alone_takes_its_format_from_the_suffix(tmp_path, suffix, starts, capsys):
    # `validate data --output report.json` (no --format) writes JSON, not the text report under a .json name
    data = write_jsonl(tmp_path / "d.jsonl", clean_rows(8))
    target = tmp_path / f"report{suffix}"
    run(data, output=str(target))
    assert target.read_text(encoding="utf-8").startswith(starts)
    if suffix == ".json":
        assert json.loads(target.read_text(encoding="utf-8"))["accounting"]["rows_in"] == 8
    if suffix != ".txt":
        assert "prefdata validate" in capsys.readouterr().out  # the terminal still gets the text report
