"""examples/train_gpt.py's search arguments: a stage cut or a found configuration that cannot train stops
with one line before any process group starts."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def train_gpt() -> ModuleType:
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        import train_gpt
    finally:
        sys.path.remove(str(ROOT / "examples"))
    return train_gpt


def _found(tmp_path: Path, **edits) -> Path:
    block = {"version": 1, "model": {"family": "gpt2", "layers": 4, "hidden": 32, "heads": 2, "seq": 16,
                                     "vocab": 128},
             "dtype": "fp32", "micro_batch": 2, "microbatches": 4, "stage_layers": [3, 3]}
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 4,
              "envpipe": {"pipeline_stages": 2, "plan": "p.json"}, "envpipe_search": {**block, **edits}}
    path = tmp_path / "found.json"
    path.write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("argv", "message"), [
    (["--tiny", "--stage-layers", "3,3"], "--stage-layers 3,3 cuts 6 layers into 2 stages; the pipeline has 6 "
                                          "layers (embedding, 4 blocks, head) and 1 stages"),
    (["--tiny", "--stage-layers", "2,2"], "--stage-layers 2,2 cuts 4 layers into 2 stages; the pipeline has 6 "
                                          "layers (embedding, 4 blocks, head) and 1 stages"),
    (["--config", "{found}"], "--deepspeed_config {found}: 'envpipe_search.stage_layers' cuts 8 layers; the model "
                              "has 6 (embedding, 4 blocks, head)"),
])
def test_bad_cut_one_line(train_gpt, tmp_path: Path, capsys, monkeypatch, argv: list[str], message: str) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)  # one process: one stage
    found = _found(tmp_path, stage_layers=[4, 4])
    argv = [str(found) if a == "{found}" else a for a in argv]
    with pytest.raises(SystemExit) as exit_:
        train_gpt.main(argv)
    err = capsys.readouterr().err
    assert exit_.value.code == 2
    assert err == f"train_gpt.py: error: {message.replace('{found}', str(found))}\n"


def test_found_configuration_sets_the_job(train_gpt, tmp_path: Path) -> None:
    """The example takes the model from the found configuration and resolves its plan beside the file (as
    envpipe.initialize does for a config path: tests/runtime/test_dropin_parts.py)."""
    found = _found(tmp_path)
    args = train_gpt.parse_args(["--deepspeed_config", str(found)])
    config = train_gpt.deepspeed_config(args)
    assert (args.model, args.layers, args.hidden, args.micro_batch, args.microbatches, args.stage_layers) == (
        "gpt2", 4, 32, 2, 4, [3, 3]) and args.pipeline_stages == 2
    assert config["envpipe_search"]["stage_layers"] == [3, 3]
    assert config["envpipe"]["plan"] == str(found.parent / "p.json")
