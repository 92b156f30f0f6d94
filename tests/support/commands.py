"""Executables that tests put on a PATH (or where a command line names a program): a Python file of the
tests run by this Python."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path


def python_command(exe: Path, script: str | Path) -> Path:
    """`exe`, an executable that runs `script` with this Python and its own arguments."""
    exe.parent.mkdir(parents=True, exist_ok=True)
    here, target = shlex.quote(sys.executable), shlex.quote(str(Path(script).resolve()))
    exe.write_text(f'#!/bin/sh\nexec {here} {target} "$@"\n')
    exe.chmod(0o755)
    return exe
