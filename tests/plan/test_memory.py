"""Activation memory in bytes: peak in-flight counts of orders, the limits they must fit, and the plans."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.plan.case import PipelineCase
from envpipe.plan.memory import MemoryLimitError, StageMemory, parse_bytes, peak_in_flight, warmup_caps
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.planner import make_plan
from envpipe.plan.schedules import envpipe_schedule, gpipe, one_f_one_b
from envpipe.profile import embedded_profile_path

GiB = 2**30


@pytest.mark.parametrize(("text", "value"), [("4096", 4096), ("1.5GiB", 3 * 2**29), ("80G", 80 * 10**9),
                                             ("512 MiB", 512 * 2**20), ("2kB", 2000), ("3Ti", 3 * 2**40)])
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "-5", "1.5 GB/s", "lots", "1e9"])
def test_parse_bytes_refuses_non_amounts(text):
    with pytest.raises(ValueError, match="not an amount of bytes"):
        parse_bytes(text)


def test_peak_in_flight_of_the_classic_orders():
    P, M = 4, 8
    assert peak_in_flight(one_f_one_b(P, M)) == [4, 3, 2, 1]  # P - s
    assert peak_in_flight(one_f_one_b(P, 2)) == [2, 2, 2, 1]  # at most M
    assert peak_in_flight(envpipe_schedule(P, M, [3, 2, 1, 0])) == [7, 5, 3, 1]  # P - s + r_s
    assert peak_in_flight(gpipe(P, M)) == [M] * P


def test_stage_memory_checks_and_reports_bytes():
    mem = StageMemory.per_stage(4, GiB, [4 * GiB, 3 * GiB, 5 * GiB, GiB])
    assert mem.capacity() == [4, 3, 5, 1]
    assert warmup_caps(mem, 4) == [0, 0, 3, 0]
    assert mem.check(one_f_one_b(4, 8), "1f1b") == [4 * GiB, 3 * GiB, 2 * GiB, GiB]
    with pytest.raises(MemoryLimitError, match=r"stage 0: the gpipe order holds 8 micro-batches of activations in "
                                               r"flight, 8589934592 B \(8.00 GiB\), more than the 4294967296 B"):
        mem.check(gpipe(4, 8), "gpipe")
    # two chunks per stage: each (chunk, micro-batch) holds half a stage's bytes; checked exactly
    halves = StageMemory.per_stage(1, 3, 4)
    assert halves.check([[("F", 0, 0), ("F", 0, 1), ("B", 0, 1), ("B", 0, 0)]], "two-chunk", chunks=2) == [3]
    with pytest.raises(MemoryLimitError, match="3 chunk micro-batches"):
        halves.check([[("F", 0, 0), ("F", 0, 1), ("F", 1, 0)]], "two-chunk", chunks=2)


@pytest.mark.parametrize(("args", "message"), [
    (((1, 2), (3,)), "2 activation sizes but 1 memory limits"),
    (((0,), (3,)), "must be positive"),
    (((1,), (-3,)), "whole numbers >= 0"),
    (((1.5,), (3,)), "whole numbers >= 0"),
])
def test_stage_memory_refuses_bad_values(args, message):
    with pytest.raises(ValueError, match=message):
        StageMemory(*args)
    with pytest.raises(ValueError, match="3 memory limits given for 2 stages"):
        StageMemory.per_stage(2, 1, [1, 2, 3])


def test_envpipe_warmup_is_capped_by_bytes_and_the_plan_reports_peaks(gpt3):
    case = PipelineCase.of(gpt3.with_stages(4), 12, 83.64)
    free = make_plan(case)
    assert free.plan.peak_memory_bytes is None and max(free.reschedule) > 1  # unconstrained: several extra
    act = [2 * GiB, GiB, GiB, GiB]
    mem = StageMemory.per_stage(4, act, [10 * GiB, 4 * GiB, 5 * GiB, GiB])  # room for 5, 4, 5, 1 micro-batches
    capped = make_plan(replace(case, memory=mem))
    peaks = peak_in_flight(envpipe_schedule(4, 12, capped.reschedule))
    assert all(p <= c for p, c in zip(peaks, mem.capacity(), strict=True))
    assert capped.reschedule[1] == 1 and capped.reschedule[0] <= 1  # stage 1 has room for one extra only
    assert capped.plan.peak_memory_bytes == [p * a for p, a in zip(peaks, act, strict=True)]
    with pytest.raises(MemoryLimitError, match="stage 0: the 1f1b order holds 4 micro-batches"):
        make_plan(replace(case, memory=StageMemory.per_stage(4, GiB, 3 * GiB)), "1f1b")


def test_optimal_planner_tries_only_orders_that_fit_and_saves_peaks(gpt3, tmp_path):
    pytest.importorskip("scipy")
    mem = StageMemory.per_stage(4, GiB, 5 * GiB)
    case = replace(PipelineCase.of(gpt3.with_stages(4).restricted(gpt3.freqs[::6]), 8, 83.64), memory=mem)
    res = optimal_plan(case, "envpipe")
    for r, _ in res.tried:
        assert all(p <= 5 for p in peak_in_flight(envpipe_schedule(4, 8, r)))
    peaks = res.plan.peak_memory_bytes
    assert peaks == [p * GiB for p in peak_in_flight(envpipe_schedule(4, 8, res.reschedule))]
    path = tmp_path / "plan.json"
    res.plan.save(path)
    data = json.loads(path.read_text())
    assert data["version"] == 1 and data["predicted"]["peak_memory_bytes"] == peaks
    assert Plan.load(path).peak_memory_bytes == peaks
    data["predicted"]["peak_memory_bytes"] = [1, 2]
    with pytest.raises(PlanError, match="list of 4 whole numbers"):
        Plan.from_json(data)
    with pytest.raises(MemoryLimitError, match="stage 0"):
        optimal_plan(case, "gpipe")


def test_cli_memory_options(tmp_path):
    profile = str(embedded_profile_path())
    out = tmp_path / "plan.json"
    base = ["plan", "--profile", profile, "-m", "12", "--gpu", "a100", "--out", str(out)]
    res = CliRunner().invoke(main, [*base, "--activation-bytes", "1GiB", "--memory-available", "9GiB"])
    assert res.exit_code == 0, res.output
    assert "peak activation memory per stage (GiB): " in res.output
    peaks = json.loads(out.read_text())["predicted"]["peak_memory_bytes"]
    assert len(peaks) == 8 and max(peaks) <= 9 * GiB
    out.unlink()
    for extra, message in [(["--activation-bytes", "1GiB"], "go together"),
                           (["--activation-bytes", "x", "--memory-available", "1"], "not an amount of bytes"),
                           (["--activation-bytes", "1,2", "--memory-available", "9"], "2 activation sizes given"),
                           (["--activation-bytes", "1GiB", "--memory-available", "6GiB", "--policy", "optimal"],
                            "stage 0: the envpipe order holds 8 micro-batches")]:
        res = CliRunner().invoke(main, [*base, *extra])
        assert res.exit_code != 0 and message in res.output, res.output
        assert "Traceback" not in res.output and not out.exists()
