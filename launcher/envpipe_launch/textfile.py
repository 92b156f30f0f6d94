"""A text file a user gave (a hostfile, an affinity), read with bounds: a regular file of at most `max_bytes`
of UTF-8, never more held in memory (/dev/zero), never waited on (a FIFO is opened without blocking, then
refused). Anything else is one LaunchError line."""

from __future__ import annotations

import os
import stat

from .errors import LaunchError


def read_text(path: str, max_bytes: int, what: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise LaunchError(f"{what} {path}: not a regular file")
            data = f.read(max_bytes + 1)
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        raise LaunchError(f"cannot read {what} {path}: {getattr(e, 'strerror', None) or e}") from e
    if len(data) > max_bytes:
        raise LaunchError(f"{what} {path}: larger than {max_bytes} bytes")
    try:
        return data.decode("utf-8-sig")  # an editor's byte-order mark is not part of the text
    except UnicodeDecodeError as e:
        raise LaunchError(f"{what} {path}: not UTF-8 text (byte {e.start})") from e
