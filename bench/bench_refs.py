"""Benchmark: `prefdata refs` vs TRL 1.16's reference log-prob precompute, same process, same ids.

CPU section: random-init Qwen2 (hidden 256, 4 layers) with the real Qwen2.5 tokenizer (151k vocab)
on the first --pairs rows of the UltraFeedback sample, tokenized once by TRL's DPOTrainer and cut to
--max-length tokens per half; both tools then score exactly the same token ids.
GPU section (only with CUDA): a ~0.5B Qwen2.5-shaped random model, 5k UltraFeedback-length pairs,
bf16; tokens/s for both, ratio, MFU against the GPU's dense bf16 peak, peak memory.

    python bench/bench_refs.py            # CPU (about 1-2 minutes here), GPU if available
    python bench/bench_refs.py --gpu-only
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
SHARED = REPO.parent / "shared" / "assets"
TOKENIZER = SHARED / "tokenizers" / "qwen2.5-instruct"
DATA = SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"
BF16_PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L40S": 362.0, "A10": 125.0, "L4": 121.0}
NOT_MEASURED = "not yet measured"


def build_model(out: Path, size: str, dtype) -> None:
    import torch
    from transformers import AutoTokenizer, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(TOKENIZER))
    if size == "small":
        shape = dict(hidden_size=256, intermediate_size=512, num_hidden_layers=4, num_attention_heads=4,
                     num_key_value_heads=2)
    else:  # Qwen2.5-0.5B shape
        shape = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                     num_key_value_heads=2)
    config = Qwen2Config(vocab_size=len(tok), max_position_embeddings=4096, tie_word_embeddings=True,
                         pad_token_id=tok.pad_token_id, **shape)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config).to(dtype)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))


def tokenize_with_trl(model_dir: Path, pairs: int, max_length: int, repeat_to: int | None = None):
    """TRL's own tokenization of the sample; completions cut so each half fits max_length."""
    import datasets
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = [json.loads(line) for line in DATA.open(encoding="utf-8")][:pairs]
    texts = datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")})
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, bf16=False, max_length=None)
    ds = trl.DPOTrainer(model=model, args=args, train_dataset=texts, processing_class=tok).train_dataset
    ids = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for row in ds:
        prompt = row["prompt_ids"][-(max_length // 2):]
        ids["prompt_ids"].append(prompt)
        ids["chosen_ids"].append(row["chosen_ids"][: max_length - len(prompt)])
        ids["rejected_ids"].append(row["rejected_ids"][: max_length - len(prompt)])
    if repeat_to:
        for key in ids:
            ids[key] = (ids[key] * (repeat_to // len(ids[key]) + 1))[:repeat_to]
    return ids


def make_out(out: Path, model_dir: Path, ids: dict) -> None:
    import datasets
    from transformers import AutoTokenizer

    from prefdata.io.manifest import tokenizer_fingerprint, write_manifest

    n = len(ids["prompt_ids"])
    datasets.Dataset.from_dict({**ids, "flags": [[] for _ in range(n)]}).save_to_disk(str(out))
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    write_manifest(out, {"tokenizer": {"fingerprint": tokenizer_fingerprint(tok), "pad_token_id": tok.pad_token_id}})


def run_prefdata(out: Path, model_dir: Path, device: str, batch_tokens: int) -> dict:
    import torch

    from prefdata.refs import compute_refs

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = compute_refs(out, str(model_dir), device=device, batch_tokens=batch_tokens, progress=False)
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"tokens": result.tokens, "seconds": result.seconds, "peak_gib": peak, "layout": result.layout,
            "dtype": result.dtype}


def run_trl(model_dir: Path, ids: dict, device: str, batch_size: int) -> dict:
    """TRL's precompute loop (`DPOTrainer._precompute_ref_logps`) on the same ids; model load and TRL's
    tokenization excluded from the timing."""
    import datasets
    import torch
    import trl
    from transformers import AutoModelForCausalLM, AutoTokenizer

    bf16 = device == "cuda"
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.bfloat16 if bf16 else torch.float32)
    work = Path(tempfile.mkdtemp())
    ds = datasets.Dataset.from_dict(ids)
    ds.save_to_disk(str(work / "ids"))
    ds = datasets.load_from_disk(str(work / "ids"))  # file-backed, so TRL can write its cache file
    args = trl.DPOConfig(output_dir=str(work / "trl"), report_to=[], use_cpu=not bf16, bf16=bf16, max_length=None,
                         precompute_ref_log_probs=False, precompute_ref_batch_size=batch_size)
    # TRL prepares (tokenizes) whatever it is given: hand it one text row, then run its precompute
    # loop on the already-tokenized ids.
    dummy = datasets.Dataset.from_dict({"prompt": ["Hi"], "chosen": [" Hello"], "rejected": [" No"]})
    trainer = trl.DPOTrainer(model=model, args=args, train_dataset=dummy, processing_class=tok)
    trainer.model.eval()
    if bf16:
        torch.cuda.reset_peak_memory_stats()
    start = time.perf_counter()
    scored = trainer._precompute_ref_logps(ds, "bench", batch_size)
    if bf16:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    tokens = sum(2 * len(p) + len(c) + len(r) for p, c, r in zip(ids["prompt_ids"], ids["chosen_ids"], ids["rejected_ids"]))
    peak = torch.cuda.max_memory_allocated() / 2**30 if bf16 else None
    return {"tokens": tokens, "seconds": seconds, "peak_gib": peak, "ref_chosen": scored["ref_chosen_logps"]}


def model_flops_per_token(model_dir: Path) -> float:
    """Forward FLOPs per token: 2 x (non-embedding params + output head); attention scores ignored."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(model_dir))
    head_dim = c.hidden_size // c.num_attention_heads
    attn = c.hidden_size * head_dim * (2 * c.num_attention_heads + 2 * c.num_key_value_heads)
    mlp = 3 * c.hidden_size * c.intermediate_size
    return 2.0 * (c.num_hidden_layers * (attn + mlp) + c.hidden_size * c.vocab_size)


def section(name: str, model_dir: Path, ids: dict, device: str, batch_tokens: int, trl_batch: int) -> list[list[str]]:
    import numpy as np

    tmp = Path(tempfile.mkdtemp())
    make_out(tmp / "out", model_dir, ids)
    ours = run_prefdata(tmp / "out", model_dir, device, batch_tokens)
    theirs = run_trl(model_dir, ids, device, trl_batch)
    import datasets

    stored = np.asarray(datasets.load_from_disk(str(tmp / "out"))["ref_chosen_logps"])
    max_diff = float(np.max(np.abs(stored - np.asarray(theirs["ref_chosen"]))))
    ours_tps = ours["tokens"] / ours["seconds"]
    trl_tps = theirs["tokens"] / theirs["seconds"]
    mfu = ""
    if device == "cuda":
        import torch

        gpu = torch.cuda.get_device_name()
        peak = next((v for k, v in BF16_PEAK_TFLOPS.items() if k in gpu), None)
        if peak:
            fpt = model_flops_per_token(model_dir)
            mfu = f"{100 * ours_tps * fpt / (peak * 1e12):.1f}% / {100 * trl_tps * fpt / (peak * 1e12):.1f}%"
        name += f" ({gpu})"
    mem = lambda r: f"{r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "n/a"  # noqa: E731
    print(f"{name}: |ref_chosen prefdata - TRL| max = {max_diff:.2e} over {len(stored)} pairs", file=sys.stderr)
    return [
        [name, f"prefdata refs ({ours['layout']}, {ours['dtype']})", str(ours["tokens"]), f"{ours['seconds']:.1f}",
         f"{ours_tps:.0f}", f"{ours_tps / trl_tps:.2f}x", mfu.split(" / ")[0] if mfu else "n/a", mem(ours)],
        [name, "TRL precompute_ref_log_probs", str(theirs["tokens"]), f"{theirs['seconds']:.1f}", f"{trl_tps:.0f}",
         "1.00x", mfu.split(" / ")[1] if mfu else "n/a", mem(theirs)],
    ]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=16, help="CPU section: UltraFeedback rows")
    parser.add_argument("--max-length", type=int, default=512, help="CPU section: tokens per half")
    parser.add_argument("--gpu-pairs", type=int, default=5000)
    parser.add_argument("--gpu-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    header = ["section", "tool", "tokens", "seconds", "tokens/s", "vs TRL", "MFU (bf16 peak)", "peak GPU mem"]
    table: list[list[str]] = []
    if not args.gpu_only:
        model_dir = Path(tempfile.mkdtemp()) / "qwen2-small"
        build_model(model_dir, "small", torch.float32)
        ids = tokenize_with_trl(model_dir, args.pairs, args.max_length)
        threads = torch.get_num_threads()
        table += section(f"CPU ({threads} threads), Qwen2 h256 L4, Qwen2.5 tokenizer, {args.pairs} pairs",
                         model_dir, ids, "cpu", batch_tokens=4096, trl_batch=4)
    gpu_name = "GPU, Qwen2 0.5B random, bf16, 5k pairs"
    if torch.cuda.is_available():
        model_dir = Path(tempfile.mkdtemp()) / "qwen2-0.5b"
        build_model(model_dir, "0.5b", torch.bfloat16)
        ids = tokenize_with_trl(model_dir, 1000, 2048, repeat_to=args.gpu_pairs)
        table += section(gpu_name, model_dir, ids, "cuda", batch_tokens=32768, trl_batch=8)
    else:
        table += [[gpu_name, tool, NOT_MEASURED, "", "", "", "", ""]
                  for tool in ("prefdata refs", "TRL precompute_ref_log_probs")]
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
