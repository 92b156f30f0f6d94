"""EnvPipe's reconfiguration on simulated waits: raise clocks on the critical path until it is the envelope.

Each round simulates the plan, walks EnvPipe's critical path, and:
- default: does nothing (no reconfiguration phase);
- greedy: raises the latest-in-time critical unit below max by 3 x 30 MHz;
- balanced: raises every critical unit at the path's minimum clock by 30 MHz.
It stops when every critical unit is an envelope unit or nothing on the path can be raised.
Per-stage tails (gradient all-reduce, optimizer step) come in through ``simulate_freqs``: they are in
every timeline it returns, and so in the time and energy each round is judged by.

The walk (EnvPipe's find_critical_path) goes back in time from stage 0's last unit to its first:
a unit whose recv stall is below the threshold was delayed by its own predecessor on the stage;
otherwise it waited for data (F: from the stage above, B: from the stage below). The threshold is
``scale`` x the smallest positive recv stall of a last-stage unit (EnvPipe uses scale 4).

Deviations, documented in docs/planner.md: EnvPipe counts 10 more rounds without a raise before it
stops; the simulation is deterministic, so the first such round already ends it. Clocks are raised
to the nearest *profiled* clock at or above the target (NVML snaps the same way). A round cap
(``max_rounds``) guards against a walk that never settles, though clocks only rise and are bounded.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass

import numpy as np

from envpipe.plan.dag import PipelineDag
from envpipe.plan.policies import is_envelope
from envpipe.plan.simulate import Timeline
from envpipe.profile.gpus import RECONFIGURE_GRANULARITY_MHZ

RECONFIGS = ("default", "greedy", "balanced")
_MIN_THRESHOLD_S = 1e-6  # when no last-stage unit ever stalls (exact, noise-free simulation)


@dataclass(frozen=True)
class Reconfig:
    """How EnvPipe reconfigures: ``method`` (default | greedy | balanced), the critical-path walk's threshold
    (``threshold_scale`` x the smallest positive last-stage recv stall) and a round cap."""

    method: str = "balanced"
    threshold_scale: float = 4.0
    max_rounds: int = 100_000

    def __post_init__(self) -> None:
        if self.method not in RECONFIGS:
            raise ValueError(f"unknown reconfiguration {self.method!r}; choose one of {', '.join(RECONFIGS)}")
        if not self.threshold_scale > 0:
            raise ValueError("the reconfiguration threshold scale must be positive")
        if self.max_rounds < 1:
            raise ValueError("the reconfiguration round limit must be at least 1")


@dataclass(frozen=True)
class ReconfigResult:
    freqs_mhz: np.ndarray
    timeline: Timeline
    rounds: int
    raises: int
    stop_reason: str


def envpipe_critical_path(tl: Timeline, threshold_scale: float) -> list[int]:
    """EnvPipe's walk, in reverse time order (index 0 is stage 0's last unit)."""
    dag = tl.dag
    recv = tl.dependency_wait
    last_stage = recv[dag.stage == dag.num_stages - 1]
    positive = last_stage[last_stage > 0]
    threshold = threshold_scale * float(positive.min()) if positive.size else _MIN_THRESHOLD_S
    first, cur = dag.order[0][0], dag.order[0][-1]
    stage, fwd, pred_same, pred_data = dag.as_lists
    stall = recv.tolist()
    N, last = dag.num_units, dag.num_stages - 1
    path = [cur]
    for _ in range(N):
        if cur == first:
            break
        s = stage[cur]
        # F of stage 0 and B of the last stage have no recv; a first unit of a stage has no predecessor
        delayed_by_data = stall[cur] >= threshold or pred_same[cur] == N
        if delayed_by_data and pred_data[cur] != N and (s > 0 if fwd[cur] else s < last):
            cur = pred_data[cur]
        else:
            cur = pred_same[cur]
        path.append(cur)
    return path


def _raise_to(clocks: np.ndarray, target: float) -> int:
    """Smallest profiled clock >= target, capped at the highest clock (clocks ascending)."""
    pos = int(np.searchsorted(clocks, target))
    return int(clocks[min(pos, clocks.size - 1)])


def reconfigure(
    dag: PipelineDag,
    freqs_mhz: np.ndarray,
    profile_clocks: np.ndarray,
    simulate_freqs: Callable[[np.ndarray, Timeline | None, np.ndarray | None], Timeline],
    how: Reconfig,
) -> ReconfigResult:
    """`reconfigure_rounds` with every round's timeline from ``simulate_freqs(freqs, previous, changed)``."""
    rounds = reconfigure_rounds(dag, freqs_mhz, profile_clocks, how)
    request = next(rounds)
    while True:
        try:
            request = rounds.send(simulate_freqs(*request))
        except StopIteration as done:
            return done.value


Request = tuple[np.ndarray, Timeline | None, np.ndarray | None]  # (clocks to run, previous timeline, changed units)


def reconfigure_rounds(dag: PipelineDag, freqs_mhz: np.ndarray, profile_clocks: np.ndarray, how: Reconfig
                       ) -> Generator[Request, Timeline, ReconfigResult]:
    """Raise ``freqs_mhz`` (per unit of ``dag``) round by round, as a generator: it yields each round's clocks to
    run (with the previous timeline and the units raised since, for an incremental simulation) and is sent
    back that round's timeline, simulated (the planner) or measured (the runtime, one training iteration each)."""
    method, max_rounds = how.method, how.max_rounds
    freqs = np.array(freqs_mhz, dtype=np.int64)
    ascending = np.sort(np.asarray(profile_clocks))
    f_max = int(ascending[-1])
    envelope = is_envelope(dag)
    tl = yield freqs.copy(), None, None
    if method == "default":
        return ReconfigResult(freqs, tl, 0, 0, "reconfiguration off (default)")
    raises = 0
    for rnd in range(1, max_rounds + 1):
        path = envpipe_critical_path(tl, how.threshold_scale)
        on_path = np.asarray(path)
        if envelope[on_path].all():
            return ReconfigResult(freqs, tl, rnd, raises, "critical path is the envelope")
        below = on_path[freqs[on_path] < f_max]
        if below.size == 0:
            return ReconfigResult(freqs, tl, rnd, raises, "every critical unit is at the highest clock")
        if method == "greedy":
            targets = below[:1]  # the path is in reverse time order: first = latest in time
            freqs[targets] = _raise_to(ascending, freqs[targets[0]] + 3 * RECONFIGURE_GRANULARITY_MHZ)
        else:
            lowest = freqs[below].min()
            targets = below[freqs[below] == lowest]
            freqs[targets] = _raise_to(ascending, lowest + RECONFIGURE_GRANULARITY_MHZ)
        raises += 1
        tl = yield freqs.copy(), tl, targets
    return ReconfigResult(freqs, tl, max_rounds, raises, f"stopped after {max_rounds} rounds (guard)")
