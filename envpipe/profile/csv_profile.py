"""Load and validate stage profiles in the Perseus/Zeus CSV format.

One row per (stage, instruction, frequency): ``stage,instruction,frequency,time,energy`` with
instruction ``forward`` or ``backward``, frequency in MHz, time in seconds and energy in joules.
Every stage must have both instructions at every clock of one shared clock set.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

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

    def to_csv(self, path: str | Path) -> None:
        with open(path, "w", newline="") as fh:
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


def _number(path: Path, line: int, column: str, text: str, kind: Callable[[str], float]) -> float:
    try:
        value = kind(text)
    except (TypeError, ValueError):
        raise ProfileError(path, line, f"column {column!r} is not a number: {text!r}") from None
    if isinstance(value, float) and not math.isfinite(value):
        raise ProfileError(path, line, f"column {column!r} is not finite: {text!r}")
    return value


def load_profile(path: str | Path) -> Profile:
    """Read and validate a profile CSV; raise ProfileError on the first problem found."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as exc:
        raise ProfileError(path, None, f"cannot open: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ProfileError(path, None, "not a text (UTF-8) CSV file") from None
    reader = csv.DictReader(io.StringIO(text, newline=""))
    header = reader.fieldnames or []
    missing = [c for c in REQUIRED_COLUMNS if c not in header]
    if missing:
        raise ProfileError(path, 1, f"missing column(s): {', '.join(missing)}")
    rows: dict[tuple[int, str, int], tuple[float, float]] = {}
    for row in reader:
        line = reader.line_num
        stage = int(_number(path, line, "stage", row["stage"], _int))
        if stage < 0:
            raise ProfileError(path, line, f"stage must be >= 0, got {stage}")
        instr = (row["instruction"] or "").strip()
        if instr not in INSTRUCTIONS:
            raise ProfileError(path, line, f"instruction must be forward or backward, got {instr!r}")
        freq = int(_number(path, line, "frequency", row["frequency"], _int))
        if freq <= 0:
            raise ProfileError(path, line, f"frequency must be positive, got {freq}")
        time = float(_number(path, line, "time", row["time"], float))
        if time <= 0:
            raise ProfileError(path, line, f"time must be positive, got {time}")
        energy = float(_number(path, line, "energy", row["energy"], float))
        if energy < 0:
            raise ProfileError(path, line, f"energy must not be negative, got {energy}")
        key = (stage, instr, freq)
        if key in rows:
            raise ProfileError(path, line, f"duplicate row for stage {stage} {instr} at {freq} MHz")
        rows[key] = (time, energy)
    if not rows:
        raise ProfileError(path, None, "no data rows")
    return _to_profile(path, rows)


def _int(text: str) -> int:
    value = float(text)
    if not value.is_integer():
        raise ValueError(text)
    return int(value)


def _to_profile(path: Path, rows: dict[tuple[int, str, int], tuple[float, float]]) -> Profile:
    stages = sorted({k[0] for k in rows})
    if stages != list(range(len(stages))):
        gaps = sorted(set(range(stages[-1] + 1)) - set(stages))
        raise ProfileError(path, None, f"stages must be numbered 0..{stages[-1]}; missing stage(s) {gaps}")
    clock_sets = {s: {k[2] for k in rows if k[0] == s} for s in stages}
    freqs = sorted(clock_sets[0], reverse=True)
    for s in stages:
        if clock_sets[s] != set(freqs):
            diff = sorted(clock_sets[s] ^ set(freqs))
            raise ProfileError(path, None, f"stage {s} does not share stage 0's clock set (differs at {diff} MHz)")
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
