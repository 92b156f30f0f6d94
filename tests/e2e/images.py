"""Both images built for real with podman, without reaching any container registry.

A Debian bookworm base made by debootstrap from the mirror apt uses (plus the host's extra CA
certificates, without which pip inside the build cannot verify PyPI through this network's proxy),
a Python stand-in for the clockd image's python:3.11 base, and a PEP 503 index of the CPU torch wheel
that lies on this machine; then `make image ENGINE=podman` with the Makefile's BASE_IMAGE, TORCH_INDEX
and BUILD_FLAGS variables, the way a user without registry access would build. The clockd image is built
from its Dockerfile's own default base, the stand-in tagged with that name, through a podman with no search
registries (tests/e2e/podman.py): FROM resolves only a fully qualified name.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.e2e.podman import Podman, Stopwatch

ROOT = Path(__file__).resolve().parents[2]
REGISTRY = "localhost/envpipe-e2e"
DEBIAN = f"{REGISTRY}/debian:bookworm"
PYTHON = f"{REGISTRY}/python:3.11-bookworm"
TAG = "e2e"


@dataclass(frozen=True)
class Images:
    runtime: str
    clockd: str


def debian_mirror() -> str:
    """The Debian mirror that apt on this machine uses (deb822 or one-line sources)."""
    for path in [*sorted(Path("/etc/apt").glob("sources.list.d/*.sources")), Path("/etc/apt/sources.list")]:
        text = path.read_text() if path.is_file() else ""
        found = re.search(r"^URIs:\s*(\S+/debian)/?\s*$", text, flags=re.M) or re.search(
            r"^deb\s+(?:\[[^]]*\]\s+)?(\S+/debian)/?\s+bookworm\b", text, flags=re.M
        )
        if found:
            return found.group(1)
    return "http://deb.debian.org/debian"


def _debian_base(podman: Podman) -> None:
    rootfs = podman.dir / "rootfs"
    subprocess.run(
        ["debootstrap", "--variant=minbase", "bookworm", str(rootfs), debian_mirror()],
        check=True, capture_output=True, timeout=600,
    )
    for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for f in (rootfs / junk).glob("*"):
            if f.is_file():
                f.unlink()
    certs = rootfs / "usr/local/share/ca-certificates"
    certs.mkdir(parents=True, exist_ok=True)
    for crt in Path("/usr/local/share/ca-certificates").glob("*.crt"):
        shutil.copy(crt, certs)
    tar = subprocess.run(["tar", "-C", str(rootfs), "-c", "."], check=True, capture_output=True).stdout
    podman.run("import", "-", DEBIAN, input=tar)
    shutil.rmtree(rootfs)


def _torch_index(podman: Podman) -> Path:
    """The torch wheel pinned in pyproject (the CPU build on this machine) and its dependencies."""
    flat, index = podman.dir / "torch-flat", podman.dir / "torch-index" / "simple"
    torch = re.search(r'"torch==([^"]+)"', (ROOT / "pyproject.toml").read_text())
    assert torch, "pyproject.toml pins torch"
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "-d", str(flat), f"torch=={torch.group(1)}"],
                   check=True, capture_output=True, timeout=600)
    for wheel in flat.glob("*.whl"):
        project = index / re.sub(r"[-_.]+", "-", wheel.name.split("-")[0]).lower()
        project.mkdir(parents=True, exist_ok=True)
        shutil.move(wheel, project / wheel.name)
        (project / "index.html").write_text(f'<a href="{wheel.name}">{wheel.name}</a>\n')
    return index.parent


def default_base(dockerfile: Path) -> str:
    """The base image a Dockerfile builds on unless told otherwise (its `ARG BASE_IMAGE=...`)."""
    found = re.search(r"^ARG BASE_IMAGE=(\S+)$", dockerfile.read_text(), flags=re.M)
    assert found, dockerfile
    return found.group(1)


def build(podman: Podman, clock: Stopwatch) -> Images:
    """Everything from scratch, or what an earlier run with ENVPIPE_E2E_KEEP=1 left (then rebuilt by make)."""
    if not podman.has_image(DEBIAN):
        with clock.lap("base image: debootstrap Debian bookworm + import"):
            _debian_base(podman)
    if not podman.has_image(PYTHON):
        with clock.lap("base image: Python (stand-in for python:3.11-slim)"):
            podman.run("build", "--format", "docker", "--pull=never", "--build-arg", f"BASE_IMAGE={DEBIAN}",
                       "-f", str(ROOT / "tests/e2e/python-base.Dockerfile"), "-t", PYTHON, str(ROOT / "tests/e2e"))
    podman.run("tag", PYTHON, default_base(ROOT / "images/clockd/Dockerfile"))  # so the default FROM resolves
    with clock.lap("local torch index"):
        index = _torch_index(podman) if not (podman.dir / "torch-index").exists() else podman.dir / "torch-index"
    flags = f"BUILD_FLAGS=--format docker --pull=never -v {index}:/torchidx:ro"
    for image in ("runtime", "clockd"):
        with clock.lap(f"image envpipe-{image}: make image ENGINE=podman IMAGES={image}"):
            result = subprocess.run(
                ["make", "--no-print-directory", "-C", str(ROOT), "image", "ENGINE=podman", f"IMAGES={image}",
                 f"REGISTRY={REGISTRY}", f"TAG={TAG}", f"RUNTIME_BASE_IMAGE={DEBIAN}",  # clockd: its own default
                 "TORCH_INDEX=file:///torchidx/simple", flags],
                env=podman.env, capture_output=True, text=True, timeout=1500,
            )
            if result.returncode != 0:
                raise RuntimeError(f"make image failed:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}")
    return Images(runtime=f"{REGISTRY}/envpipe-runtime:{TAG}", clockd=f"{REGISTRY}/envpipe-clockd:{TAG}")
