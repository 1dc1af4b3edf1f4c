"""Pairing strategies: which (chosen, rejected) pairs a record's scored completions make.

Pure functions over one record's scores (no I/O), so `prepare` and `validate` make the same pairs
in any worker, on any engine. Randomness (a random lower-rated rejected, the pick among equally
best completions) comes from a generator seeded by the run's pairing seed and the record's group
id, never from the record's position: the pairs do not depend on chunking or the worker count.

Rules every strategy keeps:
- A pair's chosen score exceeds its rejected score by at least `min_margin`, and the two scores
  are never tied (equal within float noise): ties are not paired at all. (Pairs within the
  policy's `tie_threshold` are still marked `tied_reward` by checks.reward.)
- Completions without a score take no part.
- A record without any valid pair says why: `single_completion` (fewer than two scored
  completions), `ties` (every score equal), `below_margin` (scores differ, none by the margin).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from prefdata.errors import PrefdataError

STRATEGIES = ("best-worst", "best-vs-random-lower", "all-pairs", "top-k")
UNPAIRED_REASONS = ("single_completion", "ties", "below_margin")
DEFAULT_RATING = "mean"
DEFAULT_TOP_K = 2


@dataclass(frozen=True)
class PairingSettings:
    """How scored completions become pairs (`--pairing`, `--pairing-seed`, `--min-score-margin`,
    `--rating`, `--top-k`). Checked on construction: a bad value is one PrefdataError line."""

    strategy: str = "best-worst"
    seed: int = 0
    min_margin: float = 0.0  # in the record's own units: score points, or rank steps for ranks
    rating: str = DEFAULT_RATING  # "mean" of a completion's ratings, or one named aspect
    top_k: int = DEFAULT_TOP_K  # pairs per record with strategy "top-k"

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise PrefdataError(f"--pairing must be one of {', '.join(STRATEGIES)}, got {self.strategy!r}")
        if type(self.seed) is not int:
            raise PrefdataError(f"--pairing-seed must be an integer, got {self.seed!r}")
        if not (isinstance(self.min_margin, (int, float)) and math.isfinite(self.min_margin) and self.min_margin >= 0):
            raise PrefdataError(f"--min-score-margin must be a number >= 0, got {self.min_margin!r}")
        if not isinstance(self.rating, str) or not self.rating.strip():
            raise PrefdataError("--rating must be 'mean' or the name of a rating aspect")
        if type(self.top_k) is not int or self.top_k < 1:
            raise PrefdataError(f"--top-k must be a positive integer, got {self.top_k!r}")

    def record(self) -> dict[str, object]:
        """The settings as the manifest's config records them."""
        return {"pairing": self.strategy, "pairing_seed": self.seed, "min_score_margin": self.min_margin,
                "rating": self.rating, "top_k": self.top_k}


@dataclass
class PairChoice:
    """What a record's scores made: `pairs` as (chosen, rejected) completion indices, or the
    `reason` there is none; `ties`: unordered pairs of scored completions with equal scores."""

    pairs: list[tuple[int, int]] = field(default_factory=list)
    reason: str | None = None
    ties: int = 0
    scored: int = 0  # completions with a score


def tied(a: float, b: float) -> bool:
    """Equal scores, allowing float noise (a mean of ratings summed in another order)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def choose_pairs(scores: list[float | None], settings: PairingSettings, key: str) -> PairChoice:
    """The pairs `settings.strategy` makes from `scores` (higher is better; None: unscored).
    `key` (the record's group id) seeds the random choices together with `settings.seed`."""
    scored = [(i, s) for i, s in enumerate(scores) if s is not None]
    choice = PairChoice(scored=len(scored))
    choice.ties = sum(1 for a in range(len(scored)) for b in range(a + 1, len(scored)) if tied(scored[a][1], scored[b][1]))
    if len(scored) < 2:
        choice.reason = "single_completion"
        return choice
    margin = settings.min_margin

    def valid(chosen: float, rejected: float) -> bool:
        return chosen - rejected >= margin and chosen > rejected and not tied(chosen, rejected)

    # Best first; equal scores keep input order (the random picks below choose among them).
    ranked = sorted(scored, key=lambda item: (-item[1], item[0]))
    top, bottom = ranked[0][1], ranked[-1][1]
    if not valid(top, bottom):  # the widest gap fails: no pair can pass
        choice.reason = "ties" if tied(top, bottom) else "below_margin"
        return choice
    rng = random.Random(f"{settings.seed}:{key}")  # str seeds hash with SHA-512: the same in every process
    best = [i for i, s in ranked if tied(s, top)]
    strategy = settings.strategy
    if strategy == "best-worst":
        worst = [i for i, s in ranked if tied(s, bottom)]
        choice.pairs = [(rng.choice(best), rng.choice(worst))]
    elif strategy == "best-vs-random-lower":
        chosen = rng.choice(best)
        lower = [i for i, s in ranked if valid(top, s)]
        choice.pairs = [(chosen, rng.choice(lower))]
    else:
        every = [(i, j) for i, si in ranked for j, sj in ranked if valid(si, sj)]
        if strategy == "top-k":  # the widest gaps first; equal gaps best-first (a stable sort of the ranked pairs)
            every.sort(key=lambda p: -(scores[p[0]] - scores[p[1]]))  # type: ignore[operator]
            every = every[: settings.top_k]
        choice.pairs = every
    return choice
