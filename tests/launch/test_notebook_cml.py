"""notebooks/envpipe_cml.ipynb executed with nbclient, as a CML user would run it in a session.

Fake: only the CML API (`cml.workers_v1` from tests/support/fakes/cml). Real: the kernel, `envpipe-launch
--backend cml` as a subprocess, the workers' startup code (sshd on 2222, run by the fake inside a
network namespace that stands in for the worker pod), the session's sshd, pdsh, a 2-node DeepSpeed
job of examples/train_gpt.py (gloo on CPU, sim clock), and the report and Gantt picture it writes.
"""

from __future__ import annotations

import ast
import base64
import json
import os
import subprocess
import sys
from html import escape
from pathlib import Path
from typing import Any

import nbformat
import pytest

from envpipe.runtime.config import EnvPipeConfig, parse
from envpipe.runtime.phases.steps import steps_to_report
from envpipe.runtime.report.text import headline
from tests.support import netns_hosts
from tests.support.runtime_summary import read_summary

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOK = ROOT / "notebooks" / "envpipe_cml.ipynb"
RUNNER = ROOT / "tests" / "support" / "notebook_run.py"
FAKES = ROOT / "tests" / "support" / "fakes"
NETNS = netns_hosts.netns_unavailable()
needs_netns = pytest.mark.skipif(
    NETNS is not None, reason=f"the notebook's real 2-node run needs network namespaces: {NETNS}"
)


def _run(
    tmp_path: Path, params: dict[str, Any], env: dict[str, str], prefix: list[str] | None = None
) -> tuple[subprocess.CompletedProcess, Any]:
    """Execute the notebook in a fresh process (optionally inside a namespace); the executed notebook."""
    (tmp_path / "params.json").write_text(json.dumps(params))
    out = tmp_path / "executed.ipynb"
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    full_env = {
        **os.environ,
        "HOME": str(home),  # ~/.envpipe/ssh: CML's shared project filesystem
        "PYTHONPATH": os.pathsep.join([str(FAKES), str(ROOT), str(ROOT / "launcher")]),
        "ENVPIPE_FAKE_CML_LOG": str(tmp_path / "cml_calls.jsonl"),
        **env,
    }
    argv = [sys.executable, str(RUNNER), str(NOTEBOOK), str(out), str(tmp_path / "params.json")]
    argv += [str(ROOT / "notebooks"), "900"]
    proc = subprocess.run([*(prefix or []), *argv], env=full_env, capture_output=True, text=True, timeout=960, cwd=ROOT)
    return proc, nbformat.read(out, as_version=4)


def _calls(tmp_path: Path) -> list[dict[str, Any]]:
    path = tmp_path / "cml_calls.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _outputs(nb: Any, needle: str) -> list[Any]:
    """Outputs of the code cell whose source contains `needle`."""
    (cell,) = [c for c in nb.cells if c.cell_type == "code" and needle in c.source]
    return cell.outputs


def _stream(nb: Any, needle: str) -> str:
    return "".join(o.get("text", "") for o in _outputs(nb, needle) if o.output_type == "stream")


def test_committed_notebook_is_clean_and_parameterised() -> None:
    nb = nbformat.read(NOTEBOOK, as_version=4)
    nbformat.validate(nb)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.outputs == [] and c.execution_count is None for c in code), "clear outputs before committing"
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    names = {line.split("=")[0].split(":")[0].strip() for line in params.source.splitlines() if "=" in line}
    assert {"NODES", "GPUS_PER_NODE", "WORKER_CPU", "WORKER_MEMORY", "MODEL_ARGS", "REPORT_DIR"} <= names
    assert any("envpipe_launch" in c.source and '"--backend", "cml"' in c.source for c in code)
    assert nb.metadata.kernelspec.name == "python3"


def defaults() -> dict[str, Any]:
    """The values of the notebook's `parameters` cell."""
    nb = nbformat.read(NOTEBOOK, as_version=4)
    (params,) = [c for c in nb.cells if "parameters" in c.metadata.get("tags", [])]
    values = {}
    for node in ast.parse(params.source).body:
        target = node.targets[0] if isinstance(node, ast.Assign) else node.target  # type: ignore[attr-defined]
        values[target.id] = ast.literal_eval(node.value)  # type: ignore[attr-defined]
    return values


def test_the_defaults_train_long_enough_for_a_report_and_cml_md_says_what_they_are() -> None:
    """As shipped the notebook ran 10 steps, which end inside the reconfigure phase (no report, and the report
    cell raised), and docs/cml.md gave the policy as EnvPipe's envelope where the notebook's {} is optimal."""
    values = defaults()
    assert values["STEPS"] is None and "--steps" not in values["MODEL_ARGS"]  # steps_to_report decides
    assert steps_to_report(parse(None, values["ENVPIPE"])) == 30 + 30 + 4 + 5 * 4 + 1 + 2 * 10  # docs/cml.md's sum
    table = {}
    for line in (ROOT / "docs" / "cml.md").read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("`"):
            for name in cells[0].replace("`", "").split(", "):
                table[name] = (cells[1], cells[2])  # (default, meaning)
    assert set(table) == set(values)  # every parameter, and only those
    for name, value in values.items():
        shown = json.dumps(value) if isinstance(value, list | dict) else str(value)
        if isinstance(value, str | int | dict) or value is None:
            assert shown in table[name][0].replace("`", ""), (name, table[name])
    assert parse(None, values["ENVPIPE"]).type == "optimal" and "`optimal`" in table["ENVPIPE"][1]


@needs_netns
@pytest.mark.slow
def test_notebook_runs_a_two_node_job_and_shows_the_report(tmp_path: Path) -> None:
    hosts = netns_hosts.start(tmp_path, sshd=False)  # the launcher and the fake worker start sshd
    try:
        report = tmp_path / "report"
        params = {
            "NODES": 2,
            "GPUS_PER_NODE": 1,
            "WORKER_CPU": 1,
            "WORKER_MEMORY": 2,
            # the notebook's own STEPS and ENVPIPE (the run's length follows the runtime's defaults); a CPU-sized
            # model, on CPU processes
            "MODEL_ARGS": ["--tiny", "--microbatches", "4"],
            # gloo would pick the address of the shared hostname (loopback) on every "host"
            "EXTRA_ENV": {"DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": netns_hosts.IFNAME},
            "REPORT_DIR": str(report),
            "READY_TIMEOUT_S": 60,
        }
        env = {
            "CDSW_IP_ADDRESS": hosts.ips[0],  # the session is host 0 ...
            "ENVPIPE_FAKE_CML_IPS": hosts.ips[1],  # ... the one worker host 1
            "ENVPIPE_FAKE_CML_NETNS": hosts.names[1],
            "ENVPIPE_FAKE_CML_UNKNOWN_POLLS": "2",
            "DS_ACCELERATOR": "cpu",
        }
        proc, nb = _run(tmp_path, params, env, prefix=hosts.exec_argv(0, []))
        assert proc.returncode == 0, proc.stderr[-6000:]
        left = {n: hosts.pids(i) for i, n in enumerate(hosts.names)}
    finally:
        hosts.close()
    assert left == {n: [] for n in hosts.names}, "sshd of session and worker stopped, no rank left"

    # the launcher did the guide's steps: a worker running sshd on 2222, its IP awaited, then stopped
    calls = _calls(tmp_path)
    launch = calls[0]
    assert launch["fn"] == "launch_workers"
    assert launch["args"][0] == 1 and launch["kwargs"]["code"].startswith("!")
    assert "sshd -D -e -p 2222" in launch["kwargs"]["code"]
    assert sum(c["fn"] == "await_workers" for c in calls) == 3  # twice "unknown", then the IP
    worker_id = calls[1]["args"][0][0]
    assert calls[-1] == {"fn": "stop_workers", "args": [worker_id], "kwargs": {}}

    # pdsh prefixes every remote line with its host: ranks ran on both hosts
    log = _stream(nb, "subprocess.Popen(")
    assert f"{hosts.ips[0]}: " in log and f"{hosts.ips[1]}: " in log, log[-3000:]

    summary = read_summary(report)
    assert summary.stages == 2 and summary.clock.energy == "simulated GPU"
    # every comparison pair of the runtime's defaults: the report is whole at the notebook's default length
    assert summary.measured is not None and summary.measured.pairs == EnvPipeConfig().compare_iterations
    assert summary.plan is not None and summary.plan.policy == "optimal"  # the runtime's default
    assert summary.steady.energy_j is not None and summary.predicted is not None
    html = "".join(o["data"]["text/html"] for o in _outputs(nb, "summary_path =") if "data" in o)
    assert html.startswith(f"<p><b>{escape(headline(summary))}</b></p>")  # the result first, in one line
    assert "energy per iteration (simulated GPU)" in html
    assert f"{summary.steady.throughput_samples_per_s:.2f} samples/s" in html
    assert "energy saving, the planner's prediction (simulated against simulated)" in html
    (image,) = [o for o in _outputs(nb, "gantt.png") if "data" in o]
    assert base64.b64decode(image["data"]["image/png"]) == (report / "gantt.png").read_bytes()
    stages = "".join(o["data"]["text/html"] for o in _outputs(nb, "summary.gpus") if "data" in o)
    assert stages.count("<tr><td>") == 2 and "(simulated GPU)" in stages


@needs_netns
@pytest.mark.slow
def test_worker_that_fails_to_start_stops_the_notebook_and_every_worker(tmp_path: Path) -> None:
    hosts = netns_hosts.start(tmp_path, sshd=False)
    try:
        env = {
            "CDSW_IP_ADDRESS": hosts.ips[0],
            "ENVPIPE_FAKE_CML_IPS": f"{hosts.ips[1]},10.231.7.3",
            "ENVPIPE_FAKE_CML_NETNS": hosts.names[1],  # worker 0 really starts sshd in host 1 ...
            "ENVPIPE_FAKE_CML_FAIL": "1",  # ... worker 1 fails to start
        }
        params = {"NODES": 3, "GPUS_PER_NODE": 1, "REPORT_DIR": str(tmp_path / "report"), "READY_TIMEOUT_S": 30}
        proc, nb = _run(tmp_path, params, env, prefix=hosts.exec_argv(0, []))
        left = {n: hosts.pids(i) for i, n in enumerate(hosts.names)}
    finally:
        hosts.close()
    assert proc.returncode == 1
    assert "envpipe-launch exited with status 2" in proc.stderr  # (the kernel colours "RuntimeError")
    assert "CML workers failed to start" in proc.stderr and "(failed)" in proc.stderr
    (error,) = [o for o in _outputs(nb, "subprocess.Popen(") if o.output_type == "error"]
    assert error.ename == "RuntimeError" and "CML workers failed to start" in error.evalue
    # later cells did not run: no report was looked for
    assert all(not c.outputs for c in nb.cells if c.cell_type == "code" and "summary_path =" in c.source)
    calls = _calls(tmp_path)
    ids = [w for c in calls if c["fn"] == "await_workers" for w in c["args"][0]]
    assert [c for c in calls if c["fn"] == "stop_workers"] == [
        {"fn": "stop_workers", "args": sorted(set(ids), key=ids.index), "kwargs": {}}
    ]
    assert left == {n: [] for n in hosts.names}, "the started worker's sshd was stopped"
    assert not (tmp_path / "report").exists()


@pytest.mark.slow
def test_outside_a_cml_session_the_notebook_stops_with_a_clear_error(tmp_path: Path) -> None:
    proc, nb = _run(tmp_path, {"REPORT_DIR": str(tmp_path / "report")}, {"CDSW_IP_ADDRESS": ""})
    assert proc.returncode == 1
    (error,) = [o for o in _outputs(nb, "subprocess.Popen(") if o.output_type == "error"]
    assert "envpipe-launch exited with status 2" in error.evalue
    assert "CDSW_IP_ADDRESS is not set: the cml backend runs inside a CML session" in proc.stderr
    assert _calls(tmp_path) == []  # no worker was asked for
