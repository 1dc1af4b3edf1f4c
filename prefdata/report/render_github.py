"""GitHub Actions output: workflow-command annotations on the source lines of findings, and the
job step summary (Markdown, kept under GitHub's size limit)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

from prefdata.report.render_common import FLAG_MEANINGS, Report, status_line, threshold_findings, threshold_line

STEP_SUMMARY_LIMIT = 1024 * 1024  # GitHub rejects a step summary above 1 MiB
GITHUB_ANNOTATION_CAP = 10  # GitHub shows at most 10 error and 10 warning annotations per step


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
        f"::error title={_gh_escape_property('prefdata: ' + f['name'])}::{_gh_escape_data(threshold_line(f, report).replace('`', ''))}"
        for f in threshold_findings(report)
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
    # The verdict with the headline's counts, the same words as the other renderers.
    lines = [f"::notice title=prefdata::{_gh_escape_data(status_line(report))}"] + errors + warnings
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
