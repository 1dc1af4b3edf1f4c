"""`prefdata online`: rounds of generate -> score -> prepare -> refs -> train on fresh prompts.

Each round samples from the current policy, scores the samples, pairs best vs worst per prompt, and
sends the pairs through `prepare` (the same checks and policy as offline data, plus `tied_reward`),
`compute_refs` (the reference is the starting policy unless `ref_model`) and `train`, which
continues from the last round's policy. As many prompts per round as pairs per optimizer step (one
step per round) is fully online, the default: it samples before every step as TRL's
OnlineDPOTrainer does, and learns as TRL does at every learning rate (bench/bench_online.py --learn).
Many prompts per round is semi-online: cheaper per prompt, but several steps on one sampling.

One run, one optimizer: each round's `train` continues the previous round's AdamW state and a single
learning-rate schedule planned over the whole run (rounds x epochs x ceil(prompts per round / batch
pairs) steps), as TRL's OnlineDPOTrainer keeps one optimizer and one schedule. A schedule that
restarted and decayed to zero inside every round moved the policy far less at the same settings.
The pairs carry the sampled token ids (`generate` keeps them), so training sees exactly what the
policy sampled; the checks read the decoded text next to them.

Layout of DIR: `online_config.json`, `rounds.jsonl` (one line per finished round), `round-<r>/`
(`generations.jsonl`, `pairs.jsonl`, `pairs/` = a prefdata OUT, `policy/` = metrics.jsonl and, at
checkpoints (every `save_every` rounds), that round's trained model and optimizer state) and
`policy/` (the final policy, save_pretrained). A round is finished when its line is in rounds.jsonl;
a rerun after a kill redoes the rounds after the last checkpoint, from its policy and optimizer
state (`round-<r>/policy/optimizer/`), with the same prompts and seeds, so it ends where an
uninterrupted run ends.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.core.quiet import quiet_libraries, wants_quiet
from prefdata.io.manifest import atomic_write_text
from prefdata.online.generate import generate_rows
from prefdata.online.sample_settings import SamplingSettings
from prefdata.online.jsonl import read_jsonl, write_jsonl
from prefdata.online.prompts import PromptRow, read_prompts
from prefdata.online.score import make_scorer, reward_stats, score_generations
from prefdata.settings.commands import OnlineSettings
from prefdata.settings.declare import settings_command
from prefdata.tokenize.template import DEFAULT_TEMPLATE_DATE, TemplateSettings, parse_template_kwargs
from prefdata.train.checkpoint import OPTIMIZER_DIR

ROUNDS_FILE = "rounds.jsonl"
CONFIG_FILE = "online_config.json"
# Settings a rerun must share with the run it continues (the prompt schedule and what was trained).
_RESUME_KEYS = ("prompts", "model", "ref_model", "reward_model", "reward_fn", "prompts_per_round", "samples", "seed",
                "max_new_tokens", "temperature", "top_p", "chat_template", "loss", "beta", "lr", "score_reasoning",
                # the learning-rate schedule spans the planned run: these set its length and shape
                "rounds", "epochs", "batch_pairs", "lr_schedule", "warmup_ratio", "missing_eos_penalty",
                "template_kwargs", "chat_template_file", "template_date")
# Resume keys a run directory written before they existed holds implicitly, at these values.
_RESUME_DEFAULTS = {"score_reasoning": False, "missing_eos_penalty": None, "template_kwargs": {},
                    "chat_template_file": None, "template_date": DEFAULT_TEMPLATE_DATE}
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt")
POLICY_FILE = "online_policy.toml"
# The default checkpoint interval, in prompts: the policy and optimizer go to disk about this often.
CHECKPOINT_PROMPTS = 64
# The check policy of a run given no --policy: the default, except that an empty sampled answer is
# kept (warned). It still ends with the EOS the policy sampled, so it has a token to train on, and it
# is usually the worst sample: dropping its pairs hid from the policy that empty answers are bad
# (TRL's OnlineDPOTrainer trains on them), and runs drifted toward empty answers.
ONLINE_POLICY = """# prefdata online: the default policy, with sampled empty answers kept (see prefdata/online/rounds.py)
[flags]
empty_chosen = "warn"
empty_rejected = "warn"
"""


@dataclass
class OnlineResult:
    output: Path
    policy: Path
    rounds: list[dict[str, Any]] = field(default_factory=list)
    resumed_after: int = 0  # rounds that an earlier run had finished

    def summary(self) -> str:
        lines = [f"{len(self.rounds)} rounds" + (f" ({self.resumed_after} from an earlier run)" if self.resumed_after else "")]
        # This run's rounds were printed as each finished (run_online); only earlier runs' are new here.
        lines += [format_round(line) for line in self.rounds[: self.resumed_after]]
        lines.append(f"policy: {self.policy}\nrounds: {self.output / ROUNDS_FILE}")
        return "\n".join(lines)


def format_round(line: dict[str, Any]) -> str:
    """One human line per round: rewards, pairs, what training did."""
    mean, std = line.get("reward_mean"), line.get("reward_std")
    reward = "-" if mean is None else f"{mean:.4g} ± {std:.3g}"
    if line.get("unfinished"):
        reward += f" ({line['unfinished']} of {line['samples']} samples unfinished)"
    flags = ", ".join(f"{k} {v}" for k, v in sorted(line.get("flag_counts", {}).items())) or "no flags"
    text = (f"round {line['round']}: reward {reward}; pairs {line['pairs_kept']} kept, "
            f"{line['pairs_dropped']} dropped ({flags})")
    if line.get("trained"):
        text += f"; trained {line['steps']} steps, loss {line['loss']:.4f}, margin {line['rewards/margins']:.4f}"
    else:
        text += f"; {line.get('note', 'nothing trained')}"
    return text


@settings_command(OnlineSettings)  # settings=OnlineSettings(...) or flat keywords: prefdata.settings
def run_online(prompts: str | Path, settings: OnlineSettings) -> OnlineResult:
    """Run `rounds` rounds of online DPO into `output` (see the module doc); continue a killed run.
    Each setting is declared once, in `prefdata.settings.commands.OnlineSettings` (`prefdata online
    --help`); pass `settings=OnlineSettings(...)`, flat keywords, or both.
    Generated reasoning stays in the completions that are trained on; rewards read the final answer
    unless `score_reasoning`. `missing_eos_penalty` is subtracted from unfinished samples' rewards
    before pairing (TRL's). The template settings render prompts for generation (as `generate`).
    `save_every` rounds the policy and optimizer are written to the round's directory (a checkpoint a
    rerun continues from); between checkpoints they stay in memory. Default: about every 64 prompts
    (every round at 64 prompts per round, every 8th fully online with 8); the last round always."""
    s = settings
    if any(v is not None and v < 1 for v in (s.rounds, s.prompts_per_round, s.save_every)) or s.samples < 2:
        raise PrefdataError("--rounds, --prompts-per-round and --save-every must be at least 1, --samples at least 2")
    if s.epochs < 1 or s.batch_pairs < 1:
        raise PrefdataError("--epochs and --batch-pairs must be at least 1")
    with quiet_libraries(wants_quiet(s.progress)):  # third-party bars and notices stay quiet
        template = TemplateSettings(parse_template_kwargs(s.template_kwargs),
                                    str(s.chat_template_file) if s.chat_template_file else None, date=s.template_date)
        if not Path(s.model).is_dir():  # type: ignore[arg-type]
            raise PrefdataError(f"--model {s.model} is not a local model directory")
        out = Path(s.output)  # type: ignore[arg-type]
        prompt_rows = read_prompts(prompts).rows
        plan = _plan(s, prompts, len(prompt_rows), template)
        done = _since_last_checkpoint(out, _start_or_resume(out, plan.config))
        policy = s.policy
        if policy is None:
            policy = out / POLICY_FILE
            atomic_write_text(policy, ONLINE_POLICY)
        context = _round_context(s, out, plan, template, policy)
        result = OnlineResult(out, out / "policy", resumed_after=len(done))
        current = checkpoint = current_policy(out, done, Path(s.model))  # type: ignore[arg-type]
        bar = _rounds_bar(plan.rounds, len(done), enabled=s.progress and not plan.stage_bars)
        for r in range(len(done) + 1, plan.rounds + 1):
            line = context.run(r, round_prompts(prompt_rows, r, plan.prompts_per_round), current)
            if line["trained"]:
                current = out / f"round-{r}" / "policy"
            if r == plan.rounds:
                context.save_in_memory_policy(current)  # a last round that trained nothing
            line["saved"] = (current / "config.json").is_file() or current == Path(s.model)  # type: ignore[arg-type]
            if line["saved"]:
                checkpoint = current
            _append_round(out, line)
            bar.write(format_round(line))  # above the bar; plain stdout when there is none
            sys.stdout.flush()  # a log file or pipe gets each round as it finishes
            if line["trained"]:
                bar.set_postfix(reward=f"{line['reward_mean']:.4g}", loss=f"{line['loss']:.4f}", refresh=False)
            bar.update(1)
            result.rounds.append(line)
            if not s.keep_round_policies:
                _drop_old_weights(out, r, checkpoint)
        bar.close()
        _publish_policy(current, out / "policy")
        result.rounds = read_jsonl(out / ROUNDS_FILE)
        return result


@dataclass
class _Plan:
    """The run's shape, decided from the settings and the number of prompts (recorded in config)."""

    prompts_per_round: int
    rounds: int
    save_every: int
    stage_bars: bool
    config: dict[str, Any]


def _plan(s: OnlineSettings, prompts: str | Path, prompt_count: int, template: TemplateSettings) -> _Plan:
    prompts_per_round = s.prompts_per_round
    if prompts_per_round is None:  # fully online: a fresh sampling before every optimizer step (TRL's)
        prompts_per_round = min(s.batch_pairs, prompt_count)
    elif prompts_per_round > prompt_count:
        raise PrefdataError(f"--prompts-per-round {prompts_per_round} is more than the {prompt_count} "
                            f"prompts in {prompts}")
    rounds = s.rounds if s.rounds is not None else math.ceil(prompt_count / prompts_per_round)  # one pass
    # Each stage shows its own bar only where a round is long (several steps on one sampling); a
    # fully online round is one step, and its stages' bars would add two lines a round: one bar
    # over the rounds instead.
    stage_bars = s.progress and prompts_per_round > s.batch_pairs
    # vLLM loads the policy from its directory every round: each round's policy must be on disk.
    save_every = 1 if s.engine == "vllm" else (s.save_every or math.ceil(CHECKPOINT_PROMPTS / prompts_per_round))
    config = {
        "prompts": str(prompts), "model": str(s.model), "ref_model": str(s.ref_model or s.model),
        "reward_model": None if s.reward_model is None else str(s.reward_model), "reward_fn": s.reward_fn,
        "prompts_per_round": prompts_per_round, "samples": s.samples, "seed": s.seed,
        "max_new_tokens": s.max_new_tokens, "temperature": s.temperature, "top_p": s.top_p,
        "chat_template": s.chat_template, "loss": s.loss, "beta": s.beta, "lr": s.lr, "epochs": s.epochs,
        "batch_pairs": s.batch_pairs, "max_length": s.max_length, "engine": s.engine,
        "max_prompt_length": s.max_prompt_length, "policy": None if s.policy is None else str(s.policy),
        "score_reasoning": s.score_reasoning, "rounds": rounds, "warmup_ratio": s.warmup_ratio,
        "lr_schedule": s.lr_schedule, "missing_eos_penalty": s.missing_eos_penalty,
        "template_kwargs": template.kwargs, "chat_template_file": template.chat_template_file,
        "template_date": template.date,
        "schedule_steps": planned_steps(rounds, prompts_per_round, s.epochs, s.batch_pairs),
        "save_every": save_every,
    }
    return _Plan(prompts_per_round, rounds, save_every, stage_bars, config)


def _round_context(s: OnlineSettings, out: Path, plan: _Plan, template: TemplateSettings,
                   policy: str | Path) -> _Round:
    """What every round shares: the scorer, the sampling settings, and the prepare and train settings."""
    scorer = make_scorer(s.reward_model, s.reward_fn, device=s.device, batch_size=s.batch_size,
                         trust_remote_code=s.trust_remote_code, reward_timeout=s.reward_timeout)
    generation = SamplingSettings(samples=s.samples, max_new_tokens=s.max_new_tokens, temperature=s.temperature,
                                  top_p=s.top_p, seed=s.seed, batch_size=s.batch_size, chat_template=s.chat_template,
                                  engine=s.engine, device=s.device, template=template)
    return _Round(
        out=out, start_model=Path(s.model), ref_model=Path(s.ref_model or s.model),  # type: ignore[arg-type]
        scorer=scorer, generation=generation, score_reasoning=s.score_reasoning,
        missing_eos_penalty=s.missing_eos_penalty,
        prepare_kwargs={"max_length": s.max_length, "max_prompt_length": s.max_prompt_length,
                        "chat_template": s.chat_template, "policy": policy, "trust_remote_code": s.trust_remote_code},
        train_kwargs={"loss": s.loss, "beta": s.beta, "lr": s.lr, "epochs": s.epochs, "batch_pairs": s.batch_pairs,
                      "warmup_ratio": s.warmup_ratio, "trust_remote_code": s.trust_remote_code,
                      "lr_schedule": s.lr_schedule, "schedule_steps": plan.config["schedule_steps"],
                      "save_optimizer": True},
        device=s.device, progress=plan.stage_bars, trust_remote_code=s.trust_remote_code, save_every=plan.save_every,
        last_round=plan.rounds,
    )


def _rounds_bar(rounds: int, done: int, enabled: bool) -> Any:
    """The run's progress over rounds (stderr); its `write` puts the round lines on stdout above it."""
    from tqdm.auto import tqdm

    from prefdata.core.quiet import bar_disable

    return tqdm(total=rounds, initial=done, desc="online", unit="round", disable=bar_disable(enabled), dynamic_ncols=True,
                file=sys.stderr)


def planned_steps(rounds: int, prompts_per_round: int, epochs: int, batch_pairs: int) -> int:
    """Optimizer steps of a run in which every prompt gives a kept pair: the schedule's length."""
    return rounds * epochs * math.ceil(prompts_per_round / batch_pairs)


def _since_last_checkpoint(out: Path, done: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The finished rounds up to the last one whose policy is on disk (`saved`; lines written before
    checkpoints existed saved every round); the rounds after it are redone, with the same prompts and
    seeds, so the run ends where an uninterrupted one does."""
    last = max((i for i, line in enumerate(done) if line.get("saved", True)), default=-1)
    if last < len(done) - 1:
        write_jsonl(out / ROUNDS_FILE, done[: last + 1])
    return done[: last + 1]


def round_prompts(rows: list[PromptRow], r: int, per_round: int) -> list[PromptRow]:
    """Round r's prompts (1-based): the next `per_round` prompts, wrapping around at the end."""
    start = (r - 1) * per_round
    return [rows[(start + i) % len(rows)] for i in range(per_round)]


def current_policy(out: Path, done: list[dict[str, Any]], start_model: Path) -> Path:
    """The policy after the finished rounds: the last one that trained, else the starting model."""
    for line in reversed(done):
        if line.get("trained"):
            return out / f"round-{line['round']}" / "policy"
    return start_model


def _start_or_resume(out: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    """The finished rounds of an earlier run in `out` (after checking it ran with the same settings)."""
    config_path = out / CONFIG_FILE
    if config_path.is_file():
        saved = json.loads(config_path.read_text(encoding="utf-8"))
        saved, wanted = {**_RESUME_DEFAULTS, **saved}, {**_RESUME_DEFAULTS, **config}
        changed = [k for k in _RESUME_KEYS if saved.get(k) != wanted.get(k)]
        if changed:
            detail = ", ".join(f"{k}: {saved.get(k)!r} -> {wanted.get(k)!r}" for k in changed)
            raise PrefdataError(f"{out} holds a run with other settings ({detail}): choose another --output")
        rounds_path = out / ROUNDS_FILE
        return read_jsonl(rounds_path) if rounds_path.is_file() else []
    if out.exists() and any(out.iterdir()):
        raise PrefdataError(f"--output {out} exists and is not an online run directory: choose an empty one")
    out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(config_path, json.dumps(config, indent=2) + "\n")
    return []


def _append_round(out: Path, line: dict[str, Any]) -> None:
    """Commit a finished round: rounds.jsonl is rewritten whole and renamed, never half-written."""
    path = out / ROUNDS_FILE
    lines = read_jsonl(path) if path.is_file() else []
    write_jsonl(path, [*lines, line])


def _drop_old_weights(out: Path, finished: int, current: Path) -> None:
    """Delete the weights of earlier rounds' policies (metrics stay); only `current` is needed."""
    for r in range(1, finished + 1):
        policy_dir = out / f"round-{r}" / "policy"
        if policy_dir == current or not policy_dir.is_dir():
            continue
        for file in policy_dir.iterdir():
            if file.is_file() and file.name.endswith(_WEIGHT_SUFFIXES):
                file.unlink()
        shutil.rmtree(policy_dir / OPTIMIZER_DIR, ignore_errors=True)  # the next round continues `current`'s


def _publish_policy(source: Path, target: Path) -> None:
    """Copy the final policy to DIR/policy via a temporary directory and a rename."""
    staging = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(source, staging, ignore=shutil.ignore_patterns("checkpoints", "metrics.jsonl", "train_config.json",
                                                                   OPTIMIZER_DIR))
    old = target.with_name(f".{target.name}.old")
    if target.exists():
        shutil.rmtree(old, ignore_errors=True)
        target.rename(old)
    staging.rename(target)
    shutil.rmtree(old, ignore_errors=True)


@dataclass
class _Round:
    """What every round needs; `run` does one round and returns its rounds.jsonl line."""

    out: Path
    start_model: Path
    ref_model: Path
    scorer: Any
    generation: SamplingSettings
    prepare_kwargs: dict[str, Any]
    train_kwargs: dict[str, Any]
    device: str
    progress: bool
    trust_remote_code: bool
    score_reasoning: bool = False
    missing_eos_penalty: float | None = None
    save_every: int = 1  # rounds between checkpoints (policy and optimizer on disk)
    last_round: int = 1
    # Models kept in memory across rounds: the policy the last round trained (with its directory) and
    # the reference. Loading them again each round cost more than a small round's work; the
    # directories stay the record a rerun starts from. Between checkpoints the policy's directory
    # holds only its metrics, and the optimizer state is carried here too.
    _policy: tuple[Path, Any, Any] | None = None
    _reference: Any = None

    def run(self, r: int, prompts: list[PromptRow], policy_dir: Path) -> dict[str, Any]:
        from dataclasses import replace

        from prefdata.prepare import prepare
        from prefdata.refs import compute_refs
        from prefdata.train import train
        from prefdata.train.stall import TrainingDiverged

        started = time.time()
        rdir = self.out / f"round-{r}"
        shutil.rmtree(rdir, ignore_errors=True)  # an unfinished round of a killed run starts over
        rdir.mkdir(parents=True)
        settings = replace(self.generation, seed=self.generation.seed + r)  # per round: a rerun samples the same
        clock = _Clock()
        in_memory = self._policy[1] if self._policy and self._policy[0] == policy_dir else None
        optimizer_state = self._policy[2] if in_memory is not None else None
        # A policy kept in memory between checkpoints has no weights or tokenizer on disk: the
        # tokenizer is the starting model's (rounds never change it).
        model_dir = policy_dir if (policy_dir / "config.json").is_file() else self.start_model
        rows = generate_rows(prompts, model_dir, settings, progress=self.progress,
                             trust_remote_code=self.trust_remote_code, loaded_model=in_memory)
        clock.lap("generate")
        scored = score_generations(rows, self.scorer, rdir / "generations.jsonl", rdir / "pairs.jsonl", self.progress,
                                   self.score_reasoning, self.missing_eos_penalty)
        clock.lap("score")
        rewards = [row["reward"] for row in rows if row["reward"] is not None]
        line: dict[str, Any] = {
            "round": r, "prompts": len(prompts), "samples": len(rows), "policy_in": str(policy_dir),
            **dict(zip(("reward_mean", "reward_std"), reward_stats(rewards))),
            "finished_share": sum(row["finished"] for row in rows) / len(rows),
            "unfinished": sum(not row["finished"] for row in rows),
            "pairs": scored.pair_stats.pairs if scored.pair_stats else 0,
            "pairs_kept": 0, "pairs_dropped": 0, "flag_counts": {}, "trained": False,
        }
        if not line["pairs"]:
            line["note"] = "no prompt had two samples with a reward: nothing to train"
        else:
            prepared = prepare(rdir / "pairs.jsonl", rdir / "pairs", tokenizer=str(self.start_model), workers=1,
                               progress=self.progress, **self.prepare_kwargs)
            clock.lap("prepare")
            line.update(pairs_kept=prepared.rows_out, pairs_dropped=prepared.rows_dropped + prepared.rows_quarantined,
                        flag_counts=dict(prepared.flag_counts))
            if prepared.rows_out == 0:
                line["note"] = f"all {line['pairs']} pairs were dropped by the checks: nothing to train"
            else:
                compute_refs(rdir / "pairs", model=str(self.ref_model), device=self.device, progress=self.progress,
                             trust_remote_code=self.trust_remote_code, loaded_model=self.reference())
                clock.lap("refs")
                # The first round starts the run's optimizer; later ones continue the last trained
                # round's, from memory or (after a rerun) from its checkpoint.
                continued = None if policy_dir == self.start_model or optimizer_state is not None else policy_dir
                checkpoint = r % self.save_every == 0 or r == self.last_round
                try:
                    trained = train(rdir / "pairs", model=model_dir, output=rdir / "policy",
                                    seed=self.generation.seed + r, save_every=None, device=self.device,
                                    progress=self.progress, optimizer_from=continued, loaded_policy=in_memory,
                                    loaded_optimizer=optimizer_state, save_model=checkpoint, **self.train_kwargs)
                except TrainingDiverged as exc:  # the run stops: no round after it trains on a broken policy
                    raise TrainingDiverged(f"round {r}: {exc}") from None
                self._policy = (rdir / "policy", trained.model, trained.optimizer_state)
                clock.lap("train")
                line.update(trained=True, steps=trained.steps, **_train_means(trained.metrics_path))
        line["seconds"] = round(time.time() - started, 3)
        line["stage_seconds"] = clock.laps
        return line


    def save_in_memory_policy(self, policy_dir: Path) -> None:
        """Write the policy (and optimizer) kept in memory for `policy_dir` to it, if not there yet."""
        if self._policy is None or self._policy[0] != policy_dir or (policy_dir / "config.json").is_file():
            return
        from prefdata.core.tokenizer_cache import load_pretrained_tokenizer
        from prefdata.train.checkpoint import save_final_model, save_optimizer_states

        model, (optimizer_state, scheduler_state) = self._policy[1], self._policy[2]
        save_final_model(model, load_pretrained_tokenizer(self.start_model, self.trust_remote_code), policy_dir, False)
        save_optimizer_states(policy_dir, optimizer_state, scheduler_state)

    def reference(self) -> Any:
        """The reference model, loaded once per run as `compute_refs` would load it."""
        if self._reference is None:
            from prefdata.refs.setup import load_reference_model, resolve_device, resolve_dtype

            device = resolve_device(self.device, 0)
            self._reference = load_reference_model(self.ref_model, resolve_dtype("auto", device), device,
                                                   self.trust_remote_code)
        return self._reference


class _Clock:
    """Seconds per stage of a round (for rounds.jsonl and the benchmark)."""

    def __init__(self) -> None:
        self.laps: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.laps[name] = round(now - self._last, 3)
        self._last = now


def _train_means(metrics_path: Path) -> dict[str, float]:
    """Loss and reward metrics averaged over the round's logged steps (weighted by steps logged)."""
    keys = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "rewards/accuracies")
    lines = [line for line in read_jsonl(metrics_path) if "loss" in line and "step" in line and "event" not in line]
    if not lines:
        return {key: math.nan for key in keys}
    return {key: statistics.fmean(float(line[key]) for line in lines if key in line) for key in keys}
