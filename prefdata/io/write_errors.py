"""Disk full, quota, read-only or forbidden OUT: one line naming the path instead of a traceback."""

from __future__ import annotations

import errno
import os
import re
from pathlib import Path

from prefdata.core.errors import PrefdataError

# errno values that mean "this location cannot take the output", not "the code is wrong".
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EACCES, errno.EPERM, errno.EFBIG})
_ARROW_ERRNO = re.compile(r"\[errno (\d+)\]", re.IGNORECASE)  # pyarrow's OSError carries it in the text


def _errno(exc: OSError) -> int | None:
    if exc.errno is not None:
        return exc.errno
    found = _ARROW_ERRNO.search(str(exc))
    return int(found.group(1)) if found else None


def write_problem(exc: OSError, out: str | Path) -> PrefdataError | None:
    """The one-line error for a failed write under `out`, or None when `exc` is something else
    (another errno, or a file outside OUT such as an unreadable input)."""
    code = _errno(exc)
    if code not in WRITE_ERRNOS:
        return None
    out_path = Path(out)
    path = Path(exc.filename) if isinstance(exc.filename, (str, os.PathLike)) else out_path
    try:
        inside = path.resolve() == out_path.resolve() or out_path.resolve() in path.resolve().parents
    except OSError:
        inside = False
    if not inside:
        return None
    assert code is not None
    return PrefdataError(f"cannot write {path}: {os.strerror(code)} ({out_path} got no new output)")
