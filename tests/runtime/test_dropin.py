"""EnvPipe as a drop-in engine for a DeepSpeed pipeline script written the way DeepSpeed's tutorial writes one
(examples/train_cnn.py): real torchrun processes on CPU (gloo), the stock script derived from it by changing
the initialize call back to DeepSpeed's.

- the same losses and parameters as stock DeepSpeed for the same seed, the plan deployed (policy optimal);
- EnvPipe's energy and power in DeepSpeed's CSV monitor files and TensorBoard event files;
- save_checkpoint, SIGKILL, load_checkpoint: the resumed job runs its steady plan with no profiling;
- SIGTERM ends the job with every clock back at default (a real envpipe-clockd, sim backend);
- all of it on 2 processes (PP2) and the training math on 4 (DP2 x PP2).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch

from envpipe.limits import parse_json
from tests.support.clockd_helpers import daemon_thread, wait_for
from tests.support.ports import free_port
from tests.support.runtime_summary import iterations, read_summary

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "train_cnn.py"
ENVPIPE_CALL = "envpipe.initialize("


def stock_script(tmp: Path) -> Path:
    """The example with DeepSpeed's initialize instead of EnvPipe's: the only line that differs."""
    text = EXAMPLE.read_text()
    assert text.count(ENVPIPE_CALL) == 1
    stock = tmp / "train_cnn_stock.py"
    stock.write_text(text.replace(ENVPIPE_CALL, "deepspeed.initialize("))
    return stock


def ds_config(tmp: Path, name: str, envpipe: dict | None = None) -> Path:
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "gradient_accumulation_steps": 4,
        "steps_per_print": 10**6,
        "optimizer": {"type": "Adam", "params": {"lr": 0.001, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.001,
                                                     "warmup_num_steps": 5}},
        "csv_monitor": {"enabled": True, "output_path": str(tmp / "csv"), "job_name": name},
        "tensorboard": {"enabled": True, "output_path": str(tmp / "tb"), "job_name": name},
        "envpipe": {"clock": "sim", "calibration_iterations": 2, "compare_iterations": 2, "reconfigure_rounds": 1,
                    "summary_interval": 4,
                    "monitor_interval": 2, "report_dir": str(tmp / "report" / name), **(envpipe or {})},
    }
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(config))
    return path


def torchrun(script: Path, nproc: int, config: Path, *args: str, env: dict[str, str] | None = None,
             cwd: Path) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", str(nproc),
           "--master-port", str(free_port()), str(script), "--deepspeed_config", str(config),
           "-p", "2", *args]
    full_env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1",
                "PYTHONPATH": f"{ROOT}:{os.environ.get('PYTHONPATH', '')}", **(env or {})}
    log = (cwd / f"{script.stem}-{config.stem}.log").open("a")
    return subprocess.Popen(cmd, cwd=cwd, env=full_env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def finished(proc: subprocess.Popen, cwd: Path, timeout: float = 300) -> str:
    """The job's output (every log of its folder) once it ended with exit code 0."""
    rc = proc.wait(timeout=timeout)
    text = "".join(p.read_text() for p in sorted(cwd.glob("*.log")))
    assert rc == 0, f"exit {rc}\n{text[-4000:]}"
    return text


def kill_tree(proc: subprocess.Popen, signum: int) -> None:
    """Signal torchrun and every rank (torchrun starts each rank in a session of its own)."""
    everyone = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
    for pid in everyone:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)
    proc.wait(timeout=60)
    for pid in everyone[1:]:
        with contextlib.suppress(psutil.NoSuchProcess):
            psutil.Process(pid).wait(timeout=60)


def losses(log: str) -> list[float]:
    return [float(line.split()[-1]) for line in log.splitlines() if line.startswith("step ")]


def layer_params(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every pipeline layer's parameters in a DeepSpeed checkpoint folder."""
    out = {}
    for f in sorted(checkpoint.glob("layer_*-model_states.pt")):
        for name, t in torch.load(f, map_location="cpu", weights_only=True).items():
            out[f"{f.name}:{name}"] = t
    return out


def run_both(tmp: Path, nproc: int, steps: int) -> tuple[str, str]:
    """The stock and the EnvPipe script, one after the other, each saving its final checkpoint."""
    logs = []
    for name, script in (("stock", stock_script(tmp)), ("envpipe", EXAMPLE)):
        work = tmp / name
        work.mkdir()
        proc = torchrun(script, nproc, ds_config(tmp, name), "--steps", str(steps), "--checkpoint-dir",
                        str(tmp / "ckpt" / name), cwd=work)
        logs.append(finished(proc, work))
    return logs[0], logs[1]


def assert_same_math(tmp: Path, stock_log: str, envpipe_log: str, steps: int) -> None:
    assert len(losses(stock_log)) == steps and losses(envpipe_log) == pytest.approx(losses(stock_log), abs=2e-5)
    stock = layer_params(tmp / "ckpt" / "stock" / f"global_step{steps}")
    ours = layer_params(tmp / "ckpt" / "envpipe" / f"global_step{steps}")
    assert stock.keys() == ours.keys() and stock
    for name, t in stock.items():
        torch.testing.assert_close(ours[name], t, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.slow
def test_dropin_pp2_same_math_plan_deployed_and_monitors(tmp_path: Path) -> None:
    steps = 22  # calibrate 2, profile 4, reconfigure 4, steady: 4 compared, then the plan
    stock_log, envpipe_log = run_both(tmp_path, 2, steps)
    assert_same_math(tmp_path, stock_log, envpipe_log, steps)
    s = read_summary(tmp_path / "report" / "envpipe")
    assert s.plan is not None and s.plan.policy == "optimal" and s.plan.deployed and s.plan.order_deployed
    assert s.measured is not None and s.measured.pairs == 2 and s.measured.energy_saving is not None
    phases = [x["phase"].split("@")[0] for x in iterations(tmp_path / "report" / "envpipe", 0)]
    assert phases[:10] == ["calibrate"] * 2 + ["profile"] * 4 + ["reconfigure"] * 4 and len(phases) == steps
    assert not (tmp_path / "report" / "stock").exists()  # stock DeepSpeed ignores nothing it does not know
    csv = tmp_path / "csv" / "envpipe"
    for tag in ("energy_j_simulated", "power_w_simulated", "iteration_time_s_simulated", "samples_per_s_simulated",
                "phase", "saving_planned_simulated", "saving_simulated", "stage1_energy_j_simulated"):
        rows = (csv / f"EnvPipe_Samples_{tag}.csv").read_text().splitlines()
        assert len(rows) > 2, tag  # a header and the iterations
    rows = (csv / "EnvPipe_Samples_energy_j_simulated.csv").read_text().splitlines()[1:]
    energy = [float(r.split(",")[1]) for r in rows]
    assert len(energy) >= steps - 2 and all(e > 0 for e in energy)
    assert (csv / "Train_Samples_train_loss.csv").exists()  # DeepSpeed's own events beside ours
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (tmp_path / "tb" / "envpipe").rglob("events.out.tfevents.*")
    acc = EventAccumulator(str(events))
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    assert {"EnvPipe/Samples/energy_j_simulated", "EnvPipe/Samples/power_w_simulated",
            "Train/Samples/train_loss"} <= tags
    assert len(acc.Scalars("EnvPipe/Samples/energy_j_simulated")) == len(energy)


@pytest.mark.slow
def test_dropin_dp2_pp2_same_math_as_stock(tmp_path: Path) -> None:
    steps = 16
    stock_log, envpipe_log = run_both(tmp_path, 4, steps)
    assert_same_math(tmp_path, stock_log, envpipe_log, steps)
    s = read_summary(tmp_path / "report" / "envpipe")
    assert s.data_parallel == 2 and s.plan is not None and s.plan.deployed
    assert s.job.plans_identical_across_replicas and len(s.gpus) == 4
    rows = (tmp_path / "csv" / "envpipe" / "EnvPipe_Samples_energy_j_simulated.csv").read_text().splitlines()[1:]
    assert len(rows) >= steps - 2 and all(float(r.split(",")[1]) > 0 for r in rows)  # the job's energy: 4 GPUs


@pytest.mark.slow
def test_checkpoint_kill_and_resume_in_the_steady_plan(tmp_path: Path) -> None:
    work = tmp_path / "run"
    work.mkdir()
    config = ds_config(tmp_path, "ckpt")
    ckpt = tmp_path / "ckpt"
    first = torchrun(EXAMPLE, 2, config, "--steps", "200", "--checkpoint-dir", str(ckpt), "--save-every", "14",
                     cwd=work)
    log = next(work.glob("*.log"))
    wait_for(lambda: "step 16/" in log.read_text(), timeout=240)
    kill_tree(first, signal.SIGKILL)  # no clean exit: the checkpoint of step 14 is all that is left
    assert (ckpt / "global_step14" / "envpipe_state.json").exists()
    before = len(iterations(tmp_path / "report" / "ckpt", 0))
    done = len(log.read_text())
    text = finished(torchrun(EXAMPLE, 2, config, "--steps", "20", "--checkpoint-dir", str(ckpt), "--save-every",
                             "14", cwd=work), work)
    assert "resume: the steady plan of checkpoint" in text
    lines = [x for x in log.read_text()[done:].splitlines() if x.startswith("[envpipe] ")]
    assert lines[0].startswith("[envpipe] resume:") and not any("calibrate:" in x for x in lines), lines[:3]
    resumed = iterations(tmp_path / "report" / "ckpt", 0)[before:]
    assert [x["iteration"] for x in resumed] == list(range(15, 21))
    # no calibration, profiling or reconfiguration: the steady phase (a new process's first iteration of the plan's
    # order warms up where comparison pairs are left to run)
    assert {x["phase"] for x in resumed} <= {"steady", "warm-up"} and resumed[-1]["phase"] == "steady"
    s = read_summary(tmp_path / "report" / "ckpt")
    assert s.plan is not None and s.plan.deployed and s.plan.policy == "optimal"


@pytest.mark.slow
def test_a_changed_job_resumes_with_one_line_and_profiles_again(tmp_path: Path) -> None:
    """The checkpoint of a 2-stage job loaded with another micro-batch count: one line, then profiling."""
    work = tmp_path / "run"
    work.mkdir()
    ckpt = tmp_path / "ckpt"
    finished(torchrun(EXAMPLE, 2, ds_config(tmp_path, "a"), "--steps", "15", "--checkpoint-dir", str(ckpt),
                      cwd=work), work)
    other = json.loads(ds_config(tmp_path, "b").read_text())
    other["gradient_accumulation_steps"] = 2
    (tmp_path / "b.json").write_text(json.dumps(other))
    text = finished(torchrun(EXAMPLE, 2, tmp_path / "b.json", "--steps", "17", "--checkpoint-dir", str(ckpt),
                             cwd=work), work)
    assert "resume: the job changed since checkpoint" in text and "microbatches 4 -> 2" in text
    assert [x["phase"] for x in iterations(tmp_path / "report" / "b", 0)][:2] == ["calibrate", "calibrate"]


@pytest.mark.slow
def test_a_hostile_state_resumes_with_one_line_and_profiles_again(tmp_path: Path) -> None:
    """The checkpoint's envpipe_state.json replaced by a FIFO (the old job hung, no output) and by a document
    with NaN (accepted: `nan ms` in the report, NaN in summary.json): one line, the phases again, exit 0, and
    summary.json holds no NaN (tests/runtime/test_state.py has every other hostile state, fast)."""
    ckpt = tmp_path / "ckpt"
    first = tmp_path / "first"
    first.mkdir()
    finished(torchrun(EXAMPLE, 2, ds_config(tmp_path, "base"), "--steps", "15", "--checkpoint-dir", str(ckpt),
                      cwd=first), first)
    saved = ckpt / "global_step15" / "envpipe_state.json"
    good = json.loads(saved.read_text())
    nan = json.dumps({**good, "idle_power_w": "NAN"}).replace('"NAN"', "NaN")
    for name, spoil in (("fifo", lambda: os.mkfifo(saved)), ("nan", lambda: saved.write_text(nan))):
        saved.unlink()
        spoil()
        work = tmp_path / name
        work.mkdir()
        text = finished(torchrun(EXAMPLE, 2, ds_config(tmp_path, name), "--steps", "31", "--checkpoint-dir",
                                 str(ckpt), "--save-every", "100", cwd=work), work, timeout=600)
        lines = [ln for ln in text.splitlines() if "resume:" in ln]
        assert len(lines) == 1 and "calibrating and profiling again" in lines[0], text[-3000:]
        assert ("not a regular file" if name == "fifo" else "NaN is not a finite number") in lines[0]
        assert "Traceback" not in text
        assert [x["phase"] for x in iterations(tmp_path / "report" / name, 0)][:2] == ["calibrate", "calibrate"]
        parse_json((tmp_path / "report" / name / "summary.json").read_text())  # refuses NaN and Infinity


@pytest.mark.slow
def test_sigterm_leaves_every_clock_at_default(tmp_path: Path) -> None:
    """Clock control through a real envpipe-clockd (sim backend); SIGTERM in the steady phase."""
    sock = str(tmp_path / "clockd.sock")
    work = tmp_path / "run"
    work.mkdir()
    with daemon_thread(sock) as service:
        proc = torchrun(EXAMPLE, 2, ds_config(tmp_path, "term", {"clock": "daemon"}), "--steps", "500", cwd=work,
                        env={"ENVPIPE_CLOCKD_SOCKET": sock})
        report = tmp_path / "report" / "term"
        wait_for(lambda: any(x["phase"] == "steady" for x in iterations(report, 0))
                 if (report / "iterations.rank0.jsonl").exists() else False, timeout=240)
        assert service.locked()  # the plan holds lower clocks
        proc.send_signal(signal.SIGTERM)  # torchrun hands it to every rank, as a batch system's stop does
        proc.wait(timeout=60)
        deadline = time.monotonic() + 10
        while service.locked() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not service.locked()
