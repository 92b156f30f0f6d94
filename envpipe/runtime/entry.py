"""`envpipe.initialize`: `deepspeed.initialize` for a PipelineModule, with EnvPipe inside `train_batch()`.

A DeepSpeed pipeline script changes one line:

    engine, optimizer, loader, scheduler = deepspeed.initialize(args=args, model=net, ...)   # before
    engine, optimizer, loader, scheduler = envpipe.initialize(args=args, model=net, ...)     # after

Same arguments, same return values; the engine is DeepSpeed's PipelineEngine with EnvPipe's phases run
inside the script's own `train_batch()` calls (envpipe.runtime.run). The DeepSpeed config comes the way
DeepSpeed takes it (`config=` a dict or a path, or `args.deepspeed_config` from
`deepspeed.add_config_arguments`); its `envpipe` block (envpipe.runtime.config) and the ENVPIPE_* variables
configure EnvPipe and are removed before DeepSpeed sees the config, as is a found configuration's
`envpipe_search` block (`envpipe search`; its plan path is relative to the config file).

The clock is decided before the engine is built: a job that asked for clock control and cannot have it
stops here with one line (`ClockUnavailable`); a GPU without the clock daemon says in one line that it runs
at default clocks. Clocks go back to default on every exit: the end of the process, SIGTERM, an exception
that ends it, `engine.destroy()`.
"""

from __future__ import annotations

import argparse
import atexit
import copy
import logging
import os
import signal
import weakref
from pathlib import Path
from types import FrameType
from typing import Any

import deepspeed
import torch
from deepspeed.pipe import PipelineModule

from envpipe.limits import MAX_CONFIG_BYTES, parse_json, read_text
from envpipe.runtime import config as envpipe_config
from envpipe.runtime.clocks import Device, make_clock
from envpipe.runtime.engine.engine import EnvPipeEngine, engine_class
from envpipe.runtime.engine.graphs import CudaGraphs, GraphError
from envpipe.runtime.measure.replicas import sim_slowdown
from envpipe.runtime.run import EnvPipeRun

log = logging.getLogger(__name__)
FOUND_BLOCK = "envpipe_search"  # a configuration found by `envpipe search`: the script's settings


class EnvPipeSetupError(ValueError):
    """The job cannot start as configured (one line)."""


def initialize(args: Any = None, model: Any = None, optimizer: Any = None, model_parameters: Any = None,
               training_data: Any = None, lr_scheduler: Any = None,
               distributed_port: int = deepspeed.constants.TORCH_DISTRIBUTED_DEFAULT_PORT, mpu: Any = None,
               dist_init_required: bool | None = None, collate_fn: Any = None, config: Any = None,
               mesh_param: Any = None, config_params: Any = None) -> tuple[Any, Any, Any, Any]:
    """`deepspeed.initialize` for a `deepspeed.pipe.PipelineModule`: (engine, optimizer, data loader, LR
    scheduler), the engine running EnvPipe inside `train_batch()`."""
    if not isinstance(model, PipelineModule):
        raise EnvPipeSetupError("envpipe.initialize needs a deepspeed.pipe.PipelineModule as model (EnvPipe plans "
                                f"pipeline stages), got {type(model).__name__}")
    ds_config, cfg, found = check_config(read_config(args, config if config is not None else config_params))
    if cfg.pipeline_stages is not None and cfg.pipeline_stages != model.num_stages:
        raise EnvPipeSetupError(f"the config's 'envpipe.pipeline_stages' is {cfg.pipeline_stages}; the model has "
                                f"{model.num_stages} pipeline stages")
    _warn_thread_count(found)
    on_gpu = deepspeed.get_accelerator().device_name() == "cuda"
    rank = int(os.environ.get("RANK", "0"))
    coord = model._topo.get_coord(rank)
    replica = coord.data
    # a simulated GPU runs its own stage's share of the hidden truth, the one the report's oracle reads
    device = Device(on_gpu, int(os.environ.get("LOCAL_RANK", "0")), replica, coord.pipe, model.num_stages)
    clock = make_clock(cfg, device, sim_slowdown(replica))
    try:
        with engine_class():
            engine, opt, loader, scheduler = deepspeed.initialize(
                args=_without_config(args), model=model, optimizer=optimizer, model_parameters=model_parameters,
                training_data=training_data, lr_scheduler=lr_scheduler, distributed_port=distributed_port,
                mpu=mpu, dist_init_required=dist_init_required, collate_fn=collate_fn, config=ds_config,
                mesh_param=mesh_param)
        assert isinstance(engine, EnvPipeEngine)
        _check_plan_fits(cfg, engine.num_stages, engine.micro_batches)
        if cfg.cuda_graphs:
            try:
                engine.run_units_as_graphs(CudaGraphs())
            except GraphError as exc:
                raise EnvPipeSetupError(str(exc)) from None
        run = engine.envpipe = EnvPipeRun(engine, cfg, clock)
    except BaseException:
        if clock is not None:
            clock.close()
        raise
    _release_on_exit(run)
    return engine, opt, loader, scheduler


def check_config(config: dict[str, Any]) -> tuple[dict[str, Any], envpipe_config.EnvPipeConfig, Any]:
    """(DeepSpeed's config, EnvPipe's, a found configuration's block or None): the `envpipe` and `envpipe_search`
    blocks removed, and checked as `initialize` checks them (a bad block, ENVPIPE_* variable, plan or profile
    file raises a ValueError of one line)."""
    ds_config, cfg = envpipe_config.split(config)
    found = ds_config.pop(FOUND_BLOCK, None)
    _check_inputs(cfg)
    return ds_config, cfg, found


def _check_inputs(cfg: envpipe_config.EnvPipeConfig) -> None:
    """A plan or profile file the run cannot use stops it here, in one line, not after its calibration."""
    from envpipe.plan.planfile import Plan
    from envpipe.profile import load_profile

    for key, load in (("plan", Plan.load), ("profile", load_profile)):
        given = getattr(cfg, key)
        if given:
            try:
                load(given)
            except (OSError, ValueError) as exc:
                raise EnvPipeSetupError(f"'envpipe.{key}': {exc}") from None


def _check_plan_fits(cfg: envpipe_config.EnvPipeConfig, stages: int, microbatches: int) -> None:
    """A plan file for another pipeline stops the job here, in one line, before its first step (it was refused
    only when the run reached its plan, after calibration, with a traceback)."""
    from envpipe.plan.planfile import Plan

    if cfg.plan:
        try:
            why = Plan.load(cfg.plan).pipeline_error(stages, microbatches)
        except (OSError, ValueError) as exc:  # read and checked in `check_config` already; changed since
            why = str(exc)
        if why:
            raise EnvPipeSetupError(f"'envpipe.plan' {cfg.plan}: {why}")


def read_config(args: Any, config: Any) -> dict[str, Any]:
    """The DeepSpeed config as DeepSpeed takes it (a dict, a path, or `args.deepspeed_config`). Read from a file
    that is a found configuration (`envpipe search`), its plan path is made relative to the file."""
    from_args = getattr(args, "deepspeed_config", None)
    if from_args is not None and config is not None:
        raise EnvPipeSetupError("a DeepSpeed config was given twice: --deepspeed_config and config=")
    source = config if config is not None else from_args
    if source is None:
        raise EnvPipeSetupError("no DeepSpeed config: give config= or --deepspeed_config (deepspeed.add_config_"
                                "arguments)")
    if isinstance(source, dict):
        return copy.deepcopy(source)
    path = Path(source)
    try:  # a regular file of bounded size: /dev/zero or a FIFO is refused, never read or waited on
        data = parse_json(read_text(path, MAX_CONFIG_BYTES, "DeepSpeed config"))
    except OSError as exc:
        raise EnvPipeSetupError(f"DeepSpeed config {path}: cannot read: {exc.strerror or exc}") from None
    except ValueError as exc:
        raise EnvPipeSetupError(f"DeepSpeed config {path}: {exc}") from None
    if not isinstance(data, dict):
        raise EnvPipeSetupError(f"DeepSpeed config {path}: a DeepSpeed config is a JSON object")
    block = data.get("envpipe")
    if FOUND_BLOCK in data and isinstance(block, dict) and isinstance(block.get("plan"), str) and block["plan"]:
        data["envpipe"] = {**block, "plan": str(path.parent / block["plan"])}  # a found plan lies beside its file
    return data


def _without_config(args: Any) -> Any:
    """The script's args with the config path taken out (DeepSpeed refuses a config given twice)."""
    if getattr(args, "deepspeed_config", None) is None:
        return args
    clean = copy.copy(args) if not isinstance(args, argparse.Namespace) else argparse.Namespace(**vars(args))
    clean.deepspeed_config = None
    return clean


def _warn_thread_count(found: Any) -> None:
    """One line when the torch threads differ from those the found configuration's layer profile had."""
    threads = found.get("torch_threads") if isinstance(found, dict) else None
    if isinstance(threads, int) and threads != torch.get_num_threads() and int(os.environ.get("RANK", "0")) == 0:
        print(f"[envpipe] warning: torch uses {torch.get_num_threads()} threads, the layer profile the configuration "
              f"was found on used {threads}: times will differ from the search's (set OMP_NUM_THREADS={threads}, "
              "or pass it with envpipe-launch --env)", flush=True)


_RUNS: weakref.WeakSet[EnvPipeRun] = weakref.WeakSet()


def _release_on_exit(run: EnvPipeRun) -> None:
    """Default clocks again at the end of the process and on SIGTERM (then SIGTERM's own effect)."""
    if not _RUNS:
        atexit.register(_close_all)
        previous = signal.getsignal(signal.SIGTERM)

        def on_sigterm(signum: int, frame: FrameType | None) -> None:
            _close_all()
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                os.kill(os.getpid(), signal.SIGTERM)

        try:
            signal.signal(signal.SIGTERM, on_sigterm)
        except ValueError:  # not the main thread: atexit and the daemon's lease still reset the clocks
            log.debug("envpipe: SIGTERM handler not installed (not the main thread)")
    _RUNS.add(run)


def _close_all() -> None:
    for run in list(_RUNS):
        run.close()
