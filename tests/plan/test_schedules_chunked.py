"""Interleaved 1F1B (Megatron's order) and DualPipeV (DeepSpeed's DualPipeVSchedule): orders, DAGs, the
tutorial's idle shares, memory, plans and the optimal planner on them."""

from __future__ import annotations

import importlib.util
import json
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from envpipe.cli import main
from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import evaluate_plan
from envpipe.plan.instances import BLOCKING_POWER_W, cut_down, real_profile
from envpipe.plan.layout import StageLayout, model_profile
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.optimal.milp import solve_milp
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.optimal.problem import order_problems
from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.planner import make_plan
from envpipe.plan.schedules import build_schedule, dualpipev, interleaved_1f1b, schedule_layout
from envpipe.plan.simulate import Overheads, simulate
from envpipe.profile import Profile, embedded_profile_path


def fmt(order):
    return " ".join(f"{k}{m}.{c}" for k, m, c in order)


def test_interleaved_p2_m4_v2_follows_megatron():
    # rank 0 warms up 2(P-1) + (v-1)P = 4 forwards, rank 1 2; forwards go chunk 0 then 1 per group of P
    assert [fmt(o) for o in interleaved_1f1b(2, 4, 2)] == [
        "F0.0 F1.0 F0.1 F1.1 F2.0 B0.1 F3.0 B1.1 F2.1 B0.0 F3.1 B1.0 B2.1 B3.1 B2.0 B3.0",
        "F0.0 F1.0 F0.1 B0.1 F1.1 B1.1 F2.0 B0.0 F3.0 B1.0 F2.1 B2.1 F3.1 B3.1 B2.0 B3.0",
    ]
    with pytest.raises(ValueError, match="multiple of the stages"):
        interleaved_1f1b(4, 6, 2)
    with pytest.raises(ValueError, match="at least 2 x 4 micro-batches"):
        dualpipev(4, 7)
    with pytest.raises(ValueError, match="has 2 chunk"):
        build_schedule("dualpipev", 4, 8, chunks=3)


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="deepspeed is not installed")
@pytest.mark.parametrize(("stages", "micro"), [(1, 2), (2, 4), (2, 7), (3, 6), (4, 8), (4, 13), (8, 16)])
def test_dualpipev_equals_installed_deepspeed_dualpipevschedule(stages, micro):
    from deepspeed.runtime.pipe import schedule as ds

    ours = dualpipev(stages, micro)
    for s in range(stages):
        order = []
        for cmds in ds.DualPipeVSchedule(micro_batches=micro, stages=stages, stage_id=s).steps():
            for c in cmds:
                if isinstance(c, ds.ForwardPass | ds.BackwardPass):  # buffer = phase * M + micro-batch
                    order.append(("F" if isinstance(c, ds.ForwardPass) else "B", c.buffer_id - c.phase * micro,
                                  c.phase))
        assert order == ours[s], f"stage {s}"


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 6), st.integers(1, 5), st.integers(2, 4), st.sampled_from(["interleaved", "dualpipev"]),
       st.randoms(use_true_random=False))
def test_chunked_orders_run_every_unit_once_and_respect_dependencies(stages, groups, chunks, name, rnd):
    M = stages * groups if name == "interleaved" else 2 * stages + groups - 1
    layout = schedule_layout(name, stages, chunks if name == "interleaved" else None)
    orders = build_schedule(name, stages, M, chunks=layout.chunks)
    dag = PipelineDag.from_orders(orders, M, layout)  # each unit once, no deadlock (else ScheduleError)
    dur = np.array([rnd.uniform(0.5, 2.0) for _ in range(dag.num_units)])
    tl = simulate(dag, dur, np.zeros(dag.num_units), Overheads.broadcast(stages, 0.0, 0.1))
    N = dag.num_units
    has_data = dag.pred_data != N
    lag = np.where(dag.data_crosses, 0.1, 0.0)
    assert np.all(tl.start[has_data] >= tl.end[dag.pred_data[has_data]] + lag[has_data] - 1e-9)
    same = dag.pred_same != N
    assert np.all(tl.start[same] >= tl.end[dag.pred_same[same]] - 1e-9)
    # every model stage's forward runs before its backward, on the stage that owns it
    for ids in dag.order:
        seen = set()
        for i in ids:
            key = (int(dag.mb[i]), int(dag.chunk[i]))
            assert dag.is_fwd[i] == (key not in seen)
            seen.add(key)


def chunked(prof: Profile, microbatches: int, watts: float, schedule: str, chunks: int | None) -> PipelineCase:
    """A case of ``schedule``'s layout, ``prof`` with a row per pipeline stage (split evenly over its chunks)."""
    layout = schedule_layout(schedule, prof.num_stages, chunks)
    return replace(PipelineCase.of(prof, microbatches, watts), layout=layout)


def uniform(stages: int, fwd: float, bwd: float) -> Profile:
    """Identical stages at one clock: the setting of the tutorial's bubble formulas."""
    one = np.ones((stages, 1))
    return Profile(np.array([1000]), fwd * one, bwd * one, fwd * one, bwd * one)


@pytest.mark.parametrize(("P", "M"), [(2, 4), (4, 8), (4, 16), (8, 8)])
@pytest.mark.parametrize("bwd", [1.0, 2.0])
def test_idle_shares_of_the_tutorial(P, M, bwd):
    """GPipe and 1F1B idle (P-1)/(M+P-1) of the time, interleaving with v chunks (P-1)/(vM+P-1)."""
    prof = uniform(P, 1.0, bwd)

    def idle_share(schedule: str, chunks: int | None = None) -> float:
        tl = make_plan(chunked(prof, M, 1.0, schedule, chunks), schedule, "baseline").timeline
        return float(tl.idle_time.sum() / (P * tl.iteration_time))

    assert idle_share("gpipe") == pytest.approx((P - 1) / (M + P - 1))
    assert idle_share("1f1b") == pytest.approx((P - 1) / (M + P - 1))
    for v in (2, 3):
        assert idle_share("interleaved", v) == pytest.approx((P - 1) / (v * M + P - 1))
    if M >= 2 * P:
        assert idle_share("dualpipev") < idle_share("1f1b")


def test_peak_in_flight_of_the_chunked_orders():
    P, M, v = 4, 8, 2
    warmup = [min(M * v, 2 * (P - s - 1) + (v - 1) * P) for s in range(P)]
    assert peak_in_flight(interleaved_1f1b(P, M, v)) == [min(M * v, w + 1) for w in warmup]
    assert peak_in_flight(dualpipev(P, 12)) == [2 * P + 1] * P  # chunk micro-batches: half a stage's each


def test_model_profile_splits_stages_evenly_or_takes_one_row_per_chunk(gpt3):
    prof = gpt3.with_stages(3)
    split = model_profile(prof, StageLayout.v_shape(3))
    assert split.num_stages == 6
    assert np.allclose(split.fwd_time[[0, 5]], prof.fwd_time[[0, 0]] / 2)  # rank 0 runs model stages 0 and 5
    assert model_profile(gpt3.with_stages(6), StageLayout.v_shape(3)).fwd_time[5] == pytest.approx(gpt3.fwd_time[5])
    with pytest.raises(ValueError, match=r"needs 3 \(split evenly\) or 6"):
        model_profile(gpt3.with_stages(4), StageLayout.v_shape(3))


@pytest.mark.parametrize(("schedule", "chunks"), [("interleaved", 2),
                                                  pytest.param("dualpipev", None, marks=pytest.mark.slow)])
def test_chunked_plans_round_trip_and_resimulate(schedule, chunks, tmp_path):
    prof = cut_down(real_profile("gpt3-175b+a100_sxm_bf16"), [0, 3, 5, 7], list(range(0, 38, 6)))
    case = chunked(prof, 8, 83.64, schedule, chunks)
    res = optimal_plan(case, schedule)
    assert res.budget_s is not None and res.timeline.iteration_time <= res.budget_s * (1 + 1e-12)
    assert res.timeline.energy < res.baseline.energy  # saves energy at no slowdown
    path = tmp_path / "plan.json"
    res.plan.save(path)
    data = json.loads(path.read_text())
    assert data["chunks"] == 2 and {"kind", "mb", "freq_mhz", "chunk"} == set(data["stages"][0][0])
    again = Plan.load(path)
    assert evaluate_plan(again, case).energy == pytest.approx(res.timeline.energy, rel=1e-12)
    with pytest.raises(PlanError, match="2 chunks per stage"):
        again.orders()
    del data["stages"][0][0]["chunk"]
    with pytest.raises(PlanError, match="stage 0 unit 0"):
        Plan.from_json(data)


@pytest.mark.parametrize(("schedule", "chunks"), [("interleaved", 2), ("dualpipev", None)])
def test_chunked_optimal_plans_are_near_the_milp(schedule, chunks):
    name = "bloom+a40_bf16"
    prof = cut_down(real_profile(name), [0, 7], [0, 8, 16, 24, 31])
    watts = BLOCKING_POWER_W[name]
    case = chunked(prof, 4, watts, schedule, chunks)
    res = optimal_plan(case, schedule, max_slowdown=0.02)
    _, [(_, problem)] = order_problems(case, schedule)
    assert res.budget_s is not None
    option, _ = solve_milp(problem.menus, problem.edges, res.budget_s)
    exact = problem.simulate(option).energy
    base = res.baseline.energy
    assert res.timeline.energy <= exact + 0.005 * (base - exact)
    assert res.bound_j is not None and res.bound_j <= exact * (1 + 1e-7)


def test_cli_plans_and_simulates_dualpipev(tmp_path):
    profile, out = str(embedded_profile_path()), tmp_path / "dv.json"
    runner = CliRunner()
    base = ["--profile", profile, "--stages", "4", "--gpu", "a100"]
    res = runner.invoke(main, ["plan", *base, "-m", "8", "--schedule", "dualpipev", "--policy", "optimal",
                               "--out", str(out), "--text", "--activation-bytes", "1GiB", "--memory-available", "5GiB"])
    assert res.exit_code == 0, res.output
    assert "Stage 0 | [F0.0 " in res.output and "peak activation memory per stage (GiB): 4.50" in res.output
    claimed = json.loads(out.read_text())["predicted"]
    sim = runner.invoke(main, ["simulate", *base, "--plan", str(out)])
    assert sim.exit_code == 0 and f"{claimed['energy_j']:.1f} J" in sim.output, sim.output
    for extra, message in [(["--schedule", "dualpipev", "-m", "6", "--policy", "baseline"], "at least 2 x 4"),
                           (["--schedule", "1f1b", "--chunks", "2", "-m", "8"], "--chunks applies to"),
                           (["--schedule", "interleaved", "-m", "8", "--policy", "envelope"], "needs one model stage")]:
        res = runner.invoke(main, ["plan", *base, *extra])
        assert res.exit_code != 0 and message in res.output, res.output
