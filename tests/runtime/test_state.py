"""The checkpoint's EnvPipe state (envpipe.runtime.state): a typed, bounded document. A round trip keeps what
was decided; every hostile `envpipe_state.json` (right types with wrong values, wrong shapes, NaN, numbers
out of range, deep nesting, a FIFO, /dev/zero) is one line from `load`, after which the run profiles again
(tests/runtime/test_dropin.py runs that resume for real), never an exception or a hang. The engine writes the
state before DeepSpeed names the tag in `latest`."""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from deepspeed.runtime.pipe.engine import PipelineEngine

from envpipe.limits import parse_json
from envpipe.plan.planfile import Plan
from envpipe.plan.schedules import one_f_one_b
from envpipe.runtime import state
from envpipe.runtime import summary as S
from envpipe.runtime.engine.engine import EnvPipeEngine
from tests.support.runtime_summary import sample_calibrated, sample_decided

MODELS = ["0123456789abcdef", "fedcba9876543210"]
SHAPE = state.JobShape(4, 2, 2, 4, 2, MODELS)


@pytest.fixture
def saved(tmp_path: Path) -> dict[str, Any]:
    """A good state's document, as saved."""
    state.save(tmp_path, state.to_state(SHAPE, sample_decided(), 1))
    return json.loads((tmp_path / state.STATE_FILE).read_text())


def test_round_trip_keeps_what_was_decided(tmp_path: Path, saved: dict[str, Any]) -> None:
    loaded = state.load(tmp_path, SHAPE)
    assert isinstance(loaded, state.RunState) and loaded.pairs_done == 1 and loaded.shape == SHAPE
    restored = state.from_state(loaded)
    calibrated, again = restored.calibrated, restored.decision
    original = sample_decided().decision
    assert again == replace(original, profile=again.profile) and again.info == original.info
    assert restored.reconfiguration is None
    assert again.profile is not None and np.array_equal(again.profile.fwd_time, original.profile.fwd_time)
    assert calibrated.timing == sample_calibrated().timing and np.isnan(calibrated.unit_energies[0].units.bwd_j)
    assert [calibrated.waiting_power_of(r) for r in range(4)] == [121.0, None, 126.0, 119.0]
    parse_json((tmp_path / state.STATE_FILE).read_text())  # no NaN in the file: an unmeasured energy is null
    assert saved["unit_energies"][0]["B_j"] is None
    del saved["waiting_power_w"]  # a state saved before the field: still resumes, splitting energy as it did
    (tmp_path / state.STATE_FILE).write_text(json.dumps(saved))
    loaded = state.load(tmp_path, SHAPE)
    assert isinstance(loaded, state.RunState) and state.from_state(loaded).calibrated.waiting_power_of(3) is None


def test_what_the_pairs_kept_resumes_with_the_job(tmp_path: Path) -> None:
    """A job whose pairs sent it back to 1F1B resumes on 1F1B (no pairs again); a state without a verdict (saved
    before the pairs ended, or before the field) has none."""
    refused = S.Verdict(False, "the plan's order, 1f1b, at default clocks", 0.027, -0.013, 0.0, "measured slower")
    assert state.write(tmp_path, SHAPE, sample_decided(), 2, refused) is None
    loaded = state.load(tmp_path, SHAPE)
    assert isinstance(loaded, state.RunState) and loaded.verdict == refused and loaded.pairs_done == 2
    state.save(tmp_path, state.to_state(SHAPE, sample_decided(), 0))
    loaded = state.load(tmp_path, SHAPE)
    assert isinstance(loaded, state.RunState) and loaded.verdict is None


def test_another_job_is_one_line(tmp_path: Path, saved: dict[str, Any]) -> None:
    assert state.load(tmp_path, replace(SHAPE, microbatches=8)) == (
        f"the job changed since checkpoint {tmp_path} (microbatches 4 -> 8)")
    assert SHAPE.differences(replace(SHAPE, models=[MODELS[0], "1" * 16])) == [
        "the model's parameters on stage(s) [1]"]


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], Any]:
    def change(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for key in parents:
            doc = doc[int(key)] if isinstance(doc, list) else doc[key]  # type: ignore[assignment]
        if value is DELETE:
            del doc[last]  # type: ignore[arg-type]
        elif isinstance(doc, list):
            doc[int(last)] = value
        else:
            doc[last] = value
    return change


DELETE = object()
FOUR_STAGES = Plan.at_one_clock(one_f_one_b(4, 4), 1410, "1f1b", "baseline").to_json()
EIGHT_MB = Plan.at_one_clock(one_f_one_b(2, 8), 1410, "1f1b", "baseline").to_json()
# (what is wrong, how the document changes, what the line names)
HOSTILE: list[tuple[str, Callable[[dict[str, Any]], Any], str]] = [
    ("an extra calibration key", _set("calibration.extra_s", 1.0), "calibration.extra_s"),
    ("a missing calibration key", _set("calibration.head_s", DELETE), "calibration.head_s: Field required"),
    ("a time of -1e308", _set("calibration.fwd_s.0", -1e308), "calibration.fwd_s.0: a number beyond 1e+15"),
    ("a negative time", _set("calibration.fwd_s.0", -0.5), "calibration.fwd_s.0: Input should be greater"),
    ("a huge time", _set("calibration.transfer_s", 1e300), "beyond 1e+15"),
    ("a time as text", _set("calibration.transfer_s", "0.1"), "calibration.transfer_s: Input should be a valid"),
    ("a calibration of 3 stages", _set("calibration.bwd_s", [0.1, 0.1, 0.1]), "calibration.bwd_s: 3 entries"),
    ("no plans", _set("plans", {}), "plans: one per replica"),
    ("a 4-stage plan in a 2-stage job", _set("plans.0", FOUR_STAGES), "plans.0: plan is for 4 stages"),
    ("a plan for 8 micro-batches of 4", _set("plans.1", EIGHT_MB), "plans.1: plan is for 2 stages x 8"),
    ("a third replica's plan", _set("plans.2", FOUR_STAGES), "plans: one per replica"),
    ("a plan that is no plan", _set("plans.0", {"version": 1}), "plans.0: 'num_stages' must be an integer"),
    ("profile clock -1", _set("profile.freqs.0", -1), "profile.freqs.0: Input should be greater"),
    ("profile clock 10^9", _set("profile.freqs.0", 10**9), "profile.freqs.0: Input should be less"),
    ("ragged profile rows", _set("profile.fwd_time.0", [0.1]), "fwd_time must have one row per stage"),
    ("a profile of 3 stages", _set("profile.fwd_time", [[0.1]] * 3), "fwd_time must have one row per stage"),
    ("an unknown origin", _set("origin", "oracle"), "origin: Input should be"),
    ("pairs_done -5", _set("pairs_done", -5), "pairs_done: Input should be greater than or equal to 0"),
    ("a straggler rank 99 of 2", _set("straggler", 99), "straggler: replica 99 of a job with 2"),
    ("waiting power for 3 ranks of 4", _set("waiting_power_w", [1.0, 2.0, 3.0]), "waiting_power_w: 3 entries"),
    ("a negative power", _set("blocking_power_w.1", -5.0), "blocking_power_w.1: Input should be greater"),
    ("memory of 1 stage", _set("memory", DELETE), "memory: Field required"),
    ("negative memory", _set("memory.0.static_bytes", -1), "memory: byte and micro-batch counts must be >= 0"),
    ("a predicted time of 0", _set("predicted_time_s", 0), "predicted_time_s: Input should be greater than 0"),
    ("a model digest that is none", _set("shape.models.0", "x"), "shape.models.0: String should match"),
    ("3 models for 2 stages", _set("shape.models", [*MODELS, MODELS[0]]), "models: 3 entries for 2 stages"),
    ("another plan's digest", _set("info.digest", "0" * 16), "info.digest is not replica 0's plan"),
    ("a version 2", _set("version", 2), "not a version 1 EnvPipe state"),
]
RAW: list[tuple[str, str, str]] = [  # (what, text, what the line names)
    ("NaN", '{"version": 1, "idle_power_w": NaN}', "NaN is not a finite number"),
    ("Infinity", '{"version": 1, "idle_power_w": -Infinity}', "-Infinity is not a finite number"),
    ("pairs_done 10^400", '{"version": 1, "pairs_done": 1' + "0" * 400 + "}", "integer out of range"),
    ("a float that overflows", '{"version": 1, "idle_power_w": 1e400}', "number out of range"),
    ("5,000-deep nesting", '{"version": 1, "x": ' + "[" * 5000 + "]" * 5000 + "}", "nested deeper than 10 levels"),
    ("11-deep nesting", '{"version": 1, "x": ' + "[" * 11 + "]" * 11 + "}", "nested deeper than 10 levels"),
    ("not JSON", "{", "not JSON"),
    ("a list", "[1]", "not a version 1 EnvPipe state"),
    ("bytes that are not UTF-8", '{"version": 1, "source": "\udcff"}', "not a UTF-8 EnvPipe state file"),
]


def _one_line(found: Any, *fragments: str) -> None:
    assert isinstance(found, str) and "\n" not in found and len(found) < 1000, found
    for fragment in fragments:
        assert fragment in found, found


@pytest.mark.parametrize(("what", "change", "line"), HOSTILE, ids=[h[0] for h in HOSTILE])
def test_a_hostile_state_is_one_line(what: str, change: Callable[[dict[str, Any]], Any], line: str,
                                     tmp_path: Path, saved: dict[str, Any]) -> None:
    change(saved)
    (tmp_path / state.STATE_FILE).write_text(json.dumps(saved))
    _one_line(state.load(tmp_path, SHAPE), str(tmp_path / state.STATE_FILE), line)


@pytest.mark.parametrize(("what", "text", "line"), RAW, ids=[r[0] for r in RAW])
def test_a_state_that_is_not_one_is_one_line(what: str, text: str, line: str, tmp_path: Path) -> None:
    (tmp_path / state.STATE_FILE).write_bytes(text.encode(errors="surrogateescape"))
    _one_line(state.load(tmp_path, SHAPE), line)


def test_no_state_a_fifo_and_dev_zero_are_one_line_at_once(tmp_path: Path) -> None:
    """A FIFO must not block the reader (no writer ever comes), /dev/zero must not be read to the end."""
    _one_line(state.load(tmp_path, SHAPE), f"checkpoint {tmp_path} has no EnvPipe state")
    for make in (lambda p: os.mkfifo(p), lambda p: p.symlink_to("/dev/zero"), lambda p: p.mkdir()):
        path = tmp_path / state.STATE_FILE
        if path.is_dir():
            path.rmdir()
        else:
            path.unlink(missing_ok=True)
        make(path)
        found: list[Any] = []
        reader = threading.Thread(target=lambda out=found: out.append(state.load(tmp_path, SHAPE)), daemon=True)
        reader.start()
        reader.join(10)
        assert not reader.is_alive(), "load blocked"
        _one_line(found[0], str(path))


def test_numbers_of_a_run_outside_the_bounds_are_one_line_not_a_crash(tmp_path: Path) -> None:
    """A checkpoint goes on without EnvPipe's state when a number of the run itself is out of bounds."""
    bad = sample_decided()
    bad = replace(bad, calibrated=replace(bad.calibrated, idle_power_w=1e9))
    why = state.write(tmp_path, SHAPE, bad, 0)
    assert why is not None and why.startswith("idle_power_w:") and not (tmp_path / state.STATE_FILE).exists()
    assert state.write(tmp_path, SHAPE, sample_decided(), 0) is None and (tmp_path / state.STATE_FILE).exists()


def test_the_state_is_in_the_tag_before_deepspeed_names_it_latest(tmp_path: Path, monkeypatch) -> None:
    """The old engine wrote it after DeepSpeed's save: a SIGKILL in between left `latest` naming a tag without
    it, and the resume lost the decision. Here DeepSpeed's save (a recorder) sees the state already there."""
    seen: list[bool] = []

    def deepspeed_save(self: Any, save_dir: str, tag: str, *args: Any, **kwargs: Any) -> bool:
        seen.append((Path(save_dir) / tag / state.STATE_FILE).exists())
        (Path(save_dir) / "latest").write_text(tag)
        return True

    class Run:
        def save_state(self, folder: Path) -> None:
            state.save(folder, state.to_state(SHAPE, sample_decided(), 0))

    monkeypatch.setattr(PipelineEngine, "save_checkpoint", deepspeed_save)
    engine = object.__new__(EnvPipeEngine)  # DeepSpeed's engine needs a process group: only what the call uses
    engine.__dict__.update(envpipe=Run(), global_steps=14)
    assert EnvPipeEngine.save_checkpoint(engine, str(tmp_path)) is True
    assert seen == [True] and (tmp_path / "latest").read_text() == "global_step14"
