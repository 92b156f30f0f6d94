"""Where a run's unit orders and clocks come from: a plan file, or EnvPipe's rule on measured times."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from envpipe.plan.schedules import Unit, envpipe_schedule, one_f_one_b, reschedule_counts
from envpipe.runtime.schedule import validate_orders

if TYPE_CHECKING:
    from envpipe.plan.planfile import Plan
    from envpipe.plan.simulate import Timeline


class PlanFileError(ValueError):
    """A plan file that cannot drive this pipeline."""


@dataclass
class RunPlan:
    orders: list[list[Unit]]
    clocks: list[list[int]] | None  # planned SM clock per unit, None: leave clocks alone
    predicted_time_s: float | None = None
    baseline: dict[str, float] | None = None  # predicted baseline time/energy from the planner
    predicted_energy_j: float | None = None  # the planner's prediction for this plan (simulated)

    @classmethod
    def from_plan(cls, plan: Plan, predicted: Timeline, baseline: Timeline | None = None) -> RunPlan:
        """A planner Plan's orders and clocks, with its simulated iteration (and the baseline's)."""
        return cls(
            plan.orders(),
            [[u.freq_mhz for u in units] for units in plan.stages],
            predicted.iteration_time,
            {"time_s": baseline.iteration_time, "energy_j": baseline.energy} if baseline is not None else None,
            predicted.energy,
        )


def load_plan(path: str | Path, num_stages: int, num_microbatches: int) -> RunPlan:
    """Read the plan JSON (DESIGN.md, version 1) for a pipeline of this shape."""
    try:
        data: Any = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PlanFileError(f"{path}: cannot read: {exc.strerror}") from None
    except json.JSONDecodeError as exc:
        raise PlanFileError(f"{path}: not JSON: {exc}") from None
    if not isinstance(data, dict) or data.get("version") != 1:
        raise PlanFileError(f"{path}: not a version 1 plan")
    if (data.get("num_stages"), data.get("num_microbatches")) != (num_stages, num_microbatches):
        raise PlanFileError(
            f"{path}: plan is for {data.get('num_stages')} stages x "
            f"{data.get('num_microbatches')} micro-batches, this run has "
            f"{num_stages} x {num_microbatches}"
        )
    stages: Any = data.get("stages")
    try:
        orders = [[(u["kind"], int(u["mb"])) for u in st] for st in stages]
        clocks = [[int(u["freq_mhz"]) for u in st] for st in stages]
    except (TypeError, KeyError, ValueError) as exc:
        raise PlanFileError(
            f"{path}: 'stages' must list units {{kind, mb, freq_mhz}} per stage ({exc!r})"
        ) from None
    try:
        validate_orders(orders, num_microbatches)
    except ValueError as exc:
        raise PlanFileError(f"{path}: {exc}") from None
    predicted = data.get("predicted") or {}
    baseline = None
    if "baseline_time_s" in predicted and "baseline_energy_j" in predicted:
        baseline = {
            "time_s": float(predicted["baseline_time_s"]),
            "energy_j": float(predicted["baseline_energy_j"]),
        }
    t = predicted.get("iteration_time_s")
    return RunPlan(orders, clocks, float(t) if t is not None else None, baseline)


def builtin_plan(
    scheduling: str,
    num_stages: int,
    num_microbatches: int,
    fwd_s: Sequence[float] | None = None,
    bwd_s: Sequence[float] | None = None,
) -> RunPlan:
    """1F1B, or EnvPipe's order with r_s from measured unit times (needed for 'envpipe')."""
    if scheduling == "1f1b":
        return RunPlan(one_f_one_b(num_stages, num_microbatches), None)
    if fwd_s is None or bwd_s is None:
        raise ValueError("EnvPipe scheduling without a plan needs measured forward/backward times")
    return RunPlan(
        envpipe_schedule(num_stages, num_microbatches, reschedule_counts(bwd_s, fwd_s, num_microbatches)), None
    )
