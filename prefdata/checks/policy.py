"""Check policies: what each flag means for a run (drop, error, warn, ignore) and the thresholds.

A policy is a TOML file (see checks/README.md):

    description = "optional free text"
    [flags]
    identical = "drop"          # drop | error | warn | info | ignore
    [thresholds]
    near_duplicate = 0.95       # chosen/rejected similarity >= this -> near_duplicate
    near_duplicate_prompt = 0.8 # MinHash Jaccard of prompt word 3-grams for near-duplicate prompts
    max_flagged_share = false   # share of rows with a warn-or-worse flag above which validate fails
    length_bias = false         # share of pairs with chosen longer than rejected above which it fails
    max_dropped_share = 0.2     # share of pairs dropped (drop or error) above which prepare/validate fail
    tie_threshold = 0.0         # generated pairs whose rewards differ by <= this -> tied_reward
    reward_margin = 1.0         # reward_rejected - reward_chosen > this -> reward_disagrees
    max_image_pixels = 89478485 # images above it (width x height, from the header) are quarantined undecoded
    max_pairs_per_record = 1000 # pairs one record of scored completions makes at most (false: no cap)
    above_max_pairs = "cap"     # above it: "cap" (make max_pairs_per_record of them) or "set_aside" (none)

A file only needs the keys it changes: everything it leaves out keeps the built-in default below.
`false` turns an optional limit off. The bundled policies are package data (prefdata/policies/:
default.toml, the built-in default, and pr.toml), so `--policy pr` works from any directory with an
installed package; checks/default.toml and checks/pr.toml in a clone link to them.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, get_args

from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError
from prefdata.io.images import DEFAULT_MAX_IMAGE_PIXELS
from prefdata.sets.pairing import ABOVE_MAX_PAIRS, DEFAULT_ABOVE_MAX_PAIRS, DEFAULT_MAX_PAIRS

Severity = Literal["drop", "error", "warn", "info", "ignore"]
SEVERITIES: tuple[str, ...] = get_args(Severity)

# Worst first. `error` outranks `drop`: both remove the row, error also fails the command.
# `info` keeps the flag on the row and in the reports without making the row a finding.
SEVERITY_RANK: dict[str, int] = {"error": 3, "drop": 2, "warn": 1, "info": 0, "ignore": 0}

POLICIES_PACKAGE = "prefdata.policies"  # the bundled policies, package data (default.toml, pr.toml)
BUNDLED_POLICIES = ("default", "pr")


def bundled_policy_text(name: str) -> str:
    """The TOML of a policy shipped inside the package (`--policy default`, `--policy pr`)."""
    from importlib.resources import files

    return (files(POLICIES_PACKAGE) / f"{name}.toml").read_text(encoding="utf-8")


DEFAULT_POLICY_TOML = bundled_policy_text("default")  # the one source of the built-in default

# Threshold key -> (Policy attribute, may be turned off with `false`, lowest allowed, open at lowest,
# highest allowed). Shares and similarities live in [0, 1]; reward differences are on the reward's own
# scale, so they have no upper bound.
_THRESHOLDS: dict[str, tuple[str, bool, float, bool, float]] = {
    "near_duplicate": ("near_duplicate_threshold", False, 0.0, True, 1.0),
    "near_duplicate_prompt": ("near_duplicate_prompt_threshold", False, 0.0, True, 1.0),
    "max_flagged_share": ("max_flagged_share", True, 0.0, False, 1.0),
    "length_bias": ("length_bias_limit", True, 0.0, False, 1.0),
    "max_dropped_share": ("max_dropped_share", True, 0.0, False, 1.0),
    "tie_threshold": ("tie_threshold", False, 0.0, False, math.inf),
    "reward_margin": ("reward_margin", False, 0.0, False, math.inf),
    "max_image_pixels": ("max_image_pixels", False, 1.0, False, 2.0**40),
    "max_pairs_per_record": ("max_pairs_per_record", True, 1.0, False, 2.0**40),
}
_WHOLE_NUMBERS = ("max_image_pixels", "max_pairs_per_record")
# Threshold keys whose value is a word, not a number: key -> (Policy attribute, the words allowed).
_CHOICES: dict[str, tuple[str, tuple[str, ...]]] = {"above_max_pairs": ("above_max_pairs", ABOVE_MAX_PAIRS)}
_TOP_LEVEL = {"description": str, "flags": dict, "thresholds": dict}


@dataclass(frozen=True)
class Policy:
    severities: dict[str, Severity]  # every flag in flags.ALL_FLAGS
    near_duplicate_threshold: float
    near_duplicate_prompt_threshold: float
    max_flagged_share: float | None  # None: off
    length_bias_limit: float | None  # None: off
    source: str  # the file it came from, or "default" / a built-in name
    description: str = ""
    tie_threshold: float = 0.0  # |reward_chosen - reward_rejected| <= this: tied_reward (generated pairs)
    reward_margin: float = 1.0  # reward_rejected - reward_chosen > this: reward_disagrees
    # Share of pairs removed (drop or error) above which the run fails; None: off. A run that loses a
    # fifth of its pairs almost always has a setting wrong (--max-length) rather than bad data.
    max_dropped_share: float | None = 0.2
    # Images whose header gives more pixels are quarantined undecoded (prefdata.io.images).
    max_image_pixels: int = DEFAULT_MAX_IMAGE_PIXELS
    # Pairs one record of scored completions makes at most (None: no cap), and what a record above it
    # gets: "cap" (that many of its pairs: all-pairs samples them, top-k keeps the widest) or "set_aside"
    # (none; dropped.jsonl says why).
    max_pairs_per_record: int | None = DEFAULT_MAX_PAIRS
    above_max_pairs: str = DEFAULT_ABOVE_MAX_PAIRS

    def __post_init__(self) -> None:
        missing = [f for f in F.ALL_FLAGS if f not in self.severities]
        if missing:
            raise ValueError(f"policy has no severity for {', '.join(missing)}")

    def severity(self, flag: str) -> Severity:
        try:
            return self.severities[flag]
        except KeyError:
            raise ValueError(f"unknown flag {flag!r}") from None

    def flags_at(self, *severities: Severity) -> list[str]:
        """Flags whose severity is one of `severities`, in flags.ALL_FLAGS order."""
        return [f for f in F.ALL_FLAGS if self.severities[f] in severities]

    def to_dict(self) -> dict[str, Any]:
        """The effective policy, JSON-ready (for the manifest's effective config and reports)."""
        return {
            "source": self.source,
            "description": self.description,
            "flags": {f: self.severities[f] for f in F.ALL_FLAGS},
            "thresholds": {
                "near_duplicate": self.near_duplicate_threshold,
                "near_duplicate_prompt": self.near_duplicate_prompt_threshold,
                "max_flagged_share": self.max_flagged_share,
                "length_bias": self.length_bias_limit,
                "max_dropped_share": self.max_dropped_share,
                "tie_threshold": self.tie_threshold,
                "reward_margin": self.reward_margin,
                "max_image_pixels": self.max_image_pixels,
                "max_pairs_per_record": self.max_pairs_per_record,
                "above_max_pairs": self.above_max_pairs,
            },
        }


def dataset_limit_findings(
    policy: Policy, rows: int, flagged_rows: int, chosen_longer_rows: int
) -> list[str]:
    """One line per dataset-level limit of `policy` that the counts break (empty: all fine).

    `flagged_rows`: rows with at least one flag at warn-or-worse severity. `chosen_longer_rows`:
    pairs whose chosen half is longer than the rejected one. Any finding means validate exits 1.
    """
    findings: list[str] = []
    if rows <= 0:
        return findings
    flagged_share = flagged_rows / rows
    if policy.max_flagged_share is not None and flagged_share > policy.max_flagged_share:
        findings.append(
            f"{flagged_share:.1%} of rows are flagged ({flagged_rows}/{rows}), "
            f"above max_flagged_share {policy.max_flagged_share:.1%}"
        )
    longer_share = chosen_longer_rows / rows
    if policy.length_bias_limit is not None and longer_share > policy.length_bias_limit:
        findings.append(
            f"chosen is longer than rejected in {longer_share:.1%} of pairs "
            f"({chosen_longer_rows}/{rows}), above length_bias {policy.length_bias_limit:.1%}"
        )
    return findings


def load_policy(path: str | Path | None = None) -> Policy:
    """The policy at `path` layered over the built-in default; None (or "default"): the default.
    A bundled policy's name ("pr") works from any directory; a file of that name there wins.

    Any problem with the file raises PrefdataError with one line naming the file and the key.
    """
    base = _parse(tomllib.loads(DEFAULT_POLICY_TOML), None, "default")
    if path is None or (str(path) == "default" and not Path(path).is_file()):
        return base
    p = Path(path)
    if str(path) in BUNDLED_POLICIES and not p.is_file():
        return _parse(tomllib.loads(bundled_policy_text(str(path))), base, str(path))
    if not p.is_file():
        names = ", ".join(f"--policy {name}" for name in BUNDLED_POLICIES)
        raise PrefdataError(f"policy file not found: {p} (the bundled policies need no file: {names})")
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise PrefdataError(f"{p}: not valid TOML: {exc}") from None
    return _parse(data, base, str(p))


def _parse(data: dict[str, Any], base: Policy | None, source: str) -> Policy:
    def fail(msg: str) -> PrefdataError:
        return PrefdataError(f"{source}: {msg}")

    for key, value in data.items():
        if key not in _TOP_LEVEL:
            raise fail(f"unknown key {key!r} (allowed: {', '.join(_TOP_LEVEL)})")
        if not isinstance(value, _TOP_LEVEL[key]):
            raise fail(f"{key!r} must be a {'table' if _TOP_LEVEL[key] is dict else 'string'}")

    severities: dict[str, Severity] = dict(base.severities) if base else {}
    for flag, sev in data.get("flags", {}).items():
        if flag not in F.ALL_FLAGS:
            raise fail(f"unknown flag {flag!r} in [flags]")
        if sev not in SEVERITIES:
            raise fail(f"[flags] {flag} = {sev!r}: severity must be one of {', '.join(SEVERITIES)}")
        severities[flag] = sev
    if base is None and len(severities) != len(F.ALL_FLAGS):  # the embedded default is complete
        raise fail("built-in policy lacks flags")

    attrs = [attr for attr, *_ in _THRESHOLDS.values()] + [attr for attr, _ in _CHOICES.values()]
    values: dict[str, float | str | None] = {attr: getattr(base, attr) for attr in attrs} if base else {}
    for key, value in data.get("thresholds", {}).items():
        if key in _CHOICES:
            attr, words = _CHOICES[key]
            if value not in words:
                raise fail(f"[thresholds] {key} = {value!r}: must be one of {', '.join(repr(w) for w in words)}")
            values[attr] = value
            continue
        if key not in _THRESHOLDS:
            raise fail(f"unknown key {key!r} in [thresholds] (allowed: {', '.join([*_THRESHOLDS, *_CHOICES])})")
        attr, can_be_off, low, open_low, high = _THRESHOLDS[key]
        if value is False and can_be_off:
            values[attr] = None
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            off = " or false" if can_be_off else ""
            raise fail(f"[thresholds] {key} = {value!r}: must be a number{off}")
        v = float(value)
        if not math.isfinite(v) or v > high or v < low or (open_low and v == low):
            lo = f"{'>' if open_low else '>='} {low:g}"
            hi = f" and <= {high:g}" if math.isfinite(high) else " and finite"
            raise fail(f"[thresholds] {key} = {value!r}: must be {lo}{hi}")
        if key == "max_pairs_per_record" and not v.is_integer():
            raise fail(f"[thresholds] {key} = {value!r}: must be a whole number")
        values[attr] = int(v) if key in _WHOLE_NUMBERS else v

    description = data.get("description", base.description if base else "")
    return Policy(
        severities=severities,
        description=description,
        source=source,
        **values,  # type: ignore[arg-type]
    )
