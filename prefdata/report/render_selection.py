"""Rendering NEW's selection report (prefdata.report.selection collects it): report.md, report.html
and the terminal's summary line, from the report dict alone."""

from __future__ import annotations

from typing import Any, Mapping

from prefdata.report.render_common import esc
from prefdata.report.svg import svg_histogram


def _number(value: Any) -> str:
    return "—" if value is None else f"{value:.4g}"


# A selection that moves the share of chosen-longer pairs by more than this says so in its summary
# line: a length-correlated signal can turn a balanced set into one that teaches "longer wins".
LENGTH_SHIFT_NOTED = 0.05


def summary_line(report: Mapping[str, Any]) -> str:
    """One line for the terminal: what was kept, by what, where the cut fell, and how far the selection
    moved the length bias when it moved it by more than LENGTH_SHIFT_NOTED."""
    s = report["selection"]
    reasons = ", ".join(f"{n:,} {why.replace('_', ' ')}" for why, n in s["reasons"].items() if n)
    cut = f"; cut at {s['signal']} {_number(s['cut'])}" if s["cut"] is not None else ""
    return (f"select: kept {s['kept']:,} of {s['pairs_in']:,} pairs by {s['signal']}{cut}"
            + (f"; not selected: {reasons}" if reasons else "") + _length_shift(report.get("length_bias")))


def _length_shift(bias: Mapping[str, Any] | None) -> str:
    """"; chosen longer (tokens) 47.0% of 100 pairs -> 0.0% of 30 kept", or "" when it barely moved."""
    if not bias or not bias["before"].get("pairs") or not bias["after"].get("pairs"):
        return ""
    before, after = bias["before"], bias["after"]
    if abs(after["chosen_longer"] - before["chosen_longer"]) <= LENGTH_SHIFT_NOTED:
        return ""
    return (f"; chosen longer ({bias.get('unit', 'tokens')}) {before['chosen_longer']:.1%} of {before['pairs']:,} pairs "
            f"-> {after['chosen_longer']:.1%} of {after['pairs']:,} kept")


def render_markdown(report: Mapping[str, Any]) -> str:
    """report.md of NEW."""
    s = report["selection"]
    lines = [f"# prefdata select: {s['kept']:,} of {s['pairs_in']:,} pairs kept by `{s['signal']}`", "",
             f"- signal: `{s['signal']}` = {s['formula']}",
             f"- settings: {', '.join(f'{k}={v}' for k, v in s['settings'].items() if v is not None)}",
             f"- from: `{report['lineage'].get('path')}` (content hash {report['lineage'].get('content_hash')})",
             f"- budget: {s['budget'] if s['budget'] is not None else 'none'}; cut at {_number(s['cut'])}",
             "- not selected: " + (", ".join(f"{n:,} {why}" for why, n in s["reasons"].items()) or "none"), "",
             "## Signals (before → after)", "",
             "| signal | pairs | non-finite | mean | p10 | p50 | p90 |", "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, both in report["signals"].items():
        b, a = both["before"], both["after"]
        cells = [f"{b['count']:,} → {a['count']:,}", f"{b['non_finite']:,} → {a['non_finite']:,}"]
        cells += [f"{_number(b.get(k))} → {_number(a.get(k))}" for k in ("mean", "p10", "p50", "p90")]
        lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
    bias = report["length_bias"]
    lines += ["", "## Length bias (tokens)", "",
              f"chosen longer: {bias['before']['chosen_longer']:.1%} of {bias['before']['pairs']:,} pairs before, "
              f"{bias['after']['chosen_longer']:.1%} of {bias['after']['pairs']:,} after "
              f"(rejected longer {bias['before']['rejected_longer']:.1%} → {bias['after']['rejected_longer']:.1%})",
              "", "## Sources", "", "| source | before | after |", "| --- | --- | --- |"]
    after = report["sources"]["after"]
    for name, b in report["sources"]["before"].items():
        a = after.get(name, {"pairs": 0, "share": 0.0})
        lines.append(f"| `{name}` | {b['pairs']:,} ({b['share']:.1%}) | {a['pairs']:,} ({a['share']:.1%}) |")
    lines += ["", "## Flags on the pairs (before → after)", ""]
    flags_after = report["flags"]["after"]
    lines += [f"- `{flag}`: {n:,} → {flags_after.get(flag, 0):,}" for flag, n in report["flags"]["before"].items()]
    if not report["flags"]["before"]:
        lines.append("- none")
    acc = report["accounting"]
    lines += ["", f"Rows: {acc.get('rows_in', 0):,} in = {acc.get('rows_out', 0):,} kept + "
              f"{acc.get('rows_dropped', 0):,} "
              f"dropped + {acc.get('rows_quarantined', 0):,} quarantined.", ""]
    return "\n".join(lines)


_STYLE = ("body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:60em;color:#101828}"
          "table{border-collapse:collapse;margin:.5em 0}td,th{border:1px solid #d0d5dd;padding:.25em .6em;"
          "text-align:left}svg text{font-size:10px;fill:#475467}.plot{max-width:30em}")


def _table(header: list[str], rows: list[list[str]]) -> str:
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{cell}</td>" for cell in row) + "</tr>" for row in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def render_html(report: Mapping[str, Any]) -> str:
    """report.html of NEW: one self-contained page, the selection signal's histogram with the cut marked."""
    s = report["selection"]
    signal = report["signals"][s["signal"]]["before"]
    plot = ""
    if "histogram" in signal:
        plot = svg_histogram(signal["histogram"]["edges"], signal["histogram"]["counts"], marker=s["cut"],
                             marker_label="cut" if s["cut"] is not None else "")
    facts = [f"signal <code>{esc(s['signal'])}</code> = {esc(s['formula'])}",
             f"from <code>{esc(report['lineage'].get('path'))}</code>",
             f"budget {esc(s['budget'] if s['budget'] is not None else 'none')}; cut at {esc(_number(s['cut']))}",
             "not selected: " + esc(", ".join(f"{n:,} {why}" for why, n in s["reasons"].items()))]
    signals = [[f"<code>{esc(name)}</code>"] + [
        f"{esc(_number(both['before'].get(k)))} → {esc(_number(both['after'].get(k)))}"
        for k in ("mean", "p10", "p50", "p90")]
        + [f"{both['before']['non_finite']:,} → {both['after']['non_finite']:,}"]
        for name, both in report["signals"].items()]
    bias = report["length_bias"]
    after = report["sources"]["after"]
    sources = [[f"<code>{esc(name)}</code>", f"{b['pairs']:,} ({b['share']:.1%})",
                f"{after.get(name, {}).get('pairs', 0):,} ({after.get(name, {}).get('share', 0.0):.1%})"]
               for name, b in report["sources"]["before"].items()]
    flags_after = report["flags"]["after"]
    flags = [[f"<code>{esc(flag)}</code>", f"{n:,}", f"{flags_after.get(flag, 0):,}"]
             for flag, n in report["flags"]["before"].items()]
    acc = report["accounting"]
    return "".join([
        f"<!doctype html><html><head><meta charset='utf-8'><title>prefdata select</title><style>{_STYLE}</style>"
        f"</head><body><h1>prefdata select: {s['kept']:,} of {s['pairs_in']:,} pairs kept</h1>",
        "<ul>" + "".join(f"<li>{fact}</li>" for fact in facts) + "</ul>",
        f"<div class='plot'>{plot}</div>",
        "<h2>Signals (before → after)</h2>", _table(["signal", "mean", "p10", "p50", "p90", "non-finite"], signals),
        "<h2>Length bias (tokens)</h2>",
        f"<p>chosen longer: {bias['before']['chosen_longer']:.1%} of {bias['before']['pairs']:,} pairs before, "
        f"{bias['after']['chosen_longer']:.1%} of {bias['after']['pairs']:,} after</p>",
        "<h2>Sources</h2>", _table(["source", "before", "after"], sources),
        "<h2>Flags on the pairs</h2>", _table(["flag", "before", "after"], flags) if flags else "<p>none</p>",
        f"<p>Rows: {acc.get('rows_in', 0):,} in = {acc.get('rows_out', 0):,} kept + {acc.get('rows_dropped', 0):,} "
        f"dropped + {acc.get('rows_quarantined', 0):,} quarantined.</p></body></html>\n",
    ])
