"""The clock problem of one unit order: its DAG, menus, edges and fold (the LP's periodic middle), and the
candidate orders of a schedule."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from envpipe.limits import MAX_LP_UNITS
from envpipe.plan.case import PipelineCase
from envpipe.plan.dag import PipelineDag
from envpipe.plan.evaluate import baseline_timeline
from envpipe.plan.memory import warmup_caps
from envpipe.plan.optimal.fold import Fold, periodic_fold
from envpipe.plan.optimal.lp import Edges, dag_edges
from envpipe.plan.optimal.menus import UnitMenus, unit_menus
from envpipe.plan.policies import valley_clocks
from envpipe.plan.schedules import CHUNKED, build_schedule, check_schedule, reschedule_counts
from envpipe.plan.simulate import Overheads, Timeline, resimulate, simulate

# steady micro-batches kept unfolded after the warm-up and before the cool-down, beyond the number of stages:
# the transient lasts about a pipeline's length; measured: the folded LP then matches the full one
_FOLD_MARGIN = 2
# ... but at most this many: with 64 stages a margin of 66 made the LP 3-4 times larger for 0.011 points of
# saving (GPT-3/A100 tiled, 64 x 1,024, measured 2026-11-28: benchmarks/results/planner_scale.md)
_MAX_FOLD_MARGIN = 32
# micro-batches per folded period (a multiple of the schedule's own period): one would do for the LP value,
# but its single representative is fractional in every copy, which rounding then loses; with 16 the LP's
# vertex mixes clocks inside the period instead (measured on the four real profiles at M = 96: at most
# 0.04 points of saving below the full LP's plan, against up to 0.7 with one)
_FOLD_PERIOD = 16


class PlanTooLarge(ValueError):
    """An order's LP is beyond the planner's limit (envpipe.limits.MAX_LP_UNITS)."""


@dataclass(frozen=True)
class Successors:
    """Each unit's successors in the DAG and the lag on its edges (N: none): what the latest schedule and the
    free float walk forwards."""

    same: np.ndarray  # (N,) next unit on the stage
    data: np.ndarray  # (N,) the unit that needs this one's output
    lag_in: np.ndarray  # (N,) lag on the edge pred_data[u] -> u
    lag_out: np.ndarray  # (N + 1,) lag on the edge u -> data[u]


@dataclass(frozen=True, eq=False)
class ClockProblem:
    """One fixed unit order with its menus: everything a budget sweep reuses."""

    dag: PipelineDag
    menus: UnitMenus
    edges: Edges
    overheads: Overheads
    freqs: np.ndarray  # the profile's clocks (MHz), indexed like the menus' clock indices
    fold: Fold  # the periodic fold the LP is solved on (envpipe.plan.optimal.fold)
    peak_memory_bytes: list[int] | None = None  # per stage, when the order was checked against a memory model

    @property
    def tail(self) -> np.ndarray:
        """(S,) per-stage tail after the last unit (seconds)."""
        return self.edges.tail

    @cached_property
    def successors(self) -> Successors:
        dag = self.dag
        N = dag.num_units
        succ_same = np.full(N, N)
        has = dag.pred_same != N
        succ_same[dag.pred_same[has]] = np.flatnonzero(has)
        succ_data = np.full(N, N)
        has = dag.pred_data != N
        succ_data[dag.pred_data[has]] = np.flatnonzero(has)
        lag_in = np.where(dag.data_crosses, self.overheads.transfer_s, 0.0)
        lag_out = np.zeros(N + 1)
        lag_out[:N][dag.pred_data[has]] = lag_in[has]
        return Successors(succ_same, succ_data, lag_in, lag_out)

    def simulate(self, option: np.ndarray, previous: Timeline | None = None,
                 changed: np.ndarray | None = None) -> Timeline:
        """The timeline of ``option``; with ``previous`` (another option's) and the units whose option differs
        from it, only the levels from the earliest changed unit on are recomputed."""
        _, dur, energy = self.menus.pick(option)
        if previous is None or changed is None:
            return simulate(self.dag, dur, energy, self.overheads)
        return resimulate(previous, dur, energy, changed)

    def end_caps(self, budget_s: float) -> np.ndarray:
        """(N,) latest end of each unit within the budget: its stage's tail must still fit after it."""
        return budget_s - self.tail[self.dag.stage]

    def freqs_mhz(self, option: np.ndarray) -> np.ndarray:
        return self.freqs[self.menus.pick(option)[0]]

    def fastest_time(self) -> float:
        return self.simulate(np.zeros(self.dag.num_units, int)).iteration_time

    def cheapest_option(self) -> np.ndarray:
        return self.menus.size - 1

    def fit(self, limit: np.ndarray) -> np.ndarray:
        """Per unit, the slowest (so cheapest) option whose time is at most ``limit``."""
        fits = (self.menus.time <= limit[:, None] * (1 + 1e-12)).sum(axis=1) - 1
        return np.maximum(fits, 0)

def candidate_orders(case: PipelineCase, schedule: str) -> list[list[int]]:
    """Warm-up counts to try: EnvPipe's r_s from the valley clocks of its envelope policy and of its uniform
    policy (they differ when the last stage's valley matters), and plain 1F1B (all 0); no duplicates. The case's
    memory caps r_s so that every stage's in-flight activations fit. Other schedules: their own order only."""
    S, M = case.num_stages, case.num_microbatches
    if schedule != "envpipe":
        return [[0] * S]
    profile = case.profile
    freqs = [int(f) for f in profile.freqs]
    caps = None if case.memory is None else warmup_caps(case.memory, S)
    # the valley sweep sees the unit and transfer times only, not the tails: r_s is a rule on unit times
    untailed = replace(case, overheads=replace(case.overheads, tail_s=np.zeros(S)))
    orders: list[list[int]] = []
    for sweep_last_stage in (False, True):
        valley = valley_clocks(untailed, freqs, sweep_last_stage)
        fwd_opt = [profile.fwd_time[s, profile.freq_index(valley[s])] for s in range(S)]
        r = reschedule_counts(list(profile.bwd_time[:, 0]), fwd_opt, M, caps)
        if any(r) and r not in orders:
            orders.append(r)
    return [*orders, [0] * S]


def build_problem(case: PipelineCase, schedule: str, reschedule: list[int]) -> ClockProblem:
    """The clock problem of one order; with the case's memory the order must fit (MemoryLimitError otherwise)."""
    layout, M = case.layout, case.num_microbatches
    check_schedule(schedule, layout)
    chunks = layout.chunks if schedule in CHUNKED else None
    orders = build_schedule(schedule, layout.num_stages, M, reschedule, chunks)
    peak = None if case.memory is None else case.memory.check(orders, schedule, layout.chunks)
    dag = PipelineDag.from_orders(orders, M, layout)
    period = layout.num_stages if schedule == "interleaved" else 1  # its chunks cycle through groups of P
    # ``period`` micro-batches after which the middle repeats; stages may drift apart through it in orders with
    # extra warm-up forwards (envpipe.plan.optimal.fold)
    margin = min(dag.num_stages + _FOLD_MARGIN, _MAX_FOLD_MARGIN)
    fold = periodic_fold(dag, period * -(-_FOLD_PERIOD // period), margin, any(reschedule))
    if fold.size > MAX_LP_UNITS:
        raise PlanTooLarge(f"{layout.num_stages} stages x {M} micro-batches: the optimal planner's LP would have "
                           f"{fold.size:,} units (those of the warm-up, the cool-down and up to {margin} micro-batches "
                           f"around them, which do not repeat); it takes at most {MAX_LP_UNITS:,}: plan fewer "
                           "stages (64 take any number of micro-batches), or use EnvPipe's --policy envelope")
    o = case.overheads
    return ClockProblem(dag, unit_menus(dag, case.model_profile, o), dag_edges(dag, o.transfer_s, o.tail_s), o,
                        case.profile.freqs, fold, peak)


def order_problems(case: PipelineCase, schedule: str) -> tuple[Timeline, list[tuple[list[int], ClockProblem]]]:
    """The baseline and a clock problem per candidate order of ``schedule`` on the case."""
    check_schedule(schedule, case.layout)
    baseline = baseline_timeline(case)
    return baseline, [(r, build_problem(case, schedule, r)) for r in candidate_orders(case, schedule)]

