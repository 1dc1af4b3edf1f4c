"""Benchmark: `prefdata train` vs TRL's DPOTrainer(precompute_ref_log_probs=True).

Same run, same data (the UltraFeedback sample through `prefdata prepare` + `prefdata refs`; TRL gets
the same pairs as text decoded from those ids, so it tokenizes them back to the same tokens), same
random-init Qwen2-architecture model, same batch size, learning rate, schedule, clipping and
epochs. Timed: the optimizer steps only (model loading, TRL's tokenization and reference precompute,
and saving are outside the timing), from the end of step 1 to the end of the last step, so the
first step's warm-up counts for neither.

    python bench/bench_train.py                 # CPU section (~2 min on 2 cores); GPU section if CUDA
    python bench/bench_train.py --pairs 128 --batch-pairs 8

The GPU section (~0.5B Qwen2 in bf16 autocast, peak memory for both) runs only when CUDA is
available, and otherwise prints "not yet measured".
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_DATA = REPO.parent / "shared" / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl"
QWEN_TOKENIZER = REPO.parent / "shared" / "assets" / "tokenizers" / "qwen2.5-instruct"


def _prepare_out(raw: Path, tokenizer_dir: Path, model_dir: Path, work: Path, pairs: int, max_length: int,
                 device: str) -> Path:
    subset = work / "raw.jsonl"
    with open(raw, encoding="utf-8") as src, open(subset, "w", encoding="utf-8") as dst:
        dst.writelines(itertools.islice(src, pairs))
    out = work / "out"
    try:
        from prefdata.prepare import prepare
        from prefdata.refs import compute_refs
    except ImportError as exc:  # prepare/refs still being written: build OUT the simple way
        print(f"note: prepare/refs unavailable ({exc}); building OUT directly", file=sys.stderr)
        return _simple_out(subset, model_dir, out, max_length, device)
    prepare(subset, out, tokenizer=str(model_dir), max_length=max_length, chat_template=True, progress=False)
    compute_refs(out, str(model_dir), device=device, progress=False)
    return out


def _simple_out(raw: Path, model_dir: Path, out: Path, max_length: int, device: str) -> Path:
    """Chat-template prompt, completion + EOS, completion truncated to fit; refs from the same
    forward module. Only used while the real prepare/refs are unavailable."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from prefdata.model.logprobs import plan_batches, sequence_logps
    from prefdata.io.manifest import tokenizer_fingerprint, write_manifest
    from prefdata.tokenize.masks import build_pair_batch

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows = [json.loads(line) for line in raw.read_text(encoding="utf-8").splitlines() if line.strip()]
    cols: dict[str, list] = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": [], "flags": []}
    for row in rows:
        text = lambda x: x if isinstance(x, str) else x[-1]["content"]  # noqa: E731
        prompt = tok.apply_chat_template([{"role": "user", "content": text(row["prompt"])}],
                                         add_generation_prompt=True, tokenize=False)
        p = tok(prompt, add_special_tokens=False)["input_ids"][: max_length // 2]
        room = max_length - len(p)
        c = (tok(text(row["chosen"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:room]
        r = (tok(text(row["rejected"]), add_special_tokens=False)["input_ids"] + [tok.eos_token_id])[:room]
        for k, v in zip(("prompt_ids", "chosen_ids", "rejected_ids", "flags"), (p, c, r, [])):
            cols[k].append(v)
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device)
    n = len(rows)
    ref_c, ref_r = [0.0] * n, [0.0] * n
    lengths = [2 * len(p) + len(c) + len(r) for p, c, r in zip(cols["prompt_ids"], cols["chosen_ids"], cols["rejected_ids"])]
    with torch.no_grad():
        for batch in plan_batches(lengths, 8192):
            b = build_pair_batch([cols["prompt_ids"][i] for i in batch], [cols["chosen_ids"][i] for i in batch],
                                 [cols["rejected_ids"][i] for i in batch], "right", tok.pad_token_id)
            logps, _ = sequence_logps(model, b)
            for j, i in enumerate(batch):
                ref_c[i], ref_r[i] = float(logps[j]), float(logps[len(batch) + j])
    cols["ref_chosen_logps"], cols["ref_rejected_logps"] = ref_c, ref_r
    datasets.Dataset.from_dict(cols).save_to_disk(str(out))
    write_manifest(out, {"tokenizer": {"fingerprint": tokenizer_fingerprint(tok), "pad_token_id": tok.pad_token_id},
                         "flag_counts": {}})
    return out


def _build_model(model_dir: Path, tokenizer_dir: Path, hidden: int, layers: int, heads: int, kv_heads: int,
                 intermediate: int) -> None:
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                         max_position_embeddings=4096, tie_word_embeddings=True, pad_token_id=tok.pad_token_id)
    Qwen2ForCausalLM(config).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))


def _timed_rate(times: list[float], tokens_per_step: list[int]) -> tuple[float, float]:
    """Steps/s and tokens/s between the end of step 1 and the end of the last step."""
    span = times[-1] - times[0]
    return (len(times) - 1) / span, sum(tokens_per_step[1:]) / span


def run_prefdata(out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str) -> dict:
    from prefdata.train.recipe import train

    output = work / "prefdata-run"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    train(out, model=str(model_dir), output=output, batch_pairs=batch_pairs, epochs=1, lr=5e-6, warmup_ratio=0.1,
          save_every=None, progress=False, device=device)
    lines = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in lines if "loss" in x and "elapsed_s" in x]
    # tokens per step = tokens_per_s * step seconds is what train logged; recover each step's tokens
    # from the dataset plan instead: every pair goes through exactly once per epoch.
    times = [x["elapsed_s"] for x in lines]
    steps_s = (len(times) - 1) / (times[-1] - times[0])
    total_tokens = _prefdata_tokens(out)
    result = {"steps": len(lines), "steps_per_s": steps_s,
              "tokens_per_s": total_tokens / len(lines) * steps_s, "tokens": total_tokens,
              "final_loss": lines[-1]["loss"]}
    if device == "cuda":
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def _prefdata_tokens(out: Path) -> int:
    import datasets

    ds = datasets.load_from_disk(str(out))
    return sum(2 * len(p) + len(c) + len(r) for p, c, r in zip(ds["prompt_ids"], ds["chosen_ids"], ds["rejected_ids"]))


def run_trl(out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str, max_length: int) -> dict:
    import datasets
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    ds = datasets.load_from_disk(str(out))
    # The exact same tokens, as text: TRL tokenizes prompt and prompt+completion itself.
    text = datasets.Dataset.from_dict({
        "prompt": tok.batch_decode([list(x) for x in ds["prompt_ids"]]),
        "chosen": tok.batch_decode([list(x) for x in ds["chosen_ids"]]),
        "rejected": tok.batch_decode([list(x) for x in ds["rejected_ids"]]),
    })

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            if device == "cuda":
                torch.cuda.synchronize()
            self.times.append(time.perf_counter())

    clock = StepClock()
    cuda = device == "cuda"
    config = DPOConfig(
        output_dir=str(work / "trl-run"), per_device_train_batch_size=batch_pairs, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=5e-6, lr_scheduler_type="cosine", warmup_steps=0.1, max_grad_norm=1.0,
        weight_decay=0.0, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=True,
        precompute_ref_batch_size=batch_pairs, max_length=max_length * 2, logging_steps=10_000,
        save_strategy="no", report_to="none", use_cpu=not cuda, bf16=cuda, seed=0, dataloader_num_workers=0,
        disable_tqdm=True,
    )
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    trainer = DPOTrainer(model=model, args=config, train_dataset=text, processing_class=tok, callbacks=[clock])
    tokens = sum(2 * len(p) + len(c) + len(r) for p, c, r in zip(
        trainer.train_dataset["prompt_ids"], trainer.train_dataset["chosen_ids"], trainer.train_dataset["rejected_ids"]))
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    trainer.train()
    times = clock.times
    steps_s = (len(times) - 1) / (times[-1] - times[0])
    result = {"steps": len(times), "steps_per_s": steps_s, "tokens_per_s": tokens / len(times) * steps_s,
              "tokens": tokens}
    if cuda:
        result["peak_gib"] = torch.cuda.max_memory_allocated() / 2**30
    return result


def section(name: str, data: Path, tokenizer_dir: Path, model_shape: dict, pairs: int, batch_pairs: int,
            max_length: int, device: str) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        _build_model(model_dir, tokenizer_dir, **model_shape)
        out = _prepare_out(data, tokenizer_dir, model_dir, work, pairs, max_length, device)
        ours = run_prefdata(out, model_dir, work, batch_pairs, device)
        theirs = run_trl(out, model_dir, work, batch_pairs, device, max_length)
    print(f"[{name}] prefdata: {ours}", file=sys.stderr)
    print(f"[{name}] trl:      {theirs}", file=sys.stderr)
    mem = lambda r: f"{r['peak_gib']:.2f} GiB" if "peak_gib" in r else "n/a"  # noqa: E731
    return [
        f"| {name} | prefdata train | {ours['steps']} | {ours['tokens']} | {ours['steps_per_s']:.3f} | "
        f"{ours['tokens_per_s']:.0f} | {mem(ours)} | {ours['steps_per_s'] / theirs['steps_per_s']:.2f}x |",
        f"| {name} | TRL DPOTrainer (precompute_ref_log_probs) | {theirs['steps']} | {theirs['tokens']} | "
        f"{theirs['steps_per_s']:.3f} | {theirs['tokens_per_s']:.0f} | {mem(theirs)} | 1.00x |",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--pairs", type=int, default=96)
    parser.add_argument("--batch-pairs", type=int, default=8)
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--gpu-pairs", type=int, default=512)
    parser.add_argument("--gpu-max-length", type=int, default=1024)
    args = parser.parse_args()
    if not args.data.exists():
        sys.exit(f"no data at {args.data}")
    from prefdata.tiny import build_tiny_tokenizer

    rows = [
        "| section | trainer | steps | tokens/epoch | steps/s | tokens/s | peak GPU mem | speed vs TRL |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-train-tok-") as tok_tmp:
        tiny_tok = Path(tok_tmp)
        build_tiny_tokenizer(tiny_tok)
        cpu_shape = dict(hidden=256, layers=4, heads=4, kv_heads=2, intermediate=512)
        rows += section(f"CPU ({torch.get_num_threads()} threads), Qwen2 h256 L4, tiny 512-token vocab",
                        args.data, tiny_tok, cpu_shape, args.pairs, args.batch_pairs, args.max_length, "cpu")

    if torch.cuda.is_available() and QWEN_TOKENIZER.is_dir():
        gpu_shape = dict(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864)  # Qwen2.5-0.5B shape
        name = f"GPU {torch.cuda.get_device_name()}, Qwen2 0.5B random, bf16 autocast"
        rows += section(name, args.data, QWEN_TOKENIZER, gpu_shape, args.gpu_pairs, args.batch_pairs,
                        args.gpu_max_length, "cuda")
    else:
        rows.append("| GPU, Qwen2 0.5B random, bf16 | prefdata train | not yet measured | | | | | |")
        rows.append("| GPU, Qwen2 0.5B random, bf16 | TRL DPOTrainer (precompute_ref_log_probs) | not yet measured | | | | | |")
    print("\n".join(rows))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
