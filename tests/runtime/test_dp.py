"""Data x pipeline parallelism: DP2 x PP2 real DeepSpeed processes (gloo, CPU), ZeRO-1, the runtime's
replica handling (slowest per stage, one broadcast plan, all-reduce in the iteration, job-wide report,
stragglers), and the shape and setting errors."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from envpipe.profile.from_measured import StageUnits
from envpipe.runtime import summary as S
from envpipe.runtime.config import EnvPipeConfigError, parse
from envpipe.runtime.decision import Decided, Decision, Origin
from envpipe.runtime.measure import replicas
from envpipe.runtime.measure.collective import Place, portable
from envpipe.runtime.measure.iterations import BASELINE, PLAN
from envpipe.runtime.measure.replicas import StageStats
from envpipe.runtime.report.collect import RankRecord, job_summary
from tests.support import netns_hosts
from tests.support.pipelines import WORKER, assert_same_math, orders_json, run_pipeline
from tests.support.runtime_summary import iterations, read_summary, sample_calibrated, sample_summary

M = 4


def check_dp_report(report_dir: Path, world: int, nodes: int) -> S.RunSummary:
    """The job-wide parts every DP2 x PP2 runtime report must have; returns the summary."""
    summary = read_summary(report_dir)
    job = summary.job
    assert (job.data_parallel, job.gpus, len(job.nodes)) == (2, world, nodes)
    per_gpu = [g.energy_per_iteration_j for g in summary.gpus]  # every GPU of every replica
    assert len(per_gpu) == world and all(e is not None and e > 0 for e in per_gpu)
    assert sum(n.energy_per_iteration_j or 0 for n in job.nodes) == pytest.approx(sum(e or 0 for e in per_gpu))
    assert sorted(r for n in job.nodes for r in n.ranks) == list(range(world))
    for stage in job.tails:  # measured in every rank's iteration, simulated in the prediction
        assert all(t is not None and t > 0 for t in stage.measured_allreduce_s)
        assert stage.simulated_tail_s is not None and stage.simulated_tail_s > 0
    assert summary.predicted_iteration_time_s is not None
    assert summary.predicted_iteration_time_s > max(s.simulated_tail_s or 0 for s in job.tails)
    assert [r.replica for r in job.replicas] == [0, 1]
    return summary


STEPS = 3  # of the shared launch's runs
ONE_CALIBRATION = {"calibration_iterations": 1, "compare_iterations": 0}  # short runs: no comparison pairs


@pytest.fixture(scope="module")
def dp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[dict], Path]:
    """One DP2 x PP2 launch (4 processes) for the tests below: every rank's results and the output directory."""
    out = tmp_path_factory.mktemp("dp2_pp2")
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": STEPS},
        {"name": "1f1b", "engine": "envpipe", "M": M, "steps": STEPS, "orders": orders_json(one_f_one_b(2, M))},
        {"name": "envpipe", "engine": "envpipe", "M": M, "steps": STEPS,
         "orders": orders_json(envpipe_schedule(2, M, [M, 0]))},
        {"name": "stock_zero1", "engine": "stock", "M": M, "steps": STEPS, "zero": 1},
        {"name": "envpipe_zero1", "engine": "envpipe", "M": M, "steps": STEPS, "zero": 1,
         "orders": orders_json(envpipe_schedule(2, M, [2, 0]))},
        {"name": "stock_bf16_zero1", "engine": "stock", "M": M, "steps": STEPS, "zero": 1, "bf16": True},
        {"name": "envpipe_bf16_zero1", "engine": "envpipe", "M": M, "steps": STEPS, "zero": 1, "bf16": True,
         "orders": orders_json(envpipe_schedule(2, M, [M, 0]))},
        {"name": "runtime", "engine": "runtime", "M": M, "steps": STEPS, "zero": 1,  # 1 calibrating, then steady
         "envpipe": {"type": "baseline", "scheduling": "envpipe", "clock": "sim", "straggler_threshold": 10.0,
                     **ONE_CALIBRATION}},
        # for test_plan_broadcast_gives_every_replica_the_same_clocks: 1 calibrating, 4 profiling, 2 steady
        {"name": "runtime_envelope", "engine": "runtime", "M": M, "steps": 7,
         "envpipe": {"type": "envelope", "scheduling": "envpipe", "clock": "sim", "straggler_threshold": 10.0,
                     **ONE_CALIBRATION}},
    ]
    return run_pipeline(2, runs, out, world=4), out


@pytest.mark.slow
def test_dp2_pp2_same_math_as_stock_with_and_without_zero1_fp32_and_bf16(dp_runs: tuple[list[dict], Path]) -> None:
    results, out = dp_runs
    assert results[0]["stock_zero1"]["losses"][0] != results[0]["stock_zero1"]["losses"][-1]  # it trains
    for name in ("1f1b", "envpipe"):
        assert_same_math(results, name, "stock")
    for name in ("envpipe_zero1", "runtime"):
        assert_same_math(results, name, "stock_zero1")
    assert_same_math(results, "stock_zero1", "stock")  # ZeRO-1 itself changes nothing but memory
    assert_same_math(results, "envpipe_bf16_zero1", "stock_bf16_zero1")  # DeepSpeed's bf16 ZeRO-1 path
    summary = check_dp_report(out / "runtime", world=4, nodes=1)
    assert summary.job.plans_identical_across_replicas and summary.job.straggler_replica is None
    assert summary.plan is not None
    assert summary.plan.orders[1] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]  # the last stage's
    for rank in range(4):
        steady = [x for x in iterations(out / "runtime", rank) if x["phase"] == "steady"]
        assert len(steady) == STEPS - 1


@pytest.mark.slow
def test_straggler_reported_and_others_take_a_cheaper_frontier_plan(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("scipy", reason="the optimal planner's frontier needs scipy")
    monkeypatch.setenv(replicas.SLOW_REPLICA_ENV, "1:4")  # replica 1's sim clock runs 4x slower
    block = {"type": "envelope", "scheduling": "1f1b", "clock": "sim", "straggler": "frontier",
             "straggler_threshold": 0.5}
    runs = [{"name": "runtime", "engine": "runtime", "M": M, "steps": 7, "envpipe": {**block, **ONE_CALIBRATION}}]
    run_pipeline(2, runs, tmp_path, world=4)
    summary = check_dp_report(tmp_path / "runtime", world=4, nodes=1)
    job = summary.job
    assert job.straggler_replica == 1
    assert [r.straggler for r in job.replicas] == [False, True]
    rule = job.straggler_rule
    assert rule is not None and rule.applied and rule.replica == 1
    assert rule.predicted_time_s is not None and rule.straggler_predicted_time_s is not None
    assert rule.predicted_time_s <= rule.straggler_predicted_time_s  # simulated, both
    assert not job.plans_identical_across_replicas  # replica 0 runs the straggler rule's plan
    # replica 0 (ranks 0, 2) runs its own plan, below the highest clock somewhere; the straggler
    # (ranks 1, 3) runs the agreed one
    digests = job.plan_digest_per_rank
    assert digests[0] != digests[1] or digests[2] != digests[3]
    fast = [c for r in (0, 2) for x in iterations(tmp_path / "runtime", r) if x["phase"] == "steady"
            for c in x["clocks_requested_mhz"]]
    assert fast and min(fast) < 1410
    from envpipe.runtime.report.text import render_report

    text = render_report(summary, tmp_path / "runtime")  # what the example prints
    assert "job: DP2 x PP2, 4 GPUs on 1 node(s)" in text and "straggler: replica 1" in text
    assert "straggler rule: the other replicas run a frontier plan" in text
    assert "stage 1 per replica (simulated GPU): all-reduce" in text


@pytest.mark.slow
def test_plan_broadcast_gives_every_replica_the_same_clocks(dp_runs: tuple[list[dict], Path]) -> None:
    report = dp_runs[1] / "runtime_envelope"  # an envelope plan, run in the shared launch
    summary = check_dp_report(report, world=4, nodes=1)
    assert summary.job.plans_identical_across_replicas
    digests = summary.job.plan_digest_per_rank
    for a, b in ((0, 1), (2, 3)):  # replicas 0 and 1 of stage 0, then of stage 1 (DeepSpeed's grid)
        assert digests[a] == digests[b]
        ca = [x["clocks_requested_mhz"] for x in iterations(report, a) if x["phase"] == "steady"]
        cb = [x["clocks_requested_mhz"] for x in iterations(report, b) if x["phase"] == "steady"]
        assert ca == cb and ca[0]


@pytest.mark.parametrize(
    ("world", "stages", "message"),
    [(4, 3, "3 pipeline stages do not divide the 4 processes"), (2, 4, "4 pipeline stages do not divide"),
     (4, 0, "positive integer"), (4, True, "positive integer")],
)
def test_bad_shapes(world: int, stages: int, message: str) -> None:
    with pytest.raises(replicas.ReplicaError, match=message):
        replicas.pipeline_shape(world, stages)


def test_shapes() -> None:
    assert replicas.pipeline_shape(4, None) == (4, 1)
    assert replicas.pipeline_shape(4, 2) == (2, 2)
    assert replicas.pipeline_shape(16, 8) == (8, 2)


@pytest.mark.parametrize(
    ("block", "message"),
    [({"pipeline_stages": 0}, "'envpipe.pipeline_stages' is 0: input should be greater than or equal to 1"),
     ({"pipeline_stages": "2"}, "'envpipe.pipeline_stages' is '2': input should be a valid integer"),
     ({"straggler": "wait"}, "choose one of report, frontier"),
     ({"straggler_threshold": -1}, "input should be greater than 0"),
     ({"straggler_threshold": True}, "'envpipe.straggler_threshold' is True: input should be a valid number")],
)
def test_bad_dp_settings(block: dict, message: str) -> None:
    with pytest.raises(EnvPipeConfigError, match=message):
        parse(block, {})


def test_slow_replica_setting() -> None:
    assert replicas.sim_slowdown(1, {replicas.SLOW_REPLICA_ENV: "1:2.5"}) == 2.5
    assert replicas.sim_slowdown(0, {replicas.SLOW_REPLICA_ENV: "1:2.5"}) == 1.0
    assert replicas.sim_slowdown(0, {}) == 1.0
    for bad in ("1", "x:2", "1:0.5"):
        with pytest.raises(replicas.ReplicaError, match=replicas.SLOW_REPLICA_ENV):
            replicas.sim_slowdown(0, {replicas.SLOW_REPLICA_ENV: bad})


def _place(rank: int, stage: int, replica: int, node: int = 0) -> Place:
    return Place(rank, stage, replica, "host", node)


def test_slowest_replica_per_stage_and_shortest_tail() -> None:
    def stats(f: float, b: float, tail: float, end: float) -> StageStats:
        return StageStats(StageUnits(f, b, f, b), 0.0, tail, end)

    entries = [
        (_place(0, 0, 0), stats(1.0, 2.0, 0.5, 10.0)),
        (_place(1, 0, 1), stats(1.5, 2.5, 0.1, 14.0)),
        (_place(2, 1, 0), stats(2.0, 2.0, 0.4, 11.0)),
        (_place(3, 1, 1), stats(1.0, 1.0, 0.3, 13.0)),
    ]
    per_stage = replicas.slowest_per_stage(entries, 2)
    assert [s.units.fwd_s for s in per_stage] == [1.5, 2.0]
    assert [s.units.fwd_s for s in replicas.slowest_per_stage(entries, 2, exclude=(1,))] == [1.0, 2.0]
    assert replicas.stage_tails(entries, 2) == [0.1, 0.3]
    assert replicas.replica_times(entries) == {0: 11.0, 1: 14.0}
    assert replicas.find_straggler({0: 11.0, 1: 14.0}, 0.05) == 1
    assert replicas.find_straggler({0: 11.0, 1: 11.2}, 0.05) is None
    assert replicas.find_straggler({0: 11.0}, 0.05) is None
    with pytest.raises(replicas.ReplicaError, match=r"no measurements from stage\(s\) \[2\]"):
        replicas.slowest_per_stage(entries, 3)


def _decided(tails: list[float], straggler: int | None) -> Decided:
    """What a run decided, as far as the job summary reads it: the simulated tails and the straggler found."""
    calibrated = sample_calibrated(len(tails))
    timing = replace(calibrated.timing, tail_s=tails, head_s=0.0)
    plan = Plan.at_one_clock(one_f_one_b(len(tails), 2), 1410, "1f1b", "baseline")
    decision = Decision(Origin.RULE, "test", "baseline", "1f1b", {0: plan, 1: plan}, True)
    return Decided(replace(calibrated, timing=timing, straggler=straggler), decision, None)


def test_job_summary_sums_every_gpu_of_every_node() -> None:
    def record(rank: int, stage: int, replica: int, node: int, joules: float, end: float) -> RankRecord:
        steady = [(PLAN, end, joules), (BASELINE, end, 2 * joules), (PLAN, end, joules)]  # baselines do not count
        return RankRecord(_place(rank, stage, replica, node), steady, None, None, [], f"d{stage}", [0.1, 0.1],
                          [0.2, 0.2], [])

    records = [record(0, 0, 0, 0, 10.0, 0.8), record(1, 0, 1, 0, 11.0, 0.8),
               record(2, 1, 0, 2, 12.0, 0.8), record(3, 1, 1, 2, 13.0, 1.0)]
    job = job_summary(records, 0.05, _decided([0.15, 0.25], None))
    assert [n.energy_per_iteration_j for n in job.nodes] == [21.0, 25.0]
    assert [n.ranks for n in job.nodes] == [[0, 1], [2, 3]]
    assert [r.energy_per_iteration_j for r in job.replicas] == [22.0, 24.0]
    assert job.straggler_replica == 1 and job.plans_identical_across_replicas
    assert job.straggler_seen_in == "steady iterations"
    calm = [record(0, 0, 0, 0, 10.0, 0.8), record(1, 0, 1, 0, 11.0, 0.8)]
    assert job_summary(calm, 0.05, _decided([0.1], None)).straggler_replica is None
    kept = job_summary(calm, 0.05, _decided([0.1], 1))  # the others slowed down to match it
    assert kept.straggler_replica == 1 and kept.straggler_seen_in == "calibration/profiling"
    assert [r.straggler for r in kept.replicas] == [False, True]
    assert job.tails[1] == S.StageTail(1, [0.1, 0.1], [0.2, 0.2], 0.25)
    assert job.plan_digest_per_rank == ["d0", "d0", "d1", "d1"]


SSH_REASON = netns_hosts.netns_unavailable()


@pytest.mark.slow
@pytest.mark.skipif(SSH_REASON is not None, reason=f"real ssh test impossible here: {SSH_REASON}")
def test_dp2_pp2_across_two_ssh_hosts(tmp_path: Path) -> None:
    """2 network-namespace hosts x 2 ranks through envpipe-launch --backend ssh (real sshd and pdsh)."""
    out = tmp_path / "out"
    out.mkdir()
    runs = [
        {"name": "stock", "engine": "stock", "M": M, "steps": 3},
        {"name": "envpipe", "engine": "envpipe", "M": M, "steps": 3,
         "orders": orders_json(envpipe_schedule(2, M, [M, 0]))},
        {"name": "runtime", "engine": "runtime", "M": M, "steps": 3,
         "envpipe": {"type": "baseline", "scheduling": "envpipe", "clock": "sim", "straggler_threshold": 10.0,
                     **ONE_CALIBRATION}},
    ]
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"stages": 2, "runs": runs}))
    hosts = netns_hosts.start(tmp_path)
    try:
        hostfile = tmp_path / "hostfile"
        hostfile.write_text("".join(f"{ip} slots=2\n" for ip in hosts.ips))
        r = netns_hosts.launch_ssh(
            hosts, "--nodes", "2", "--hostfile", str(hostfile), "--env", f"GLOO_SOCKET_IFNAME={netns_hosts.IFNAME}",
            "--env", "OMP_NUM_THREADS=1", str(WORKER), f"@{spec}", str(out), timeout=240,
        )
    finally:
        hosts.close()
    assert r.returncode == 0, r.stderr[-3000:]
    results = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    assert_same_math(results, "envpipe", "stock")
    assert_same_math(results, "runtime", "stock")
    summary = check_dp_report(out / "runtime", world=4, nodes=2)
    per_node = summary.job.nodes
    assert [n.ranks for n in per_node] == [[0, 1], [2, 3]]
    assert all(n.energy_per_iteration_j is not None and n.energy_per_iteration_j > 0 for n in per_node)


def test_errors_broadcast_from_rank_0_survive_pickling() -> None:
    from envpipe.plan.planfile import PlanError
    from envpipe.profile.csv_profile import ProfileError

    plain = PlanError("plan.json: not JSON")
    assert portable(plain) is plain
    custom = portable(ProfileError("p.csv", 3, "bad row"))  # its __init__ does not unpickle
    assert isinstance(custom, ValueError) and "p.csv:3: bad row" in str(custom)


def test_gpu_script_parses_and_its_table_reads_reports(tmp_path: Path) -> None:
    """benchmarks/dp_h200.sh (run end to end on CPU with TINY=1 by hand) and its table on two reports."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    assert subprocess.run(["bash", "-n", str(root / "benchmarks" / "dp_h200.sh")]).returncode == 0
    for name, t in (("stock_dp2", 0.2), ("envpipe_dp2", 0.25)):
        (tmp_path / name).mkdir()
        sample_summary(t, 50.0, 0.24).save(tmp_path / name / "summary.json")
    (tmp_path / "stock_dp2_zero1.skipped").write_text("skipped: needs 4 GPUs, 2 visible\n")  # as the script writes
    table = subprocess.run([sys.executable, str(root / "benchmarks" / "runtime_results.py"), "dp-table", str(tmp_path),
                            "stock_dp2",
                            "envpipe_dp2", "envpipe_dp2_zero1", "stock_dp2_zero1"],
                           capture_output=True, text=True, check=True).stdout
    lines = table.splitlines()
    assert "| envpipe_dp2 | DP2×PP2 | 0.25 | 128 | 0.8 | 50 (measured (NVML counter)) | 50 | 0.24 |" in lines[3]
    assert "all-reduce 0.01 / 0.02, tail 0.03 / 0.04 (simulated tail 0.03)" in lines[3]
    assert lines[4].startswith("| envpipe_dp2_zero1 | not run or failed")
    assert lines[5].startswith("| stock_dp2_zero1 | skipped: needs 4 GPUs, 2 visible |")


def test_example_refuses_stages_that_do_not_divide_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    example = Path(__file__).resolve().parents[2] / "examples"
    monkeypatch.syspath_prepend(str(example))
    import train_gpt

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("WORLD_SIZE", "4")

    def refused(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exc:
            train_gpt.main(argv)
        assert exc.value.code == 2
        return capsys.readouterr().err

    assert "3 pipeline stages do not divide the 4 processes" in refused(["--tiny", "--pipeline-stages", "3"])
    (tmp_path / "ds.json").write_text(json.dumps({"envpipe": {"pipeline_stages": 8}}))
    assert "8 pipeline stages do not divide the 4 processes" in refused(["--tiny", "--config", "ds.json"])
    assert "--pipeline-stages: '0': must be a positive finite number" in refused(["--tiny", "--pipeline-stages", "0"])
    assert list(tmp_path.iterdir()) == [tmp_path / "ds.json"]  # nothing left behind


def test_calibration_per_replica_slowest_units_shortest_tail() -> None:
    """Each replica is calibrated on its own pipeline (host clocks of different replicas may differ); per stage
    the job takes the slowest replica's units and the shortest tail; the replica that ended last leads."""
    from dataclasses import replace

    from tests.support.timings import GAP, HEAD, TAIL, measure

    orders = one_f_one_b(2, 4)
    fast = measure(orders, [0.010, 0.012], [0.020, 0.024])
    slow = measure(orders, [0.010, 0.018], [0.020, 0.036], host0=5000.0)  # stage 1 slower, another clock
    waited = [replace(t, step_end=t.step_end + 0.05) for t in fast]  # the fast one waits in the all-reduce
    it = [(_place(0, 0, 0), waited[0]), (_place(1, 0, 1), slow[0]), (_place(2, 1, 0), waited[1]),
          (_place(3, 1, 1), slow[1])]
    cals = replicas.calibrate_replicas(orders, [it])
    assert sorted(cals) == [0, 1] and cals[1].fwd_s == pytest.approx([0.010 + GAP, 0.018 + GAP])
    entries = replicas.stage_entries(cals, it)
    cal = replicas.job_calibration(cals, entries, 2)
    assert cal.fwd_s == pytest.approx([0.010 + GAP, 0.018 + GAP]) and cal.bwd_s == pytest.approx([0.020 + GAP,
                                                                                                  0.036 + GAP])
    assert cal.tail_s == pytest.approx(np.add(TAIL[:2], HEAD))  # not the waiting replica's longer tail
    assert replicas.slowest_replica(it) == 1
    assert replicas.find_straggler(replicas.replica_times(entries), 0.05) == 1
    only_fast = replicas.job_calibration(cals, entries, 2, exclude=(1,))
    assert only_fast.fwd_s == pytest.approx([0.010 + GAP, 0.012 + GAP])
