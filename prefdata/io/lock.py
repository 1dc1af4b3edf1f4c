"""One writer per OUT: `prepare` and `refs` hold OUT/.prefdata-lock while they write.

The lock is an advisory `flock` on that file, so the kernel drops it when its holder dies: a lock
file left by a killed run is stale by construction and the next run takes it over (and the killed
run's staging leftovers with it). The file says who holds it, for the refusal message. Where
`flock` is unavailable (not POSIX), the holder's process id decides whether a lock is stale.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from prefdata.core.errors import PrefdataError
from prefdata.io.write_errors import write_problem

try:
    import fcntl
except ImportError:  # Windows: no flock; fall back to exclusive creation + process ids
    fcntl = None  # type: ignore[assignment]

LOCK_NAME = ".prefdata-lock"
F = TypeVar("F", bound=Callable[..., Any])


class OutLock:
    """Exclusive lock on OUT for one command; a context manager, or `acquire()` / `release()`.

    `create`: make OUT (and its parents) when missing; the directory is removed again on release
    when the lock made it and nothing else was written there."""

    def __init__(self, out: str | Path, command: str, *, create: bool = True) -> None:
        self.out = Path(out)
        self.path = self.out / LOCK_NAME
        self.command = command
        self.create = create
        self._fd: int | None = None
        self._made_out = False

    def acquire(self) -> OutLock:
        if not self.out.exists() and self.create:
            try:
                self.out.mkdir(parents=True, exist_ok=True)
            except OSError as exc:
                raise write_problem(exc, self.out) or exc from None
            self._made_out = True
        while True:
            fd = self._open()
            if _try_lock(fd, self.path):
                # The file may have been unlinked by its previous holder between our open and our
                # lock; then we locked a file nobody else will ever see: start again.
                try:
                    same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
                except FileNotFoundError:
                    same = False
                if same:
                    break
                os.close(fd)
                continue
            holder = _read_holder(fd)
            os.close(fd)
            self._undo_mkdir()
            raise PrefdataError(
                f"{self.out} is in use by another prefdata run ({_describe(holder)}); "
                "only one run may write an OUT at a time"
            )
        info = {"pid": os.getpid(), "host": socket.gethostname(), "command": self.command,
                "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(info).encode("utf-8"), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is None:
            return
        # Unlink before unlocking (see the inode check in acquire), and only our own file: OUT may
        # have been removed under us (a failed run) and a new run may hold a new lock file there.
        try:
            if os.stat(self.path).st_ino == os.fstat(self._fd).st_ino:
                self.path.unlink()
        except FileNotFoundError:
            pass
        os.close(self._fd)  # closing drops the flock
        self._fd = None
        self._undo_mkdir()

    def _open(self) -> int:
        try:
            return os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise write_problem(exc, self.out) or PrefdataError(f"cannot create the lock file {self.path}: {exc}") from None

    def _undo_mkdir(self) -> None:
        if self._made_out:
            try:
                self.out.rmdir()  # only succeeds when empty: never removes what others wrote
            except OSError:
                pass
            self._made_out = False

    def __enter__(self) -> OutLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _try_lock(fd: int, path: Path) -> bool:
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            return False
    holder = _read_holder(fd)  # no flock: a lock whose process is gone (on this host) is stale
    return not holder or (holder.get("host") == socket.gethostname() and not _alive(int(holder.get("pid", 0))))


def _read_holder(fd: int) -> dict[str, Any]:
    try:
        data = os.pread(fd, 4096, 0)
        holder = json.loads(data.decode("utf-8")) if data else {}
        return holder if isinstance(holder, dict) else {}
    except (OSError, ValueError):
        return {}


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _describe(holder: dict[str, Any]) -> str:
    if not holder:
        return "holder unknown"
    return f"{holder.get('command', '?')} pid {holder.get('pid', '?')} on {holder.get('host', '?')} since {holder.get('started', '?')}"


def is_rank_zero(kwargs: dict[str, Any]) -> bool:
    """For distributed commands: only rank 0 (the rank that writes OUT) takes the lock."""
    rank = kwargs.get("rank")
    return int(rank if rank is not None else os.environ.get("RANK", "0") or 0) == 0


def holding_out_lock(command: str, *, when: Callable[[dict[str, Any]], bool] = lambda kwargs: True) -> Callable[[F], F]:
    """Decorator: hold OUT's lock (OUT = the first argument) while the command runs.

    OUT is not created: a missing OUT is the command's own error to report."""

    def wrap(function: F) -> F:
        first = next(iter(inspect.signature(function).parameters))

        @functools.wraps(function)
        def run(*args: Any, **kwargs: Any) -> Any:
            out = args[0] if args else kwargs.get(first)
            if out is None or not when(kwargs) or not Path(out).is_dir():
                return function(*args, **kwargs)
            with OutLock(out, command, create=False):
                try:
                    return function(*args, **kwargs)
                except OSError as exc:  # disk full or read-only OUT: one line, not a traceback
                    problem = write_problem(exc, out)
                    if problem is None:
                        raise
                    raise problem from None

        return run  # type: ignore[return-value]

    return wrap
