"""The engine model file (`envpipe search --engine-model`): a fitted model round-trips, a bad one is one line."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.search.engine_model import GPU, SIMULATED_GPU, EngineModelError, engine_model, load_engine_model
from tests.support.layer_profiles import layer_profile


def test_round_trip_and_the_default_per_device(tmp_path: Path) -> None:
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(GPU.to_json()))
    assert load_engine_model(path) == GPU
    assert engine_model(layer_profile([1.0] * 3)) == GPU  # a GPU's profile
    assert engine_model(replace(layer_profile([1.0] * 3), device="cpu")) == SIMULATED_GPU
    older = GPU.to_json()
    del older["host_spread"]  # a file fitted before the spread existed: no band
    path.write_text(json.dumps(older))
    assert load_engine_model(path) == replace(GPU, host_spread=0.0)
    fitted = replace(GPU, step_per_parameter_s=3.3e-11)  # a fit with the optimizer step per parameter
    path.write_text(json.dumps(fitted.to_json()))
    assert load_engine_model(path) == fitted
    assert "step_per_parameter_s" not in GPU.to_json()  # none: the profile's step times


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.update(version=2), "not an engine model"),
    (lambda d: d.update(host_scale=float("nan")), "NaN is not a finite number"),
    (lambda d: d.update(unit_host_s=-1), "'unit_host_s' must be a number in [0.0, 1.0], got -1"),
    (lambda d: d.update(outside_allocator_bytes=1.5), "'outside_allocator_bytes' must be an integer in [0, "),
    (lambda d: d.pop("allocator"), "'allocator' must be a string"),
    (lambda d: d.update(host_spread=1.5), "'host_spread' must be a number in [0.0, 0.9], got 1.5"),
    (lambda d: d.update(host_spread="0.1"), "'host_spread' must be a number in [0.0, 0.9], got '0.1'"),
    (lambda d: d.update(step_per_parameter_s=-1e-9), "'step_per_parameter_s' must be a number in [0.0, 1e-06]"),
    (lambda d: d.update(step_per_parameter_s=None), "'step_per_parameter_s' must be a number in [0.0, 1e-06], got"),
])
def test_bad_engine_model_is_one_line(tmp_path: Path, edit, message: str) -> None:
    data = GPU.to_json()
    edit(data)
    path = tmp_path / "engine.json"
    path.write_text(json.dumps(data))
    with pytest.raises(EngineModelError, match=message.replace("[", r"\[").replace("]", r"\]")):
        load_engine_model(path)
    layers = tmp_path / "layers.json"
    layer_profile([1.0] * 4).save(layers)
    res = CliRunner().invoke(main, ["search", "--layers", str(layers), "--gpus-per-node", "1", "--global-batch", "4",
                                    "--memory-gib", "4", "--engine-model", str(path), "--out-dir", str(tmp_path / "o")])
    assert res.exit_code == 1 and f"Error: {path}: " in res.output and "Traceback" not in res.output
    assert not (tmp_path / "o").exists()
