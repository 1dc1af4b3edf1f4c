"""Benchmark: every GPU row in one command, one table (Markdown and JSON) that names the GPU.

    make bench-gpu                                  # scripts/setup.sh, then this script on the GPU
    python bench/bench_gpu.py --device cpu --tiny   # the harness itself on CPU, in seconds

Needs only the repository: the model is built from code (random init, Qwen2.5-0.5B's shape and
vocabulary size, the tiny tokenizer from prefdata/tiny/ driving it), and the data are synthetic
token ids with a mix of UltraFeedback-like rows (short prompts, long answers) and HH-like rows
(long multi-turn prompts, short answers). No download, nothing from ../shared.

One OUT and one model for every row, in this order:

1. refs: `prefdata refs` under each layout (padded halves, padding-free packing, packing + prefix
   sharing: the default) against TRL's `precompute_ref_log_probs` loop on the same ids, bf16 on GPU
   (fp32 on CPU); tokens/s, the values' largest difference from TRL's, peak GPU memory.
2. train: `prefdata train` under the same three layouts against TRL's `DPOTrainer` handed the same
   ids and refs, at equal settings (--batch-pairs pairs per step, one epoch, AdamW at 5e-6, bf16
   autocast over fp32 weights, no gradient checkpointing); each in its own process (bench_train.py's
   children), steps/s and tokens/s as the median over steps 2.., peak GPU memory.
3. the tests that need a GPU (`pytest -m gpu` over the files that hold them); on CPU they skip, and
   the table says how many and why.

Tokens are counted alike for every row: prompt twice + both completions per pair (TRL's count), so
rows that forward a shared prompt once get no credit for the tokens they skip. MFU = FLOPs per token
(forward 2N for refs, forward + backward 6N for train; N = non-embedding parameters + the output
head, bench_refs.model_flops_per_token) x tokens/s / the GPU's dense bf16 peak (gpu_peak.py). A
figure that needs a GPU (MFU, peak GPU memory) says "not measured" on CPU, as do rows whose tool is
not installed; nothing is estimated.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import random
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_refs  # noqa: E402
import bench_train  # noqa: E402
from gpu_peak import mfu, peak_bf16_tflops  # noqa: E402

NO_GPU = "not measured (no GPU)"
QWEN_05B = dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                num_key_value_heads=2)
QWEN_VOCAB = 151_936
TINY = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)
LAYOUTS = (("right", "padded halves"), ("blocks", "padding-free packing"), ("shared", "packing + prefix sharing"))
TRAIN_ROWS = {"right": "padded-pairs", "blocks": "packed-pairs", "shared": "shared-pairs"}


# ------------------------------------------------------------------ setup


def synthetic_ids(pairs: int, vocab: tuple[int, int], scale: float, seed: int = 0) -> dict[str, list[list[int]]]:
    """Random token ids in two shapes, alternating: UltraFeedback-like (prompt 32-256 tokens, answers
    64-512) and HH-like (prompt 256-768, answers 16-128); `scale` shrinks every length (--tiny)."""
    rng = random.Random(seed)
    low, high = vocab

    def ids(lo: int, hi: int) -> list[int]:
        return [rng.randrange(low, high) for _ in range(max(1, int(rng.randint(lo, hi) * scale)))]

    out: dict[str, list[list[int]]] = {"prompt_ids": [], "chosen_ids": [], "rejected_ids": []}
    for i in range(pairs):
        (p_lo, p_hi), (c_lo, c_hi) = ((32, 256), (64, 512)) if i % 2 == 0 else ((256, 768), (16, 128))
        out["prompt_ids"].append(ids(p_lo, p_hi))
        out["chosen_ids"].append(ids(c_lo, c_hi))
        out["rejected_ids"].append(ids(c_lo, c_hi))
    return out


def build(work: Path, tiny: bool, device: str) -> tuple[Path, dict[str, Any]]:
    """The model directory (tiny tokenizer saved beside it) and a description of the model."""
    import torch

    from prefdata.tiny import build_tiny_tokenizer

    tok_dir, model_dir = work / "tokenizer", work / "model"
    build_tiny_tokenizer(tok_dir)
    shape, vocab = (TINY, None) if tiny else (QWEN_05B, QWEN_VOCAB)
    bench_train.build_model(model_dir, tok_dir, shape, arch="qwen2", vocab_size=vocab, device=device,
                            dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(model_dir))
    fpt = bench_refs.model_flops_per_token(model_dir)
    name = "tiny random Qwen2" if tiny else "random Qwen2, Qwen2.5-0.5B shape and vocabulary"
    return model_dir, {"name": name, "hidden_size": config.hidden_size, "layers": config.num_hidden_layers,
                       "vocab_size": config.vocab_size, "flops_per_token_forward": fpt,
                       "params_for_mfu": fpt / 2}


# ------------------------------------------------------------------ rows


def _row(section: str, tool: str, **values: Any) -> dict[str, Any]:
    row = {"section": section, "tool": tool, "tokens": None, "seconds": None, "tokens_per_s": None,
           "steps_per_s": None, "vs_trl": None, "mfu": None, "peak_gpu_gib": None, "note": ""}
    row.update(values)
    return row


def _fresh_gpu(device: str) -> None:
    """Free what earlier rows left, so each row's peak memory is its own."""
    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def _have(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def warm_up(work: Path, model_dir: Path, warm_ids: dict, device: str, tiny: bool) -> None:
    """Each tool and layout once on a few pairs, unmeasured: the first CUDA kernels, cuBLAS handles
    and allocator growth are paid here, not by whichever row happens to run first."""
    batch_tokens, trl_batch = (2048, 4) if tiny else (32768, 8)
    warm = work / "warm-up"
    bench_refs.make_out(warm, model_dir, warm_ids)
    for layout, _ in LAYOUTS:
        bench_refs.run_prefdata(warm, model_dir, device, batch_tokens, layout=layout)
    if _have("trl"):
        bench_refs.run_trl(model_dir, warm_ids, device, trl_batch)
    _fresh_gpu(device)


def refs_rows(out: Path, model_dir: Path, ids: dict, device: str, tiny: bool, fpt: float,
              peak: float | None) -> list[dict[str, Any]]:
    import datasets
    import numpy as np

    halves = zip(ids["prompt_ids"], ids["chosen_ids"], ids["rejected_ids"])
    tokens = sum(2 * len(p) + len(c) + len(r) for p, c, r in halves)  # TRL's count, for every row
    batch_tokens, trl_batch = (2048, 4) if tiny else (32768, 8)
    theirs = None
    trl_row = _row("refs", "TRL precompute_ref_log_probs (padded)", tokens=tokens)
    if _have("trl"):
        _fresh_gpu(device)
        theirs = bench_refs.run_trl(model_dir, ids, device, trl_batch)
        trl_tps = tokens / theirs["seconds"]
        trl_row.update(seconds=theirs["seconds"], tokens_per_s=trl_tps, vs_trl=1.0,
                       mfu=mfu(fpt, trl_tps, peak), peak_gpu_gib=theirs["peak_gib"])
    else:
        trl_row["note"] = "not measured (trl not installed)"
    rows = []
    for layout, label in LAYOUTS:
        _fresh_gpu(device)
        ours = bench_refs.run_prefdata(out, model_dir, device, batch_tokens, layout=layout)
        tps = tokens / ours["seconds"]
        row = _row("refs", f"prefdata refs, {label} ({layout})", tokens=tokens, seconds=ours["seconds"],
                   tokens_per_s=tps, mfu=mfu(fpt, tps, peak), peak_gpu_gib=ours["peak_gib"],
                   note=f"{ours['dtype']}; forwarded {ours['forwarded']:,} tokens")
        if theirs is not None:
            stored = np.asarray(datasets.load_from_disk(str(out))["ref_chosen_logps"])
            diff = float(np.max(np.abs(stored - np.asarray(theirs["ref_chosen"]))))
            row.update(vs_trl=tps / trl_row["tokens_per_s"], max_abs_diff_vs_trl=diff)
            row["note"] += f"; ref_chosen within {diff:.1e} of TRL's"
        rows.append(row)
    return [trl_row, *rows]


def train_rows(out: Path, model_dir: Path, work: Path, device: str, batch_pairs: int, fpt: float,
               peak: float | None) -> list[dict[str, Any]]:
    names = [("trl", "TRL DPOTrainer (padded, precomputed refs)")]
    names += [(TRAIN_ROWS[layout], f"prefdata train, {label} ({layout})") for layout, label in LAYOUTS]
    rows, trl_steps = [], None
    for name, label in names:
        if name == "trl" and not _have("trl"):
            rows.append(_row("train", label, note="not measured (trl not installed)"))
            continue
        try:
            r = bench_train.run_child(name, out, model_dir, work, batch_pairs, device)
        except RuntimeError as exc:  # a failed row says so; it is never filled in
            rows.append(_row("train", label, note=f"failed: {str(exc).strip().splitlines()[-1][:200]}"))
            continue
        if name == "trl":
            trl_steps = r["steps_per_s"]
        rows.append(_row("train", label, tokens=r["tokens_epoch"], steps=r["steps"], steps_per_s=r["steps_per_s"],
                         tokens_per_s=r["tokens_per_s"], mfu=mfu(3 * fpt, r["tokens_per_s"], peak),
                         peak_gpu_gib=r.get("peak_gpu_gib"),
                         vs_trl=r["steps_per_s"] / trl_steps if trl_steps else None,
                         note=f"{batch_pairs} pairs/step, {r['steps']} steps; {r['layout']}"))
    return rows


def gpu_tests(device: str) -> dict[str, Any]:
    """`pytest -m gpu` over the test files that hold GPU tests; counts and skip reasons from JUnit XML."""
    files = sorted(str(p.relative_to(REPO)) for p in (REPO / "tests").rglob("test_*.py")
                   if re.search(r"^@pytest\.mark\.gpu$", p.read_text(encoding="utf-8"), re.MULTILINE))
    with tempfile.TemporaryDirectory(prefix="bench-gpu-tests-") as tmp:
        report = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={report}",
               *files]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        if device == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # --device cpu: the GPU tests see no GPU either
        started = time.perf_counter()
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - started
        if not report.is_file():
            return {"command": " ".join(cmd[1:]), "error": (proc.stdout + proc.stderr).strip()[-500:],
                    "passed": 0, "failed": 0, "skipped": 0, "seconds": seconds, "skip_reasons": {}, "failures": []}
        cases = ET.parse(report).getroot().iter("testcase")
        result: dict[str, Any] = {"command": "python -m pytest -m gpu " + " ".join(files), "files": files,
                                  "passed": 0, "failed": 0, "skipped": 0, "seconds": seconds,
                                  "skip_reasons": {}, "failures": []}
        for case in cases:
            name = f"{case.get('classname')}.{case.get('name')}"
            skipped = case.find("skipped")
            if skipped is not None:
                result["skipped"] += 1
                reason = (skipped.get("message") or "").removeprefix("Skipped: ")
                result["skip_reasons"][reason] = result["skip_reasons"].get(reason, 0) + 1
            elif case.find("failure") is not None or case.find("error") is not None:
                result["failed"] += 1
                result["failures"].append(name)
            else:
                result["passed"] += 1
        return result


# ------------------------------------------------------------------ the table


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _num(value: float | None, fmt: str) -> str:
    return "" if value is None else format(value, fmt)


def render_markdown(report: dict[str, Any]) -> str:
    gpu = report["gpu"] or f"none ({report['device']})"
    peak = f"{report['peak_bf16_tflops']:g} TFLOP/s dense bf16" if report["peak_bf16_tflops"] else "unknown peak"
    model = report["model"]
    lines = [
        f"GPU: {gpu} ({peak}); torch {report['torch']}; model: {model['name']} (hidden {model['hidden_size']}, "
        f"{model['layers']} layers, vocabulary {model['vocab_size']:,}); {report['pairs']} pairs; "
        f"command: `{report['command']}`",
        "",
        "| what | tool | tokens | seconds | tokens/s | steps/s | vs TRL | MFU (bf16 peak) | peak GPU memory | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    gpu_missing = report["device"] != "cuda"
    for r in report["rows"]:
        measured = r["tokens_per_s"] is not None
        mfu_cell = (f"{100 * r['mfu']:.1f}%" if r["mfu"] is not None
                    else NO_GPU if gpu_missing else "not measured (unknown GPU peak)" if measured else "")
        mem_cell = f"{r['peak_gpu_gib']:.2f} GiB" if r["peak_gpu_gib"] is not None else NO_GPU if gpu_missing else ""
        lines.append(
            f"| {r['section']} | {r['tool']} | {_num(r['tokens'], ',')} | {_num(r['seconds'], '.2f')} | "
            f"{_num(r['tokens_per_s'], ',.0f')} | {_num(r['steps_per_s'], '.2f')} | "
            f"{'' if r['vs_trl'] is None else format(r['vs_trl'], '.2f') + 'x'} | "
            f"{mfu_cell if measured else ''} | {mem_cell if measured else ''} | {_cell(r['note'])} |")
    t = report["gpu_tests"]
    detail = "; ".join(f"{n} skipped: {reason}" for reason, n in t["skip_reasons"].items())
    if t["failures"]:
        detail = "failed: " + ", ".join(t["failures"]) + ("; " + detail if detail else "")
    if t.get("error"):
        detail = f"pytest did not run: {t['error'][-200:]}"
    counts = f"{t['passed']} passed, {t['failed']} failed, {t['skipped']} skipped" + (f"; {detail}" if detail else "")
    lines.append(f"| GPU tests | `pytest -m gpu` | | {t['seconds']:.1f} | | | | | | {_cell(counts)} |")
    return "\n".join(lines) + "\n"


def measure(tiny: bool, device: str, pairs: int, batch_pairs: int,
            peak: float | None) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """Build the model and OUT, warm up, then the refs and train rows: (model, rows, stage seconds)."""
    started, stages = time.perf_counter(), {}
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as tmp:
        work = Path(tmp)
        model_dir, model = build(work, tiny, device)
        from transformers import AutoTokenizer

        vocab = (10, len(AutoTokenizer.from_pretrained(str(model_dir))))  # ids the tokenizer knows
        scale = 0.05 if tiny else 1.0
        ids = synthetic_ids(pairs, vocab, scale)
        out = work / "out"
        bench_refs.make_out(out, model_dir, ids)
        warm_up(work, model_dir, synthetic_ids(8, vocab, scale, seed=1), device, tiny)
        stages["setup_s"] = time.perf_counter() - started
        fpt = model["flops_per_token_forward"]
        mark = time.perf_counter()
        rows = refs_rows(out, model_dir, ids, device, tiny, fpt, peak)  # leaves OUT with refs for train
        stages["refs_s"] = time.perf_counter() - mark
        mark = time.perf_counter()
        rows += train_rows(out, model_dir, work, device, batch_pairs, fpt, peak)
        stages["train_s"] = time.perf_counter() - mark
    return model, rows, stages


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument("--tiny", action="store_true", help="tiny model and short rows: checks the harness, in seconds")
    parser.add_argument("--pairs", type=int, help="pairs in OUT (default 1024; --tiny 12)")
    parser.add_argument("--batch-pairs", type=int, help="train: pairs per optimizer step (default 8; --tiny 4)")
    parser.add_argument("--out", default=str(REPO / "bench" / "results"), help="where gpu.md and gpu.json go")
    parser.add_argument("--skip-gpu-tests", action="store_true")
    args = parser.parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    if device == "cuda" and not torch.cuda.is_available():
        print("bench_gpu: error: --device cuda, but torch sees no CUDA GPU", file=sys.stderr)
        return 2
    pairs = args.pairs or (12 if args.tiny else 1024)
    batch_pairs = args.batch_pairs or (4 if args.tiny else 8)
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    gpu = torch.cuda.get_device_name() if device == "cuda" else None
    peak = peak_bf16_tflops(gpu)
    started = time.perf_counter()
    command = "python bench/bench_gpu.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip()
    from prefdata.core.quiet import quiet_libraries

    with quiet_libraries(True):  # transformers', datasets' and TRL's bars and notices are not the table
        model, rows, stages = measure(args.tiny, device, pairs, batch_pairs, peak)
    mark = time.perf_counter()
    tests = ({"command": "skipped (--skip-gpu-tests)", "passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0,
              "skip_reasons": {}, "failures": []} if args.skip_gpu_tests else gpu_tests(device))
    stages["gpu_tests_s"] = time.perf_counter() - mark
    stages["total_s"] = time.perf_counter() - started
    report = {
        "gpu": gpu, "device": device, "peak_bf16_tflops": peak, "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(), "command": command,
        "pairs": pairs, "batch_pairs": batch_pairs, "model": model, "rows": rows, "gpu_tests": tests,
        "stages": stages, "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    markdown = render_markdown(report)
    (dest / "gpu.json").write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    (dest / "gpu.md").write_text(markdown, encoding="utf-8")
    print(markdown)
    print(f"wrote {dest / 'gpu.md'} and {dest / 'gpu.json'} in {stages['total_s']:.0f}s", file=sys.stderr)
    return 1 if tests["failed"] or tests.get("error") or any(r["note"].startswith("failed") for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
