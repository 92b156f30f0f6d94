"""The `envpipe` config block and ENVPIPE_* overrides."""

from __future__ import annotations

import pytest

from envpipe.runtime.config import EnvPipeConfig, EnvPipeConfigError, parse, split


def test_defaults_and_block() -> None:
    assert parse(None, {}) == EnvPipeConfig()
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
        ({"type": "fast"}, {}, r"'envpipe.type' is 'fast'; choose one of baseline, uniform, envelope"),
        ({}, {"ENVPIPE_SCHEDULING": "gpipe"}, r"ENVPIPE_SCHEDULING is 'gpipe'; choose one of 1f1b, envpipe"),
        ({}, {"ENVPIPE_RECONFIGURE": "fast"}, r"ENVPIPE_RECONFIGURE is 'fast'"),
        ({"clock": "nvml"}, {}, r"'envpipe.clock' is 'nvml'"),
        ({"shedule": "1f1b"}, {}, r"unknown key\(s\) in 'envpipe' block: shedule"),
        ({"gpu": 3}, {}, r"'envpipe.gpu' must be a non-empty string"),
        ({"plan": "a.json", "profile": "b.csv"}, {}, r"either 'plan'"),
        ([1], {}, r"must be an object, got list"),
    ],
)
def test_invalid_values_are_explained(block, env, message) -> None:
    with pytest.raises(EnvPipeConfigError, match=message):
        parse(block, env)
