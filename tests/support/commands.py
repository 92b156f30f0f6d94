"""Commands run with this Python: executables that tests put on a PATH (or where a command line names a
program), a Python file of the tests run by this Python; and a checkout's script run by its path."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path


def python_command(exe: Path, script: str | Path) -> Path:
    """`exe`, an executable that runs `script` with this Python and its own arguments."""
    exe.parent.mkdir(parents=True, exist_ok=True)
    here, target = shlex.quote(sys.executable), shlex.quote(str(Path(script).resolve()))
    exe.write_text(f'#!/bin/sh\nexec {here} {target} "$@"\n')
    exe.chmod(0o755)
    return exe


def run_script(script: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """`script` as a developer runs it from a checkout: by its path, with this Python, without PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([sys.executable, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=60)
