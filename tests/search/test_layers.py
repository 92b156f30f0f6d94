"""The layer profile file: round trip, and one clear line for each way it can be malformed."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from envpipe.search.cut import Cut
from envpipe.search.engine_model import SIMULATED_GPU
from envpipe.search.evaluate import build_pipeline
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import NO_UNIT_CALLS, LayerProfileError, UnitCalls, load_layer_profile
from envpipe.search.memory import MemoryTables
from envpipe.search.space import Shape
from tests.support.layer_profiles import cluster, layer_profile

CALLS = UnitCalls(2e-4, 3e-5, {1: 4e-4, 2: 4.5e-4, 4: 5e-4}, "measured here")


def test_round_trip(tmp_path: Path) -> None:
    profile = replace(layer_profile([1.0, 2.0, 3.0, 4.0], dtype="bf16"), unit_calls=CALLS)
    path = tmp_path / "layers.json"
    profile.save(path)
    again = load_layer_profile(path)
    assert again.layers == profile.layers and again.model == profile.model and again.dtype == "bf16"
    assert again.micro_batch_sizes == (1, 2, 4) and again.source == str(path)
    assert again.unit_calls == CALLS and again.unit_calls.backward_s == pytest.approx(2.3e-4)


def test_busy_power_per_micro_batch_round_trips_and_prices_the_units(tmp_path: Path) -> None:
    """A profile with a busy power per size reads it back, and the search's energy of a configuration at a size is
    its time at that size's power; a profile without (before 2026-11-29) prices every size at its one power."""
    profile = replace(layer_profile([1.0, 2.0, 3.0, 4.0]), busy_power_by_micro_batch_w={1: 200.0, 2: 400.0, 4: 600.0})
    path = tmp_path / "layers.json"
    profile.save(path)
    again = load_layer_profile(path)
    assert again.busy_power_by_micro_batch_w == {1: 200.0, 2: 400.0, 4: 600.0}
    assert [again.busy_power_at(b) for b in (1, 2, 4)] == [200.0, 400.0, 600.0]
    assert layer_profile([1.0, 2.0, 3.0]).busy_power_at(4) == 300.0  # the profile's one busy power
    assert "busy_w_by_micro_batch" not in layer_profile([1.0, 2.0, 3.0]).to_json()["power"]
    hw = cluster(1, 1, 1 << 14)
    for b, watts in ((1, 200.0), (4, 600.0)):
        tables = MemoryTables(again, b, 1, 2)
        pipeline = build_pipeline(SearchInputs.of(again, hw, SIMULATED_GPU), Shape(1, 1, b, 2), Cut((4,), 0.0),
                                  tables)
        for kind in ("F", "B"):  # at the top clock: the measured time at the size's measured power
            assert pipeline.profile.energy(kind, 0, 0) == pytest.approx(pipeline.profile.time(kind, 0, 0) * watts)


def test_a_unit_computes_at_the_busy_power_and_waits_at_the_idle_power() -> None:
    """A launch-bound stage (its host slower than its device): the search charges its device time at the busy
    power and the rest of the unit's time at the idle power; its tail runs at the busy power."""
    profile = replace(layer_profile([1.0] * 4, host_ms=[6.0] * 4), busy_power_by_micro_batch_w={1: 500.0, 2: 500.0,
                                                                                                4: 500.0})
    tables = MemoryTables(profile, 1, 1, 2)
    pipeline = build_pipeline(SearchInputs.of(profile, cluster(1, 1, 1 << 14), SIMULATED_GPU), Shape(1, 1, 1, 2),
                              Cut((4,), 0.0), tables)
    device = sum(layer.per_micro_batch[1].forward_s for layer in profile.layers)
    unit = pipeline.profile.time("F", 0, 0)
    assert unit > 1.5 * device  # launch-bound
    assert pipeline.profile.energy("F", 0, 0) == pytest.approx(device * 500.0 + (unit - device) * 80.0)
    assert pipeline.tail_power_w == profile.busy_power_w == 300.0


def test_a_profile_without_unit_calls_writes_zeros(tmp_path: Path) -> None:
    """Every size gets a load time (0: none measured), so that the file reads back."""
    profile = layer_profile([1.0, 2.0, 3.0])
    assert profile.to_json()["unit_calls"]["load_s"] == {"1": 0.0, "2": 0.0, "4": 0.0}
    path = tmp_path / "layers.json"
    profile.save(path)
    calls = load_layer_profile(path).unit_calls
    assert (calls.backward_call_s, calls.grad_zero_call_s, calls.load(2), calls.load(8)) == (0, 0, 0, 0)


def _edit(data: dict[str, Any], change: str) -> None:
    match change:
        case "kind":
            data["kind"] = "perseus"
        case "version":
            data["version"] = 7
        case "dtype":
            data["dtype"] = "fp8"
        case "layer count":
            data["layers"].pop()
        case "negative time":
            data["layers"][1]["per_micro_batch"]["2"]["forward_s"] = -1
        case "missing size":
            del data["layers"][2]["per_micro_batch"]["4"]
        case "bytes not int":
            data["layers"][0]["param_bytes"] = 1.5
        case "family":
            data["model"]["family"] = "bert"
        case "power":
            data["power"]["busy_w"] = 0
        case "unit calls":
            del data["unit_calls"]
        case "load size":
            del data["unit_calls"]["load_s"]["2"]
        case "call time":
            data["unit_calls"]["backward_call_s"] = -1e-4
        case "power size":
            data["power"]["busy_w_by_micro_batch"] = {"1": 300.0, "2": 300.0}
        case "power per size":
            data["power"]["busy_w_by_micro_batch"] = {"1": 300.0, "2": -5, "4": 300.0}


@pytest.mark.parametrize(("change", "message"), [
    ("kind", "'kind' must be 'envpipe-layer-profile', got 'perseus'"),
    ("version", "unsupported layer profile version 7 (this tool reads 1, 2, 3, 4)"),
    ("dtype", "'dtype' must be one of fp32, bf16, got 'fp8'"),
    ("layer count", "3 layers for a model of 2 blocks: expected 4"),
    ("negative time", "layer 1 micro-batch 2: 'forward_s' must be in (0, 3600], got -1"),
    ("missing size", "layer 2: 'per_micro_batch' has sizes ['1', '2'], expected [1, 2, 4]"),
    ("bytes not int", "layer 0: 'param_bytes' must be an integer in [0, 1125899906842624], got 1.5"),
    ("family", "'model.family' must be one of gpt2, llama, got 'bert'"),
    ("power", "'power.busy_w' must be in (0, 10000], got 0"),
    ("unit calls", "'unit_calls' must be a JSON object"),
    ("load size", "'unit_calls.load_s' has sizes ['1', '4'], expected [1, 2, 4] (micro_batch_sizes)"),
    ("call time", "'unit_calls.backward_call_s' must be in [0, 3600], got -0.0001"),
    ("power size", "'power.busy_w_by_micro_batch' must have one entry per micro-batch size, 1, 2, 4"),
    ("power per size", "'power.busy_w_by_micro_batch.2' must be in (0, 10000], got -5"),
])
def test_malformed_profile_one_line(tmp_path: Path, change: str, message: str) -> None:
    data = layer_profile([1.0, 2.0, 3.0, 4.0]).to_json()
    _edit(data, change)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LayerProfileError) as err:
        load_layer_profile(path)
    assert str(err.value).startswith(f"{path}: {message}")
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(("content", "message"), [
    (None, "cannot read"),
    ("{not json", "not JSON"),
    ("[1, 2]", "the profile must be a JSON object"),
    ("stage,instruction,frequency,time,energy\n", "not JSON"),
])
def test_unreadable_files(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "layers.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(LayerProfileError, match=message):
        load_layer_profile(path)


def test_version_1_profiles_still_read() -> None:
    """The committed H200 profiles predate host and repeat times and device memory: read as 0 and unknown."""
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "search_layers_gpt2_h200.json"
    profile = load_layer_profile(path)
    assert profile.device == "NVIDIA H200" and profile.device_memory.total_bytes is None
    cost = profile.layers[1].per_micro_batch[2]
    assert cost.forward_s > 0 and cost.forward_host_s == cost.backward_repeat_s == 0


def test_a_version_2_profile_reads_without_unit_calls(tmp_path: Path) -> None:
    """The first one-GPU accuracy run's profiles (version 2) predate the unit calls: read as none."""
    path = (Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "search_accuracy" / "call2" / "fit"
            / "gpt2_12x1024_s1024" / "layers.json")
    profile = load_layer_profile(path)
    assert json.loads(path.read_text())["version"] == 2 and profile.unit_calls == NO_UNIT_CALLS
    assert profile.layers[1].per_micro_batch[1].backward_repeat_s > 0


def test_a_version_3_profile_reads_without_the_calls_each_backward_carried(tmp_path: Path) -> None:
    """Version 3 measured every layer's backward with its own backward() call and zeroing (230 us here): read
    without them, as version 4 measures them (inside one backward()), never below 0."""
    profile = replace(layer_profile([1.0, 2.0, 3.0, 4.0], host_ms=[0.3, 3.0, 3.0, 3.0]), unit_calls=CALLS)
    data = profile.to_json()
    data["version"] = 3
    for layer in data["layers"]:
        layer["per_micro_batch"]["1"]["backward_repeat_s"] = 1.5e-3
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(data))
    read = load_layer_profile(path)
    block, embedding = read.layers[1].per_micro_batch[1], read.layers[0].per_micro_batch[1]
    assert block.backward_host_s == pytest.approx(2e-3 - 2.3e-4)
    assert block.backward_repeat_s == pytest.approx(1.5e-3 - 2.3e-4)
    assert embedding.backward_host_s == 0.0  # 0.2 ms carried less than the calls
    assert block.forward_host_s == profile.layers[1].per_micro_batch[1].forward_host_s


def test_a_version_2_profile_needs_its_host_times(tmp_path: Path) -> None:
    data = layer_profile([1.0, 2.0, 3.0, 4.0]).to_json()
    data["version"] = 2
    del data["layers"][2]["per_micro_batch"]["1"]["backward_host_s"]
    path = tmp_path / "layers.json"
    path.write_text(json.dumps(data))
    with pytest.raises(LayerProfileError, match="layer 2 micro-batch 1: 'backward_host_s' must be a number, got None"):
        load_layer_profile(path)
