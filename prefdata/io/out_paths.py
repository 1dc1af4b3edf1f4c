"""The files of an OUT that someone else may have handed over, each checked before it is read.

`select`, `refs`, `train`, `show` and `validate` read OUTs that others hand over. A tampered OUT must
not make them read anything outside it: every file they read goes through `out_file`, which refuses
a symlink and a name that leaves OUT (`../`, an absolute path), and the Arrow files `state.json`
lists go through the same check before `datasets.load_from_disk` joins their names to OUT.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath
from typing import Any

from prefdata.core.errors import PrefdataError

# The files of a finished OUT that commands read, besides the Arrow files state.json lists.
READ_FILES = ("manifest.json", "state.json", "dataset_info.json", "dropped.jsonl", "quarantine.jsonl")


def out_file(out: str | Path, name: str) -> Path:
    """OUT/`name`, refused (one line, exit 2) when `name` leaves OUT or the path is a symlink.

    A missing file is returned as is (callers decide whether it must exist); an existing one must
    be a regular file. Symlinks are refused even when they point inside OUT: prefdata never writes
    one, so one there was put there by someone else."""
    out = Path(out)
    parts = name_parts(out, name)
    path = out.joinpath(*parts)
    for step in [out.joinpath(*parts[: i + 1]) for i in range(len(parts))]:
        if step.is_symlink():
            raise PrefdataError(f"{step} is a symlink: refusing to read a file of {out} that may lie outside it")
    if path.exists() and not path.is_file():
        raise PrefdataError(f"{path} is not a regular file: refusing to read a tampered OUT")
    base = out.resolve()
    if path.resolve() != base and base not in path.resolve().parents:
        raise PrefdataError(f"{path} lies outside {out}: refusing to read a tampered OUT")
    return path


def name_parts(base: Path, name: str) -> tuple[str, ...]:
    """The parts of a relative file name found in `base`'s metadata (state.json), refused (one line)
    when it is absolute or climbs out with `..`: joined to `base` it would name a file elsewhere."""
    parts = PurePosixPath(name.replace("\\", "/")).parts
    if not parts or PurePosixPath(name).is_absolute() or Path(name).is_absolute() or ".." in parts:
        raise PrefdataError(f"{base} names a file outside it ({name!r}): refusing to read a tampered dataset")
    return parts


def data_files(out: str | Path) -> list[Path]:
    """The Arrow files OUT's state.json lists, each checked with `out_file` and present."""
    state_path = out_file(out, "state.json")
    try:
        state: Any = json.loads(state_path.read_text(encoding="utf-8"))
        entries = state["_data_files"]
        names = [entry["filename"] for entry in entries]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"{state_path}: no readable dataset state ({type(exc).__name__}: {exc})") from None
    if not isinstance(entries, list) or not all(isinstance(name, str) for name in names):
        raise PrefdataError(f"{state_path}: _data_files must be a list of {{\"filename\": NAME}} entries")
    paths = [out_file(out, name) for name in names]
    for path in paths:
        if not path.is_file():
            raise PrefdataError(f"{state_path} lists {path.name}, which does not exist")
    return paths


def check_out_files(out: str | Path) -> list[Path]:
    """Every file of OUT a command reads checked with `out_file`; returns the Arrow data files."""
    out = Path(out)
    if out.is_dir():
        for name in READ_FILES:
            out_file(out, name)
    return data_files(out)


def arrow_rows(paths: list[Path]) -> int:
    """Rows in Arrow IPC stream files (what `save_to_disk` writes), memory-mapped: reads no column data."""
    import pyarrow as pa

    rows = 0
    for path in paths:
        try:
            with pa.memory_map(str(path)) as source:
                rows += sum(batch.num_rows for batch in pa.ipc.open_stream(source))
        except (OSError, ValueError, pa.ArrowInvalid) as exc:
            raise PrefdataError(f"{path} is not a readable Arrow file ({str(exc).splitlines()[0]})") from None
    return rows


def count_lines(path: Path) -> int:
    """Non-blank lines of a JSON-lines file (0 when it is absent), streamed."""
    if not path.is_file():
        return 0
    count = 0
    with open(path, "rb") as handle:
        for line in handle:
            count += bool(line.strip())
    return count
