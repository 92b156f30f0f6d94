"""Data-parallel replicas of the pipeline: the job's shape, who measures, what is agreed, stragglers.

DeepSpeed's grid is world = stages x replicas (axes pipe x data). The replicas of a stage all-reduce
their gradients at the end of every iteration, so each iteration waits for the slowest of them.

- **Every replica measures.** Per stage the runtime takes the *slowest* replica's numbers (largest
  forward + backward unit time; its unit energies go with it): the all-reduce makes every replica wait
  for it anyway, so planning for it costs no time and planning for a faster one would.
- **Calibration per replica.** Each replica's stages form one measured pipeline (`calibrate_replicas`):
  its own unit, overhead, transfer and tail times (envpipe.runtime.measure.timing); `job_calibration` combines them.
- **Tails.** A stage's tail (step end - last unit end: gradient all-reduce + optimizer step) is the *shortest*
  over its replicas: the last replica to reach the all-reduce does not wait there, so its tail is transfer +
  step alone.
- **One decision.** Rank 0 plans; the plan is broadcast (`agree`), so every replica of a stage runs the
  same orders and clocks. Only the straggler rule (`envpipe.runtime.phases.straggler`) gives the replicas
  that wait for a straggler a plan of their own, and the report says so.
"""

from __future__ import annotations

import os
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace

from envpipe.plan.schedules import Unit
from envpipe.profile.from_measured import StageUnits
from envpipe.runtime.measure.collective import Place
from envpipe.runtime.measure.timing import SimInputs, StageTiming, sim_inputs

SLOW_REPLICA_ENV = "ENVPIPE_SIM_SLOW_REPLICA"  # "REPLICA:FACTOR": that replica's sim clock runs slower


class ReplicaError(ValueError):
    """A data x pipeline shape that cannot work, or a bad straggler emulation setting."""


def pipeline_shape(world_size: int, stages: int | None) -> tuple[int, int]:
    """(stages, data-parallel replicas) for this world; stages default to the world size (no DP)."""
    stages = world_size if stages is None else stages
    if isinstance(stages, bool) or not isinstance(stages, int) or stages < 1:
        raise ReplicaError(f"pipeline stages must be a positive integer, got {stages!r}")
    if stages > world_size or world_size % stages:
        raise ReplicaError(
            f"{stages} pipeline stages do not divide the {world_size} processes of the job: data-parallel "
            f"replicas = processes / stages must be a whole number (e.g. {_divisors(world_size)})"
        )
    return stages, world_size // stages


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


@dataclass(frozen=True)
class StageStats:
    """One rank's stage, calibrated in its replica: its units (with their mean energies once metered), the gap
    before its first unit, its tail, and when its units ended (from its own step start); nan: not measured."""

    units: StageUnits
    gap_s: float
    tail_s: float
    pipeline_s: float = float("nan")

    @property
    def unit_s(self) -> float:
        """A forward and a backward unit: what makes a replica the slowest."""
        return self.units.fwd_s + self.units.bwd_s


Entry = tuple[Place, StageStats]


def slowest_per_stage(entries: Iterable[Entry], stages: int, exclude: Iterable[int] = ()) -> list[StageStats]:
    """Per stage, the numbers of its slowest replica (largest forward + backward), leaving out those in `exclude`."""
    skip = set(exclude)
    best: dict[int, StageStats] = {}
    for where, stats in entries:
        if where.replica in skip:
            continue
        cur = best.get(where.stage)
        if cur is None or stats.unit_s > cur.unit_s:
            best[where.stage] = stats
    missing = [s for s in range(stages) if s not in best]
    if missing:
        raise ReplicaError(f"no measurements from stage(s) {missing}")
    return [best[s] for s in range(stages)]


UnitEnergies = tuple[float | None, float | None]  # one rank's mean F and B unit energy in one iteration (J)


def slowest_with_energy(entries: Sequence[Entry], iterations: Sequence[Sequence[UnitEnergies | None]],
                        stages: int) -> list[StageStats]:
    """`slowest_per_stage` of ``entries`` with each rank's forward and backward unit energy: its mean over
    ``iterations`` (each a per-rank list in rank order, None where a rank has no meter; nan where none is known).

    Why the mean: one iteration's reading of the counter is off by a few percent either way (it updates every
    few tens of milliseconds); on 2 x H100 a stage's calibration iterations read 182-205 J where their mean was
    198 J (2026-11-27), and the prediction had taken the last one's alone."""
    nan = float("nan")
    means = []
    for rank in zip(*iterations, strict=True):
        known = [e for e in rank if e is not None]
        fwd = [f for f, _ in known if f is not None]
        bwd = [b for _, b in known if b is not None]
        means.append((statistics.fmean(fwd) if fwd else nan, statistics.fmean(bwd) if bwd else nan))
    return slowest_per_stage([(w, replace(st, units=replace(st.units, fwd_j=f, bwd_j=b)))
                              for (w, st), (f, b) in zip(entries, means, strict=True)], stages)


def stage_tails(entries: Iterable[Entry], stages: int) -> list[float]:
    """Per stage, the shortest measured tail over its replicas (the last to arrive does not wait)."""
    tails: dict[int, float] = {}
    for where, stats in entries:
        tails[where.stage] = min(tails.get(where.stage, float("inf")), stats.tail_s)
    return [tails[s] for s in range(stages)]


Measured = tuple[Place, StageTiming]  # one rank's iteration


def calibrate_replicas(
    orders: Sequence[Sequence[Unit]], iterations: Sequence[Sequence[Measured]]
) -> dict[int, SimInputs]:
    """Each replica's calibration from its own stages' timings (samples of the iterations pooled)."""
    per: dict[int, list[list[StageTiming]]] = {}
    for it in iterations:
        mine: dict[int, list[StageTiming]] = {}
        for where, timing in it:
            mine.setdefault(where.replica, []).append(timing)
        for d, timings in mine.items():
            per.setdefault(d, []).append(timings)
    return {d: sim_inputs(orders, its) for d, its in sorted(per.items())}


def stage_entries(cals: Mapping[int, SimInputs], last: Sequence[Measured]) -> list[Entry]:
    """Per rank: its stage's calibrated numbers in its replica, and when its units ended (`last` iteration)."""
    entries: list[Entry] = []
    for where, t in last:
        c, s = cals[where.replica], where.stage
        entries.append((where, StageStats(StageUnits(c.fwd_s[s], c.bwd_s[s]), c.gap_s[s], c.tail_s[s], _units_end(t))))
    return entries


def _units_end(t: StageTiming) -> float:
    """When the rank's last unit ended, from its own step start (host clocks of different nodes differ)."""
    return max((end for *_, end in t.units), default=t.step_start) - t.step_start


def job_calibration(
    cals: Mapping[int, SimInputs], entries: Iterable[Entry], stages: int, exclude: Iterable[int] = ()
) -> SimInputs:
    """The job's simulator inputs: per stage the slowest replica's units, the shortest tail of the stage."""
    entries = list(entries)
    skip = set(exclude)
    rows = slowest_per_stage(entries, stages, skip)
    kept = [c for d, c in cals.items() if d not in skip]
    return SimInputs(
        [r.units.fwd_s for r in rows],
        [r.units.bwd_s for r in rows],
        [r.gap_s for r in rows],
        max(c.transfer_s for c in kept),
        stage_tails(entries, stages),
        max(c.head_s for c in kept),
    )


def _latest_per_replica(times: Iterable[tuple[Place, float]]) -> dict[int, float]:
    """Per replica, the latest of its stages' times."""
    latest: dict[int, float] = {}
    for where, t in times:
        latest[where.replica] = max(latest.get(where.replica, 0.0), t)
    return latest


def slowest_replica(iteration: Iterable[Measured]) -> int:
    """The replica whose stages ended their units last in this iteration (ties: the lowest id)."""
    times = _latest_per_replica((where, _units_end(t)) for where, t in iteration)
    return max(sorted(times), key=lambda d: times[d])


def replica_times(entries: Iterable[Entry]) -> dict[int, float]:
    """Per replica, when its last stage finished its units (the latest `pipeline_s` over its stages)."""
    return _latest_per_replica((where, stats.pipeline_s) for where, stats in entries)


def find_straggler(times: Mapping[int, float], threshold: float) -> int | None:
    """The replica slower than the median of the others by more than `threshold` (`straggler_threshold` of the
    config), if any."""
    if len(times) < 2:
        return None
    worst = max(times, key=lambda r: times[r])
    others = statistics.median(t for r, t in times.items() if r != worst)
    return worst if times[worst] > others * (1.0 + threshold) else None


def sim_slowdown(replica: int, environ: Mapping[str, str] | None = None) -> float:
    """The sim clock slowdown of this replica from ENVPIPE_SIM_SLOW_REPLICA=REPLICA:FACTOR (CPU tests)."""
    value = (os.environ if environ is None else environ).get(SLOW_REPLICA_ENV, "")
    if not value:
        return 1.0
    try:
        who, factor = value.split(":")
        slow, f = int(who), float(factor)
    except ValueError:
        raise ReplicaError(f"{SLOW_REPLICA_ENV}={value!r}: expected REPLICA:FACTOR, e.g. 1:3") from None
    if not f >= 1.0:
        raise ReplicaError(f"{SLOW_REPLICA_ENV}={value!r}: the factor must be >= 1")
    return f if slow == replica else 1.0
