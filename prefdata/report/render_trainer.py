"""The report's `trainer` section (validate --trainer, prefdata.trainers) in text and Markdown: what the
trainer's own preprocessing does to the rows, and its ids beside prefdata's."""

from __future__ import annotations

from typing import Any

from prefdata.report.render_common import esc, locs

Report = dict[str, Any]


def _where(example: dict[str, Any]) -> str:
    return f"{example['source_file']}:{example['source_line']}"


def _cell(text: str) -> str:
    """A Markdown table cell: pipes escaped (token pieces and special tokens hold them), one line."""
    return text.replace("|", "\\|").replace("\n", " ")


def _pieces(tokens: list[str]) -> str:
    return "|".join(repr(t) for t in tokens) or "(end)"


def _comparison_line(c: dict[str, Any], name: str) -> str:
    parts = ", ".join(f"{n} in the {p}" if p != "length" else f"{n} in length only"
                      for p, n in sorted(c["first_difference_in"].items()))
    return (f"ids vs prefdata's: {c['equal']:,} of {c['pairs']:,} pairs equal, {c['differ']:,} differ"
            f"{' (first difference: ' + parts + ')' if parts else ''}; trained tokens equal in {c['trained_equal']:,}")


def trainer_text(report: Report) -> list[str]:
    section = report.get("trainer")
    if not section:
        return []
    name = section["trainer"]
    lines = [f"under {name} {section['version']} ({' '.join(section['settings'])}): {section['trained_pairs']:,} of "
             f"{section['rows']:,} rows trained, {section['dropped_rows']:,} dropped by {name}"]
    lines += [f"  note: {note}" for note in section.get("notes", [])]
    for group in section["findings"]:
        rows = list({_where(e): e for e in group["examples"]}.values())  # one row may have two findings
        lines.append(f"  {group['flag']} under {name}  {group['severity']}  {group['rows']:,} rows  e.g. {locs(rows, 3)}")
        lines.append(f"    {group['examples'][0]['detail']}")
        lines.append(f"    cause: {'; '.join(group['cause'])}  avoid: {'; '.join(group['fix'])}")
    c = section["comparison"]
    lines.append("  " + _comparison_line(c, name))
    for e in c["examples"][:3]:
        lines.append(f"    {_where(e)} {e['half']} token {e['position']} (after {e['before']!r}): "
                     f"prefdata {_pieces(e['prefdata'])}  {name} {_pieces(e['trainer'])}")
    return lines


def trainer_markdown(report: Report) -> list[str]:
    section = report.get("trainer")
    if not section:
        return []
    name = section["trainer"]
    out = [f"### Under {name}", "",
           f"{name} {section['version']} with `{' '.join(section['settings'])}`: {section['trained_pairs']:,} of "
           f"{section['rows']:,} rows trained, {section['dropped_rows']:,} dropped by {name}.", "",
           *(f"- note: {note}" for note in section.get("notes", [])), *([""] if section.get("notes") else [])]
    if section["findings"]:
        out += ["| flag | severity | rows | cause | avoided by | e.g. |", "| --- | --- | ---: | --- | --- | --- |"]
        for g in section["findings"]:
            out.append(f"| `{g['flag']}` | {g['severity']} | {g['rows']:,} | {_cell('; '.join(g['cause']))} | "
                       f"{_cell('; '.join(g['fix']))} | {_where(g['examples'][0])}: {_cell(g['examples'][0]['detail'])} |")
        out.append("")
    c = section["comparison"]
    out += [_comparison_line(c, name) + ".", ""]
    if c["examples"]:
        out += ["| row | half | token | after | prefdata | " + name + " |", "| --- | --- | ---: | --- | --- | --- |"]
        for e in c["examples"]:
            out.append(f"| {_where(e)} | {e['half']} | {e['position']} | `{_cell(repr(e['before']))}` | "
                       f"`{_cell(_pieces(e['prefdata']))}` | `{_cell(_pieces(e['trainer']))}` |")
        out.append("")
    return out


def trainer_html(report: Report) -> list[str]:
    section = report.get("trainer")
    if not section:
        return []
    name = section["trainer"]
    out = [f"<h2>Under {esc(name)}</h2>",
           f"<p>{esc(name)} {esc(section['version'])} with <code>{esc(' '.join(section['settings']))}</code>: "
           f"{section['trained_pairs']:,} of {section['rows']:,} rows trained, {section['dropped_rows']:,} dropped by "
           f"{esc(name)}.</p>"]
    if section["findings"]:
        out.append("<table><tr><th>flag</th><th>severity</th><th>rows</th><th>cause</th><th>avoided by</th>"
                   "<th>e.g.</th></tr>")
        for g in section["findings"]:
            first = g["examples"][0]
            out.append(f"<tr><td><code>{esc(g['flag'])}</code></td><td>{esc(g['severity'])}</td><td class=n>{g['rows']:,}</td>"
                       f"<td>{esc('; '.join(g['cause']))}</td><td>{esc('; '.join(g['fix']))}</td>"
                       f"<td>{esc(_where(first))}: {esc(first['detail'])}</td></tr>")
        out.append("</table>")
    c = section["comparison"]
    out.append(f"<p>{esc(_comparison_line(c, name))}.</p>")
    if c["examples"]:
        out.append(f"<table><tr><th>row</th><th>half</th><th>token</th><th>after</th><th>prefdata</th>"
                   f"<th>{esc(name)}</th></tr>")
        for e in c["examples"]:
            out.append(f"<tr><td>{esc(_where(e))}</td><td>{esc(e['half'])}</td><td class=n>{e['position']}</td>"
                       f"<td><code>{esc(repr(e['before']))}</code></td><td><code>{esc(_pieces(e['prefdata']))}</code></td>"
                       f"<td><code>{esc(_pieces(e['trainer']))}</code></td></tr>")
        out.append("</table>")
    return out
