"""The replicas that wait for a straggler take the least-energy plan that still ends in its time.

The gradient all-reduce makes every replica of a stage wait for the slowest one each iteration. With
`envpipe.straggler: frontier`, rank 0 computes the optimal planner's time-energy frontier
(`envpipe.plan.frontier.frontier`) on the *other* replicas' profile and gives them the least-energy
point whose predicted iteration (the calibrated transfer and per-stage tails included, as in the agreed
plan's prediction) is no longer than the straggler's predicted iteration under the agreed plan: they
finish no later than the straggler, on less energy. All numbers here are simulated on the profiles
measured online.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from envpipe.plan.frontier import FrontierPoint
from envpipe.profile import Profile

FRONTIER_POINTS = 12


def relaxed_plan(
    profile: Profile,
    num_microbatches: int,
    schedule: str,
    idle_power_w: float,
    tails_s: Sequence[float],
    straggler_time_s: float,
    transfer_s: float = 0.0,
) -> FrontierPoint | None:
    """The frontier point for the non-straggling replicas, or None when none fits the straggler's time."""
    from envpipe.plan.frontier import frontier  # the optimal planner is only needed here

    points = frontier(
        profile, num_microbatches, idle_power_w=idle_power_w, schedule=schedule, points=FRONTIER_POINTS,
        transfer_s=transfer_s, tail_s=np.asarray(tails_s, float),
    )
    fits = [p for p in points if p.time_s <= straggler_time_s]
    return min(fits, key=lambda p: p.energy_j) if fits else None
