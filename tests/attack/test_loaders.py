"""The attack suite (#35): property-based fuzzing (hypothesis, derandomized, bounded examples: the fast tier) of
what reads a user's or a checkpoint's files, and of the launcher's quoting.

- The loaders here: the checkpoint's EnvPipe state (envpipe.runtime.state.load), plan files
  (envpipe.plan.planfile.Plan.load) and layer profiles (envpipe.search.layers.load_layer_profile), each fed
  hostile files (tests/support/hostile_json.py: a valid document changed, its text spoiled, or any bytes). Each
  answers with its document or one line (state: the line it returns; plans: PlanError; layer profiles:
  LayerProfileError), never another exception, and what it accepts is used without one: a state resumes
  (`from_state`), a plan says whether the engine runs it in its pipeline.
- The launcher's quoting: tests/launch/test_words.py, any byte string in, the same byte string seen by a
  remote `printf %s` through DeepSpeed's own runner code, pdsh's `%` formats and bash.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from envpipe.plan.planfile import Plan, PlanError
from envpipe.plan.schedules import envpipe_schedule
from envpipe.runtime import state
from envpipe.search.layers import LayerProfileError, load_layer_profile
from tests.support.hostile_json import files
from tests.support.layer_profiles import layer_profile
from tests.support.runtime_summary import sample_decided

SHAPE = state.JobShape(4, 2, 2, 4, 2, ["0123456789abcdef", "fedcba9876543210"])
FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
STATE = state.document(state.to_state(SHAPE, sample_decided(), 1))
PLAN = Plan.at_one_clock(envpipe_schedule(2, 4, [1, 0]), 1410, "envpipe", "optimal").to_json()
LAYERS = layer_profile([1.0, 3.0, 3.0, 2.0]).to_json()


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("attack")


def _one_line(message: str) -> None:
    assert message and "\n" not in message and len(message) < 2000, message


@FUZZ
@given(files(STATE))
def test_the_state_loader_answers_every_file_with_a_state_or_one_line(folder: Path, data: bytes) -> None:
    (folder / state.STATE_FILE).write_bytes(data)
    found = state.load(folder, SHAPE)
    if isinstance(found, str):
        _one_line(found)
    else:  # accepted: it resumes
        restored = state.from_state(found)
        assert set(restored.decision.plans) == set(range(SHAPE.replicas))


@FUZZ
@given(files(PLAN))
def test_the_plan_loader_answers_every_file_with_a_plan_or_one_line(folder: Path, data: bytes) -> None:
    (folder / "plan.json").write_bytes(data)
    try:
        plan = Plan.load(folder / "plan.json")
    except PlanError as exc:
        _one_line(str(exc))
        return
    why = plan.pipeline_error(2, 4)  # accepted: it says whether the engine runs it in this pipeline
    assert why is None or "\n" not in why


@FUZZ
@given(files(LAYERS))
def test_the_layer_profile_loader_answers_every_file_with_a_profile_or_one_line(folder: Path, data: bytes) -> None:
    (folder / "layers.json").write_bytes(data)
    try:
        profile = load_layer_profile(folder / "layers.json")
    except LayerProfileError as exc:
        _one_line(str(exc))
        return
    assert all(c.activation_bytes > 0 for layer in profile.layers for c in layer.per_micro_batch.values())
