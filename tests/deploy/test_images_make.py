"""images/images.mk: `make image`, `make push`, `make image push`, run with `make -n` and with a stub
engine on PATH that records its arguments (no container engine can run here)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="GNU make not installed")


def stub_engine(tmp_path: Path, name: str) -> tuple[dict[str, str], Path]:
    """A fake `docker`/`podman` first on PATH that appends its argv to a log, one call per line."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    log = tmp_path / "engine.log"
    stub = bindir / name
    stub.write_text(f'#!/bin/sh\necho "$0 $*" >> {log}\n')
    stub.chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}")
    return env, log


def make(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args],
                          capture_output=True, text=True, env=env)


def calls(log: Path) -> list[list[str]]:
    return [line.split()[1:] for line in log.read_text().splitlines()] if log.exists() else []


def test_dry_run_image_push_builds_then_pushes_both() -> None:
    result = make("-n", "image", "push", "REGISTRY=reg.example/team", "TAG=v9", "ENGINE=podman",
                  "PLATFORM=linux/arm64")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    for img in ("runtime", "clockd"):
        assert f"podman build --platform linux/arm64 -f images/{img}/Dockerfile" in out
        assert f"-t reg.example/team/envpipe-{img}:v9 ." in out
        assert f"podman push reg.example/team/envpipe-{img}:v9" in out
    assert out.index("podman build") < out.index("podman push")


def test_stub_docker_records_builds_and_pushes(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "docker")
    result = make("image", "push", "REGISTRY=reg.example/team", "TAG=t1", env=env)
    assert result.returncode == 0, result.stderr
    recorded = calls(log)
    assert [c[0] for c in recorded] == ["build", "build", "push", "push"]
    build = recorded[0]
    assert build[build.index("-f") + 1] == "images/runtime/Dockerfile"
    assert build[build.index("-t") + 1] == "reg.example/team/envpipe-runtime:t1"
    assert build[build.index("--platform") + 1] == "linux/amd64"
    assert "VERSION=t1" in build and build[-1] == "."
    assert any(arg.startswith("REVISION=") and arg != "REVISION=unknown" for arg in build)
    assert recorded[3] == ["push", "reg.example/team/envpipe-clockd:t1"]


def test_tag_defaults_to_git_describe(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "docker")
    described = subprocess.run(["git", "-C", str(ROOT), "describe", "--tags", "--always", "--dirty"],
                               capture_output=True, text=True, check=True).stdout.strip()
    assert make("image", env=env).returncode == 0
    # Without REGISTRY the image is tagged locally only.
    assert f"envpipe-clockd:{described}" in calls(log)[1]


def test_image_push_without_registry_fails_before_building(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "docker")
    result = make("image", "push", "REGISTRY=", env=env)
    assert result.returncode != 0
    assert "REGISTRY is not set" in result.stderr
    assert calls(log) == []


def test_push_without_registry_fails(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "podman")
    result = make("push", "ENGINE=podman", "REGISTRY=", env=env)
    assert result.returncode != 0 and "REGISTRY is not set" in result.stderr
    assert calls(log) == []


def test_missing_engine_fails_clearly(tmp_path: Path) -> None:
    env = dict(os.environ, PATH=str(tmp_path))  # neither docker nor podman, but make still runs
    result = subprocess.run([shutil.which("make") or "make", "-C", str(ROOT), "image", "ENGINE=podman"],
                            capture_output=True, text=True, env=env)
    assert result.returncode != 0
    assert "container engine 'podman' not found on PATH" in result.stderr


def test_unsupported_engine_is_refused(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "buildah")
    result = make("image", "ENGINE=buildah", env=env)
    assert result.returncode != 0 and "ENGINE='buildah' is not supported" in result.stderr
    assert calls(log) == []


def test_failed_build_stops_before_the_next(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "docker")
    stub = Path(env["PATH"].split(":")[0]) / "docker"
    stub.write_text(stub.read_text() + "exit 1\n")
    result = make("image", "push", "REGISTRY=r.example", env=env)
    assert result.returncode != 0
    assert [c[0] for c in calls(log)] == ["build"]


def test_build_variables_reach_the_builds(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "podman")
    result = make("image", "ENGINE=podman", "REGISTRY=localhost/e2e", "TAG=t",
                  "RUNTIME_BASE_IMAGE=localhost/debian:bookworm", "CLOCKD_BASE_IMAGE=localhost/python:3.11",
                  "TORCH_INDEX=file:///torchidx/simple", "BUILD_FLAGS=--format docker -v /srv/idx:/torchidx:ro",
                  env=env)
    assert result.returncode == 0, result.stderr
    runtime, clockd = calls(log)
    assert "BASE_IMAGE=localhost/debian:bookworm" in runtime and "TORCH_INDEX=file:///torchidx/simple" in runtime
    assert "BASE_IMAGE=localhost/python:3.11" in clockd and not any("TORCH_INDEX" in a for a in clockd)
    for build in (runtime, clockd):
        i = build.index("--format")
        assert build[i:i + 4] == ["--format", "docker", "-v", "/srv/idx:/torchidx:ro"]


def test_defaults_pass_no_base_image(tmp_path: Path) -> None:
    env, log = stub_engine(tmp_path, "docker")
    assert make("image", env=env).returncode == 0
    assert not any("BASE_IMAGE" in a or "TORCH_INDEX" in a for build in calls(log) for a in build)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("REGISTRY=bad registry!!", "REGISTRY='bad registry!!' is not a registry"),
        ("REGISTRY=it's", "REGISTRY='it's' is not a registry"),
        ("TAG=-v1", "TAG='-v1' is not an image tag"),
        ("TAG=a:b", "TAG='a:b' is not an image tag"),
    ],
)
def test_malformed_reference_is_refused_in_one_line_before_building(
    tmp_path: Path, setting: str, message: str
) -> None:
    env, log = stub_engine(tmp_path, "docker")
    result = make("image", "push", setting, env=env)
    assert result.returncode != 0
    (line,) = result.stderr.splitlines()
    assert message in line and result.stdout == ""
    assert calls(log) == []
