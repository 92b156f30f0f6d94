"""What the runtime image, the envpipe-clockd chart and the launcher's pods agree on: the one source of
these defaults. tests/deploy/test_pod_contract.py compares it with charts/envpipe-clockd/values.yaml (the
`socket` block), with images/runtime/Dockerfile (ARG CLOCKD_GID, USER) and with envpipe.clock's
socket path (envpipe.clock.protocol.DEFAULT_SOCKET: the launcher never imports envpipe, so each package
has its one definition and the test keeps them equal), and renders the chart to check that the
launcher's pods match it.

- clockd (the chart) creates DIR/NAME on a hostPath, mode 0660, owner root, group GID;
- worker pods run as RUNTIME_UID, add GID to supplementalGroups (the image's user is in GID too),
  mount DIR read-only from the same hostPath and find the socket through ENVPIPE_CLOCKD_SOCKET;
- jobs run with --no-clockd do not mount it (every node of a job uses GPUs, node 0 the launcher too);
- with ssh, every node gets LAUNCHER_NODE_ENV (host:port of node 0's sshd): the image's entrypoint ends a node
  > 0 once node 0, reached before, stops answering, so the Job completes where the cluster has no Job
  successPolicy to end it on node 0's success (Kubernetes before 1.31; launcher/envpipe_launch/kube_version.py).
"""

from __future__ import annotations

from dataclasses import dataclass

RUNTIME_UID = 1000  # the runtime image's user `envpipe`, and its primary group
RUNTIME_GID = 1000
SOCKET_ENV = "ENVPIPE_CLOCKD_SOCKET"
LAUNCHER_NODE_ENV = "ENVPIPE_LAUNCHER_NODE"


@dataclass(frozen=True)
class ClockdSocket:
    """Where a node's clockd listens and which group may talk to it (chart values socket.*); ``path`` is
    the launcher's one definition of the socket path."""

    host_dir: str = "/run/envpipe"
    name: str = "clockd.sock"
    gid: int = 2500
    mode: int = 0o660

    @property
    def path(self) -> str:
        return f"{self.host_dir}/{self.name}"
