"""The terminal summary of a report dict: status, rows in/out, the most common flags with example lines."""

from __future__ import annotations

from prefdata.report.render_common import (
    balance_line,
    pct,
    bounded_line,
    Report,
    flags_by_severity,
    headline,
    hint_lines,
    locs,
    status_line,
    threshold_findings,
    threshold_line,
)
from prefdata.report.render_images import images_text
from prefdata.report.render_scored import capped_line, ledger_line
from prefdata.report.render_trainer import trainer_text


def render_text(report: Report, top: int = 8) -> str:
    """A short terminal summary: rows in/out, status, the most common flags with example lines."""
    command = report.get("command") or "report"
    lines = [
        f"prefdata {command}: {report.get('input')} — {status_line(report)}",
        "  " + headline(report),
    ]
    if report.get("scored"):  # records of scored completions: both ledgers in one line
        lines.append("  scored completions: " + ledger_line(report))
        if capped_line(report["scored"]):  # records above the policy's max_pairs_per_record
            lines.append("  " + capped_line(report["scored"]))
    lines += ["  " + line for line in images_text(report)]  # image pairs: sizes, tokens per image
    entries = flags_by_severity(report)  # quarantined records included, as the headline counts them
    if entries:
        lines.append("  flags:")
        width = max(len(name) for name, _ in entries)
        for name, info in entries[:top]:
            where = locs(info.get("examples", []), 3)
            lines.append(f"    {name:<{width}}  {info.get('severity') or '-':<5}  {info['count']:>7,}  e.g. {where}")
        if len(entries) > top:
            lines.append(f"    … and {len(entries) - top} more flags (see the full report)")
    quarantine = report.get("quarantine", {})
    for reason in quarantine.get("reasons", [])[:3]:
        lines.append(f"  quarantined {reason['count']:,}×: {reason['reason']}  ({locs(reason['rows'], 3)})")
    for f in threshold_findings(report):
        if f.get("exceeded"):
            lines.append("  limit: " + threshold_line(f, report).replace("`", ""))
    if report.get("length_balance"):
        lines.append("  " + balance_line(report["length_balance"]).replace("`", ""))
    if report.get("sources"):  # a mixture: each source's kept pairs and share of the output
        lines.append("  sources: " + ", ".join(
            f"{s['name']} {s['kept']:,} kept ({pct(s['share_of_kept'])})" for s in report["sources"]))
    lines += ["  " + line for line in trainer_text(report)]  # validate --trainer: what that trainer trains on
    lines += [f"  hint: {line}" for line in hint_lines(report)]
    if bounded_line(report):
        lines.append("  " + bounded_line(report).replace("`", ""))
    baseline = report.get("baseline")
    if baseline:
        lines.append(
            f"  vs baseline: {baseline['new_flagged_rows']:,} new flagged rows, "
            f"{baseline['regressions']:,} regressions, {baseline['resolved_rows']:,} resolved"
        )
    return "\n".join(lines) + "\n"
