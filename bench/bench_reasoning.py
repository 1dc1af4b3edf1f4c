"""Benchmark: `prefdata prepare` vs TRL's DPO preparation on reasoning and tool-call rows.

Conversational rows built from the UltraFeedback sample in ../shared: every chosen/rejected
assistant turn carries a `reasoning_content` trace (the first sentence of the answer, reworded), and
every fourth row is a tool-calling pair (a `tools` column, a chosen turn with only `tool_calls`).
Same rows, same tokenizer (Qwen2.5's template renders both), same process:
  (a) TRL 1.16: `DPOTrainer._prepare_dataset` (tokenize map, num_proc=1 as DPOConfig defaults to);
  (b) prefdata: `prefdata.prepare.prepare` end to end (read, normalize, render, tokenize, every check
      including reasoning_lost / reasoning_mismatch / tool_call_invalid, write OUT).

Usage: python bench/bench_reasoning.py [--rows 4000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "assets"
TOKENIZER = SHARED / "tokenizers" / "qwen2.5-instruct"
SOURCE = SHARED / "data" / "ultrafeedback-sample" / "train.jsonl"
MAX_LENGTH = 1024
TOOLS = [{"type": "function", "function": {"name": "search", "description": "search the web", "parameters": {
    "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def reasoning_rows(count: int) -> list[dict]:
    source = [json.loads(line) for line in SOURCE.read_text(encoding="utf-8").splitlines() if line.strip()]
    source = [r for r in source if r["chosen"].strip() and r["rejected"].strip() and r["chosen"] != r["rejected"]]
    rows = []
    for i in range(count):
        r = source[i % len(source)]
        prompt = [{"role": "user", "content": r["prompt"]}]

        def turn(text: str) -> dict:
            first = text.split(".")[0][:200]
            return {"role": "assistant", "content": text, "reasoning_content": f"The user asks; I think: {first}."}

        row = {"prompt": prompt, "chosen": [turn(r["chosen"])], "rejected": [turn(r["rejected"])]}
        if i % 4 == 3:  # a tool-calling pair
            call = {"type": "function", "function": {"name": "search", "arguments": {"query": r["prompt"][:80]}}}
            row["chosen"] = [{"role": "assistant", "content": "", "tool_calls": [call]}]
            row["tools"] = json.dumps(TOOLS)
        rows.append(row)
    return rows


def time_trl(rows: list[dict]) -> float:
    from datasets import Dataset, disable_progress_bars
    from transformers import AutoTokenizer
    from trl import DPOConfig, DPOTrainer

    disable_progress_bars()
    logging.getLogger("trl").setLevel(logging.ERROR)
    tokenizer = AutoTokenizer.from_pretrained(str(TOKENIZER))
    dataset = Dataset.from_list([{**r, "tools": r.get("tools")} for r in rows])
    with tempfile.TemporaryDirectory() as tmp:
        args = DPOConfig(output_dir=tmp, max_length=MAX_LENGTH, report_to=[], use_cpu=True, bf16=False)
        started = time.perf_counter()
        out = DPOTrainer._prepare_dataset(SimpleNamespace(_tokenizer=tokenizer), dataset, tokenizer, args, "train")
        seconds = time.perf_counter() - started
    assert len(out) > 0  # TRL drops rows whose prompt alone fills max_length
    return seconds


def time_prefdata(rows: list[dict], workers: int) -> tuple[float, dict]:
    from prefdata.prepare import prepare

    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "rows.jsonl"
        raw.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
        started = time.perf_counter()
        result = prepare(raw, Path(tmp) / "out", tokenizer=str(TOKENIZER), max_length=MAX_LENGTH, progress=False,
                         workers=workers)
        seconds = time.perf_counter() - started
    return seconds, result.flag_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--repeat", type=int, default=2, help="rounds; the best wall time of each tool is kept")
    parser.add_argument("--workers", type=int, default=1, help="prefdata workers (1: one process, as TRL's num_proc=1)")
    args = parser.parse_args()
    if not TOKENIZER.is_dir() or not SOURCE.is_file():
        sys.exit("needs ../shared/assets (the Qwen2.5 tokenizer and the UltraFeedback sample)")
    warnings.filterwarnings("ignore")
    rows = reasoning_rows(args.rows)
    trl_best = prefdata_best = float("inf")
    flags: dict = {}
    for _ in range(args.repeat):
        trl_best = min(trl_best, time_trl(rows))
        seconds, flags = time_prefdata(rows, args.workers)
        prefdata_best = min(prefdata_best, seconds)
    print(f"{args.rows:,} reasoning/tool-call rows (Qwen2.5 template, max_length {MAX_LENGTH}), best of {args.repeat}:")
    print(f"  TRL DPOTrainer._prepare_dataset : {trl_best:7.2f} s  ({args.rows / trl_best:,.0f} pairs/s)")
    print(f"  prefdata prepare (workers={args.workers})   : {prefdata_best:7.2f} s  ({args.rows / prefdata_best:,.0f} pairs/s)")
    print(f"  prefdata / TRL speed            : {trl_best / prefdata_best:.2f}x")
    print(f"  prefdata flags: {json.dumps(flags, sort_keys=True)}")


if __name__ == "__main__":
    main()
