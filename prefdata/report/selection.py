"""The report of a `prefdata select` run: each signal's distribution before and after, where the cut
fell, what the selection did to length bias, per-source shares and flag counts; report.json's dict
(report/render_selection.py renders it). Its inputs are plain arrays (the select command computes them), so this module
knows nothing of how pairs were chosen."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from prefdata.report.length_bias import bias_dict, count_bias

SCHEMA_VERSION = 1
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9)
HISTOGRAM_BINS = 10


def float_summary(values: np.ndarray, bins: int = HISTOGRAM_BINS) -> dict[str, Any]:
    """count, non-finite count, mean, min, quantiles, max and an equal-width histogram of the finite values."""
    finite = values[np.isfinite(values)]
    out: dict[str, Any] = {"count": int(len(values)), "non_finite": int(len(values) - len(finite))}
    if not len(finite):
        return out
    try:
        with np.errstate(all="raise"):
            moments = _moments(finite, bins, 1.0)
    except (FloatingPointError, ValueError):
        # Values near float64's ends (a reward of ±1.7e308 overflows a sum or a bin width; subnormal ones
        # leave no room for bins): the same figures over the values divided by their largest magnitude.
        with np.errstate(all="ignore"):
            moments = _moments(finite, bins, float(np.abs(finite).max()))
    out.update(mean=moments.pop("mean"), min=float(finite.min()), max=float(finite.max()), **moments)
    return out


def _moments(finite: np.ndarray, bins: int, scale: float) -> dict[str, Any]:
    """Mean, quantiles and histogram of `finite`, computed over `finite / scale` and scaled back."""
    scaled = finite / scale if scale != 1.0 else finite
    counts, edges = np.histogram(scaled, bins=bins)
    return {"mean": float(scaled.mean()) * scale,
            **{f"p{int(q * 100)}": float(np.quantile(scaled, q)) * scale for q in QUANTILES},
            "histogram": {"edges": [float(e) * scale for e in edges], "counts": [int(c) for c in counts]}}


def length_bias(chosen: np.ndarray, rejected: np.ndarray) -> dict[str, Any]:
    bias: Counter[str] = Counter()
    count_bias(bias, chosen, rejected)
    return bias_dict(bias)


def _shares(counts: Counter[str], total: int) -> dict[str, dict[str, Any]]:
    return {key: {"pairs": n, "share": round(n / total, 6) if total else 0.0} for key, n in sorted(counts.items())}


@dataclass(frozen=True)
class Choice:
    """What the selection did: the row positions kept, how many rows each reason left out, the budget
    in pairs and the signal where it cut (None: no budget, or it cut nothing)."""

    kept: np.ndarray
    reasons: Mapping[str, int]
    budget: int | None
    cut: float | None


@dataclass(frozen=True)
class PairFacts:
    """Per row of OUT: the chosen and rejected halves' lengths in tokens, the source file, the flags."""

    chosen_lengths: np.ndarray
    rejected_lengths: np.ndarray
    sources: list[str]
    flags: list[list[str]]


def selection_report(*, signal: str, formula: str, settings: Mapping[str, Any], values: np.ndarray, choice: Choice,
                     other_signals: Mapping[str, np.ndarray], pairs: PairFacts, accounting: Mapping[str, int],
                     lineage: Mapping[str, Any]) -> dict[str, Any]:
    """report.json of NEW. `values`: the selection signal per row of OUT; `choice.kept`: row positions kept."""
    kept, sources, flags = choice.kept, pairs.sources, pairs.flags
    chosen_lengths, rejected_lengths = pairs.chosen_lengths, pairs.rejected_lengths
    mask = np.zeros(len(values), dtype=bool)
    mask[kept] = True
    source_before, source_after = Counter(sources), Counter(s for s, k in zip(sources, mask) if k)
    flags_before = Counter(f for row in flags for f in row)
    flags_after = Counter(f for row, k in zip(flags, mask) if k for f in row)
    signals = {name: {"before": float_summary(v), "after": float_summary(v[mask])}
               for name, v in sorted(other_signals.items())}
    signals[signal] = {"before": float_summary(values), "after": float_summary(values[mask])}
    return {
        "schema_version": SCHEMA_VERSION,
        "command": "select",
        "lineage": dict(lineage),
        "selection": {
            "signal": signal, "formula": formula, "settings": dict(settings), "pairs_in": int(len(values)),
            "kept": int(mask.sum()), "not_selected": int(len(values) - mask.sum()), "reasons": dict(choice.reasons),
            "budget": choice.budget, "cut": choice.cut,
        },
        "signals": signals,
        "length_bias": {"unit": "tokens", "before": length_bias(chosen_lengths, rejected_lengths),
                        "after": length_bias(chosen_lengths[mask], rejected_lengths[mask])},
        "sources": {"before": _shares(source_before, len(values)), "after": _shares(source_after, int(mask.sum()))},
        "flags": {"before": dict(sorted(flags_before.items())), "after": dict(sorted(flags_after.items()))},
        "accounting": dict(accounting),
    }
