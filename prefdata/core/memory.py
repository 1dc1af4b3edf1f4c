"""Giving freed heap memory back to the system between the stages of a long run."""

from __future__ import annotations

from typing import Any


def trim_heap() -> None:
    """Give the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Results unpickled from workers are thousands of small objects, many of them allocated on
    the engine's result thread (its own malloc arena). Freed, they leave holes that what the
    run builds next does not reuse, and the process would keep their memory beside it."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def _glibc() -> Any:
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:  # not glibc (macOS, musl): nothing to trim
        return None


_LIBC = _glibc()
