"""The built wheel ships the hostfile templates (through the launcher/envpipe_launch/hostfiles symlink)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_wheel_contains_templates_and_loads_them(tmp_path: Path) -> None:
    src = tmp_path / "src"  # build from a copy so no build/ or egg-info lands in the checkout
    shutil.copytree(
        ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "*.egg-info", "build")
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            ".",
        ],
        cwd=src,
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("envpipe-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        z.extractall(tmp_path / "site")
    for fmt in ("deepspeed", "openmpi", "mvapich"):
        assert f"envpipe_launch/hostfiles/{fmt}.j2" in names
    # what `pip install 'envpipe[launch]'` brings: no torch, no deepspeed
    metadata = next((tmp_path / "site").glob("envpipe-*.dist-info/METADATA")).read_text()
    launch = {line.split()[1].split(">")[0] for line in metadata.splitlines()
              if line.startswith("Requires-Dist:") and 'extra == "launch"' in line}
    assert launch == {"click", "jinja2", "kubernetes", "psutil", "tqdm", "cryptography"}
    assert "License-Expression: Apache-2.0" in metadata  # an SPDX expression, not the deprecated table
    code = "from envpipe_launch import hostfile as h; print(h.render([h.Host('n0', 2)], 'mvapich'), end='')"
    env = dict(os.environ, PYTHONPATH=str(tmp_path / "site"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=tmp_path)
    assert out.stdout == "n0:2\n", out.stderr
