"""Start and end a training process's DeepSpeed process groups so that nothing is left behind.

Start: DeepSpeed's CPU backend JIT-compiles a shared-memory all-reduce op at `init_distributed`, and when
all ranks share a host (its launcher sets LOCAL_SIZE) maps a 66 MiB `/dev/shm` segment per rank that it
never unlinks. Only its inference all-reduce uses the op, EnvPipe never does, so it is switched off.

End: the gloo process groups DeepSpeed keeps referenced (pipeline p2p groups, the grid's groups) outlive
`destroy_process_group()`, and so do their worker threads. A worker that drops a finished collective's
work after the main thread has begun interpreter finalization must take the GIL to free the work's
tensors; CPython then ends that thread with a forced unwind through a noexcept frame, and the rank dies
with SIGABRT "terminate called without an active exception" after a successful run (seen in a core dump:
`~AsyncAllgatherWork` -> `gil_scoped_acquire` -> `PyThread_exit_thread` -> `std::terminate`; see
pytorch/pytorch#179291). A finished process therefore ends with `os._exit` once every group is destroyed
and every stream flushed: no interpreter finalization, no race.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from typing import NoReturn

import deepspeed
import torch.distributed as tdist

SHM_COMM_OP = "deepspeed_shm_comm"
# what a launcher sets (torchrun, DeepSpeed's, mpirun/OpenMPI, MPICH/PMI, Slurm): without any, one process
LAUNCHER_VARIABLES = ("RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK", "SLURM_PROCID")


def init_distributed(on_gpu: bool) -> None:
    """`deepspeed.init_distributed` with NCCL on GPU, gloo on CPU, and no shared-memory comm op. Started by no
    launcher (`python script.py`), the job is one process: DeepSpeed would look for MPI instead."""
    # DeepSpeed caches the probed op table in the module so that edits to it persist (deepspeed/ops/__init__.py)
    deepspeed.ops.__compatible_ops__[SHM_COMM_OP] = False
    if not any(v in os.environ for v in LAUNCHER_VARIABLES):
        with socket.socket() as s:  # a free port for the one process's store
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                           "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    deepspeed.init_distributed(dist_backend="nccl" if on_gpu else "gloo")


def exit_process(code: int = 0) -> NoReturn:
    """End a rank that has finished its work: destroy its process groups, flush, and leave without finalization.

    Call it last, after clocks are restored and reports are written: atexit handlers do not run.
    """
    if tdist.is_initialized():
        tdist.destroy_process_group()  # local on every rank: no rank waits for another here
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
