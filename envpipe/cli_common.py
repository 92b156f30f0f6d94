"""What the `envpipe` commands share: finite-number and per-stage options, output-path checks, one-line
errors, and showing and writing a simulated plan."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from envpipe.limits import MAX_STAGES, output_path_error, parse_slowdown, quote, range_error
from envpipe.plan.planfile import Plan
from envpipe.plan.render import summary_table, text_trace
from envpipe.plan.simulate import Overheads, Timeline

_MAX_ERROR_CHARS = 300
F = TypeVar("F", bound=Callable[..., Any])


class Finite(click.ParamType):
    """A finite float in [low, high] (``(low, high]`` when ``low_open``): click's FloatRange lets nan and inf in."""

    name = "float"

    def __init__(self, low: float, high: float, low_open: bool = False) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return f"FLOAT {'(' if self.low_open else '['}{self.low:g}, {self.high:g}]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            number = float(value)
        except (TypeError, ValueError):
            self.fail(f"{one_line(repr(value))} is not a number", param, ctx)
        reason = range_error(number, self.low, self.high, self.low_open)
        if reason:
            self.fail(reason, param, ctx)
        return number


class Slowdown(click.ParamType):
    """A slowdown: a fraction in [0, 1) or a percent with '%' (envpipe.limits.parse_slowdown)."""

    name = "slowdown"

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "FRACTION | PERCENT%"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            return parse_slowdown(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


class PerStage(click.ParamType):
    """One finite number in [low, high] for every stage (a float), or one per stage separated by commas (an
    array): ``0.02`` or ``0.02,0.03``. Whether the count fits the pipeline is checked once it is known
    (``per_stage_count``)."""

    name = "numbers"

    def __init__(self, what: str, low: float, high: float, unit: str) -> None:
        self.what, self.low, self.high, self.unit = what, low, high, unit

    def get_metavar(self, param: click.Parameter, ctx: click.Context) -> str:
        return "X | X0,X1,..."

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float | np.ndarray:
        if isinstance(value, float | np.ndarray):
            return value
        parts = str(value).split(",")
        if len(parts) > MAX_STAGES:
            self.fail(f"{len(parts)} values; at most one per stage ({MAX_STAGES})", param, ctx)
        try:
            numbers = [float(v) for v in parts]
        except ValueError:
            self.fail(f"{quote(value)}: expected {self.unit}, e.g. 0.02 or 0.02,0.03", param, ctx)
        reasons = [r for r in (range_error(x, self.low, self.high) for x in numbers) if r]
        if reasons:
            self.fail(f"{self.what} {reasons[0]}", param, ctx)
        return numbers[0] if len(numbers) == 1 else np.array(numbers)


def per_stage_count(value: float | np.ndarray | None, num_stages: int, what: str, option: str) -> None:
    """A per-stage option's values must be one, or one per stage: a usage error naming the option otherwise."""
    if isinstance(value, np.ndarray) and value.size != num_stages:
        raise click.BadParameter(f"{value.size} {what} given for {num_stages} stages (give one, or one per stage)",
                                 param_hint=option)


def output_option(*names: str, help: str, suffixes: tuple[str, ...] = ()) -> Callable[[F], F]:
    """An option naming a file the command writes, checked before any work: a wrong suffix, a directory, or
    a place that cannot be written is one line at once, not a traceback after minutes of planning.
    Missing directories are fine (created when the file is written)."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        if suffixes and Path(value).suffix.lower() not in suffixes:
            raise click.BadParameter(f"must end in {' or '.join(suffixes)}", ctx, param)
        why = output_path_error(value)
        if why is not None:
            raise click.BadParameter(why, ctx, param)
        return value

    return click.option(*names, type=click.Path(dir_okay=False), default=None, callback=check, help=help)


def one_line(message: str) -> str:
    """An error message as one line of bounded length (an error must never be a 600 KB line)."""
    text = " ".join(message.split())
    return text if len(text) <= _MAX_ERROR_CHARS else f"{text[:_MAX_ERROR_CHARS]}... ({len(text):,} characters)"


class OneLineErrors(click.Group):
    """Every error as one line on stderr: a usage block or a traceback hides the one thing that is wrong."""

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.UsageError as exc:
            hint = f" (see '{exc.ctx.command_path} -h')" if exc.ctx else ""
            _fail(one_line(exc.format_message()) + hint, exc.exit_code)
        except click.ClickException as exc:
            _fail(one_line(exc.format_message()), exc.exit_code)
        except click.Abort:  # Ctrl-C: the shell's convention, 128 + SIGINT
            _fail("interrupted", 130)
        except MemoryError:
            _fail("out of memory: try fewer stages or micro-batches", 1)
        except OSError as exc:
            if exc.errno != errno.EPIPE:
                raise
            # the reader of our output went away (`envpipe ... | head`): the Python docs' remedy, so that the
            # interpreter's last flush does not fail again
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


def _fail(message: str, code: int) -> None:
    click.echo(f"Error: {message}", err=True)
    sys.exit(code)


@dataclass(frozen=True)
class Outputs:
    """What a command shows and writes besides its summary: the text trace, the plan JSON, the Gantt picture."""

    text: bool
    out: str | None
    gantt: str | None


@dataclass(frozen=True)
class PlanOptions:
    """`envpipe plan`'s options, as click parses them (one field per option)."""

    profile_path: str
    microbatches: int
    stages: int | None
    schedule: str
    chunks: int | None
    policy: str
    reconfig: str
    blocking_power: float | np.ndarray | None
    tail_power: float | np.ndarray | None
    gpu: str
    transfer_time: float
    tail_time: float | np.ndarray
    activation_bytes: int | list[int] | None
    memory_available: int | list[int] | None
    threshold_scale: float
    out: str | None
    text: bool
    gantt: str | None
    max_slowdown: float | None
    time_budget: float | None
    time_limit: float | None
    frontier_csv: str | None
    frontier_points: int

    @property
    def outputs(self) -> Outputs:
        return Outputs(self.text, self.out, self.gantt)


@dataclass(frozen=True)
class Shown:
    """A simulated iteration to show: its timeline, each unit's clock (indexed like the timeline's DAG), the
    baseline it is compared with and that baseline's name (``1F1B all-max``)."""

    timeline: Timeline
    clocks_mhz: np.ndarray
    baseline: Timeline
    baseline_name: str


def watts(power_w: np.ndarray) -> str:
    """``83.64 W``, or ``80, 90 W per stage``."""
    if np.all(power_w == power_w[0]):
        return f"{power_w[0]:g} W"
    return f"{', '.join(f'{w:g}' for w in power_w)} W per stage"


def powers(overheads: Overheads) -> str:
    """``blocking power 83.64 W``, and the tail power where it is not the blocking power."""
    text = f"blocking power {watts(overheads.blocking_power_w)}"
    if np.any(overheads.tail_power_w != overheads.blocking_power_w):
        text += f", tail power {watts(overheads.tail_power_w)}"
    return text


def show(shown: Shown, title: str, outputs: Outputs) -> None:
    """The text trace (when asked) and the summary table of a simulated plan."""
    if outputs.text:
        click.echo(text_trace(shown.timeline, shown.clocks_mhz))
    click.echo(summary_table(shown.timeline, shown.baseline, title, shown.baseline_name))


def write_outputs(shown: Shown, plan: Plan | None, outputs: Outputs, gantt_title: str) -> None:
    """The plan JSON and the Gantt picture, where asked; a write that fails is one line, not a traceback."""
    from envpipe.plan.gantt import draw_gantt

    out, gantt = outputs.out, outputs.gantt
    try:
        if out and plan is not None:
            plan.save(out)
            click.echo(f"plan written to {out}")
        if gantt:
            draw_gantt(shown.timeline, shown.clocks_mhz, gantt, gantt_title, label="simulated")
            click.echo(f"Gantt picture written to {gantt}")
    except OSError as exc:
        raise click.ClickException(f"cannot write {exc.filename or out or gantt}: {exc.strerror or exc}") from None
