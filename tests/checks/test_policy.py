"""Policy loading: defaults, layering, the shipped files, and one-line errors for bad files."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from prefdata.checks.policy import DEFAULT_POLICY_TOML, dataset_limit_findings, load_policy
from prefdata.core import flags as F
from prefdata.core.errors import PrefdataError

REPO = Path(__file__).resolve().parents[2]

DESIGN_DEFAULTS = {
    F.IDENTICAL: "drop",
    F.WHITESPACE_ONLY: "drop",
    F.NEAR_DUPLICATE: "warn",
    F.IDENTICAL_AFTER_TRUNCATION: "drop",
    F.EMPTY_PROMPT: "warn",
    F.EMPTY_CHOSEN: "drop",
    F.EMPTY_REJECTED: "drop",
    F.NO_COMPLETION_TOKENS: "drop",
    F.COMPLETION_TRUNCATED: "warn",
    F.PROMPT_BOUNDARY_MISMATCH: "warn",
    F.DUPLICATE_PAIR: "warn",
    F.CONFLICTING_PAIR: "warn",
    F.MULTI_TURN_COMPLETION: "warn",
    F.PROMPT_LEAK: "warn",
    F.NON_FINITE_REF_LOGPS: "drop",
    F.TIED_REWARD: "drop",
    F.REWARD_DISAGREES: "warn",
    F.REASONING_LOST: "error",
    F.SYSTEM_LOST: "error",
    F.REASONING_MISMATCH: "warn",
    F.SAME_FINAL_ANSWER: "info",
    F.TOOL_CALL_INVALID: "error",
    F.BENCHMARK_OVERLAP: "drop",
    F.IMAGE_MISMATCH: "error",
    F.IMAGE_TRUNCATED: "drop",
    F.LENGTH_BALANCE: "drop",
    F.ENVIRONMENT_DIFFERS: "drop",
    F.DIVERGES_AT_NON_MODEL_TURN: "drop",
    F.NO_TRAINED_TOKENS: "drop",
    F.UNEQUAL_TURNS: "warn",
    F.TURN_RENDERS_DIFFERENTLY: "error",
    F.NOT_SELECTED: "drop",
}


def test_default_matches_design():
    policy = load_policy()
    # The design's flags keep their defaults; a new check's default is its unit's (tests/checks/test_units.py).
    assert {flag: policy.severities[flag] for flag in DESIGN_DEFAULTS} == DESIGN_DEFAULTS
    assert set(policy.severities) == set(F.ALL_FLAGS)
    assert policy.near_duplicate_threshold == 0.95
    assert policy.near_duplicate_prompt_threshold == 0.8
    assert policy.max_flagged_share is None and policy.length_bias_limit is None
    assert policy.source == "default"


def test_shipped_default_toml_equals_embedded_default():
    shipped = load_policy(REPO / "checks" / "default.toml")
    assert dataclasses.replace(shipped, source="default") == load_policy(None)
    assert (REPO / "checks" / "default.toml").read_text(encoding="utf-8") == DEFAULT_POLICY_TOML


def test_pr_policy_is_strict():
    pr = load_policy(REPO / "checks" / "pr.toml")
    for flag, severity in DESIGN_DEFAULTS.items():
        if severity == "drop" and flag not in (F.LENGTH_BALANCE, F.NOT_SELECTED):  # asked for, not bad data
            assert pr.severity(flag) == "error", flag
    assert pr.severity(F.LENGTH_BALANCE) == "drop"
    assert pr.severity(F.NOT_SELECTED) == "drop"
    assert pr.severity(F.CONFLICTING_PAIR) == "error"
    assert pr.severity(F.PROMPT_LEAK) == "error"
    assert pr.severity(F.NEAR_DUPLICATE) == "warn"  # not listed: keeps the default
    assert pr.max_flagged_share is not None and 0 < pr.max_flagged_share < 1
    assert pr.length_bias_limit is not None


def test_partial_file_overrides_only_what_it_names(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('[flags]\nnear_duplicate = "ignore"\n[thresholds]\nnear_duplicate = 0.9\nlength_bias = 0.7\n')
    policy = load_policy(path)
    assert policy.severity(F.NEAR_DUPLICATE) == "ignore"
    assert policy.severity(F.IDENTICAL) == "drop"
    assert policy.near_duplicate_threshold == 0.9
    assert policy.near_duplicate_prompt_threshold == 0.8
    assert policy.length_bias_limit == 0.7
    assert policy.source == str(path)


def test_false_turns_limits_off(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[thresholds]\nmax_flagged_share = 0.2\n")
    assert load_policy(path).max_flagged_share == 0.2
    path.write_text("[thresholds]\nmax_flagged_share = false\nlength_bias = false\n")
    assert load_policy(path).max_flagged_share is None


def test_to_dict_lists_every_flag_and_threshold():
    d = load_policy().to_dict()
    assert list(d["flags"]) == list(F.ALL_FLAGS)
    assert set(d["thresholds"]) == {
        "near_duplicate", "near_duplicate_prompt", "max_flagged_share", "length_bias", "tie_threshold", "reward_margin",
        "max_dropped_share", "max_image_pixels", "max_pairs_per_record", "above_max_pairs",
    }


def test_the_pairing_cap_is_a_threshold_with_a_choice(tmp_path):
    """max_pairs_per_record: a whole number >= 1 or false (no cap); above_max_pairs: cap | set_aside."""
    default = load_policy()
    assert (default.max_pairs_per_record, default.above_max_pairs) == (1000, "cap")
    path = tmp_path / "p.toml"
    path.write_text('[thresholds]\nmax_pairs_per_record = 50\nabove_max_pairs = "set_aside"\n')
    policy = load_policy(path)
    assert (policy.max_pairs_per_record, policy.above_max_pairs) == (50, "set_aside")
    assert type(policy.max_pairs_per_record) is int
    path.write_text("[thresholds]\nmax_pairs_per_record = false\n")
    assert load_policy(path).max_pairs_per_record is None


@pytest.mark.parametrize(
    "text, needle",
    [
        ('[flags]\nidenticall = "drop"\n', "identicall"),
        ('[flags]\nidentical = "fatal"\n', "identical"),
        ('[flags]\nidentical = 1\n', "identical"),
        ("[thresholds]\nnear_dup = 0.9\n", "near_dup"),
        ("[thresholds]\nnear_duplicate = 1.5\n", "near_duplicate"),
        ("[thresholds]\nnear_duplicate = 0\n", "near_duplicate"),
        ("[thresholds]\nnear_duplicate = false\n", "near_duplicate"),
        ('[thresholds]\nnear_duplicate_prompt = "high"\n', "near_duplicate_prompt"),
        ("[thresholds]\nmax_flagged_share = -0.1\n", "max_flagged_share"),
        ("[thresholds]\nlength_bias = true\n", "length_bias"),
        ("[thresholds]\nlength_bias = nan\n", "length_bias"),
        ("[thresholds]\nmax_pairs_per_record = 0\n", "max_pairs_per_record"),
        ("[thresholds]\nmax_pairs_per_record = 2.5\n", "max_pairs_per_record"),
        ("[thresholds]\nmax_pairs_per_record = true\n", "max_pairs_per_record"),
        ('[thresholds]\nabove_max_pairs = "drop"\n', "above_max_pairs"),
        ("[thresholds]\nabove_max_pairs = 1\n", "above_max_pairs"),
        ("[checks]\nx = 1\n", "checks"),
        ("severity = 'drop'\n", "severity"),
        ("flags = 3\n", "flags"),
        ("[flags\n", "not valid TOML"),
    ],
)
def test_bad_policy_is_one_line_error_naming_key_and_file(tmp_path, text, needle):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(PrefdataError) as info:
        load_policy(path)
    message = str(info.value)
    assert needle in message and str(path) in message
    assert "\n" not in message


def test_missing_policy_file(tmp_path):
    with pytest.raises(PrefdataError, match="not found"):
        load_policy(tmp_path / "nope.toml")


def test_unknown_flag_lookup_is_a_bug():
    with pytest.raises(ValueError):
        load_policy().severity("no_such_flag")


def test_dataset_limit_findings(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[thresholds]\nmax_flagged_share = 0.1\nlength_bias = 0.8\n")
    policy = load_policy(path)
    assert dataset_limit_findings(policy, rows=100, flagged_rows=10, chosen_longer_rows=80) == []
    findings = dataset_limit_findings(policy, rows=100, flagged_rows=11, chosen_longer_rows=81)
    assert len(findings) == 2 and "max_flagged_share" in findings[0] and "length_bias" in findings[1]
    assert dataset_limit_findings(load_policy(), rows=100, flagged_rows=100, chosen_longer_rows=100) == []
    assert dataset_limit_findings(policy, rows=0, flagged_rows=0, chosen_longer_rows=0) == []
