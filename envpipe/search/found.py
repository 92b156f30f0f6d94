"""The found configuration as a file that trains it: a DeepSpeed config with an `envpipe` block and an
`envpipe_search` block, read back by examples/train_gpt.py (`--config found.json`).

    {"train_batch_size": 64, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 16,
     "bf16": {"enabled": true}, "zero_optimization": {"stage": 0},
     "envpipe": {"pipeline_stages": 2, "plan": "found.plan.json"},
     "envpipe_search": {"version": 1, "model": {"family": "gpt2", ...}, "dtype": "bf16", "micro_batch": 2,
                        "microbatches": 16, "stage_layers": [9, 9], "gpus": {"nodes": 1, "gpus_per_node": 4},
                        "predicted": {...}, "label": "simulated ..."}}

The plan path is relative to the config file. DeepSpeed's batch keys and the block agree by construction;
`train_settings` checks them again, so an edited file that no longer agrees stops with one line.
"""

from __future__ import annotations

import shlex
from typing import Any

from envpipe.search.band import HostBand
from envpipe.search.cluster import Cluster
from envpipe.search.engine_model import EngineModel
from envpipe.search.evaluate import Candidate
from envpipe.search.layers import DTYPES, FAMILIES, MODEL_KEYS, LayerProfile

FOUND_VERSION = 1
TRAIN_SCRIPT = "examples/train_gpt.py"
SIMULATED = ("simulated: layer profile {source} ({device}, {dtype}, {date}), lower clocks from the {model} "
             "frequency model")


class FoundConfigError(ValueError):
    """A found-configuration block that cannot be trained as written."""


def simulated_label(layers: LayerProfile) -> str:
    return SIMULATED.format(source=layers.source, device=layers.device, dtype=layers.dtype, date=layers.date,
                            model=layers.clock_model)


def found_config(candidate: Candidate, layers: LayerProfile, cluster: Cluster, plan_file: str,
                 engine: EngineModel, graphed: bool = False) -> dict[str, Any]:
    """The DeepSpeed config (with both blocks) that trains ``candidate``; ``plan_file`` relative to it.
    ``engine``: the engine model the predictions used; its allocator setting is the one to train with.
    ``graphed``: predicted with the units replayed as CUDA graphs, which the config switches on."""
    shape = candidate.shape
    config: dict[str, Any] = {
        "train_batch_size": shape.global_batch,
        "train_micro_batch_size_per_gpu": shape.micro_batch,
        "gradient_accumulation_steps": shape.microbatches,
    }
    if layers.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    config["zero_optimization"] = {"stage": 0}  # what the search's memory model counts (envpipe.search.memory)
    config["envpipe"] = {"pipeline_stages": shape.stages, "plan": plan_file}
    if graphed:
        config["envpipe"]["cuda_graphs"] = True
    config["envpipe_search"] = {
        "version": FOUND_VERSION,
        "model": layers.model.to_json(),
        "dtype": layers.dtype,
        "micro_batch": shape.micro_batch,
        "microbatches": shape.microbatches,
        "stage_layers": list(candidate.pipeline.cut.counts),
        "gpus": {"nodes": cluster.nodes, "gpus_per_node": cluster.gpus_per_node},
        "allocator": engine.allocator,  # PYTORCH_CUDA_ALLOC_CONF the memory predictions hold for (launch_command)
        "torch_threads": layers.cpu_threads,  # a CPU profile's threads: envpipe.initialize warns when they differ
        "predicted": predicted(candidate),
        "label": simulated_label(layers),
        "engine_model": engine.label,
    }
    return config


def with_band(config: dict[str, Any], band: HostBand) -> dict[str, Any]:
    """``config`` (found_config's) whose predictions carry the candidate's host band (envpipe.search.band)."""
    block = config["envpipe_search"]
    return {**config, "envpipe_search": {**block, "predicted": {**block["predicted"], **band.to_json()}}}


def predicted(candidate: Candidate) -> dict[str, Any]:
    """What the search predicts for a configuration (all simulated)."""
    return {
        "iteration_time_s": candidate.iteration_time_s,
        "baseline_iteration_time_s": candidate.pipeline.baseline_time_s,  # 1F1B, every unit at the top clock
        "order_iteration_time_s": candidate.order_time_s,  # the plan's order at the top clock (no envpipe-clockd)
        "throughput_samples_per_s": candidate.throughput(),
        "energy_per_iteration_j": candidate.energy_j,
        "baseline_energy_per_iteration_j": candidate.baseline_energy_j,
        "energy_saving": candidate.saving,
        "peak_memory_bytes_per_stage": list(candidate.peak_bytes),  # the device's: what must fit
        "peak_allocated_bytes_per_stage": list(candidate.peak_allocated_bytes),  # the caching allocator's
        "order": candidate.order,
        "reschedule": candidate.reschedule,
        "clocks_planned": candidate.planned,
    }


def launch_command(cluster: Cluster, config_path: str, layers: LayerProfile, engine: EngineModel,
                   launch_args: str = "") -> str:
    """The envpipe-launch command that trains the configuration (``launch_args``: backend options). A profile
    measured on CPU holds for processes with its thread count, and the memory model for the allocator
    setting it was fitted with: the command hands both to every rank with `--env` (a shell prefix would reach
    the launcher only, not ranks started over ssh or in pods)."""
    env = [f"OMP_NUM_THREADS={layers.cpu_threads}"] if layers.cpu_threads is not None else []
    if engine.allocator:
        env.append(f"PYTORCH_CUDA_ALLOC_CONF={engine.allocator}")
    words = ["envpipe-launch", "--nodes", str(cluster.nodes), "--gpus-per-node", str(cluster.gpus_per_node),
             *[w for e in env for w in ("--env", e)], *shlex.split(launch_args), "--", TRAIN_SCRIPT,
             "--config", config_path]
    return shlex.join(words)


def train_settings(block: Any, ds_config: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """The training script's settings from an `envpipe_search` block (model, dtype, micro-batch size and
    count, stage cut), checked against the DeepSpeed keys beside it; and the plan path (None: none)."""
    if not isinstance(block, dict) or block.get("version") != FOUND_VERSION:
        raise FoundConfigError(f"'envpipe_search' must be an object with \"version\": {FOUND_VERSION}")
    model = block.get("model")
    keys = MODEL_KEYS
    if not isinstance(model, dict) or set(model) != set(keys) or model["family"] not in FAMILIES or any(
            not _positive(model[k]) for k in keys[1:]):
        raise FoundConfigError(f"'envpipe_search.model' must give {', '.join(keys)} (family one of "
                               f"{', '.join(FAMILIES)}, the others positive integers)")
    if block.get("dtype") not in DTYPES:
        raise FoundConfigError(f"'envpipe_search.dtype' must be one of {', '.join(DTYPES)}")
    cut = block.get("stage_layers")
    if not isinstance(cut, list) or not cut or not all(_positive(c) for c in cut):
        raise FoundConfigError("'envpipe_search.stage_layers' must be a list of positive layer counts")
    if sum(cut) != model["layers"] + 2:
        raise FoundConfigError(f"'envpipe_search.stage_layers' cuts {sum(cut)} layers; the model has "
                               f"{model['layers'] + 2} (embedding, {model['layers']} blocks, head)")
    for key, ds_key in (("micro_batch", "train_micro_batch_size_per_gpu"),
                        ("microbatches", "gradient_accumulation_steps")):
        if not _positive(block.get(key)) or ds_config.get(ds_key, block.get(key)) != block.get(key):
            raise FoundConfigError(f"'envpipe_search.{key}' must be a positive integer equal to {ds_key!r}")
    envpipe = ds_config.get("envpipe")
    if not isinstance(envpipe, dict):
        raise FoundConfigError("the config has no 'envpipe' block (pipeline_stages, plan)")
    stages = envpipe.get("pipeline_stages")
    if stages != len(cut):
        raise FoundConfigError(f"'envpipe.pipeline_stages' is {stages!r}; the stage cut has {len(cut)} stages")
    settings = {"model": model["family"], **{k: model[k] for k in keys[1:]}, "dtype": block["dtype"],
                "micro_batch": block["micro_batch"], "microbatches": block["microbatches"], "stage_layers": list(cut)}
    plan = envpipe.get("plan")
    return settings, plan if isinstance(plan, str) and plan else None


def _positive(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1
