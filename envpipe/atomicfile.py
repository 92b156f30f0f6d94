"""Write a file atomically: a failed or interrupted write leaves the old file (or none), never a torn one."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


def new_file_mode() -> int:
    """The mode ``open`` gives a new file under this process's umask (0644 under the usual 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


@contextmanager
def atomic_write(path: str | Path, mode: str = "w", **open_args: Any) -> Iterator[IO[Any]]:
    """Open a temporary file next to ``path``; on success it replaces ``path`` with the usual mode (0644
    under umask 022), on failure it is removed. Missing parent directories are created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **open_args) as fh:
            os.fchmod(fh.fileno(), new_file_mode())  # mkstemp's 0600 would hide results from other users
            yield fh
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
