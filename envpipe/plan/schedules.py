"""Pipeline schedules as per-stage ordered lists of units.

A unit is ``(kind, mb)`` with kind ``"F"`` (forward) or ``"B"`` (backward). Like DeepSpeed's
``runtime/pipe/schedule.py``, an order is plain data that can be printed, compared and tested.

- 1F1B (DeepSpeed's TrainSchedule): stage s runs min(M, P-s) forwards before its first backward,
  then alternates B, F, then drains the remaining backwards.
- EnvPipe: the same shape with min(M, P-s+r_s) warm-up forwards (r_s from ``reschedule_counts``),
  so the bubble before the first backward is filled with (slow) forwards.
- GPipe: all forwards, then all backwards.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Unit = tuple[str, int]
SCHEDULES = ("1f1b", "envpipe", "gpipe")


def warmup_order(num_microbatches: int, warmup: int) -> list[Unit]:
    """``warmup`` forwards, then alternating B/F, then the remaining backwards."""
    M = num_microbatches
    w = max(1, min(M, warmup))
    order: list[Unit] = [("F", m) for m in range(w)]
    next_f = w
    for b in range(M):
        order.append(("B", b))
        if next_f < M:
            order.append(("F", next_f))
            next_f += 1
    return order


def one_f_one_b(num_stages: int, num_microbatches: int) -> list[list[Unit]]:
    return [warmup_order(num_microbatches, num_stages - s) for s in range(num_stages)]


def envpipe_schedule(num_stages: int, num_microbatches: int, reschedule: Sequence[int]) -> list[list[Unit]]:
    """Stage s runs min(M, P-s+r_s) warm-up forwards; the last stage always runs 1F1B (its B(m) must
    follow its F(m) directly), whatever r is given for it."""
    if len(reschedule) != num_stages:
        raise ValueError(f"need one reschedule count per stage ({num_stages}), got {len(reschedule)}")
    if any(r < 0 for r in reschedule):
        raise ValueError(f"reschedule counts must be >= 0, got {list(reschedule)}")
    extra = [*reschedule[:-1], 0]
    return [warmup_order(num_microbatches, num_stages - s + extra[s]) for s in range(num_stages)]


def gpipe(num_stages: int, num_microbatches: int) -> list[list[Unit]]:
    order = [("F", m) for m in range(num_microbatches)] + [("B", m) for m in range(num_microbatches)]
    return [list(order) for _ in range(num_stages)]


def reschedule_counts(
    bwd_time_max: Sequence[float],
    fwd_time_opt: Sequence[float],
    num_microbatches: int,
    memory_cap: Sequence[int] | int | None = None,
) -> list[int]:
    """EnvPipe's r_s: extra warm-up forwards per stage.

    r_s = floor(Tb_s(f_max) * (P-s-1) / Tf_s(f_opt)) fills the wait for B0's gradient (which passes
    P-s-1 downstream backwards at max clock) with forwards at the valley clock; then capped by
    memory (micro-batches of activations that fit) and by M-(P-s); then made non-increasing
    across stages unless the upstream stage is already saturated (r_i + P - i == M); 0 on the
    last stage. Same rule as EnvPipe's get_reschedule_forward_cnt and the fix-up in its schedule.
    """
    P, M = len(bwd_time_max), num_microbatches
    if len(fwd_time_opt) != P:
        raise ValueError("bwd_time_max and fwd_time_opt must have one entry per stage")
    caps: list[int | None]
    caps = [memory_cap] * P if memory_cap is None or isinstance(memory_cap, int) else list(memory_cap)
    r = []
    for s in range(P):
        if s == P - 1:
            r.append(0)
            continue
        raw = math.floor(bwd_time_max[s] * (P - s - 1) / fwd_time_opt[s])
        cap = caps[s]
        if cap is not None:
            raw = min(raw, cap)
        r.append(max(0, min(raw, M - (P - s))))
    for i in range(P - 1):
        if r[i] < r[i + 1] and r[i] + (P - i) != M:
            r[i + 1] = r[i]
    r[P - 1] = 0
    return r


def build_schedule(
    name: str, num_stages: int, num_microbatches: int, reschedule: Sequence[int] | None = None
) -> list[list[Unit]]:
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError("a pipeline needs at least 1 stage and 1 micro-batch")
    if name == "1f1b":
        return one_f_one_b(num_stages, num_microbatches)
    if name == "gpipe":
        return gpipe(num_stages, num_microbatches)
    if name == "envpipe":
        return envpipe_schedule(num_stages, num_microbatches, reschedule or [0] * num_stages)
    raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
