"""Benchmark: `prefdata train` vs TRL's DPOTrainer, same run, same pairs, same ids, same refs.

Data (`--data uf|hh|both`, see bench/data_styles.py): UltraFeedback-style rows (short prompts, long
answers) or HH-RLHF-style multi-turn rows (long transcript prompts, short answers), through
`prefdata prepare` + `prefdata refs`. TRL gets exactly those ids and reference log-probs (its
trainer is built on one dummy row, then handed the prepared ids + refs), so both train on the same
tokens. Model: a random tiny Llama (hidden 256, 4 layers, 512-token vocab), fp32.

Rows: TRL at equal settings (fp32, no gradient checkpointing: the 1.00x baseline); TRL's own
defaults (bf16 autocast + gradient checkpointing); then prefdata with one technique added per row:
plain (padded halves, random batches, full-vocabulary logits at every position, as a plain
trainer does) -> no prompt logits -> length-sorted batches -> padding-free packing -> prefix
sharing (= prefdata's default); and the floor: one forward + backward over exactly the unique
tokens of the same batches (prompt once, both completions, no padding, no mask), no optimizer.

Every row runs in its own process; peak RSS growth counts from the start of its first step
(activations, gradients, optimizer state; imports and loading excluded for every row). Throughput is
counted in the same data tokens for every row (prompt twice + both completions per pair, TRL's
`num_tokens`): the median over steps 2.. of a step's tokens / its seconds, in wall time and in
this process's CPU time (forward, backward and optimizer of the step). Ratios use CPU time: on a
shared, busy machine wall time mostly measures the other load.
About the same pairs per step in every row (token budgets are set per layout to --batch-pairs
times the mean cost of a pair).

    python bench/bench_train.py --data both          # CPU (~10 min on 2 busy cores); GPU if CUDA
    python bench/bench_train.py --data hh --pairs 32
    python bench/bench_train.py --smollm2            # real model (make smollm2), real UltraFeedback pairs
    python bench/bench_train.py --smollm2 --max-length 1024 --max-steps 3 --rows trl,shared-pairs
                                                     # TRL's default max length, the first 3 steps

The GPU section (Qwen2.5-0.5B shape, bf16) runs only when CUDA is available, and otherwise prints
"not measured (no GPU)".
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))
QWEN_TOKENIZER = REPO.parent / "shared" / "assets" / "tokenizers" / "qwen2.5-instruct"

ROWS = {  # name -> (kind, layout, by token budget)
    "trl-defaults": ("trl", None, False),
    "trl": ("trl", None, False),
    "handoff": ("trl", None, False),
    "plain": ("prefdata-full-logits", "right", False),
    "no-prompt-logits": ("prefdata", "right", False),
    "sorted": ("prefdata", "right", True),
    "packed": ("prefdata", "blocks", True),
    "shared": ("prefdata", "shared", True),
    "floor": ("floor", "shared", True),
    # The same --batch-pairs per step as TRL, by layout (bench_gpu.py: steps/s at equal settings).
    "padded-pairs": ("prefdata", "right", False),
    "packed-pairs": ("prefdata", "blocks", False),
    "shared-pairs": ("prefdata", "shared", False),
}
LABELS = {
    "trl-defaults": "TRL DPOTrainer, TRL defaults (bf16 autocast, gradient checkpointing)",
    "trl": "TRL DPOTrainer, fp32, no checkpointing (baseline)",
    "handoff": "prefdata.trl.DPOTrainer on OUT, docs/trl.md's CPU settings (bf16 and checkpointing off on CPU)",
    "plain": "prefdata: plain (padded halves, random batches, full-vocab logits)",
    "no-prompt-logits": "prefdata: + log-probs only at completion positions",
    "sorted": "prefdata: + length-sorted batches (--batch-tokens)",
    "packed": "prefdata: + padding-free packing",
    "shared": "prefdata: + prefix sharing (default)",
    "floor": "floor: forward + backward over the unique tokens",
    "padded-pairs": "prefdata train, padded halves (--layout right)",
    "packed-pairs": "prefdata train, padding-free packing (--layout blocks)",
    "shared-pairs": "prefdata train, packing + prefix sharing (default)",
}


# ------------------------------------------------------------------ setup (parent process)


def build_model(model_dir: Path, tokenizer_dir: Path, shape: dict, arch: str = "llama", vocab_size: int | None = None,
                device: str = "cpu", dtype=None) -> None:
    """A random-init model of `shape` with the tokenizer saved beside it. `vocab_size` (default: the
    tokenizer's) may be larger, so a small tokenizer drives a model with a real vocabulary's head."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cls, cfg = (LlamaForCausalLM, LlamaConfig) if arch == "llama" else (Qwen2ForCausalLM, Qwen2Config)
    torch.manual_seed(0)
    config = cfg(vocab_size=max(vocab_size or 0, len(tok)), max_position_embeddings=4096, tie_word_embeddings=True,
                 pad_token_id=tok.pad_token_id, **shape)
    with torch.device(device):  # a 0.5B init is quicker on the GPU
        model = cls(config)
    model.to(dtype or torch.float32).save_pretrained(str(model_dir))
    tok.save_pretrained(str(model_dir))


def prepare_out(style: str, model_dir: Path, work: Path, pairs: int, device: str) -> Path:
    from data_styles import style_rows

    from prefdata.prepare import prepare
    from prefdata.refs import compute_refs

    raw = work / f"{style}.jsonl"
    raw.write_text("".join(json.dumps(r) + "\n" for r in style_rows(style, pairs)), encoding="utf-8")
    out = work / f"out-{style}"
    if style == "hh":  # transcripts as plain text; keep the last 448 prompt tokens, as HH trainers do
        prepare(raw, out, tokenizer=str(model_dir), max_length=512, max_prompt_length=448, progress=False)
    else:
        prepare(raw, out, tokenizer=str(model_dir), max_length=256, chat_template=True, progress=False)
    compute_refs(out, str(model_dir), device=device, progress=False)
    return out


def run_child(row: str, out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str,
              max_steps: int | None = None) -> dict:
    result = work / f"{row}.json"
    cmd = [sys.executable, __file__, "--child", row, "--out", str(out), "--model", str(model_dir),
           "--work", str(work), "--batch-pairs", str(batch_pairs), "--device", device, "--result", str(result)]
    if max_steps is not None:  # the first steps of the epoch only (both trainers draw the same order at seed 0)
        cmd += ["--max-steps", str(max_steps)]
    env = {**os.environ, "TQDM_DISABLE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{row} failed:\n{proc.stderr[-3000:]}")
    return json.loads(result.read_text())


# ------------------------------------------------------------------ one row (child process)


class PeakRSS:
    """Peak resident memory above the level at the start of the first step, sampled every 5 ms
    (imports, model and data loading are not counted for anyone)."""

    current: PeakRSS | None = None

    def __init__(self) -> None:
        import psutil

        self.process = psutil.Process()
        self.base = self.peak = self.process.memory_info().rss
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self.done.wait(0.005):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def __enter__(self) -> PeakRSS:
        PeakRSS.current = self
        self.thread.start()
        return self

    def rebase(self) -> None:
        """Count from now: called once, as the first step starts."""
        self.base = self.peak = self.process.memory_info().rss

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join()

    @property
    def growth_mib(self) -> float:
        return (self.peak - self.base) / 2**20


def step_rate(step_tokens: list[int], step_seconds: list[float]) -> float:
    """Median over steps 2.. of tokens/s: robust to other load on a shared machine."""
    import statistics

    rates = [t / s for t, s in zip(step_tokens[1:], step_seconds[1:]) if s > 0]
    return statistics.median(rates)


def steps_per_second(step_seconds: list[float]) -> float:
    """1 / the median seconds of steps 2.. (the first step pays one-off warm-up)."""
    import statistics

    return 1.0 / statistics.median(step_seconds[1:] or step_seconds)


def _budget(out: Path, model, layout: str, batch_pairs: int) -> int:
    """A token budget that gives about `batch_pairs` pairs per batch under `layout`."""
    from prefdata.train.data import load_pairs

    data = load_pairs(out, need_refs=True)
    data.use_layout(model, layout)
    return int(batch_pairs * sum(data.forward_tokens) / len(data.forward_tokens))


def _full_logits_pair_logps(model, prompts, chosens, rejecteds, layout, pad_token_id):
    """What a plain trainer computes: the whole model forward on right-padded halves, log-softmax
    over the full vocabulary at every position, then the completion tokens picked out."""
    import torch

    from prefdata.model.pairs import PairLogps
    from prefdata.tokenize.masks import build_pair_batch

    device = next(model.parameters()).device
    batch = build_pair_batch(prompts, chosens, rejecteds, "right", pad_token_id).to(device)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask,
                   position_ids=batch.position_ids, use_cache=False).logits.float()
    logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, batch.input_ids[:, 1:, None]).squeeze(-1)
    mask = (batch.loss_mask & (batch.position_ids > 0))[:, 1:].float()
    sums, counts = (logp * mask).sum(-1), mask.sum(-1).long()
    means = (logits[:, :-1].detach().mean(-1) * mask).sum(-1)
    n = len(prompts)
    return PairLogps(sums[:n], sums[n:], counts[:n], counts[n:], means[:n], means[n:], batch.num_tokens, 0)


def child_prefdata(row: str, out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str,
                   max_steps: int | None = None) -> dict:
    import prefdata.train.step as step
    from prefdata.train.recipe import train

    kind, layout, by_tokens = ROWS[row]
    if kind == "prefdata-full-logits":
        step.pair_logps = _full_logits_pair_logps
    budget = None
    if by_tokens:
        budget = _budget(out, _config_model(model_dir), layout, batch_pairs)
    cpu = _clock_prefdata_steps()
    output = work / f"run-{row}"
    with PeakRSS() as rss:
        train(out, model=str(model_dir), output=output, batch_pairs=batch_pairs, batch_tokens=budget, epochs=1,
              max_steps=max_steps, lr=5e-6, warmup_ratio=0.1, save_every=None, progress=False, device=device, layout=layout)
    lines = [json.loads(x) for x in (output / "metrics.jsonl").read_text().splitlines()]
    lines = [x for x in lines if "loss" in x and "event" not in x]  # step lines, not a stall event
    ends = [0.0] + [x["elapsed_s"] for x in lines]
    counts = [0] + [x["num_tokens"] for x in lines]
    seconds = [b - a for a, b in zip(ends, ends[1:])]
    tokens = [b - a for a, b in zip(counts, counts[1:])]
    config = json.loads((output / "train_config.json").read_text())
    return {"steps": len(lines), "tokens_per_s": step_rate(tokens, seconds), "steps_per_s": steps_per_second(seconds),
            "tokens_per_cpu_s": step_rate(tokens, cpu), "rss_mib": rss.growth_mib,
            "final_loss": lines[-1]["loss"], "layout": config["layout"],
            "shared": f"{config['prefix_sharing']['shared_pairs']}/{config['prefix_sharing']['pairs']}",
            "tokens_epoch": lines[-1]["num_tokens"], "step_tokens": tokens, "step_cpu_s": [round(c, 2) for c in cpu]}


def _clock_prefdata_steps() -> list[float]:
    """Process CPU seconds of each optimizer step (forward, backward, optimizer): from the start of
    the step's micro-batches to the metrics update that follows the optimizer step."""
    import prefdata.train.loop as loop_module

    seconds: list[float] = []
    started = [0.0]
    accumulate, add = loop_module._accumulate, loop_module.Window.add

    def timed_accumulate(*args, **kwargs):
        if not seconds and PeakRSS.current is not None:
            PeakRSS.current.rebase()
        started[0] = time.process_time()
        return accumulate(*args, **kwargs)

    def timed_add(self, *args, **kwargs):
        seconds.append(time.process_time() - started[0])
        return add(self, *args, **kwargs)

    loop_module._accumulate = timed_accumulate
    loop_module.Window.add = timed_add
    return seconds


def _config_model(model_dir: Path):
    """A weightless stand-in with the model's config (what the planners read)."""
    import transformers

    class _Shell:
        config = transformers.AutoConfig.from_pretrained(str(model_dir))

    return _Shell()


def child_trl(row: str, out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str,
              max_steps: int | None = None) -> dict:
    import datasets
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    cuda = device == "cuda"
    ds = datasets.load_from_disk(str(out))
    keep = [i for i, f in enumerate(ds["flags"]) if "non_finite_ref_logps" not in (f or [])]
    cols = ("prompt_ids", "chosen_ids", "rejected_ids", "ref_chosen_logps", "ref_rejected_logps")
    same = datasets.Dataset.from_dict({c: [ds[c][i] for i in keep] for c in cols})
    step_tokens: list[int] = []

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.times: list[float] = []
            self.cpu: list[float] = []

        def on_step_begin(self, args, state, control, **kwargs):
            if not self.times and PeakRSS.current is not None:
                PeakRSS.current.rebase()
            self.started = time.perf_counter()
            self.cpu_started = time.process_time()

        def on_step_end(self, args, state, control, **kwargs):
            if cuda:
                torch.cuda.synchronize()
            self.times.append(time.perf_counter() - self.started)
            self.cpu.append(time.process_time() - self.cpu_started)

    clock = StepClock()
    # TRL's defaults are ~4x slower on CPU: a few steps are enough to time them.
    settings = {"max_steps": 4} if row == "trl-defaults" else {"gradient_checkpointing": False, "bf16": cuda}
    if row == "handoff":  # docs/trl.md's example: bf16 and checkpointing on a GPU only
        settings = {"activation_checkpointing": cuda, "bf16": cuda}
    if max_steps is not None:
        settings["max_steps"] = max_steps
    config = DPOConfig(
        output_dir=str(work / f"trl-{row}"), per_device_train_batch_size=batch_pairs, gradient_accumulation_steps=1,
        num_train_epochs=1, learning_rate=5e-6, lr_scheduler_type="cosine", warmup_steps=0.1, max_grad_norm=1.0,
        weight_decay=0.0, beta=0.1, loss_type=["sigmoid"], precompute_ref_log_probs=True, max_length=None,
        logging_steps=10_000, save_strategy="no", report_to="none", use_cpu=not cuda, seed=0,
        dataloader_num_workers=0, disable_tqdm=True, **settings,
    )
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if row == "handoff":  # the documented hand-off: OUT itself, as docs/trl.md's example passes it
        from prefdata.trl import DPOTrainer as HandoffTrainer

        trainer = HandoffTrainer(model=model, args=config, train_dataset=str(out), processing_class=tok,
                                 callbacks=[clock])
    else:
        dummy = datasets.Dataset.from_dict({"prompt": ["Hi"], "chosen": [" Hello"], "rejected": [" No"]})
        trainer = DPOTrainer(model=model, args=config, train_dataset=dummy, processing_class=tok, callbacks=[clock])
        trainer.train_dataset = same  # the prepared ids and prefdata's refs, exactly
    collate = trainer.data_collator

    def counting_collator(examples):
        step_tokens.append(sum(2 * len(e["prompt_ids"]) + len(e["chosen_ids"]) + len(e["rejected_ids"])
                               for e in examples))
        return collate(examples)

    trainer.data_collator = counting_collator
    with PeakRSS() as rss:
        trainer.train()
    times = clock.times
    return {"steps": len(times), "tokens_per_s": step_rate(step_tokens[: len(times)], times),
            "steps_per_s": steps_per_second(times),
            "tokens_per_cpu_s": step_rate(step_tokens[: len(times)], clock.cpu),
            "rss_mib": rss.growth_mib, "layout": "right (TRL)", "shared": "0",
            "gradient_checkpointing": bool(trainer.args.gradient_checkpointing),
            "bf16": bool(trainer.args.bf16), "tokens_epoch": sum(step_tokens[: len(times)]),
            "step_tokens": step_tokens[: len(times)], "step_cpu_s": [round(c, 2) for c in clock.cpu]}


def child_floor(row: str, out: Path, model_dir: Path, work: Path, batch_pairs: int, device: str,
                max_steps: int | None = None) -> dict:
    """Forward + backward over exactly the unique tokens of the shared row's batches: each pair one
    plain causal block (prompt once, chosen, rejected), head on completion positions, no optimizer."""
    import torch
    from transformers import AutoModelForCausalLM

    from prefdata.model.logprobs import completion_logps
    from prefdata.tokenize.masks import build_block_pair_batch
    from prefdata.train.data import epoch_batches, load_pairs

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).to(device).train()
    data = load_pairs(out, need_refs=True)
    data.use_layout(model, "shared")
    budget = _budget(out, model, "shared", batch_pairs)
    batches = epoch_batches(data, 0, 0, batch_pairs, budget, 1)[:max_steps]
    times, cpu, tokens = [], [], []
    with PeakRSS() as rss:
        for rows in batches:
            if not times:
                rss.rebase()
            started, cpu_started = time.perf_counter(), time.process_time()
            part = data.dataset[rows]
            batch = build_block_pair_batch(part["prompt_ids"], part["chosen_ids"], part["rejected_ids"],
                                           [True] * len(rows))
            batch.blocks.shared = [None] * len(batch.blocks.shared)  # plain causal: no mask at all
            completion_logps(model, batch).logps.sum().backward()
            model.zero_grad(set_to_none=True)
            if device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
            cpu.append(time.process_time() - cpu_started)
            tokens.append(sum(data.pair_tokens_of(rows)))
    return {"steps": len(times), "tokens_per_s": step_rate(tokens, times), "tokens_per_cpu_s": step_rate(tokens, cpu),
            "rss_mib": rss.growth_mib,
            "layout": "unique tokens", "shared": f"{len(data.rows)}/{len(data.rows)}", "tokens_epoch": sum(tokens)}


# ------------------------------------------------------------------ report


def section(name: str, style: str, tokenizer_dir: Path, shape: dict, pairs: int, batch_pairs: int, device: str,
            rows: list[str], arch: str = "llama", max_steps: int | None = None) -> list[str]:
    with tempfile.TemporaryDirectory(prefix="bench-train-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        build_model(model_dir, tokenizer_dir, shape, arch)
        out = prepare_out(style, model_dir, work, pairs, device)
        results = {}
        for row in rows:
            results[row] = run_child(row, out, model_dir, work, batch_pairs, device, max_steps)
            print(f"[{style}] {row}: {results[row]}", file=sys.stderr, flush=True)
    return table_lines(name, rows, results)


def table_lines(name: str, rows: list[str], results: dict[str, dict]) -> list[str]:
    base = results["trl"]["tokens_per_cpu_s"]
    floor = results.get("floor", {}).get("tokens_per_cpu_s")
    lines = []
    for row in rows:
        r = results[row]
        vs_floor = f"{floor / r['tokens_per_cpu_s']:.2f}x" if floor else ""
        lines.append(
            f"| {name} | {LABELS[row]} | {r['layout']} | {r['shared']} | {r['steps']} | {r['tokens_epoch']} | "
            f"{r['tokens_per_s']:.0f} | {r['tokens_per_cpu_s']:.0f} | {r['rss_mib']:.0f} MiB | "
            f"{r['tokens_per_cpu_s'] / base:.2f}x | {vs_floor} |"
        )
    return lines


REAL_ROWS = "trl,plain,padded-pairs,packed-pairs,shared-pairs"


def real_section(pairs: int, batch_pairs: int, rows: list[str], max_length: int = 192,
                 max_steps: int | None = None) -> list[str]:
    """The rows on SmolLM2-135M-Instruct (`make smollm2`), fp32 on CPU, over the first `pairs` real
    UltraFeedback rows of ../shared prepared with its chat template (`max_length`, prompts cut to
    half of it), for one epoch or its first `max_steps` steps."""
    import torch
    from bench_real import UF_SAMPLE, prepare_with_refs, smollm2_dir

    model_dir = smollm2_dir()
    if model_dir is None or not UF_SAMPLE.is_file():
        sys.exit("--smollm2 needs the converted model (make smollm2) and ../shared's UltraFeedback sample")
    lines = UF_SAMPLE.read_text(encoding="utf-8").splitlines()[:pairs]
    with tempfile.TemporaryDirectory(prefix="bench-train-real-") as tmp:
        work = Path(tmp)
        out = prepare_with_refs(lines, work / "out", model_dir, max_length, max_length // 2)
        results = {}
        for row in rows:
            results[row] = run_child(row, out, model_dir, work, batch_pairs, "cpu", max_steps)
            print(f"[smollm2] {row}: {results[row]}", file=sys.stderr, flush=True)
    name = (f"CPU ({torch.get_num_threads()} threads), real UltraFeedback (max length {max_length}), "
            "SmolLM2-135M-Instruct fp32")
    return table_lines(name, rows, results)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", choices=["uf", "hh", "both"], default="both")
    parser.add_argument("--pairs", type=int, default=None, help="raw rows per data style (default uf 64, hh 32)")
    parser.add_argument("--batch-pairs", type=int, default=4)
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated subset of: " + ", ".join(ROWS))
    parser.add_argument("--gpu-pairs", type=int, default=256)
    parser.add_argument("--smollm2", action="store_true",
                        help="only the real-model rows: SmolLM2-135M-Instruct (make smollm2) on real UltraFeedback "
                             f"pairs (default --pairs 16, --rows {REAL_ROWS})")
    parser.add_argument("--max-length", type=int, default=192,
                        help="--smollm2: prepare's --max-length (prompts cut to half of it); TRL's default is 1024")
    parser.add_argument("--max-steps", type=int, default=None,
                        help="the first N steps of the epoch only (a few are enough to time a step)")
    for flag in ("--child", "--out", "--model", "--work", "--result"):
        parser.add_argument(flag, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.child:  # one row in its own process
        kind = ROWS[args.child][0]
        run = {"trl": child_trl, "floor": child_floor}.get(kind, child_prefdata)
        cuda = args.device == "cuda"
        if cuda:
            torch.cuda.reset_peak_memory_stats()
        result = run(args.child, Path(args.out), Path(args.model), Path(args.work), args.batch_pairs, args.device,
                     args.max_steps)
        result["peak_gpu_gib"] = torch.cuda.max_memory_allocated() / 2**30 if cuda else None
        Path(args.result).write_text(json.dumps(result))
        return

    from prefdata.tiny import build_tiny_tokenizer

    rows = [r for r in args.rows.split(",") if r]
    if "trl" not in rows:
        rows.insert(0, "trl")
    table = [
        "| section | trainer | layout | prompt shared | steps | tokens/epoch | tokens/s (wall) | tokens/CPU-s | "
        "peak RSS growth | vs TRL fp32 (CPU time) | floor / this |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    if args.smollm2:
        real_rows = [r for r in (args.rows if args.rows != ",".join(ROWS) else REAL_ROWS).split(",") if r]
        if "trl" not in real_rows:
            real_rows.insert(0, "trl")
        print("\n".join(table[:2] + real_section(args.pairs or 16, args.batch_pairs, real_rows, args.max_length,
                                                      args.max_steps)))
        return
    styles = ["uf", "hh"] if args.data == "both" else [args.data]
    cpu_shape = dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     intermediate_size=512)
    with tempfile.TemporaryDirectory(prefix="bench-train-tok-") as tok_tmp:
        build_tiny_tokenizer(tok_tmp)
        for style in styles:
            pairs = args.pairs or {"uf": 64, "hh": 32}[style]
            name = f"CPU ({torch.get_num_threads()} threads), {style.upper()}-style, Llama h256 L4 fp32"
            table += section(name, style, Path(tok_tmp), cpu_shape, pairs, args.batch_pairs, "cpu", rows,
                             max_steps=args.max_steps)

    gpu_name = "GPU, Qwen2.5-0.5B shape random, bf16"
    if torch.cuda.is_available() and QWEN_TOKENIZER.is_dir():
        gpu_shape = dict(hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
                         intermediate_size=4864)
        for style in styles:
            table += section(f"{gpu_name}, {style.upper()}-style ({torch.cuda.get_device_name()})", style,
                             QWEN_TOKENIZER, gpu_shape, args.gpu_pairs, args.batch_pairs, "cuda",
                             ["trl", "shared", "floor"], arch="qwen2", max_steps=args.max_steps)
    else:
        table.append(f"| {gpu_name} | prefdata train / TRL DPOTrainer | not measured (no GPU) | | | | | | | | |")
    print("\n".join(table))


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
