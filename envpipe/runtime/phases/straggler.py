"""The replicas that wait for a straggler take the least-energy plan that still ends in its time.

The gradient all-reduce makes every replica of a stage wait for the slowest one each iteration. With
`envpipe.straggler: frontier`, rank 0 computes the optimal planner's time-energy frontier
(`envpipe.plan.optimal.frontier.frontier`) on the *other* replicas' profile and gives them the least-energy
point whose predicted iteration (the calibrated transfer and per-stage tails included, as in the agreed
plan's prediction) is no longer than the straggler's predicted iteration under the agreed plan: they
finish no later than the straggler, on less energy. All numbers here are simulated on the profiles
measured online.
"""

from __future__ import annotations

from envpipe.plan.case import PipelineCase, Planned

FRONTIER_POINTS = 12


def relaxed_plan(case: PipelineCase, schedule: str, straggler_time_s: float) -> Planned | None:
    """The frontier point of ``case`` (the non-straggling replicas) that fits the straggler's time, or None."""
    from envpipe.plan.optimal.frontier import frontier  # the optimal planner is only needed here

    points = frontier(case, schedule, FRONTIER_POINTS)
    fits = [p for p in points if p.timeline.iteration_time <= straggler_time_s]
    return min(fits, key=lambda p: p.timeline.energy) if fits else None
