"""What a flag's text may be: argparse `type=` functions that turn it into a value or say, in one line,
why not (prefdata.settings.commands declares which flag takes which)."""

from __future__ import annotations

import argparse

from prefdata.core.numbers import OFFSET_MAX


def _int_at_least(text: str, low: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < low:
        raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
    return value


def positive_int(text: str) -> int:
    return _int_at_least(text, 1, "a positive integer")


def non_negative_int(text: str) -> int:
    return _int_at_least(text, 0, "an integer >= 0")


def line_ref(text: str) -> int | str:
    """`show --line`: N, or FILE:N as every report prints a location (`explicit.jsonl:2`)."""
    head, colon, tail = str(text).strip().rpartition(":")
    if not tail.isdigit() or int(tail) < 1 or (colon and not head):
        raise argparse.ArgumentTypeError(f"expected a source line N or FILE:N (as reports print it), got {text!r}")
    return f"{head}:{int(tail)}" if head else int(tail)


def share(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {text!r}") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a share between 0 and 1, got {value}")
    return value


def share_or_count(text: str) -> float | int:
    """--keep: a share of the pairs (0.3 or 30%) or a number of pairs (300)."""
    try:
        if text.strip().endswith("%"):
            value: float | int = float(text.strip()[:-1]) / 100.0
        elif any(ch in text for ch in ".eE"):
            value = float(text)
        else:
            value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a share (0.3, 30%) or a number of pairs (300), got {text!r}") from None
    if (isinstance(value, float) and not 0.0 < value <= 1.0) or (isinstance(value, int) and value < 1):
        raise argparse.ArgumentTypeError(f"expected a share in (0, 1] or a number of pairs >= 1, got {text}")
    return value


def finite_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


# The largest |--offset-scale|: an offset is trained in float32, where beyond 1e4 the logit stops
# moving with the policy (and past 3.4e38 is inf); the scale is held to an offset's own bound
# (docs/select.md, "Bounds"), so a file or flag cannot ask for an inf offset.
OFFSET_SCALE_LIMIT = OFFSET_MAX


def offset_scale(text: str) -> float:
    value = finite_float(text)
    if abs(value) > OFFSET_SCALE_LIMIT:
        raise argparse.ArgumentTypeError(f"expected a number with |A| <= {OFFSET_SCALE_LIMIT:g} (offsets are float32), "
                                         f"got {text}")
    return value


def positive_seconds(text: str) -> float:
    value = finite_float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


# ---- groups shared by several commands ------------------------------------------------------------
