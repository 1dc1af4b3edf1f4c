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

`--learn` asks whether the policy gets better, not only how fast a round runs: the learning case of
`prefdata.tiny.learning_case` (a tiny random Llama policy on a 6k-vocabulary ChatML tokenizer,
conversational prompts, a rule reward = the answer's share of letters a to m; and a second case with a tiny
reward model) trained by `prefdata online` and by TRL's OnlineDPOTrainer from the same policy with
the same prompts, 2 samples per prompt, max new tokens, learning rate and schedule, beta, batch and
number of optimizer steps (prefdata: R rounds of all prompts, 1 epoch each; TRL: R epochs). Printed:
the mean reward of each round's fresh samples for both (TRL: its per-step `objective/scores`,
averaged over each epoch), then one common evaluation of the start and both final policies (fresh
samples, same seed, same generation code) and the gain ratio, and time per prompt for both.

    python bench/bench_online.py --learn                  # both cases, 48 prompts, 4 rounds
    python bench/bench_online.py --learn --case rule --seeds 0 1 2
    python bench/bench_online.py --learn --smollm2 --case rule   # SmolLM2-135M-Instruct (`make smollm2`) on
                                                                 # UltraFeedback prompts: the real-model case
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
    from prefdata.tiny import build_tiny_model, build_tiny_tokenizer
    from prefdata.tiny.reward import build_tiny_reward_model

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
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)
    loop = trainer.train().metrics["train_runtime"]  # the Trainer's own clock: its training loop
    seconds = time.perf_counter() - started
    print(f"  TRL:      {seconds:7.2f}s  steps {trainer.state.global_step}")
    return seconds


def _import_both_sides(*model_dirs: Path) -> None:
    """Both sides' modules imported before any clock starts, transformers' lazily imported model and
    tokenizer classes included (one load of each model): the first timed run must not pay the
    process's imports for the other (the trainers' own clocks start after them too)."""
    import datasets  # noqa: F401
    import trl.experimental.online_dpo  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    import prefdata.prepare  # noqa: F401
    import prefdata.refs  # noqa: F401
    import prefdata.train  # noqa: F401
    # What those import lazily, inside the stages (pandera and polars for the schema checks: 0.3 s).
    import prefdata.core.schema  # noqa: F401
    import prefdata.model.logprobs  # noqa: F401
    import prefdata.online.generate  # noqa: F401
    import prefdata.refs.compute  # noqa: F401
    import prefdata.train.recipe  # noqa: F401

    for model_dir in model_dirs:
        AutoTokenizer.from_pretrained(str(model_dir))
        causal = "ForCausalLM" in AutoConfig.from_pretrained(str(model_dir)).architectures[0]
        (AutoModelForCausalLM if causal else AutoModelForSequenceClassification).from_pretrained(str(model_dir))


def section(name: str, device: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        policy, rm = _models(work, args.hidden, args.layers)
        _import_both_sides(policy, rm)
        prompts = _prompts(work / "prompts.jsonl", args.prompts)
        print(f"{name}: {args.prompts} prompts x 2 samples, max_new_tokens {args.max_new_tokens}, "
              f"batch {args.batch_pairs} pairs per step (prefdata generates {args.gen_batch} prompts per call), hidden {args.hidden} x {args.layers} layers, device {device}")
        ours = run_prefdata(work / "prompts.jsonl", policy, rm, work / "prefdata-run", args, device)
        theirs = run_trl(prompts, policy, rm, work / "trl-run", args, device)
        print(f"  throughput: prefdata {args.prompts / ours:.2f} prompts/s, TRL {args.prompts / theirs:.2f} prompts/s; "
              f"ratio prefdata/TRL = {theirs / ours:.2f}x")


def _eval_reward(policy: Path, prompts_file: Path, scorer, samples: int, max_new_tokens: int, seed: int,
                 batch_size: int = 64) -> float:
    """Mean reward of fresh samples from `policy` (the same generation code and seed for every policy)."""
    import statistics

    from prefdata.online.generate import generate_rows
    from prefdata.online.sample_settings import SamplingSettings
    from prefdata.online.prompts import read_prompts
    from prefdata.online.score import answer_only

    rows = generate_rows(read_prompts(prompts_file).rows, policy,
                         SamplingSettings(samples=samples, max_new_tokens=max_new_tokens, seed=seed, batch_size=batch_size,
                                          device="cpu"), progress=False)
    rewards = scorer([r["prompt"] for r in rows], [answer_only(r["completion"]) for r in rows], {})
    return statistics.fmean(rewards)


def learn_prefdata(case: dict, out: Path, reward: dict, args: argparse.Namespace,
                   seed: int, per_round: int | None = None) -> tuple[float, list[float], float]:
    """(seconds of the whole run, each round's mean sampled reward, seconds of its rounds by their
    own clock, rounds.jsonl's `seconds`: the loop without the run's set-up). `per_round` prompts a
    round (None: all of them, R rounds)."""
    from prefdata.online.rounds import run_online

    started = time.perf_counter()
    per_round = per_round or args.prompts
    rounds = args.rounds * args.prompts // per_round  # the same prompts and steps whatever the round size
    result = run_online(
        case["prompts"], model=case["policy"], output=out, rounds=rounds, prompts_per_round=per_round,
        samples=2, max_new_tokens=args.max_new_tokens, temperature=1.0, batch_size=min(args.gen_batch, args.prompts),
        batch_pairs=args.batch_pairs, lr=args.lr, beta=args.beta, lr_schedule=args.lr_schedule, epochs=1,
        seed=seed, device="cpu", progress=False, **reward,
    )
    loop = sum(line["seconds"] for line in result.rounds)
    stages: dict[str, float] = {}
    for line in result.rounds:  # where prefdata's time goes, summed over the rounds
        for stage, seconds in line["stage_seconds"].items():
            stages[stage] = stages.get(stage, 0.0) + seconds
    print(f"    prefdata seed {seed} by stage: " + ", ".join(f"{k} {v:.1f}s" for k, v in stages.items()), flush=True)
    return time.perf_counter() - started, [line["reward_mean"] for line in result.rounds], loop


def learn_trl(case: dict, out: Path, reward: dict, args: argparse.Namespace, seed: int,
              trl_defaults: bool = False) -> tuple[float, list[float], float]:
    """TRL at prefdata's settings (fp32, no gradient checkpointing), or with `trl_defaults` at its own
    defaults for those two (gradient checkpointing on, bf16); lr, batch, steps, schedule stay equal."""
    import datasets
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
    from trl.experimental.online_dpo import OnlineDPOConfig, OnlineDPOTrainer

    from prefdata.tiny.learning_case import first_half_share

    started = time.perf_counter()
    policy = AutoModelForCausalLM.from_pretrained(str(case["policy"]), dtype=torch.float32)
    ref = AutoModelForCausalLM.from_pretrained(str(case["policy"]), dtype=torch.float32)
    if "reward_model" in reward:
        funcs = AutoModelForSequenceClassification.from_pretrained(reward["reward_model"], num_labels=1)
        extra = {"reward_processing_classes": AutoTokenizer.from_pretrained(reward["reward_model"])}
    else:
        funcs, extra = first_half_share, {}
    config = OnlineDPOConfig(
        output_dir=str(out), per_device_train_batch_size=args.batch_pairs, num_train_epochs=args.rounds,
        learning_rate=args.lr, beta=[args.beta], max_new_tokens=args.max_new_tokens, temperature=1.0,
        lr_scheduler_type=args.lr_schedule, warmup_steps=0, max_grad_norm=1.0, logging_steps=1,
        save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=seed,
        # TRL's defaults are bf16 and gradient checkpointing on; prefdata trains fp32 without
        # checkpointing on CPU, so the equal-settings row turns both off.
        **({} if trl_defaults else {"bf16": False, "gradient_checkpointing": False}),
    )
    from prefdata.online.prompts import read_prompts

    prompts = [row.prompt for row in read_prompts(case["prompts"]).rows]
    trainer = OnlineDPOTrainer(model=policy, ref_model=ref, reward_funcs=funcs, args=config,
                               train_dataset=datasets.Dataset.from_dict({"prompt": prompts}),
                               processing_class=AutoTokenizer.from_pretrained(str(case["policy"])), **extra)
    from transformers.trainer_callback import PrinterCallback

    trainer.remove_callback(PrinterCallback)  # its per-step dicts would drown the comparison
    loop = trainer.train().metrics["train_runtime"]  # the Trainer's own clock: its training loop
    seconds = time.perf_counter() - started
    trainer.save_model(str(out / "final"))
    steps_per_round = -(-args.prompts // args.batch_pairs)
    scores = [log["objective/scores"] for log in trainer.state.log_history if "objective/scores" in log]
    curve = [sum(scores[i:i + steps_per_round]) / len(scores[i:i + steps_per_round])
             for i in range(0, len(scores), steps_per_round)]
    return seconds, curve, loop


def _own_prompts(source: Path, dest: Path, n: int) -> Path:
    """The first n prompts of `source` (any file `prefdata generate` reads) as conversational rows."""
    from prefdata.online.prompts import read_prompts

    rows = read_prompts(source).rows[:n]
    if len(rows) < n:
        raise SystemExit(f"bench_online: {source} has {len(rows)} usable prompts, --prompts asks for {n}")
    as_messages = [row.prompt if isinstance(row.prompt, list) else [{"role": "user", "content": row.prompt}]
                   for row in rows]
    dest.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in as_messages), encoding="utf-8")
    return dest


def _smollm2_case(work: Path, n: int) -> dict:
    """The real-model case: SmolLM2-135M-Instruct (`make smollm2`) as the policy, the first n
    UltraFeedback prompts (../shared) whose rendered prompt is 64-256 tokens (UF's middle: its quartiles
    are 53 / 112 / 253; the 1,000-token tail would pad every batch to its length), the a-m rule reward."""
    import importlib.util

    from transformers import AutoTokenizer

    from prefdata.tiny.learning_case import REWARD_NAME, REWARD_SOURCE

    spec = importlib.util.spec_from_file_location("_get_smollm2", REPO / "scripts" / "get_smollm2.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    policy, source = script.model_dir(), REPO.parent / "shared" / "assets" / "data" / "ultrafeedback-sample" / "train.jsonl"
    if not script.is_converted(policy):
        raise SystemExit(f"bench_online: SmolLM2 not converted in {policy}: run `make smollm2`")
    if not source.is_file():
        raise SystemExit(f"bench_online: {source} is missing (the real case's prompts)")
    tokenizer, prompts, lengths = AutoTokenizer.from_pretrained(str(policy)), [], []
    for line in source.read_text(encoding="utf-8").splitlines():
        messages = [{"role": "user", "content": json.loads(line)["prompt"]}]
        length = len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False))
        if 64 <= length <= 256 and len(prompts) < n:
            prompts.append(messages)
            lengths.append(length)
    work.mkdir(parents=True, exist_ok=True)
    (work / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p}) + "\n" for p in prompts), encoding="utf-8")
    (work / "rewards.py").write_text(REWARD_SOURCE, encoding="utf-8")
    print(f"  SmolLM2-135M-Instruct (float32, {policy}); {len(prompts)} UltraFeedback prompts of "
          f"{min(lengths)}-{max(lengths)} tokens (mean {sum(lengths) / len(lengths):.0f}) with the chat template")
    return {"policy": policy, "prompts": work / "prompts.jsonl", "reward_fn": Path(f"{work / 'rewards.py'}:{REWARD_NAME}")}


def learn_section(args: argparse.Namespace) -> None:
    from prefdata.online.rewards import RewardModelScorer
    from prefdata.tiny.learning_case import build_learning_case, first_half_share
    from prefdata.tiny.reward import build_tiny_reward_model

    steps = args.rounds * -(-args.prompts // args.batch_pairs)
    print(f"learning: {args.prompts} prompts x 2 samples, {args.max_new_tokens} new tokens, lr {args.lr} "
          f"({args.lr_schedule} over the run), beta {args.beta}, {args.batch_pairs} pairs per step, {steps} optimizer "
          f"steps (prefdata: {args.rounds} rounds x 1 epoch; TRL: {args.rounds} epochs), "
          + ("SmolLM2-135M-Instruct" if args.smollm2 else f"tiny Llama {args.hidden} x {args.layers} layers, 6k vocabulary")
          + ", CPU")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        if args.smollm2:
            case = _smollm2_case(work / "case", args.prompts)
        else:
            case = build_learning_case(work / "case", prompts=args.prompts, hidden_size=args.hidden,
                                       num_layers=args.layers, warm_start_steps=args.warm_start)
        if args.prompts_file:  # the user's own prompts in place of the case's synthetic ones
            case["prompts"] = _own_prompts(Path(args.prompts_file), work / "own-prompts.jsonl", args.prompts)
        _import_both_sides(case["policy"])
        cases = []
        if args.case in ("rule", "both"):
            cases.append(("rule reward (a-m share)", {"reward_fn": str(case["reward_fn"])},
                          lambda p, c, k: first_half_share(p, c)))
        if args.case in ("rm", "both"):
            build_tiny_reward_model(work / "rm", hidden_size=args.hidden, num_layers=args.layers)
            rm = RewardModelScorer(work / "rm", device="cpu", batch_size=64)
            cases.append(("reward model (tiny Llama RM)", {"reward_model": str(work / "rm")}, rm))
        # prefdata's variants: one per --prompts-per-round value, each against the same TRL run per seed.
        variants = {_variant(k, args): k for k in (args.prompts_per_round or [None])}
        for name, reward, scorer in cases:
            gains: dict[str, list[float]] = {"TRL": [], "TRL defaults": [], **{v: [] for v in variants}}
            times: dict[str, list[float]] = {"TRL": [], "TRL defaults": [], **{v: [] for v in variants}}
            loops: dict[str, list[float]] = {"TRL": [], **{v: [] for v in variants}}
            for seed in args.seeds:
                start = _eval_reward(case["policy"], case["prompts"], scorer, args.eval_samples, args.max_new_tokens,
                                     1000 + seed, args.gen_batch)
                curves = {}
                for label, per_round in variants.items():
                    out = work / f"p-{name[:4]}-{seed}-{per_round}"
                    seconds, curves[label], loop = learn_prefdata(case, out, reward, args, seed, per_round)
                    gains[label].append(_eval_reward(out / "policy", case["prompts"], scorer, args.eval_samples,
                                                     args.max_new_tokens, 1000 + seed, args.gen_batch) - start)
                    times[label].append(seconds)
                    loops[label].append(loop)
                theirs_s, curves["TRL"], theirs_loop = learn_trl(case, work / f"t-{name[:4]}-{seed}", reward, args, seed)
                gains["TRL"].append(_eval_reward(work / f"t-{name[:4]}-{seed}" / "final", case["prompts"], scorer,
                                                 args.eval_samples, args.max_new_tokens, 1000 + seed, args.gen_batch)
                                    - start)
                times["TRL"].append(theirs_s)
                loops["TRL"].append(theirs_loop)
                print(f"  {name}, seed {seed}: reward of each round's fresh samples")
                for label, curve in curves.items():
                    print(f"    {label}: " + " -> ".join(f"{v:.4f}" for v in curve))
                print(f"    evaluation ({args.eval_samples} fresh samples per prompt): start {start:.4f}; "
                      + "; ".join(f"{label} gain {gains[label][-1]:+.4f}" for label in (*variants, "TRL")))
                print("    time (whole run; training loop by its own clock): "
                      + "; ".join(f"{label} {times[label][-1]:.1f}s ({loops[label][-1]:.1f}s)" for label in (*variants, "TRL")),
                      flush=True)
                if args.trl_defaults:
                    out = work / f"d-{name[:4]}-{seed}"
                    default_s, _, _ = learn_trl(case, out, reward, args, seed, trl_defaults=True)
                    default = _eval_reward(out / "final", case["prompts"], scorer, args.eval_samples, args.max_new_tokens,
                                     1000 + seed, args.gen_batch)
                    print(f"    TRL at its defaults (bf16, gradient checkpointing): {default:.4f} "
                          f"(gain {default - start:+.4f}), {default_s:.1f}s")
                    gains["TRL defaults"].append(default - start)
                    times["TRL defaults"].append(default_s)
            for label in variants:
                _print_cell(args, name, label, gains, times, loops)


def _variant(per_round: int | None, args: argparse.Namespace) -> str:
    """A prefdata variant's label: its round size in prompts."""
    if per_round is None or per_round == args.prompts:
        return f"prefdata (rounds of all {args.prompts} prompts)"
    if per_round == args.batch_pairs:
        return f"prefdata (fully online: rounds of {per_round} prompts)"
    return f"prefdata (rounds of {per_round} prompts)"


def _print_cell(args: argparse.Namespace, name: str, label: str, gains: dict[str, list[float]],
                times: dict[str, list[float]], loops: dict[str, list[float]]) -> None:
    """One table cell: a prefdata variant's gains and time per prompt against TRL's, paired by seed."""
    import statistics

    prompts_run = args.prompts * args.rounds
    g_ours, g_theirs = statistics.fmean(gains[label]), statistics.fmean(gains["TRL"])
    per_prompt = {k: statistics.fmean(v) / prompts_run for k, v in times.items() if v}
    ratio = "n/a (TRL gained nothing)" if g_theirs <= 0 else f"{g_ours / g_theirs:.2f}x"
    if args.trl_defaults:
        t_default = per_prompt["TRL defaults"]
        print(f"  {name}, TRL at its defaults: mean gain {statistics.fmean(gains['TRL defaults']):+.4f}, "
              f"{t_default * 1000:.0f} ms per prompt ({label} {per_prompt[label] * 1000:.0f} ms: "
              f"{t_default / per_prompt[label]:.2f}x)")
    spread = {k: (max(v) - min(v)) if v else 0.0 for k, v in gains.items()}
    # Paired by seed (same start policy and evaluation draws): is the difference beyond the noise?
    diffs = [a - b for a, b in zip(gains[label], gains["TRL"])]
    sem = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
    print(f"  CELL lr {args.lr:g} | {name} | {label} {g_ours:+.4f} (spread {spread[label]:.4f}) | "
          f"TRL {g_theirs:+.4f} (spread {spread['TRL']:.4f}) | ratio {ratio} | "
          f"difference {statistics.fmean(diffs):+.4f} ± {sem:.4f} (standard error over seeds) | "
          f"{per_prompt[label] * 1000:.0f} / {per_prompt['TRL'] * 1000:.0f} ms per prompt "
          f"({per_prompt['TRL'] / per_prompt[label]:.2f}x); training loops by their own clocks "
          f"{statistics.fmean(loops[label]) / prompts_run * 1000:.0f} / "
          f"{statistics.fmean(loops['TRL']) / prompts_run * 1000:.0f} ms per prompt "
          f"({statistics.fmean(loops['TRL']) / statistics.fmean(loops[label]):.2f}x)", flush=True)


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
    parser.add_argument("--learn", action="store_true", help="the learning benchmark (see above) instead of throughput")
    parser.add_argument("--case", choices=["rule", "rm", "both"], default="both", help="--learn: which reward")
    parser.add_argument("--rounds", type=int, default=4, help="--learn: rounds (TRL: epochs) over the prompts")
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--lr-schedule", default="cosine", choices=["cosine", "linear", "constant"])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0], help="--learn: seeds to average over")
    parser.add_argument("--lrs", type=float, nargs="+", default=None,
                        help="--learn: sweep these learning rates (one table cell per lr and reward)")
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads for both sides (default: torch's; 1 is steadier on a shared machine)")
    parser.add_argument("--trl-defaults", action="store_true",
                        help="--learn: also run TRL at its own defaults (bf16, gradient checkpointing), as its own row")
    parser.add_argument("--eval-samples", type=int, default=16, metavar="K",
                        help="--learn: fresh samples per prompt in the common evaluation (4 left the gain's noise "
                             "about as large as the gain at small learning rates)")
    parser.add_argument("--prompts-file", default=None, metavar="FILE",
                        help="--learn: take the first --prompts prompts of FILE (e.g. real data) instead of the case's")
    parser.add_argument("--warm-start", type=int, default=0, metavar="STEPS",
                        help="--learn: supervised steps on short answers ending in EOS before either run, so the "
                             "policy finishes its answers (0: the random policy, whose samples are all cut off)")
    parser.add_argument("--smollm2", action="store_true",
                        help="--learn: the real-model case: SmolLM2-135M-Instruct (`make smollm2`) on UltraFeedback "
                             "prompts with the a-m rule reward (--case rule only)")
    parser.add_argument("--prompts-per-round", type=int, nargs="+", default=None, metavar="K",
                        help="--learn: prefdata's prompts per round; several values run one prefdata variant each "
                             "against the same TRL run (default: all prompts, R rounds; with --smollm2, --batch-pairs: "
                             "fully online, prefdata online's own default)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads or max(1, torch.get_num_threads()))
    if args.learn:
        learn_defaults = {"prompts": 48, "max_new_tokens": 24, "lr": 2e-3}
        if args.smollm2:  # a real model's learning rate; sized for a quiet machine (about 2 hours on 2 CPU cores, estimated)
            learn_defaults = {"prompts": 16, "max_new_tokens": 32, "lr": 2e-5, "rounds": 2, "batch_pairs": 2,
                              "eval_samples": 4}
        # A flag typed on the command line wins, even where its value equals the parser's default.
        typed = {action.dest for action in parser._actions for opt in action.option_strings
                 if any(arg == opt or arg.startswith(opt + "=") for arg in sys.argv[1:])}
        for key, value in learn_defaults.items():
            if key not in typed:
                setattr(args, key, value)
        if args.smollm2 and "prompts_per_round" not in typed:
            args.prompts_per_round = [args.batch_pairs]  # prefdata online's default, TRL's schedule
        quiet = {"TRANSFORMERS_VERBOSITY": "error", "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
                 "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
        os.environ.update({k: v for k, v in quiet.items() if k not in os.environ})
        if args.smollm2 and args.case != "rule":
            parser.error("--smollm2 has the rule reward only: add --case rule")
        for lr in args.lrs or [args.lr]:
            learn_section(argparse.Namespace(**{**vars(args), "lr": lr}))
        return 0
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
