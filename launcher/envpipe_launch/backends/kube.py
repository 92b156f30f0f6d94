"""kube: the job as a batch workload (an Indexed Job or a JobSet, see kube_manifests), its options
checked before anything exists, `--dry-run`'s manifests (no key: the pods mount the ssh Secret by name),
and the launch: ask the cluster its version (kube_version), create (the job's ssh Secret too), admit (Kueue),
wait for the nodes, stream node 0's log, pass the exit status through, delete everything (kube_run)."""

from __future__ import annotations

import dataclasses
import re
import secrets
import sys
from dataclasses import dataclass, field
from typing import Any

import yaml
from kubernetes import client, config

from .. import kube_version, sshkeys, textfile, words
from ..command_line import CommandLine
from ..errors import LaunchError
from ..job import JobSpec, env_pairs, job_name
from ..kube_manifests import Batch, KubeJob, PodSettings
from ..pod_contract import ClockdSocket
from .kube_run import KubeRun, server_version


@dataclass(frozen=True)
class KubeOptions:
    image: str | None
    namespace: str = "default"
    name: str | None = None
    cpu_only: bool = False
    ready_timeout_s: float = 600.0
    keep: bool = False
    no_ssh: bool = False
    pods: PodSettings = field(default_factory=PodSettings)
    batch: Batch = field(default_factory=Batch)
    ssh_secret: str | None = None  # a Secret of the user's that the pods mount instead of the job's own
    dry_run: bool = False  # print the manifests and exit


_DNS_LABEL = r"[a-z0-9]([-a-z0-9]*[a-z0-9])?"
_DNS_SUBDOMAIN = re.compile(rf"^{_DNS_LABEL}(\.{_DNS_LABEL})*$")
_LABEL_KEY = re.compile(rf"^({_DNS_LABEL}(\.{_DNS_LABEL})*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{{0,61}}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_TAINT_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_AFFINITY_KINDS = {"nodeAffinity", "podAffinity", "podAntiAffinity"}
AFFINITY_MAX_BYTES = 64 * 1024  # a real affinity is a few hundred bytes
_NODE_OPS = ("In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt")  # v1.NodeSelectorRequirement
_LABEL_OPS = ("In", "NotIn", "Exists", "DoesNotExist")  # v1.LabelSelectorRequirement


def _label(pair: str, what: str) -> tuple[str, str]:
    key, sep, value = pair.partition("=")
    if not sep or not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value):
        raise LaunchError(f"{what} expects KEY=VALUE with a Kubernetes label key and value, got {pair!r}")
    return key, value


def _toleration(text: str) -> dict[str, str]:
    """kubectl's taint syntax: KEY[=VALUE][:EFFECT]; without a value any value of KEY is tolerated."""
    rest, _, effect = text.rpartition(":") if ":" in text else (text, "", "")
    key, sep, value = rest.partition("=")
    if not _LABEL_KEY.match(key) or not _LABEL_VALUE.match(value) or (effect and effect not in _TAINT_EFFECTS):
        raise LaunchError(
            f"--toleration expects KEY[=VALUE][:EFFECT] with EFFECT one of {', '.join(_TAINT_EFFECTS)}, got {text!r}"
        )
    tol = {"key": key, "operator": "Equal" if sep else "Exists"}
    if sep:
        tol["value"] = value
    if effect:
        tol["effect"] = effect
    return tol


def _affinity(path: str) -> dict[str, Any]:
    """The workers' affinity from a YAML/JSON file, as the API server will read it, or one line why not."""
    text = textfile.read_text(path, AFFINITY_MAX_BYTES, "--affinity")
    try:
        if any(isinstance(event, yaml.AliasEvent) for event in yaml.parse(text)):  # a few lines can expand to GBs
            raise LaunchError(f"--affinity {path}: YAML aliases (*name) are not accepted; write the values out")
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise LaunchError(f"cannot read --affinity {path}: {e}") from e
    if not isinstance(data, dict) or not data or not set(data) <= _AFFINITY_KINDS:
        raise LaunchError(f"--affinity {path} must hold a mapping of {', '.join(sorted(_AFFINITY_KINDS))}")
    why = affinity_error(data)
    if why:
        raise LaunchError(f"--affinity {path}: not a Kubernetes affinity: {why}")
    return data


def affinity_error(data: dict[str, Any]) -> str | None:
    """Why the API server would refuse `data` as a pod's affinity (v1.Affinity), or None: it must read back
    unchanged through the Kubernetes client's own model (required fields, types, no unknown or misspelt
    field), and its operators must be the API's."""
    api = client.ApiClient()
    try:
        model = api._ApiClient__deserialize(data, "V1Affinity")  # type: ignore[attr-defined]  # the client's reader
        again = api.sanitize_for_serialization(model)
    except (ValueError, TypeError, AttributeError) as e:
        errors = getattr(e, "errors", None)  # pydantic's (the client's models since v35): model, field, why
        if not callable(errors):
            return str(e)
        first = errors(include_url=False)[0]
        field = ".".join(str(x) for x in first["loc"])
        return f"{str(getattr(e, 'title', '')).replace('V1', 'v1.', 1)}{'.' + field if field else ''}: {first['msg']}"
    where = _first_difference(data, again, "")
    if where is not None:
        return f"{where or 'the affinity'}: not a field or value of v1.Affinity"
    for path, requirement in _requirements(data, ""):
        ops = _LABEL_OPS if ".labelSelector" in path or ".namespaceSelector" in path else _NODE_OPS
        if requirement.get("operator") not in ops:
            return f"{path}.operator: {requirement.get('operator')!r} is not one of {', '.join(ops)}"
    return None


def _first_difference(given: Any, read: Any, path: str) -> str | None:
    if isinstance(given, dict) and isinstance(read, dict):
        for key in sorted(set(given) | set(read)):
            if key not in given or key not in read:
                return f"{path}.{key}".lstrip(".")
            found = _first_difference(given[key], read[key], f"{path}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(given, list) and isinstance(read, list) and len(given) == len(read):
        return next((d for i, (a, b) in enumerate(zip(given, read, strict=True))
                     if (d := _first_difference(a, b, f"{path}[{i}]")) is not None), None)
    return None if type(given) is type(read) and given == read else path.lstrip(".")


def _requirements(node: Any, path: str) -> list[tuple[str, dict[str, Any]]]:
    """Every entry of a matchExpressions or matchFields list, with its path."""
    found: list[tuple[str, dict[str, Any]]] = []
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("matchExpressions", "matchFields") and isinstance(value, list):
                found += [(f"{path}.{key}[{i}]".lstrip("."), r) for i, r in enumerate(value) if isinstance(r, dict)]
            else:
                found += _requirements(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _requirements(value, f"{path}[{i}]")
    return found


@dataclass(frozen=True)
class PodRequest:
    """The workers' pod options as the CLI gives them, not yet checked (pod_settings checks them)."""

    cpu: int = 4
    memory_gib: int = 16
    shm_gib: int = 4
    node_selector: tuple[str, ...] = ()
    tolerations: tuple[str, ...] = ()
    affinity_file: str | None = None
    image_pull_secrets: tuple[str, ...] = ()
    priority_class: str | None = None
    clockd_dir: str | None = None
    clockd_gid: int | None = None
    no_clockd: bool = False


def pod_settings(req: PodRequest) -> PodSettings:
    """The kube options of the CLI, checked: one clear line for each kind of mistake."""
    for flag, value in (("--worker-cpu", req.cpu), ("--worker-memory", req.memory_gib), ("--shm-size", req.shm_gib)):
        if value < 1:
            raise LaunchError(f"{flag} must be >= 1, got {value}")
    for flag, name in [("--image-pull-secret", s) for s in req.image_pull_secrets] + [
        ("--priority-class", req.priority_class or "x")
    ]:
        if len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
            raise LaunchError(f"{flag} {name!r} is not a Kubernetes object name (lowercase a-z, 0-9, '-', '.')")
    clockd: ClockdSocket | None = ClockdSocket()
    if req.no_clockd:
        if req.clockd_dir is not None or req.clockd_gid is not None:
            raise LaunchError("--no-clockd conflicts with --clockd-dir and --clockd-gid")
        clockd = None
    else:
        default = ClockdSocket()
        host_dir = default.host_dir if req.clockd_dir is None else req.clockd_dir.rstrip("/")
        gid = default.gid if req.clockd_gid is None else req.clockd_gid
        if not host_dir.startswith("/") or any(c.isspace() for c in host_dir):
            raise LaunchError(f"--clockd-dir must be an absolute path without spaces, got {req.clockd_dir!r}")
        if not 1 <= gid < 2**31:
            raise LaunchError(f"--clockd-gid must lie in 1..2147483647, got {gid}")
        clockd = ClockdSocket(host_dir=host_dir, gid=gid)
    return PodSettings(
        cpu=str(req.cpu),
        memory_gib=req.memory_gib,
        shm_gib=req.shm_gib,
        node_selector=dict(_label(p, "--node-selector") for p in req.node_selector),
        tolerations=tuple(_toleration(t) for t in req.tolerations),
        affinity=_affinity(req.affinity_file) if req.affinity_file else None,
        image_pull_secrets=req.image_pull_secrets,
        priority_class=req.priority_class,
        clockd=clockd,
    )


def build_job(spec: JobSpec, opts: KubeOptions) -> KubeJob:
    if not opts.image:
        raise LaunchError("the kube backend needs --image (a worker image with sshd, python and deepspeed)")
    if spec.gpus_per_node == 0 and not opts.cpu_only:
        raise LaunchError("no GPUs requested (--gpus-per-node 0) for a GPU worker image; pass --cpu for a CPU-only job")
    if opts.cpu_only and spec.gpus_per_node > 0:
        raise LaunchError("--cpu conflicts with --gpus-per-node > 0")
    if opts.pods.shm_gib >= opts.pods.memory_gib:
        raise LaunchError(
            f"--shm-size {opts.pods.shm_gib} GiB must be below --worker-memory {opts.pods.memory_gib} GiB "
            "(a memory-backed /dev/shm counts against the pod's memory limit)"
        )
    for what, word in [("training script", spec.script), *(("argument", a) for a in spec.script_args)]:
        words.check_text(what, word)
    if not opts.no_ssh:  # DeepSpeed's env file in the ConfigMap, read by its pdsh runner on node 0
        words.check_env(env_pairs(spec.env), words.PDSH)
    if opts.ssh_secret is not None:
        if opts.no_ssh:
            raise LaunchError("--ssh-secret conflicts with --no-ssh (no node logs into another)")
        if len(opts.ssh_secret) > 253 or not _DNS_SUBDOMAIN.match(opts.ssh_secret):
            raise LaunchError(f"--ssh-secret {opts.ssh_secret!r} is not a Kubernetes object name "
                              "(lowercase a-z, 0-9, '-', '.')")
    name = job_name(opts.name or "envpipe", "" if opts.name else secrets.token_hex(3))
    return KubeJob(
        spec,
        name,
        opts.namespace,
        opts.image,
        no_ssh=opts.no_ssh,
        pods=opts.pods,
        batch=opts.batch,
        worker_wait_s=int(opts.ready_timeout_s),
        ssh_secret=opts.ssh_secret,
    )


class _ManifestDumper(yaml.SafeDumper):
    """Quotes y/n too: YAML 1.1 parsers (Go's, in kubectl) read them as booleans, PyYAML does not.
    Text of several lines (the ssh key, the hostfile) as a literal block, as a person would write it."""


def _text(dumper: yaml.SafeDumper, text: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)


_ManifestDumper.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^[yYnN]$"), list("yYnN"))
_ManifestDumper.add_representer(str, _text)


def dry_run(job: KubeJob) -> str:
    """The objects as the launcher would create them, for the oldest supported Kubernetes (kube_version), without
    the owner references (they need the workload's uid) and without any key: the pods mount the ssh Secret by
    name, which `kubectl apply -f` of these objects needs to exist (the launcher makes its own at create)."""
    return yaml.dump_all(job.manifests(), Dumper=_ManifestDumper, sort_keys=False)


def secret_note(job: KubeJob) -> str | None:
    """What a dry run's reader must do first: make the Secret the pods mount (None: no ssh, or --ssh-secret)."""
    if not job.makes_secret:
        return None
    name = job.secret_name
    return (f"the pods mount Secret {name}, which these manifests do not hold (no key is printed): create it first "
            f"(ssh-keygen -t ed25519 -N '' -f KEY; kubectl create secret generic {name} -n {job.namespace} "
            "--type=kubernetes.io/ssh-auth --from-file=ssh-privatekey=KEY --from-file=authorized_keys=KEY.pub), "
            "or name one with --ssh-secret")


def _load_config() -> client.ApiClient:
    try:
        config.load_incluster_config()
    except config.ConfigException:
        try:
            config.load_kube_config()
        except (config.ConfigException, OSError) as e:
            raise LaunchError(f"no Kubernetes configuration (kubeconfig or in-cluster): {e}") from e
    return client.ApiClient()


def options(args: CommandLine) -> KubeOptions:
    """The kube options of the parsed command line, checked."""
    return KubeOptions(
        image=args.image,
        namespace=args.namespace,
        name=args.name,
        cpu_only=args.cpu_only,
        ready_timeout_s=args.ready_timeout,
        keep=args.keep,
        no_ssh=args.no_ssh,
        ssh_secret=args.ssh_secret,
        dry_run=args.dry_run,
        batch=Batch(args.workload, args.queue, args.ttl_after_finished, args.active_deadline),
        pods=pod_settings(PodRequest(
            cpu=args.worker_cpu,
            memory_gib=args.worker_memory,
            shm_gib=args.shm_size,
            node_selector=args.node_selector,
            tolerations=args.toleration,
            affinity_file=args.affinity_file,
            image_pull_secrets=args.image_pull_secret,
            priority_class=args.priority_class,
            clockd_dir=args.clockd_dir,
            clockd_gid=args.clockd_gid,
            no_clockd=args.no_clockd,
        )),
    )


def launch(spec: JobSpec, opts: KubeOptions) -> int:
    job = build_job(spec, opts)
    if opts.dry_run:
        sys.stdout.write(dry_run(job))
        note = secret_note(job)
        if note:
            print(f"envpipe-launch: {note}", file=sys.stderr)
        return 0
    return run_job(job, opts, _load_config())


def run_job(job: KubeJob, opts: KubeOptions, api: client.ApiClient) -> int:
    """Create the job in the cluster `api` reaches, wait for its nodes, follow node 0 and pass its exit status
    through; delete everything at the end (unless --keep)."""
    job = dataclasses.replace(job, launch=secrets.token_hex(8))  # this launch's objects: what it may delete
    version = server_version(api)
    job = dataclasses.replace(job, success_policy=version >= kube_version.SUCCESS_POLICY)
    run = KubeRun(job, api, opts.ready_timeout_s)
    if job.ssh_secret is not None:
        run.check_ssh_secret()
    what = f"{job.kind.kind} {job.name}"
    ends = "" if job.no_ssh or job.success_policy else ": no Job successPolicy, the other nodes end with node 0"
    print(f"envpipe-launch: {what} in namespace {job.namespace} (Kubernetes {version}{ends})", file=sys.stderr)
    try:
        print(f"envpipe-launch: hostfile\n{job.hostfile()}", file=sys.stderr, end="")
        run.create(sshkeys.generate() if job.makes_secret else None)
        run.start()
        ips = run.wait_nodes()
        print(f"envpipe-launch: nodes ready at {', '.join(ips)}", file=sys.stderr)
        return run.follow()
    except KeyboardInterrupt:
        print("envpipe-launch: interrupted", file=sys.stderr)
        return 130
    finally:
        if opts.keep and run.created:  # a job stopped half-created is deleted: a suspended one would never end
            print(
                f"envpipe-launch: kept {what} (the cluster deletes it {job.batch.ttl_after_finished_s}s after it "
                f"finishes; everything now: kubectl delete {job.kind.kind.lower()} {job.name} -n {job.namespace})",
                file=sys.stderr,
            )
        else:
            run.cleanup()
