"""What the `envpipe` commands share: finite-number options, output-path checks, one-line errors, and
showing and writing a simulated plan."""

from __future__ import annotations

import errno
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import numpy as np

from envpipe.limits import range_error
from envpipe.plan.planfile import Plan
from envpipe.plan.render import summary_table, text_trace
from envpipe.plan.simulate import Timeline

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


def output_option(*names: str, help: str, suffixes: tuple[str, ...] = ()) -> Callable[[F], F]:
    """An option naming a file the command writes, checked before any work: a wrong suffix, a directory, or
    a place that cannot be written is one line at once, not a traceback after minutes of planning.
    Missing directories are fine (created when the file is written)."""

    def check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
        if value is None:
            return None
        path = Path(value)
        if suffixes and path.suffix.lower() not in suffixes:
            raise click.BadParameter(f"must end in {' or '.join(suffixes)}", ctx, param)
        try:
            if path.is_dir():
                raise click.BadParameter(f"{value} is a directory", ctx, param)
            parent = path.absolute().parent
            while not parent.exists():
                parent = parent.parent
            if not parent.is_dir():
                raise click.BadParameter(f"{parent} is not a directory", ctx, param)
            if not os.access(parent, os.W_OK | os.X_OK):
                raise click.BadParameter(f"cannot write in {parent}", ctx, param)
        except (OSError, ValueError) as exc:  # a name too long, a NUL byte
            raise click.BadParameter(f"not a usable file name: {exc}", ctx, param) from None
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


def show(tl: Timeline, baseline: Timeline, clocks_mhz: np.ndarray, title: str, text: bool) -> None:
    """The text trace (when asked) and the summary table of a simulated plan."""
    if text:
        click.echo(text_trace(tl, clocks_mhz))
    click.echo(summary_table(tl, baseline, title))


def write_outputs(plan: Plan | None, out: str | None, tl: Timeline, clocks_mhz: np.ndarray, gantt: str | None,
                  gantt_title: str) -> None:
    """The plan JSON and the Gantt picture, where asked; a write that fails is one line, not a traceback."""
    from envpipe.plan.gantt import draw_gantt

    try:
        if out and plan is not None:
            plan.save(out)
            click.echo(f"plan written to {out}")
        if gantt:
            draw_gantt(tl, clocks_mhz, gantt, gantt_title)
            click.echo(f"Gantt picture written to {gantt}")
    except OSError as exc:
        raise click.ClickException(f"cannot write {exc.filename or out or gantt}: {exc.strerror or exc}") from None
