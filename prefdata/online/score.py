"""`prefdata score`: rewards for generations (then best-vs-worst pairs) or for an offline preference file.

- Generations (rows with a `completion`, as `prefdata generate` writes them): each sample gets a
  `reward` (written back to the generations file unless `output` says otherwise), and each prompt
  gives one pair, highest vs lowest reward, written as `pairs.jsonl` for `prepare` (online.pairs).
- Offline preference rows (any shape `prepare` reads): each row keeps every field and gains
  `reward_chosen`/`reward_rejected`; `prepare`/`validate` then flag `reward_disagrees` where the
  reward model prefers the rejected half by more than the policy's margin.

Reasoning: the scorer sees the final answer only, a leading `<think>…</think>` block removed (and, in
message lists, assistant contents' think blocks and reasoning fields), as most reward models expect;
`score_reasoning=True` (`--score-reasoning`) scores the whole text. The rows keep the whole text.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError, RecordError
from prefdata.core.reasoning import REASONING_FIELDS, message_answer, split_reasoning
from prefdata.io.formats import normalize_record
from prefdata.io.readers import iter_raw_records
from prefdata.online.jsonl import write_jsonl
from prefdata.online.pairs import PairStats, make_pairs
from prefdata.online.rewards import DEFAULT_REWARD_TIMEOUT, RewardFunctionScorer, RewardModelScorer
from prefdata.settings.commands import ScoreSettings
from prefdata.settings.declare import settings_command

Scorer = Callable[..., list[float]]
CHUNK = 1024  # rows per reward-function call / progress step


@dataclass
class ScoreResult:
    mode: str  # "generations" | "pairs"
    output: Path
    rows: int  # rows scored
    unscored: int  # rows left without a reward (unreadable, no text, or a None reward)
    reward_mean: float | None
    reward_std: float | None
    pairs_path: Path | None = None
    pair_stats: PairStats | None = None
    seconds: float = 0.0

    def summary(self) -> str:
        mean = "-" if self.reward_mean is None else f"{self.reward_mean:.4g} ± {self.reward_std or 0:.3g}"
        lines = [f"scored {self.rows} rows (reward {mean}) in {self.seconds:.1f}s -> {self.output}"]
        if self.unscored:
            lines.append(f"{self.unscored} rows have no reward")
        if self.pair_stats is not None:
            lines.append(f"{self.pair_stats.pairs} pairs (best vs worst of {self.pair_stats.prompts} prompts; "
                         f"{self.pair_stats.unpaired} without two rewarded samples) -> {self.pairs_path}")
            lines.append(f"next: prefdata prepare {self.pairs_path} OUT --tokenizer POLICY")
        else:
            lines.append(f"next: prefdata validate {self.output}  (flags reward_disagrees)")
        return "\n".join(lines)


def make_scorer(reward_model: str | Path | None, reward_fn: str | None, *, device: str = "auto",
                batch_size: int = 8, trust_remote_code: bool = False,
                reward_timeout: float | None = DEFAULT_REWARD_TIMEOUT) -> Scorer:
    """The scorer for exactly one of `reward_model` / `reward_fn` (each call of which, and its import,
    within `reward_timeout` seconds)."""
    if (reward_model is None) == (reward_fn is None):
        raise PrefdataError("give exactly one of --reward-model RM and --reward-fn FILE.py:NAME")
    if reward_timeout is not None and not 0 < reward_timeout < math.inf:
        raise PrefdataError(f"--reward-timeout must be a number of seconds > 0, got {reward_timeout}")
    if reward_fn is not None:
        return RewardFunctionScorer(reward_fn, reward_timeout)
    return RewardModelScorer(reward_model, device=device, batch_size=batch_size,  # type: ignore[arg-type]
                             trust_remote_code=trust_remote_code)


@settings_command(ScoreSettings)  # settings=ScoreSettings(...) or flat keywords: prefdata.settings
def score(input: str | Path, settings: ScoreSettings) -> ScoreResult:
    """Score INPUT (see the module doc). Generations are rewritten in place unless `output` is given;
    pairs go to `pairs` (default: pairs.jsonl next to the generations). Offline files go to `output`
    (default: INPUT's name with .scored.jsonl). Rewards read the final answer unless `score_reasoning`.
    Each setting is declared once, in `prefdata.settings.commands.ScoreSettings` (`prefdata score --help`);
    pass `settings=ScoreSettings(...)`, flat keywords (`reward_model="rm"`), or both."""
    s = settings
    started = time.time()
    generations = _generation_rows(input)  # None: an offline preference file
    scorer = make_scorer(s.reward_model, s.reward_fn, device=s.device, batch_size=s.batch_size,
                         trust_remote_code=s.trust_remote_code, reward_timeout=s.reward_timeout)
    source = Path(input)
    if generations is not None:
        result = score_generations(generations, scorer, Path(s.output) if s.output else source,
                                   Path(s.pairs) if s.pairs else source.parent / "pairs.jsonl", s.progress,
                                   s.score_reasoning, s.missing_eos_penalty)
    else:
        default = source.with_name(source.name.split(".")[0] + ".scored.jsonl")
        result = score_pairs(input, scorer, Path(s.output) if s.output else default, s.progress, s.score_reasoning)
    result.seconds = time.time() - started
    return result


def _generation_rows(path: str | Path) -> list[dict[str, Any]] | None:
    """All rows when the first readable record is a generation (has `completion`), else None."""
    rows: list[dict[str, Any]] = []
    for raw in iter_raw_records(path):
        if raw.error is not None or not isinstance(raw.value, dict):
            if rows:
                raise PrefdataError(f"{raw.source_file}:{raw.source_line}: {raw.error or 'record is not an object'}")
            continue
        if not rows and "completion" not in raw.value:
            return None
        rows.append(raw.value)
    return rows or None


def _columns(rows: Sequence[dict[str, Any]], skip: set[str]) -> dict[str, list[Any]]:
    """The other columns, as TRL hands dataset columns to reward functions (one list per key)."""
    keys: list[str] = []
    for row in rows:
        keys.extend(k for k in row if k not in skip and k not in keys)
    return {k: [row.get(k) for row in rows] for k in keys}


def answer_only(completion: Any) -> Any:
    """What a reward reads by default: a string completion without its leading think block; a message
    list with each assistant turn's content cut to its answer and its reasoning fields left out."""
    if isinstance(completion, str):
        return split_reasoning(completion)[1]
    if not isinstance(completion, list):
        return completion
    out = []
    for message in completion:
        if isinstance(message, dict) and message.get("role") == "assistant":
            answer = message_answer(message) if isinstance(message.get("content"), str) else message.get("content")
            message = {**{k: v for k, v in message.items() if k not in REASONING_FIELDS}, "content": answer}
        out.append(message)
    return out


def _score_all(scorer: Scorer, prompts: list[Any], completions: list[Any], columns: list[dict[str, Any]],
               progress: bool, skip: set[str], score_reasoning: bool = False) -> list[float]:
    from tqdm.auto import tqdm

    if not score_reasoning:
        completions = [answer_only(c) for c in completions]
    rewards: list[float] = []
    for start in tqdm(range(0, len(prompts), CHUNK), desc="score", unit=" chunks", disable=not progress or None):
        end = start + CHUNK
        rewards += scorer(prompts[start:end], completions[start:end], _columns(columns[start:end], skip))
    return rewards


def reward_stats(values: list[float]) -> tuple[float | None, float | None]:
    """Mean and population sd of the finite rewards (None, None without any). Taken over the rewards
    divided by the largest magnitude, so that 1e308s do not overflow (both stay within that magnitude)."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return None, None
    scale = max(abs(v) for v in finite) or 1.0
    scaled = [v / scale for v in finite]
    return statistics.fmean(scaled) * scale, statistics.pstdev(scaled) * scale


def _json_reward(value: float) -> float | None:
    return value if math.isfinite(value) else None  # JSON has no NaN: no reward is null


def score_generations(rows: list[dict[str, Any]], scorer: Scorer, output: Path, pairs_path: Path,
                      progress: bool = True, score_reasoning: bool = False,
                      missing_eos_penalty: float | None = None) -> ScoreResult:
    """Add `reward` to every generation row, write them, and write the best-vs-worst pairs (chosen on
    rewards less `missing_eos_penalty` for unfinished samples). Reward functions get the sampled
    `completion_ids` as a keyword, as TRL hands them."""
    for row in rows:
        if not isinstance(row.get("completion"), str) or not isinstance(row.get("prompt"), (str, list)):
            raise PrefdataError("generation rows need a string 'completion' and a 'prompt' (as `prefdata generate` writes)")
    rewards = _score_all(scorer, [r["prompt"] for r in rows], [r["completion"] for r in rows], rows, progress,
                         {"prompt", "completion", "reward", "prompt_ids"}, score_reasoning)
    for row, value in zip(rows, rewards):
        row["reward"] = _json_reward(value)
    write_jsonl(output, rows)
    pair_rows, stats = make_pairs(rows, missing_eos_penalty)
    write_jsonl(pairs_path, pair_rows)
    mean, std = reward_stats(rewards)
    return ScoreResult("generations", output, len(rows), sum(not math.isfinite(v) for v in rewards), mean, std,
                       pairs_path, stats)


def score_pairs(input: str | Path, scorer: Scorer, output: Path, progress: bool = True,
                score_reasoning: bool = False) -> ScoreResult:
    """Add `reward_chosen`/`reward_rejected` to every offline pair that has text to score."""
    records: list[dict[str, Any]] = []
    scorable: list[int] = []
    prompts: list[Any] = []
    chosen: list[Any] = []
    rejected: list[Any] = []
    for raw in iter_raw_records(input):
        if raw.error is not None or not isinstance(raw.value, dict):
            continue  # nothing to write back; `prepare` quarantines it from the original file
        records.append(dict(raw.value))
        try:
            pair = normalize_record(raw)
        except RecordError:
            continue
        if not (pair.chosen or pair.chosen_messages) or not (pair.rejected or pair.rejected_messages):
            continue  # pre-tokenized without text: nothing a reward model can read
        scorable.append(len(records) - 1)
        prompts.append(pair.prompt_messages if pair.prompt_messages is not None else pair.prompt)
        chosen.append(pair.chosen_messages if pair.chosen_messages is not None else pair.chosen)
        rejected.append(pair.rejected_messages if pair.rejected_messages is not None else pair.rejected)
    if not scorable:
        raise PrefdataError(f"{input}: no preference pairs with text to score")
    extras = [records[i] for i in scorable]
    skip = {"prompt", "chosen", "rejected", "reward_chosen", "reward_rejected"}
    chosen_rewards = _score_all(scorer, prompts, chosen, extras, progress, skip, score_reasoning)
    rejected_rewards = _score_all(scorer, prompts, rejected, extras, progress, skip, score_reasoning)
    for i, rc, rr in zip(scorable, chosen_rewards, rejected_rewards):
        records[i]["reward_chosen"], records[i]["reward_rejected"] = _json_reward(rc), _json_reward(rr)
    write_jsonl(output, records)
    mean, std = reward_stats(chosen_rewards + rejected_rewards)
    unscored = len(records) - len(scorable) + sum(not (math.isfinite(a) and math.isfinite(b))
                                                   for a, b in zip(chosen_rewards, rejected_rewards))
    return ScoreResult("pairs", output, len(scorable), unscored, mean, std)
