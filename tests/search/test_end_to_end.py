"""Profile -> search -> train on CPU, the three commands of the README, with real processes: the layer
profile of examples/train_gpt.py's model, `envpipe search` for 2 GPUs with a memory that only a 2-stage
pipeline fits, and the exact envpipe-launch command it prints (DeepSpeed, 2 CPU processes, gloo). Also
the GPU accuracy benchmark's CPU path."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from envpipe.cli import main
from envpipe.plan.memory import peak_in_flight
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime.summary import RunSummary
from envpipe.search.cluster import GIB
from envpipe.search.cut import bottleneck_cut
from envpipe.search.layers import load_layer_profile
from envpipe.search.memory import MemoryTables

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1", "PYTHONFAULTHANDLER": "1"}


def _least_peak(path: Path, stages: int, micro_batch: int, microbatches: int) -> float:
    """The least peak memory per GPU any cut into ``stages`` stages needs (one replica per stage)."""
    tables = MemoryTables(load_layer_profile(path), micro_batch, 2 // stages, microbatches)
    cost = np.stack([tables.peak(w) for w in peak_in_flight(one_f_one_b(stages, microbatches))])
    cut = bottleneck_cut(cost)
    assert cut is not None
    return cut.cost


@pytest.mark.slow
def test_profile_search_train_two_stages(tmp_path: Path) -> None:
    layers = tmp_path / "layers.json"
    profile = subprocess.run([sys.executable, "examples/train_gpt.py", "--tiny", "--profile-layers", str(layers),
                              "--profile-micro-batches", "2"], cwd=ROOT, env=ENV, capture_output=True, text=True,
                             timeout=300)
    assert profile.returncode == 0, profile.stdout + profile.stderr
    assert "layer 6/6 (Head) measured" in profile.stdout
    # global batch 4 on 2 GPUs, micro-batch 2: P=1 (D=2, M=1) or P=2 (D=1, M=2). A memory between the
    # two shapes' least peaks leaves only the 2-stage pipeline.
    one, two = _least_peak(layers, 1, 2, 1), _least_peak(layers, 2, 2, 2)
    assert two < one
    out = tmp_path / "found"
    res = CliRunner().invoke(main, ["search", "--layers", str(layers), "--gpus-per-node", "2", "--global-batch", "4",
                                    "--memory-gib", str((one + two) / 2 / GIB), "--memory-margin-gib", "0",
                                    "--out-dir", str(out)])
    assert res.exit_code == 0, res.output
    assert "1 do not fit" in res.output
    config = json.loads((out / "found.json").read_text())
    assert config["envpipe"]["pipeline_stages"] == 2 and len(config["envpipe_search"]["stage_layers"]) == 2
    launch = shlex.split(res.output.strip().splitlines()[-1])
    assert launch[:7] == ["envpipe-launch", "--nodes", "1", "--gpus-per-node", "2", "--env", "OMP_NUM_THREADS=1"]
    launcher = str(Path(sys.executable).with_name("envpipe-launch"))
    report = tmp_path / "report"
    train = subprocess.run([launcher, *launch[1:], "--steps", "2", "--calibration-steps", "1", "--report-dir",
                            str(report)], cwd=ROOT, env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True,
                           text=True, timeout=300)
    assert train.returncode == 0, train.stdout[-3000:] + train.stderr[-3000:]
    cut = config["envpipe_search"]["stage_layers"]
    assert f"stage=0 layers={cut[0]} stage=1 layers={cut[1]}" in train.stdout  # DeepSpeed was given the cut
    summary = RunSummary.load(report / "summary.json")
    assert (summary.stages, summary.microbatches, summary.data_parallel) == (2, 2, 1)
    plan = json.loads((out / "found.plan.json").read_text())
    assert summary.plan is not None and summary.plan.deployed and "found.plan.json" in summary.plan.source
    assert summary.plan.orders == [[f"{u['kind']}{u['mb']}" for u in units] for units in plan["stages"]]
    assert summary.plan.clocks == [[u["freq_mhz"] for u in units] for units in plan["stages"]]


@pytest.mark.slow
def test_accuracy_benchmark_cpu_path(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    env = {**ENV, "PYTHON": sys.executable, "CPU": "1", "TINY": "1", "MODELS": "gpt2", "SIZES": "2", "BATCH": "4",
           "SHIFT": "0", "STEPS": "3", "OUT": str(out), "WORK": str(work)}  # 2 calibration + 1 steady
    run = subprocess.run(["bash", "benchmarks/search_h200.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in out.iterdir()) == ["layers_gpt2.json", "search_h200.md", "search_runs.tar.gz"]
    table = (out / "search_h200.md").read_text()
    rows = [ln for ln in table.splitlines() if ln.startswith("| P")]
    assert [r.split(" | ")[0] for r in rows] == ["| P1_D2_b2_cut6", "| P2_D1_b2_cut3-3"]
    assert "Over 2 runs: iteration time |error| median" in table
    links = json.loads((work / "links.json").read_text())  # two all-reduce sizes timed; gloo: no device memory
    assert len(links["allreduce_s_by_bytes"]) == 2 and links["communicators"]["per_group_bytes"] == 0
    assert sorted(p.name for p in (work / "communicators" / "runs").glob("*.json")) == [
        "P1_D1_b1_cut6.json", "P1_D2_b1_cut6.json", "P2_D1_b1_cut3-3.json"]  # the tiny model in each layout
    declared = json.loads((work / "gpt2" / "configs" / "declared.json").read_text())  # before the runs
    assert sorted(declared["configs"]) == ["P1_D2_b2_cut6", "P2_D1_b2_cut3-3"] and declared["cuda_graphs"] is False
    assert f"Predictions written at {declared['at']} (before the runs), eager" in table
    assert all("| allocator's peak | - | - | - |" in r for r in rows)  # on CPU: no device need, no energy measured
    # the same declared configuration trained again from the archive: its predictions as written, nothing searched
    again, work2 = tmp_path / "again", tmp_path / "work2"
    env |= {"RETRAIN": str(out / "search_runs.tar.gz"), "NAMES": "P2_D1_b2_cut3-3 P9_D9_b9_cut9", "OUT": str(again),
            "WORK": str(work2)}
    run = subprocess.run(["bash", "benchmarks/search_h200.sh"], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert sorted(p.name for p in (work2 / "gpt2").iterdir()) == ["configs", "layers.json", "report_P2_D1_b2_cut3-3",
                                                                  "runs"]
    again_rows = [ln for ln in (again / "search_h200.md").read_text().splitlines() if ln.startswith("| P")]
    assert [r.split(" | ")[0] for r in again_rows] == ["| P2_D1_b2_cut3-3"]
    first, second = (json.loads((w / "gpt2" / "runs" / "P2_D1_b2_cut3-3.json").read_text()) for w in (work, work2))
    assert second["predicted"] == first["predicted"]
    assert f"Predictions written at {declared['at']} (before the runs)" in (again / "search_h200.md").read_text()
    for name in ("P1_D2_b2_cut6", "P2_D1_b2_cut3-3"):
        run_json = json.loads((work / "gpt2" / "runs" / f"{name}.json").read_text())
        assert all(b > 0 for b in run_json["measured"]["peak_memory_bytes_per_stage"])
