"""The leased-clock state file: which GPUs the daemon may have moved off their default clocks.

A GPU is written into the file before its clock is first locked (write ahead) and taken out after its
reset succeeds (both on the GPU's serial path, service.py), so whatever kills the daemon (SIGKILL, OOM,
a node-level crash), the next start, the guard container or ``--reset-all-and-exit`` knows which GPUs a
dead daemon left slow, and for whom.
Writes are atomic (a temporary file, fsync, rename, fsync of the directory): a crash mid-write leaves
the old file or the new one, never half of one. An exclusive lock on ``<file>.lock`` keeps a second
daemon from sharing the file: it is the daemon's own lock on the node, which ``--reset-all-and-exit``
and the reset guard take too. Only regular files are read or written: a FIFO, a device or a directory at
either path is refused at once (a FIFO would block the open for ever).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
from dataclasses import asdict, dataclass

VERSION = 1


class StateError(Exception):
    """The state file cannot be used: one line for the operator."""


class StateBusy(StateError):
    """Another live daemon holds the state file."""


class StateUnreadable(Exception):
    """The state file exists but says nothing usable (then every GPU must be reset)."""


@dataclass(frozen=True)
class Entry:
    """Why a GPU may be off its default clock: the lease that locked it, and when (Unix time)."""

    lease: str
    owner: str
    since: float


class StateFile:
    def __init__(self, path: str) -> None:
        self.path = path
        self._lock_fd: int | None = None
        self._created_lock = False

    def open(self) -> dict[str, Entry] | None:
        """Take the file for this process; what it records, or None when there is no file yet.

        StateError if the file cannot be used (no such directory, not writable; StateBusy: another
        daemon holds it); StateUnreadable if its content is not a state file we wrote.
        """
        where = f"--state-file {self.path}"
        if os.path.isdir(self.path):
            raise StateError(f"{where}: is a directory; give a file path")
        parent = os.path.dirname(os.path.abspath(self.path))
        if not os.path.isdir(parent):
            raise StateError(f"{where}: directory {parent} does not exist")
        lock_path = self.path + ".lock"
        try:
            self._created_lock = not os.path.exists(lock_path)
            fd = os.open(lock_path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK, 0o600)
        except OSError as exc:
            raise StateError(f"{where}: cannot write in {parent}: {exc.strerror}") from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise StateError(f"{where}: {lock_path} is not a regular file; remove it")
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StateBusy(f"{where}: another envpipe-clockd holds {lock_path}") from None
        self._lock_fd = fd
        return self._read()

    def _read(self) -> dict[str, Entry] | None:
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # a FIFO must not block us
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StateUnreadable(f"{self.path}: {exc.strerror}") from None
        with open(fd) as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise StateError(f"--state-file {self.path}: is not a regular file (a FIFO or a device?); remove it")
            try:
                raw = json.load(f)
            except (OSError, ValueError) as exc:
                raise StateUnreadable(f"{self.path}: {exc}") from None
        try:
            if raw["version"] != VERSION:
                raise StateUnreadable(f"{self.path}: version {raw['version']!r}, this daemon reads {VERSION}")
            return {uuid: Entry(**e) for uuid, e in raw["gpus"].items()}
        except (KeyError, TypeError, AttributeError) as exc:
            raise StateUnreadable(f"{self.path}: not a state file ({exc!r})") from None

    def save(self, gpus: dict[str, Entry]) -> None:
        """Replace the file with ``gpus``, atomically and durably."""
        tmp = f"{self.path}.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)  # whatever a crash (or anyone) left there: never write into a FIFO or a link
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        with open(fd, "w") as f:
            json.dump({"version": VERSION, "gpus": {u: asdict(e) for u, e in sorted(gpus.items())}}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(os.path.dirname(os.path.abspath(self.path)), os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)

    def close(self, *, failed_start: bool = False) -> None:
        """Release the lock; after a failed start, remove the lock file if this process made it."""
        if self._lock_fd is None:
            return
        if failed_start and self._created_lock:
            with contextlib.suppress(OSError):
                os.unlink(self.path + ".lock")
        os.close(self._lock_fd)
        self._lock_fd = None
