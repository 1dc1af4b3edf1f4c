"""Renderers for a report dict (see prefdata/report.py): terminal text, Markdown, self-contained HTML,
and GitHub Actions annotations plus the job step summary.

Every renderer reads only the report dict, so a report.json from any run renders the same way.
The HTML is one file with inline CSS and inline SVG plots: it opens offline and in CI artifacts.
"""

from __future__ import annotations

import html
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

Report = Mapping[str, Any]

FLAG_MEANINGS: dict[str, str] = {
    "identical": "chosen and rejected are identical",
    "whitespace_only": "chosen and rejected differ only in whitespace",
    "near_duplicate": "chosen and rejected are nearly identical",
    "identical_after_truncation": "chosen and rejected token ids are equal after truncation",
    "empty_prompt": "the prompt is empty",
    "empty_chosen": "the chosen completion is empty",
    "empty_rejected": "the rejected completion is empty",
    "no_completion_tokens": "a completion has no tokens left after truncation",
    "completion_truncated": "a completion lost its end (EOS) to truncation",
    "prompt_boundary_mismatch": "prompt tokens are not a prefix of prompt+completion tokens",
    "duplicate_pair": "the same pair appears earlier in the data",
    "conflicting_pair": "the same pair appears earlier with chosen and rejected swapped",
    "multi_turn_completion": "the completion spans several turns",
    "prompt_leak": "the prompt also occurs in the --against data",
    "non_finite_ref_logps": "reference log-probs are not finite",
    "tied_reward": "the two generated samples got the same reward (within the tie threshold)",
    "reward_disagrees": "the reward model prefers rejected over chosen by more than the margin",
    "quarantined": "the record could not be read or normalized",
}

STATUS_WORD = {"pass": "PASS", "warn": "PASS with warnings", "fail": "FAIL"}
STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub rejects a step summary above 1 MiB
GITHUB_ANNOTATION_CAP = 10  # GitHub shows at most 10 error and 10 warning annotations per step


# ----------------------------------------------------------------------------- small helpers


def _pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def _num(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1000 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "–" if value is None else str(value)


def _loc(row: Mapping[str, Any]) -> str:
    return f"{row.get('source_file')}:{row.get('source_line')}"


def _locs(rows: Iterable[Mapping[str, Any]], limit: int = 5) -> str:
    """file:line, file:line … — the file name is only repeated when it changes."""
    parts, last = [], None
    for row in list(rows)[:limit]:
        file = row.get("source_file")
        parts.append(f"{file}:{row.get('source_line')}" if file != last else f":{row.get('source_line')}")
        last = file
    return ", ".join(parts)


_SEVERITY_ORDER = {"error": 0, "drop": 1, "warn": 2}


def _flags_by_severity(report: Report) -> list[tuple[str, Mapping[str, Any]]]:
    """Worst severity first, then most rows: what a reader should look at first."""
    flags = report.get("flags", {})
    return sorted(flags.items(), key=lambda kv: (_SEVERITY_ORDER.get(kv[1].get("severity"), 3), -kv[1]["count"], kv[0]))


def _thresholds(report: Report) -> list[Mapping[str, Any]]:
    return [f for f in report.get("findings", []) if f.get("kind") == "threshold"]


def _threshold_line(f: Mapping[str, Any]) -> str:
    label = {"max_flagged_share": "flagged rows", "length_bias": "chosen longer than rejected"}.get(f["name"], f["name"])
    verdict = "exceeds" if f.get("exceeded") else "within"
    return f"{label}: {_pct(f['value'])} ({verdict} the limit {_pct(f['limit'])}, `{f['name']}`)"


def _headline(report: Report) -> str:
    acc = report.get("accounting", {})
    return (
        f"{_num(acc.get('rows_in', 0))} rows in · {_num(acc.get('rows_out', 0))} kept · "
        f"{_num(acc.get('rows_dropped', 0))} dropped · {_num(acc.get('rows_quarantined', 0))} quarantined"
    )


# ----------------------------------------------------------------------------- terminal text


def render_text(report: Report, top: int = 8) -> str:
    """A short terminal summary: rows in/out, status, the most common flags with example lines."""
    status = report.get("status", "pass")
    command = report.get("command") or "report"
    lines = [
        f"prefdata {command}: {report.get('input')} — {STATUS_WORD.get(status, status)} "
        f"({report.get('errors', 0)} at error severity, {report.get('warnings', 0)} warnings)",
        "  " + _headline(report),
    ]
    flags = report.get("flags", {})
    if flags:
        lines.append("  flags:")
        width = max(len(name) for name in flags)
        for name, info in _flags_by_severity(report)[:top]:
            where = _locs(info.get("examples", []), 3)
            lines.append(f"    {name:<{width}}  {info.get('severity') or '-':<5}  {info['count']:>7,}  e.g. {where}")
        if len(flags) > top:
            lines.append(f"    … and {len(flags) - top} more flags (see the full report)")
    quarantine = report.get("quarantine", {})
    for reason in quarantine.get("reasons", [])[:3]:
        lines.append(f"  quarantined {reason['count']:,}×: {reason['reason']}  ({_locs(reason['rows'], 3)})")
    for f in _thresholds(report):
        if f.get("exceeded"):
            lines.append("  limit: " + _threshold_line(f).replace("`", ""))
    baseline = report.get("baseline")
    if baseline:
        lines.append(
            f"  vs baseline: {baseline['new_flagged_rows']:,} new flagged rows, "
            f"{baseline['regressions']:,} regressions, {baseline['resolved_rows']:,} resolved"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- Markdown


def _md_escape(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ").replace("`", "'")


def _spark(counts: list[int]) -> str:
    """A histogram as one line of block characters (Markdown has no plots)."""
    blocks = " ▁▂▃▄▅▆▇█"
    peak = max(counts) if counts else 0
    if not peak:
        return ""
    return "".join(blocks[0 if c == 0 else max(1, round(c / peak * 8))] for c in counts)


def render_markdown(report: Report, *, max_flagged_examples: int = 5) -> str:
    status = report.get("status", "pass")
    icon = {"pass": "✅", "warn": "⚠️", "fail": "❌"}.get(status, "")
    out: list[str] = [
        f"## {icon} prefdata {report.get('command') or 'report'}: {STATUS_WORD.get(status, status)}",
        "",
        f"`{_md_escape(report.get('input'))}` — {_headline(report)}. "
        f"**{report.get('errors', 0):,}** at error severity, {report.get('warnings', 0):,} warnings. "
        f"Policy: `{_md_escape((report.get('policy') or {}).get('source'))}`.",
        "",
    ]
    limits = _thresholds(report)
    if limits:
        out += ["| limit | value | max | |", "| --- | ---: | ---: | --- |"]
        for f in limits:
            mark = "❌ exceeded" if f.get("exceeded") else "ok"
            out.append(f"| `{f['name']}` | {_pct(f['value'])} | {_pct(f['limit'])} | {mark} |")
        out.append("")

    baseline = report.get("baseline")
    if baseline:
        out += [
            "### Changes against the baseline",
            "",
            f"{baseline['new_flagged_rows']:,} new flagged rows ({baseline['new_error_rows']:,} at error severity), "
            f"{baseline['resolved_rows']:,} resolved; **{baseline['regressions']:,} regressions**"
            + (f"; limits newly exceeded: {', '.join(baseline['new_thresholds_exceeded'])}" if baseline["new_thresholds_exceeded"] else "")
            + ".",
            "",
        ]
        changed = {k: v for k, v in baseline.get("flag_deltas", {}).items() if v["delta"]}
        if changed:
            out += ["| flag | before | after | change |", "| --- | ---: | ---: | ---: |"]
            for name, d in changed.items():
                out.append(f"| `{name}` | {d['before']:,} | {d['after']:,} | {d['delta']:+,} |")
            out.append("")
        if baseline.get("new_rows"):
            out += ["| new finding | where | severity |", "| --- | --- | --- |"]
            for row in baseline["new_rows"][:20]:
                out.append(f"| {', '.join(f'`{f}`' for f in row['new_flags'])} | `{_md_escape(_loc(row))}` | {row.get('severity') or '-'} |")
            if len(baseline["new_rows"]) > 20:
                out.append(f"| … {len(baseline['new_rows']) - 20:,} more | | |")
            out.append("")

    flags = report.get("flags", {})
    out += ["### Flags", ""]
    if flags:
        out += ["| flag | severity | rows | meaning | examples |", "| --- | --- | ---: | --- | --- |"]
        for name, info in _flags_by_severity(report):
            examples = "<br>".join(
                f"`{_md_escape(_loc(e))}` {_md_escape(e.get('prompt', ''))[:60]}" for e in info.get("examples", [])[:max_flagged_examples]
            )
            out.append(
                f"| `{name}` | {info.get('severity') or '-'} | {info['count']:,} | {FLAG_MEANINGS.get(name, '')} | {examples} |"
            )
    else:
        out.append("No flagged rows.")
    out.append("")

    quarantine = report.get("quarantine", {})
    if quarantine.get("count"):
        out += ["### Quarantined records", "", "| reason | rows | lines |", "| --- | ---: | --- |"]
        for reason in quarantine.get("reasons", []):
            out.append(f"| {_md_escape(reason['reason'])} | {reason['count']:,} | `{_md_escape(_locs(reason['rows']))}` |")
        if quarantine.get("other_reasons_count"):
            out.append(f"| other reasons | {quarantine['other_reasons_count']:,} | |")
        out.append("")

    dataset = report.get("dataset", {})
    if dataset:
        dp, dpair = dataset.get("duplicate_prompts", {}), dataset.get("duplicate_pairs", {})
        conf, near = dataset.get("conflicting_pairs", {}), dataset.get("near_duplicate_prompts", {})
        out += [
            "### Dataset-wide",
            "",
            "| check | groups | rows | largest groups (lines) |",
            "| --- | ---: | ---: | --- |",
            f"| exact duplicate prompts | {dp.get('groups', 0):,} | {dp.get('rows', 0):,} | {_groups_md(dp.get('top', []))} |",
            f"| exact duplicate pairs | {dpair.get('groups', 0):,} | {dpair.get('rows', 0):,} | {_groups_md(dpair.get('top', []))} |",
            f"| conflicting pairs (swapped) | – | {conf.get('count', 0):,} | {_md_escape(_locs(conf.get('examples', [])))} |",
            f"| near-duplicate prompts (MinHash ≥ {near.get('threshold')}) | {near.get('clusters', 0):,} | {near.get('rows', 0):,} | "
            + "; ".join(_md_escape(_locs(c["rows"], 3)) + f" ({c['size']})" for c in near.get("top", [])[:3])
            + " |",
            "",
        ]

    lengths = report.get("lengths", {})
    if lengths:
        out += [
            f"### Lengths ({lengths.get('unit')}, {lengths.get('measured')})",
            "",
            "| | mean | p5 | p50 | p95 | p99 | max | histogram |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- |",
        ]
        for name in ("prompt", "chosen", "rejected"):
            d = lengths.get(name, {})
            if not d.get("count"):
                continue
            q = d["quantiles"]
            out.append(
                f"| {name} | {_num(d['mean'])} | {q['p5']:,} | {q['p50']:,} | {q['p95']:,} | {q['p99']:,} | {d['max']:,} | `{_spark(d['histogram']['counts'])}` |"
            )
        out.append("")
    trunc = report.get("truncation", {})
    bias = report.get("length_bias", {})
    sim = report.get("similarity", {})
    out += ["### Truncation, length bias, similarity", ""]
    if trunc.get("available"):
        out.append(
            f"- Truncated: prompt {_pct(trunc['prompt_rate'])}, chosen {_pct(trunc['chosen_rate'])}, "
            f"rejected {_pct(trunc['rejected_rate'])} (any: {_pct(trunc['any_rate'])} of {trunc['rows']:,} tokenized pairs)."
        )
    else:
        out.append(f"- Truncation: not measured ({trunc.get('reason', 'no tokenizer')}).")
    if bias.get("pairs"):
        out.append(
            f"- Length bias ({bias['unit']}): chosen longer in {_pct(bias['chosen_longer'])}, rejected longer in "
            f"{_pct(bias['rejected_longer'])}, equal in {_pct(bias['equal'])} of {bias['pairs']:,} pairs"
            + (f" (limit {_pct(bias['limit'])})." if bias.get("limit") is not None else ".")
        )
    if sim.get("rows_measured"):
        sampled = f" (sample of {sim['rows_measured']:,} of {sim['rows_total']:,})" if sim.get("sampled") else ""
        out.append(
            f"- Chosen/rejected similarity{sampled}: mean {sim['mean']:.3f}, median {sim['quantiles']['p50']:.3f}, "
            f"p95 {sim['quantiles']['p95']:.3f}; `{_spark(sim['histogram']['counts'])}` over 0…1"
            + (f"; {_pct(sim['share_at_or_above_threshold'])} at or above {sim['threshold']}" if "threshold" in sim else "")
            + "."
        )
    out += ["", f"<sub>prefdata {report.get('prefdata_version')} · report schema {report.get('schema_version')} · {report.get('generated_at')}</sub>", ""]
    return "\n".join(out)


def _groups_md(top: list[Mapping[str, Any]]) -> str:
    return "; ".join(
        f"{g['count']}× `{_md_escape(_locs(g['rows'], 3))}`" + (f" “{_md_escape(g['excerpt'][:40])}”" if g.get("excerpt") else "")
        for g in top[:3]
    )


# ----------------------------------------------------------------------------- HTML

_CSS = """
:root{--bg:#f6f7f9;--card:#fff;--ink:#1d2330;--mute:#667085;--line:#e4e7ec;--accent:#3e63dd;
--ok:#12805c;--okbg:#e3f6ee;--warn:#b54708;--warnbg:#fef0c7;--err:#c01048;--errbg:#ffe4e8;--drop:#6941c6;--dropbg:#f0eafe}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--ink);font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif}
main{max-width:1180px;margin:0 auto;padding:28px 24px 48px}
header{display:flex;align-items:center;gap:16px;flex-wrap:wrap;margin-bottom:6px}
h1{font-size:22px;margin:0}
h2{font-size:16px;margin:32px 0 10px;padding-bottom:6px;border-bottom:1px solid var(--line)}
.sub{color:var(--mute);font-size:13px;margin-bottom:18px;word-break:break-all}
.badge{display:inline-block;padding:2px 10px;border-radius:999px;font-weight:600;font-size:12px;letter-spacing:.02em}
.pass{background:var(--okbg);color:var(--ok)}.warn{background:var(--warnbg);color:var(--warn)}
.fail,.error{background:var(--errbg);color:var(--err)}.drop{background:var(--dropbg);color:var(--drop)}
.ignore,.none{background:#f2f4f7;color:var(--mute)}
.big{font-size:14px;padding:4px 14px}
.cards{display:grid;grid-template-columns:repeat(auto-fit,minmax(150px,1fr));gap:12px}
.card{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:14px 16px}
.card .v{font-size:26px;font-weight:650;font-variant-numeric:tabular-nums}
.card .k{color:var(--mute);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.card .s{color:var(--mute);font-size:12px}
.card.e .v{color:var(--err)}.card.w .v{color:var(--warn)}
table{width:100%;border-collapse:collapse;background:var(--card);border:1px solid var(--line);border-radius:10px;overflow:hidden}
th,td{text-align:left;padding:8px 12px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:#fafbfc;color:var(--mute);font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.03em}
tr:last-child td{border-bottom:none}
td.n{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
code,.loc{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.loc{color:var(--accent);white-space:nowrap}
.ex{color:var(--mute);font-size:12px;margin:2px 0}
.ex q{color:var(--ink)}
.meaning{color:var(--mute);font-size:12px}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(340px,1fr));gap:14px}
.plot{background:var(--card);border:1px solid var(--line);border-radius:10px;padding:12px 14px}
.plot h3{font-size:13px;margin:0 0 2px}.plot .q{color:var(--mute);font-size:12px;margin-bottom:4px}
svg text{font:10px system-ui,sans-serif;fill:#667085}
.bar{display:flex;height:22px;border-radius:6px;overflow:hidden;border:1px solid var(--line);background:#f2f4f7;position:relative}
.bar span{display:block;height:100%}
.legend{display:flex;gap:6px 16px;white-space:nowrap;color:var(--mute);font-size:12px;margin-top:6px;flex-wrap:wrap}
.dot{display:inline-block;width:10px;height:10px;border-radius:3px;margin-right:5px;vertical-align:-1px}
.meter{height:8px;background:#eef0f4;border-radius:4px;overflow:hidden;min-width:120px}
.meter span{display:block;height:100%;background:var(--accent)}
.empty{color:var(--mute);background:var(--card);border:1px dashed var(--line);border-radius:10px;padding:14px}
footer{color:var(--mute);font-size:12px;margin-top:36px}
"""


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _svg_histogram(
    edges: list[float],
    counts: list[int],
    *,
    color: str = "#3e63dd",
    overflow: int = 0,
    marker: float | None = None,
    marker_label: str = "",
    fmt=_num,
    width: int = 360,
    height: int = 150,
) -> str:
    """A bar chart as inline SVG: bars, a baseline, min/mid/max x labels, a peak y label."""
    if not counts:
        return ""
    bars = counts + ([overflow] if overflow else [])
    peak = max(bars) or 1
    left, right, top, bottom = 34, 8, 10, 22
    plot_w, plot_h = width - left - right, height - top - bottom
    step = plot_w / len(bars)
    parts = [
        f'<svg viewBox="0 0 {width} {height}" width="100%" role="img" xmlns="http://www.w3.org/2000/svg">',
        f'<line x1="{left}" y1="{top + plot_h}" x2="{width - right}" y2="{top + plot_h}" stroke="#d0d5dd"/>',
        f'<line x1="{left}" y1="{top}" x2="{width - right}" y2="{top}" stroke="#f0f1f3" stroke-dasharray="3 3"/>',
        f'<text x="{left - 4}" y="{top + 4}" text-anchor="end">{_e(fmt(peak))}</text>',
        f'<text x="{left - 4}" y="{top + plot_h}" text-anchor="end">0</text>',
    ]
    for i, count in enumerate(bars):
        h = plot_h * count / peak
        x = left + i * step
        is_over = overflow and i == len(bars) - 1
        label = f"≥ {fmt(edges[-1])}" if is_over else f"{fmt(edges[i])} – {fmt(edges[i + 1])}"
        fill = "#98a2b3" if is_over else color
        parts.append(
            f'<rect x="{x + 0.8:.1f}" y="{top + plot_h - h:.1f}" width="{max(step - 1.6, 0.8):.1f}" '
            f'height="{h:.1f}" rx="1.5" fill="{fill}"><title>{_e(label)}: {count:,}</title></rect>'
        )
    x_max = edges[-1]
    for frac, anchor in ((0.0, "start"), (0.5, "middle"), (1.0, "end")):
        value = edges[0] + (x_max - edges[0]) * frac
        x = left + (plot_w - (step if overflow else 0)) * frac
        parts.append(f'<text x="{x:.1f}" y="{height - 6}" text-anchor="{anchor}">{_e(fmt(value))}</text>')
    if marker is not None and x_max > edges[0]:
        mx = left + (plot_w - (step if overflow else 0)) * (marker - edges[0]) / (x_max - edges[0])
        parts.append(f'<line x1="{mx:.1f}" y1="{top}" x2="{mx:.1f}" y2="{top + plot_h}" stroke="#c01048" stroke-dasharray="4 3"/>')
        parts.append(f'<text x="{mx - 3:.1f}" y="{top + 9}" text-anchor="end" style="fill:#c01048">{_e(marker_label)}</text>')
    parts.append("</svg>")
    return "".join(parts)


def _card(key: str, value: Any, sub: str = "", cls: str = "") -> str:
    return f'<div class="card {cls}"><div class="k">{_e(key)}</div><div class="v">{_e(_num(value))}</div><div class="s">{_e(sub)}</div></div>'


def _sev_class(severity: str | None) -> str:
    return {"error": "e", "warn": "w"}.get(severity or "", "")


def _sev(severity: str | None) -> str:
    return f'<span class="badge {_e(severity or "none")}">{_e(severity or "—")}</span>'


def _loc_html(row: Mapping[str, Any]) -> str:
    return f'<span class="loc">{_e(_loc(row))}</span>'


def render_html(report: Report) -> str:
    status = report.get("status", "pass")
    acc = report.get("accounting", {})
    rows_in = acc.get("rows_in", 0) or 0
    policy = report.get("policy") or {}
    share = (lambda n: f"{(n or 0) / rows_in * 100:.1f}% of rows") if rows_in else (lambda n: "")
    body: list[str] = [
        "<header>",
        f"<h1>prefdata {_e(report.get('command') or 'report')}</h1>",
        f'<span class="badge big {_e(status)}">{_e(STATUS_WORD.get(status, status))}</span>',
        "</header>",
        f'<div class="sub"><code>{_e(report.get("input"))}</code> · policy <code>{_e(policy.get("source"))}</code>'
        + (f' · tokenizer <code>{_e(report.get("tokenizer"))}</code>' if report.get("tokenizer") else " · no tokenizer (text-level checks)")
        + "</div>",
        '<section class="cards">',
        _card("rows in", rows_in),
        _card("kept", acc.get("rows_out", 0), share(acc.get("rows_out"))),
        _card("dropped", acc.get("rows_dropped", 0), share(acc.get("rows_dropped"))),
        _card("quarantined", acc.get("rows_quarantined", 0), share(acc.get("rows_quarantined")), _sev_class(report.get("quarantine", {}).get("severity")) if acc.get("rows_quarantined") else ""),
        _card("errors", report.get("errors", 0), "findings at error severity", "e" if report.get("errors") else ""),
        _card("warnings", report.get("warnings", 0), "rows at warn severity", "w" if report.get("warnings") else ""),
        "</section>",
    ]
    body += _html_limits(report)
    body += _html_baseline(report.get("baseline"))
    body += _html_flags(report)
    body += _html_quarantine(report.get("quarantine", {}))
    body += _html_dataset(report.get("dataset", {}))
    body += _html_distributions(report)
    body.append(
        f"<footer>prefdata {_e(report.get('prefdata_version'))} · report schema {_e(report.get('schema_version'))} · "
        f"generated {_e(report.get('generated_at'))}</footer>"
    )
    title = f"prefdata {report.get('command') or 'report'} · {report.get('input')}"
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{_e(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _html_limits(report: Report) -> list[str]:
    limits = _thresholds(report)
    if not limits:
        return []
    out = ["<h2>Dataset limits</h2><table><tr><th>limit</th><th>value</th><th>max</th><th></th></tr>"]
    for f in limits:
        verdict = '<span class="badge fail">exceeded</span>' if f.get("exceeded") else '<span class="badge pass">ok</span>'
        out.append(f"<tr><td><code>{_e(f['name'])}</code></td><td class=n>{_pct(f['value'])}</td><td class=n>{_pct(f['limit'])}</td><td>{verdict}</td></tr>")
    out.append("</table>")
    return out


def _html_baseline(baseline: Mapping[str, Any] | None) -> list[str]:
    if not baseline:
        return []
    out = [
        "<h2>Changes against the baseline</h2>",
        '<section class="cards">',
        _card("new flagged rows", baseline["new_flagged_rows"], f"{baseline['new_error_rows']:,} at error severity", "w" if baseline["new_flagged_rows"] else ""),
        _card("regressions", baseline["regressions"], "these fail the check", "e" if baseline["regressions"] else ""),
        _card("resolved rows", baseline["resolved_rows"], "flagged before, not now"),
        "</section>",
    ]
    changed = {k: v for k, v in baseline.get("flag_deltas", {}).items() if v["delta"]}
    if changed:
        out.append('<h2>Flag count changes</h2><table><tr><th>flag</th><th>before</th><th>after</th><th>change</th></tr>')
        for name, d in changed.items():
            out.append(f"<tr><td><code>{_e(name)}</code></td><td class=n>{d['before']:,}</td><td class=n>{d['after']:,}</td><td class=n>{d['delta']:+,}</td></tr>")
        out.append("</table>")
    if baseline.get("new_rows"):
        out.append("<h2>New findings</h2><table><tr><th>where</th><th>new flags</th><th>severity</th><th>prompt</th></tr>")
        for row in baseline["new_rows"][:50]:
            flags = " ".join(f"<code>{_e(f)}</code>" for f in row["new_flags"])
            out.append(f"<tr><td>{_loc_html(row)}</td><td>{flags}</td><td>{_sev(row.get('severity'))}</td><td class=meaning>{_e(row.get('excerpt') or row.get('error'))}</td></tr>")
        out.append("</table>")
    return out


def _html_flags(report: Report) -> list[str]:
    flags = report.get("flags", {})
    out = ["<h2>Flags</h2>"]
    if not flags:
        return out + ['<div class="empty">No row carries a flag.</div>']
    checked = report.get("rows_checked") or 0
    peak = max(info["count"] for info in flags.values()) or 1
    out.append("<table><tr><th>flag</th><th>severity</th><th>rows</th><th></th><th>examples</th></tr>")
    for name, info in _flags_by_severity(report):
        examples = "".join(
            f'<div class="ex">{_loc_html(e)} <q>{_e(e.get("prompt"))}</q></div>' for e in info.get("examples", [])
        )
        rate = f"{info['count'] / checked * 100:.1f}%" if checked else ""
        out.append(
            f"<tr><td><code>{_e(name)}</code><div class=meaning>{_e(FLAG_MEANINGS.get(name, ''))}</div></td>"
            f"<td>{_sev(info.get('severity'))}</td><td class=n>{info['count']:,}<div class=meaning>{rate}</div></td>"
            f'<td><div class="meter"><span style="width:{info["count"] / peak * 100:.1f}%"></span></div></td>'
            f"<td>{examples}</td></tr>"
        )
    out.append("</table>")
    return out


def _html_quarantine(quarantine: Mapping[str, Any]) -> list[str]:
    if not quarantine.get("count"):
        return []
    out = ["<h2>Quarantined records</h2><table><tr><th>reason</th><th>rows</th><th>lines</th></tr>"]
    for reason in quarantine.get("reasons", []):
        out.append(f"<tr><td>{_e(reason['reason'])}</td><td class=n>{reason['count']:,}</td><td><span class=loc>{_e(_locs(reason['rows']))}</span></td></tr>")
    if quarantine.get("other_reasons_count"):
        out.append(f"<tr><td>other reasons</td><td class=n>{quarantine['other_reasons_count']:,}</td><td></td></tr>")
    out.append("</table>")
    return out


def _html_groups(top: list[Mapping[str, Any]], size_key: str = "count") -> str:
    return "".join(
        f'<div class="ex"><b>{g[size_key]:,}×</b> <span class=loc>{_e(_locs(g["rows"], 4))}</span>'
        + (f' <q>{_e(g.get("excerpt") or g["rows"][0].get("excerpt"))}</q>' if (g.get("excerpt") or g["rows"][0].get("excerpt")) else "")
        + "</div>"
        for g in top[:5]
    )


def _html_dataset(dataset: Mapping[str, Any]) -> list[str]:
    if not dataset:
        return []
    dp, dpair = dataset.get("duplicate_prompts", {}), dataset.get("duplicate_pairs", {})
    conf, near = dataset.get("conflicting_pairs", {}), dataset.get("near_duplicate_prompts", {})
    near_label = f"near-duplicate prompts<div class=meaning>MinHash, Jaccard ≥ {_e(near.get('threshold'))}</div>"
    if not near.get("computed"):
        near_label += "<div class=meaning>not computed</div>"
    rows = [
        ("exact duplicate prompts<div class=meaning>whitespace-normalized</div>", dp.get("groups", 0), dp.get("rows", 0), _html_groups(dp.get("top", []))),
        ("exact duplicate pairs", dpair.get("groups", 0), dpair.get("rows", 0), _html_groups(dpair.get("top", []))),
        (
            "conflicting pairs<div class=meaning>same pair, chosen/rejected swapped</div>",
            None,
            conf.get("count", 0),
            "".join(f'<div class="ex">{_loc_html(e)} <q>{_e(e.get("prompt"))}</q></div>' for e in conf.get("examples", [])),
        ),
        (near_label, near.get("clusters", 0), near.get("rows", 0), _html_groups(near.get("top", []), "size")),
    ]
    out = ["<h2>Dataset-wide</h2><table><tr><th>check</th><th>groups</th><th>rows</th><th>largest groups</th></tr>"]
    for label, groups, count, detail in rows:
        out.append(f"<tr><td>{label}</td><td class=n>{'–' if groups is None else f'{groups:,}'}</td><td class=n>{count:,}</td><td>{detail}</td></tr>")
    out.append("</table>")
    return out


def _html_distributions(report: Report) -> list[str]:
    lengths = report.get("lengths", {})
    colors = {"prompt": "#7a8bd6", "chosen": "#12805c", "rejected": "#c4320a"}
    out = [f"<h2>Lengths <span class=meaning>({_e(lengths.get('unit'))}, {_e(lengths.get('measured'))})</span></h2>", '<div class="grid">']
    for name in ("prompt", "chosen", "rejected"):
        d = lengths.get(name, {})
        if not d.get("count"):
            continue
        q = d["quantiles"]
        hist = d["histogram"]
        over = f' · grey bar: ≥ {hist["edges"][-1]:,}' if hist.get("overflow") else ""
        out.append(
            f'<div class="plot"><h3>{name}</h3><div class="q">mean {_num(d["mean"])} · median {q["p50"]:,} · '
            f'p95 {q["p95"]:,} · max {d["max"]:,}{over}</div>'
            + _svg_histogram(
                hist["edges"], hist["counts"], color=colors[name], overflow=hist.get("overflow", 0), fmt=lambda v: _num(round(v))
            )
            + "</div>"
        )
    out.append("</div>")

    out.append('<h2>Length bias, truncation, similarity</h2><div class="grid">')
    bias = report.get("length_bias", {})
    if bias.get("pairs"):
        limit = bias.get("limit")
        marker = (
            f'<span style="position:absolute;left:{limit * 100:.1f}%;top:-3px;bottom:-3px;border-left:2px dashed #1d2330" title="limit"></span>'
            if limit is not None
            else ""
        )
        out.append(
            f'<div class="plot"><h3>Length bias</h3><div class="q">share of {bias["pairs"]:,} pairs by which half is longer ({_e(bias["unit"])})'
            + (f" · limit {_pct(limit)} chosen-longer" if limit is not None else "")
            + "</div>"
            f'<div class="bar"><span style="width:{bias["chosen_longer"] * 100:.2f}%;background:#12805c" title="chosen longer"></span>'
            f'<span style="width:{bias["equal"] * 100:.2f}%;background:#d0d5dd" title="equal"></span>'
            f'<span style="width:{bias["rejected_longer"] * 100:.2f}%;background:#c4320a" title="rejected longer"></span>{marker}</div>'
            f'<div class="legend"><span><i class="dot" style="background:#12805c"></i>chosen longer {_pct(bias["chosen_longer"])}</span>'
            f'<span><i class="dot" style="background:#d0d5dd"></i>equal {_pct(bias["equal"])}</span>'
            f'<span><i class="dot" style="background:#c4320a"></i>rejected longer {_pct(bias["rejected_longer"])}</span></div></div>'
        )
    trunc = report.get("truncation", {})
    if trunc.get("available"):
        bars = "".join(
            f'<div style="display:flex;align-items:center;gap:10px;margin:6px 0"><span style="width:70px">{name}</span>'
            f'<div class="meter" style="flex:1"><span style="width:{trunc[name + "_rate"] * 100:.2f}%;background:#b54708"></span></div>'
            f'<span class=n style="width:56px;text-align:right">{_pct(trunc[name + "_rate"])}</span></div>'
            for name in ("prompt", "chosen", "rejected", "any")
        )
        out.append(f'<div class="plot"><h3>Truncation</h3><div class="q">share of {trunc["rows"]:,} tokenized pairs cut by the length limits</div>{bars}</div>')
    else:
        out.append(f'<div class="plot"><h3>Truncation</h3><div class="q">not measured: {_e(trunc.get("reason", "no tokenizer"))}</div></div>')
    sim = report.get("similarity", {})
    if sim.get("rows_measured"):
        hist = sim["histogram"]
        sampled = f" · uniform sample of {sim['rows_measured']:,} / {sim['rows_total']:,}" if sim.get("sampled") else ""
        out.append(
            f'<div class="plot"><h3>Chosen/rejected similarity</h3><div class="q">mean {sim["mean"]:.3f} · median {sim["quantiles"]["p50"]:.3f}{sampled}</div>'
            + _svg_histogram(
                hist["edges"], hist["counts"], color="#6941c6", marker=sim.get("threshold"),
                marker_label=f"near_duplicate ≥ {sim.get('threshold')}", fmt=lambda v: f"{v:g}" if isinstance(v, float) else _num(v),
            )
            + "</div>"
        )
    out.append("</div>")
    return out


# ----------------------------------------------------------------------------- GitHub Actions


def _gh_escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_escape_property(text: str) -> str:
    return _gh_escape_data(text).replace(":", "%3A").replace(",", "%2C")


def _workspace_path(path: str | None) -> str | None:
    """Annotations need paths relative to the repository root (GITHUB_WORKSPACE, else cwd)."""
    if not path:
        return None
    p = Path(path)
    if not p.is_absolute():
        return p.as_posix()
    root = Path(os.environ.get("GITHUB_WORKSPACE") or os.getcwd()).resolve()
    try:
        return p.resolve().relative_to(root).as_posix()
    except ValueError:
        return p.as_posix()


def _annotation(level: str, row: Mapping[str, Any], flags: list[str], source_root: str | None = None) -> str:
    if row.get("error"):
        title = "prefdata: quarantined record"
        message = str(row["error"])
    else:
        title = "prefdata: " + ", ".join(flags)
        message = "; ".join(FLAG_MEANINGS.get(f, f) for f in flags)
        if row.get("excerpt"):
            message += f" (prompt: {row['excerpt']})"
    props = []
    source = row.get("source_file")
    if source and source_root and not Path(source).is_absolute():
        source = str(Path(source_root) / source)  # files of a directory input are relative to it
    file = _workspace_path(source)
    if file:
        props.append(f"file={_gh_escape_property(file)}")
        props.append(f"line={int(row.get('source_line') or 1)}")
    props.append(f"title={_gh_escape_property(title)}")
    return f"::{level} {','.join(props)}::{_gh_escape_data(message)}"


def github_annotations(report: Report, max_annotations: int = GITHUB_ANNOTATION_CAP) -> list[str]:
    """Workflow commands that annotate the source lines of findings.

    Errors first (error severity and quarantined records), then warnings (drop and warn severity),
    each capped at `max_annotations` because GitHub shows no more per step; one final notice counts
    what was left out. With a baseline only new findings are annotated (old ones are not this change's)."""
    baseline = report.get("baseline")
    if baseline:
        rows = [dict(r) for r in baseline.get("new_rows", [])]
        flag_of = lambda r: r["new_flags"]  # noqa: E731
    else:
        rows = list(report.get("flagged_rows", []))
        flag_of = lambda r: r.get("flags") or []  # noqa: E731
    # Exceeded limits first: they say the most, and GitHub's cap of errors would hide them otherwise.
    errors = [
        f"::error title={_gh_escape_property('prefdata: ' + f['name'])}::{_gh_escape_data(_threshold_line(f).replace('`', ''))}"
        for f in _thresholds(report)
        if f.get("exceeded") and (not baseline or f["name"] in baseline.get("new_thresholds_exceeded", []))
    ][:max_annotations]
    warnings: list[str] = []
    rest = 0
    for row in rows:
        level = "error" if row.get("severity") == "error" else "warning"
        bucket = errors if level == "error" else warnings
        if len(bucket) < max_annotations:
            flags = [f for f in flag_of(row) if f != "quarantined"]
            bucket.append(_annotation(level, row, flags, (report.get("meta") or {}).get("source_root")))
        else:
            rest += 1
    if baseline:
        rest += max(0, baseline.get("new_flagged_rows", 0) - len(rows))
    else:
        rest += max(0, report.get("flagged_rows_total", 0) - len(rows))
    lines = errors + warnings
    if rest:
        lines.append(f"::notice title=prefdata::{rest:,} more flagged rows are not annotated (GitHub shows at most {max_annotations} errors and {max_annotations} warnings per step); see the job summary or report")
    return lines


def truncate_utf8(text: str, limit: int, note: str) -> str:
    """`text` cut at a line boundary so that it plus `note` fits in `limit` UTF-8 bytes."""
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    budget = max(0, limit - len(note.encode("utf-8")) - 1)
    cut = data[:budget].decode("utf-8", errors="ignore")
    if "\n" in cut:
        cut = cut[: cut.rindex("\n") + 1]
    return cut + note


def write_step_summary(markdown: str, path: str | os.PathLike[str] | None = None, limit: int = STEP_SUMMARY_LIMIT) -> bool:
    """Append `markdown` to $GITHUB_STEP_SUMMARY (or `path`), keeping the file under GitHub's 1 MiB.

    Returns False when there is no summary file to write to."""
    target = path or os.environ.get("GITHUB_STEP_SUMMARY")
    if not target:
        return False
    target = Path(target)
    existing = target.stat().st_size if target.exists() else 0
    room = max(0, limit - existing - 1024)  # a little slack for whatever the step writes after us
    note = "\n\n> **Report truncated** to stay under GitHub's 1 MiB step-summary limit; the full report is in the job's artifacts or `--output`.\n"
    with open(target, "a", encoding="utf-8") as handle:
        handle.write(truncate_utf8(markdown if markdown.endswith("\n") else markdown + "\n", room, note))
    return True
