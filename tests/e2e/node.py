"""One host playing one Kubernetes node: a Pod object (from `helm template` or the launcher's
builders) becomes a `podman run`, the way the kubelet would run it, for the fields our pods use.

Translated: the user, group, supplementalGroups and fsGroup; dropped and added capabilities,
allowPrivilegeEscalation=false (no-new-privileges), readOnlyRootFilesystem; hostPath volumes (bind
mounts of <host root>/<path>, created for DirectoryOrCreate, read-only where the mount says so);
memory emptyDirs (tmpfs with the size limit); Secret and ConfigMap volumes (files written with the
mode and fsGroup the kubelet gives them); env values and downward-API fieldRefs; $(VAR) and $$ in
command, args and env values; CPU and memory limits; args after the image's entrypoint; the
hostname; downward-API fieldRefs of labels and annotations (JOB_COMPLETION_INDEX). The cluster DNS
of a headless Service (`<hostname>.<subdomain>`) is played by `dns()`: names registered up front get
fixed addresses on the node's network, every container finds them in its /etc/hosts (podman's own
DNS needs netavark and aardvark-dns, which these machines lack), and the pod with that name gets that
address. Ignored, because one host has no use for them: scheduling fields, probes, ports, the
service-account token (never mounted by our pods).
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path
from typing import Any

from tests.e2e.podman import Podman
from tests.support.fakes.kubelet import kubelet_expand

Obj = dict[str, Any]
SUBNET = "10.213.47"  # the node's pod network (/24), fixed so that DNS names can have fixed addresses
CNI_LEASES = Path("/var/lib/cni/networks")  # the CNI host-local plugin's address leases, one folder per network


def _quantity_bytes(q: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "": 1}
    number, unit = re.fullmatch(r"([0-9.]+)([KMG]i)?", q).groups()  # type: ignore[union-attr]
    return int(float(number) * units[unit or ""])


class Node:
    def __init__(self, podman: Podman, network: str) -> None:
        self.podman = podman
        self.network = network
        self.host_root = podman.dir / "node"  # hostPath /run/envpipe lives at <host_root>/run/envpipe
        self.volumes = podman.dir / "volumes"
        for stale in (self.host_root, self.volumes):  # a node starts empty, whatever an earlier run left
            shutil.rmtree(stale, ignore_errors=True)
        self.files: dict[str, dict[str, str]] = {}  # Secrets and ConfigMaps by name: key -> text
        self.names: dict[str, str] = {}  # DNS name -> address: the cluster DNS of headless Services
        # a run killed mid-way (no close) leaves its network and its containers' address leases: with fixed
        # addresses the next run would find them taken ("requested IP address ... is not available")
        podman.run("network", "rm", "-f", network, check=False)
        shutil.rmtree(CNI_LEASES / network, ignore_errors=True)
        podman.run("network", "create", "--subnet", f"{SUBNET}.0/24", network)

    def dns(self, *names: str) -> None:
        """Give each name an address of the node's network, as CoreDNS would for a Service's pods."""
        for name in names:
            self.names.setdefault(name, f"{SUBNET}.{10 + len(self.names)}")

    def host_path(self, path: str) -> Path:
        return self.host_root / path.lstrip("/")

    def add_object(self, obj: Obj) -> None:
        """A Secret or ConfigMap that pods of this node may mount."""
        self.files[obj["metadata"]["name"]] = obj.get("stringData") or obj.get("data") or {}

    def _volume_args(self, pod_name: str, volume: Obj, mount: Obj, fs_group: int | None) -> list[str]:
        target, ro = mount["mountPath"], mount.get("readOnly", False)
        if "hostPath" in volume:
            src = self.host_path(volume["hostPath"]["path"])
            if volume["hostPath"].get("type") == "DirectoryOrCreate":
                src.mkdir(mode=0o755, parents=True, exist_ok=True)
            return ["-v", f"{src}:{target}{':ro' if ro else ''}"]
        if "emptyDir" in volume:
            if volume["emptyDir"].get("medium") != "Memory":
                return ["--tmpfs", target]  # disk-backed on a node; a tmpfs serves the tests as well
            size = _quantity_bytes(volume["emptyDir"]["sizeLimit"])
            return ["--tmpfs", f"{target}:rw,size={size},mode=1777"]
        source = volume.get("secret") or volume.get("configMap")
        assert source is not None, f"volume kind not translated: {volume}"
        name = source.get("secretName") or source["name"]
        data = self.files[name]
        items = source.get("items") or [{"key": k, "path": k} for k in data]
        mode = source.get("defaultMode", 0o644)
        directory = self.volumes / pod_name / volume["name"]
        directory.mkdir(parents=True, exist_ok=True)
        for item in items:
            path = directory / item["path"]
            path.write_text(data[item["key"]])
            # the kubelet: group fsGroup, and read access for it on read-only volumes
            os.chown(path, 0, fs_group if fs_group is not None else 0)
            path.chmod(mode | (0o040 if fs_group is not None else 0))
        return ["-v", f"{directory}:{target}:ro"]

    def run_args(self, pod: Obj, image: str, extra_env: dict[str, str] | None = None,
                 container_name: str | None = None) -> list[str]:
        """One of the pod's containers (default: its only one) as `podman run` arguments; the pod's first
        container takes the pod's name, any other `<pod>-<container>`."""
        meta, spec = pod["metadata"], pod["spec"]
        containers = spec["containers"]
        if container_name is None:
            (container,) = containers
        else:
            container = next(c for c in containers if c["name"] == container_name)
        pod_ctx, ctx = spec.get("securityContext", {}), container.get("securityContext", {})
        name = meta["name"] if container is containers[0] else f"{meta['name']}-{container['name']}"
        hostname = spec.get("hostname", name)
        args = ["run", "-d", "--name", name, "--network", self.network, "--hostname", hostname]
        address = self.names.get(f"{hostname}.{spec.get('subdomain')}")
        if address is not None:  # the pod behind a name of a headless Service
            args += ["--ip", address]
        args += [f"--add-host={n}:{a}" for n, a in self.names.items()]
        user = ctx.get("runAsUser", pod_ctx.get("runAsUser"))
        group = ctx.get("runAsGroup", pod_ctx.get("runAsGroup"))
        if user is not None:
            args += ["--user", f"{user}:{group if group is not None else user}"]
        for gid in pod_ctx.get("supplementalGroups", []) + ([pod_ctx["fsGroup"]] if "fsGroup" in pod_ctx else []):
            args += ["--group-add", str(gid)]
        caps = ctx.get("capabilities", {})
        args += [f"--cap-drop={c.lower()}" for c in caps.get("drop", [])]
        args += [f"--cap-add={c.lower()}" for c in caps.get("add", [])]
        if ctx.get("allowPrivilegeEscalation") is False:
            args += ["--security-opt", "no-new-privileges"]
        if ctx.get("readOnlyRootFilesystem"):
            args += ["--read-only", "--read-only-tmpfs=false"]
        limits = container.get("resources", {}).get("limits", {})
        if "memory" in limits:
            args += ["--memory", str(_quantity_bytes(limits["memory"]))]
        if "cpu" in limits:
            cpu = str(limits["cpu"])
            args += ["--cpus", str(int(cpu[:-1]) / 1000 if cpu.endswith("m") else float(cpu))]
        uid = str(uuid.uuid4())
        fields = {"metadata.name": name, "metadata.namespace": meta.get("namespace", "default"), "metadata.uid": uid}
        for part in ("labels", "annotations"):  # e.g. the Job controller's completion index
            fields.update({f"metadata.{part}['{k}']": v for k, v in (meta.get(part) or {}).items()})
        env: dict[str, str] = {}
        for e in container.get("env", []):  # in order: a value may refer to the variables before it
            raw = e["value"] if "value" in e else fields[e["valueFrom"]["fieldRef"]["fieldPath"]]
            env[e["name"]] = kubelet_expand(raw, env) if "value" in e else raw
        for key, value in {**env, **(extra_env or {})}.items():
            args += ["--env", f"{key}={value}"]
        volumes = {v["name"]: v for v in spec.get("volumes", [])}
        for mount in container.get("volumeMounts", []):
            args += self._volume_args(name, volumes[mount["name"]], mount, pod_ctx.get("fsGroup"))
        command = [kubelet_expand(a, env) for a in container.get("command", [])]
        cargs = [kubelet_expand(a, env) for a in container.get("args", [])]
        if command:
            return [*args, "--entrypoint", command[0], image, *command[1:], *cargs]
        return [*args, image, *cargs]

    def start(self, pod: Obj, image: str, extra_env: dict[str, str] | None = None) -> list[str]:
        """Every container of the pod, in the pod's order; their podman names."""
        names = []
        for c in pod["spec"]["containers"]:
            args = self.run_args(pod, image, extra_env, c["name"])
            self.podman.run(*args)
            names.append(args[args.index("--name") + 1])
        return names
