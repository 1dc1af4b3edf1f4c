"""OUT/ as a directory: a staging directory inside it, `publish` (the manifest last), `abandon`.

Everything is written into OUT/.prefdata-staging-PID/ first; `publish` swaps it in with renames, the
manifest last, so a half-written OUT/ never looks complete. A directory is only ever deleted when
prefdata's marker file says prefdata created it.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any, Iterable

from prefdata.core.errors import PrefdataError, first_line
from prefdata.io.lock import LOCK_NAME

MARKER = ".prefdata-output"  # present in every directory prefdata creates; guards deletion
STAGING_PREFIX = ".prefdata-staging-"


def is_prefdata_dir(path: Path) -> bool:
    return (path / MARKER).is_file()


def prepare_output_dir(out: Path, overwrite: bool, inputs: Iterable[str | Path | None] = ()) -> Path:
    """Check OUT may be written; return a fresh staging directory inside it.

    Everything is written into OUT/.prefdata-staging-PID/ (prefdata never writes outside OUT) and
    published by `publish`; until then a previous output in OUT stays whole and untouched. `inputs`
    (the paths the command reads) must not lie inside OUT: publishing replaces what OUT holds.
    """
    refuse_inputs_inside(out, inputs)
    if out.exists():
        if not out.is_dir():
            raise PrefdataError(f"{out} exists and is not a directory")
        if any(entry.name != LOCK_NAME for entry in out.iterdir()):  # the lock is the caller's own
            if not overwrite and (out / "manifest.json").exists():
                raise PrefdataError(f"{out} already exists; pass --overwrite to replace it")
            if not is_prefdata_dir(out):
                raise PrefdataError(
                    f"{out} exists and was not created by prefdata; refusing to write into it"
                    + (" even with --overwrite" if overwrite else "")
                )
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("created by prefdata\n", encoding="utf-8")
    _remove_stale_staging(out)
    staging = out / f"{STAGING_PREFIX}{os.getpid()}"
    staging.mkdir()
    return staging


def refuse_inputs_inside(output: Path, inputs: Iterable[str | Path | None], what: str = "replaces") -> None:
    """One line (exit 2) when an input path is `output` or lies inside it: replacing the output
    (--overwrite, or publishing over an unfinished one) would delete the input the run reads.
    None and non-path inputs (a Hub id that names no local file) are skipped."""
    target = Path(output).resolve()
    for given in inputs:
        if given is None or not Path(given).exists():
            continue
        # The path as named (a symlink inside OUT would be deleted too) and what it points to.
        for found in (Path(given).absolute().parent.resolve() / Path(given).name, Path(given).resolve()):
            if found == target or target in found.parents:
                where = "is the output" if found == target else "lies inside the output"
                raise PrefdataError(f"the input {given} {where} {output}, which this command {what}: "
                                    "move the input out of it, or choose another output")


def _remove_stale_staging(out: Path) -> None:
    """Leftovers of killed runs are removed; they live inside OUT, which prefdata created."""
    for candidate in out.glob(f"{STAGING_PREFIX}*"):
        if candidate.is_dir():
            shutil.rmtree(candidate, ignore_errors=True)


def publish(staging: Path, out: Path) -> None:
    """Replace OUT's contents with the staging directory's, the manifest last.

    Order matters for a kill at any point: the old manifest goes first (OUT stops looking
    finished), then the old files, then the new files are renamed in, and the new manifest last.
    """
    if not is_prefdata_dir(out):  # re-checked: never delete foreign data
        raise PrefdataError(f"{out} was not created by prefdata; refusing to replace it")
    (out / "manifest.json").unlink(missing_ok=True)
    for entry in out.iterdir():
        if entry == staging or entry.name in (MARKER, LOCK_NAME):
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
    for entry in staging.iterdir():
        if entry.name not in ("manifest.json", MARKER):
            os.replace(entry, out / entry.name)
    if (staging / "manifest.json").exists():
        os.replace(staging / "manifest.json", out / "manifest.json")
    shutil.rmtree(staging)


def abandon(staging: Path, out: Path) -> None:
    """After a failure: drop the staging directory, and OUT itself if it holds nothing else."""
    shutil.rmtree(staging, ignore_errors=True)
    if out.is_dir() and [entry.name for entry in out.iterdir() if entry.name != LOCK_NAME] == [MARKER]:
        shutil.rmtree(out, ignore_errors=True)


def load_out_dataset(path: str | Path, command: str) -> Any:
    """OUT's dataset as `datasets.load_from_disk(OUT)` gives it, for `command` (train, select, the
    TRL hand-off); one line instead of a traceback when it cannot be read or holds several splits.
    Its files are checked first (prefdata.io.out_paths): load_from_disk would follow a symlink or a
    `../` name in state.json out of OUT."""
    import datasets

    from prefdata.io.out_paths import check_out_files

    state = Path(path) / "state.json"
    if (Path(path) / "dataset_dict.json").exists() and not state.exists():
        raise PrefdataError(f"{path} holds several splits; {command} takes one prepared OUT per split")
    if state.is_symlink() or state.exists():
        check_out_files(path)
    try:
        dataset = datasets.load_from_disk(str(path))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise PrefdataError(f"cannot open the prepared data in {path}: {first_line(exc)}") from None
    if not isinstance(dataset, datasets.Dataset):
        raise PrefdataError(f"{path} holds several splits; {command} takes one prepared OUT per split")
    return dataset
