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
  completions), `ties` (every score equal), `below_margin` (scores differ, none by the margin),
  `too_many_pairs` (the strategy would make more than `max_pairs` pairs and the policy says
  `above_max_pairs = "set_aside"`).
- No record makes more than `max_pairs` pairs (the policy's `max_pairs_per_record`). Above it,
  all-pairs keeps a random sample of `max_pairs` of its pairs (drawn like the other random picks,
  so a fair cross-section of what it would make) and top-k its `max_pairs` widest; with
  `above_max_pairs = "set_aside"` the record makes none.

Bounded work whatever the record holds: ties and valid pairs are counted on sorted scores
(O(n log n), not over every pair), and all-pairs and top-k build only the pairs they keep.
"""

from __future__ import annotations

import bisect
import heapq
import math
import random
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable

from prefdata.core.errors import PrefdataError

STRATEGIES = ("best-worst", "best-vs-random-lower", "all-pairs", "top-k", "sweet-spot")
SWEET_SPOT_SDS = 2.0  # sweet-spot: the rejected nearest mean - 2 sd of the record's scores (arXiv 2502.16825)
UNPAIRED_REASONS = ("single_completion", "ties", "below_margin", "too_many_pairs")
DEFAULT_RATING = "mean"
DEFAULT_TOP_K = 2
# The policy's [thresholds] max_pairs_per_record and above_max_pairs (checks.policy reads them from
# the TOML; these are the built-in defaults). 1000 pairs keep a 45-completion record whole under
# all-pairs; one record of 10,000 completions would otherwise make 50 million.
DEFAULT_MAX_PAIRS = 1000
ABOVE_MAX_PAIRS = ("cap", "set_aside")
DEFAULT_ABOVE_MAX_PAIRS = "cap"


@dataclass(frozen=True)
class PairingSettings:
    """How scored completions become pairs (`--pairing`, `--pairing-seed`, `--min-score-margin`,
    `--rating`, `--top-k`). Checked on construction: a bad value is one PrefdataError line."""

    strategy: str = "best-worst"
    seed: int = 0
    min_margin: float = 0.0  # in the record's own units: score points, or rank steps for ranks
    rating: str = DEFAULT_RATING  # "mean" of a completion's ratings, or one named aspect
    top_k: int = DEFAULT_TOP_K  # pairs per record with strategy "top-k"
    max_pairs: int | None = DEFAULT_MAX_PAIRS  # pairs per record at most (policy); None: no cap
    above_max_pairs: str = DEFAULT_ABOVE_MAX_PAIRS  # "cap": max_pairs of its pairs; "set_aside": none

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
        if self.max_pairs is not None and (type(self.max_pairs) is not int or self.max_pairs < 1):
            raise PrefdataError(f"max_pairs_per_record must be a positive integer, got {self.max_pairs!r}")
        if self.above_max_pairs not in ABOVE_MAX_PAIRS:
            raise PrefdataError(f"above_max_pairs must be one of {', '.join(ABOVE_MAX_PAIRS)}, got {self.above_max_pairs!r}")

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
    possible: int = 0  # pairs the strategy makes without max_pairs (more than `pairs` when capped or set aside)


def tied(a: float, b: float) -> bool:
    """Equal scores, allowing float noise (a mean of ratings summed in another order)."""
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def choose_pairs(scores: list[float | None], settings: PairingSettings, key: str) -> PairChoice:
    """The pairs `settings.strategy` makes from `scores` (higher is better; None: unscored).
    `key` (the record's group id) seeds the random choices together with `settings.seed`."""
    scored = [(i, s) for i, s in enumerate(scores) if s is not None]
    choice = PairChoice(scored=len(scored), ties=count_ties([s for _, s in scored]))
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
        choice.pairs, choice.possible = [(rng.choice(best), rng.choice(worst))], 1
    elif strategy == "best-vs-random-lower":
        chosen = rng.choice(best)
        lower = [i for i, s in ranked if valid(top, s)]
        choice.pairs, choice.possible = [(chosen, rng.choice(lower))], 1
    elif strategy == "sweet-spot":
        choice.pairs, choice.possible = [(rng.choice(best), sweet_spot_rejected(ranked, valid))], 1
    else:
        starts = valid_starts([s for _, s in ranked], valid)
        possible = sum(len(ranked) - start for start in starts)
        if strategy == "top-k":
            possible = min(possible, settings.top_k)
        choice.possible = possible
        limit = possible if settings.max_pairs is None else min(possible, settings.max_pairs)
        if limit < possible and settings.above_max_pairs == "set_aside":
            choice.reason = "too_many_pairs"
            return choice
        if strategy == "all-pairs":  # best-first: every pair, or a random sample of them above the cap
            choice.pairs = listed_pairs(ranked, starts, limit, rng)
        else:  # the widest gaps first; equal gaps best-first (chosen's place in `ranked`, then rejected's)
            choice.pairs = widest_pairs(ranked, valid, limit)
    return choice


def sweet_spot_rejected(ranked: list[tuple[int, float]], valid: Callable[[float, float], bool]) -> int:
    """The rejected completion nearest mean - 2 sd of the record's scores (population sd), among those
    the best may be paired with: as samples per prompt grow, best-vs-worst picks ever more extreme
    rejecteds, and a rejected near mean - 2 sd trains better (arXiv 2502.16825). With few samples the
    target lies below the worst, so this is best-worst. Equally near: the higher-ranked one."""
    values = [s for _, s in ranked]
    mean = math.fsum(values) / len(values)
    sd = math.sqrt(math.fsum((s - mean) ** 2 for s in values) / len(values))
    target = mean - SWEET_SPOT_SDS * sd
    top = values[0]
    lower = [(abs(s - target), place, i) for place, (i, s) in enumerate(ranked) if valid(top, s)]
    return min(lower)[2]


def count_ties(values: list[float]) -> int:
    """Unordered pairs of `values` that are `tied`, in O(n log n): once sorted, the values tied
    with one lie right after it, and that run only moves forward (tied is monotone in the gap)."""
    ordered = sorted(values)
    ties, end = 0, 0
    for i, value in enumerate(ordered):
        end = max(end, i + 1)
        while end < len(ordered) and tied(value, ordered[end]):
            end += 1
        ties += end - i - 1
    return ties


def valid_starts(ranked: list[float], valid: Callable[[float, float], bool]) -> list[int]:
    """For each place i of `ranked` (best first), the first j whose pair (i, j) is `valid`: the
    valid j are a suffix (a wider gap passes where a narrower one did), and it starts no earlier
    for the next i (a narrower gap never passes where a wider one failed). O(n) calls of `valid`."""
    starts, start = [], 0
    for i, value in enumerate(ranked):
        start = max(start, i + 1)
        while start < len(ranked) and not valid(value, ranked[start]):
            start += 1
        starts.append(start)
    return starts


def listed_pairs(ranked: list[tuple[int, float]], starts: list[int], limit: int,
                 rng: random.Random) -> list[tuple[int, int]]:
    """all-pairs: every valid pair best-first (chosen's place, then rejected's), or, when there are
    more than `limit`, `limit` of them drawn by `rng` without building the others (pair number p
    is found from the suffix sizes by bisection), kept in the same order."""
    offsets = [0]
    for start in starts:
        offsets.append(offsets[-1] + len(ranked) - start)
    total = offsets[-1]
    numbers = range(total) if limit >= total else sorted(rng.sample(range(total), limit))
    pairs = []
    for number in numbers:
        i = bisect.bisect_right(offsets, number) - 1
        pairs.append((ranked[i][0], ranked[starts[i] + number - offsets[i]][0]))
    return pairs


def widest_pairs(ranked: list[tuple[int, float]], valid: Callable[[float, float], bool], limit: int) -> list[tuple[int, int]]:
    """The first `limit` valid pairs of `ranked` (best first) by widest gap, then chosen's and
    rejected's place in `ranked`: what sorting every pair would give, built pair by pair.

    A heap walks runs of equal scores (a, b), a before b, from the widest (first run, last run);
    each popped run pair gives its neighbours (a + 1, b) and (a, b - 1), whose gaps are narrower.
    A run pair that fails `valid` is not expanded: its neighbours' scores are closer still. Gaps
    are compared exactly (Fraction): rounding could give a neighbour the same float gap and put it
    out of order. Work: O(limit log limit) beyond the runs."""
    runs: list[tuple[float, int, int]] = []  # (score, first place, end place) in `ranked`
    for place, (_, score) in enumerate(ranked):
        if runs and runs[-1][0] == score:
            runs[-1] = (score, runs[-1][1], place + 1)
        else:
            runs.append((score, place, place + 1))
    exact: dict[int, Fraction] = {}

    def gap(a: int, b: int) -> Fraction:
        for run in (a, b):
            if run not in exact:
                exact[run] = Fraction(runs[run][0])
        return exact[a] - exact[b]

    last = len(runs) - 1
    heap = [(-gap(0, last), 0, last)] if last > 0 else []
    seen = {(0, last)}
    out: list[tuple[int, int]] = []
    while heap and len(out) < limit:
        _, a, b = heapq.heappop(heap)
        if not valid(runs[a][0], runs[b][0]):
            continue
        for i in range(runs[a][1], runs[a][2]):
            for j in range(runs[b][1], runs[b][2]):
                out.append((ranked[i][0], ranked[j][0]))
                if len(out) == limit:
                    return out
        for na, nb in ((a + 1, b), (a, b - 1)):
            if na < nb and (na, nb) not in seen:
                seen.add((na, nb))
                heapq.heappush(heap, (-gap(na, nb), na, nb))
    return out
