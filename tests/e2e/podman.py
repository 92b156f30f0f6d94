"""podman as root with all of its state in one scratch directory, and its cleanup.

The settings are the ones that work on these machines (shared/research/containers.md): runc with
cgroupfs, capped nofile/nproc ulimits (runc fails with "error setting rlimit" otherwise), the overlay
storage driver (ENVPIPE_E2E_STORAGE=vfs for the slow fallback), images built with --format docker
(the OCI format drops the runtime Dockerfile's SHELL). podman still writes a blob cache under
/var/lib/containers and netavark state under /run/containers: `close()` removes what this run added.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

SYSTEM_STATE = (Path("/var/lib/containers"), Path("/run/containers"))


def unavailable() -> str | None:
    """Why podman cannot run containers here, or None."""
    if os.geteuid() != 0:
        return "needs root (podman runs rootful here)"
    for tool in ("podman", "runc", "debootstrap"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/apt-deps installs podman, buildah, runc, debootstrap)"
    with tempfile.TemporaryDirectory(prefix="envpipe-podman-probe-") as tmp:
        info = Podman(Path(tmp)).run("info", check=False, timeout=60)
    if info.returncode != 0:
        last = info.stderr.strip().splitlines()[-1:] or [f"exit {info.returncode}"]
        return f"`podman info` fails: {last[0]}"
    return None


def _tree(path: Path) -> set[Path]:
    return set(path.rglob("*")) | {path} if path.exists() else set()


class Podman:
    def __init__(self, workdir: Path, storage: str = "overlay") -> None:
        self.dir = workdir
        self.storage = storage
        for sub in ("libpod", "tmp", "net", "root", "run"):
            (workdir / sub).mkdir(parents=True, exist_ok=True)
        (workdir / "containers.conf").write_text(
            "[containers]\n"
            'default_ulimits = ["nofile=4096:4096", "nproc=4096:4096"]\n'
            "[engine]\n"
            'cgroup_manager = "cgroupfs"\nevents_logger = "file"\nruntime = "runc"\n'
            f'tmp_dir = "{workdir}/libpod"\nimage_copy_tmp_dir = "{workdir}/tmp"\n'
            "[network]\n"
            f'network_config_dir = "{workdir}/net"\n'
        )
        (workdir / "storage.conf").write_text(
            f'[storage]\ndriver = "{storage}"\ngraphroot = "{workdir}/root"\nrunroot = "{workdir}/run"\n'
        )
        # no search registries, as on a machine whose podman has none configured: a short image name is refused
        (workdir / "registries.conf").write_text('unqualified-search-registries = []\nshort-name-mode = "enforcing"\n')
        self.env = dict(
            os.environ,
            CONTAINERS_CONF=str(workdir / "containers.conf"),
            CONTAINERS_STORAGE_CONF=str(workdir / "storage.conf"),
            CONTAINERS_REGISTRIES_CONF=str(workdir / "registries.conf"),
            TMPDIR=str(workdir / "tmp"),
        )
        self._system_before = {p: _tree(p) for p in SYSTEM_STATE}

    def run(self, *args: str, check: bool = True, timeout: float = 600, input: bytes | None = None,
            ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            ["podman", *args], env=self.env, capture_output=True, timeout=timeout, input=input,
        )
        out = subprocess.CompletedProcess(
            result.args, result.returncode, result.stdout.decode(errors="replace"),
            result.stderr.decode(errors="replace"),
        )
        if check and out.returncode != 0:
            raise RuntimeError(f"podman {' '.join(args[:3])}... failed ({out.returncode}): {out.stderr[-2000:]}")
        return out

    def has_image(self, ref: str) -> bool:
        return self.run("image", "exists", ref, check=False).returncode == 0

    def ip(self, container: str, network: str) -> str:
        fmt = f"{{{{(index .NetworkSettings.Networks \"{network}\").IPAddress}}}}"
        return self.run("inspect", "-f", fmt, container).stdout.strip()

    def close(self, keep_images: bool = False) -> None:
        """Remove containers and networks; unless keep_images, the whole store and the system state
        that this run added under /var/lib/containers and /run/containers."""
        self.run("rm", "-af", "-t", "0", check=False)
        self.run("network", "prune", "-f", check=False)
        if keep_images:
            return
        self.run("system", "reset", "-f", check=False, timeout=300)
        for path, before in self._system_before.items():
            for added in sorted(_tree(path) - before, key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    added.rmdir() if added.is_dir() and not added.is_symlink() else added.unlink()
        shutil.rmtree(self.dir, ignore_errors=True)


class Stopwatch:
    """Named durations of one e2e run (measured, this machine): each one line as it ends, through
    `say` (the conftest prints it past pytest's capture), and all of them again at the run's end."""

    def __init__(self, say: Callable[[str], None] = print) -> None:
        self.laps: list[tuple[str, float]] = []
        self.say = say

    @contextlib.contextmanager
    def lap(self, name: str):  # type: ignore[no-untyped-def]
        start = time.monotonic()
        try:
            yield
        except BaseException:
            self.say(f"e2e: {name}: failed after {time.monotonic() - start:.1f} s")
            raise
        self.record(name, time.monotonic() - start)

    def record(self, name: str, seconds: float) -> None:
        self.laps.append((name, seconds))
        self.say(f"e2e: {name}: {seconds:.1f} s")

    def lines(self) -> list[str]:
        return [f"{name:<44} {seconds:8.2f} s" for name, seconds in self.laps]


if __name__ == "__main__":  # `make e2e` asks first: prints why podman cannot run here, or nothing
    print(unavailable() or "", end="")
