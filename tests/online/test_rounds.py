"""`prefdata online`: rounds that learn, rounds with nothing to train, and continuing a killed run."""

from __future__ import annotations

import io
import json
import sys

import pytest

from prefdata.cli import main
from prefdata.core.errors import PrefdataError
from prefdata.online import rounds as R
from prefdata.online.rounds import run_online


def _lines(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_rounds_with_a_rule_reward_record_their_accounts_and_chain_their_policies(tmp_path, tiny_model_dir,
                                                                                 prompts_file, rules_file):
    """Whether one seed's reward rises is the CPU's float rounding amplified by sampling (issue 40):
    test_learning.py asserts learning over seeds with pinned arithmetic; this asserts what every run does."""
    out = tmp_path / "run"
    result = run_online(
        prompts_file, model=tiny_model_dir, output=out, reward_fn=f"{rules_file}:count_e", rounds=3,
        prompts_per_round=16, samples=4, max_new_tokens=16, lr=1e-2, beta=0.1, batch_pairs=4, epochs=2,
        batch_size=16, seed=0, device="cpu", progress=False,
    )
    lines = _lines(out / "rounds.jsonl")
    assert [line["reward_mean"] for line in result.rounds] == [line["reward_mean"] for line in lines]
    assert [line["round"] for line in lines] == [1, 2, 3]
    for line in lines:
        assert {"reward_mean", "reward_std", "pairs_kept", "pairs_dropped", "flag_counts", "loss",
                "rewards/margins"} <= set(line)
        assert line["trained"] and line["pairs_kept"] + line["pairs_dropped"] == line["pairs"]
    for r in (1, 2, 3):
        assert (out / f"round-{r}" / "generations.jsonl").is_file()
        assert (out / f"round-{r}" / "pairs" / "manifest.json").is_file()
        assert (out / f"round-{r}" / "pairs" / "dropped.jsonl").is_file()
        assert (out / f"round-{r}" / "pairs" / "report.json").is_file()
    # Round 2 sampled from round 1's policy; the reference stayed the starting policy.
    assert lines[1]["policy_in"] == str(out / "round-1" / "policy")
    refs_manifest = json.loads((out / "round-2" / "pairs" / "manifest.json").read_text())
    assert tiny_model_dir in json.dumps(refs_manifest)
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(str(out / "policy"))
    trained = AutoModelForCausalLM.from_pretrained(str(out / "round-3" / "policy"))
    assert all((a == b).all() for a, b in zip(final.state_dict().values(), trained.state_dict().values()))
    assert not list((out / "round-1" / "policy").glob("*.safetensors"))  # old rounds' weights are dropped


def test_a_round_with_every_pair_dropped_trains_nothing(tmp_path, tiny_model_dir, prompts_file, rules_file, capsys):
    out = tmp_path / "run"
    code = main([
        "online", str(prompts_file), "--model", tiny_model_dir, "--reward-fn", f"{rules_file}:constant",
        "--output", str(out), "--rounds", "1", "--prompts-per-round", "4", "--samples", "2",
        "--max-new-tokens", "4", "--device", "cpu", "--no-progress",
    ])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "all 4 pairs were dropped" in captured.out and "Traceback" not in captured.err
    line = _lines(out / "rounds.jsonl")[0]
    assert line["pairs_kept"] == 0 and line["pairs_dropped"] == 4 and not line["trained"]
    assert line["flag_counts"]["tied_reward"] == 4
    assert (out / "policy" / "config.json").is_file()  # the unchanged starting policy


def test_a_killed_run_continues_from_the_last_finished_round(tmp_path, tiny_model_dir, prompts_file, reward_model_dir,
                                                              monkeypatch):
    out = tmp_path / "run"
    kwargs = {"model": tiny_model_dir, "output": out, "reward_model": reward_model_dir, "prompts_per_round": 4,
              "samples": 2, "max_new_tokens": 4, "batch_pairs": 2, "device": "cpu", "progress": False,
              "save_every": 1}
    real_run = R._Round.run

    def killed_in_round_2(self, r, prompts, policy_dir):
        if r == 2:
            (self.out / "round-2").mkdir(parents=True, exist_ok=True)
            (self.out / "round-2" / "half-written").write_text("x")
            raise KeyboardInterrupt
        return real_run(self, r, prompts, policy_dir)

    monkeypatch.setattr(R._Round, "run", killed_in_round_2)
    with pytest.raises(KeyboardInterrupt):
        run_online(prompts_file, rounds=2, **kwargs)
    first = _lines(out / "rounds.jsonl")
    assert [line["round"] for line in first] == [1]

    monkeypatch.setattr(R._Round, "run", real_run)
    result = run_online(prompts_file, rounds=2, **kwargs)
    lines = _lines(out / "rounds.jsonl")
    assert result.resumed_after == 1 and [line["round"] for line in lines] == [1, 2]
    assert lines[0] == first[0]  # the finished round was not redone
    assert not (out / "round-2" / "half-written").exists()
    # Round 2 got the next prompts, not round 1's again.
    round_2 = {row["source_line"] for row in _lines(out / "round-2" / "generations.jsonl")}
    assert round_2 == {5, 6, 7, 8}

    with pytest.raises(PrefdataError, match="other settings"):
        run_online(prompts_file, rounds=3, **{**kwargs, "samples": 3})


def test_by_default_a_run_is_fully_online_over_one_pass_of_the_prompts(tmp_path, tiny_model_dir, prompts_file,
                                                                        rules_file):
    """No --prompts-per-round: each round samples --batch-pairs prompts and takes one step, as TRL's
    OnlineDPOTrainer samples before every step; no --rounds: one pass over the 16 prompts. The policy
    goes to disk every ceil(64 / 4) = 16 rounds and after the last: here only after round 4."""
    out = tmp_path / "run"
    result = run_online(prompts_file, model=tiny_model_dir, output=out, reward_fn=f"{rules_file}:length",
                        samples=2, max_new_tokens=4, batch_pairs=4, lr=1e-2, device="cpu", progress=False)
    lines = _lines(out / "rounds.jsonl")
    assert [line["prompts"] for line in lines] == [4, 4, 4, 4]
    assert all(line["steps"] == 1 for line in lines if line["trained"])
    assert [line["saved"] for line in lines] == [False, False, False, True]
    config = json.loads((out / "online_config.json").read_text())
    assert (config["prompts_per_round"], config["rounds"], config["save_every"]) == (4, 4, 16)
    assert (result.policy / "config.json").is_file()
    assert not (out / "round-2" / "policy" / "config.json").exists()  # between checkpoints: metrics only


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("per_round", [None, 8])
def test_fully_online_shows_one_bar_over_rounds_and_long_rounds_show_their_stages(
        tmp_path, tiny_model_dir, prompts_file, rules_file, capsys, monkeypatch, per_round):
    """A fully online round is one step: its stages' bars would add two lines a round, so the run
    shows one bar over the rounds. Rounds of several steps show each stage's bar as before. The
    round lines are on stdout either way."""
    terminal = _Terminal()  # bars are drawn on a terminal only (a redirected stderr gets none)
    monkeypatch.setattr(sys, "stderr", terminal)
    run_online(prompts_file, model=tiny_model_dir, output=tmp_path / "run", reward_fn=f"{rules_file}:length",
               samples=2, max_new_tokens=4, batch_pairs=4, prompts_per_round=per_round, rounds=2, lr=1e-2,
               device="cpu", progress=True)
    out, err = capsys.readouterr().out, terminal.getvalue()
    assert [line.split(":")[0] for line in out.splitlines()] == ["round 1", "round 2"]
    if per_round is None:
        assert "online:" in err and "2/2" in err and "train:" not in err and "refs:" not in err
    else:
        assert "online:" not in err and "train:" in err
