"""`make demo-real`: prepare -> refs -> train -> held-out accuracy on a real model, on CPU, in minutes.

The model is SmolLM2-135M-Instruct as `make smollm2` converts it (float32, ~/.cache/prefdata or
$PREFDATA_SMOLLM2_DIR); the data real UltraFeedback pairs from ../shared (TRAIN from the head of the
sample, HELD-OUT from its tail, no row in both). Each stage is the `prefdata` command a user types;
the demo prints each command, its time, and at the end the held-out reward accuracy and margin of
the trained policy (prefdata train's own eval on HELD-OUT: implicit DPO rewards against the stored
reference log-probs). Before training the policy is the reference: every margin is 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
UF_SAMPLE = REPO.parent / "shared" / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl"


def _model_dir() -> Path:
    spec = importlib.util.spec_from_file_location("_get_smollm2", REPO / "scripts" / "get_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    path = module.model_dir()
    if not module.is_converted(path):
        sys.exit(f"SmolLM2 not converted: run `make smollm2` (looked in {path})")
    return path


def _run(stage: str, *args: str) -> float:
    """One `prefdata` command, shown as typed; its own output only on failure. Returns its seconds."""
    shown = " ".join(["prefdata", *args])
    print(f"{stage} $ {shown}", flush=True)
    started = time.time()
    done = subprocess.run([sys.executable, "-m", "prefdata", *args], capture_output=True, text=True,
                          env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
    seconds = time.time() - started
    if done.returncode != 0:
        sys.exit(f"{stage} failed ({done.returncode}): {(done.stderr or done.stdout).strip().splitlines()[-1]}")
    print(f"      {seconds:.0f} s", flush=True)
    return seconds


def run(work: Path, pairs: int, heldout: int, max_length: int, batch_pairs: int, lr: float) -> dict:
    """The four stages in `work`; returns what was measured."""
    model = str(_model_dir())
    lines = UF_SAMPLE.read_text(encoding="utf-8").splitlines()
    (work / "train.jsonl").write_text("\n".join(lines[:pairs]) + "\n", encoding="utf-8")
    (work / "heldout.jsonl").write_text("\n".join(lines[-heldout:]) + "\n", encoding="utf-8")
    common = ["--tokenizer", model, "--chat-template", "--max-length", str(max_length),
              "--max-prompt-length", str(max_length // 2), "--no-progress"]
    seconds = {}
    seconds["prepare"] = _run("[1/4]", "prepare", str(work / "train.jsonl"), str(work / "train"), *common)
    seconds["prepare"] += _run("     ", "prepare", str(work / "heldout.jsonl"), str(work / "heldout"), *common)
    seconds["refs"] = _run("[2/4]", "refs", str(work / "train"), "--model", model, "--no-progress")
    seconds["refs"] += _run("     ", "refs", str(work / "heldout"), "--model", model, "--no-progress")
    seconds["train"] = _run("[3/4]", "train", str(work / "train"), "--model", model, "--output", str(work / "policy"),
                            "--eval", str(work / "heldout"), "--batch-pairs", str(batch_pairs), "--lr", str(lr),
                            "--no-progress")
    metrics = [json.loads(x) for x in (work / "policy" / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in metrics if "loss" in m and "event" not in m]
    final_eval = [m for m in metrics if "eval/loss" in m][-1]
    return {"seconds": seconds, "steps": len(steps), "train_pairs": _rows(work / "train"),
            "heldout_pairs": _rows(work / "heldout"), "first_loss": steps[0]["loss"], "last_loss": steps[-1]["loss"],
            "accuracy": final_eval["eval/rewards/accuracies"], "margin": final_eval["eval/rewards/margins"],
            "eval_loss": final_eval["eval/loss"]}


def _rows(out: Path) -> int:
    return json.loads((out / "manifest.json").read_text())["row_accounting"]["rows_out"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=64, help="raw training rows (head of the sample)")
    parser.add_argument("--heldout", type=int, default=32, help="raw held-out rows (tail of the sample)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--work", type=Path, default=None, help="keep the outputs here (default: a temporary directory)")
    args = parser.parse_args()
    if not UF_SAMPLE.is_file():
        sys.exit(f"{UF_SAMPLE} not found: the demo needs ../shared's UltraFeedback sample")
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="prefdata-demo-real-") as tmp:
        work = args.work or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        got = run(work, args.pairs, args.heldout, args.max_length, args.batch_pairs, args.lr)
    print(f"[4/4] held-out ({got['heldout_pairs']} pairs), SmolLM2-135M-Instruct fp32 after {got['steps']} steps "
          f"on {got['train_pairs']} pairs:")
    print("      before: reward accuracy 0.000, margin +0.000 (policy = reference: every implicit reward is 0)")
    print(f"      after:  reward accuracy {got['accuracy']:.3f}, margin {got['margin']:+.4f}, eval loss "
          f"{got['eval_loss']:.4f} (ln 2 = 0.6931)")
    print(f"      train loss {got['first_loss']:.4f} (step 1) -> {got['last_loss']:.4f} (step {got['steps']})")
    stages = ", ".join(f"{k} {v:.0f} s" for k, v in got["seconds"].items())
    print(f"\ndone in {time.time() - started:.0f} s ({stages})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
