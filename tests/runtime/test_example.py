"""examples/train_gpt.py end to end on CPU: two real processes (gloo), a plan file with clocks, sim clock; its
arguments and one-line errors in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule
from envpipe.runtime.config import parse
from envpipe.runtime.phases.steps import steps_to_report
from envpipe.simgpu import JobTruth
from tests.support.ports import free_port
from tests.support.runtime_summary import iterations, read_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_gpt.py"
DEMO = ("--layers", "4", "--hidden", "192", "--heads", "4", "--seq", "96", "--vocab", "512", "--micro-batch", "4",
        "--microbatches", "8")  # the Makefile's demo: the optimal plan takes EnvPipe's order


def _import_example() -> ModuleType:
    """examples/train_gpt.py as the module `train_gpt`; sys.path is left as it was."""
    sys.path.insert(0, str(EXAMPLE.parent))
    try:
        import train_gpt
    finally:
        sys.path.remove(str(EXAMPLE.parent))
    return train_gpt


def _torchrun(
    args: list[str], env_extra: dict[str, str], cwd: Path, size: tuple[str, ...] = ("--tiny",)
) -> subprocess.CompletedProcess:
    # PYTHONFAULTHANDLER: a rank killed by a signal (SIGABRT, SIGSEGV) prints its Python stack
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1", **env_extra}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        "2",
        "--master-port",
        str(free_port()),
        str(EXAMPLE),
        *size,
        *args,
    ]
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=180)


@pytest.mark.slow
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_example_runs_a_plan_with_simulated_clocks(model: str, tmp_path: Path) -> None:
    M = 4
    orders = envpipe_schedule(2, M, [2, 0])
    clocks = [[1005 if k == "F" else 1410 for k, _ in o] for o in orders]  # slow forwards on every stage
    plan = {
        "version": 1,
        "num_stages": 2,
        "num_microbatches": M,
        "schedule": "envpipe",
        "policy": "envelope",
        "stages": [
            [{"kind": k, "mb": m, "freq_mhz": c} for (k, m), c in zip(o, cs, strict=True)]
            for o, cs in zip(orders, clocks, strict=True)
        ],
        "predicted": {"iteration_time_s": 0.5},
        "critical_path": [],
    }
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    proc = _torchrun(
        [
            "--model",
            model,
            "--microbatches",
            str(M),
            "--steps",
            "3",
            "--calibration-steps",
            "1",
            "--plan",
            "plan.json",
            "--compare-iterations",
            "0",
            "--log-interval",
            "1",
            "--report-dir",
            "rep",
        ],
        {"ENVPIPE_TYPE": "envelope"},
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    summary = read_summary(tmp_path / "rep")
    assert summary.clock.energy == "simulated GPU" and summary.steady.energy_j is not None
    assert summary.plan is not None and summary.plan.source.startswith("plan file plan.json (sha256 ")
    assert summary.plan.orders[0] == ["F0", "F1", "F2", "F3", "B0", "B1", "B2", "B3"]
    assert summary.predicted_iteration_time_s == 0.5 and summary.steady.time_s.n == 2
    assert summary.measured is None and summary.baseline is None  # no comparison iterations asked for
    lines = iterations(tmp_path / "rep", 0)
    assert [x["phase"] for x in lines] == ["calibrate", "steady", "steady"]
    assert lines[1]["clocks_requested_mhz"] == [1005, 1410]  # stage 0: Fs at 1005, then Bs at 1410
    assert lines[2]["clocks_requested_mhz"] == [1005, 1410]
    assert all(x["loss"] > 0 for x in iterations(tmp_path / "rep", 1))  # every rank has the loss
    units = summary.units_last_iteration[0]
    assert {u.mhz for u in units if u.kind == "F"} == {1005}
    assert (tmp_path / "rep" / "gantt.png").stat().st_size > 1000
    assert "[envpipe]       3/3 steady        plan      loss" in proc.stdout  # every iteration's loss, on rank 0


def test_example_refuses_bad_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """One line on stderr and exit 2, before any process group or model exists; nothing left behind."""
    train_gpt = _import_example()
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ENVPIPE_SCHEDULING", "gpipe")
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")

    def refused(argv: list[str]) -> str:
        with pytest.raises(SystemExit) as exc:
            train_gpt.main(argv)
        assert exc.value.code == 2
        err = capsys.readouterr().err.strip()
        assert "Traceback" not in err and len(err.splitlines()) == 1
        return err

    assert "ENVPIPE_SCHEDULING is 'gpipe'; choose one of 1f1b, envpipe" in refused(["--tiny"])
    monkeypatch.delenv("ENVPIPE_SCHEDULING")
    (tmp_path / "ds.json").write_text(json.dumps({"envpipe": {"type": "fastest"}}))
    assert "'envpipe.type' is 'fastest'" in refused(["--tiny", "--deepspeed_config", "ds.json"])
    missing = refused(["--tiny", "--config", "missing.json"])
    assert "DeepSpeed config missing.json: cannot read: No such file or directory" in missing
    (tmp_path / "bad.json").write_text("{")
    assert "DeepSpeed config bad.json: not JSON" in refused(["--tiny", "--config", "bad.json"])
    (tmp_path / "bad.json").unlink()
    assert "--steps: '0': must be a positive finite number" in refused(["--tiny", "--steps", "0"])
    assert "--hidden 30 is not a multiple of --heads 4" in refused(["--tiny", "--hidden", "30", "--heads", "4"])
    assert "which clock 'none' cannot measure" in refused(["--tiny", "--clock", "none", "--policy", "envelope"])
    assert "4 pipeline stages do not divide the 1 processes" in refused(["--tiny", "--pipeline-stages", "4"])
    # files that are not files: refused at once, never read (/dev/zero) or waited on (a FIFO)
    os.mkfifo(tmp_path / "fifo")
    for given in ("/dev/zero", str(tmp_path / "fifo")):
        assert "not a regular file" in refused(["--tiny", "--config", given])
        assert "'envpipe.plan': " in refused(["--tiny", "--plan", given])
    assert "is a directory" in refused(["--tiny", "--profile-layers", str(tmp_path)])
    assert "--hidden: '4000000000': at most 131072" in refused(["--tiny", "--hidden", "4000000000"])
    (tmp_path / "fifo").unlink()
    assert sorted(tmp_path.iterdir()) == [tmp_path / "ds.json"]  # nothing left behind


def test_tiny_fills_only_the_sizes_not_given() -> None:
    train_gpt = _import_example()
    args = train_gpt.parse_args(["--tiny", "--layers", "6"])
    assert (args.layers, args.hidden, args.seq) == (6, 32, 16)
    assert train_gpt.parse_args([]).hidden == 2048


@pytest.mark.slow
def test_a_plan_for_another_pipeline_stops_the_job_before_its_first_step(tmp_path: Path) -> None:
    """A plan for 8 micro-batches where the job has 4: one line at envpipe.initialize (the old runtime refused
    it only when it reached the plan, after its calibration steps, with a traceback)."""
    plan = Plan.at_one_clock(envpipe_schedule(2, 8, [1, 0]), 1410, "envpipe", "envelope")
    plan.save(tmp_path / "plan.json")
    proc = _torchrun(["--microbatches", "4", "--steps", "6", "--plan", "plan.json", "--log-interval", "1",
                      "--report-dir", "rep"], {}, tmp_path)
    assert proc.returncode != 0, proc.stdout[-2000:] + proc.stderr[-4000:]  # torchrun's: its ranks exited 2
    ours = [x for x in proc.stderr.splitlines() if x.startswith("train_gpt.py: error:")]
    assert ours and all(x == "train_gpt.py: error: 'envpipe.plan' plan.json: plan is for 2 stages x 8 "
                        "micro-batches, this run has 2 x 4" for x in ours), proc.stderr[-3000:]
    frames = [x for x in proc.stderr.splitlines() if x.strip().startswith('File "')]
    assert not [x for x in frames if "envpipe" in x or "train_gpt" in x], frames  # torchrun's own frames only
    assert "calibrate" not in proc.stdout  # no step ran
    assert not (tmp_path / "rep" / "iterations.rank0.jsonl").exists()


@pytest.mark.slow
def test_clock_control_asked_for_and_unreachable_is_one_line(tmp_path: Path) -> None:
    proc = _torchrun(["--clock", "daemon", "--steps", "2"], {"ENVPIPE_CLOCKD_SOCKET": str(tmp_path / "absent.sock")},
                     tmp_path)
    assert proc.returncode != 0
    ours = [x for x in proc.stderr.splitlines() if x.startswith("train_gpt.py: error:")]
    assert ours and all("clock control was asked for (envpipe clock 'daemon')" in x for x in ours), proc.stderr[-3000:]


@pytest.mark.slow
def test_cuda_graphs_without_a_cuda_device_is_one_line(tmp_path: Path) -> None:
    proc = _torchrun(["--cuda-graphs", "--steps", "2", "--report-dir", "rep"], {}, tmp_path)
    assert proc.returncode != 0
    ours = [x for x in proc.stderr.splitlines() if x.startswith("train_gpt.py: error:")]
    assert ours and all(x == "train_gpt.py: error: cuda_graphs: CUDA graphs need a CUDA device; this stage runs on "
                        "cpu" for x in ours), proc.stderr[-3000:]
    frames = [x for x in proc.stderr.splitlines() if x.strip().startswith('File "')]
    assert not [x for x in frames if "envpipe" in x or "train_gpt" in x], frames
    assert not (tmp_path / "rep" / "iterations.rank0.jsonl").exists()


# units of tens of milliseconds on CPU, so that simulated clocks and waits are larger than CPU noise
SMALL = ("--layers", "2", "--hidden", "128", "--heads", "2", "--seq", "64", "--vocab", "512", "--micro-batch", "4")


@pytest.mark.slow
def test_online_profile_plan_reconfigure_and_predict(tmp_path: Path) -> None:
    """All online phases on CPU with the sim clock: calibrate, profile, plan, reconfigure, steady."""
    proc = _torchrun(
        ["--microbatches", "8", "--steps", "40", "--calibration-steps", "3", "--report-dir", "rep"],
        {"ENVPIPE_TYPE": "envelope", "ENVPIPE_SCHEDULING": "envpipe", "ENVPIPE_RECONFIGURE": "balanced"},
        tmp_path,
        (*SMALL, "--reconfigure-rounds", "20"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = iterations(tmp_path / "rep", 0)
    phases = [x["phase"] for x in lines]
    assert phases[:3] == ["calibrate"] * 3 and phases[-3:] == ["steady"] * 3 and len(phases) == 40
    assert [p for p in phases if p.startswith("profile@")] == [
        "profile@1740",
        "profile@1440",
        "profile@1155",
        "profile@855",
    ]
    rounds = [x["round"] for x in lines if x["phase"] == "reconfigure"]
    summary = read_summary(tmp_path / "rep")
    rec = summary.reconfiguration
    assert rec is not None and rounds == list(range(len(rec.rounds))) and rec.method == "balanced"
    # usually 8-12 rounds; on a loaded 2-core machine noisy waits can keep the path off the envelope until
    # the round guard (--reconfigure-rounds) ends the phase, which is a designed stop too
    stops = ("critical path is the envelope", "every critical unit is at the highest clock")
    assert rec.stop_reason.startswith("stopped after") or rec.stop_reason in stops
    assert rec.raises is not None and len(rec.rounds) == rec.raises + 1  # one measured iteration per round
    p = summary.predicted
    assert p is not None and p.energy_j > 0 and -1 < p.energy_saving < 1 and p.profile.startswith("online")
    plan = json.loads((tmp_path / "rep" / "plan.json").read_text())
    assert summary.plan is not None
    assert [[u["freq_mhz"] for u in st] for st in plan["stages"]] == summary.plan.clocks  # the raised plan
    # envelope units stay at the top clock; the plan slows some others down
    assert summary.plan.clocks[1] == [1740] * 16 and min(summary.plan.clocks[0]) < 1740
    # the simulator, fed with the calibrated unit, transfer and tail times, predicts the measured time
    # (CPU noise from other processes on a small machine: a loose bound)
    assert summary.time_error is not None and abs(summary.time_error) < 0.5, summary.time_error
    cal = summary.calibration
    assert cal is not None and cal.transfer_s >= 0 and all(t > 0 for t in cal.tail_s) and all(f > 0 for f in cal.fwd_s)
    blocking = JobTruth.embedded(2).blocking_w  # the simulated GPU's, learned from its counter while it idles
    assert cal.idle_power_w == pytest.approx(blocking, rel=0.05)
    assert cal.blocking_power_w is not None and cal.tail_power_w is not None
    for gpu in summary.gpus:  # the simulated counter at unit boundaries: waits at blocking power, the tail busier
        u = gpu.unit_energy
        assert u is not None and u.fwd_j and u.bwd_j and u.wait_power_w is not None
        assert u.wait_power_w == pytest.approx(blocking, rel=0.05) and u.fwd_j > 0
    assert "reconfiguration (balanced, simulated GPU)" in (tmp_path / "rep" / "report.txt").read_text()


def test_example_takes_the_local_rank_deepspeeds_launcher_adds() -> None:
    train_gpt = _import_example()
    # `deepspeed` / `envpipe-launch` run `train_gpt.py --local_rank=N <user args>`
    assert train_gpt.parse_args(["--local_rank=1", "--tiny"]).layers == 4
    assert train_gpt.parse_args(["--local-rank", "0", "--steps", "3"]).steps == 3


@pytest.mark.slow
def test_steady_iterations_time_units_every_tenth(tmp_path: Path) -> None:
    """Without the sim clock (which must see every unit), steady iterations time their units only now
    and then; every iteration still has its line, and the summary's units are a timed iteration's."""
    proc = _torchrun(
        ["--microbatches", "4", "--steps", "14", "--calibration-steps", "2", "--clock", "none", "--report-dir", "rep"],
        {"ENVPIPE_TYPE": "baseline", "ENVPIPE_SCHEDULING": "1f1b"},
        tmp_path,
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    for rank in (0, 1):
        lines = iterations(tmp_path / "rep", rank)
        steady = [x for x in lines if x["phase"] == "steady"]
        assert len(steady) == 12 and all(x["time_s"] > 0 for x in steady)
        assert [i for i, x in enumerate(steady) if x["units_timed"]] == [0, 10]
        assert all(x["units_timed"] for x in lines if x["phase"] == "calibrate")
    summary = read_summary(tmp_path / "rep")
    assert summary.steady.time_s.n == 12 and summary.steady.energy_j is None  # no clock: no energy counter
    assert [len(units) for units in summary.units_last_iteration] == [8, 8]  # the last timed one


@pytest.mark.slow
def test_one_process_without_a_launcher_and_a_loop_that_ends_before_the_steady_phase(tmp_path: Path) -> None:
    """`python examples/train_gpt.py` (no torchrun: one process, not DeepSpeed's MPI discovery), stopping while
    the run reconfigures: the report says in one line that there is none yet."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
                                                            "MASTER_PORT")}
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--tiny", "--steps", "11", "--calibration-steps", "5",
                           "--report-dir", "rep"], env={**env, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"},
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "no report yet: the run is in its reconfigure phase" in proc.stdout  # calibrate 5, profile 4, then 2
    assert len(iterations(tmp_path / "rep", 0)) == 11


def test_every_option_says_what_it_does() -> None:
    """`train_gpt.py --help` leaves no option unexplained (DeepSpeed's launcher's --local_rank is hidden)."""
    bare = [a.option_strings for a in _import_example().parser()._actions if a.option_strings and not a.help]
    assert bare == []


@pytest.mark.slow
def test_without_clock_control_the_order_earns_its_place_and_the_plan_is_rehearsed(tmp_path: Path) -> None:
    """clock 'sim-readonly' (the simulated GPU of a node without envpipe-clockd): the plan's order runs at default
    clocks in pairs with 1F1B and the no-harm verdict decides what runs after them; with `rehearse`, first the
    plan's units are stretched by exactly their planned extra time, in pairs with 1F1B."""
    for name, steps, extra in (("order", 12, []), ("rehearsed", 20, ["--rehearse"])):
        done = _torchrun(["--clock", "sim-readonly", "--compare-iterations", "2", "--calibration-steps", "2",
                          "--steps", str(steps), "--report-dir", str(tmp_path / name), *extra], {}, tmp_path, DEMO)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for name in ("order", "rehearsed"):
        s, out = read_summary(tmp_path / name), tmp_path / name
        assert s.clock.kind == "sim" and not s.clock.controls_clocks and s.plan is not None
        v, m = s.verdict, s.measured
        assert v is not None and m is not None and m.pairs == 2 and m.energy_saving is not None
        assert v.kept == (m.slowdown.median <= 0 and m.energy_saving.median >= 0)  # no allowance without clocks
        assert v.slowdown == pytest.approx(m.slowdown.median) and v.what.startswith("the plan's order, envpipe")
        steady = [x["runs"] for x in iterations(out, 0) if x["phase"] == "steady"]
        assert steady[:4] == ["plan", "baseline", "baseline", "plan"]
        assert set(steady[4:]) == {"plan" if v.kept else "baseline"}
        text = (out / "report.txt").read_text()
        assert f"no harm (what runs after the pairs): {v.reason}" in text
        assert text.splitlines()[0].startswith("saved nothing:" if not v.kept else "saved ")
    r = read_summary(tmp_path / "rehearsed").rehearsal
    assert r is not None and r.pairs == 2 and r.time == "simulated GPU"
    assert any(x.planned_s > 0 for x in r.stages)
    assert all(x.inserted_s == pytest.approx(x.planned_s, rel=1e-12, abs=1e-15) for x in r.stages)  # exactly
    assert abs(r.error) < 0.01, r  # the rehearsed slowdown within 1 point of the planner's
    rehearse = [x["runs"] for x in iterations(tmp_path / "rehearsed", 0) if x["phase"] == "rehearse"]
    assert rehearse[-4:] == ["rehearsal", "baseline", "baseline", "rehearsal"]
    assert "rehearsal (clocks cannot be set here" in (tmp_path / "rehearsed" / "report.txt").read_text()


@pytest.mark.slow
def test_a_rehearsed_plan_over_its_budget_is_re_planned_until_it_measures_within_it(tmp_path: Path) -> None:
    """clock 'sim-readonly' with `rehearse`, on simulated GPUs whose stage 1 runs its calibration's units 1.3 x
    slower than later ones (the drift the H200 runs showed): the plan made on the calibration spends slack stage 1
    no longer leaves, so its rehearsed round measures far over the 0 % budget; the profile is corrected by the
    round's timed 1F1B iterations and the plan re-made, until a rehearsed round measures within budget; then the
    rehearsal of the plan that runs agrees with its prediction within a point."""
    cold = {"ENVPIPE_SIM_COLD_STAGE": f"1:{2 * 2 * 8}:1.3"}  # both calibration iterations: 2 x M units each
    done = _torchrun(["--clock", "sim-readonly", "--compare-iterations", "2", "--calibration-steps", "2",
                      "--steps", "50", "--rehearse", "--report-dir", str(tmp_path / "rep")], cold, tmp_path, DEMO)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    s = read_summary(tmp_path / "rep")
    r = s.reconfiguration
    assert r is not None and r.method == "replan" and r.rehearsed and len(r.rounds) >= 2, r
    assert r.rounds[0].slowdown is not None and r.rounds[0].slowdown > 0.05  # the calibration's slack is not there
    assert r.stop_reason.startswith("within budget"), r.stop_reason
    assert s.predicted is not None and "corrected by the units that ran" in s.predicted.profile
    rh = s.rehearsal
    assert rh is not None and abs(rh.error) < 0.01, rh
    assert all(x.inserted_s == pytest.approx(x.planned_s, rel=1e-12, abs=1e-15) for x in rh.stages)
    lines = [x for x in iterations(tmp_path / "rep", 0) if x.get("round") == 0]
    assert lines[0]["phase"] == "warm-up" and all(x["rehearsed"] for x in lines)
    assert [x["runs"] for x in lines[1:]] == ["plan", "baseline", "baseline", "plan", "baseline", "baseline"]
    text = (tmp_path / "rep" / "report.txt").read_text()
    assert "reconfiguration (replan, simulated GPU, rehearsed: each unit stretched" in text


@pytest.mark.slow
def test_every_iteration_and_the_measured_saving_reach_the_monitors(tmp_path: Path) -> None:
    """A script that ends with the report (as train_gpt.py, the demo) has every iteration in DeepSpeed's CSV
    monitor, the last ones included (their energy is known only once the report waits for the counter), and
    the measured saving from the first comparison pair on, not from the report at the end of the pairs."""
    config = tmp_path / "ds.json"
    config.write_text(json.dumps({"csv_monitor": {"enabled": True, "output_path": str(tmp_path / "csv"),
                                                  "job_name": "j"}}))
    block = {"calibration_iterations": 1, "profile_points": 2, "reconfigure_rounds": 1, "compare_iterations": 3}
    steps = steps_to_report(parse(block, {}))  # (the notebook's default length): the whole report, just
    proc = _torchrun(["--steps", str(steps), "--calibration-steps", "1", "--profile-points", "2",
                      "--reconfigure-rounds", "1", "--compare-iterations", "3", "--report-dir", "rep",
                      "--deepspeed_config", str(config)], {}, tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    csv = tmp_path / "csv" / "j"

    def column(tag: str) -> list[tuple[int, float]]:
        rows = (csv / f"EnvPipe_Samples_{tag}.csv").read_text().splitlines()
        assert rows[0] == f"step,{tag}"  # the column is named after the tag, the stage's included
        return [(int(a), float(b)) for a, b in (r.split(",") for r in rows[1:])]

    energy = column("energy_j_simulated")
    assert len(energy) == steps and all(e > 0 for _, e in energy)
    assert len(column("stage1_clock_mhz")) == steps
    steady = [x for x in iterations(tmp_path / "rep", 0) if x["phase"] == "steady"]
    saving = column("saving_simulated")
    samples = {x["iteration"]: step for x, (step, _) in zip(iterations(tmp_path / "rep", 0), energy, strict=True)}
    assert saving[0][0] == samples[steady[1]["iteration"]]  # from the iteration that completes the first pair
    s = read_summary(tmp_path / "rep")
    assert s.measured is not None and s.measured.energy_saving is not None and s.measured.pairs == 3
    assert saving[-1][1] == pytest.approx(s.measured.energy_saving.median)  # the report's figure
