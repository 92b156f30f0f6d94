"""Pipeline schedules as per-stage ordered lists of units.

A unit is ``(kind, mb)`` with kind ``"F"`` (forward) or ``"B"`` (backward). Like DeepSpeed's
``runtime/pipe/schedule.py``, an order is plain data that can be printed, compared and tested.

- 1F1B (DeepSpeed's TrainSchedule): stage s runs min(M, P-s) forwards before its first backward,
  then alternates B, F, then drains the remaining backwards.
- EnvPipe: the same shape with min(M, P-s+r_s) warm-up forwards (r_s from ``reschedule_counts``),
  so the bubble before the first backward is filled with (slow) forwards.
- GPipe: all forwards, then all backwards.
- Interleaved 1F1B (Megatron's virtual pipeline, v chunks per stage, envpipe.plan.layout): forwards visit
  chunks in groups of P micro-batches (micro-batches 0..P-1 on chunk 0, then on chunk 1, ...), backwards
  the chunks in reverse; stage s runs 2(P-s-1) + (v-1)P forwards, then alternates F, B, then drains.
- DualPipeV (DeepSeek-V3's, exactly as DeepSpeed 0.19's DualPipeVSchedule orders it): rank s runs
  phase 0 (chunk 0) and phase 1 (chunk 1) in DeepSpeed's eight steps, weight gradients kept inside B.

Units of a schedule with several chunks per stage are ``(kind, mb, chunk)``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from envpipe.plan.layout import StageLayout

Unit = tuple[str, int]  # (kind, micro-batch) on a stage that runs one model stage
ChunkUnit = tuple[str, int, int]  # (kind, micro-batch, chunk) on a stage that runs several
SCHEDULES = ("1f1b", "envpipe", "gpipe", "interleaved", "dualpipev")
CHUNKED = {"interleaved": 2, "dualpipev": 2}  # schedules with several chunks per stage, and their default count


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


def interleaved_1f1b(num_stages: int, num_microbatches: int, chunks: int) -> list[list[ChunkUnit]]:
    """Megatron's interleaved 1F1B with ``chunks`` model chunks per stage (micro-batch groups of P).

    Forward k (of M·v) runs micro-batch ``g·P + k % P`` of chunk ``(k // P) % v`` in group g = k // (P·v);
    backward k the same micro-batch of chunk v-1-that; stage s runs min(M·v, 2(P-s-1) + (v-1)P) forwards,
    then forward, backward pairs, then the remaining backwards. Megatron needs M divisible by P."""
    P, M, v = num_stages, num_microbatches, chunks
    if v < 2:
        raise ValueError(f"interleaved 1F1B needs at least 2 chunks per stage, got {v}")
    if M % P:
        raise ValueError(f"interleaved 1F1B needs the micro-batches ({M}) to be a multiple of the stages ({P}), "
                         "as Megatron's schedule does")
    table = [(g + m, k) for g in range(0, M, P) for k in range(v) for m in range(P)]  # forward k -> (mb, chunk)
    total = M * v

    def forward(i: int) -> ChunkUnit:
        return "F", table[i][0], table[i][1]

    def backward(i: int) -> ChunkUnit:
        return "B", table[i][0], v - 1 - table[i][1]

    orders = []
    for s in range(P):
        warmup = min(total, 2 * (P - s - 1) + (v - 1) * P)
        order = [forward(i) for i in range(warmup)]
        for i in range(total - warmup):
            order += [forward(warmup + i), backward(i)]
        order += [backward(i) for i in range(total - warmup, total)]
        orders.append(order)
    return orders


def dualpipev(num_stages: int, num_microbatches: int) -> list[list[ChunkUnit]]:
    """DualPipeV's unit order per rank, step by step as DeepSpeed's DualPipeVSchedule.steps() yields it
    (chunk = DeepSpeed's phase; each (phase, kind) takes its micro-batches in order). Needs M >= 2P."""
    P, M = num_stages, num_microbatches
    if M < 2 * P:
        raise ValueError(f"DualPipeV needs at least 2 x {P} micro-batches, got {M} (as DeepSpeed's schedule)")
    orders = []
    for r in range(P):
        ahead = P - r - 1
        steps: list[tuple[int, str]] = (
            [(0, "F")] * 2 * ahead  # 1: nF0
            + [(0, "F"), (1, "F")] * (r + 1)  # 2: nF0F1
            + [(1, "B"), (1, "F")] * ahead  # 3: nB1W1F1 (W inside B)
            + [(0, "F"), (1, "B"), (1, "F"), (0, "B")] * (M - 2 * P + r + 1)  # 4: nF0B1F1B0
            + [(1, "B"), (1, "F"), (0, "B")] * ahead  # 5: nB1F1B0
            + [(1, "B"), (0, "B")] * (r + 1)  # 6: nB1B0
            + [(0, "B")] * ahead)  # 7: nWB0 (8: nW has no unit)
        count = {key: 0 for key in ((0, "F"), (1, "F"), (0, "B"), (1, "B"))}
        order: list[ChunkUnit] = []
        for phase, kind in steps:
            order.append((kind, count[phase, kind], phase))
            count[phase, kind] += 1
        orders.append(order)
    return orders


def schedule_layout(name: str, num_stages: int, chunks: int | None = None) -> StageLayout:
    """The stage layout a schedule runs on (``chunks``: interleaved 1F1B's v; DualPipeV always has 2)."""
    if name == "interleaved":
        return StageLayout.interleaved(num_stages, CHUNKED[name] if chunks is None else chunks)
    if chunks not in (None, CHUNKED.get(name, 1)):
        raise ValueError(f"schedule {name} has {CHUNKED.get(name, 1)} chunk(s) per stage, not {chunks}")
    return StageLayout.v_shape(num_stages) if name == "dualpipev" else StageLayout.single(num_stages)


def check_schedule(schedule: str, layout: StageLayout) -> None:
    """That ``schedule`` is a known schedule and runs on ``layout`` (clear ValueErrors otherwise)."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    chunked = schedule in CHUNKED
    if (layout.chunks > 1) != chunked or schedule_layout(schedule, layout.num_stages, layout.chunks) != layout:
        needs = "several model chunks per stage" if chunked else "one model stage per pipeline stage"
        raise ValueError(f"schedule {schedule} does not run on this layout of model stages ({layout.num_stages} "
                         f"stages x {layout.chunks} chunk(s)): it needs {needs}")


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
    name: str, num_stages: int, num_microbatches: int, reschedule: Sequence[int] | None = None,
    chunks: int | None = None,
) -> list[list[Unit]] | list[list[ChunkUnit]]:
    """Per-stage unit orders of a schedule (``chunks``: model chunks per stage of interleaved 1F1B)."""
    if num_stages < 1 or num_microbatches < 1:
        raise ValueError("a pipeline needs at least 1 stage and 1 micro-batch")
    if name == "interleaved":
        return interleaved_1f1b(num_stages, num_microbatches, schedule_layout(name, num_stages, chunks).chunks)
    schedule_layout(name, num_stages, chunks)  # refuses a chunk count the schedule does not have
    if name == "dualpipev":
        return dualpipev(num_stages, num_microbatches)
    if name == "1f1b":
        return one_f_one_b(num_stages, num_microbatches)
    if name == "gpipe":
        return gpipe(num_stages, num_microbatches)
    if name == "envpipe":
        return envpipe_schedule(num_stages, num_microbatches, reschedule or [0] * num_stages)
    raise ValueError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
