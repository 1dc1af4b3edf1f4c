"""Benchmark: `prefdata refs` vs TRL 1.16's reference log-prob precompute, same process, same ids.

CPU section: random-init Qwen2 (hidden 256, 4 layers) with the real Qwen2.5 tokenizer (151k vocab)
on --pairs rows in each data style (`--data uf|hh|both`, bench/data_styles.py: UltraFeedback-style
short prompts, HH-style multi-turn long prompts), tokenized once by TRL's DPOTrainer and cut to
--max-length tokens per half; both tools then score exactly the same token ids. Seconds are wall
time and this process's CPU time of the scoring loops only (model loading, planning and writing
excluded on both sides); the ratio uses CPU time, which other load on a shared machine disturbs
least. Tokens are counted alike for both: prompt twice + both completions per pair.
GPU section (only with CUDA): a ~0.5B Qwen2.5-shaped random model, 5k UltraFeedback-length pairs,
bf16; tokens/s for both, ratio, MFU against the GPU's dense bf16 peak, peak memory.

    python bench/bench_refs.py --data both  # CPU (a few minutes here), GPU if available
    python bench/bench_refs.py --gpu-only
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
SHARED = REPO.parent / "shared" / "assets"
TOKENIZER = SHARED / "tokenizers" / "qwen2.5-instruct"
DATA = SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"
NOT_MEASURED = "not measured (no GPU)"


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


def tokenize_with_trl(model_dir: Path, pairs: int, max_length: int, repeat_to: int | None = None,
                      style: str = "uf"):
    """TRL's own tokenization of the rows; the prompt keeps its end (half of max_length for uf,
    all but 64 tokens for hh), completions are cut so each half fits max_length."""
    import datasets
    import trl
    from data_styles import style_rows
    from transformers import AutoModelForCausalLM, AutoTokenizer

    rows = style_rows(style, pairs)
    texts = datasets.Dataset.from_dict({k: [r[k] for r in rows] for k in ("prompt", "chosen", "rejected")})
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    args = trl.DPOConfig(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True, bf16=False, max_length=None)
    ds = trl.DPOTrainer(model=model, args=args, train_dataset=texts, processing_class=tok).train_dataset
    ids = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    prompt_room = max_length // 2 if style == "uf" else max_length - 64
    for row in ds:
        prompt = row["prompt_ids"][-prompt_room:]
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


def run_prefdata(out: Path, model_dir: Path, device: str, batch_tokens: int, layout: str = "auto") -> dict:
    """`prefdata refs` on OUT (computed again when OUT already holds refs) under `layout`."""
    import torch

    from prefdata.refs import compute_refs

    import prefdata.refs as refs_module

    cpu = [0.0]
    scoring = refs_module.compute_shards

    def timed(*args, **kwargs):  # CPU time of the scoring loop alone
        started = time.process_time()
        try:
            return scoring(*args, **kwargs)
        finally:
            cpu[0] += time.process_time() - started

    refs_module.compute_shards = timed
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    try:
        result = compute_refs(out, str(model_dir), device=device, batch_tokens=batch_tokens, progress=False,
                              recompute=True, layout=layout)
    finally:
        refs_module.compute_shards = scoring
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    return {"forwarded": result.tokens, "seconds": result.seconds, "cpu_seconds": cpu[0], "peak_gib": peak,
            "layout": result.layout, "dtype": result.dtype, "shared": result.shared_pairs}


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
    start, cpu_start = time.perf_counter(), time.process_time()
    scored = trainer._precompute_ref_logps(ds, "bench", batch_size)
    if bf16:
        torch.cuda.synchronize()
    seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    tokens = sum(2 * len(p) + len(c) + len(r) for p, c, r in zip(ids["prompt_ids"], ids["chosen_ids"], ids["rejected_ids"]))
    peak = torch.cuda.max_memory_allocated() / 2**30 if bf16 else None
    return {"tokens": tokens, "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_gib": peak,
            "ref_chosen": scored["ref_chosen_logps"]}


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
    tokens = theirs["tokens"]  # the same ids: prompt twice + both completions per pair, for both tools
    ours_tps, trl_tps = tokens / ours["seconds"], tokens / theirs["seconds"]
    ours_cpu, trl_cpu = tokens / ours["cpu_seconds"], tokens / theirs["cpu_seconds"]
    mfu = ""
    if device == "cuda":
        import torch

        from gpu_peak import peak_bf16_tflops

        gpu = torch.cuda.get_device_name()
        peak = peak_bf16_tflops(gpu)
        if peak:
            fpt = model_flops_per_token(model_dir)
            mfu = f"{100 * ours_tps * fpt / (peak * 1e12):.1f}% / {100 * trl_tps * fpt / (peak * 1e12):.1f}%"
        name += f" ({gpu})"
        ratio = ours_tps / trl_tps  # a GPU is not shared: wall time
    else:
        ratio = ours_cpu / trl_cpu
    mem = lambda r: f"{r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else "n/a"  # noqa: E731
    print(f"{name}: |ref_chosen prefdata - TRL| max = {max_diff:.2e} over {len(stored)} pairs; prefdata forwarded "
          f"{ours['forwarded']} of {tokens} tokens (prompt shared in {ours['shared']} pairs)", file=sys.stderr)
    return [
        [name, f"prefdata refs ({ours['layout']}, {ours['dtype']})", str(tokens), f"{ours['seconds']:.1f}",
         f"{ours['cpu_seconds']:.1f}", f"{ours_tps:.0f}", f"{ours_cpu:.0f}", f"{ratio:.2f}x",
         mfu.split(" / ")[0] if mfu else "n/a", mem(ours)],
        [name, "TRL precompute_ref_log_probs", str(tokens), f"{theirs['seconds']:.1f}", f"{theirs['cpu_seconds']:.1f}",
         f"{trl_tps:.0f}", f"{trl_cpu:.0f}", "1.00x", mfu.split(" / ")[1] if mfu else "n/a", mem(theirs)],
    ]


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["uf", "hh", "both"], default="both")
    parser.add_argument("--pairs", type=int, default=16, help="CPU section: rows per data style")
    parser.add_argument("--max-length", type=int, default=512, help="CPU section: tokens per half")
    parser.add_argument("--gpu-pairs", type=int, default=5000)
    parser.add_argument("--gpu-only", action="store_true")
    args = parser.parse_args()
    os.environ.setdefault("TQDM_DISABLE", "1")
    header = ["section", "tool", "tokens", "seconds (wall)", "seconds (CPU)", "tokens/s (wall)", "tokens/CPU-s",
              "vs TRL", "MFU (bf16 peak)", "peak GPU mem"]
    table: list[list[str]] = []
    if not args.gpu_only:
        model_dir = Path(tempfile.mkdtemp()) / "qwen2-small"
        build_model(model_dir, "small", torch.float32)
        threads = torch.get_num_threads()
        for style in (["uf", "hh"] if args.data == "both" else [args.data]):
            ids = tokenize_with_trl(model_dir, args.pairs, args.max_length, style=style)
            table += section(f"CPU ({threads} threads), {style.upper()}-style, Qwen2 h256 L4, Qwen2.5 tokenizer, "
                             f"{args.pairs} pairs", model_dir, ids, "cpu", batch_tokens=4096, trl_batch=4)
    gpu_name = "GPU, Qwen2 0.5B random, bf16, 5k pairs"
    if torch.cuda.is_available():
        model_dir = Path(tempfile.mkdtemp()) / "qwen2-0.5b"
        build_model(model_dir, "0.5b", torch.bfloat16)
        ids = tokenize_with_trl(model_dir, 1000, 2048, repeat_to=args.gpu_pairs)
        table += section(gpu_name, model_dir, ids, "cuda", batch_tokens=32768, trl_batch=8)
    else:
        table += [[gpu_name, tool, NOT_MEASURED, "", "", "", "", "", "", ""]
                  for tool in ("prefdata refs", "TRL precompute_ref_log_probs")]
    print("| " + " | ".join(header) + " |")
    print("| " + " | ".join("---" for _ in header) + " |")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
