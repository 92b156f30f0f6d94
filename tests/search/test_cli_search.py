"""`envpipe search` through click: the files it writes, what they contain, and one line for bad input."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.cli_search import search_command
from envpipe.plan.planfile import Plan
from envpipe.search.found import FoundConfigError, train_settings
from envpipe.search.inputs import SearchInputs
from envpipe.search.layers import load_layer_profile
from envpipe.search.report import frontier_figure
from envpipe.search.search import Objective, SearchOptions, search
from tests.support.layer_profiles import cluster, layer_profile


@pytest.fixture
def layers(tmp_path: Path) -> Path:
    path = tmp_path / "layers.json"
    layer_profile([1.0, 3.0, 3.0, 3.0, 3.0, 2.0], params=[2_000_000] * 6).save(path)
    return path


def _search(*args: str) -> tuple[int, str]:
    res = CliRunner().invoke(main, ["search", *args])
    return res.exit_code, res.output


def test_search_writes_a_trainable_configuration(tmp_path: Path, layers: Path) -> None:
    out = tmp_path / "found"
    code, text = _search("--layers", str(layers), "--gpus-per-node", "4", "--global-batch", "16",
                         "--memory-gib", "4", "--top-k", "3", "--out-dir", str(out))
    assert code == 0, text
    assert "9 configurations for 4 GPUs (1 x 4), global batch 16" in text
    result = json.loads((out / "search.json").read_text())
    assert result["label"].startswith("simulated: layer profile") and len(result["configurations"]) == 3
    best = result["configurations"][0]
    config = json.loads((out / "found.json").read_text())
    assert config["train_batch_size"] == 16 and config["envpipe"]["pipeline_stages"] == best["stages"]
    settings, plan = train_settings(config["envpipe_search"], config)
    assert settings["stage_layers"] == best["stage_layers"] and settings["micro_batch"] == best["micro_batch"]
    assert Plan.load(out / plan).num_microbatches == best["microbatches"]
    for rank in (2, 3):  # the runners-up can be trained too
        other = json.loads((out / "top" / f"{rank}.json").read_text())
        assert Plan.load(out / "top" / other["envpipe"]["plan"]).num_stages == other["envpipe"]["pipeline_stages"]
    assert (out / "frontier.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    launch = text.strip().splitlines()[-1].strip()
    # the memory model holds for the allocator setting the engine model was fitted with: every rank gets it
    assert shlex.split(launch) == ["envpipe-launch", "--nodes", "1", "--gpus-per-node", "4", "--env",
                                   "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True", "--", "examples/train_gpt.py",
                                   "--config", str(out / "found.json")]
    assert config["envpipe_search"]["allocator"] == "expandable_segments:True"
    assert config["zero_optimization"] == {"stage": 0}
    assert '"envpipe_search"' not in text  # the printed DeepSpeed block is DeepSpeed's and the runtime's only
    # the host band: this profile's host times are 0 (device-bound), so every band is a point
    assert "host band" in text and "regime" in text and "+0.0..+0.0%" in text and "undecided" not in text
    assert best["predicted"]["regime"] == "device-bound" and result["undecided"] == []
    time_s = best["predicted"]["iteration_time_s"]
    assert best["predicted"]["time_band_s"] == [time_s, time_s]
    assert config["envpipe_search"]["predicted"] == best["predicted"]  # found.json carries the same predictions


def test_search_says_which_ranks_the_hosts_speed_could_swap(tmp_path: Path) -> None:
    """A launch-bound profile (host 20 ms a layer, device 0.1 ms) with the engine model's 10 % host spread: every
    configuration is launch-bound, and the second (12 % slower) is within the first's band: named undecided."""
    path, engine = tmp_path / "layers.json", tmp_path / "engine.json"
    layer_profile([0.1] * 4, host_ms=[20.0] * 4, sizes=(1,)).save(path)
    engine.write_text(json.dumps({"version": 1, "unit_host_s": 0.0, "iteration_s": 0.0, "host_scale": 1.0,
                                  "fragmentation": 0.0, "outside_allocator_bytes": 0, "allocator": "", "label": "t",
                                  "host_spread": 0.1}))
    code, text = _search("--layers", str(path), "--gpus-per-node", "2", "--global-batch", "8", "--memory-gib", "4",
                         "--top-k", "2", "--engine-model", str(engine), "--out-dir", str(tmp_path / "found"))
    assert code == 0, text
    result = json.loads((tmp_path / "found" / "search.json").read_text())
    regimes = [c["predicted"]["regime"] for c in result["configurations"]]
    assert regimes == ["launch-bound", "launch-bound"]
    (low1, high1), (low2, _) = (c["predicted"]["time_band_s"] for c in result["configurations"])
    assert low1 < low2 <= high1  # P=1 D=2 then P=2 D=1, 12 % apart: within the first's band of about +-10 %
    assert result["undecided"] == [2] and "undecided: the time bands of #2 overlap #1's" in text


def test_cuda_graphs_predicts_device_times_and_switches_them_on(tmp_path: Path) -> None:
    """A launch-bound profile (host 20 ms a layer, device 0.1 ms): eager, the host sets the pace; with --cuda-graphs
    the units take their layers' device times, and the found config sets the runtime's cuda_graphs."""
    path = tmp_path / "layers.json"
    layer_profile([0.1] * 4, host_ms=[20.0] * 4, sizes=(1,)).save(path)
    times = {}
    for flag in ([], ["--cuda-graphs"]):
        out = tmp_path / ("graphed" if flag else "eager")
        code, text = _search("--layers", str(path), "--gpus-per-node", "1", "--global-batch", "4", "--memory-gib",
                             "4", "--out-dir", str(out), *flag)
        assert code == 0, text
        config = json.loads((out / "found.json").read_text())
        assert config["envpipe"].get("cuda_graphs", False) is bool(flag)
        times[bool(flag)] = config["envpipe_search"]["predicted"]["baseline_iteration_time_s"]
    assert times[False] > 20 * times[True]
    cpu = tmp_path / "cpu.json"
    profile = load_layer_profile(path)
    replace(profile, device="cpu", cpu_threads=2, measured_mhz=None).save(cpu)
    code, text = _search("--layers", str(cpu), "--gpus-per-node", "1", "--global-batch", "4", "--memory-gib", "4",
                         "--cuda-graphs", "--out-dir", str(tmp_path / "no"))
    assert code == 2 and "Invalid value for '--cuda-graphs': CUDA graphs need a CUDA device" in text
    assert "Traceback" not in text and not (tmp_path / "no").exists()


def test_frontier_objective_and_launch_args(tmp_path: Path, layers: Path) -> None:
    code, text = _search("--layers", str(layers), "--nodes", "2", "--gpus-per-node", "2", "--global-batch", "16",
                         "--memory-gib", "4", "--objective", "frontier", "--out-dir", str(tmp_path / "f"),
                         "--launch-args", "--backend kube --image reg/envpipe-runtime:1")
    assert code == 0, text
    found = tmp_path / "f" / "found.json"
    launch = shlex.split(text.strip().splitlines()[-1])
    assert launch[:5] == ["envpipe-launch", "--nodes", "2", "--gpus-per-node", "2"]
    assert launch[-8:] == ["--backend", "kube", "--image", "reg/envpipe-runtime:1", "--", "examples/train_gpt.py",
                           "--config", str(found)]
    assert json.loads((tmp_path / "f" / "search.json").read_text())["objective"]["kind"] == "frontier"


@pytest.mark.parametrize(("args", "message"), [
    (["--gpus-per-node", "7", "--global-batch", "16"], "Error: no pipeline shape uses 7 GPUs"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--memory-gib", "0.001", "--memory-margin-gib", "0"],
     "Error: no configuration fits"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--memory-gib", "1"], "Invalid value for '--memory-margin-gib': "
                                                                            "1 GiB is not below the memory per GPU"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--objective", "energy"], "Error: the energy objective needs"),
    (["--gpus-per-node", "0", "--global-batch", "16"], "Invalid value for '--gpus-per-node'"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--layers", "{bad}"], "Error: {bad}: layer 1 micro-batch 1: "
                                                                             "'forward_s' must be in (0, 3600]"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--layers", "{missing}"], "Error: {missing}: cannot read"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--launch-args", '--image "x'],
     "Invalid value for '--launch-args': '--image \"x': No closing quotation"),
    # the old search took these and raised a traceback when it planned (ValueError, InfeasibleBudget)
    (["--gpus-per-node", "2", "--global-batch", "16", "--layers", "{no-activations}"],
     "Error: {no-activations}: layer 0 micro-batch 1: 'activation_bytes' must be an integer in [1, "),
    (["--gpus-per-node", "2", "--global-batch", "16", "--intra-node-gbps", "1e-300"],
     "Invalid value for '--intra-node-gbps': must be in [0.1, 1e+06], got 1e-300"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--allreduce-gbps", "1e-300"],
     "Invalid value for '--allreduce-gbps': must be in [0.1, 1e+06], got 1e-300"),
    (["--nodes", "2", "--gpus-per-node", "1", "--global-batch", "16", "--inter-node-gbps", "1e-300"],
     "Invalid value for '--inter-node-gbps': must be in [0.1, 1e+06], got 1e-300"),
    (["--gpus-per-node", "2", "--global-batch", "16", "--communicator-mib", "-1"],
     "Invalid value for '--communicator-mib': must be in [0, 1.04858e+06], got -1"),
])
def test_bad_input_one_line_nothing_written(tmp_path: Path, layers: Path, args: list[str], message: str) -> None:
    bad = tmp_path / "bad.json"
    data = json.loads(layers.read_text())
    data["layers"][1]["per_micro_batch"]["1"]["forward_s"] = 0
    bad.write_text(json.dumps(data))
    zero = json.loads(layers.read_text())
    for layer in zero["layers"]:
        for cell in layer["per_micro_batch"].values():
            cell["activation_bytes"] = 0
    (tmp_path / "zero.json").write_text(json.dumps(zero))
    paths = {"{bad}": str(bad), "{missing}": str(tmp_path / "missing.json"),
             "{no-activations}": str(tmp_path / "zero.json")}
    args = [paths.get(a, a) for a in args]
    if "--layers" not in args:
        args += ["--layers", str(layers)]
    if "--memory-gib" not in args:
        args += ["--memory-gib", "4"]
    out = tmp_path / "out"
    code, text = _search(*args, "--out-dir", str(out))
    assert code != 0
    for key, value in paths.items():
        message = message.replace(key, value)
    lines = [ln for ln in text.splitlines() if ln.startswith(("Error", "Usage", "Try"))]
    assert message in text and "Traceback" not in text
    assert len([ln for ln in lines if ln.startswith("Error")]) == 1
    assert not out.exists()


@pytest.mark.parametrize(("edit", "message"), [
    (lambda b, c: b.update(version=2), "must be an object with \"version\": 1"),
    (lambda b, c: b.update(stage_layers=[3, 4]), "cuts 7 layers; the model has 6"),
    (lambda b, c: c.update(gradient_accumulation_steps=99), "'envpipe_search.microbatches' must be a positive integer "
                                                          "equal to 'gradient_accumulation_steps'"),
    (lambda b, c: c["envpipe"].update(pipeline_stages=3), "'envpipe.pipeline_stages' is 3"),
    (lambda b, c: b["model"].update(family="bert"), "'envpipe_search.model' must give"),
])
def test_found_config_checks(tmp_path: Path, layers: Path, edit, message: str) -> None:
    code, text = _search("--layers", str(layers), "--gpus-per-node", "2", "--global-batch", "16", "--memory-gib", "4",
                         "--out-dir", str(tmp_path / "o"))
    assert code == 0, text
    config = json.loads((tmp_path / "o" / "found.json").read_text())
    block = config.pop("envpipe_search")
    edit(block, config)
    with pytest.raises(FoundConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        train_settings(block, config)


def test_every_option_is_documented() -> None:
    undocumented = [p.name for p in search_command.params if isinstance(p, click.Option) and not p.help]
    assert not undocumented
    text = CliRunner().invoke(main, ["search", "--help"]).output
    assert "gigabits per second" in text and "--memory-margin-gib" in text and "--engine-model" in text


@pytest.mark.parametrize("kind", ["fifo", "dev-zero", "directory"])
def test_layers_must_be_a_regular_file(tmp_path: Path, kind: str) -> None:
    """A FIFO is refused without waiting for a writer, /dev/zero without reading it whole (in a fresh process:
    a hang or a memory blow-up would show as the timeout)."""
    path = {"fifo": tmp_path / "fifo", "dev-zero": Path("/dev/zero"), "directory": tmp_path}[kind]
    if kind == "fifo":
        os.mkfifo(path)
    res = subprocess.run([sys.executable, "-c", "import sys; from envpipe.cli import main; sys.exit(main())",
                          "search", "--layers", str(path), "--gpus-per-node", "1", "--global-batch", "4",
                          "--memory-gib", "1", "--out-dir", str(tmp_path / "out")], capture_output=True, text=True,
                         timeout=60)
    assert res.returncode != 0 and res.stdout == "" and "Traceback" not in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1, res.stderr
    expected = {"fifo": "not a regular file", "dev-zero": "not a regular file", "directory": "is a directory"}
    assert expected[kind] in res.stderr
    assert not (tmp_path / "out").exists()


def test_solver_output_stays_off_stdout(tmp_path: Path, layers: Path) -> None:
    """The optimal planner's HiGHS runs print nothing of their own (a real process: native output)."""
    res = subprocess.run([sys.executable, "-c", "import sys; from envpipe.cli import main; sys.exit(main())",
                          "search", "--layers", str(layers), "--gpus-per-node", "4", "--global-batch", "16",
                          "--memory-gib", "4", "--objective", "frontier", "--out-dir", str(tmp_path / "out")],
                         capture_output=True, text=True, timeout=300, check=True)
    assert "Highs" not in res.stdout and "Highs" not in res.stderr
    assert res.stdout.splitlines()[0].startswith("assumed: 4.00 GiB per GPU (--memory-gib), margin 1.00 GiB; links: "
                                                 "within a node 800 Gb/s (100 GB/s) point to point")
    json.loads((tmp_path / "out" / "search.json").read_text(), parse_constant=_no_constant)


def _no_constant(name: str) -> None:
    raise AssertionError(f"{name} written")


def test_frontier_picture_is_labelled_points(layers: Path) -> None:
    """Read from the figure's artists: every planned configuration a point, each chosen one labelled with its
    rank and shape, the best one starred; no line joins configurations."""
    profile = load_layer_profile(layers)
    result = search(SearchInputs.of(profile, cluster(1, 4, 4096)), 16, Objective("throughput"), SearchOptions(top_k=3))
    fig = frontier_figure(result)
    try:
        ax = fig.axes[0]
        labels = [t.get_text() for t in ax.texts]
        assert labels == [f"#{i} {c.shape.label()}" for i, c in enumerate(result.candidates, 1)]
        points = sum(len(c.get_offsets()) for c in ax.collections)
        assert points == len(result.planned) + 1  # every planned one, and the star on the best
        assert not [line for line in ax.get_lines() if len(line.get_xdata()) > 2]  # no curve through them
        assert "(simulated)" in ax.get_title()
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
