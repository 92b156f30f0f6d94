"""Read a run's summary.json the way every reader must: validated against the JSON Schema in the repo,
then as the typed `RunSummary`."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import jsonschema

from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import envpipe_schedule
from envpipe.profile import embedded_profile_path, load_profile
from envpipe.profile.from_measured import StageUnits
from envpipe.runtime import summary as S
from envpipe.runtime.decision import CalibrationResult, Decided, Decision, Origin
from envpipe.runtime.measure.replicas import StageStats
from envpipe.runtime.measure.timing import SimInputs
from envpipe.runtime.summary import SCHEMA_PATH, RunSummary


def read_summary(report_dir: Path) -> RunSummary:
    data = json.loads((Path(report_dir) / "summary.json").read_text())
    jsonschema.validate(data, json.loads(SCHEMA_PATH.read_text()))
    return RunSummary.from_json(data)


def iterations(report_dir: Path, rank: int) -> list[dict]:
    """A rank's per-iteration JSON lines."""
    return [json.loads(x) for x in (Path(report_dir) / f"iterations.rank{rank}.jsonl").read_text().splitlines()]


def sample_summary(time_s: float = 0.2, energy_j: float | None = 50.0, predicted_s: float | None = 0.24,
                   engine: str = "envpipe", data_parallel: int = 2, stages: int = 2) -> S.RunSummary:
    """A small, valid summary for readers' tests (one steady iteration; numbers as given)."""
    spread = S.Spread.of([time_s])
    assert spread is not None
    gpus = data_parallel * stages
    tails = [S.StageTail(s, [0.01, 0.02], [0.03, 0.04], 0.03) for s in range(stages)]
    job = S.JobSummary(data_parallel, gpus, [S.NodeSummary(0, "host", list(range(gpus)), energy_j)],
                       [S.ReplicaSummary(d, time_s, time_s, None, False) for d in range(data_parallel)],
                       None, None, 0.05, None, tails, True, ["d"] * gpus)
    return S.RunSummary(
        S.SCHEMA_VERSION, engine, stages, 8, data_parallel, 32, S.ClockInfo("nvml", False, "measured (NVML counter)",
                                                                          "measured (wall clock)", None, []),
        None, S.Iterations(spread, S.Spread.of([energy_j]) if energy_j is not None else None, 32 / time_s), None,
        None, None, predicted_s, None if predicted_s is None else (predicted_s - time_s) / time_s, None, None,
        [S.GpuSummary(r, r % data_parallel, r // data_parallel, "host", None, None, None) for r in range(gpus)], job,
        [[S.MeasuredUnit("F", 0, 0.01 * s, 0.01 * s + 0.02, 1410), S.MeasuredUnit("B", 0, 0.05, 0.09, 1200)]
         for s in range(stages)])


def sample_calibrated(P: int = 2) -> CalibrationResult:
    """A calibration of ``P`` stages without a memory limit (CPU), with measured powers."""
    cal = SimInputs([0.01] * P, [0.02] * P, [0.0] * P, 0.001, [0.005] * P, 0.0)
    spread = S.Spread.of([0.2])
    assert spread is not None
    report = S.Calibration(1, spread, cal.fwd_s, cal.bwd_s, cal.gap_s, cal.transfer_s, cal.tail_s, cal.head_s,
                           [None] * P, 80.0, [90.0] * P, [200.0] * P)
    memory = [S.MemoryUse(1024, 2048, None, None, None, P - s) for s in range(P)]
    energies = [StageStats(StageUnits(0.01, 0.02, 2.0, float("nan")), 0.0, 0.0) for _ in range(P)]
    return CalibrationResult(cal, report, memory, energies, None, 80.0, [90.0] * P, [200.0] * P)


def sample_decided() -> Decided:
    """What a 2-stage, 2-replica job decided (the planner on a profile), for checkpoint tests."""
    profile = load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))
    sub = type(profile)(profile.freqs, profile.fwd_time[:2], profile.bwd_time[:2], profile.fwd_energy[:2],
                        profile.bwd_energy[:2], "two stages")
    plan = Plan.at_one_clock(envpipe_schedule(2, 4, [1, 0]), 1410, "envpipe", "optimal")
    decision = Decision(Origin.PLANNER, "planner", "optimal", "envpipe", {0: plan, 1: plan}, True, 1.0,
                        predicted_time_s=0.2, profile=sub)
    calibrated = replace(sample_calibrated(), waiting_power_w=[121.0, None, 126.0, 119.0])
    return Decided(calibrated, decision, None)
