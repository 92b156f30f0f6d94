"""Activation memory in bytes: what each pipeline stage can hold in flight, and what a unit order needs.

A forward pass leaves its activations on its stage until the backward of the same micro-batch has
run; the number of micro-batches whose forward ran and whose backward has not yet ended is the
stage's *in-flight* count. It depends only on the unit order, never on clocks or durations: 1F1B
holds min(M, P - s) on stage s, EnvPipe's order P - s + r_s, GPipe M.

With several model chunks per stage (interleaved 1F1B, DualPipeV) the in-flight count is counted in
(chunk, micro-batch) pairs, and one pair holds 1/chunks of the stage's activation bytes per
micro-batch: the stage's layers are split evenly over its chunks (docs/planner.md).

Pure: no numpy, no I/O, so the runtime and the configuration search can use it freely.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
           "KI": 2**10, "MI": 2**20, "GI": 2**30, "TI": 2**40}
_BYTES = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kKmMgGtT][iI]?)?[bB]?\s*")


class MemoryLimitError(ValueError):
    """A unit order needs more activation memory on some stage than the stage has."""


def parse_bytes(text: str) -> int:
    """``"80G"`` -> 80e9, ``"1.5GiB"`` -> 1.5 * 2**30, ``"4096"`` -> 4096 (SI and binary suffixes, optional B)."""
    match = _BYTES.fullmatch(text)
    if match is None:
        raise ValueError(f"{text!r} is not an amount of bytes (e.g. 4096, 512MiB, 1.5G)")
    number, suffix = match.groups()
    return round(float(number) * _SUFFIX[(suffix or "").upper()])


def format_bytes(count: float) -> str:
    """Exact bytes and a readable binary size: ``9663676416 B (9.00 GiB)``."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if count >= size:
            return f"{count:.0f} B ({count / size:.2f} {unit})"
    return f"{count:.0f} B"


def describe_peaks(peak_bytes: Sequence[int]) -> str:
    """One line: each stage's peak in-flight activation memory in GiB."""
    return "peak activation memory per stage (GiB): " + " ".join(f"{b / 2**30:.2f}" for b in peak_bytes)


@dataclass(frozen=True)
class StageMemory:
    """Per pipeline stage: the bytes of activations one in-flight micro-batch holds until its backward,
    and the bytes available for in-flight activations (the device's memory limit minus static memory:
    weights, gradients, optimizer state, workspace)."""

    activation_bytes: tuple[int, ...]
    available_bytes: tuple[int, ...]

    def __post_init__(self) -> None:
        if len(self.activation_bytes) != len(self.available_bytes) or not self.activation_bytes:
            raise ValueError(f"{len(self.activation_bytes)} activation sizes but {len(self.available_bytes)} "
                             "memory limits: give one of each per stage")
        for name, values in (("activation bytes", self.activation_bytes), ("available bytes", self.available_bytes)):
            if any(not isinstance(v, int) or isinstance(v, bool) or v < 0 for v in values):
                raise ValueError(f"{name} must be whole numbers >= 0, got {list(values)}")
        if any(a == 0 for a in self.activation_bytes):
            raise ValueError("activation bytes per micro-batch must be positive")

    @classmethod
    def per_stage(cls, num_stages: int, activation_bytes: int | Sequence[int],
                  available_bytes: int | Sequence[int]) -> StageMemory:
        """One number for every stage, or one per stage, for each of the two quantities."""
        def spread(value: int | Sequence[int], name: str) -> tuple[int, ...]:
            values = (value,) * num_stages if isinstance(value, int) else tuple(value)
            if len(values) != num_stages:
                raise ValueError(f"{len(values)} {name} given for {num_stages} stages")
            return values
        return cls(spread(activation_bytes, "activation sizes"), spread(available_bytes, "memory limits"))

    @property
    def num_stages(self) -> int:
        return len(self.activation_bytes)

    def capacity(self) -> list[int]:
        """Per stage, the most micro-batches (one chunk per stage) whose activations fit at once."""
        return [b // a for a, b in zip(self.activation_bytes, self.available_bytes, strict=True)]

    def peak_bytes(self, in_flight: Sequence[int], chunks: int = 1) -> list[int]:
        """Bytes each stage holds at its peak, for per-stage peak in-flight counts (in chunk micro-batches)."""
        return [-(-n * a // chunks) for n, a in zip(in_flight, self.activation_bytes, strict=True)]

    def check(self, orders: Sequence[Sequence[tuple[str, int] | tuple[str, int, int]]], what: str,
              chunks: int = 1) -> list[int]:
        """Per-stage peak bytes of ``orders``; MemoryLimitError naming the first stage that does not fit."""
        if len(orders) != self.num_stages:
            raise ValueError(f"memory is given for {self.num_stages} stages, the pipeline has {len(orders)}")
        peaks = peak_in_flight(orders)
        needed = self.peak_bytes(peaks, chunks)
        for s, (n, need, have) in enumerate(zip(peaks, needed, self.available_bytes, strict=True)):
            if n * self.activation_bytes[s] > have * chunks:  # exact: no rounding of the even chunk split
                held = f"{n} micro-batches" if chunks == 1 else f"{n} chunk micro-batches (1/{chunks} stage each)"
                raise MemoryLimitError(f"stage {s}: the {what} order holds {held} of activations in flight, "
                                       f"{format_bytes(need)}, more than the {format_bytes(have)} available")
        return needed


def peak_in_flight(orders: Sequence[Sequence[tuple[str, int] | tuple[str, int, int]]]) -> list[int]:
    """Per stage, the most (chunk, micro-batch) pairs whose forward has started and whose backward has not
    ended, walking the stage's units in order (a forward allocates, its backward frees at its end)."""
    peaks = []
    for units in orders:
        held = peak = 0
        for unit in units:
            held += 1 if unit[0] == "F" else -1
            peak = max(peak, held)
        peaks.append(peak)
    return peaks


def warmup_caps(memory: StageMemory, num_stages: int) -> list[int]:
    """Per stage, the most extra warm-up forwards (EnvPipe's r_s) beyond 1F1B's P - s that still fit;
    negative where even 1F1B does not fit (check() then names the stage)."""
    if memory.num_stages != num_stages:
        raise ValueError(f"memory is given for {memory.num_stages} stages, the pipeline has {num_stages}")
    return [cap - (num_stages - s) for s, cap in enumerate(memory.capacity())]
