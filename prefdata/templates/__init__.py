"""Chat templates shipped with prefdata (package data), found by name from any directory:
`--chat-template-file deepseek-r1-keep-reasoning` (docs/reasoning.md says what each one changes)."""

from __future__ import annotations

from importlib import resources

SUFFIX = ".jinja"


def bundled_template_names() -> list[str]:
    """Names of the bundled templates (file names without `.jinja`)."""
    return sorted(entry.name[: -len(SUFFIX)] for entry in resources.files(__name__).iterdir()
                  if entry.name.endswith(SUFFIX))


def bundled_template_text(name: str) -> str | None:
    """The bundled template called `name` (with or without `.jinja`), or None when there is none."""
    stem = name[: -len(SUFFIX)] if name.endswith(SUFFIX) else name
    if stem not in bundled_template_names():
        return None
    return resources.files(__name__).joinpath(stem + SUFFIX).read_text(encoding="utf-8")
