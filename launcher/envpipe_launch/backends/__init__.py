"""Where the nodes come from: one module per backend (local, ssh, kube, cml), each a `Backend`.

A backend reads the options only it uses from the parsed command line (`options`: a frozen dataclass, None for
local; checked, one line for a mistake) and runs the job with them (`launch`, the job's exit code).
`envpipe_launch.cli` parses and dispatches through `backend(name)`; a backend module is imported only when it is
the one asked for (kube's client is heavy).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from ..command_line import CommandLine
from ..job import BACKENDS, JobSpec

Opts = TypeVar("Opts")


class Backend(Protocol[Opts]):
    def options(self, args: CommandLine) -> Opts:
        """The backend's own options from the command line, checked."""
        ...

    def launch(self, spec: JobSpec, opts: Opts) -> int:
        """Run the job; its exit code."""
        ...


def backend(name: str) -> Backend[Any]:
    """The backend called ``name`` (one of job.BACKENDS), its module imported now."""
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}")
    return cast("Backend[Any]", importlib.import_module(f"{__name__}.{name}"))


if TYPE_CHECKING:  # mypy checks that every backend module is a Backend
    from . import cml, kube, local, ssh

    _CHECKED: tuple[Backend[None], Backend[ssh.SshOptions], Backend[kube.KubeOptions], Backend[cml.CmlOptions]] = (
        local, ssh, kube, cml)
