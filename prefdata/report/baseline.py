"""A report compared with a baseline report (the base branch's): new findings, regressions, deltas."""

from __future__ import annotations

from typing import Any, Mapping


def _finding_keys(report: Mapping[str, Any]) -> set[tuple[str, str]]:
    keys = set()
    for row in report.get("flagged_rows", []):
        for flag in row.get("flags") or ["quarantined"]:
            keys.add((row["hash"], flag))
    return keys


def compare_to_baseline(report: Mapping[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """What changed since `baseline` (a report of the base branch).

    A finding is (content hash, flag); it is new when the baseline has no row with the same content
    carrying the same flag, so moving or reordering rows is not a change. Regressions are new findings
    at error severity, and thresholds exceeded now but not in the baseline."""
    before = _finding_keys(baseline)
    new_rows = []
    for row in report.get("flagged_rows", []):
        new_flags = [f for f in (row.get("flags") or ["quarantined"]) if (row["hash"], f) not in before]
        if new_flags:
            new_rows.append({**row, "new_flags": new_flags})
    now_keys = _finding_keys(report)
    resolved = len({h for h, _ in before} - {h for h, _ in now_keys})

    base_flags = {name: info.get("count", 0) for name, info in baseline.get("flags", {}).items()}
    cur_flags = {name: info.get("count", 0) for name, info in report.get("flags", {}).items()}
    deltas = {
        name: {"before": base_flags.get(name, 0), "after": cur_flags.get(name, 0), "delta": cur_flags.get(name, 0) - base_flags.get(name, 0)}
        for name in sorted(set(base_flags) | set(cur_flags))
    }
    q_before = baseline.get("quarantine", {}).get("count", 0)
    q_after = report.get("quarantine", {}).get("count", 0)
    if q_before or q_after:
        deltas["quarantined"] = {"before": q_before, "after": q_after, "delta": q_after - q_before}

    base_exceeded = {f["name"] for f in baseline.get("findings", []) if f.get("kind") == "threshold" and f.get("exceeded")}
    new_thresholds = [
        f for f in report.get("findings", []) if f.get("kind") == "threshold" and f.get("exceeded") and f["name"] not in base_exceeded
    ]
    new_errors = [r for r in new_rows if r.get("severity") == "error"]
    return {
        "schema_version": baseline.get("schema_version"),
        "input": baseline.get("input"),
        "new_flagged_rows": len(new_rows),
        "new_error_rows": len(new_errors),
        "resolved_rows": resolved,
        "new_rows": new_rows[:1000],
        "new_thresholds_exceeded": [f["name"] for f in new_thresholds],
        "flag_deltas": deltas,
        "rows_in": {"before": baseline.get("accounting", {}).get("rows_in"), "after": report.get("accounting", {}).get("rows_in")},
        "baseline_complete": bool(baseline.get("flagged_rows_complete", True)),
        "regressions": len(new_errors) + len(new_thresholds),
    }


def apply_baseline(report: dict[str, Any], baseline: Mapping[str, Any]) -> dict[str, Any]:
    """Attach the comparison and make `status` reflect regressions only (what a PR check wants)."""
    comparison = compare_to_baseline(report, baseline)
    report["baseline"] = comparison
    if comparison["regressions"]:
        report["status"] = "fail"
    elif report["status"] == "fail":
        report["status"] = "warn"  # known findings: not this change's fault, still worth reading
    return report
