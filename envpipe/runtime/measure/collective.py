"""Collective helpers over every rank of the job: where a rank sits, gather, and rank 0's word for all.

Rank 0 decides (plans, re-plans, refuses); `agree` broadcasts its decision, and an exception raised
on rank 0 is raised on every rank, so no rank waits for a decision that never comes.
"""

from __future__ import annotations

import os
import pickle
import socket
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import torch
import torch.distributed as tdist

T = TypeVar("T")


@dataclass(frozen=True)
class Place:
    """Where a rank sits: its stage, its replica (DeepSpeed's data-parallel id) and its node."""

    rank: int
    stage: int
    replica: int
    host: str
    node_first_rank: int  # the lowest global rank on the node: tells nodes apart that share a hostname


def place(engine: Any) -> Place:
    rank = tdist.get_rank()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    return Place(rank, engine.stage_id, engine.grid.get_data_parallel_id(), socket.gethostname(), rank - local)


def rank() -> int:
    return tdist.get_rank()


def world_size() -> int:
    return tdist.get_world_size()


def gather(obj: Any) -> list[Any]:
    """Every rank's `obj`, in rank order (a collective call)."""
    everyone: list[Any] = [None] * tdist.get_world_size()
    tdist.all_gather_object(everyone, obj)
    return everyone


def agree(obj: Any) -> Any:
    """Rank 0's `obj` on every rank (a collective call). An exception from rank 0 is raised everywhere."""
    box = [obj if tdist.get_rank() == 0 else None]
    tdist.broadcast_object_list(box, src=0)
    if isinstance(box[0], BaseException):
        raise box[0]
    return box[0]


def decided(choose: Callable[[], T]) -> T:
    """Rank 0's ``choose()`` on every rank (a collective call); an error on rank 0 is raised on every rank,
    so none waits for a decision that never comes."""
    choice: Any = None
    if tdist.get_rank() == 0:
        try:
            choice = choose()
        except Exception as exc:
            choice = portable(exc)
    return agree(choice)  # type: ignore[no-any-return]


def portable(exc: BaseException) -> BaseException:
    """`exc` if it survives pickling (to be broadcast with `agree`), else a ValueError with its message."""
    try:
        pickle.loads(pickle.dumps(exc))
    except Exception:
        return ValueError(f"{type(exc).__name__}: {exc}")
    return exc



def job_max(x: float) -> float:
    """The largest of every rank's ``x`` (a collective call)."""
    t = torch.tensor([x], dtype=torch.float64)
    tdist.all_reduce(t, op=tdist.ReduceOp.MAX)
    return float(t)


def progress(message: str) -> None:
    """One line of the job's progress, on rank 0's stdout."""
    if tdist.get_rank() == 0:
        print(f"[envpipe] {message}", flush=True)
