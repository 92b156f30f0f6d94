"""The runtime's default policy, optimal, end to end in real DeepSpeed processes (gloo, CPU): the math of
stock 1F1B, the report's measured and simulated numbers, the memory limit, clockd's refusals, and a GPU
node without the clock daemon (NVML faked at the pynvml module)."""

from __future__ import annotations

from pathlib import Path

import pytest

from envpipe.clock.service import ServiceConfig
from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import one_f_one_b
from envpipe.simgpu import JobTruth
from tests.support.clockd_helpers import daemon_thread
from tests.support.pipelines import ROOT, assert_same_math, run_pipeline
from tests.support.runtime_summary import iterations, read_summary

M = 4
SIM = {"clock": "sim", "compare_iterations": 2, "reconfigure_rounds": 2, "calibration_iterations": 2}
STEPS = 20  # calibrate 2, profile 4, reconfigure 4 or 8, then steady: 4 compared, the rest the plan


def _optimal_checks(out: Path, stages: int) -> None:
    s = read_summary(out)
    assert s.plan is not None and s.plan.policy == "optimal" and s.plan.deployed
    assert s.plan.source.startswith("planner (optimal) on a profile: online: profiled at ")
    assert s.plan.budget_s is not None and s.plan.clocks is not None and len(s.plan.clocks) == stages
    p = s.predicted  # simulated, against its own baseline
    assert p is not None and p.energy_saving >= 0 and p.slowdown <= 1e-9
    m = s.measured  # measured, against this run's own interleaved 1F1B all-max iterations
    assert m is not None and m.pairs == 2 and m.energy_saving is not None and m.energy.startswith("simulated")
    rec = s.reconfiguration
    assert rec is not None and rec.method == "replan" and 1 <= len(rec.rounds) <= 2
    phases = [x["phase"] for x in iterations(out, 0)]
    assert phases.count("calibrate") == 2 and sum(p.startswith("profile@") for p in phases) == 4
    assert phases.count("reconfigure") == 4 * len(rec.rounds) and len(phases) == STEPS
    steady = [x["runs"] for x in iterations(out, 0) if x["phase"] == "steady"]
    assert steady[:4] == ["plan", "baseline", "baseline", "plan"] and set(steady[4:]) == {"plan"}
    assert s.baseline is not None and s.baseline.time_s.n == 2 and s.steady.time_s.n == len(steady) - 2
    e = s.energy  # the energy model (each phase at its measured power) against the simulated GPU's hidden truth
    assert e is not None and e.energy == "simulated GPU" and abs(e.error) < 0.03, e
    assert len(e.stages) == stages and all(abs(x.error) < 0.03 for x in e.stages), e


@pytest.mark.slow
@pytest.mark.parametrize("stages", [2, 4])
def test_optimal_policy_end_to_end_same_math_as_stock(stages: int, tmp_path: Path) -> None:
    runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": STEPS, "envpipe": SIM},
            {"name": "stock", "engine": "stock", "M": M, "steps": "as:runtime"}]
    if stages == 2:  # the memory limit: one byte fits no activation, so EnvPipe's order gives way to 1F1B
        runs.append({"name": "tight", "engine": "runtime", "M": M, "steps": 4,
                     "envpipe": {**SIM, "type": "baseline", "scheduling": "envpipe", "memory_limit_bytes": 1,
                                 "compare_iterations": 0}})
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
        runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 3,
                 "envpipe": {"type": "baseline", "scheduling": "1f1b", "clock": "daemon", "compare_iterations": 0,
                             "calibration_iterations": 1}}]
        run_pipeline(2, runs, tmp_path, env_extra={"ENVPIPE_CLOCKD_SOCKET": sock})
        assert not service.locked()  # both leases ended with the job: every GPU reset
    s = read_summary(tmp_path / "runtime")
    assert s.clock.kind == "daemon" and s.clock.controls_clocks and s.clock.reattaches == 0
    assert s.clock.refusals and {(r.mhz, r.status) for r in s.clock.refusals} == {(1410, 422)}
    assert {r.rank for r in s.clock.refusals} == {0, 1} and "outside the allowed range" in s.clock.refusals[0].message
    assert "clock requests refused by the daemon" in (tmp_path / "runtime" / "report.txt").read_text()


@pytest.mark.slow
def test_gpu_node_without_clock_control_deploys_the_order_not_the_clocks(tmp_path: Path) -> None:
    """clock 'readonly' (NVML faked at the pynvml module; the engine itself on CPU), as on a GPU node without
    clockd: default clocks, energy from the NVML counter (measured), a plan from the measured units and the
    power-capped frequency model (simulated); its order runs, its clocks do not; the order's time is measured
    against this run's own 1F1B iterations."""
    env = {"PYTHONPATH": f"{ROOT / 'tests' / 'support' / 'fakes' / 'nvml_module'}:{ROOT}", "FAKE_NVML_SM_MHZ": "1455"}
    runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 8,
             "envpipe": {"clock": "readonly", "compare_iterations": 2, "scheduling": "envpipe",
                         "calibration_iterations": 2}}]
    run_pipeline(2, runs, tmp_path, env_extra=env)
    s = read_summary(tmp_path / "runtime")
    assert s.clock.kind == "nvml" and not s.clock.controls_clocks and s.clock.energy == "measured (NVML counter)"
    assert s.clock.note is not None and "clocks are left as they are" in s.clock.note
    assert s.plan is not None and s.plan.policy == "optimal" and not s.plan.deployed
    assert s.calibration is not None and s.calibration.effective_clock_mhz == [1455.0, 1455.0]
    p = s.predicted
    assert p is not None and "power-capped at the measured effective clocks" in p.profile
    assert s.reconfiguration is None
    steady = [x for x in iterations(tmp_path / "runtime", 0) if x["phase"] == "steady"]
    assert all(x["energy_j"] > 0 and x["clocks_requested_mhz"] == [] for x in steady)  # clocks never asked for
    text = (tmp_path / "runtime" / "report.txt").read_text()
    if s.plan.order == "1f1b":  # nothing to compare: 1F1B at default clocks is the baseline itself
        assert not s.plan.order_deployed and s.measured is None and {x["runs"] for x in steady} == {"baseline"}
    else:  # the order against 1F1B, then what the no-harm rule kept (here wall-clock times on a busy CPU)
        assert s.measured is not None and s.measured.pairs == 2 and s.verdict is not None
        assert s.plan.order_deployed == s.verdict.kept
        assert [x["runs"] for x in steady][:4] == ["plan", "baseline", "baseline", "plan"]
    assert "clocks not deployed" in text or (s.verdict is not None and not s.verdict.kept and "withdrawn" in text)
    log = (tmp_path / "rank0.log").read_text()
    assert "Traceback" not in log, log[-3000:]


@pytest.mark.slow
def test_a_plan_measured_over_its_budget_gives_way_to_1f1b(tmp_path: Path) -> None:
    """A plan file whose clocks slow the job (clock 'sim': they run; a plan file is not re-planned): its pairs
    measure it over the budget, so the rest of the job runs 1F1B all-max and the report says why."""
    slowest = JobTruth.embedded(2).clocks_mhz[-1]
    Plan.at_one_clock(one_f_one_b(2, M), slowest, "1f1b", "uniform").save(tmp_path / "slow.json")
    runs = [{"name": "slow", "engine": "runtime", "M": M, "steps": 8,
             "envpipe": {"clock": "sim", "plan": str(tmp_path / "slow.json"), "compare_iterations": 2,
                         "calibration_iterations": 2}}]
    run_pipeline(2, runs, tmp_path)
    s = read_summary(tmp_path / "slow")
    v = s.verdict
    assert v is not None and not v.kept and v.what == "the plan" and v.slowdown > 0.1
    assert "over the 0 % budget" in v.reason and v.reason.endswith("running 1F1B with every clock at max")
    steady = [x for x in iterations(tmp_path / "slow", 0) if x["phase"] == "steady"]
    assert [x["runs"] for x in steady] == ["plan", "baseline", "baseline", "plan", "baseline", "baseline"]
    assert steady[-1]["clocks_requested_mhz"] in ([], [JobTruth.embedded(2).clocks_mhz[0]])
    assert s.plan is not None and not s.plan.deployed  # what runs now is 1F1B all-max
    text = (tmp_path / "slow" / "report.txt").read_text()
    assert text.splitlines()[0].startswith("saved nothing: the plan: +") and "withdrawn" in text
