"""One configuration (a shape and its stage cut) as the planner sees it, and its optimal clock plan.

From the layer profile: per stage the forward and backward unit time (its layers' host and device times
as the engine runs them, envpipe.search.timing) and energy (time x the profile's busy power at the micro-batch
size), measured at the top clock, the other clocks simulated by the frequency model
(envpipe.profile.from_measured); the p2p transfer of the boundary activation (the slowest link: the simulator
takes one transfer time); per stage a tail (its layers' optimizer step, the gradient all-reduce over the
replicas and, bf16, the weights' all-gather, and the engine's work per iteration); per stage its memory
(envpipe.search.memory) and what its process holds beside it (its communicators: envpipe.search.cluster). Then
the simulator's 1F1B all-max baseline, and the optimal planner (envpipe.plan.optimal) in EnvPipe's
schedule with the stages' memory in bytes (envpipe.plan.memory.StageMemory): it tries EnvPipe's extra
warm-up forwards where they fit and plain 1F1B, and keeps the order and clocks of least energy within the
time budget. Every number here is simulated.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from envpipe.plan.case import PipelineCase
from envpipe.plan.evaluate import baseline_timeline, evaluate_plan, plan_from_timeline
from envpipe.plan.memory import StageMemory, peak_in_flight
from envpipe.plan.optimal.orders import optimal_plan
from envpipe.plan.optimal.problem import PlanTooLarge
from envpipe.plan.planfile import Plan
from envpipe.plan.simulate import Overheads
from envpipe.profile import FrequencyModel, Profile
from envpipe.profile.from_measured import profile_from_measured
from envpipe.profile.gpus import GPU_FILTERS
from envpipe.search.bounds import energy_lower_bound, time_lower_bound
from envpipe.search.cut import Cut
from envpipe.search.engine_model import device_overhead
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import LayerProfile
from envpipe.search.memory import DeviceOverhead, MemoryTables, StageBytes
from envpipe.search.space import Shape
from envpipe.search.timing import unit_times


def clock_candidates(layers: LayerProfile) -> list[int]:
    """The stage profile's clocks: the GPU's candidate rule (90 MHz steps), or the simulated GPU's clocks."""
    rule = GPU_FILTERS.get(layers.gpu)
    if rule is None:
        return list(FrequencyModel.default().clocks_mhz)
    return list(range(rule.max_mhz, rule.min_mhz - 1, -rule.granularity))


@dataclass(frozen=True)
class Pipeline:
    """A shape with its cut, ready for the simulator and the planner."""

    shape: Shape
    cut: Cut
    profile: Profile  # stage profile: top clock from the layer profile, lower clocks simulated
    transfer_s: float
    tail_s: np.ndarray  # (P,)
    memory: tuple[StageBytes, ...]  # in the allocator's bytes
    overheads: tuple[DeviceOverhead, ...]  # per stage, from the allocator's bytes to the device's
    idle_power_w: float
    tail_power_w: float  # the stage's power in its tail: the profile's busy power
    baseline_time_s: float  # 1F1B, every unit at the top clock
    baseline_energy_j: float  # one pipeline

    @property
    def microbatches(self) -> int:
        return self.shape.microbatches

    @property
    def time_lower_bound_s(self) -> float:
        return time_lower_bound(self)

    def energy_lower_bound_j(self, budget_s: float | None = None) -> float:
        """Job energy (all replicas) no plan within the budget (default: the baseline's time) goes below."""
        budget = self.baseline_time_s if budget_s is None else budget_s
        return self.shape.replicas * energy_lower_bound(self, budget)


def build_pipeline(inputs: SearchInputs, shape: Shape, cut: Cut, tables: MemoryTables) -> Pipeline:
    layers, cluster, engine = inputs.layers, inputs.cluster, inputs.engine
    b, D = shape.micro_batch, shape.replicas
    bounds = cut.bounds
    costs = [[layer.per_micro_batch[b] for layer in layers.layers[lo:hi]] for lo, hi in bounds]
    calls = layers.unit_calls
    # the first stage loads the micro-batch's inputs, the last its labels (DeepSpeed's LoadMicroBatch)
    fwd, bwd = (list(t) for t in zip(*(unit_times(stage, engine, calls.backward_s,
                                                  calls.load(b) if s in (0, len(costs) - 1) else 0.0, inputs.graphed)
                                       for s, stage in enumerate(costs)), strict=True))
    busy, idle = layers.busy_power_at(b), layers.idle_power_w

    def energy(unit_s: float, device_s: float) -> float:  # the device computes at its busy power, waits at idle
        computing = min(unit_s, device_s)
        return computing * busy + (unit_s - computing) * idle

    fwd_e = [energy(t, sum(c.forward_s for c in stage)) for t, stage in zip(fwd, costs, strict=True)]
    bwd_e = [energy(t, sum(c.backward_s for c in stage)) for t, stage in zip(bwd, costs, strict=True)]
    profile = profile_from_measured(fwd, bwd, fwd_e, bwd_e, clock_candidates(layers))
    transfer = max((cluster.p2p_s(stage[-1].output_bytes, cluster.link_crosses_nodes(D, s))
                    for s, stage in enumerate(costs[:-1])), default=0.0)
    tail = np.array([_tail_s(inputs, D, s, lo, hi) + engine.iteration_s for s, (lo, hi) in enumerate(bounds)])
    pipeline = Pipeline(shape, cut, profile, transfer, tail, tuple(tables.stage(lo, hi) for lo, hi in bounds),
                        stage_overheads(inputs, shape), idle, layers.busy_power_w, 0.0, 0.0)
    base = baseline_timeline(case_of(pipeline))
    return replace(pipeline, baseline_time_s=base.iteration_time, baseline_energy_j=base.energy)


def stage_overheads(inputs: SearchInputs, shape: Shape) -> tuple[DeviceOverhead, ...]:
    """Per stage, from the allocator's bytes to the device's: the profile's and the engine model's, and what the
    stage's communicators hold (envpipe.search.cluster)."""
    return tuple(device_overhead(inputs.layers, inputs.engine,
                                 inputs.cluster.communicators_bytes(shape.stages, shape.replicas, s))
                 for s in range(shape.stages))


def case_of(pipeline: Pipeline, memory: StageMemory | None = None) -> PipelineCase:
    """The planner's case of the pipeline: its stages wait at the idle power and run their tails (the optimizer
    step, the all-reduce) at the busy power."""
    shape = pipeline.shape
    overheads = Overheads.broadcast(shape.stages, pipeline.idle_power_w, pipeline.transfer_s, pipeline.tail_s,
                                    pipeline.tail_power_w)
    return PipelineCase(pipeline.profile, shape.microbatches, overheads, memory)


def _tail_s(inputs: SearchInputs, replicas: int, stage: int, lo: int, hi: int) -> float:
    """After a stage's last unit: its optimizer step, the gradient all-reduce, (bf16) the weights' all-gather.
    bf16: DeepSpeed's BF16_Optimizer steps only the replica's partition of the fp32 master weights (the
    profile times the whole layer's step), then all-gathers the weights. The step: the engine model's per
    parameter where fitted, else the profile's per layer (envpipe.search.engine_model)."""
    layers, cluster, per_parameter = inputs.layers, inputs.cluster, inputs.engine.step_per_parameter_s
    own = layers.layers[lo:hi]
    weights = sum(layer.param_bytes for layer in own)
    crosses = cluster.group_crosses_nodes(replicas, stage)
    step = (sum(layer.optimizer_step_s for layer in own) if per_parameter is None
            else per_parameter * sum(layer.parameters for layer in own))
    tail = cluster.allreduce_s(weights, replicas, crosses)
    if layers.dtype == "bf16":
        return tail + step / replicas + cluster.allgather_s(weights, replicas, crosses)
    return tail + step


@dataclass(frozen=True)
class Candidate:
    """A configuration with its optimal plan (simulated); energies are the job's (all replicas)."""

    pipeline: Pipeline
    plan: Plan
    reschedule: list[int]
    iteration_time_s: float
    energy_j: float
    baseline_energy_j: float
    peak_allocated_bytes: tuple[int, ...]  # per stage, with the plan's order: the allocator's peak
    planned: bool = True  # False: too large for the planner, the 1F1B all-max baseline stands in

    @property
    def peak_bytes(self) -> tuple[int, ...]:
        """Per stage, the device memory at the peak (what must fit in the GPU)."""
        return tuple(o.device_bytes(b) for o, b in zip(self.pipeline.overheads, self.peak_allocated_bytes,
                                                        strict=True))

    @property
    def shape(self) -> Shape:
        return self.pipeline.shape

    @property
    def saving(self) -> float:
        return 1.0 - self.energy_j / self.baseline_energy_j

    @property
    def order_time_s(self) -> float:
        """The iteration time of the plan's order with every unit at the top clock (simulated)."""
        return order_time_s(self.pipeline, self.plan)

    @property
    def order(self) -> str:
        if not self.planned:
            return "1f1b (not planned)"
        return "1f1b" if not any(self.reschedule) else "envpipe r=" + ",".join(map(str, self.reschedule))

    def throughput(self) -> float:
        return self.shape.global_batch / self.iteration_time_s


def order_time_s(pipeline: Pipeline, plan: Plan) -> float:
    """The iteration time of ``plan``'s order with every unit at the top clock: what runs where clocks cannot be
    set (GPUs without envpipe-clockd: the runtime deploys the order, the GPU keeps its default clocks)."""
    p = pipeline.profile
    return evaluate_plan(Plan.at_one_clock(plan.orders(), p.f_max, plan.schedule, plan.policy),
                         case_of(pipeline)).iteration_time


def stage_memory(pipeline: Pipeline, capacity: int) -> StageMemory:
    """The planner's memory model of the pipeline: per stage, the bytes one in-flight micro-batch holds and the
    bytes left for them after the rest the stage holds at its peak (StageBytes.per_in_flight, room_taken), within
    the allocated peak that keeps the device's peak within ``capacity`` bytes."""
    return StageMemory(tuple(m.per_in_flight for m in pipeline.memory),
                       tuple(max(0, o.allocatable(capacity) - m.room_taken)
                             for m, o in zip(pipeline.memory, pipeline.overheads, strict=True)))


def peaks(pipeline: Pipeline, plan: Plan) -> tuple[int, ...]:
    """The allocator's peak bytes per stage with the plan's order (its micro-batches in flight)."""
    return tuple(m.peak(w) for m, w in zip(pipeline.memory, peak_in_flight(plan.orders()), strict=True))


def units(shape: Shape) -> int:
    """Forward and backward units of one iteration: the size of the planner's DAG."""
    return 2 * shape.stages * shape.microbatches


def plan_pipeline(pipeline: Pipeline, capacity: int, time_budget_s: float | None = None,
                  max_units: int | None = None) -> Candidate:
    """The least-energy plan of ``pipeline`` within the budget (default: its 1F1B all-max time). A pipeline of
    more than ``max_units`` units, or whose LP is beyond the planner's limit (envpipe.limits.MAX_LP_UNITS), gets
    its 1F1B all-max baseline as plan instead (the planner's time grows with the DAG: about 10 s at 65,536 units
    on a 2-core machine)."""
    shape = pipeline.shape
    if max_units is not None and units(shape) > max_units:
        return _baseline_candidate(pipeline)
    # only orders whose in-flight activations fit are tried: 1F1B always does (the cut was chosen so)
    case = case_of(pipeline, stage_memory(pipeline, capacity))
    try:
        result = optimal_plan(case, "envpipe", time_budget_s)
    except PlanTooLarge:  # its LP is beyond the planner's limit (envpipe.limits.MAX_LP_UNITS), as a large DAG is
        return _baseline_candidate(pipeline)
    D = shape.replicas
    return Candidate(pipeline, result.plan, list(result.reschedule), result.timeline.iteration_time,
                     D * result.timeline.energy, D * pipeline.baseline_energy_j, peaks(pipeline, result.plan))


def _baseline_candidate(pipeline: Pipeline) -> Candidate:
    shape, p = pipeline.shape, pipeline.profile
    base = baseline_timeline(case_of(pipeline))
    plan = plan_from_timeline(base, np.full(base.dag.num_units, p.f_max), "1f1b", "baseline", base)
    D = shape.replicas
    return Candidate(pipeline, plan, [0] * shape.stages, base.iteration_time, D * base.energy, D * base.energy,
                     peaks(pipeline, plan), planned=False)
