"""The drop-in engine's parts without processes (fast): the config as DeepSpeed takes it, the steady phase's
iterations, the monitor's events, the checkpointed state, the energy model against measured iterations and the
oracle on a simulated GPU's truth. tests/runtime/test_dropin.py runs them together in real DeepSpeed jobs."""

from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule, one_f_one_b
from envpipe.runtime import summary as S
from envpipe.runtime.config import EnvPipeConfig
from envpipe.runtime.decision import CalibrationResult, Decided, Decision, Origin
from envpipe.runtime.entry import EnvPipeSetupError, _warn_thread_count, _without_config, check_config, read_config
from envpipe.runtime.measure.collective import Place
from envpipe.runtime.measure.iterations import BASELINE, PLAN, Iteration, comparison_pattern
from envpipe.runtime.measure.timing import SimInputs, StageTiming
from envpipe.runtime.phases.calibrate import calibrate, median_change
from envpipe.runtime.phases.steady import WARMUP, SteadyRecord, steady
from envpipe.runtime.report import monitor, prediction
from envpipe.runtime.report.collect import RankRecord
from envpipe.runtime.report.monitor import Finished, MonitorFeed
from envpipe.runtime.rig import EnergySplit, Measured, Rig
from envpipe.simgpu import JobTruth
from tests.support.runtime_summary import sample_calibrated


def test_config_as_deepspeed_takes_it(tmp_path: Path) -> None:
    assert read_config(None, {"a": 1}) == {"a": 1}
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2, "envpipe": {"type": "baseline"}}))
    args = argparse.Namespace(deepspeed_config=str(path), local_rank=0)
    config = read_config(args, None)
    assert config["envpipe"] == {"type": "baseline"}
    assert _without_config(args).deepspeed_config is None and args.deepspeed_config == str(path)  # a copy
    for bad_args, bad_config, message in (
            (args, {"x": 1}, "given twice"), (None, None, "no DeepSpeed config"),
            (None, str(tmp_path / "missing.json"), "cannot read: No such file"),
            (None, str(tmp_path), "cannot read"), (None, str(_write(tmp_path / "l.json", "[1]")), "a JSON object"),
            (None, str(_write(tmp_path / "b.json", "{")), "not JSON")):
        with pytest.raises(EnvPipeSetupError, match=message):
            read_config(bad_args, bad_config)


def test_envpipe_blocks_come_out_and_a_found_plan_lies_beside_its_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    plan = Plan.at_one_clock(one_f_one_b(2, 4), 1410, "1f1b", "baseline")
    (tmp_path / "found").mkdir()
    plan.save(tmp_path / "found" / "p.json")
    found = {"envpipe": {"plan": "p.json", "type": "optimal"}, "envpipe_search": {"version": 1}, "steps_per_print": 9}
    ds_config, cfg, block = check_config(read_config(None, str(_write(tmp_path / "found" / "found.json",
                                                                  json.dumps(found)))))
    assert ds_config == {"steps_per_print": 9} and block == {"version": 1}
    assert cfg.plan == str(tmp_path / "found" / "p.json")
    monkeypatch.chdir(tmp_path)
    plan.save(tmp_path / "p.json")
    _, as_given, _ = check_config(found)
    assert as_given.plan == "p.json" and "envpipe" in found  # a dict: no file to lie beside; the caller's dict stays
    _, plain, none = check_config(read_config(None, str(_write(tmp_path / "ds.json",
                                                           json.dumps({"envpipe": {"plan": "p.json"}})))))
    assert plain.plan == "p.json" and none is None  # a plain config: the path as the user wrote it
    # a plan or profile the run cannot use stops it here, in one line, not after its calibration
    with pytest.raises(EnvPipeSetupError, match=r"^'envpipe.plan': missing.json: cannot read"):
        check_config({"envpipe": {"plan": "missing.json"}})
    with pytest.raises(EnvPipeSetupError, match=r"^'envpipe.profile': .*ds.json"):
        check_config({"envpipe": {"profile": str(_write(tmp_path / "ds.json", "{}"))}})


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _it(index: int, runs: str, energy: float | None = 1.0, phase: str = "steady") -> Iteration:
    return Iteration(index, phase, runs, float(index), float(index) + 0.5, 1e9 + index, 8, 8 * index, [1410, 855],
                     0.1, True, {}, energy)


def test_steady_record_keeps_the_window_and_a_bounded_tail() -> None:
    plan = Plan.at_one_clock(one_f_one_b(2, 4), 1410, "1f1b", "optimal")
    record = SteadyRecord(plan, PLAN, pairs=2)
    window = comparison_pattern(4, 2)
    assert window == [PLAN, BASELINE, BASELINE, PLAN]
    for i, runs in enumerate([*window, *[PLAN] * 200]):
        record.add(_it(i, runs))
    kept = record.iterations()
    assert [x.runs for x in kept[:4]] == window and len(kept) == 4 + record.recent.maxlen  # type: ignore[operator]
    assert kept[-1].index == 203  # the newest plan iterations


class _RigRan:
    """What the steady phase asks of the rig: the baseline, the config, whether an order ran in this process."""

    def __init__(self, baseline: Plan, orders_run: list[Plan]) -> None:
        self.baseline, self.cfg, self.sim = baseline, EnvPipeConfig(), None
        self._run = [p.orders() for p in orders_run]

    def has_run(self, plan: Plan) -> bool:
        return plan.orders() in self._run


@pytest.mark.parametrize(("ran_before", "pairs", "warms_up"), [(False, 2, True), (True, 2, False), (False, 0, False)])
def test_a_new_order_warms_up_before_its_comparison_pairs(
    monkeypatch: pytest.MonkeyPatch, ran_before: bool, pairs: int, warms_up: bool
) -> None:
    """EnvPipe's order first seen in the steady phase (a GPU without the clock daemon): one warm-up iteration
    before the ABBA pairs (its first iteration paid 3.5x on 2 x H100), none where the order ran before or
    nothing is compared."""
    monkeypatch.setattr("envpipe.runtime.phases.steady.progress", lambda _: None)
    baseline = Plan.at_one_clock(one_f_one_b(2, 4), 1410, "1f1b", "baseline")
    plan = Plan.at_one_clock(envpipe_schedule(2, 4, [1, 0]), 1410, "envpipe", "optimal")
    kept = S.Verdict(True, "the plan", 0.0, None, 0.0, "kept")
    phase = steady(_RigRan(baseline, [plan] if ran_before else []), SteadyRecord(plan, PLAN, pairs), 0,  # type: ignore[arg-type]
                   lambda: None, lambda: kept)
    measured = Measured(StageTiming(0, 0.0, 1.0, []), None, None, None)
    steps = [next(phase)] + [phase.send(measured) for _ in range(5)]
    got = [(x.phase, x.runs, x.plan.orders() == plan.orders()) for x in steps]
    ran = [x.runs for x in steps if x.phase == "steady"]
    assert (got[0] == (WARMUP, PLAN, True)) is warms_up
    assert ran[: 2 * pairs] == comparison_pattern(2 * pairs, pairs)[: 2 * pairs]
    assert all(x.plan.orders() == (plan if r == PLAN else baseline).orders() for x, r in
               zip([x for x in steps if x.phase == "steady"], ran, strict=True))


def test_monitor_events_of_the_job_per_iteration() -> None:
    written: list[list[tuple[str, float, int]]] = []
    feed = MonitorFeed(written.append, "measured", simulated_time=False)
    feed.saving_planned = 0.12
    rows = [Finished(7, 0, "steady", PLAN, 0.5, 100.0, 16, 112, 1200.0),
            Finished(7, 1, "steady", PLAN, 0.6, 150.0, 16, 112, 1410.0)]
    events = dict((tag, value) for tag, value, step in feed.events(rows))
    p = "EnvPipe/Samples/"
    assert events[f"{p}energy_j_measured"] == 250.0 and events[f"{p}power_w_measured"] == pytest.approx(250 / 0.6)
    assert events[f"{p}iteration_time_s"] == 0.6 and events[f"{p}samples_per_s"] == pytest.approx(16 / 0.6)
    assert events[f"{p}stage1_energy_j_measured"] == 150.0 and events[f"{p}stage0_clock_mhz"] == 1200.0
    assert events[f"{p}phase"] == 3 and events[f"{p}runs_plan"] == 1
    assert events[f"{p}saving_planned_simulated"] == 0.12 and f"{p}saving_measured" not in events  # no pair yet
    assert {step for _, _, step in feed.events(rows)} == {112}  # DeepSpeed's step: the samples so far
    unknown = feed.events([Finished(8, 0, "profile@1005", BASELINE, 0.5, None, 16, 128, 0.0)])
    assert not any("energy" in tag for tag, _, _ in unknown)  # no counter yet: no energy event


def test_the_measured_saving_reaches_the_monitor_from_the_first_pair_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two ranks, flushed every iteration: the saving appears with the iteration that completes the first
    comparison pair (before, it waited for the report, written only at the end of the comparison), follows
    the pairs, and holds once the window of pairs is over; it is the report's figure (the median per pair)."""
    monkeypatch.setattr(monitor.collective, "rank", lambda: 0)
    ranks: list[list[Finished]] = [[], []]
    monkeypatch.setattr(monitor.collective, "gather", lambda mine: [mine, ranks[1]])
    written: list[list[tuple[str, float, int]]] = []
    feed = MonitorFeed(written.extend, "simulated", simulated_time=True)
    energies = {PLAN: (60.0, 30.0), BASELINE: (70.0, 40.0)}  # per rank: the plan saves 2/11 of the job's 110 J
    phases = ["calibrate", "profile@1005", "warm-up"] + ["steady"] * 8
    runs = [BASELINE, BASELINE, PLAN, PLAN, BASELINE, BASELINE, PLAN, PLAN, PLAN, PLAN, BASELINE]
    savings = []
    for i, (phase, ran) in enumerate(zip(phases, runs, strict=True)):
        e0, e1 = energies[ran]
        if i == 6:
            e0 = 65.0  # the second pair's plan saves less: 1 - 95/110
        written.clear()
        feed.add(Iteration(i, phase, ran, 0.0, 0.5, 0.0, 16, 16 * (i + 1), [1000], None, True, energy_j=e0), 0)
        ranks[1] = [Finished(i, 1, phase, ran, 0.5, e1, 16, 16 * (i + 1), 1000.0)]
        feed.flush()
        saving = [v for tag, v, _ in written if tag == "EnvPipe/Samples/saving_simulated"]
        savings.append(saving[0] if saving else None)
    first, both = 1 - 90 / 110, statistics.median([1 - 90 / 110, 1 - 95 / 110])
    assert savings[:4] == [None] * 4  # calibrate, profile, warm-up, the first pair's plan
    assert savings[4:] == pytest.approx([first, first, both, both, both, both, both])  # 3-4, 5-6; 7-8 ends it


def test_a_stage_s_csv_column_names_the_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """DeepSpeed's CSV monitor names a file's column after the tag's last '/' part: each stage's says which."""
    from deepspeed.monitor import csv_monitor

    monkeypatch.setattr(csv_monitor.dist, "get_rank", lambda: 0)
    csv = csv_monitor.csvMonitor(argparse.Namespace(enabled=True, output_path=str(tmp_path), job_name="j"))
    feed = MonitorFeed(csv.write_events, "measured", simulated_time=False)
    csv.write_events(feed.events([Finished(1, s, "steady", PLAN, 0.5, 10.0 + s, 16, 16, 900.0 + s)
                                  for s in range(2)]))
    headers = {f.name: f.read_text().splitlines()[0] for f in (tmp_path / "j").glob("*stage*.csv")}
    assert headers == {f"EnvPipe_Samples_stage{s}_{what}.csv": f"step,stage{s}_{what}"
                       for s in range(2) for what in ("clock_mhz", "energy_j_measured")}


def test_energy_model_charges_each_phase_at_its_power() -> None:
    """Worked numbers: one 1F1B iteration of 2 stages x 2 micro-batches, units of 1 s at 100 W (F) and 2 s at
    200 W (B), no transfer, tails of 0.5 s; blocking 50 W, tail 300 W on every stage."""
    from envpipe.plan.case import PipelineCase
    from envpipe.plan.evaluate import evaluate_plan
    from envpipe.plan.simulate import Overheads
    from envpipe.profile import Profile

    one = np.ones((2, 1))
    profile = Profile(np.array([1000]), one, 2 * one, 100 * one, 400 * one, "worked")
    plan = Plan.at_one_clock(one_f_one_b(2, 2), 1000, "1f1b", "baseline")
    overheads = Overheads.broadcast(2, 50.0, 0.0, 0.5, 300.0)
    tl = evaluate_plan(plan, PipelineCase(profile, 2, overheads))
    energy = tl.stage_energy
    busy = 2 * 100 + 2 * 400  # per stage
    waits = tl.idle_time - 0.5
    assert np.allclose(energy, busy + waits * 50 + 0.5 * 300)
    record = RankRecord(Place(0, 0, 0, "h", 0), [(PLAN, tl.iteration_time, float(energy[0]) * 1.02)], None, None,
                        [], "d", [], [], [])
    other = RankRecord(Place(1, 1, 0, "h", 0), [(PLAN, tl.iteration_time, float(energy[1]))], None, None, [], "d", [],
                       [], [])
    calibrated = CalibrationResult(SimInputs([1.0] * 2, [2.0] * 2, [0.0] * 2, 0.0, [0.5] * 2, 0.0),
                            sample_calibrated().report, [], [], None, 50.0, [50.0] * 2, [300.0] * 2)
    decision = Decision(Origin.RULE, "worked", "baseline", "1f1b", {0: plan, 1: plan}, True, profile=profile)
    decided = Decided(calibrated, decision, None)
    e = prediction.energy_prediction([record, other], PLAN, plan, decided, "measured (NVML counter)")
    assert e is not None and e.stages[0].error == pytest.approx(1 / 1.02 - 1) and e.stages[1].error == pytest.approx(0)
    assert e.predicted_j == pytest.approx(float(energy.sum()))
    no_profile = prediction.energy_prediction([record, other], PLAN, plan,
                                              replace(decided, decision=replace(decision, profile=None)), "x")
    assert no_profile is None


def test_oracle_plans_on_the_truth_and_scores_the_runs_plan_there() -> None:
    truth_job = JobTruth.embedded(2)
    truth = truth_job.oracle_profile([(1e9, 2e9), (1e9, 2e9)])
    top = int(truth.freqs[0])
    slow = Plan.at_one_clock(one_f_one_b(2, 8), top, "1f1b", "optimal").with_clocks(
        [[top] * 16, [855] * 16])  # a plan that slows stage 1 everywhere: over budget on the truth, but scored
    powers = ([truth_job.blocking_w] * 2, [2 * truth_job.blocking_w] * 2)
    o = prediction.oracle_comparison(EnvPipeConfig(), prediction.GpuTruth(truth, *powers, "table"), slow,
                                     sample_calibrated())
    assert 0 < o.energy_saving < 0.5 and o.source == "table"
    top_plan = Plan.at_one_clock(one_f_one_b(2, 8), top, "1f1b", "optimal")
    same = prediction.oracle_comparison(EnvPipeConfig(), prediction.GpuTruth(truth, *powers, "t"), top_plan,
                                        sample_calibrated())
    assert same.planner_energy_saving == pytest.approx(0.0, abs=1e-12)  # the baseline itself saves nothing


def test_one_warning_line_when_torch_threads_differ_from_the_layer_profiles(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    import torch

    threads = torch.get_num_threads()
    monkeypatch.delenv("RANK", raising=False)
    _warn_thread_count({"torch_threads": threads})
    _warn_thread_count({})  # a found block without a CPU layer profile
    assert capsys.readouterr().out == ""
    _warn_thread_count({"torch_threads": threads + 3})
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 1 and f"torch uses {threads} threads" in out[0] and f"OMP_NUM_THREADS={threads + 3}" in out[0]
    monkeypatch.setenv("RANK", "1")  # rank 0 says it once for the job
    _warn_thread_count({"torch_threads": threads + 3})
    assert capsys.readouterr().out == ""


class _CountingRig:
    """A one-stage rig that records when the calibration reads the energy counter and meets the other ranks."""

    def __init__(self) -> None:
        self.cfg, self.P, self.M, self.sim, self.meter = EnvPipeConfig(), 1, 2, None, None
        self.place = Place(0, 0, 0, "host", 0)
        self.baseline = Plan.at_one_clock(one_f_one_b(1, 2), 1410, "1f1b", "baseline")
        self.events: list[str] = []

    def static_bytes(self) -> int:
        return 0

    def memory_limit(self) -> None:
        return None

    def peak_bytes(self) -> None:
        return None

    def energy(self, timing: StageTiming, wait_power_w: float | None = None) -> EnergySplit:
        """Iteration i's units read 10 + i J (forward) and 20 + 3 i J (backward): a counter that drifts."""
        assert wait_power_w is None  # no counter to measure a blocked GPU with
        self.events.append("counter")
        i = timing.step_start
        return EnergySplit(10.0 + i, 20.0 + 3 * i, 2 * (30.0 + 4 * i), 1.0, 0.1, 2.0, 0.1)

    def gather(self, mine: object) -> list[tuple[Place, object]]:
        self.events.append("gather")
        return [(self.place, mine)]

    gather_each = Rig.gather_each


def _calibrate(rig: _CountingRig, times: list[float]) -> tuple[CalibrationResult, list[str]]:
    """Drive the calibration with iteration i taking ``times[i]`` s (the last one's after those); the events before
    each step's iteration."""
    phase = calibrate(rig)  # type: ignore[arg-type]
    step, before = next(phase), []
    for i, length in enumerate([*times, *[times[-1]] * 40]):
        assert step.phase == "calibrate"
        # the saved-tensor hooks slow an iteration: only the warm-up one, which is neither timed nor metered, has them
        assert step.measure_memory == (i == 0), i
        before.append(",".join(rig.events))
        t0 = float(i)
        units = [(k, mb, t0 + 0.1 * j, t0 + 0.1 * j + 0.05) for j, (k, mb) in enumerate(one_f_one_b(1, 2)[0])]
        try:
            step = phase.send(Measured(StageTiming(0, t0, t0 + length, units), None, [100], None))
        except StopIteration as done:
            return done.value, before
    raise AssertionError(f"the calibration ran past {len(times) + 40} iterations")


def test_calibration_iterations_run_back_to_back(monkeypatch: pytest.MonkeyPatch) -> None:
    """No wait for the energy counter between calibration iterations (on 2 x H100 the waits left 40-115 ms idle
    gaps, and each iteration then read about 6 % less energy than back to back); the ranks only agree, in one small
    gather per measured iteration, on the iteration's time (whether it settled)."""
    monkeypatch.setattr("envpipe.runtime.phases.calibrate.progress", lambda _: None)
    rig = _CountingRig()
    calibrated, before = _calibrate(rig, [0.5] * 30)
    # 2 warm-ups + 4 settled (the least count), then 3 untimed ones (the anchor: at least 0.5 s, at least 3)
    assert len(before) == 9 and all("counter" not in x for x in before)
    assert [x.count("gather") for x in before] == [0, 0, 0, 1, 2, 3, 4, 4, 4]  # one per measured iteration
    assert rig.events.count("counter") == 4  # all after the last iteration
    r = calibrated.report
    assert (r.iterations, r.ran, r.settled, r.change) == (4, 6, True, 0.0)  # the first two warmed up
    assert (r.anchor_iterations, r.anchor_time_s, r.anchor_energy_j) == (3, 0.5, None)  # no counter here
    # the unit energies are the settled iterations' mean (2 to 5), not the last iteration's reading alone
    assert calibrated.unit_energies[0].units.fwd_j == pytest.approx(13.5)
    assert calibrated.unit_energies[0].units.bwd_j == pytest.approx(30.5)


def test_calibration_runs_until_the_iteration_time_settles(monkeypatch: pytest.MonkeyPatch) -> None:
    """A launch-bound job's first iterations run slow: the calibration goes on until the median of the last three
    moves by at most the tolerance, and the model takes the settled ones only."""
    monkeypatch.setattr("envpipe.runtime.phases.calibrate.progress", lambda _: None)
    falling = [0.9, 0.8, 0.7, 0.62, 0.56, 0.52, 0.5, 0.5, 0.5, 0.5, 0.5]
    calibrated, _ = _calibrate(_CountingRig(), falling + [0.5] * 20)
    r = calibrated.report
    # medians of three: ..., 0.52 (0.56, 0.52, 0.5), 0.5 (0.52, 0.5, 0.5): -3.8 %; then 0.5, 0.5: settled at 9
    assert r.ran == 9 and r.settled and r.change == 0.0 and r.iterations == 4
    assert r.time_s.median == pytest.approx(0.5) and r.time_s.max == pytest.approx(0.52)  # the slow ones are not in it


def test_a_calibration_that_never_settles_stops_at_its_cap_and_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    lines: list[str] = []
    monkeypatch.setattr("envpipe.runtime.phases.calibrate.progress", lines.append)
    rig = _CountingRig()
    rig.cfg = EnvPipeConfig(calibration_max_iterations=8)
    calibrated, _ = _calibrate(rig, [1.0 - 0.05 * i for i in range(8)])
    r = calibrated.report
    assert r.ran == 8 and r.settled is False and r.change == pytest.approx(0.7 / 0.75 - 1)  # medians of three
    assert any("still moved -6.7 % after 8 iterations: the predictions are flagged" in x for x in lines), lines
    few = _CountingRig()
    few.cfg = EnvPipeConfig(calibration_iterations=2)  # a fixed count: too few to tell
    r = _calibrate(few, [1.0, 1.0])[0].report
    assert (r.ran, r.iterations, r.settled, r.change) == (2, 1, None, None)


def test_median_change() -> None:
    assert median_change([1.0, 1.0, 1.0]) is None  # three: nothing to compare yet
    assert median_change([2.0, 1.0, 1.0, 1.0]) == 0.0  # one slow first iteration does not move the median
    assert median_change([1.3, 1.2, 1.1, 1.0]) == pytest.approx(1.1 / 1.2 - 1)


def test_waits_charged_at_the_blocked_power_move_the_rest_to_the_work() -> None:
    """A 100 ms counter charges a few-ms bubble at about the iteration's mean power; charged at the power measured
    blocked in a collective, the surplus goes to the units and the tail in proportion, the total unchanged."""
    # 4 forwards of 5 J and 4 backwards of 10 J; waits 30 J in 60 ms (500 W); tail 10 J in 20 ms
    split = EnergySplit(5.0, 10.0, 60.0, 30.0, 0.06, 10.0, 0.02)
    charged = split.charging_waits_at(150.0)
    assert charged.wait_j == pytest.approx(9.0) and charged.wait_s == 0.06  # 150 W x 60 ms
    k = (70.0 + 30.0 - 9.0) / 70.0  # 1.3: the work takes the 21 J the waits gave up
    assert (charged.fwd_j, charged.bwd_j, charged.units_j, charged.tail_j) == pytest.approx(
        (5.0 * k, 10.0 * k, 60.0 * k, 10.0 * k))
    assert charged.units_j + charged.wait_j + charged.tail_j == pytest.approx(100.0)
    assert charged.tail_s == 0.02
    # a blocked power above the split's wait power takes from the work; never below zero
    assert split.charging_waits_at(1e6).units_j == 0.0
    assert EnergySplit(None, None, 0.0, 1.0, 0.1, 0.0, 0.0).charging_waits_at(5.0).wait_j == 1.0  # no work: as it is


_BLOCKED_RANK = """
import sys, threading, time, types
import torch, torch.distributed as tdist
from envpipe.energy.meter import PolledMeter
from envpipe.runtime.phases.calibrate import _blocked_power

class Counter:
    # 300 W while this rank waits in the collective, 50 W otherwise
    def __init__(self):
        self.t, self.j, self.waiting, self.lock = time.perf_counter(), 0.0, False, threading.Lock()
    def read(self):
        with self.lock:
            now = time.perf_counter()
            self.j += (now - self.t) * (300.0 if self.waiting else 50.0)
            self.t = now
            return self.j
    def set(self, waiting):
        self.read()
        self.waiting = waiting

class Rig:
    def __init__(self, counter):
        self.counter, self.meter = counter, PolledMeter(counter.read, period_s=0.002)
        self.place = types.SimpleNamespace(rank=tdist.get_rank())
    def gather(self, mine):
        everyone = [None] * tdist.get_world_size()
        tdist.all_gather_object(everyone, mine)
        return [(None, x) for x in everyone]
    def wait_in_collective(self):
        self.counter.set(True)
        tdist.all_reduce(torch.zeros(1))
        self.counter.set(False)

tdist.init_process_group("gloo")
rig = Rig(Counter())
meter = rig.meter
if tdist.get_rank() == int(sys.argv[1]):  # this rank has no energy counter
    rig.meter = None
print("blocked", _blocked_power(rig))
meter.close()
tdist.destroy_process_group()
"""


def _blocked_powers(tmp_path: Path, without_counter: int = -1) -> list[float | None]:
    """Each rank's `_blocked_power` in a real two-process gloo job (rank ``without_counter`` has no counter)."""
    import os
    import subprocess
    import sys

    from tests.support.ports import free_port

    script = tmp_path / "rank.py"
    script.write_text(_BLOCKED_RANK)
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "WORLD_SIZE": "2",
           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())}
    procs = [subprocess.Popen([sys.executable, str(script), str(without_counter)], env={**env, "RANK": str(r)},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    outs = [p.communicate(timeout=120) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=True):
        assert p.returncode == 0, err[-3000:]
    words = [out.split("blocked", 1)[1].strip() for out, _ in outs]
    return [None if w == "None" else float(w) for w in words]


def test_blocked_power_is_read_while_the_rank_waits_for_the_one_holding_back(tmp_path: Path) -> None:
    """Two real gloo processes: rank 0 holds back while rank 1 waits, then rank 1 while rank 0 waits; each rank's
    blocked power comes from its own wait (300 W on its counter), never from its hold (50 W)."""
    assert _blocked_powers(tmp_path) == [pytest.approx(300.0, rel=0.05)] * 2


def test_no_rank_waits_for_a_blocked_power_when_one_has_no_counter(tmp_path: Path) -> None:
    """A rank without an energy counter cannot hold the others in a collective it never joins: every rank agrees
    first, and none measures (no hang, no half-measured job)."""
    assert _blocked_powers(tmp_path, without_counter=1) == [None, None]


def test_a_stage_is_charged_its_replicas_mean_blocked_power_else_its_waits() -> None:
    """Stage 0's two replicas measured 120 and 130 W blocked: 125 W, whatever their interpolated waits said; stage 1
    measured none (a simulated GPU's exact counter): its waits' own power, 40 J over 0.2 s."""
    from envpipe.runtime.phases.calibrate import _phase_powers

    class TwoStages:
        P = 2

        def gather(self, mine: object) -> list[tuple[Place, object]]:
            split = (50.0, 0.1, 5.0, 0.02)  # wait J, wait s, tail J, tail s
            return [(Place(0, 0, 0, "h", 0), (split, 120.0)), (Place(1, 0, 1, "h", 0), (split, 130.0)),
                    (Place(2, 1, 0, "h", 0), ((40.0, 0.2, 6.0, 0.03), None))]

    blocking, tail, per_rank = _phase_powers(TwoStages(), [], None, 70.0)  # type: ignore[arg-type]
    assert blocking == pytest.approx([125.0, 200.0])
    assert per_rank == [120.0, 130.0, None]  # kept per rank: each rank charges its own waits at its own
    assert tail == pytest.approx([10.0 / 0.04, 200.0])
