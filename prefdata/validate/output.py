"""`validate`'s report out: rendered in its format to stdout or `--output` (GitHub: annotations on
stdout and the Markdown summary in $GITHUB_STEP_SUMMARY), and the `--baseline` report read."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from prefdata.core.errors import PrefdataError
from prefdata.io.manifest import atomic_write_text
from prefdata.report.sections import SCHEMA_VERSION


def load_baseline(path: str | Path) -> dict[str, Any]:
    p = Path(path)
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise PrefdataError(f"--baseline {p}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise PrefdataError(f"--baseline {p}: not a JSON report ({exc})") from None
    if not isinstance(data, dict) or "schema_version" not in data or "flagged_rows" not in data:
        raise PrefdataError(f"--baseline {p}: not a prefdata report.json (no schema_version / flagged_rows)")
    if not isinstance(data["schema_version"], int) or data["schema_version"] > SCHEMA_VERSION:
        raise PrefdataError(
            f"--baseline {p}: report schema {data['schema_version']!r} is newer than this prefdata reads ({SCHEMA_VERSION})"
        )
    return data


def _render(report: dict[str, Any], fmt: str) -> str:
    # Each renderer imported only for its format: start-up counts on every pull-request check.
    if fmt == "json":
        return json.dumps(report, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
    if fmt == "markdown":
        from prefdata.report.render_markdown import render_markdown

        return render_markdown(report)
    if fmt == "html":
        from prefdata.report.render_html import render_html

        return render_html(report)
    from prefdata.report.render_text import render_text

    return render_text(report)


_SUFFIX_FORMATS = {".html": "html", ".htm": "html", ".md": "markdown", ".json": "json"}


def emit(report: dict[str, Any], fmt: str, output: str | Path | None) -> str:
    from prefdata.report.render_text import render_text

    if fmt == "github":
        from prefdata.report.render_github import github_annotations, write_step_summary
        from prefdata.report.render_markdown import render_markdown

        annotations = github_annotations(report)
        text = "".join(line + "\n" for line in annotations)
        sys.stdout.write(text)  # GitHub reads workflow commands from stdout only
        sys.stdout.write(render_text(report))
        write_step_summary(render_markdown(report))
        if output is not None:
            file_format = _SUFFIX_FORMATS.get(Path(output).suffix.lower(), "json")
            _write(output, _render(report, file_format))
        return text
    if output is not None and fmt == "text":  # `--output report.json` alone: the file's suffix says what it wants
        fmt = _SUFFIX_FORMATS.get(Path(output).suffix.lower(), "text")
    rendered = _render(report, fmt)
    if output is not None:
        _write(output, rendered)
        if fmt != "text":
            sys.stdout.write(render_text(report))  # still say what happened on the terminal
    else:
        sys.stdout.write(rendered)
    return rendered


def _write(path: str | Path, text: str) -> None:
    p = Path(path)
    if p.is_dir():
        raise PrefdataError(f"--output {p} is a directory")
    if not p.parent.exists():
        raise PrefdataError(f"--output {p}: directory {p.parent} does not exist")
    atomic_write_text(p, text)
