"""The replicas that wait for a straggler take the least-energy plan that still ends in its time.

The gradient all-reduce makes every replica of a stage wait for the slowest one each iteration. With
`envpipe.straggler: frontier`, rank 0 computes the optimal planner's time-energy frontier
(`envpipe.plan.frontier.frontier`) on the *other* replicas' profile and gives them the least-energy
point whose predicted iteration (the calibrated transfer and per-stage tails included, as in the agreed
plan's prediction) is no longer than the straggler's predicted iteration under the agreed plan: they
finish no later than the straggler, on less energy.
All numbers here are simulated on the profiles measured online.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from envpipe.profile import Profile
from envpipe.runtime.plans import RunPlan

FRONTIER_POINTS = 12


@dataclass
class Relaxed:
    plan: RunPlan
    note: dict[str, Any]  # what the report says about it (simulated numbers)


def relaxed_plan(
    profile: Profile,
    num_microbatches: int,
    schedule: str,
    idle_power_w: float,
    tails_s: Sequence[float],
    straggler_time_s: float,
    straggler: int,
    transfer_s: float = 0.0,
) -> Relaxed | None:
    """The frontier point for the non-straggling replicas, or None when none fits the straggler's time."""
    from envpipe.plan.frontier import frontier  # the optimal planner is only needed here

    tail = np.asarray(tails_s, float)
    points = frontier(
        profile, num_microbatches, idle_power_w=idle_power_w, schedule=schedule, points=FRONTIER_POINTS,
        transfer_s=transfer_s, tail_s=tail,
    )
    fits = [p for p in points if p.time_s <= straggler_time_s]
    if not fits:
        return None
    best = min(fits, key=lambda p: p.energy_j)
    tl, fastest = best.timeline, points[0].timeline  # simulated with the same transfer and tails
    plan = RunPlan.from_plan(best.plan, tl)
    note = {
        "straggler_replica": straggler,
        "rule": "least-energy frontier plan whose iteration fits the straggler's (optimal planner)",
        "straggler_predicted_time_s": straggler_time_s,
        "predicted_time_s": tl.iteration_time,
        "predicted_energy_per_replica_j": tl.energy,
        "fastest_frontier_energy_per_replica_j": fastest.energy,
        "frontier_points": len(points),
        "numbers": "simulated",
    }
    return Relaxed(plan, note)
