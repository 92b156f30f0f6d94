"""envpipe.runtime.distributed in real processes: no shared-memory comm op, and an exit without finalization."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from tests.support.ports import free_port

ROOT = Path(__file__).resolve().parents[2]


def _run(script: str, tmp_path: Path, port: int) -> subprocess.CompletedProcess:
    """One rank of a one-rank gloo job, as DeepSpeed's launcher starts it on a single host (LOCAL_SIZE set)."""
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "PYTHONPATH": str(ROOT),
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
    }
    path = tmp_path / "rank.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run(
        [sys.executable, str(path), str(tmp_path)], env=env, capture_output=True, text=True, timeout=120
    )


def test_init_distributed_maps_no_shared_memory_segment(tmp_path: Path) -> None:
    port = free_port()
    proc = _run(
        """
        import deepspeed.comm.comm as ds_comm
        import torch.distributed as tdist
        from envpipe.runtime import distributed

        distributed.init_distributed(on_gpu=False)
        print("backend", tdist.get_backend(), "shm op", ds_comm.cdb.shm_comm_op)
        distributed.exit_process()
        """,
        tmp_path,
        port,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "backend gloo shm op None" in proc.stdout
    assert "shm_comm_op built" not in proc.stdout
    # DeepSpeed names its segment after MASTER_ADDR and MASTER_PORT, one per rank
    assert not list(Path("/dev/shm").glob(f"deepspeed_allreduce_buffer_*_127.0.0.1_{port}_*"))


def test_exit_process_destroys_groups_flushes_and_skips_finalization(tmp_path: Path) -> None:
    proc = _run(
        """
        import atexit
        import logging
        import sys
        from pathlib import Path

        import torch
        import torch.distributed as tdist
        from envpipe.runtime import distributed

        out = Path(sys.argv[1])
        atexit.register(lambda: (out / "atexit-ran").write_text(""))


        class Finalized:
            def __del__(self):
                (out / "finalizer-ran").write_text("")


        marker = Finalized()
        tdist.init_process_group("gloo")
        group = tdist.new_group([0])  # still referenced at exit, like DeepSpeed's pipeline groups
        tdist.all_reduce(torch.ones(2), group=group)
        logging.basicConfig(filename=out / "log.txt")
        logging.getLogger().warning("logged before exit")
        sys.stdout.write("no newline, still buffered")
        distributed.exit_process(3)
        """,
        tmp_path,
        free_port(),
    )
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert proc.stdout == "no newline, still buffered"
    assert "logged before exit" in (tmp_path / "log.txt").read_text()
    assert not (tmp_path / "atexit-ran").exists()
    assert not (tmp_path / "finalizer-ran").exists()
