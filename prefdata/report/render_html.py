"""The report dict as one self-contained HTML page: inline CSS and inline SVG plots, so it opens
offline and in CI artifacts."""

from __future__ import annotations

from typing import Any, Mapping

from prefdata.report.render_common import (
    bounded_line,
    FLAG_MEANINGS,
    Report,
    counts_phrase,
    esc,
    flag_share,
    flags_by_severity,
    hint_lines,
    loc,
    locs,
    num,
    pct,
    share_of,
    status_word,
    threshold_findings,
    threshold_value,
)
from prefdata.report.render_common import balance_line, length_bias_units_line, source_cells
from prefdata.report.render_trainer import trainer_html
from prefdata.report.render_images import images_html
from prefdata.report.render_scored import scored_html
from prefdata.report.svg import svg_histogram

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


def _card(key: str, value: Any, sub: str = "", cls: str = "") -> str:
    return f'<div class="card {cls}"><div class="k">{esc(key)}</div><div class="v">{esc(num(value))}</div><div class="s">{esc(sub)}</div></div>'


def _sev_class(severity: str | None) -> str:
    return {"error": "e", "warn": "w"}.get(severity or "", "")


def _sev(severity: str | None) -> str:
    return f'<span class="badge {esc(severity or "none")}">{esc(severity or "—")}</span>'


def _loc_html(row: Mapping[str, Any]) -> str:
    return f'<span class="loc">{esc(loc(row))}</span>'


def render_html(report: Report) -> str:
    status = report.get("status", "pass")
    acc = report.get("accounting", {})
    rows_in = acc.get("rows_in", 0) or 0
    policy = report.get("policy") or {}
    share = lambda n: share_of(n, rows_in, "row")  # noqa: E731 - every card says its denominator
    body: list[str] = [
        "<header>",
        f"<h1>prefdata {esc(report.get('command') or 'report')}</h1>",
        f'<span class="badge big {esc(status)}">{esc(status_word(report))}</span>',
        "</header>",
        f'<p class="counts">{esc(counts_phrase(report))}</p>',
        f'<div class="sub"><code>{esc(report.get("input"))}</code> · policy <code>{esc(policy.get("source"))}</code>'
        + (f' · tokenizer <code>{esc(report.get("tokenizer"))}</code>' if report.get("tokenizer") else " · no tokenizer (text-level checks)")
        + "</div>",
        '<section class="cards">',
        _card("rows in", rows_in),
        _card("kept", acc.get("rows_out", 0), share(acc.get("rows_out"))),
        _card("dropped", acc.get("rows_dropped", 0), share(acc.get("rows_dropped"))),
        _card("quarantined", acc.get("rows_quarantined", 0), share(acc.get("rows_quarantined")), _sev_class(report.get("quarantine", {}).get("severity")) if acc.get("rows_quarantined") else ""),
        _card("errors", report.get("errors", 0), f"{share(report.get('errors'))}: an error-severity flag",
              "e" if report.get("errors") else ""),
        _card("warnings", report.get("warnings", 0), f"{share(report.get('warnings'))}: worst flag a warning",
              "w" if report.get("warnings") else ""),
        "</section>",
    ]
    body += _html_limits(report)
    body += [f'<p class="hint"><b>Hint:</b> {esc(line)}</p>' for line in hint_lines(report)]
    body += _html_baseline(report.get("baseline"))
    body += _html_flags(report)
    body += trainer_html(report)  # validate/prepare --trainer: what that trainer trains on
    body += _html_quarantine(report.get("quarantine", {}))
    body += scored_html(report)
    body += _html_decontamination(report.get("decontamination"))
    body += _html_dataset(report.get("dataset", {}))
    body += images_html(report)
    body += _html_distributions(report)
    body += _html_sources(report.get("sources"))
    body.append(
        f"<footer>prefdata {esc(report.get('prefdata_version'))} · report schema {esc(report.get('schema_version'))} · "
        f"generated {esc(report.get('generated_at'))}</footer>"
    )
    title = f"prefdata {report.get('command') or 'report'} · {report.get('input')}"
    return (
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>"
        f"<body><main>{''.join(body)}</main></body></html>\n"
    )


def _html_limits(report: Report) -> list[str]:
    limits = threshold_findings(report)
    if not limits:
        return []
    out = ["<h2>Dataset limits</h2><table><tr><th>limit</th><th>value</th><th>max</th><th></th></tr>"]
    for f in limits:
        verdict = '<span class="badge fail">exceeded</span>' if f.get("exceeded") else '<span class="badge pass">ok</span>'
        out.append(f"<tr><td><code>{esc(f['name'])}</code></td><td class=n>{esc(threshold_value(f, report))}</td><td class=n>{pct(f['limit'])}</td><td>{verdict}</td></tr>")
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
            out.append(f"<tr><td><code>{esc(name)}</code></td><td class=n>{d['before']:,}</td><td class=n>{d['after']:,}</td><td class=n>{d['delta']:+,}</td></tr>")
        out.append("</table>")
    if baseline.get("new_rows"):
        out.append("<h2>New findings</h2><table><tr><th>where</th><th>new flags</th><th>severity</th><th>prompt</th></tr>")
        for row in baseline["new_rows"][:50]:
            flags = " ".join(f"<code>{esc(f)}</code>" for f in row["new_flags"])
            out.append(f"<tr><td>{_loc_html(row)}</td><td>{flags}</td><td>{_sev(row.get('severity'))}</td><td class=meaning>{esc(row.get('excerpt') or row.get('error'))}</td></tr>")
        out.append("</table>")
    return out


def _html_flags(report: Report) -> list[str]:
    entries = flags_by_severity(report)  # quarantined records included, as the headline counts them
    out = ["<h2>Flags</h2>"]
    if not entries:
        return out + ['<div class="empty">No row carries a flag.</div>']
    peak = max(info["count"] for _, info in entries) or 1
    out.append("<table><tr><th>flag</th><th>severity</th><th>rows</th><th></th><th>examples</th></tr>")
    for name, info in entries:
        examples = "".join(
            f'<div class="ex">{_loc_html(e)} <q>{esc(e.get("prompt"))}</q></div>' for e in info.get("examples", [])
        )
        rate = esc(flag_share(report, name, info["count"]))  # of the pairs; quarantined: of the rows in
        out.append(
            f"<tr><td><code>{esc(name)}</code><div class=meaning>{esc(FLAG_MEANINGS.get(name, ''))}</div></td>"
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
        out.append(f"<tr><td>{esc(reason['reason'])}</td><td class=n>{reason['count']:,}</td><td><span class=loc>{esc(locs(reason['rows']))}</span></td></tr>")
    if quarantine.get("other_reasons_count"):
        out.append(f"<tr><td>other reasons</td><td class=n>{quarantine['other_reasons_count']:,}</td><td></td></tr>")
    out.append("</table>")
    return out


def _html_decontamination(section: Mapping[str, Any] | None, limit: int = 200) -> list[str]:
    if not section:
        return []
    index = section.get("index", {})
    out = [
        "<h2>Decontamination</h2>",
        f"<p>{section['pairs_flagged']:,} pairs share a {esc(section['ngram'])}-word run with a benchmark item "
        f"({'prompt and completions' if section.get('completions') else 'prompt'} checked; "
        f"{index.get('runs', 0):,} benchmark runs, {index.get('bytes', 0) / 2**20:.1f} MiB).</p>",
        "<table><tr><th>benchmark</th><th>items</th><th>too short</th><th>without text</th><th>pairs flagged</th></tr>",
    ]
    for b in section.get("benchmarks", []):
        out.append(f"<tr><td><code>{esc(b['path'])}</code></td><td class=n>{b['items']:,}</td><td class=n>{b['items_short']:,}</td>"
                   f"<td class=n>{b['items_without_text']:,}</td><td class=n>{b['pairs_flagged']:,}</td></tr>")
    out.append("</table>")
    matches = section.get("matches", [])
    if matches:
        out.append("<table><tr><th>pair</th><th>half</th><th>benchmark item</th><th>item excerpt</th><th>overlap</th></tr>")
        for m in matches[:limit]:
            out.append(f"<tr><td>{_loc_html(m)}</td><td>{esc(m['half'])}</td><td><span class=loc>{esc(m['item_file'])}:{esc(m['item_line'])}</span></td>"
                       f"<td><q>{esc(m['item_excerpt'])}</q></td><td><q>{esc(m['overlap'])}</q></td></tr>")
        out.append("</table>")
        if len(matches) > limit or not section.get("matches_complete", True):
            out.append(f"<p>… {section['pairs_flagged'] - min(limit, len(matches)):,} more (report.json lists them).</p>")
    return out


def _html_groups(top: list[Mapping[str, Any]], size_key: str = "count") -> str:
    return "".join(
        f'<div class="ex"><b>{g[size_key]:,}×</b> <span class=loc>{esc(locs(g["rows"], 4))}</span>'
        + (f' <q>{esc(g.get("excerpt") or g["rows"][0].get("excerpt"))}</q>' if (g.get("excerpt") or g["rows"][0].get("excerpt")) else "")
        + "</div>"
        for g in top[:5]
    )


def _html_dataset(dataset: Mapping[str, Any]) -> list[str]:
    if not dataset:
        return []
    dp, dpair = dataset.get("duplicate_prompts", {}), dataset.get("duplicate_pairs", {})
    conf, near = dataset.get("conflicting_pairs", {}), dataset.get("near_duplicate_prompts", {})
    near_label = f"near-duplicate prompts<div class=meaning>MinHash, Jaccard ≥ {esc(near.get('threshold'))}</div>"
    if not near.get("computed"):
        near_label += "<div class=meaning>not computed</div>"
    rows = [
        ("exact duplicate prompts<div class=meaning>whitespace-normalized</div>", dp.get("groups", 0), dp.get("rows", 0), _html_groups(dp.get("top", []))),
        ("exact duplicate pairs", dpair.get("groups", 0), dpair.get("rows", 0), _html_groups(dpair.get("top", []))),
        (
            "conflicting pairs<div class=meaning>same pair, chosen/rejected swapped</div>",
            None,
            conf.get("count", 0),
            "".join(f'<div class="ex">{_loc_html(e)} <q>{esc(e.get("prompt"))}</q></div>' for e in conf.get("examples", [])),
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
    out = [f"<h2>Lengths <span class=meaning>({esc(lengths.get('unit'))}, {esc(lengths.get('measured'))})</span></h2>", '<div class="grid">']
    for name in ("prompt", "chosen", "rejected"):
        d = lengths.get(name, {})
        if not d.get("count"):
            continue
        q = d["quantiles"]
        hist = d["histogram"]
        over = f' · grey bar: ≥ {hist["edges"][-1]:,}' if hist.get("overflow") else ""
        out.append(
            f'<div class="plot"><h3>{name}</h3><div class="q">mean {num(d["mean"])} · median {q["p50"]:,} · '
            f'p95 {q["p95"]:,} · max {d["max"]:,}{over}</div>'
            + svg_histogram(
                hist["edges"], hist["counts"], color=colors[name], overflow=hist.get("overflow", 0), fmt=lambda v: num(round(v))
            )
            + (f'<div class="q">{esc(bounded_line(report))}</div>' if bounded_line(report) else "")
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
            f'<div class="plot"><h3>Length bias</h3><div class="q">share of {bias["pairs"]:,} pairs by which half is longer ({esc(bias["unit"])})'
            + (f" · limit {pct(limit)} chosen-longer" if limit is not None else "")
            + "</div>"
            f'<div class="bar"><span style="width:{bias["chosen_longer"] * 100:.2f}%;background:#12805c" title="chosen longer"></span>'
            f'<span style="width:{bias["equal"] * 100:.2f}%;background:#d0d5dd" title="equal"></span>'
            f'<span style="width:{bias["rejected_longer"] * 100:.2f}%;background:#c4320a" title="rejected longer"></span>{marker}</div>'
            f'<div class="legend"><span><i class="dot" style="background:#12805c"></i>chosen longer {pct(bias["chosen_longer"])}</span>'
            f'<span><i class="dot" style="background:#d0d5dd"></i>equal {pct(bias["equal"])}</span>'
            f'<span><i class="dot" style="background:#c4320a"></i>rejected longer {pct(bias["rejected_longer"])}</span></div>'
            + (f'<div class="q">chosen longer {esc(length_bias_units_line(bias))}</div>' if length_bias_units_line(bias) else "")
            + (f'<div class="q">{esc(balance_line(report["length_balance"]).replace("`", ""))}</div>' if report.get("length_balance") else "")
            + "</div>"
        )
    trunc = report.get("truncation", {})
    if trunc.get("available"):
        bars = "".join(
            f'<div style="display:flex;align-items:center;gap:10px;margin:6px 0"><span style="width:70px">{name}</span>'
            f'<div class="meter" style="flex:1"><span style="width:{trunc[name + "_rate"] * 100:.2f}%;background:#b54708"></span></div>'
            f'<span class=n style="width:56px;text-align:right">{pct(trunc[name + "_rate"])}</span></div>'
            for name in ("prompt", "chosen", "rejected", "any")
        )
        out.append(f'<div class="plot"><h3>Truncation</h3><div class="q">share of {trunc["rows"]:,} tokenized pairs cut by the length limits</div>{bars}</div>')
    else:
        out.append(f'<div class="plot"><h3>Truncation</h3><div class="q">not measured: {esc(trunc.get("reason", "no tokenizer"))}</div></div>')
    sim = report.get("similarity", {})
    if sim.get("rows_measured"):
        hist = sim["histogram"]
        sampled = f" · uniform sample of {sim['rows_measured']:,} / {sim['rows_total']:,}" if sim.get("sampled") else ""
        out.append(
            f'<div class="plot"><h3>Chosen/rejected similarity</h3><div class="q">mean {sim["mean"]:.3f} · median {sim["quantiles"]["p50"]:.3f}{sampled}</div>'
            + svg_histogram(
                hist["edges"], hist["counts"], color="#6941c6", marker=sim.get("threshold"),
                marker_label=f"near_duplicate ≥ {sim.get('threshold')}", fmt=lambda v: f"{v:g}" if isinstance(v, float) else num(v),
            )
            + "</div>"
        )
    out.append("</div>")
    return out


def _html_sources(sources: list[Mapping[str, Any]] | None) -> list[str]:
    """A mixture's per-source table (report.json `sources`)."""
    if not sources:
        return []
    heads = ("source", "asked", "rows in", "kept", "dropped", "quarantined", "share of kept", "chosen longer (tokens)",
             "chosen longer (characters)", "tokens p50 prompt / chosen / rejected", "flags")
    out = ["<h2>Sources</h2><table><tr>" + "".join(f"<th>{esc(h)}</th>" for h in heads) + "</tr>"]
    for row in sources:
        flags = ", ".join(f"<code>{esc(name)}</code> {n:,}" for name, n in list(row["flags"].items())[:4]) or "–"
        out.append("<tr>" + "".join(f"<td>{esc(cell)}</td>" for cell in source_cells(row)) + f"<td>{flags}</td></tr>")
    out.append("</table>")
    return out
