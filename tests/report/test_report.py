"""ReportBuilder on constructed rows: every report section, determinism, the baseline comparison."""

from __future__ import annotations

import json
import random

import pytest

from prefdata.checks.policy import load_policy
from prefdata.core import flags as F
from prefdata.core.records import CheckedRow
from prefdata.core.records import Pair, RawRecord, TokenizedPair
from prefdata.report.baseline import apply_baseline, compare_to_baseline
from prefdata.report.builder import ReportBuilder
from prefdata.report.compact import content_hash
from prefdata.report.distributions import IntDistribution
from prefdata.report.sections import SCHEMA_VERSION, build_report
from prefdata.report.similarity import SimilaritySample

FILE = "data/train.jsonl"


def row(line, prompt="p", chosen="a", rejected="b", flags=(), policy=None, tokenized=None, file=FILE):
    from prefdata.checks.pair import apply_policy

    kept, severity = apply_policy(list(flags), policy or load_policy(None))
    outcome = "dropped" if severity in ("drop", "error") else "kept"
    pair = Pair(file, line, prompt, chosen, rejected)
    return CheckedRow(RawRecord(file, line, value={}), pair, tokenized, kept, severity, outcome)


def quarantined(line, error="invalid JSON: Expecting value", raw_text="{oops", file=FILE):
    raw = RawRecord(file, line, error=error, raw_text=raw_text)
    return CheckedRow(raw, None, None, [], None, "quarantined", error=error)


def tok(prompt, chosen, rejected, full=None):
    """TokenizedPair with the given final lengths; `full` (p, c, r) = lengths before truncation."""
    full = full or (prompt, chosen, rejected)
    return TokenizedPair(list(range(prompt)), list(range(chosen)), list(range(100, 100 + rejected)), *full)


def build(rows, policy=None, **kwargs):
    builder = ReportBuilder(policy or load_policy(None), **kwargs)
    for r in rows:
        builder.add(r)
    return builder, build_report(builder, {}, {"input": "data", "command": "validate"})


def test_outcomes_flag_counts_and_examples_with_lines():
    rows = [row(i, f"prompt {i}", "same", "same", [F.IDENTICAL]) for i in range(1, 9)]
    rows += [row(20, "q", "x", "y", [F.DUPLICATE_PAIR]), row(21, "r", "x", "y"), quarantined(22)]
    _, report = build(rows)
    assert report["schema_version"] == SCHEMA_VERSION
    assert report["outcomes"] == {"kept": 2, "dropped": 8, "quarantined": 1}
    assert report["accounting"] == {
        "rows_in": 11, "rows_out": 2, "rows_dropped": 8, "rows_quarantined": 1,
        # One pair per record: records and pairs are the rows; no scored completions.
        "records_in": 11, "records_paired": 10, "records_unpaired": 0, "records_quarantined": 1,
        "pairs_made": 10, "pairs_kept": 2, "pairs_dropped": 8,
        "scored_records": 0, "completions_in": 0, "completions_paired": 0, "completions_unpaired": 0,
    }
    assert report["scored"] is None
    identical = report["flags"][F.IDENTICAL]
    assert identical["count"] == 8 and identical["severity"] == "drop"
    assert [e["source_line"] for e in identical["examples"]] == [1, 2, 3, 4, 5]  # first five, input order
    assert identical["examples"][0] == {
        "source_file": FILE, "source_line": 1, "outcome": "dropped", "prompt": "prompt 1", "chosen": "same", "rejected": "same",
    }
    assert report["flags"][F.DUPLICATE_PAIR]["severity"] == "warn"
    assert list(report["flags"]) == [F.IDENTICAL, F.DUPLICATE_PAIR]  # most rows first
    assert report["rows_checked"] == 10 and report["rows_flagged"] == 9
    json.dumps(report)  # JSON-able as is


def test_a_record_is_listed_once_among_a_flags_examples():
    """The pairs of one scored record share its line: a reader is sent to that line once."""
    rows = [row(6, "p6", "same", "same", [F.IDENTICAL])]
    rows += [row(60, "p60", "same", "same", [F.IDENTICAL]) for _ in range(3)]
    rows += [row(61, "p61", "same", "same", [F.IDENTICAL]), row(60, "p60", "same", "same", [F.IDENTICAL], file="other.jsonl")]
    _, report = build(rows)
    identical = report["flags"][F.IDENTICAL]
    assert identical["count"] == 6  # every pair counts ...
    examples = [(e["source_file"], e["source_line"]) for e in identical["examples"]]
    assert examples == [(FILE, 6), (FILE, 60), (FILE, 61), ("other.jsonl", 60)]  # ... each place once


def test_excerpts_are_short_single_lines():
    _, report = build([row(1, "line one\nline two " + "x" * 500, "a", "a", [F.IDENTICAL])])
    prompt = report["flags"][F.IDENTICAL]["examples"][0]["prompt"]
    assert "\n" not in prompt and len(prompt) <= 100 and prompt.endswith("…")


def test_quarantine_reasons_with_lines_and_error_severity():
    rows = [quarantined(3), quarantined(5), quarantined(9, error="chosen: expected a string"), row(10)]
    _, report = build(rows)
    q = report["quarantine"]
    assert q["count"] == 3 and q["severity"] == "error"
    assert q["reasons"][0] == {
        "reason": "invalid JSON: Expecting value", "count": 2,
        "rows": [{"source_file": FILE, "source_line": 3}, {"source_file": FILE, "source_line": 5}],
    }
    assert q["reasons"][1]["reason"] == "chosen: expected a string"
    # A record that cannot be read fails a check: errors counts it, status says so.
    assert report["errors"] == 3 and report["status"] == "fail"


def test_status_pass_and_warn():
    assert build([row(1), row(2)])[1]["status"] == "pass"
    _, warned = build([row(1), row(2, flags=[F.NEAR_DUPLICATE])])
    assert warned["status"] == "warn" and warned["warnings"] == 1 and warned["errors"] == 0


def test_error_severity_rows_are_counted_once_each():
    pr = load_policy("checks/pr.toml")
    clean = [row(i, policy=pr) for i in range(2, 21)]  # 1 flagged of 20: under pr.toml's 10% limit
    _, report = build([row(1, "p", "a", "a", [F.IDENTICAL, F.CONFLICTING_PAIR], policy=pr)] + clean, pr)
    assert report["errors"] == 1  # one row, however many error flags it carries
    flag_findings = {f["name"]: f for f in report["findings"] if f["kind"] == "flag"}
    assert flag_findings[F.IDENTICAL]["severity"] == "error"


def test_exact_duplicate_prompts_and_pairs_with_lines():
    rows = [
        row(1, "What is 2+2?", "4", "5"),
        row(2, "What  is 2+2? ", "four", "five"),  # same prompt after whitespace normalization
        row(3, "Other", "x", "y"),
        row(4, "What is 2+2?", "4", "5"),  # exact duplicate pair of line 1
        row(5, "Other", "z", "w"),
    ]
    _, report = build(rows)
    prompts = report["dataset"]["duplicate_prompts"]
    assert prompts["groups"] == 2 and prompts["rows"] == 5 and prompts["extra_copies"] == 3
    top = prompts["top"][0]
    assert top["count"] == 3 and top["excerpt"] == "What is 2+2?"
    assert [r["source_line"] for r in top["rows"]] == [1, 2, 4]
    pairs = report["dataset"]["duplicate_pairs"]
    assert pairs["groups"] == 1 and pairs["rows"] == 2
    assert [r["source_line"] for r in pairs["top"][0]["rows"]] == [1, 4]


def test_conflicting_pairs_come_from_the_flag():
    rows = [row(1, "p", "a", "b"), row(2, "p", "b", "a", [F.CONFLICTING_PAIR])]
    _, report = build(rows)
    conflicting = report["dataset"]["conflicting_pairs"]
    assert conflicting["count"] == 1 and conflicting["examples"][0]["source_line"] == 2


def test_near_duplicate_prompt_clusters_from_minhash_ids():
    builder = ReportBuilder(load_policy(None))
    for i in range(1, 7):
        builder.add(row(i * 10, f"prompt number {i}"))
    builder.add_near_duplicate_prompts([[4, 5], [0, 2, 3], [1]], builder.location)
    near = build_report(builder, {}, {})["dataset"]["near_duplicate_prompts"]
    assert near["computed"] and near["threshold"] == 0.8 and near["method"] == "minhash"
    assert near["clusters"] == 2 and near["rows"] == 5  # singletons are not clusters
    assert near["top"][0]["size"] == 3
    assert near["top"][0]["rows"][0] == {"source_file": FILE, "source_line": 10, "excerpt": "prompt number 1"}
    # The prepare pipeline hands (file, line) tuples; a dict works as well.
    builder.add_near_duplicate_prompts([[7, 8]], {7: ("a.jsonl", 3), 8: ("a.jsonl", 9)})
    near = build_report(builder, {}, {})["dataset"]["near_duplicate_prompts"]
    assert near["top"][0]["rows"] == [{"source_file": "a.jsonl", "source_line": 3}, {"source_file": "a.jsonl", "source_line": 9}]


def test_lengths_in_characters_without_tokens():
    rows = [row(i, "p" * i, "c" * (2 * i), "r" * i) for i in range(1, 101)]
    _, report = build(rows)
    lengths = report["lengths"]
    assert lengths["unit"] == "characters"
    prompt = lengths["prompt"]
    assert prompt["count"] == 100 and prompt["min"] == 1 and prompt["max"] == 100 and prompt["mean"] == 50.5
    assert prompt["quantiles"]["p50"] == 50 and prompt["quantiles"]["p95"] == 95 and prompt["quantiles"]["p99"] == 99
    hist = prompt["histogram"]
    assert sum(hist["counts"]) + hist["overflow"] == 100 and len(hist["edges"]) == len(hist["counts"]) + 1
    assert report["truncation"] == {"available": False, "rows": 0, "reason": "no tokenizer"}
    assert report["length_bias"]["chosen_longer"] == 1.0 and report["length_bias"]["unit"] == "characters"


def test_lengths_in_tokens_before_truncation_and_truncation_rates():
    rows = [
        row(1, tokenized=tok(4, 6, 3, full=(4, 6, 3))),
        row(2, tokenized=tok(2, 6, 6, full=(9, 6, 6))),  # prompt cut
        row(3, tokenized=tok(4, 6, 6, full=(4, 20, 6))),  # chosen cut
        row(4, tokenized=tok(4, 2, 6, full=(4, 2, 30))),  # rejected cut
    ]
    _, report = build(rows)
    assert report["lengths"]["unit"] == "tokens" and report["lengths"]["measured"] == "before truncation"
    assert report["lengths"]["prompt"]["max"] == 9 and report["lengths"]["chosen"]["max"] == 20
    trunc = report["truncation"]
    assert trunc["available"] and trunc["rows"] == 4
    assert trunc["prompt_rate"] == 0.25 and trunc["chosen_rate"] == 0.25 and trunc["rejected_rate"] == 0.25
    assert trunc["any_rate"] == 0.75
    bias = report["length_bias"]
    assert bias["unit"] == "tokens" and bias["chosen_longer"] == 0.5 and bias["rejected_longer"] == 0.25 and bias["equal"] == 0.25


def test_length_histogram_caps_outliers_into_overflow():
    dist = IntDistribution()
    for v in list(range(100)) * 10 + [10**6]:
        dist.add(v)
    hist = dist.to_dict()["histogram"]
    assert hist["overflow"] == 1 and hist["edges"][-1] < 1000
    assert dist.to_dict()["max"] == 10**6


def test_length_bias_limit(tmp_path):
    policy_file = tmp_path / "p.toml"
    policy_file.write_text("[thresholds]\nlength_bias = 0.6\n")
    policy = load_policy(policy_file)
    biased = [row(i, "p", "long answer", "no") for i in range(7)] + [row(9, "p", "a", "bb"), row(10, "p", "a", "bb"), row(11)]
    _, report = build(biased, policy)
    limit = next(f for f in report["findings"] if f["name"] == "length_bias")
    assert limit["exceeded"] and limit["value"] == 0.7 and limit["limit"] == 0.6
    # A dataset limit is no row: it fails the run on its own count, not as an error row.
    assert (report["errors"], report["limits_exceeded"], report["status"]) == (0, 1, "fail")
    _, fine = build(biased[:6] + [row(20, "p", "a", "bb")] * 4, policy)
    assert not next(f for f in fine["findings"] if f["name"] == "length_bias")["exceeded"] and fine["limits_exceeded"] == 0


def test_max_flagged_share(tmp_path):
    policy_file = tmp_path / "p.toml"
    policy_file.write_text("[thresholds]\nmax_flagged_share = 0.25\n")
    policy = load_policy(policy_file)
    rows = [row(i) for i in range(6)] + [row(7, flags=[F.NEAR_DUPLICATE]), row(8, flags=[F.NEAR_DUPLICATE])]
    _, ok = build(rows, policy)
    assert ok["limits_exceeded"] == 0 and ok["status"] != "fail"  # 2/8 = 25%: at the limit is fine
    _, over = build(rows + [row(9, flags=[F.DUPLICATE_PAIR])], policy)
    share = next(f for f in over["findings"] if f["name"] == "max_flagged_share")
    assert share["exceeded"] and share["value"] == pytest.approx(3 / 9, abs=1e-6)
    assert (over["errors"], over["limits_exceeded"], over["status"]) == (0, 1, "fail")


def test_ignored_flags_do_not_count(tmp_path):
    policy_file = tmp_path / "p.toml"
    policy_file.write_text('[flags]\nnear_duplicate = "ignore"\n[thresholds]\nmax_flagged_share = 0.1\n')
    policy = load_policy(policy_file)
    _, report = build([row(i, flags=[F.NEAR_DUPLICATE], policy=policy) for i in range(5)], policy)
    assert report["flags"] == {} and report["errors"] == 0 and report["status"] == "pass"


def test_similarity_distribution_and_threshold_share():
    rows = [row(1, "p", "same text", "same text"), row(2, "p", "abc", "xyz"), row(3, "p", "abcd", "abce")]
    _, report = build(rows)
    sim = report["similarity"]
    assert sim["rows_measured"] == 3 and not sim["sampled"]
    assert sim["histogram"]["counts"][-1] == 1 and sim["histogram"]["counts"][0] == 1
    assert sim["quantiles"]["p99"] == 1.0 and sim["threshold"] == 0.95
    assert sim["share_at_or_above_threshold"] == pytest.approx(1 / 3, abs=1e-5)


def test_similarity_sample_is_bounded_uniform_and_order_independent():
    pairs = [(f"prompt {i}", f"answer {i} " * (i % 7 + 1), f"reply {i}") for i in range(400)]

    def measure(order):
        builder = ReportBuilder(load_policy(None))
        builder.similarity = SimilaritySample(k=50)
        for i in order:
            builder.add(row(i + 1, *pairs[i]))
        return build_report(builder, {}, {})["similarity"]

    forward = measure(range(400))
    shuffled = list(range(400))
    random.Random(1).shuffle(shuffled)
    assert forward["rows_measured"] == 50 and forward["rows_total"] == 400 and forward["sampled"]
    assert measure(shuffled) == forward


def test_similarity_sample_holds_each_distinct_pair_once(monkeypatch):
    """Copies of a pair (same content hash) enter the sample once and are measured once, not on
    every heap comparison between copies."""
    import prefdata.report.similarity as report_module

    calls = []
    real = report_module.similarity
    monkeypatch.setattr(report_module, "similarity", lambda a, b: calls.append(1) or real(a, b))
    builder = ReportBuilder(load_policy(None))
    builder.similarity = SimilaritySample(k=10)
    rows = [row(i + 1, "same prompt", "same answer", "other answer") for i in range(200)]
    rows += [row(300 + i, f"p{i}", f"a{i}", f"b{i}") for i in range(3)]
    for r in rows:
        builder.add(r)
    sim = build_report(builder, {}, {})["similarity"]
    assert sim["rows_measured"] == 4 and sim["rows_total"] == 203
    assert len(calls) == 4


def test_report_is_deterministic_apart_from_generated_at():
    def make():
        rows = [row(i, f"p{i % 5}", "a" * i, "b", [F.NEAR_DUPLICATE] if i % 3 else [], tokenized=tok(3, i, 2)) for i in range(1, 60)]
        rows.append(quarantined(61))
        builder, report = build(rows)
        builder.add_near_duplicate_prompts([[3, 8], [1, 2, 9]], builder.location)
        report = build_report(builder, {}, {"input": "x"})
        report.pop("generated_at")
        return json.dumps(report, sort_keys=True)

    assert make() == make()


def test_content_hash_ignores_position_and_whitespace_but_not_content():
    a = Pair("a.jsonl", 1, "Hello  world", "yes", "no")
    b = Pair("b.jsonl", 99, "Hello world ", "yes", "no")
    c = Pair("a.jsonl", 1, "Hello world", "no", "yes")
    assert content_hash(a) == content_hash(b) != content_hash(c)
    assert len(content_hash(a)) == 16


def test_flagged_rows_list_hashes_flags_and_lines():
    _, report = build([row(1), row(2, "p", "x", "x", [F.IDENTICAL]), quarantined(3)])
    flagged = report["flagged_rows"]
    assert [(r["source_line"], r["flags"], r["severity"]) for r in flagged] == [(2, [F.IDENTICAL], "drop"), (3, [], "error")]
    assert flagged[1]["error"] and report["flagged_rows_complete"] and report["flagged_rows_total"] == 2


def _pr_report(rows_spec):
    pr = load_policy("checks/pr.toml")
    rows = [row(line, p, c, r, flags, policy=pr) for line, p, c, r, flags in rows_spec]
    return build(rows, pr)[1]


def test_baseline_moved_rows_are_not_new_and_new_rows_are_regressions():
    base_rows = [(1, "p1", "a", "a", [F.IDENTICAL])] + [(i, f"q{i}", "good", "bad", []) for i in range(2, 30)]
    base = _pr_report(base_rows)
    # Same content, shifted down by one line: nothing new.
    moved = _pr_report([(line + 1, p, c, r, f) for line, p, c, r, f in base_rows])
    diff = compare_to_baseline(moved, base)
    assert diff["new_flagged_rows"] == 0 and diff["regressions"] == 0
    assert diff["flag_deltas"][F.IDENTICAL] == {"before": 1, "after": 1, "delta": 0}
    # One new identical pair (error under pr.toml) and one new near-duplicate (warn).
    head = _pr_report(base_rows + [(40, "new", "b", "b", [F.IDENTICAL]), (41, "n2", "abc", "abd", [F.NEAR_DUPLICATE])])
    diff = compare_to_baseline(head, base)
    assert diff["new_flagged_rows"] == 2 and diff["new_error_rows"] == 1 and diff["regressions"] == 1
    assert [r["source_line"] for r in diff["new_rows"]] == [40, 41]
    assert diff["flag_deltas"][F.IDENTICAL]["delta"] == 1 and diff["flag_deltas"][F.NEAR_DUPLICATE]["delta"] == 1
    # A fixed row is resolved.
    fixed = _pr_report([(1, "p1", "a", "b", [])] + base_rows[1:])
    assert compare_to_baseline(fixed, base)["resolved_rows"] == 1


def test_apply_baseline_status_only_fails_on_regressions():
    base = _pr_report([(1, "p1", "a", "a", [F.IDENTICAL])] + [(i, f"q{i}", "g", "bad", []) for i in range(2, 30)])
    assert base["status"] == "fail"
    same = apply_baseline(json.loads(json.dumps(base)), base)
    assert same["baseline"]["regressions"] == 0 and same["status"] == "warn"


def test_baseline_threshold_newly_exceeded_is_a_regression():
    good = [(i, f"q{i}", "good", "bad", []) for i in range(1, 20)]
    base = _pr_report(good)
    # 3 near-duplicates of 22 rows = 13.6% > pr.toml's 10% (warn rows, but the limit is an error).
    head = _pr_report(good + [(30 + i, f"n{i}", "abcdefghij", "abcdefghik", [F.NEAR_DUPLICATE]) for i in range(3)])
    diff = compare_to_baseline(head, base)
    assert diff["new_thresholds_exceeded"] == ["max_flagged_share"] and diff["regressions"] == 1
    # Already exceeded in the baseline: not a regression.
    assert compare_to_baseline(head, head)["regressions"] == 0


def test_quarantined_rows_in_baseline_comparison():
    base = build([row(1), quarantined(2)])[1]
    head = build([row(1), quarantined(2), quarantined(3, raw_text='{"prompt": ')])[1]
    diff = compare_to_baseline(head, base)
    assert diff["new_flagged_rows"] == 1 and diff["regressions"] == 1
    assert diff["new_rows"][0]["new_flags"] == ["quarantined"]
    assert diff["flag_deltas"]["quarantined"] == {"before": 1, "after": 2, "delta": 1}


def test_quarantine_is_a_warning_in_prepare_reports():
    builder = ReportBuilder(load_policy(None))
    for r in (row(1), quarantined(2)):
        builder.add(r)
    prepared = build_report(builder, {}, {"command": "prepare"})
    assert prepared["quarantine"]["severity"] == "warn" and prepared["errors"] == 0 and prepared["status"] == "warn"
    validated = build_report(builder, {}, {"command": "validate"})
    assert validated["errors"] == 1 and validated["flagged_rows"][0]["severity"] == "error"
