"""prepare/validate on scored completions: pairs made, both ledgers whole, the same OUT on every
path (workers, batch size, worker writes), the report's scored section, the flags."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.cli import build_parser


def _uf(text_scores: list[tuple[str, dict[str, str]]]) -> list[dict]:
    return [{"model": f"m{i}", "response": text, "annotations": {k: {"Rating": v} for k, v in ratings.items()},
             "fine-grained_score": None, "overall_score": 5.0} for i, (text, ratings) in enumerate(text_scores)]


def _records() -> list[str]:
    rows: list[dict | str] = []
    for i in range(12):  # UltraFeedback raw: four rated completions
        rows.append({"instruction": f"Question {i}: name a colour.", "source": "evol", "completions": _uf([
            (f"Red {i}.", {"helpfulness": "5", "honesty": "5"}), (f"Green {i}.", {"helpfulness": "3", "honesty": "4"}),
            (f"Blue {i}.", {"helpfulness": "4", "honesty": "4"}), (f"Grey {i}.", {"helpfulness": "1", "honesty": "2"}),
        ])})
    for i in range(6):  # generic scores, with a tie among them
        rows.append({"prompt": f"Sum {i}+{i}?", "completions": [str(2 * i), str(2 * i + 1), f"{2 * i}!"],
                     "scores": [1.0, 0.25, 1.0], "id": i})
    rows.append({"prompt": "All equal", "completions": ["a", "b", "c"], "scores": [2, 2, 2]})  # ties
    rows.append({"prompt": "Alone", "completions": ["only"], "scores": [3]})  # single completion
    rows.append({"prompt": "Close", "completions": ["x", "y"], "scores": [0.5, 0.25]})  # below a margin of 0.5
    rows.append({"prompt": "Same text", "completions": ["dup", "dup"], "scores": [1, 0]})  # identical: dropped by policy
    rows.append({"instruction": "Rank them", "generations": ["third", "first", "second"], "ranks": [3, 1, 2]})
    rows.append({"prompt": "Plain pair", "chosen": "yes", "rejected": "no"})
    rows.append("{not json")
    rows.append({"prompt": "p", "completions": ["a", "b"], "scores": [1]})  # malformed: quarantined
    return [r if isinstance(r, str) else json.dumps(r) for r in rows]


RECORDS = len(_records())


@pytest.fixture
def raw(tmp_path) -> Path:
    path = tmp_path / "scored.jsonl"
    path.write_text("\n".join(_records()) + "\n", encoding="utf-8")
    return path


def _prepare(raw, out, tok, **kw):
    from prefdata.prepare import prepare

    kw.setdefault("workers", 1)
    return prepare(raw, out, tokenizer=tok, progress=False, min_score_margin=0.5, **kw)


def _lines(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


@pytest.mark.parametrize("pairing, pairs_per_uf, pairs_per_generic", [
    ("best-worst", 1, 1), ("best-vs-random-lower", 1, 1), ("all-pairs", 6, 2), ("top-k", 2, 2),
])
def test_every_record_and_pair_is_accounted_for(raw, tmp_path, tiny_tokenizer_dir, pairing, pairs_per_uf, pairs_per_generic) -> None:
    import datasets

    result = _prepare(raw, tmp_path / "out", tiny_tokenizer_dir, pairing=pairing)
    out = tmp_path / "out"
    acc = json.loads((out / "manifest.json").read_text())["row_accounting"]
    # UF means 5, 3.5, 4, 1.5: with a margin of 0.5 all six pairs pass (4 vs 3.5 exactly); top-k: 2.
    # Generic 1, 0.25, 1: the tie is never paired; ranks 1 < 2 < 3 make 3 with all-pairs.
    rank_pairs = {"all-pairs": 3, "top-k": 2}.get(pairing, 1)
    made = 12 * pairs_per_uf + 6 * pairs_per_generic + 1 + rank_pairs  # + 1: "dup" vs "dup"
    assert acc["records_in"] == RECORDS
    assert (acc["records_unpaired"], acc["records_quarantined"]) == (3, 2)
    assert acc["records_paired"] == RECORDS - 5
    assert acc["records_in"] == acc["records_paired"] + acc["records_unpaired"] + acc["records_quarantined"]
    assert acc["pairs_made"] == made + 1  # + the plain pair
    assert acc["pairs_made"] == acc["pairs_kept"] + acc["pairs_dropped"] and acc["pairs_dropped"] == 1  # "dup" vs "dup"
    assert acc["rows_in"] == acc["rows_out"] + acc["rows_dropped"] + acc["rows_quarantined"]
    assert acc["completions_in"] == 12 * 4 + 6 * 3 + 3 + 1 + 2 + 2 + 3
    assert acc["completions_in"] == acc["completions_paired"] + acc["completions_unpaired"]
    assert (result.rows_out, result.rows_quarantined) == (acc["pairs_kept"], 2)

    data = datasets.load_from_disk(str(out))
    dropped, quarantined = _lines(out / "dropped.jsonl"), _lines(out / "quarantine.jsonl")
    assert len(data) == acc["pairs_kept"] and len(quarantined) == 2
    unpaired = [d for d in dropped if "unpaired" in d]
    assert sorted(d["unpaired"] for d in unpaired) == ["below_margin", "single_completion", "ties"]
    assert len(dropped) - len(unpaired) == acc["pairs_dropped"]
    # Every input line is in exactly one ledger: lines with pairs, lines without, quarantined lines.
    pair_lines = set(data["source_line"]) | {d["source_line"] for d in dropped if "unpaired" not in d}
    other = [d["source_line"] for d in unpaired] + [q["source_line"] for q in quarantined]
    assert not pair_lines & set(other) and len(other) == len(set(other))
    assert len(pair_lines) + len(other) == RECORDS
    # Each pair keeps its group id and both scores; chosen beats rejected by at least the margin.
    for row in data:
        if row["prompt"] == "Plain pair":
            assert row["group_id"] is None
            continue
        assert len(row["group_id"]) == 16
        if row["reward_chosen"] is not None:
            assert row["reward_chosen"] - row["reward_rejected"] >= 0.5
        else:
            assert row["rank_rejected"] - row["rank_chosen"] >= 0.5
    groups = {}
    for row in data:
        groups.setdefault(row["source_line"], set()).add(row["group_id"])
    assert all(len(ids) == 1 for ids in groups.values())  # one group id per record
    report = json.loads((out / "report.json").read_text())
    assert report["accounting"] == acc
    assert report["scored"]["pairs_made"] == made and report["scored"]["records"] == RECORDS - 3  # not the pair, not quarantined


def test_same_out_whatever_the_workers_and_batch_size(raw, tmp_path, tiny_tokenizer_dir, monkeypatch) -> None:
    monkeypatch.setattr("prefdata.checks.stream.CHUNK_BYTES", 700)  # many chunks: pairs of one record never split
    monkeypatch.setattr("prefdata.io.chunks.CHUNK_BYTES", 700)
    runs = {
        "one": dict(workers=1),
        "two": dict(workers=2, batch_size=3),
        "batch": dict(workers=1, batch_size=5),
    }
    results = {name: _prepare(raw, tmp_path / name, tiny_tokenizer_dir, pairing="best-vs-random-lower", pairing_seed=7, **kw)
               for name, kw in runs.items()}
    manifests = {name: json.loads((tmp_path / name / "manifest.json").read_text()) for name in runs}
    first = manifests["one"]
    assert first["config"]["pairing"] == "best-vs-random-lower" and first["config"]["pairing_seed"] == 7
    assert first["config"]["min_score_margin"] == 0.5
    for name in ("two", "batch"):
        for key in ("content_hash", "row_accounting", "flag_counts"):
            assert manifests[name][key] == first[key], (name, key)
        for file in ("dropped.jsonl", "quarantine.jsonl"):
            assert (tmp_path / name / file).read_bytes() == (tmp_path / "one" / file).read_bytes()
        a, b = (dict(results[n].report) for n in ("one", name))
        a.pop("generated_at"), b.pop("generated_at")
        assert a == b


def test_the_pairing_seed_picks_differently_and_the_same_seed_the_same(raw, tmp_path, tiny_tokenizer_dir) -> None:
    lines = [json.dumps({"prompt": f"q{i}", "completions": ["best", "b", "c", "d", "e"], "scores": [9, 1, 2, 3, 4]}) for i in range(30)]
    path = tmp_path / "many.jsonl"
    path.write_text("\n".join(lines) + "\n")
    hashes = []
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        _prepare(path, tmp_path / name, tiny_tokenizer_dir, pairing="best-vs-random-lower", pairing_seed=seed)
        hashes.append(json.loads((tmp_path / name / "manifest.json").read_text())["content_hash"])
    assert hashes[0] == hashes[1] != hashes[2]


def test_a_pair_within_the_tie_threshold_is_tied_reward(raw, tmp_path, tiny_tokenizer_dir) -> None:
    """Pairs are never made from equal scores; close ones are generated pairs (chosen_sample), so
    checks.reward marks them tied_reward under the policy's tie threshold (dropped by default)."""
    import datasets
    from prefdata.prepare import prepare

    policy = tmp_path / "ties.toml"
    policy.write_text("[thresholds]\ntie_threshold = 0.3\nmax_dropped_share = false\n")
    prepare(raw, tmp_path / "out", tokenizer=tiny_tokenizer_dir, progress=False, workers=1, policy=str(policy))
    dropped = _lines(tmp_path / "out" / "dropped.jsonl")
    tied = [d for d in dropped if "tied_reward" in d["flags"]]
    assert [d["prompt"] for d in tied] == ["Close"]  # 0.5 vs 0.25: within 0.3
    assert tied[0]["extra"]["chosen_sample"] == 0 and tied[0]["extra"]["group_id"]
    kept = datasets.load_from_disk(str(tmp_path / "out"))
    assert all(r["reward_chosen"] - r["reward_rejected"] > 0.3 for r in kept if r["reward_chosen"] is not None)
    assert not any("reward_disagrees" in r["flags"] for r in kept)  # chosen never scores below rejected


def test_no_pair_made_fails_in_one_line(tmp_path, tiny_tokenizer_dir) -> None:
    path = tmp_path / "ties.jsonl"
    path.write_text(json.dumps({"prompt": "p", "completions": ["a", "b"], "scores": [1, 1]}) + "\n")
    result = _prepare(path, tmp_path / "out", tiny_tokenizer_dir)
    assert result.exit_code == 1 and result.problem.startswith("no pair made: none of the 1 records")
    assert _lines(tmp_path / "out" / "dropped.jsonl")[0]["unpaired"] == "ties"


def test_report_has_the_scored_section_in_every_format(raw, tmp_path, tiny_tokenizer_dir) -> None:
    _prepare(raw, tmp_path / "out", tiny_tokenizer_dir, pairing="all-pairs")
    report = json.loads((tmp_path / "out" / "report.json").read_text())
    scored = report["scored"]
    assert scored["per_prompt"]["completions"]["max"] == 4 and scored["per_prompt"]["ties"]["max"] == 3  # 2, 2, 2
    assert scored["records_with_ties"] == 6 + 1 + 0  # generic rows, all-equal row
    assert {e["reason"]: e["count"] for e in scored["unpaired"]} == {"ties": 1, "single_completion": 1, "below_margin": 1}
    assert set(scored["margins"]) == {"score", "rank"} and scored["margins"]["score"]["min"] >= 0.5
    assert scored["margins"]["score"]["count"] + scored["margins"]["rank"]["count"] == scored["pairs_made"]
    assert sum(scored["margins"]["score"]["histogram"]["counts"]) == scored["margins"]["score"]["count"]
    markdown = (tmp_path / "out" / "report.md").read_text()
    assert "### Scored completions → pairs" in markdown and "records in =" in markdown and "`ties`" in markdown
    assert "score margin" in markdown and "tied completion pairs" in markdown
    html = (tmp_path / "out" / "report.html").read_text()
    assert "Scored completions → pairs" in html and "pairs made per prompt" in html


def test_validate_pairs_scored_records_on_both_text_paths(raw) -> None:
    import contextlib
    import io

    from prefdata.validate.command import validate

    reports = []
    for workers in (1, 2):  # the passes in this process, then in two workers
        with contextlib.redirect_stdout(io.StringIO()):
            reports.append(validate(raw, format="json", progress=False, workers=workers, pairing="all-pairs",
                                    min_score_margin=0.5).report)
    for report in reports:
        report.pop("generated_at")
    assert reports[0] == reports[1]
    assert reports[0]["accounting"]["records_in"] == RECORDS and reports[0]["outcomes"]["unpaired"] == 3


def test_pairing_flags_are_on_prepare_and_validate(capsys) -> None:
    for command in ("prepare", "validate"):
        with pytest.raises(SystemExit):
            build_parser().parse_args([command, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        for flag in ("--pairing {best-worst,best-vs-random-lower,all-pairs,top-k,sweet-spot}", "--pairing-seed", "--min-score-margin",
                     "--rating", "--top-k", "lower rank"):
            assert flag in text, (command, flag)
    args = build_parser().parse_args(["prepare", "r", "o", "--pairing", "top-k", "--top-k", "3", "--min-score-margin", "0.5",
                                      "--rating", "helpfulness", "--pairing-seed", "4"])
    assert (args.pairing, args.top_k, args.min_score_margin, args.rating, args.pairing_seed) == ("top-k", 3, 0.5, "helpfulness", 4)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["prepare", "r", "o", "--min-score-margin", "-1"])


def test_scored_records_lend_their_prompts_to_against(raw) -> None:
    from prefdata.checks.checker import build_leak_index
    from prefdata.core.records import Pair

    index = build_leak_index(raw)
    for prompt in ("Question 3: name a colour.", "All equal", "Alone"):  # paired or not
        assert index.contains_pair(Pair("f", 1, prompt, "a", "b"))
    assert not index.contains_pair(Pair("f", 1, "never seen", "a", "b"))
