"""A fake of CML's `cml.workers_v1` with the documented API, for tests without a CML cluster.

Functions and return shapes follow the CML workers API docs: launch_workers(n, cpu, memory,
nvidia_gpu=0, kernel="python3", script="", code="", env={}, ...) -> list of worker dicts;
await_workers(ids, wait_for_completion=True, timeout_seconds=60) -> {"workers": [...], "failures": [...]};
list_workers() -> list of dicts (id, status, created_at, running_at, finished_at, duration, ip_address,
app_url); stop_workers(*ids) (no ids: all workers of this session). By default no worker process
runs; with ENVPIPE_FAKE_CML_NETNS each worker's `code` really runs, in a Linux network namespace that
stands in for the worker pod (its IP is that namespace's address).

Configured through environment variables, read at each launch_workers call:
  ENVPIPE_FAKE_CML_IPS            comma-separated IPs handed to workers in launch order
                                  (default 10.0.0.11, 10.0.0.12, ...)
  ENVPIPE_FAKE_CML_UNKNOWN_POLLS  how many await_workers/list_workers calls report ip_address
                                  "unknown" for a running worker before its IP shows (default 1)
  ENVPIPE_FAKE_CML_FAIL           comma-separated 0-based launch indexes of workers that fail
                                  (status "failed"; await_workers returns them under "failures")
  ENVPIPE_FAKE_CML_SUCCEED        1: workers with wait_for_completion=True end "succeeded" (default 1)
  ENVPIPE_FAKE_CML_NETNS          comma-separated network namespaces, in launch order: worker i runs its
                                  `code` there (`!cmd` through bash, else python -c) as a real process;
                                  it is "running" while that process lives, then "succeeded" or "failed";
                                  stop_workers ends its whole process tree, sshd's setsid children
                                  included (as a pod deletion does); its output goes to
                                  <ENVPIPE_FAKE_CML_LOG>.<worker id>.out (or nowhere)
  ENVPIPE_FAKE_CML_LOG            a file: every call is appended to it as a JSON line {"fn", "args",
                                  "kwargs"}, so a test can see the calls of another process (a notebook
                                  kernel's launcher subprocess)
Inspect `calls` (a list of (function, args, kwargs)) and `workers` in tests; `reset()` clears both.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import uuid
from typing import Any

from envpipe_launch.supervise import Supervised  # the launcher that imports this fake is importable here

calls: list[tuple[str, tuple, dict]] = []
workers: dict[str, dict[str, Any]] = {}
_procs: dict[str, Supervised] = {}
_launched = itertools.count()
_polls = 0


def reset() -> None:
    global _launched, _polls
    for wid in list(_procs):
        _kill(wid)
    calls.clear()
    workers.clear()
    _launched = itertools.count()
    _polls = 0


def _env_list(name: str) -> list[str]:
    return [v.strip() for v in os.environ.get(name, "").split(",") if v.strip()]


def _record(fn: str, args: tuple, kwargs: dict) -> None:
    calls.append((fn, args, kwargs))
    log = os.environ.get("ENVPIPE_FAKE_CML_LOG")
    if log:
        with open(log, "a") as f:
            f.write(json.dumps({"fn": fn, "args": list(args), "kwargs": kwargs}) + "\n")


def _start(wid: str, netns: str, code: str) -> None:
    """Run a worker's startup code like a CML engine would, inside its network namespace."""
    argv = ["bash", "-c", code[1:]] if code.startswith("!") else [sys.executable, "-c", code]
    log = os.environ.get("ENVPIPE_FAKE_CML_LOG")
    # CML keeps a worker's output apart from the session's; a worker must not hold the caller's pipes
    with open(f"{log}.{wid}.out" if log else os.devnull, "ab") as out:
        argv = ["ip", "netns", "exec", netns, *argv]
        _procs[wid] = Supervised(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out)


def _kill(wid: str) -> None:
    proc = _procs.pop(wid, None)
    if proc is None:
        return
    proc.stop()  # SIGTERM, SIGKILL what is left: the tree is gone and the process reaped


def launch_workers(
    n: int,
    cpu: float,
    memory: float,
    nvidia_gpu: int = 0,
    kernel: str = "python3",
    script: str = "",
    code: str = "",
    env: dict | None = None,
    accelerator_label_id: Any = None,
    resource_profile_id: Any = None,
    resource_group_id: Any = None,
) -> list[dict[str, Any]]:
    _record(
        "launch_workers",
        (n, cpu, memory),
        {"nvidia_gpu": nvidia_gpu, "kernel": kernel, "script": script, "code": code, "env": env or {}},
    )
    if n < 1:
        raise ValueError("n must be >= 1")
    ips, fail = _env_list("ENVPIPE_FAKE_CML_IPS"), {int(i) for i in _env_list("ENVPIPE_FAKE_CML_FAIL")}
    netns = _env_list("ENVPIPE_FAKE_CML_NETNS")
    out = []
    for _ in range(n):
        idx = next(_launched)
        w: dict[str, Any] = {
            "id": uuid.uuid4().hex[:16],
            "status": "failed" if idx in fail else "running",
            "created_at": "2026-01-01T00:00:00Z",
            "running_at": None,
            "finished_at": None,
            "duration": None,
            "ip_address": "unknown",
            "app_url": "",
            "_ip": ips[idx] if idx < len(ips) else f"10.0.0.{11 + idx}",
            "_env": env or {},
            "_code": code or script,
        }
        workers[w["id"]] = w
        if idx < len(netns) and w["status"] == "running":
            _start(w["id"], netns[idx], w["_code"])
        out.append(_public(w))
    return out


def _public(w: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in w.items() if not k.startswith("_")}


def _poll() -> None:
    """One observation of the cluster: IPs appear after ENVPIPE_FAKE_CML_UNKNOWN_POLLS polls."""
    global _polls
    _polls += 1
    for wid, proc in list(_procs.items()):
        if proc.proc.poll() is not None and workers[wid]["status"] == "running":
            workers[wid]["status"] = "succeeded" if proc.proc.returncode == 0 else "failed"
            _procs.pop(wid)
    if _polls > int(os.environ.get("ENVPIPE_FAKE_CML_UNKNOWN_POLLS", "1")):
        for w in workers.values():
            if w["status"] == "running":
                w["ip_address"] = w["_ip"]


def list_workers() -> list[dict[str, Any]]:
    _record("list_workers", (), {})
    _poll()
    return [_public(w) for w in workers.values()]


def await_workers(ids: list, wait_for_completion: bool = True, timeout_seconds: int = 60) -> dict[str, list]:
    _record(
        "await_workers",
        (ids,),
        {"wait_for_completion": wait_for_completion, "timeout_seconds": timeout_seconds},
    )
    _poll()
    wanted = [i["id"] if isinstance(i, dict) else i for i in ids]
    done, failures = [], []
    for wid in wanted:
        w = workers.get(wid)
        if w is None or w["status"] in ("failed", "timedout", "stopped"):
            failures.append(_public(w) if w else {"id": wid, "status": "unknown"})
        elif wait_for_completion and os.environ.get("ENVPIPE_FAKE_CML_SUCCEED", "1") == "1":
            w["status"] = "succeeded"
            done.append(_public(w))
        else:
            done.append(_public(w))
    return {"workers": done, "failures": failures}


def stop_workers(*worker_id: str) -> list[dict[str, Any]]:
    _record("stop_workers", worker_id, {})
    for wid in worker_id or list(workers):
        _kill(wid)
        if wid in workers and workers[wid]["status"] == "running":
            workers[wid]["status"] = "stopped"
    return [_public(workers[w]) for w in (worker_id or list(workers)) if w in workers]
