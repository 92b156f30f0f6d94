"""A script that imports envpipe builds DeepSpeed's JIT ops in its own environment's folder, not in the
per-user ~/.cache/torch_extensions that every checkout shares (and waits on)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

CHILD = """
import os, envpipe
from torch.utils.cpp_extension import _get_build_directory
print(os.environ["TORCH_EXTENSIONS_DIR"])
print(_get_build_directory("deepspeed_shm_comm", verbose=False))
"""


def _run(env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_the_op_build_goes_to_the_environments_own_folder() -> None:
    env = {k: v for k, v in os.environ.items() if k != "TORCH_EXTENSIONS_DIR"}
    folder, build = _run(env)
    assert Path(folder) == Path(sys.prefix) / "torch_extensions"  # the checkout's venv (make: .venv)
    assert Path(build).parent == Path(folder)  # where torch's cpp_extension.load (DeepSpeed's JIT) builds


def test_a_folder_the_user_chose_is_kept(tmp_path: Path) -> None:
    folder, build = _run({**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)})
    assert folder == str(tmp_path) and Path(build).parent == tmp_path
