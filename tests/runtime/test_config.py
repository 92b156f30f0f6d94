"""The `envpipe` config block and ENVPIPE_* overrides."""

from __future__ import annotations

import math

import click
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from envpipe.cli_common import Slowdown
from envpipe.runtime.config import EnvPipeConfig, EnvPipeConfigError, parse, split


def test_defaults_and_block() -> None:
    assert parse(None, {}) == EnvPipeConfig()
    default = EnvPipeConfig()
    assert (default.type, default.scheduling, default.reconfig_method) == ("optimal", "envpipe", "replan")
    assert parse({"type": "envelope"}, {}).reconfig_method == "default"  # EnvPipe's own default: none
    cfg = parse({"type": "uniform", "scheduling": "1f1b", "reconfig": "greedy", "gpu": "h200"}, {})
    assert (cfg.type, cfg.scheduling, cfg.reconfig, cfg.gpu) == ("uniform", "1f1b", "greedy", "h200")


def test_environment_overrides_block() -> None:
    env = {"ENVPIPE_TYPE": "baseline", "ENVPIPE_SCHEDULING": "envpipe", "ENVPIPE_RECONFIGURE": "balanced"}
    cfg = parse({"type": "uniform", "scheduling": "1f1b"}, env)
    assert (cfg.type, cfg.scheduling, cfg.reconfig) == ("baseline", "envpipe", "balanced")


def test_split_leaves_input_alone() -> None:
    ds = {"train_batch_size": 8, "envpipe": {"type": "baseline"}}
    rest, cfg = split(ds, {})
    assert rest == {"train_batch_size": 8} and cfg.type == "baseline" and "envpipe" in ds


@pytest.mark.parametrize(
    ("block", "env", "message"),
    [
        ({"type": "fast"}, {}, r"'envpipe.type' is 'fast'; choose one of optimal, baseline, uniform, envelope"),
        ({}, {"ENVPIPE_SCHEDULING": "gpipe"}, r"ENVPIPE_SCHEDULING is 'gpipe'; choose one of 1f1b, envpipe"),
        ({}, {"ENVPIPE_RECONFIGURE": "fast"}, r"ENVPIPE_RECONFIGURE is 'fast'"),
        ({"clock": "nvml"}, {}, r"'envpipe.clock' is 'nvml'"),
        ({"shedule": "1f1b"}, {}, r"unknown key\(s\) in 'envpipe' block: shedule"),
        ({"gpu": 3}, {}, r"'envpipe.gpu' is 3: input should be a valid string"),
        ({"gpu": ""}, {}, r"'envpipe.gpu' is '': string should have at least 1 character"),
        ({"plan": "a.json", "profile": "b.csv"}, {}, r"either 'plan'"),
        ([1], {}, r"must be an object, got list"),
        ({"max_slowdown": 0.1, "time_budget_s": 2.0}, {}, r"either 'max_slowdown' or 'time_budget_s'"),
        ({"max_slowdown": 1.5}, {}, r"'envpipe.max_slowdown' is 1.5: the slowdown 1.5 is not a fraction in \[0, 1\)"),
        ({"max_slowdown": 5}, {}, r"'envpipe.max_slowdown' is 5: .* for \+5 % write 5% or 0.05"),
        ({"max_slowdown": "120%"}, {}, r"the slowdown must be below 100 %"),
        ({"max_slowdown": True}, {}, r"True is not a slowdown"),
        ({"max_slowdown": float("nan")}, {}, r"the slowdown must be a finite number"),
        ({"straggler_threshold": 10**400}, {}, r"straggler_threshold' is 10{36}\.\.\.: input should be a valid number"),
        ({"time_budget_s": 0}, {}, r"'envpipe.time_budget_s' is 0: input should be greater than 0"),
        ({"memory_headroom": -0.1}, {}, r"input should be greater than or equal to 0"),
        ({"memory_limit_bytes": 1.5}, {}, r"'envpipe.memory_limit_bytes' is 1.5: input should be a valid integer"),
        ({"memory_limit_bytes": True}, {}, r"input should be a valid integer"),
        ({"compare_iterations": -1}, {}, r"input should be greater than or equal to 0"),
        ({}, {"ENVPIPE_CLOCK": "nvml"},
         r"ENVPIPE_CLOCK is 'nvml'; choose one of auto, sim, sim-readonly, daemon, readonly, none"),
        ({"type": "envelope", "reconfig": "replan"}, {}, r"reconfig 'replan' re-plans with the optimal planner"),
    ],
)
def test_invalid_values_are_explained(block, env, message) -> None:
    with pytest.raises(EnvPipeConfigError, match=message):
        parse(block, env)


@given(st.floats(0, 1, exclude_max=True))
def test_a_slowdown_is_a_fraction_or_a_percent_as_on_the_command_line(fraction: float) -> None:
    """One convention for `max_slowdown` and `envpipe plan|search --max-slowdown` (envpipe.limits.parse_slowdown):
    a fraction in [0, 1), or the same as a percent with '%'."""
    assert parse({"max_slowdown": fraction}, {}).max_slowdown == fraction
    assert parse({"max_slowdown": f"{100 * fraction!r}%"}, {}).max_slowdown == pytest.approx(fraction, rel=1e-12)
    assert Slowdown().convert(f"{100 * fraction!r} %", None, None) == pytest.approx(fraction, rel=1e-12)


@given(st.one_of(st.floats(1, 1e300), st.integers(1, 10**6), st.floats(max_value=-1e-300), st.text(max_size=20)))
def test_anything_else_is_one_line_naming_the_convention(value: object) -> None:
    text = str(value).strip()
    try:
        number = float(text.removesuffix("%"))
    except ValueError:
        number = math.nan
    fraction = number / 100 if text.endswith("%") else number
    assume(not 0 <= fraction < 1)  # nan too
    with pytest.raises(EnvPipeConfigError) as block:
        parse({"max_slowdown": value}, {})
    with pytest.raises(click.BadParameter) as cli:
        Slowdown().convert(value, None, None)
    for message in (str(block.value), cli.value.message):
        assert "\n" not in message and "slowdown" in message
