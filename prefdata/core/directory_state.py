"""What a local directory holds, cheaply: a key for caches of things loaded or hashed from it.

A tokenizer or model fingerprint is kept per process while the directory's files stay as they were
(`prefdata online` reads the same directories every round); a file saved again changes its size,
modification time or inode, and the key with it.
"""

from __future__ import annotations

import os
from pathlib import Path


def directory_state(path: str | os.PathLike) -> tuple | None:
    """(real path, (name, size, mtime_ns, inode) of each file, by name), or None when `path` is not
    a readable directory."""
    if not os.path.isdir(path):
        return None
    try:
        entries = sorted(os.scandir(path), key=lambda entry: entry.name)
        files = []
        for entry in entries:
            if entry.is_file():
                stat = entry.stat()
                files.append((entry.name, stat.st_size, stat.st_mtime_ns, stat.st_ino))
    except OSError:
        return None
    return (os.path.realpath(Path(path)), tuple(files))
