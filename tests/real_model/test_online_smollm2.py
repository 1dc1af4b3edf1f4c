"""`prefdata online` on a real model: one round with SmolLM2-135M-Instruct as the policy, on real
UltraFeedback prompts rendered with its chat template, scored by a rule reward, runs end to end and its
accounts add up (samples, pairs, kept + dropped, steps, the round's mean reward). No learning assertion:
whether one round raises the reward rests on the seed (bench/bench_online.py --learn --smollm2 measures it).

The model comes from `make smollm2` (the test skips with one line without it). Two short prompts and
eight new tokens keep it to a minute or less on 2 CPU cores."""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest
from transformers import AutoModelForCausalLM

from prefdata.tiny.learning_case import REWARD_NAME, REWARD_SOURCE

N_PROMPTS, SAMPLES, BATCH_PAIRS = 2, 2, 2

pytestmark = pytest.mark.slow


def test_one_online_round_on_smollm2_adds_up(tmp_path, smollm2_dir, shared_data):
    rows = [json.loads(line) for line in shared_data("ultrafeedback-sample/train.jsonl").read_text().splitlines()]
    short = [row for row in rows if 40 <= len(row["prompt"]) <= 300][:N_PROMPTS]  # real prompts, cheap to run
    prompts = tmp_path / "uf.jsonl"
    prompts.write_text("".join(json.dumps(row) + "\n" for row in short))
    (tmp_path / "rewards.py").write_text(REWARD_SOURCE)
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "prefdata", "online", str(prompts), "--model", smollm2_dir, "--output", str(out),
         "--reward-fn", f"{tmp_path / 'rewards.py'}:{REWARD_NAME}", "--chat-template", "--rounds", "1", "--prompts-per-round", str(N_PROMPTS),
         "--samples", str(SAMPLES), "--max-new-tokens", "8", "--batch-pairs", str(BATCH_PAIRS), "--lr", "1e-5",
         "--device", "cpu", "--no-progress"],
        capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "Traceback" not in done.stderr

    (line,) = [json.loads(x) for x in (out / "rounds.jsonl").read_text().splitlines()]
    generations = [json.loads(x) for x in (out / "round-1" / "generations.jsonl").read_text().splitlines()]
    pairs = (out / "round-1" / "pairs.jsonl").read_text().splitlines()
    assert line["prompts"] == N_PROMPTS and line["samples"] == len(generations) == N_PROMPTS * SAMPLES
    assert line["unfinished"] == sum(not g["finished"] for g in generations)
    rewards = [g["reward"] for g in generations]
    assert all(0.0 <= r <= 1.0 for r in rewards)  # the a-m share of each answer
    assert line["reward_mean"] == pytest.approx(statistics.fmean(rewards))
    assert line["pairs"] == len(pairs) <= N_PROMPTS
    assert line["pairs_kept"] + line["pairs_dropped"] == line["pairs"]
    if line["pairs_kept"]:
        assert line["trained"] and line["steps"] == math.ceil(line["pairs_kept"] / BATCH_PAIRS)
        assert math.isfinite(line["loss"])
    policy = AutoModelForCausalLM.from_pretrained(str(out / "policy"))
    assert policy.config.num_hidden_layers == 30 and policy.config.vocab_size == 49152
