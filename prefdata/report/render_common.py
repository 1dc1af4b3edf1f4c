"""What every renderer of a report dict shares: flag meanings (the checks'), status words, number and location
formats.

Every renderer reads only the report dict, so a report.json from any run renders the same way.
"""

from __future__ import annotations

import html
from typing import Any, Iterable, Mapping

from prefdata.checks.units import CHECKS

Report = Mapping[str, Any]

# Each check's meaning is written in its unit (prefdata/checks/units/); quarantined records are no flag.
FLAG_MEANINGS: dict[str, str] = {check.name: check.meaning for check in CHECKS} | {
    "quarantined": "the record could not be read or normalized",
}

STATUS_WORD = {"pass": "PASS", "warn": "PASS with warnings", "fail": "FAIL"}


def pct(value: float | None) -> str:
    return "–" if value is None else f"{value * 100:.1f}%"


def counted(count: Any, word: str) -> str:
    """`count` and `word`, plural unless the count is one ("1 pair checked", "2 pairs checked")."""
    return f"{num(count)} {word if count == 1 else word + 's'}"


def num(value: Any) -> str:
    if isinstance(value, float):  # beyond 1e15 every digit is noise: 1.79e+308, not 309 of them
        return f"{value:,.4g}" if abs(value) < 1000 or abs(value) >= 1e15 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return "–" if value is None else str(value)


def loc(row: Mapping[str, Any]) -> str:
    return f"{row.get('source_file')}:{row.get('source_line')}"


def locs(rows: Iterable[Mapping[str, Any]], limit: int = 5) -> str:
    """file:line, file:line … — the file name is only repeated when it changes."""
    parts, last = [], None
    for row in sorted(rows, key=_place)[:limit]:  # ascending, whatever order they were collected in
        file = row.get("source_file")
        parts.append(f"{file}:{row.get('source_line')}" if file != last else f":{row.get('source_line')}")
        last = file
    return ", ".join(parts)


def _place(row: Mapping[str, Any]) -> tuple[str, int]:
    return str(row.get("source_file") or ""), int(row.get("source_line") or 0)


_SEVERITY_ORDER = {"error": 0, "drop": 1, "warn": 2}


def flags_by_severity(report: Report) -> list[tuple[str, Mapping[str, Any]]]:
    """Worst severity first, then most rows: what a reader should look at first. Quarantined records
    are an entry too (`quarantined`), since the headline's counts include them."""
    entries = dict(report.get("flags", {}))
    quarantine = report.get("quarantine") or {}
    if quarantine.get("count"):
        # Each reason's lines, most common reason first: put back in input order for the examples.
        examples = sorted((row for reason in quarantine.get("reasons", []) for row in reason.get("rows", [])), key=_place)
        entries["quarantined"] = {"count": quarantine["count"], "severity": quarantine.get("severity"), "examples": examples}
    return sorted(entries.items(), key=lambda kv: (_SEVERITY_ORDER.get(kv[1].get("severity"), 3), -kv[1]["count"], kv[0]))


def counts_phrase(report: Report) -> str:
    """The headline's counts with their denominator, as every renderer prints them: "2 of 30 rows with
    errors, 1 with warnings, 3 with drop flags, 1 limit exceeded" (the last two only when there are
    any). Each row counts once, at its worst severity (error, then drop, then warn), so in prepare the
    rows with errors and with drop flags are the dropped pairs; quarantined records count at their severity."""
    errors, warnings = report.get("errors", 0), report.get("warnings", 0)
    rows = rows_in(report)
    parts = [f"{num(errors)} of {count(rows, 'row')} with errors", f"{num(warnings)} with warnings"]
    if report.get("drops"):
        parts.append(f"{num(report['drops'])} with drop flags")
    if report.get("limits_exceeded"):
        parts.append(f"{count(report['limits_exceeded'], 'limit')} exceeded")
    return ", ".join(parts)


def rows_in(report: Report) -> int:
    """The rows a report counts: every record read (the headline's "N rows in")."""
    return int((report.get("accounting") or {}).get("rows_in") or 0)


def share_of(part: int | None, whole: int, unit: str) -> str:
    """"10.7% of 28 rows": a share that says its denominator; "" when there is none."""
    return f"{pct((part or 0) / whole)} of {count(whole, unit)}" if whole else ""


def flag_share(report: Report, name: str, flagged: int) -> str:
    """A flag table entry's share: of the pairs checked for a flag, of the rows in for quarantined
    records (they never became pairs), as the quarantined card says it."""
    if name == "quarantined":
        return share_of(flagged, rows_in(report), "row")
    return share_of(flagged, int(report.get("rows_checked") or 0), "pair")


def status_word(report: Report) -> str:
    """PASS, PASS with warnings, PASS with drops (drop flags only: nothing to fix, rows set aside), FAIL."""
    status = report.get("status", "pass")
    if status == "warn" and not report.get("warnings") and not report.get("errors"):
        return "PASS with drops" if report.get("drops") else "PASS"
    return STATUS_WORD.get(status, status)


def threshold_findings(report: Report) -> list[Mapping[str, Any]]:
    return [f for f in report.get("findings", []) if f.get("kind") == "threshold"]


def threshold_value(f: Mapping[str, Any], report: Report | None = None) -> str:
    """A dataset limit's value with its denominator: "20.0% of 25 pairs" (the pairs checked; for
    length_bias the pairs measured), so it is not read against the cards' shares of the rows in."""
    if report is None:
        return pct(f["value"])
    pairs = (report.get("length_bias") or {}).get("pairs") if f["name"] == "length_bias" else report.get("rows_checked")
    return f"{pct(f['value'])} of {count(int(pairs), 'pair')}" if pairs else pct(f["value"])


def threshold_line(f: Mapping[str, Any], report: Report | None = None) -> str:
    label = {
        "max_flagged_share": "flagged rows", "length_bias": "chosen longer than rejected", "max_dropped_share": "dropped pairs",
    }.get(f["name"], f["name"])
    verdict = "exceeds" if f.get("exceeded") else "within"
    return f"{label}: {threshold_value(f, report)} ({verdict} the limit {pct(f['limit'])}, `{f['name']}`)"


def hint_lines(report: Report) -> list[str]:
    """report.hints as one line each (the main cause of lost pairs, a missing --chat-template)."""
    return [hint["message"] for hint in report.get("hints", [])]


def count(value: int, word: str) -> str:
    """"1 warning", "2,308 warnings": a count with thousands separators and the right plural."""
    return f"{value:,} {word if value == 1 else word + 's'}"


def status_line(report: Report) -> str:
    """The verdict in words: "PASS with warnings (0 rows with errors, 1 row with warnings)"; with a
    baseline whose findings explain every error, "no regressions (19 rows with errors, all in the baseline)"."""
    errors = report.get("errors", 0)
    baseline = report.get("baseline")
    if baseline is not None and not baseline.get("regressions") and (errors or report.get("limits_exceeded")):
        return f"no regressions ({counts_phrase(report)}, all in the baseline)"
    return f"{status_word(report)} ({counts_phrase(report)})"


def headline(report: Report) -> str:
    acc = report.get("accounting", {})
    unpaired = acc.get("records_unpaired", 0)  # scored completions that made no pair (dropped.jsonl says why)
    no_pair = f" · {num(unpaired)} {'record' if unpaired == 1 else 'records'} made no pair" if unpaired else ""
    if report.get("command") == "validate":  # validate writes nothing: it finds, it keeps and drops nothing
        dropped = acc.get("rows_dropped", 0) - unpaired
        would = f" ({num(dropped)} that prepare would drop)" if dropped else ""
        return (
            f"{counted(acc.get('rows_in', 0), 'row')} in · {counted(report.get('rows_checked', 0), 'pair')} checked · "
            f"{num(report.get('rows_flagged', 0))} with findings{would}{no_pair} · {num(acc.get('rows_quarantined', 0))} quarantined"
        )
    return (
        f"{counted(acc.get('rows_in', 0), 'row')} in · {num(acc.get('rows_out', 0))} kept · "
        f"{num(acc.get('rows_dropped', 0) - unpaired)} dropped{no_pair} · {num(acc.get('rows_quarantined', 0))} quarantined"
    )


def esc(value: Any) -> str:
    """HTML-escaped text (None is empty), for the HTML page and its SVG plots."""
    return html.escape("" if value is None else str(value), quote=True)


def bounded_line(report: Report) -> str:
    """Which rows were too long for the exact similarity (checks.similarity), or "" when none."""
    bounded = report.get("similarity", {}).get("bounded") or {}
    if not bounded.get("rows"):
        return ""
    rows = bounded["rows"]
    return (
        f"similarity: {rows:,} pair{'s' if rows != 1 else ''} over {report['similarity']['exact_limit']:,} "
        f"characters together measured by {bounded['method']}, not exactly ({locs(bounded['examples'], 5)})"
    )


def length_bias_units_line(bias: Mapping[str, Any]) -> str:
    """"in 62.0% of 1,000 pairs by tokens, 58.1% by characters (kept pairs: …)", or "" without pairs."""
    def part(section: Mapping[str, Any] | None) -> str:
        units = [f"{pct(section[unit]['chosen_longer'])} by {unit}" for unit in ("tokens", "characters")
                 if section and section.get(unit) and section[unit].get("pairs")]
        return ", ".join(units)

    every = part(bias)
    if not every or not bias.get("pairs"):
        return ""
    kept = part(bias.get("kept"))
    return f"in {every} of {bias['pairs']:,} pairs" + (f" (kept pairs: {kept})" if kept else "")


def balance_line(balance: Mapping[str, Any]) -> str:
    """One line on what --balance-length did."""
    line = (
        f"--balance-length {balance['target']:g} (seed {balance['seed']}): chosen longer in "
        f"{pct(balance['chosen_longer_before'])} of {balance['pairs_before']:,} kept pairs before, "
        f"{pct(balance['chosen_longer_after'])} of {balance['pairs_after']:,} after; "
        f"{balance['dropped']:,} {'pair' if balance['dropped'] == 1 else 'pairs'} dropped as `length_balance`"
    )
    if balance.get("note"):
        line += f" ({balance['note']})"
    return line


def source_cells(row: Mapping[str, Any]) -> list[str]:
    """A per-source row's cells: name, asked, rows in, kept, dropped (and records of scored completions
    with no pair), quarantined, share of kept, chosen longer (tokens), chosen longer (characters), token p50s."""
    mix = row.get("mix") or {}
    asked = f"{mix['share']:.1%}" if mix.get("share") is not None else (f"{mix['rows']:,} rows" if mix.get("rows") else "–")
    bias = row.get("length_bias") or {}
    tokens = row.get("tokens")

    def longer(unit: str) -> str:
        section, kept = bias.get(unit), (bias.get("kept") or {}).get(unit)
        if not section or not section.get("pairs"):
            return "–"
        text = pct(section["chosen_longer"])
        if kept and kept.get("pairs") and kept["pairs"] != section["pairs"]:
            text += f" (kept {pct(kept['chosen_longer'])})"
        return text

    dropped = f"{row['dropped']:,}"
    if row.get("unpaired"):  # records of scored completions that made no pair (dropped.jsonl says why)
        dropped += f" (+{row['unpaired']:,} with no pair)"
    p50 = " / ".join(f"{tokens[p]['quantiles']['p50']:,}" if tokens[p].get("count") else "–"
                     for p in ("prompt", "chosen", "rejected")) if tokens else "–"
    return [
        row["name"], asked, f"{row['rows_in']:,}", f"{row['kept']:,}", dropped, f"{row['quarantined']:,}",
        pct(row["share_of_kept"]), longer("tokens"), longer("characters"), p50,
    ]
