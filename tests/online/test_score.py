"""`prefdata score`: reward-model scores, TRL's reward-function convention, best-vs-worst pairs and the
flags those pairs get when they go through prepare / validate."""

from __future__ import annotations

import json
import math

import pytest

from prefdata.cli import main
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.online.pairs import make_pairs
from prefdata.online.score import score
from prefdata.prepare import prepare
from prefdata.validate.command import validate


def write_jsonl(path, rows):
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def _gen(prompt, line, completions, finished=None):
    return [
        {"prompt": prompt, "completion": c, "sample": k, "source_file": "p.jsonl", "source_line": line,
         "finished": True if finished is None else finished[k]}
        for k, c in enumerate(completions)
    ]


def _read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_reward_model_scores_equal_an_independent_computation(tmp_path, reward_model_dir, tiny_model_dir):
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    conversation = [{"role": "user", "content": "Name a color."}]
    rows = (_gen(conversation, 1, ["Blue.", "A deep, calm ocean blue.", "red"])
            + _gen("What is 2 + 2?", 2, ["4", "It is four, of course."]))
    generations = write_jsonl(tmp_path / "generations.jsonl", rows)
    result = score(generations, reward_model=reward_model_dir, batch_size=3, device="cpu", progress=False)
    scored = _read(generations)

    rm_tokenizer = AutoTokenizer.from_pretrained(reward_model_dir)
    assert rm_tokenizer.get_vocab() != AutoTokenizer.from_pretrained(tiny_model_dir).get_vocab()
    model = AutoModelForSequenceClassification.from_pretrained(reward_model_dir).eval()
    for row in scored:
        prompt = row["prompt"] if isinstance(row["prompt"], list) else [{"role": "user", "content": row["prompt"]}]
        text = rm_tokenizer.apply_chat_template(prompt + [{"role": "assistant", "content": row["completion"]}],
                                                tokenize=False)
        ids = rm_tokenizer(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
        with torch.no_grad():
            expected = model(input_ids=ids).logits[0, 0].item()
        assert row["reward"] == pytest.approx(expected, abs=1e-5)
    assert len({row["reward"] for row in scored}) == len(scored)  # real, distinct scores
    # Pairs: best vs worst per prompt, rewards and provenance carried along.
    pairs = _read(result.pairs_path)
    assert len(pairs) == 2 and result.pair_stats.unpaired == 0
    first = [r for r in scored if r["source_line"] == 1]
    best, worst = max(first, key=lambda r: r["reward"]), min(first, key=lambda r: r["reward"])
    assert (pairs[0]["chosen"], pairs[0]["rejected"]) == (best["completion"], worst["completion"])
    assert (pairs[0]["reward_chosen"], pairs[0]["reward_rejected"]) == (best["reward"], worst["reward"])
    assert pairs[0]["prompt"] == conversation and (pairs[0]["prompt_file"], pairs[0]["prompt_line"]) == ("p.jsonl", 1)


def test_reward_function_follows_trls_convention(tmp_path, rules_file, monkeypatch):
    shapes = tmp_path / "shapes.json"
    monkeypatch.setenv("PREFDATA_TEST_SHAPES", str(shapes))
    conversation = [{"role": "user", "content": "Hi"}]
    generations = write_jsonl(tmp_path / "g.jsonl", _gen(conversation, 1, ["a", "b", "c"]))
    result = score(generations, reward_fn=f"{rules_file}:shapes", progress=False)
    seen = json.loads(shapes.read_text())
    assert seen["prompts"] == [conversation] * 3
    assert seen["completions"] == [[{"role": "assistant", "content": c}] for c in "abc"]  # message lists
    assert {"sample", "finished", "source_file", "source_line"} <= set(seen["kwargs"])
    rewards = [row["reward"] for row in _read(generations)]
    assert rewards == [None, 1.0, 2.0]  # None: no reward (TRL), written as null
    assert result.unscored == 1
    assert _read(result.pairs_path)[0]["chosen_sample"] == 2


@pytest.mark.parametrize(
    "spec, needle",
    [("nofile.py:f", "no such file"), ("{rules}:missing", "no function"), ("{rules}", "FILE.py:NAME")],
)
def test_bad_reward_function_is_one_line(tmp_path, rules_file, capsys, spec, needle):
    generations = write_jsonl(tmp_path / "g.jsonl", _gen("Hi", 1, ["a", "b"]))
    code = main(["score", str(generations), "--reward-fn", spec.format(rules=rules_file)])
    err = capsys.readouterr().err
    assert code == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_ties_unfinished_and_identical_samples_are_flagged(tmp_path, rules_file, tiny_model_dir):
    rows = (_gen("Say hi.", 1, ["hello there", "hi"])  # constant reward: a tie
            + _gen("Count.", 2, ["one two", "one  two"])  # whitespace only
            + _gen("Name a fruit.", 3, ["apple", "pear"], finished=[True, False]))
    generations = write_jsonl(tmp_path / "g.jsonl", rows)
    score(generations, reward_fn=f"{rules_file}:constant", progress=False)
    result = prepare(tmp_path / "pairs.jsonl", tmp_path / "out", tokenizer=tiny_model_dir, workers=1, progress=False)
    dropped = {r["source_line"]: r["flags"] for r in _read(tmp_path / "out" / "dropped.jsonl")}
    assert result.rows_out == 0 and result.rows_dropped == 3
    assert F.TIED_REWARD in dropped[1]
    assert F.WHITESPACE_ONLY in dropped[2]
    assert F.COMPLETION_TRUNCATED in dropped[3] and F.TIED_REWARD in dropped[3]


def test_rewards_that_differ_make_a_kept_pair_and_the_threshold_is_policy(tmp_path, rules_file, tiny_model_dir):
    generations = write_jsonl(tmp_path / "g.jsonl", _gen("Say hi.", 1, ["hello there", "hi"]))
    score(generations, reward_fn=f"{rules_file}:length", progress=False)  # 11 vs 2
    kept = prepare(tmp_path / "pairs.jsonl", tmp_path / "a", tokenizer=tiny_model_dir, workers=1, progress=False)
    assert kept.rows_out == 1 and F.TIED_REWARD not in kept.flag_counts
    policy = tmp_path / "loose.toml"
    policy.write_text("[thresholds]\ntie_threshold = 9.0\n")
    tied = prepare(tmp_path / "pairs.jsonl", tmp_path / "b", tokenizer=tiny_model_dir, workers=1, progress=False,
                   policy=policy)
    assert tied.rows_out == 0 and tied.flag_counts[F.TIED_REWARD] == 1
    policy.write_text("[thresholds]\ntie_threshold = -1\n")
    with pytest.raises(PrefdataError, match="tie_threshold"):
        prepare(tmp_path / "pairs.jsonl", tmp_path / "c", tokenizer=tiny_model_dir, workers=1, progress=False,
                policy=policy)


def test_offline_scoring_flags_reward_disagrees_in_validate(tmp_path, rules_file, capsys):
    data = write_jsonl(tmp_path / "offline.jsonl", [
        {"prompt": "Q1", "chosen": "short", "rejected": "a much longer answer", "id": 7},
        {"prompt": "Q2", "chosen": "a much longer answer", "rejected": "short"},
        {"prompt": "Q3", "chosen": "abc", "rejected": "abcd"},  # prefers rejected, within the margin
    ])
    result = score(data, reward_fn=f"{rules_file}:length", progress=False)
    rows = _read(result.output)
    assert result.output.name == "offline.scored.jsonl" and rows[0]["id"] == 7  # other fields pass through
    assert [(r["reward_chosen"], r["reward_rejected"]) for r in rows] == [(5, 20), (20, 5), (3, 4)]
    report = validate(str(result.output), progress=False, format="json", output=str(tmp_path / "r.json")).report
    flag = report["flags"][F.REWARD_DISAGREES]
    assert flag["count"] == 1 and flag["severity"] == "warn"
    assert "reward_disagrees" in validate(str(result.output), progress=False, format="markdown",
                                         output=str(tmp_path / "r.md")).rendered
    # The generated-pair flag never fires on offline data, even on equal rewards.
    assert F.TIED_REWARD not in report["flags"]


def test_generation_rows_need_a_reward_source(tmp_path, capsys):
    generations = write_jsonl(tmp_path / "g.jsonl", _gen("Hi", 1, ["a", "b"]))
    assert main(["score", str(generations)]) == 2
    assert "exactly one of --reward-model" in capsys.readouterr().err


def test_make_pairs_skips_prompts_without_two_rewards():
    rows = _gen("A", 1, ["x", "y"]) + _gen("B", 2, ["z", "w"])
    for row, reward in zip(rows, [1.0, 2.0, None, 3.0]):
        row["reward"] = reward
    pairs, stats = make_pairs(rows)
    assert [p["chosen"] for p in pairs] == ["y"] and stats.unpaired == 1 and stats.prompts == 2
    assert not math.isnan(pairs[0]["reward_rejected"])


def test_cli_generate_then_score_with_a_reward_model(tmp_path, tiny_model_dir, reward_model_dir, prompts_file, capsys):
    gen = tmp_path / "gen"
    assert main(["generate", str(prompts_file), str(gen), "--model", tiny_model_dir, "--samples", "2",
                 "--max-new-tokens", "4", "--batch-size", "8", "--device", "cpu", "--no-progress"]) == 0
    assert main(["score", str(gen / "generations.jsonl"), "--reward-model", reward_model_dir, "--device", "cpu",
                 "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "generated 32 samples for 16 prompts" in out and "16 pairs" in out
    rows = _read(gen / "generations.jsonl")
    assert len(rows) == 32 and all(isinstance(r["reward"], float) for r in rows)
    assert len(_read(gen / "pairs.jsonl")) == 16


def test_prompts_of_a_one_line_json_array_stay_apart():
    """Records of a one-line JSON array all start on line 1: grouping must not merge their prompts."""
    rows = _gen("A", 1, ["x", "y"]) + _gen("B", 1, ["z", "w"])
    for row, reward in zip(rows, [1.0, 2.0, 5.0, 3.0]):
        row["reward"] = reward
    pairs, stats = make_pairs(rows)
    assert stats.prompts == 2 and [(p["prompt"], p["chosen"], p["rejected"]) for p in pairs] == [("A", "y", "x"), ("B", "z", "w")]


def test_reward_function_values_beyond_any_float_are_no_reward_and_numpy_numbers_count(tmp_path):
    """A reward function is user code: a 400-digit int is no reward (as NaN), not an OverflowError
    traceback; numpy's scalars are numbers; a string is refused in one line."""
    import numpy as np

    from prefdata.core.errors import PrefdataError
    from prefdata.online.rewards import RewardFunctionScorer

    (tmp_path / "r.py").write_text(
        "import numpy as np\n"
        "def huge(prompts, completions, **kw):\n    return [10 ** 400, np.float32(0.5), np.int64(2), None]\n"
        "def text(prompts, completions, **kw):\n    return ['high'] * len(prompts)\n")
    values = RewardFunctionScorer(f"{tmp_path / 'r.py'}:huge")(["p"] * 4, ["c"] * 4)
    assert np.isnan(values[0]) and values[1:3] == [0.5, 2.0] and np.isnan(values[3])
    with pytest.raises(PrefdataError, match="returned str, not a number"):
        RewardFunctionScorer(f"{tmp_path / 'r.py'}:text")(["p"], ["c"])
