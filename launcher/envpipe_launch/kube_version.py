"""Which Kubernetes a cluster runs, and what the kube backend's objects may use there.

The launcher asks the API server (GET /version, as `kubectl version` does) before it creates anything:

- below MIN (1.27) it stops with one line: the Job fields the job relies on (podFailurePolicy, the pods'
  DisruptionTarget condition, Indexed completion) are not all served there by default;
- from SUCCESS_POLICY (1.31: Job successPolicy beta and on by default; GA in 1.33) node 0's success ends the Job
  through `spec.successPolicy`. Below, the API server drops that field (unknown before 1.30, behind an alpha
  gate in 1.30) and the other nodes end themselves once node 0 is gone (the image's entrypoint, through
  pod_contract.LAUNCHER_NODE_ENV), which works on every supported version, and on 1.31+ too.

`--dry-run` asks nothing: it prints the objects for MIN, which every supported version accepts.
The range is checked against Kubernetes' own schemas of MIN and of the newest version kubernetes-validate
ships (tests/launch/test_kube_manifests.py), and stated in docs/launcher.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import LaunchError


@dataclass(frozen=True, order=True)
class KubeVersion:
    major: int
    minor: int

    def __str__(self) -> str:
        return f"{self.major}.{self.minor}"


MIN = KubeVersion(1, 27)
SUCCESS_POLICY = KubeVersion(1, 31)


def parse(major: str | None, minor: str | None, git_version: str | None) -> KubeVersion:
    """The version of a /version answer: its gitVersion ("v1.30.2-eks-1552ad0"), else major and minor, whose
    minor may carry a "+" ("30+" on GKE and EKS)."""
    found = re.match(r"v?(\d+)\.(\d+)", git_version or "")
    if found:
        return KubeVersion(int(found[1]), int(found[2]))
    digits = [re.match(r"\d+", part or "") for part in (major, minor)]
    if digits[0] and digits[1]:
        return KubeVersion(int(digits[0][0]), int(digits[1][0]))
    raise LaunchError(f"the API server's version is unreadable: major {major!r}, minor {minor!r}, "
                      f"gitVersion {git_version!r}")


def supported(version: KubeVersion) -> KubeVersion:
    if version < MIN:
        raise LaunchError(f"the cluster runs Kubernetes {version}; the kube backend needs {MIN} or later "
                          "(Indexed Jobs with podFailurePolicy; docs/launcher.md)")
    return version
