"""The report's scored-completions section (report.scored) as Markdown and as HTML.

Records and pairs both ways (records in = paired + unpaired + quarantined; pairs made = kept +
dropped), per-prompt counts (completions, pairs made, ties), why records made no pair, the records
capped at the policy's max_pairs_per_record, and the distribution of score margins of the pairs made.
"""

from __future__ import annotations

from typing import Any, Mapping

from prefdata.report.render_common import esc, locs, num
from prefdata.report.svg import svg_histogram

REASONS = {
    "single_completion": "fewer than two completions with a score",
    "ties": "every score equal (ties are never paired)",
    "below_margin": "no two scores at least --min-score-margin apart",
    "too_many_pairs": "more pairs than the policy's max_pairs_per_record (above_max_pairs = \"set_aside\")",
}
PER_PROMPT = (("completions", "completions"), ("pairs", "pairs made"), ("ties", "tied completion pairs"))


def ledger_line(report: Mapping[str, Any]) -> str:
    acc, scored = report.get("accounting", {}), report.get("scored") or {}
    return (
        f"{num(acc.get('records_in', 0))} records in = {num(acc.get('records_paired', 0))} with a pair + "
        f"{num(acc.get('records_unpaired', 0))} with none + {num(acc.get('records_quarantined', 0))} quarantined; "
        f"{num(acc.get('pairs_made', 0))} pairs made = {num(acc.get('pairs_kept', 0))} kept + "
        f"{num(acc.get('pairs_dropped', 0))} dropped; {num(scored.get('completions_in', 0))} completions in "
        f"{num(scored.get('records', 0))} records of scored completions, {num(scored.get('completions_paired', 0))} in a pair"
    )


def _margin_label(scale: str) -> str:
    return "score margin (chosen − rejected)" if scale == "score" else "rank margin (rank steps)"


def capped_line(scored: Mapping[str, Any]) -> str:
    """One line on the records capped at max_pairs_per_record ("" when none was)."""
    capped = scored.get("capped") or {}
    if not capped.get("records"):
        return ""
    records = capped["records"]
    return (f"{num(records)} {'record' if records == 1 else 'records'} would make more pairs than the policy's "
            f"max_pairs_per_record and made that many (all-pairs: a random sample; top-k: the widest gaps); "
            f"{num(capped['pairs_not_made'])} pairs not made ({locs(capped['rows'])})")


def margin_line(scale: str, d: Mapping[str, Any], spark: Any) -> str:
    """The margin distribution of one scale in words; margins beyond a float are counted apart."""
    beyond = d.get("non_finite", 0)
    overflow = f"{num(beyond)} {'pair' if beyond == 1 else 'pairs'} with a margin beyond a float (scores near ±1.8e308) left out"
    if not d["count"]:
        return f"- {_margin_label(scale)}: {overflow}."
    q = d["quantiles"]
    return (
        f"- {_margin_label(scale)} over {d['count']:,} pairs: mean {num(d['mean'])}, min {num(d['min'])}, "
        f"p5 {num(q['p5'])}, median {num(q['p50'])}, p95 {num(q['p95'])}, max {num(d['max'])}; "
        f"`{spark(d['histogram']['counts'])}` from 0 to {num(d['histogram']['edges'][-1])}"
        + (f"; {overflow}." if beyond else ".")
    )


def scored_markdown(report: Mapping[str, Any], spark: Any) -> list[str]:
    scored = report.get("scored")
    if not scored:
        return []
    out = ["### Scored completions → pairs", "", ledger_line(report) + ".", ""]
    out += ["| per prompt | mean | min | p50 | p95 | max | histogram |", "| --- | ---: | ---: | ---: | ---: | ---: | --- |"]
    for key, label in PER_PROMPT:
        d = scored["per_prompt"][key]
        q = d["quantiles"]
        out.append(f"| {label} | {num(d['mean'])} | {d['min']:,} | {q['p50']:,} | {q['p95']:,} | {d['max']:,} | `{spark(d['histogram']['counts'])}` |")
    out.append("")
    if scored["unpaired"]:
        out += ["| no pair made | records | lines |", "| --- | ---: | --- |"]
        for entry in scored["unpaired"]:
            out.append(f"| `{entry['reason']}`: {REASONS.get(entry['reason'], '')} | {entry['count']:,} | `{locs(entry['rows'])}` |")
        out.append("")
    if capped_line(scored):
        out += [capped_line(scored) + ".", ""]
    for scale, d in scored["margins"].items():
        out.append(margin_line(scale, d, spark))
    if scored["margins"]:
        out.append("")
    return out


def scored_html(report: Mapping[str, Any]) -> list[str]:
    scored = report.get("scored")
    if not scored:
        return []
    out = [f"<h2>Scored completions → pairs</h2><p>{esc(ledger_line(report))}.</p>", '<div class="grid">']
    for key, label in PER_PROMPT:
        d = scored["per_prompt"][key]
        hist = d["histogram"]
        out.append(
            f'<div class="plot"><h3>{esc(label)} per prompt</h3><div class="q">mean {num(d["mean"])} · median '
            f'{d["quantiles"]["p50"]:,} · max {d["max"]:,}</div>'
            + svg_histogram(hist["edges"], hist["counts"], color="#7a8bd6", overflow=hist.get("overflow", 0), fmt=lambda v: num(round(v)))
            + "</div>"
        )
    for scale, d in scored["margins"].items():
        if not d["count"]:  # every margin overflowed a float: nothing to plot
            continue
        hist = d["histogram"]
        out.append(
            f'<div class="plot"><h3>{esc(_margin_label(scale))}</h3><div class="q">{d["count"]:,} pairs · mean {num(d["mean"])} · '
            f'median {num(d["quantiles"]["p50"])} · max {num(d["max"])}</div>'
            + svg_histogram(hist["edges"], hist["counts"], color="#12805c", fmt=lambda v: f"{v:g}")
            + "</div>"
        )
    out.append("</div>")
    if capped_line(scored):
        out.append(f"<p>{esc(capped_line(scored))}.</p>")
    beyond = sum(d.get("non_finite", 0) for d in scored["margins"].values())
    if beyond:
        out.append(f"<p>{num(beyond)} {'pair' if beyond == 1 else 'pairs'} with a margin beyond a float "
                   "(scores near ±1.8e308) left out of the margin plots.</p>")
    if scored["unpaired"]:
        out.append("<table><tr><th>no pair made</th><th>records</th><th>lines</th></tr>")
        for entry in scored["unpaired"]:
            out.append(
                f"<tr><td><code>{esc(entry['reason'])}</code><div class=meaning>{esc(REASONS.get(entry['reason'], ''))}</div></td>"
                f"<td class=n>{entry['count']:,}</td><td><span class=loc>{esc(locs(entry['rows']))}</span></td></tr>"
            )
        out.append("</table>")
    return out
