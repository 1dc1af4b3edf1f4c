"""Benchmark: one online DPO round, `prefdata online` vs TRL's OnlineDPOTrainer, same run.

Same tiny models built in code (a Qwen2-architecture policy with the ChatML tokenizer, and a Llama
sequence-classification reward model with its own tokenizer and template), same conversational
prompts, 2 samples per prompt (TRL's fixed number), same max_new_tokens, temperature, batch size
(pairs per optimizer step), learning rate and beta, one pass over the prompts. TRL generates one
training batch at a time; prefdata generates and scores `--gen-batch` prompts per call, since its
generation is a stage of its own.

Timed for both: everything one round takes, model loading included: for prefdata `run_online`
(generate, score, prepare with its checks, refs, train, save); for TRL the trainer's construction
and `train()` (it generates, scores and takes a DPO step per batch, with the reference model in
memory). Reported as prompts/s and the ratio prefdata / TRL.

    python bench/bench_online.py                 # CPU section; GPU section when CUDA is available
    python bench/bench_online.py --prompts 64 --batch-pairs 8 --max-new-tokens 32
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _models(work: Path, hidden: int, layers: int) -> tuple[Path, Path]:
    from prefdata.online.tiny import build_tiny_reward_model
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer

    build_tiny_tokenizer(work / "tok")
    build_tiny_model(work / "policy", tokenizer_dir=work / "tok", hidden_size=hidden, num_layers=layers)
    build_tiny_reward_model(work / "rm", hidden_size=hidden, num_layers=layers)
    return work / "policy", work / "rm"


def _prompts(path: Path, n: int) -> list[list[dict[str, str]]]:
    topics = ["the sea", "a cat", "France", "sleep", "numbers", "a lazy dog", "German", "colors"]
    prompts = [[{"role": "user", "content": f"Question {i}: tell me something about {topics[i % len(topics)]}."}]
               for i in range(n)]
    path.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts))
    return prompts


def run_prefdata(prompts_file: Path, policy: Path, rm: Path, out: Path, args: argparse.Namespace, device: str) -> float:
    from prefdata.online.rounds import run_online

    started = time.perf_counter()
    result = run_online(
        prompts_file, model=policy, output=out, reward_model=rm, rounds=1, prompts_per_round=args.prompts,
        samples=2, max_new_tokens=args.max_new_tokens, temperature=1.0, batch_size=args.gen_batch,
        batch_pairs=args.batch_pairs, lr=args.lr, beta=0.1, device=device, progress=False,
    )
    seconds = time.perf_counter() - started
    line = result.rounds[0]
    stages = ", ".join(f"{k} {v:.1f}s" for k, v in line["stage_seconds"].items())
    print(f"  prefdata: {seconds:7.2f}s  pairs kept {line['pairs_kept']}/{line['pairs']}, steps {line.get('steps', 0)} "
          f"({stages})")
    return seconds


def run_trl(prompts: list, policy: Path, rm: Path, out: Path, args: argparse.Namespace, device: str) -> float:
    import datasets
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForSequenceClassification,
        AutoTokenizer,
    )
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    started = time.perf_counter()
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = AutoModelForCausalLM.from_pretrained(str(policy), dtype=dtype)
    ref = AutoModelForCausalLM.from_pretrained(str(policy), dtype=dtype)
    reward = AutoModelForSequenceClassification.from_pretrained(str(rm), num_labels=1, dtype=dtype)
    config = OnlineDPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch_pairs, num_train_epochs=1,
        learning_rate=args.lr, beta=[0.1], max_new_tokens=args.max_new_tokens, temperature=1.0,
        logging_steps=1, save_strategy="no", report_to="none", use_cpu=device == "cpu", bf16=device == "cuda",
        disable_tqdm=True, seed=0, lr_scheduler_type="cosine",
        gradient_checkpointing=False,  # TRL's default is on; prefdata does not checkpoint, so neither does TRL here
    )
    trainer = OnlineDPOTrainer(
        model=model, ref_model=ref, reward_funcs=reward, args=config,
        train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
        processing_class=AutoTokenizer.from_pretrained(str(policy)),
        reward_processing_classes=AutoTokenizer.from_pretrained(str(rm)),
    )
    trainer.train()
    seconds = time.perf_counter() - started
    print(f"  TRL:      {seconds:7.2f}s  steps {trainer.state.global_step}")
    return seconds


def section(name: str, device: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        policy, rm = _models(work, args.hidden, args.layers)
        prompts = _prompts(work / "prompts.jsonl", args.prompts)
        print(f"{name}: {args.prompts} prompts x 2 samples, max_new_tokens {args.max_new_tokens}, "
              f"batch {args.batch_pairs} pairs per step (prefdata generates {args.gen_batch} prompts per call), hidden {args.hidden} x {args.layers} layers, device {device}")
        ours = run_prefdata(work / "prompts.jsonl", policy, rm, work / "prefdata-run", args, device)
        theirs = run_trl(prompts, policy, rm, work / "trl-run", args, device)
        print(f"  throughput: prefdata {args.prompts / ours:.2f} prompts/s, TRL {args.prompts / theirs:.2f} prompts/s; "
              f"ratio prefdata/TRL = {theirs / ours:.2f}x")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--gen-batch", type=int, default=32,
                        help="prompts per generate call / rows per reward batch for prefdata (TRL: --batch-pairs)")
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lr", type=float, default=1e-4)
    args = parser.parse_args()
    torch.set_num_threads(max(1, torch.get_num_threads()))
    section("CPU", "cpu", args)
    if torch.cuda.is_available():
        gpu = argparse.Namespace(**{**vars(args), "prompts": max(args.prompts, 256), "hidden": 512, "layers": 8,
                                    "max_new_tokens": max(args.max_new_tokens, 128), "batch_pairs": 32,
                                    "gen_batch": 256})
        section("GPU", "cuda", gpu)
    else:
        print("GPU: not measured (no GPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
