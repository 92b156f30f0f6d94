"""Load and validate stage profiles in the Perseus/Zeus CSV format.

One row per (stage, instruction, frequency): ``stage,instruction,frequency,time,energy`` with
instruction ``forward`` or ``backward``, frequency in MHz, time in seconds and energy in joules.
Every stage must have both instructions at every clock of one shared clock set.
"""

from __future__ import annotations

import csv
import hashlib
import io
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from envpipe.atomicfile import atomic_write
from envpipe.limits import (
    MAX_CLOCK_MHZ,
    MAX_CLOCKS,
    MAX_PROFILE_BYTES,
    MAX_PROFILE_ROWS,
    MAX_STAGES,
    MAX_UNIT_ENERGY_J,
    MAX_UNIT_TIME_S,
    quote,
    range_error,
    read_text,
)

REQUIRED_COLUMNS = ("stage", "instruction", "frequency", "time", "energy")
INSTRUCTIONS = ("forward", "backward")
_DATA_DIR = Path(__file__).parent / "data"


class ProfileError(ValueError):
    """A profile file is malformed; the message names the file, the line and the reason."""

    def __init__(self, path: str | Path, line: int | None, reason: str) -> None:
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: {reason}")
        self.path, self.line, self.reason = str(path), line, reason


@dataclass(frozen=True)
class Profile:
    """Per-stage forward/backward time (s) and energy (J) at each clock.

    ``freqs`` is sorted from highest to lowest; arrays are indexed ``[stage, freq_index]``.
    """

    freqs: np.ndarray  # (K,) int MHz, descending
    fwd_time: np.ndarray  # (S, K)
    bwd_time: np.ndarray
    fwd_energy: np.ndarray
    bwd_energy: np.ndarray
    source: str = "<memory>"

    @property
    def num_stages(self) -> int:
        return int(self.fwd_time.shape[0])

    @property
    def f_max(self) -> int:
        return int(self.freqs[0])

    def freq_index(self, mhz: int) -> int:
        hits = np.flatnonzero(self.freqs == mhz)
        if hits.size == 0:
            raise KeyError(f"{mhz} MHz is not a clock of profile {self.source}")
        return int(hits[0])

    def time(self, kind: str, stage: int, freq_idx: int) -> float:
        table = self.fwd_time if kind == "F" else self.bwd_time
        return float(table[stage, freq_idx])

    def energy(self, kind: str, stage: int, freq_idx: int) -> float:
        table = self.fwd_energy if kind == "F" else self.bwd_energy
        return float(table[stage, freq_idx])

    def restricted(self, freqs: list[int] | np.ndarray) -> Profile:
        """The same profile over a subset of its clocks (kept in descending order)."""
        wanted = sorted({int(f) for f in freqs}, reverse=True)
        idx = [self.freq_index(f) for f in wanted]
        return Profile(
            np.asarray(wanted, dtype=np.int64),
            self.fwd_time[:, idx],
            self.bwd_time[:, idx],
            self.fwd_energy[:, idx],
            self.bwd_energy[:, idx],
            self.source,
        )

    def with_stages(self, num_stages: int) -> Profile:
        """A profile of ``num_stages`` stages: cut, or tiled cyclically from the measured stages.

        Tiling is for what-if studies and benchmarks of larger pipelines; it is not a measurement.
        """
        if num_stages < 1:
            raise ValueError("number of stages must be at least 1")
        idx = [s % self.num_stages for s in range(num_stages)]
        return Profile(
            self.freqs,
            self.fwd_time[idx],
            self.bwd_time[idx],
            self.fwd_energy[idx],
            self.bwd_energy[idx],
            self.source,
        )

    @property
    def digest(self) -> str:
        """A fingerprint of the numbers (not the file): plans record it to refuse being simulated on another profile."""
        h = hashlib.sha256(f"{self.num_stages},{self.freqs.size};".encode())
        h.update(np.ascontiguousarray(self.freqs, "<i8").tobytes())
        for table in (self.fwd_time, self.bwd_time, self.fwd_energy, self.bwd_energy):
            h.update(np.ascontiguousarray(table, "<f8").tobytes())
        return f"sha256:{h.hexdigest()}"

    def to_csv(self, path: str | Path) -> None:
        with atomic_write(path, newline="") as fh:
            w = csv.writer(fh)
            w.writerow(REQUIRED_COLUMNS)
            for s in range(self.num_stages):
                for k, f in enumerate(self.freqs):
                    w.writerow([s, "forward", int(f), repr(float(self.fwd_time[s, k])),
                                repr(float(self.fwd_energy[s, k]))])
                    w.writerow([s, "backward", int(f), repr(float(self.bwd_time[s, k])),
                                repr(float(self.bwd_energy[s, k]))])


def embedded_profile_path(name: str = "gpt3-175b+a100_sxm_bf16") -> Path:
    """Path of a profile shipped with the package (see envpipe/profile/data/README.md)."""
    path = _DATA_DIR / f"{name}.csv"
    if not path.exists():
        shipped = sorted(p.stem for p in _DATA_DIR.glob("*.csv"))
        raise FileNotFoundError(f"no embedded profile {name!r}; shipped: {', '.join(shipped)}")
    return path


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile CSV (a UTF-8 BOM is fine); raise ProfileError on the first problem."""
    path = Path(path)
    text = _read_text(path)
    if not text.strip():
        raise ProfileError(path, None, "empty file")
    reader = csv.reader(io.StringIO(text, newline=""))
    rows: dict[tuple[int, str, int], tuple[float, float]] = {}
    clocks: set[int] = set()
    try:
        columns = _columns(path, next(reader, []))
        for fields in reader:
            line = reader.line_num
            if not any(f.strip() for f in fields):
                continue
            if len(fields) != columns["fields"]:
                raise ProfileError(path, line, f"{len(fields)} fields, the header has {columns['fields']}")
            if len(rows) == MAX_PROFILE_ROWS:
                raise ProfileError(path, line, f"more than {MAX_PROFILE_ROWS:,} rows (the limit of a profile)")
            stage, instr, freq, time, energy = _row(path, line, fields, columns)
            key = (stage, instr, freq)
            if key in rows:
                raise ProfileError(path, line, f"duplicate row for stage {stage} {instr} at {freq} MHz")
            clocks.add(freq)
            if len(clocks) > MAX_CLOCKS:
                raise ProfileError(path, line, f"more than {MAX_CLOCKS} distinct clocks (the limit of a profile)")
            rows[key] = (time, energy)
    except csv.Error as exc:
        raise ProfileError(path, reader.line_num, f"malformed CSV: {exc}") from None
    if not rows:
        raise ProfileError(path, None, "no data rows")
    return _to_profile(path, rows)


def _read_text(path: Path) -> str:
    try:
        text = read_text(path, MAX_PROFILE_BYTES, "profile")
    except OSError as exc:
        raise ProfileError(path, None, f"cannot open: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise ProfileError(path, None, str(exc)) from None
    if "\0" in text:
        raise ProfileError(path, None, "not a text CSV file (it contains NUL bytes)")
    return text


def _columns(path: Path, header: list[str]) -> dict[str, int]:
    """Position of each required column, and the header's field count under "fields"."""
    names = [h.strip() for h in header]
    repeated = sorted(name for name, n in Counter(names).items() if n > 1 and name)
    if repeated:
        raise ProfileError(path, 1, f"duplicate column(s): {', '.join(quote(n) for n in repeated[:5])}")
    missing = [c for c in REQUIRED_COLUMNS if c not in names]
    if missing:
        raise ProfileError(path, 1, f"missing column(s): {', '.join(missing)}")
    return {**{c: names.index(c) for c in REQUIRED_COLUMNS}, "fields": len(names)}


def _row(path: Path, line: int, fields: list[str], columns: dict[str, int]) -> tuple[int, str, int, float, float]:
    def number(column: str, low: float, high: float, integer: bool = False) -> float:
        text = fields[columns[column]].strip()
        try:
            value = float(text)
        except ValueError:
            raise ProfileError(path, line, f"column {column!r} is not a number: {quote(text)}") from None
        if integer and math.isfinite(value) and not value.is_integer():
            raise ProfileError(path, line, f"column {column!r} is not an integer: {quote(text)}")
        reason = range_error(value, low, high, low_open=not integer)
        if reason:
            raise ProfileError(path, line, f"{column} {reason}")
        return value

    stage = int(number("stage", 0, MAX_STAGES - 1, integer=True))
    instr = fields[columns["instruction"]].strip()
    if instr not in INSTRUCTIONS:
        raise ProfileError(path, line, f"instruction must be forward or backward, got {quote(instr)}")
    freq = int(number("frequency", 1, MAX_CLOCK_MHZ, integer=True))
    return stage, instr, freq, number("time", 0, MAX_UNIT_TIME_S), number("energy", 0, MAX_UNIT_ENERGY_J)


def _to_profile(path: Path, rows: dict[tuple[int, str, int], tuple[float, float]]) -> Profile:
    stages = sorted({k[0] for k in rows})
    if stages != list(range(len(stages))):
        gaps = sorted(set(range(stages[-1] + 1)) - set(stages))
        raise ProfileError(path, None, f"stages must be numbered 0..{stages[-1]}; missing stage(s) {gaps[:5]}")
    clock_sets: dict[int, set[int]] = {s: set() for s in stages}
    for s, _, f in rows:
        clock_sets[s].add(f)
    freqs = sorted(clock_sets[0], reverse=True)
    for s in stages:
        if clock_sets[s] != clock_sets[0]:
            diff = sorted(clock_sets[s] ^ clock_sets[0])
            raise ProfileError(path, None, f"stage {s} does not share stage 0's clock set (differs at {diff[:5]} MHz)")
        for instr in INSTRUCTIONS:
            lacking = [f for f in freqs if (s, instr, f) not in rows]
            if lacking:
                raise ProfileError(path, None, f"stage {s} has no {instr} row at {lacking[:5]} MHz")
    S, K = len(stages), len(freqs)
    arrays = {name: np.empty((S, K)) for name in ("ft", "bt", "fe", "be")}
    for s in stages:
        for k, f in enumerate(freqs):
            arrays["ft"][s, k], arrays["fe"][s, k] = rows[(s, "forward", f)]
            arrays["bt"][s, k], arrays["be"][s, k] = rows[(s, "backward", f)]
    return Profile(np.asarray(freqs, dtype=np.int64), arrays["ft"], arrays["bt"], arrays["fe"],
                   arrays["be"], str(path))
