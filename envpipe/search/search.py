"""The configuration search: every shape, its best stage cut, the optimal clock plan of the promising ones.

1. Shapes (space.py): P x D = the GPUs, micro-batch size b from the profile, M = global batch / (D b).
2. Per shape, the cut (cut.py): the layers into P contiguous stages with the smallest bottleneck unit time
   (per layer the slower of host and device, timing.layer_weight) among the cuts whose every stage fits in
   the device's memory less the margin with the micro-batches 1F1B keeps in flight there (memory.py).
   Shapes with no such cut are *infeasible* and never returned.
3. Per feasible shape, the pipeline (evaluate.py): stage profile, transfer, tails, memory, and the
   simulator's 1F1B all-max baseline (cheap).
4. Only then the optimal planner (the expensive step), on as few pipelines as the objective allows (and
   only on iterations of at most ``max_plan_units`` units; larger ones keep their 1F1B all-max plan):
   - throughput: the k fastest baselines (the planner never makes an iteration longer than its budget,
     the baseline's time), the others are pruned;
   - energy (at a throughput floor): pipelines too slow for the floor are dropped; the others are planned
     in order of an energy lower bound (evaluate.Pipeline.energy_lower_bound_j) with the floor's time as
     budget, and planning stops once the bound reaches the k-th best energy found (branch and bound);
   - frontier: in order of time; a pipeline is pruned when a planned one is at least as fast with at
     most its lower bound of energy (it can only be dominated); the planned ones that no other beats in
     both time and energy form the frontier.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import one_f_one_b
from envpipe.search.band import HostBand, host_band, undecided
from envpipe.search.cluster import GIB
from envpipe.search.cut import bottleneck_cut, segment_sums
from envpipe.search.evaluate import Candidate, Pipeline, build_pipeline, plan_pipeline, stage_overheads
from envpipe.search.inputs import SearchInputs
from envpipe.search.memory import MemoryTables
from envpipe.search.space import MAX_PLAN_UNITS, OBJECTIVES, SearchError, Shape, shapes
from envpipe.search.timing import layer_weight

Progress = Callable[[int, int, str], None]  # (done, total, what)
Planner = Callable[[Pipeline, float | None], Candidate]  # (pipeline, time budget or None) -> planned


@dataclass(frozen=True)
class SearchOptions:
    """``top_k``: how many configurations to return. ``max_plan_units``: configurations with more forward and
    backward units per iteration are not given to the optimal planner; their 1F1B all-max baseline stands in
    (marked "not planned"). None: no limit."""

    top_k: int = 5
    max_plan_units: int | None = MAX_PLAN_UNITS
    progress: Progress | None = None


@dataclass(frozen=True)
class Objective:
    kind: str = "throughput"
    min_throughput: float | None = None  # energy: samples/s the configuration must reach
    max_slowdown: float | None = None  # energy: or at most this much slower than the fastest configuration

    def __post_init__(self) -> None:
        if self.kind not in OBJECTIVES:
            raise SearchError(f"unknown objective {self.kind!r}; choose one of {', '.join(OBJECTIVES)}")
        floors = (self.min_throughput, self.max_slowdown)
        if self.kind == "energy" and floors.count(None) != 1:
            raise SearchError("the energy objective needs exactly one throughput floor: a minimum throughput "
                              "(samples/s) or a maximum slowdown against the fastest configuration")
        if self.kind != "energy" and floors != (None, None):
            raise SearchError("a throughput floor (minimum throughput, maximum slowdown) belongs to the energy "
                              "objective")
        if (self.min_throughput is not None and not self.min_throughput > 0) or (
                self.max_slowdown is not None and not 0 <= self.max_slowdown < 1):
            raise SearchError("the minimum throughput must be positive and the maximum slowdown a fraction in [0, 1)")


@dataclass
class SearchStats:
    shapes: int = 0  # configurations considered: every shape with its best cut
    infeasible: int = 0  # no cut fits in memory
    pruned: int = 0  # never planned: the objective's bound shows they cannot make the top k
    too_slow: int = 0  # energy objective: even all-max 1F1B misses the throughput floor
    planned: int = 0  # the optimal planner ran (or, past max_plan_units, the baseline stands in: not_planned)
    not_planned: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class SearchResult:
    objective: Objective
    candidates: list[Candidate]  # the top k (frontier: its points), best first
    planned: list[Candidate]  # every configuration the planner ran on (for the picture)
    stats: SearchStats
    time_budget_s: float | None  # energy objective: the floor's iteration time
    bands: list[HostBand]  # per candidate, its predictions as the host's speed wanders (envpipe.search.band)

    @property
    def undecided(self) -> list[int]:
        """Ranks whose band overlaps the first's in the objective's measure: the host's speed could swap them."""
        return undecided(self.bands, self.objective.kind == "energy")


def search(inputs: SearchInputs, global_batch: int, objective: Objective,
           options: SearchOptions = SearchOptions()) -> SearchResult:
    if options.top_k < 1:
        raise SearchError(f"top k must be at least 1, got {options.top_k}")
    layers, cluster, progress = inputs.layers, inputs.cluster, options.progress

    def plan(p: Pipeline, budget: float | None) -> Candidate:
        return plan_pipeline(p, cluster.usable_bytes, budget, options.max_plan_units)

    t0 = time.perf_counter()
    stats = SearchStats()
    candidates = shapes(cluster.gpus, layers.num_layers, global_batch, layers.micro_batch_sizes)
    stats.shapes = len(candidates)
    pipelines, closest = _feasible_pipelines(inputs, candidates, progress)
    stats.infeasible = len(candidates) - len(pipelines)
    if not pipelines:
        need, shape = closest
        raise SearchError(
            f"no configuration fits {cluster.memory_bytes / GIB:.2f} GiB per GPU less the "
            f"{cluster.margin_bytes / GIB:.2f} GiB margin: the least device memory any of the {len(candidates)} shapes "
            f"needs is {need / GIB:.2f} GiB ({shape.label()}, its least-memory cut); give more memory per GPU, "
            "more GPUs, or profile smaller micro-batches")
    budget = None
    if objective.kind == "throughput":
        planned, chosen = _throughput(pipelines, plan, stats, options)
    elif objective.kind == "energy":
        budget = _floor_time(pipelines, objective, global_batch)
        planned, chosen = _energy(pipelines, plan, budget, stats, options)
    else:
        planned, chosen = _frontier(pipelines, plan, stats, progress)
    stats.planned = len(planned)
    stats.not_planned = sum(not c.planned for c in planned)
    bands = [host_band(inputs, c) for c in chosen]
    stats.seconds = time.perf_counter() - t0
    return SearchResult(objective, chosen, planned, stats, budget, bands)


def _feasible_pipelines(inputs: SearchInputs, candidates: list[Shape], progress: Progress | None
                        ) -> tuple[list[Pipeline], tuple[float, Shape]]:
    """The pipelines of the shapes that fit, each with its time-balanced feasible cut; and for an error
    message the least device memory any shape needs (its min-max-memory cut)."""
    layers = inputs.layers
    unit = np.array([[layer_weight(layer.per_micro_batch[b], inputs.graphed) for layer in layers.layers]
                     for b in layers.micro_batch_sizes])
    time_tables = {b: segment_sums(unit[i]) for i, b in enumerate(layers.micro_batch_sizes)}
    cluster = inputs.cluster
    pipelines: list[Pipeline] = []
    closest: tuple[float, Shape] = (np.inf, candidates[0])
    for i, shape in enumerate(candidates):
        tables = MemoryTables(layers, shape.micro_batch, shape.replicas, shape.microbatches, inputs.graphed)
        flight = peak_in_flight(one_f_one_b(shape.stages, shape.microbatches))
        overheads = stage_overheads(inputs, shape)
        peaks = np.stack([tables.peak(w) for w in flight])  # (P, L+1, L+1)
        fits = peaks <= np.array([o.allocatable(cluster.usable_bytes) for o in overheads])[:, None, None]
        cut = bottleneck_cut(np.where(fits, time_tables[shape.micro_batch][None], np.inf))
        if cut is None:
            least = bottleneck_cut(np.stack([o.device_table(p) for o, p in zip(overheads, peaks, strict=True)]))
            if least is not None and least.cost < closest[0]:
                closest = (least.cost, shape)
        else:
            pipelines.append(build_pipeline(inputs, shape, cut, tables))
        if progress:
            progress(i + 1, len(candidates), f"cut {shape.label()}")
    return pipelines, closest


def _by_time(c: Candidate) -> tuple[float, float]:
    return (c.iteration_time_s, c.energy_j)


def _throughput(pipelines: list[Pipeline], plan: Planner, stats: SearchStats, options: SearchOptions
                ) -> tuple[list[Candidate], list[Candidate]]:
    top_k, progress = options.top_k, options.progress
    ranked = sorted(pipelines, key=lambda p: (p.baseline_time_s, p.shape.replicas * p.baseline_energy_j))
    stats.pruned = max(0, len(ranked) - top_k)
    planned = []
    for i, p in enumerate(ranked[:top_k]):
        planned.append(plan(p, None))
        if progress:
            progress(i + 1, min(top_k, len(ranked)), f"plan {p.shape.label()}")
    return planned, sorted(planned, key=_by_time)


def _floor_time(pipelines: list[Pipeline], objective: Objective, global_batch: int) -> float:
    if objective.min_throughput is not None:
        return global_batch / objective.min_throughput
    assert objective.max_slowdown is not None
    return min(p.baseline_time_s for p in pipelines) * (1 + objective.max_slowdown)


def _energy(pipelines: list[Pipeline], plan: Planner, budget: float, stats: SearchStats, options: SearchOptions
            ) -> tuple[list[Candidate], list[Candidate]]:
    top_k, progress = options.top_k, options.progress
    fast = [p for p in pipelines if p.baseline_time_s <= budget * (1 + 1e-9)]
    stats.too_slow = len(pipelines) - len(fast)
    if not fast:
        best = min(pipelines, key=lambda p: p.baseline_time_s)
        raise SearchError(f"no configuration reaches the throughput floor: it needs an iteration of at most "
                          f"{budget:.4f} s; the fastest ({best.shape.label()}) takes {best.baseline_time_s:.4f} s "
                          "(simulated)")
    bounded = sorted(((p.energy_lower_bound_j(budget), p) for p in fast), key=lambda x: x[0])
    planned: list[Candidate] = []
    for i, (bound, p) in enumerate(bounded):
        energies = sorted(c.energy_j for c in planned)
        if len(energies) >= top_k and bound >= energies[top_k - 1]:
            stats.pruned = len(bounded) - i
            break
        planned.append(plan(p, budget))
        if progress:
            progress(i + 1, len(bounded), f"plan {p.shape.label()}")
    return planned, sorted(planned, key=lambda c: (c.energy_j, c.iteration_time_s))[:top_k]


def _frontier(pipelines: list[Pipeline], plan: Planner, stats: SearchStats, progress: Progress | None
              ) -> tuple[list[Candidate], list[Candidate]]:
    planned: list[Candidate] = []
    ranked = sorted(pipelines, key=lambda p: p.time_lower_bound_s)
    for i, p in enumerate(ranked):
        bound = p.energy_lower_bound_j()
        if any(c.iteration_time_s <= p.time_lower_bound_s and c.energy_j <= bound for c in planned):
            stats.pruned += 1
            continue
        planned.append(plan(p, None))
        if progress:
            progress(i + 1, len(ranked), f"plan {p.shape.label()}")
    frontier = [c for c in planned if not any(_dominates(d, c) for d in planned)]
    return planned, sorted(frontier, key=_by_time)


def _dominates(d: Candidate, c: Candidate) -> bool:
    return (d.iteration_time_s <= c.iteration_time_s and d.energy_j <= c.energy_j
            and (d.iteration_time_s, d.energy_j) != (c.iteration_time_s, c.energy_j))
