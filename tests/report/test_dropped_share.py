"""max_dropped_share: a run that drops too many pairs fails with one line naming the cause and the
setting that keeps them; a chat tokenizer reading plain strings is told about --chat-template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.checks.policy import load_policy
from prefdata.cli import main


def _long_prompt_rows(path: Path, long: int = 6, short: int = 4) -> Path:
    """`long` rows whose prompt alone fills a 40-token budget, then `short` rows that fit."""
    with open(path, "w", encoding="utf-8") as handle:
        for i in range(long + short):
            prompt = " ".join(f"word{j} about topic {i}" for j in range(30)) if i < long else f"short question {i}"
            handle.write(json.dumps({"prompt": prompt, "chosen": f"good answer {i}", "rejected": f"bad reply {i}"}) + "\n")
    return path


def _err_lines(capsys) -> tuple[str, list[str]]:
    captured = capsys.readouterr()
    return captured.out, [line for line in captured.err.splitlines() if line.strip()]


def test_prepare_fails_naming_the_cause_and_max_prompt_length(tmp_path, tiny_tokenizer_dir, capsys):
    raw = _long_prompt_rows(tmp_path / "long.jsonl")
    out = tmp_path / "out"
    code = main(["prepare", str(raw), str(out), "--tokenizer", tiny_tokenizer_dir, "--max-length", "40", "--no-progress"])
    stdout, err = _err_lines(capsys)
    assert code == 1
    assert err == [
        "prefdata prepare: error: dropped 6 of 10 pairs (60.0%), above max_dropped_share 20%: main cause "
        "no_completion_tokens (6 pairs): prompts fill the --max-length 40 budget; --max-prompt-length 20 "
        "cuts prompts from the left and keeps the completions (or raise --max-length)"
    ]
    assert "FAIL" in stdout and "hint: dropped 6 of 10 pairs" in stdout
    report = json.loads((out / "report.json").read_text())
    (hint,) = report["hints"]
    assert (hint["kind"], hint["flag"], hint["count"], hint["setting"]) == (
        "dropped_share", "no_completion_tokens", 6, "--max-prompt-length 20"
    )
    assert "--max-prompt-length 20" in (out / "report.md").read_text()
    assert "--max-prompt-length 20" in (out / "report.html").read_text()
    assert (out / "manifest.json").is_file()  # OUT is whole: the pairs it kept are usable

    # The setting the line names keeps them all: exit 0, no hint.
    code = main(["prepare", str(raw), str(out), "--tokenizer", tiny_tokenizer_dir, "--max-length", "40",
                 "--max-prompt-length", "20", "--overwrite", "--no-progress"])
    stdout, err = _err_lines(capsys)
    assert (code, err) == (0, [])
    assert "hint:" not in stdout and "0 dropped" in stdout


def test_tiny_max_length_suggests_raising_it(tmp_path, tiny_tokenizer_dir, capsys):
    raw = _long_prompt_rows(tmp_path / "long.jsonl", long=0, short=10)
    code = main(["prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--max-length", "4",
                 "--no-progress"])
    _, err = _err_lines(capsys)
    assert code == 1 and len(err) == 1
    # Nothing kept: that leads, and the cause follows it.
    assert err[0].startswith("prefdata prepare: error: no pair kept: all 10 pairs were dropped by the policy")
    assert err[0].endswith("dropped.jsonl); main cause no_completion_tokens (10 pairs): --max-length 4 leaves "
                           "too little room for the completions; raise --max-length")


def test_validate_with_tokenizer_applies_it_and_false_turns_it_off(tmp_path, tiny_tokenizer_dir, capsys):
    raw = _long_prompt_rows(tmp_path / "long.jsonl")
    code = main(["validate", str(raw), "--tokenizer", tiny_tokenizer_dir, "--max-length", "40", "--no-progress"])
    stdout, err = _err_lines(capsys)
    assert code == 1
    assert len(err) == 1 and err[0].startswith("prefdata validate: error: dropped 6 of 10 pairs")
    assert "limit: dropped pairs: 60.0% of 10 pairs (exceeds the limit 20.0%, max_dropped_share)" in stdout

    off = tmp_path / "off.toml"
    off.write_text("[thresholds]\nmax_dropped_share = false\n")
    code = main(["validate", str(raw), "--tokenizer", tiny_tokenizer_dir, "--max-length", "40", "--policy", str(off),
                 "--no-progress"])
    stdout, err = _err_lines(capsys)
    assert (code, err) == (0, [])
    assert "max_dropped_share" not in stdout


def test_share_at_the_limit_passes(tmp_path, tiny_tokenizer_dir, capsys):
    """2 of 10 dropped is 20%: not above the default limit."""
    raw = _long_prompt_rows(tmp_path / "long.jsonl", long=2, short=8)
    code = main(["prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir, "--max-length", "40",
                 "--no-progress"])
    stdout, err = _err_lines(capsys)
    assert (code, err) == (0, [])
    assert "2 dropped" in stdout and "hint:" not in stdout


def test_policy_threshold_is_checked(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text("[thresholds]\nmax_dropped_share = 1.5\n")
    with pytest.raises(Exception, match="max_dropped_share = 1.5: must be >= 0 and <= 1"):
        load_policy(bad)
    assert load_policy().max_dropped_share == 0.2
    assert load_policy("checks/pr.toml").max_dropped_share == 0.2


def test_plain_strings_with_a_chat_tokenizer_suggest_chat_template(tmp_path, shared_tokenizer, capsys):
    """'Hello' + 'world' merge into one word when joined: every row gets prompt_boundary_mismatch."""
    tokenizer = shared_tokenizer("qwen2.5-instruct")
    raw = tmp_path / "plain.jsonl"
    rows = [{"prompt": f"Question {i}: Hello", "chosen": f"world {i}", "rejected": f"there {i}"} for i in range(5)]
    raw.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    code = main(["validate", str(raw), "--tokenizer", tokenizer, "--format", "json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    hints = [h for h in report["hints"] if h["kind"] == "chat_template"]
    assert len(hints) == 1 and hints[0]["setting"] == "--chat-template" and hints[0]["count"] == 5
    assert "the tokenizer has a chat template; --chat-template renders them through it" in hints[0]["message"]

    code = main(["validate", str(raw), "--tokenizer", tokenizer, "--chat-template", "--format", "json", "--no-progress"])
    report = json.loads(capsys.readouterr().out)
    assert [h for h in report["hints"] if h["kind"] == "chat_template"] == []


# -- the hint names the true cause, from the counts and the settings given ---------------------

from prefdata.report.hints import dropped_share_hint, template_hint  # noqa: E402


def _flags(**counts):
    severity = {"reasoning_lost": "error"}
    return {name: {"count": n, "severity": severity.get(name, "drop")} for name, n in counts.items()}


@pytest.mark.parametrize("identical", [85, 86, 87, 90])
def test_length_hint_keeps_the_budget_whichever_length_flag_leads(identical):
    """HH at --max-length 128: 87 identical_after_truncation, 86 no_completion_tokens (empty halves are
    equal): both come from prompts filling the budget, and the advice must not flip on one pair."""
    hint = dropped_share_hint(_flags(identical_after_truncation=identical, no_completion_tokens=86), 88, 300, 0.2,
                              {"max_length": 128, "max_prompt_length": None})
    assert hint["setting"] == "--max-prompt-length 64"
    assert "--max-prompt-length 64 cuts prompts from the left" in hint["message"] and "raise --max-length" in hint["message"]
    assert "fix the data" not in hint["message"]


def test_length_hint_never_repeats_a_given_max_prompt_length():
    hint = dropped_share_hint(_flags(no_completion_tokens=5), 5, 10, 0.2, {"max_length": 64, "max_prompt_length": 60})
    assert hint["setting"] == "--max-length" and "--max-prompt-length 32" not in hint["message"]


def test_identical_after_truncation_without_empty_halves_asks_for_more_length():
    hint = dropped_share_hint(_flags(identical_after_truncation=5), 5, 10, 0.2, {"max_length": 64, "max_prompt_length": None})
    assert hint["setting"] == "--max-length" and "raise --max-length" in hint["message"]


@pytest.mark.parametrize("count", [1, 2])
def test_a_template_that_drops_tool_calls_is_the_cause_not_the_data(count):
    """reasoning_lost leaves halves equal (identical_after_truncation): on a tie the template is the cause."""
    hint = dropped_share_hint(_flags(reasoning_lost=count, identical_after_truncation=1), 2, 2, 0.2, {})
    assert hint["flag"] == "reasoning_lost" and hint["setting"] == "--chat-template-file"
    assert "fix the data" not in hint["message"] and "chat template does not render" in hint["message"]


def test_template_hint_never_suggests_the_template_file_already_given():
    fresh = template_hint(_flags(reasoning_lost=3), {"chat_template_file": None}, ["deepseek-r1-keep-reasoning"])
    assert "prepare with --chat-template-file deepseek-r1-keep-reasoning" in fresh["message"]
    given = template_hint(_flags(reasoning_lost=3), {"chat_template_file": "mine.jinja"}, ["deepseek-r1-keep-reasoning"])
    assert "prepare with --chat-template-file" not in given["message"]
    assert "--chat-template-file mine.jinja does not render" in given["message"]
    assert template_hint(_flags(identical=3), {}) is None


def test_template_hint_names_a_bundled_template_only_for_the_tokenizer_it_was_made_for():
    """SmolLM3's (or any other) tokenizer gets no DeepSeek-R1 template: its turns would not match."""
    other = template_hint(_flags(reasoning_lost=3), {"chat_template_file": None}, [])
    assert "deepseek" not in other["message"]
    assert "it drops them; prepare with --chat-template-file and a template that renders them" in other["message"]
    hint = dropped_share_hint(_flags(reasoning_lost=2), 2, 2, 0.2, {}, [])
    assert "deepseek" not in hint["message"] and "a template that renders them" in hint["message"]
    hint = dropped_share_hint(_flags(reasoning_lost=2), 2, 2, 0.2, {}, ["deepseek-r1-keep-reasoning"])
    assert "--chat-template-file deepseek-r1-keep-reasoning" in hint["message"]


def test_prepare_with_a_template_file_that_still_drops_calls_says_so(tmp_path, tiny_tokenizer_dir, capsys):
    from prefdata.tiny import CHATML_TEMPLATE  # role and content only: tool calls vanish

    template = tmp_path / "chatml.jinja"
    template.write_text(CHATML_TEMPLATE)
    call = {"type": "function", "function": {"name": "lookup", "arguments": "{\"q\": \"x\"}"}}
    rows = [{"prompt": [{"role": "user", "content": f"q{i}"}],
             "chosen": [{"role": "assistant", "content": "Let me check.", "tool_calls": [call]}],
             "rejected": [{"role": "assistant", "content": "No."}]} for i in range(3)]
    rows += [{"prompt": f"p{i}", "chosen": "yes", "rejected": "no"} for i in range(20)]  # under max_dropped_share
    raw = tmp_path / "rows.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in rows))
    code = main(["prepare", str(raw), str(tmp_path / "out"), "--tokenizer", tiny_tokenizer_dir,
                 "--chat-template-file", str(template), "--no-progress"])
    stdout, _ = _err_lines(capsys)
    assert code == 1
    hint = next(line for line in stdout.splitlines() if "reasoning_lost on 3 rows" in line)
    assert f"--chat-template-file {template} does not render" in hint and "prepare with --chat-template-file" not in stdout
    assert "fix the data" not in stdout
