"""Benchmark on a real model: does offline DPO teach SmolLM2-135M-Instruct, with `prefdata train` and with TRL?

The model is SmolLM2-135M-Instruct as `make smollm2` converts it (float32, outside the repository).
Real UltraFeedback pairs (../shared/assets/data/ultrafeedback-sample) go through `prefdata prepare
--chat-template` and `prefdata refs`: TRAIN rows from the head of the file, HELD-OUT rows from its
tail (no row in both). Then, per seed, the same OUT trains once with `prefdata train` and once with
TRL's DPOTrainer through the hand-off (`prefdata.trl.DPOTrainer`: the same ids and refs), at equal
settings (fp32, batch, lr, cosine schedule with warmup, AdamW, clipping; each trainer shuffles with
the seed). One judge scores every trained model on HELD-OUT: `prefdata refs --recompute` with the
trained model gives its completion log-probs, and the implicit DPO reward of a half is
beta * (policy - reference). Reported per seed and as mean +- sd: held-out reward accuracy (share of
pairs whose chosen reward beats the rejected one) and mean margin, before (policy = reference:
every margin 0) and after, plus each trainer's time per step (in process, the same clocks as
bench/bench_train.py).

    python bench/bench_real.py                          # 96 pairs, 48 held out, 3 seeds (~2.3 h under load)
    python bench/bench_real.py --pairs 256 --heldout 96 # the README's row: 81 min on 2 quiet cores

The helpers (prepare_with_refs, train_prefdata, train_trl) also serve
tests/real_model/test_train_smollm2.py (prefdata vs TRL step by step at equal settings).
"""

from __future__ import annotations

import argparse
import gc
import importlib.util
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
UF_SAMPLE = REPO.parent / "shared" / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl"
BETA = 0.1


def smollm2_dir() -> Path | None:
    """The converted model's directory, or None where `make smollm2` has not run."""
    spec = importlib.util.spec_from_file_location("_get_smollm2", REPO / "scripts" / "get_smollm2.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    path = module.model_dir()
    return path if module.is_converted(path) else None


def _quiet() -> None:
    """transformers' loading and saving bars off: this bench prints its own lines."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def prepare_with_refs(lines: list[str], out: Path, model_dir: Path, max_length: int, max_prompt_length: int) -> Path:
    """Raw UltraFeedback lines -> `prepare --chat-template` -> `refs` (prefdata's Python API, as the CLI runs it)."""
    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs

    _quiet()
    out.parent.mkdir(parents=True, exist_ok=True)
    raw = out.parent / f"{out.name}.jsonl"
    raw.write_text("".join(line.rstrip("\n") + "\n" for line in lines), encoding="utf-8")
    prepare(raw, out, tokenizer=str(model_dir), chat_template=True, max_length=max_length,
            max_prompt_length=max_prompt_length, progress=False, workers=1)
    compute_refs(out, str(model_dir), device="cpu", progress=False)
    return out


_CLOCK: list[list[float]] = []


def _step_clock() -> list[float]:
    """Process CPU seconds of each prefdata optimizer step (bench_train's clock), installed once per
    process and emptied for each run."""
    if not _CLOCK:
        sys.path.insert(0, str(REPO / "bench"))
        from bench_train import _clock_prefdata_steps

        _CLOCK.append(_clock_prefdata_steps())
    _CLOCK[0].clear()
    return _CLOCK[0]


def train_prefdata(out: Path, model_dir: Path, output: Path, *, seed: int, lr: float, batch_pairs: int,
                   warmup_ratio: float, shuffle: bool = True) -> tuple[list[dict], list[float]]:
    """`prefdata train` (Python API, default layout): its per-step metric lines and CPU seconds per step."""
    from prefdata.train.recipe import train

    seconds = _step_clock()
    train(out, model=str(model_dir), output=output, batch_pairs=batch_pairs, epochs=1, lr=lr, warmup_ratio=warmup_ratio,
          lr_schedule="cosine", max_grad_norm=1.0, beta=BETA, seed=seed, shuffle=shuffle, save_every=None,
          progress=False, device="cpu", overwrite=True)
    lines = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    return [x for x in lines if "loss" in x and "event" not in x and "eval/loss" not in x], seconds


def train_trl(out: Path, model_dir: Path, output: Path, *, seed: int, lr: float, batch_pairs: int,
              warmup_ratio: float, shuffle: bool = True) -> tuple[list[dict], list[float]]:
    """TRL 1.16's DPOTrainer on OUT through prefdata's hand-off at the same settings as train_prefdata:
    its per-step log lines and CPU seconds per step (TRL's callback clock, as bench_train's). The model
    is saved to `output`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from transformers.trainer_callback import PrinterCallback

    from prefdata.trl import DPOConfig, DPOTrainer

    _quiet()

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.cpu: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            self.started = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            self.cpu.append(time.process_time() - self.started)

    # TRL rounds warmup up (ceil); prefdata's train rounds it down (none below 2 steps): the same
    # number of warmup steps is handed to both by giving TRL prefdata's count.
    from prefdata.train.recipe import warmup_steps_for

    pairs = len(__import__("datasets").load_from_disk(str(out)))
    warmup = warmup_steps_for(warmup_ratio, math.ceil(pairs / batch_pairs))
    config = DPOConfig(
        output_dir=str(output), per_device_train_batch_size=batch_pairs, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=lr, lr_scheduler_type="cosine", warmup_steps=warmup, max_grad_norm=1.0,
        weight_decay=0.0, adam_beta1=0.9, adam_beta2=0.999, adam_epsilon=1e-8, beta=BETA, loss_type=["sigmoid"],
        max_length=None, logging_steps=1, save_strategy="no", report_to="none", use_cpu=True, bf16=False,
        activation_checkpointing=False, seed=seed, data_seed=seed, dataloader_num_workers=0, disable_tqdm=True,
        train_sampling_strategy="random" if shuffle else "sequential",
    )
    clock = StepClock()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = DPOTrainer(model=model, args=config, train_dataset=str(out), processing_class=tok, callbacks=[clock])
    trainer.remove_callback(PrinterCallback)  # TRL's per-step dicts on stdout; the lines are returned instead
    trainer.train()
    trainer.save_model(str(output))
    lines = [x for x in trainer.state.log_history if "loss" in x]
    return lines, clock.cpu


def heldout(heldout_out: Path, policy: Path | str, work: Path) -> dict[str, float]:
    """Held-out reward accuracy and mean margin of `policy` against the reference whose log-probs
    HELD-OUT stores: refs recomputed with the policy on a copy give its completion log-probs."""
    import datasets

    from prefdata.refs import compute_refs

    ref = datasets.load_from_disk(str(heldout_out))
    ref_c, ref_r = ref["ref_chosen_logps"], ref["ref_rejected_logps"]
    copy = work / "heldout-scored"
    shutil.rmtree(copy, ignore_errors=True)
    shutil.copytree(heldout_out, copy)
    compute_refs(copy, str(policy), device="cpu", progress=False, recompute=True)
    scored = datasets.load_from_disk(str(copy))
    margins = [BETA * ((pc - rc) - (pr - rr))
               for pc, pr, rc, rr in zip(scored["ref_chosen_logps"], scored["ref_rejected_logps"], ref_c, ref_r)]
    shutil.rmtree(copy, ignore_errors=True)
    return {"accuracy": sum(m > 0 for m in margins) / len(margins), "margin": statistics.fmean(margins),
            "pairs": len(margins)}


def _sd(values: list[float]) -> float:
    return statistics.stdev(values) if len(values) > 1 else 0.0


def _row(name: str, runs: list[dict]) -> str:
    acc, margin = [r["accuracy"] for r in runs], [r["margin"] for r in runs]
    step = [r["s_per_step"] for r in runs]
    per_seed = " ; ".join(f"{r['accuracy']:.3f} / {r['margin']:+.3f}" for r in runs)
    return (f"| {name} | {per_seed} | {statistics.fmean(acc):.3f} +- {_sd(acc):.3f} | "
            f"{statistics.fmean(margin):+.3f} +- {_sd(margin):.3f} | {statistics.fmean(step):.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=96, help="raw training rows from the head of the sample")
    parser.add_argument("--heldout", type=int, default=48, help="raw held-out rows from the tail of the sample")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--max-length", type=int, default=192)
    parser.add_argument("--max-prompt-length", type=int, default=96)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--warmup-ratio", type=float, default=0.1)
    args = parser.parse_args()
    model_dir = smollm2_dir()
    if model_dir is None:
        sys.exit("SmolLM2 not converted: run `make smollm2` first")
    if not UF_SAMPLE.is_file():
        sys.exit(f"{UF_SAMPLE} not found (../shared is missing)")
    import datasets
    import torch

    torch.set_num_threads(min(2, os.cpu_count() or 1))
    lines = UF_SAMPLE.read_text(encoding="utf-8").splitlines()
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="bench-real-") as tmp:
        work = Path(tmp)
        train_out = prepare_with_refs(lines[: args.pairs], work / "train", model_dir, args.max_length,
                                      args.max_prompt_length)
        held = prepare_with_refs(lines[-args.heldout:], work / "heldout", model_dir, args.max_length,
                                 args.max_prompt_length)
        # Before training the policy is the reference: every implicit reward, hence every margin, is 0.
        before = {"accuracy": 0.0, "margin": 0.0, "pairs": len(datasets.load_from_disk(str(held)))}
        results: dict[str, list[dict]] = {"prefdata train": [], "TRL DPOTrainer (hand-off)": []}
        for seed in [int(s) for s in args.seeds.split(",")]:
            for name, run in (("prefdata train", train_prefdata), ("TRL DPOTrainer (hand-off)", train_trl)):
                output = work / f"run-{seed}"
                steps, cpu = run(train_out, model_dir, output, seed=seed, lr=args.lr, batch_pairs=args.batch_pairs,
                                 warmup_ratio=args.warmup_ratio)
                score = heldout(held, output, work)
                score.update(seed=seed, s_per_step=statistics.median(cpu[1:] or cpu), steps=len(steps),
                             train_loss_last=steps[-1]["loss"])
                results[name].append(score)
                print(f"{name} seed {seed}: {score}", file=sys.stderr, flush=True)
                shutil.rmtree(output, ignore_errors=True)
                gc.collect()
        n_train, n_held = len(datasets.load_from_disk(str(train_out))), before["pairs"]
    print(f"\nSmolLM2-135M-Instruct fp32, {n_train} UltraFeedback training pairs (1 epoch, batch {args.batch_pairs}, "
          f"lr {args.lr:g} cosine, warmup {args.warmup_ratio:g}, beta {BETA}), {n_held} held-out pairs, "
          f"max length {args.max_length}, {torch.get_num_threads()} threads; {time.time() - started:.0f} s in all\n")
    print("| trainer | held-out accuracy / margin per seed | accuracy mean +- sd | margin mean +- sd | "
          "CPU s per step (median) |")
    print("| --- | --- | --- | --- | --- |")
    print(f"| before (policy = reference) | {before['accuracy']:.3f} / {before['margin']:+.3f} | "
          f"{before['accuracy']:.3f} | {before['margin']:+.3f} | |")
    for name, runs in results.items():
        print(_row(name, runs))
    ours, theirs = ([r["s_per_step"] for r in runs] for runs in results.values())
    print(f"\ntime per step, TRL / prefdata (CPU s, median over seeds): "
          f"{statistics.median(theirs) / statistics.median(ours):.2f}x")


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("TQDM_DISABLE", "1")
    main()
