"""Online DPO with reasoning: generated think blocks stay in the completions, and rewards read the
final answer unless `--score-reasoning` asks for the whole text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from prefdata.cli import main
from prefdata.online.generate import _decode, decode_completion, think_tag_tokens
from prefdata.online.score import answer_only, score

SEES_THINK = '''
def sees_think(prompts, completions, **kwargs):
    import json, os
    texts = [c if isinstance(c, str) else json.dumps(c) for c in completions]
    with open(os.environ["PREFDATA_TEST_SEEN"], "a") as f:
        f.write(json.dumps(texts) + "\\n")
    return [1.0 if ("<think>" in t or "reasoning_content" in t or "ponder" in t) else 0.0 for t in texts]
'''

REASONED = "<think>\nI ponder the sky.\n</think>\n\nBlue."


def _write(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _generations(tmp_path: Path) -> Path:
    rows = [{"prompt": "Name a color.", "completion": c, "sample": k, "source_file": "p.jsonl", "source_line": 1,
             "finished": True} for k, c in enumerate([REASONED, "Red."])]
    return _write(tmp_path / "generations.jsonl", rows)


@pytest.fixture()
def sees_think(tmp_path, monkeypatch) -> str:
    path = tmp_path / "rules.py"
    path.write_text(SEES_THINK)
    monkeypatch.setenv("PREFDATA_TEST_SEEN", str(tmp_path / "seen.jsonl"))
    return f"{path}:sees_think"


def _seen(tmp_path: Path) -> list[list[str]]:
    return [json.loads(line) for line in (tmp_path / "seen.jsonl").read_text().splitlines()]


def test_reward_function_reads_the_answer_by_default_and_the_whole_text_with_the_flag(tmp_path, sees_think):
    generations = _generations(tmp_path)
    score(generations, reward_fn=sees_think, progress=False)
    assert _seen(tmp_path)[-1] == ["Blue.", "Red."]
    rows = [json.loads(line) for line in generations.read_text().splitlines()]
    assert [r["reward"] for r in rows] == [0.0, 0.0]
    assert rows[0]["completion"] == REASONED  # the written rows keep the reasoning

    score(generations, reward_fn=sees_think, progress=False, score_reasoning=True)
    assert _seen(tmp_path)[-1] == [REASONED, "Red."]
    rows = [json.loads(line) for line in generations.read_text().splitlines()]
    assert [r["reward"] for r in rows] == [1.0, 0.0]
    pairs = [json.loads(line) for line in (tmp_path / "pairs.jsonl").read_text().splitlines()]
    assert pairs[0]["chosen"] == REASONED  # what is trained on is the whole completion


def test_cli_score_reasoning_flag(tmp_path, sees_think, capsys):
    generations = _generations(tmp_path)
    assert main(["score", str(generations), "--reward-fn", sees_think, "--no-progress"]) == 0
    assert main(["score", str(generations), "--reward-fn", sees_think, "--score-reasoning", "--no-progress"]) == 0
    assert _seen(tmp_path) == [["Blue.", "Red."], [REASONED, "Red."]]
    config = tmp_path / "prefdata.toml"
    config.write_text("[score]\nscore_reasoning = true\n")
    assert main(["score", str(generations), "--reward-fn", sees_think, "--config", str(config), "--no-progress"]) == 0
    assert _seen(tmp_path)[-1] == [REASONED, "Red."]


def test_conversational_pairs_score_the_assistant_answer(tmp_path, sees_think):
    prompt = [{"role": "user", "content": "Name a color."}]
    rows = [
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": REASONED}],
         "rejected": [{"role": "assistant", "content": "Red."}]},
        {"prompt": prompt, "chosen": [{"role": "assistant", "content": "Blue.", "reasoning_content": "I ponder."}],
         "rejected": [{"role": "assistant", "content": "Green."}]},
    ]
    source = _write(tmp_path / "pairs.jsonl", rows)
    out = score(source, reward_fn=sees_think, output=tmp_path / "a.jsonl", progress=False)
    scored = [json.loads(line) for line in out.output.read_text().splitlines()]
    assert [r["reward_chosen"] for r in scored] == [0.0, 0.0]
    chosen_seen = _seen(tmp_path)[0]
    assert all("<think>" not in text for text in chosen_seen) and '"Blue."' in chosen_seen[0]
    score(source, reward_fn=sees_think, output=tmp_path / "b.jsonl", progress=False, score_reasoning=True)
    scored = [json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()]
    assert scored[0]["reward_chosen"] == 1.0
    assert scored[0]["chosen"][0]["content"] == REASONED  # rows are written back whole


def test_answer_only_leaves_the_input_alone():
    message = {"role": "assistant", "content": "<think>x</think>\n\nYes.", "reasoning_content": None}
    kept = {"role": "assistant", "content": "Yes.", "thinking": "because"}
    assert answer_only([message, {"role": "tool", "content": "<think>t</think> raw"}]) == [
        {"role": "assistant", "content": "Yes."}, {"role": "tool", "content": "<think>t</think> raw"}]
    assert answer_only([kept]) == [{"role": "assistant", "content": "Yes."}]
    assert message["content"].startswith("<think>") and kept["thinking"] == "because"
    assert answer_only("no reasoning here") == "no reasoning here"
    assert answer_only("</think>\n\nafter a generation prompt that opened it") == "after a generation prompt that opened it"


def test_reward_model_reads_the_answer_only(tmp_path, reward_model_dir):
    """Two samples with the same answer, one with reasoning before it: the same reward by default,
    different rewards when the reasoning is scored."""
    rows = [{"prompt": "Name a color.", "completion": c, "sample": k, "source_file": "p.jsonl", "source_line": 1,
             "finished": True} for k, c in enumerate([REASONED, "Blue."])]
    generations = _write(tmp_path / "generations.jsonl", rows)
    score(generations, reward_model=reward_model_dir, device="cpu", progress=False)
    rewards = [json.loads(line)["reward"] for line in generations.read_text().splitlines()]
    assert rewards[0] == pytest.approx(rewards[1], abs=1e-6)
    score(generations, reward_model=reward_model_dir, device="cpu", progress=False, score_reasoning=True)
    rewards = [json.loads(line)["reward"] for line in generations.read_text().splitlines()]
    assert rewards[0] != pytest.approx(rewards[1], abs=1e-6)


@pytest.mark.parametrize("special", [False, True])
def test_generated_think_tags_survive_decoding(tiny_tokenizer_dir, special):
    """Generation decodes without special tokens; a tokenizer that marks the think tags special must
    not lose them (the reasoning is part of what the policy produced and is trained on)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny_tokenizer_dir)
    if special:
        tokenizer.add_special_tokens({"additional_special_tokens": ["<think>", "</think>"]})
    else:
        tokenizer.add_tokens(["<think>", "</think>"])
    keep = think_tag_tokens(tokenizer)
    assert bool(keep) == special
    ids = tokenizer("<think>\nfour\n</think>\n\n4", add_special_tokens=False)["input_ids"]
    eos = [tokenizer.eos_token_id]
    sample = _decode(tokenizer, ids + eos + ids, eos, keep)
    text, finished = sample.text, sample.finished
    assert sample.ids == ids + eos  # the sampled ids through the stop token, think tags included
    assert finished and text.startswith("<think>") and "</think>" in text and text.endswith("4")
    assert decode_completion(tokenizer, ids, keep) == text
    if special:  # the plain decode the engines used would have dropped them
        assert "<think>" not in tokenizer.decode(ids, skip_special_tokens=True)


def test_online_records_score_reasoning_and_resumes_older_runs(tmp_path):
    from prefdata.core.errors import PrefdataError
    from prefdata.online.rounds import CONFIG_FILE, _start_or_resume

    out = tmp_path / "run"
    out.mkdir()
    old = {"prompts": "p", "model": "m"}  # a run directory from before the flag existed
    (out / CONFIG_FILE).write_text(json.dumps(old))
    assert _start_or_resume(out, {**old, "score_reasoning": False}) == []
    with pytest.raises(PrefdataError, match="score_reasoning: False -> True"):
        _start_or_resume(out, {**old, "score_reasoning": True})
