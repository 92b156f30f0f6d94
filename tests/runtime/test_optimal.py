"""The runtime's default policy, optimal, end to end in real DeepSpeed processes (gloo, CPU): the math of
stock 1F1B, the report's measured and simulated numbers, the memory limit, clockd's refusals, and a GPU
node without the clock daemon (NVML faked at the pynvml module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envpipe.clock.service import ServiceConfig
from tests.runtime.test_dp import assert_same_math
from tests.runtime.test_pipeline import ROOT, run_pipeline
from tests.support.clockd_helpers import daemon_thread
from tests.support.runtime_summary import iterations, read_summary

M = 4
SIM = {"clock": "sim", "compare_iterations": 2, "reconfigure_rounds": 2}


def _optimal_checks(out: Path, stages: int) -> None:
    s = read_summary(out)
    assert s.plan is not None and s.plan.policy == "optimal" and s.plan.deployed
    assert s.plan.source == "planner (optimal) on the online profile"
    assert s.plan.budget_s is not None and s.plan.clocks is not None and len(s.plan.clocks) == stages
    p = s.predicted  # simulated, against its own baseline
    assert p is not None and p.energy_saving >= 0 and p.slowdown <= 1e-9
    m = s.measured  # measured, against this run's own interleaved 1F1B all-max iterations
    assert m is not None and m.pairs == 2 and m.energy_saving is not None and m.energy.startswith("simulated")
    assert s.baseline is not None and s.baseline.time_s.n == 2 and s.steady.time_s.n == 4
    rec = s.reconfiguration
    assert rec is not None and rec.method == "replan" and 1 <= len(rec.rounds) <= 2
    phases = [x["phase"] for x in iterations(out, 0)]
    assert phases.count("calibrate") == 2 and sum(p.startswith("profile@") for p in phases) == 4
    assert [x["runs"] for x in iterations(out, 0) if x["phase"] == "steady"] == ["plan", "baseline", "baseline",
                                                                                "plan", "plan", "plan"]


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_optimal_policy_end_to_end_same_math_as_stock(stages: int, tmp_path: Path) -> None:
    runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 6, "calibration": 2, "envpipe": SIM},
            {"name": "stock", "engine": "stock", "M": M, "steps": "as:runtime"}]
    if stages == 2:  # the memory limit: one byte fits no activation, so EnvPipe's order gives way to 1F1B
        runs.append({"name": "tight", "engine": "runtime", "M": M, "steps": 2, "calibration": 2,
                     "envpipe": {**SIM, "type": "baseline", "scheduling": "envpipe", "memory_limit_bytes": 1}})
    results = run_pipeline(stages, runs, tmp_path)
    assert_same_math(results, "runtime", "stock")
    _optimal_checks(tmp_path / "runtime", stages)
    if stages == 2:
        tight = read_summary(tmp_path / "tight")
        assert tight.plan is not None and tight.plan.order == "1f1b" and tight.plan.memory is not None
        assert [m.max_in_flight for m in tight.plan.memory] == [0, 0]
        assert all(m.activation_bytes_per_microbatch > 0 for m in tight.plan.memory)
        refused = tight.plan.refused_orders  # (a limit that only cuts EnvPipe's warm-ups: test_runtime_decide_report)
        assert any(r.startswith("stage 0: even 1F1B keeps 2 micro-batches in flight") for r in refused), refused


@pytest.mark.slow
def test_daemon_refusals_reach_the_summary(tmp_path: Path) -> None:
    """clock 'daemon' on CPU against a real envpipe-clockd whose allow-list stops at 1200 MHz: every lock at
    the top clock (1410) is refused with 422, the job runs on, and summary.json says so."""
    sock = str(tmp_path / "clockd.sock")
    with daemon_thread(sock, config=ServiceConfig(max_mhz=1200)) as service:
        runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 2, "calibration": 1,
                 "envpipe": {"type": "baseline", "scheduling": "1f1b", "clock": "daemon", "compare_iterations": 0}}]
        run_pipeline(2, runs, tmp_path, env_extra={"ENVPIPE_CLOCKD_SOCKET": sock})
        assert not service.locked()  # both leases ended with the job: every GPU reset
    s = read_summary(tmp_path / "runtime")
    assert s.clock.kind == "daemon" and s.clock.controls_clocks
    assert s.clock.refusals and {(r.mhz, r.status) for r in s.clock.refusals} == {(1410, 422)}
    assert {r.rank for r in s.clock.refusals} == {0, 1} and "outside the allowed range" in s.clock.refusals[0].message
    assert "clock requests refused by the daemon" in (tmp_path / "runtime" / "report.txt").read_text()


@pytest.mark.slow
def test_gpu_node_without_the_daemon_plans_but_does_not_deploy(tmp_path: Path) -> None:
    """A GPU rank (NVML faked; the engine itself on CPU) with no clockd: one warning line, default clocks,
    energy from the NVML counter (measured), a plan from the measured units and the power-capped frequency
    model, reported as simulated and not deployed; no measured comparison of a plan that never ran."""
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'support' / 'fakes' / 'nvml_module'}:{ROOT}", "FAKE_NVML_SM_MHZ": "1455",
           "ENVPIPE_CLOCKD_SOCKET": str(tmp_path / "absent.sock")}
    runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 2, "calibration": 2, "device": "fake-gpu",
             "envpipe": {"clock": "auto"}}]
    run_pipeline(2, runs, tmp_path, env_extra=env)
    s = read_summary(tmp_path / "runtime")
    assert s.clock.kind == "nvml" and not s.clock.controls_clocks and s.clock.energy == "measured (NVML counter)"
    assert s.clock.note is not None and "clocks cannot be changed here" in s.clock.note
    assert s.plan is not None and s.plan.policy == "optimal" and not s.plan.deployed
    assert s.calibration is not None and s.calibration.effective_clock_mhz == [1455.0, 1455.0]
    p = s.predicted
    assert p is not None and "power-capped at the measured effective clocks" in p.profile
    assert s.measured is None and s.baseline is None and s.reconfiguration is None
    steady = [x for x in iterations(tmp_path / "runtime", 0) if x["phase"] == "steady"]
    assert [x["runs"] for x in steady] == ["baseline", "baseline"] and all(x["energy_j"] > 0 for x in steady)
    log = (tmp_path / "rank0.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    warned = [x for x in log.splitlines() if "clocks cannot be changed here" in x]
    assert warned[:1] == [f"envpipe: {s.clock.note}"], log
    assert "reported, not deployed" in (tmp_path / "runtime" / "report.txt").read_text()
