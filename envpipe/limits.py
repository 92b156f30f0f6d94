"""The planner's documented input limits (docs/planner.md, "Limits") and the checks that enforce them.

Every number a user gives the planner (profile CSV, plan JSON, `envpipe` options) is finite and inside
these bounds, so no input can make it allocate gigabytes, overflow to inf or divide by zero. The bounds
are far outside real pipelines: a real unit takes milliseconds to seconds and tens of joules.
"""

from __future__ import annotations

import json
import math
import os
import reprlib
import stat
from pathlib import Path
from typing import Any, NoReturn

MAX_STAGES = 1024
MAX_MICROBATCHES = 65_536
MAX_UNITS = 131_072  # 2 x stages x micro-batches (64 stages x 1,024 micro-batches); bounds memory
# the optimal planner's LP: the units of an order that do not repeat (its warm-up, its cool-down and up to 32
# micro-batches around them; envpipe.plan.optimal.fold). At 32,768 a plan with EnvPipe's orders took up to 51 s on the
# 2-core VM at load 2-3 (128 stages x 128 micro-batches, measured 2026-11-28: benchmarks/results/planner_scale.md),
# too close to a minute on a busier machine; at 131,072 (1,024 x 64) one LP took 190 s. 64 stages take any number
# of micro-batches up to MAX_UNITS.
MAX_LP_UNITS = 24_576
MAX_CLOCKS = 1024  # distinct clocks in one profile
MAX_CLOCK_MHZ = 10_000
MAX_UNIT_TIME_S = 3600.0
MAX_UNIT_ENERGY_J = 1e7
MAX_POWER_W = 10_000.0  # idle power
MAX_SECONDS = 3600.0  # transfer and tail times
MAX_BUDGET_S = 1e9  # time budgets
MAX_FRONTIER_POINTS = 1000
MAX_THRESHOLD_SCALE = 1e6
MAX_PROFILE_ROWS = 262_144  # 2 x stages x clocks, e.g. 128 stages x 1,024 clocks
MAX_PROFILE_BYTES = 16 * 2**20
MAX_PLAN_BYTES = 16 * 2**20  # the largest plan (131,072 units) takes about 8 MiB
MAX_CONFIG_BYTES = 16 * 2**20  # a DeepSpeed config (a found configuration's included)
MAX_JSON_DEPTH = 8
MAX_JSON_INT_DIGITS = 18

_quote = reprlib.Repr()
_quote.maxstring = _quote.maxother = 40
_quote.maxlist = _quote.maxtuple = _quote.maxdict = 4
_quote.maxlevel = 2


def quote(value: object) -> str:
    """A short repr of a user's value for an error message (a 1 MB field must not become a 1 MB line)."""
    return _quote.repr(value)


def read_text(path: str | Path, max_bytes: int, what: str) -> str:
    """A regular UTF-8 file (a BOM is fine) of at most ``max_bytes``, read without ever holding more: /dev/zero
    or a huge file must not fill memory, and a FIFO must not block the reader (it is opened without waiting
    for a writer, then refused). OSError if it cannot be read; ValueError (the reason) if it is refused."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with open(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"not a regular file (a {what} is read from a file)")
        data = fh.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise ValueError(f"larger than {max_bytes // 2**20} MiB (the limit of a {what})")
    try:
        return data.decode("utf-8-sig")  # spreadsheet programs start UTF-8 files with a BOM
    except UnicodeDecodeError as exc:
        raise ValueError(f"not a UTF-8 {what} file (bad byte at offset {exc.start})") from None


def output_path_error(path: str | Path) -> str | None:
    """Why a file cannot be written at ``path`` (a directory, no writable directory above it, a name the system
    refuses), or None. Missing directories are fine: writers create them."""
    try:
        where = Path(path)
        if where.is_dir():
            return f"{path} is a directory"
        parent = where.absolute().parent
        while not parent.exists():
            parent = parent.parent
        if not parent.is_dir():
            return f"{parent} is not a directory"
        if not os.access(parent, os.W_OK | os.X_OK):
            return f"cannot write in {parent}"
    except (OSError, ValueError) as exc:  # a name too long, a NUL byte
        return f"not a usable file name: {exc}"
    return None


def parse_json(text: str, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """JSON with finite numbers only (no NaN or Infinity, no float that overflows), integers of at most
    ``MAX_JSON_INT_DIGITS`` digits, and nesting the parser survives; ValueError (the reason) otherwise. The
    caller checks its own depth (``json_depth``) against ``max_depth``, which the message for nesting beyond
    the parser names."""
    try:
        return json.loads(text, parse_constant=_refuse_constant, parse_float=_finite_float, parse_int=_short_int)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON: {exc}") from None
    except RecursionError:  # the C scanner stops cleanly at the interpreter's recursion limit
        raise ValueError(f"nested deeper than {max_depth} levels") from None


def _refuse_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not a finite number")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number out of range: {quote(text)}")
    return value


def _short_int(text: str) -> int:
    if len(text.lstrip("-")) > MAX_JSON_INT_DIGITS:
        raise ValueError(f"integer out of range: {quote(text)}")
    return int(text)


def json_depth(value: Any) -> int:
    """How deeply lists and objects nest (an object holding a list of numbers is 2)."""
    depth, level = 0, [value]
    while level:
        depth += 1
        level = [child for v in level for child in (v.values() if isinstance(v, dict) else v)
                 if isinstance(child, list | dict)]
    return depth


def range_error(value: float, low: float, high: float, low_open: bool = False) -> str | None:
    """Why ``value`` is not a finite number in [low, high] (``(low, high]`` when ``low_open``), or None."""
    if not math.isfinite(value):
        return f"must be a finite number, got {value}"
    if value < low or (low_open and value == low) or value > high:
        return f"must be in {'(' if low_open else '['}{low:g}, {high:g}], got {value:g}"
    return None


def parse_slowdown(value: object) -> float:
    """A slowdown as EnvPipe takes it everywhere (`envpipe plan|search --max-slowdown`, the runtime's
    `max_slowdown`, `train_gpt.py --max-slowdown`): a fraction in [0, 1), e.g. 0.05, or a percent with '%',
    e.g. "5%". ValueError (the reason, one line) otherwise: a bare 5 would be +500 % to one reader and +5 % to
    another, so a number of 1 or more is refused, with both readings spelled out."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{quote(value)} is not a slowdown: give a fraction in [0, 1) such as 0.05, or a percent "
                         "such as 5%")
    text = value.strip() if isinstance(value, str) else ""
    percent = text.endswith("%")
    try:
        number = float(text.removesuffix("%").strip()) if isinstance(value, str) else float(value)
    except ValueError:
        raise ValueError(f"{quote(value)} is not a slowdown: give a fraction in [0, 1) such as 0.05, or a percent "
                         "such as 5%") from None
    if not math.isfinite(number):
        raise ValueError(f"the slowdown must be a finite number, got {quote(value)}")
    fraction = number / 100 if percent else number
    if fraction < 0:
        raise ValueError(f"the slowdown must not be negative, got {quote(value)}")
    if fraction >= 1:
        if percent:
            raise ValueError(f"the slowdown must be below 100 %, got {quote(value)}")
        raise ValueError(f"the slowdown {number:g} is not a fraction in [0, 1): for +{number:g} % write "
                         f"{number:g}% or {number / 100:g}")
    return fraction


def units_error(num_stages: int, num_microbatches: int) -> str | None:
    """Why a pipeline of this size is refused, or None."""
    units = 2 * num_stages * num_microbatches
    if units > MAX_UNITS:
        return (f"{num_stages} stages x {num_microbatches} micro-batches is {units:,} units; "
                f"the planner takes at most {MAX_UNITS:,} (2 x stages x micro-batches)")
    return None
