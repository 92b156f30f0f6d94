"""Hostfiles rendered from the jinja2 templates in hostfiles/, and checked before use."""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import jinja2

from .errors import LaunchError

FORMATS = ("deepspeed", "openmpi", "mvapich")
_HOST = re.compile(r"[^\s:,#]+")
# The lines each format's template produces; parse() accepts exactly these (plus # comments).
_LINE = {
    "deepspeed": re.compile(r"^(\S+)\s+slots=(\d+)$"),
    "openmpi": re.compile(r"^(\S+)\s+slots=(\d+)$"),
    "mvapich": re.compile(r"^([^\s:]+):(\d+)$"),
}


@dataclass(frozen=True)
class Host:
    host: str
    slots: int


def check(hosts: list[Host]) -> list[Host]:
    """Refuse what DeepSpeed/MPI would reject later with a worse message."""
    if not hosts:
        raise LaunchError("hostfile: no hosts")
    seen: set[str] = set()
    for h in hosts:
        # whitespace breaks every format, ":" the MVAPICH one, "," pdsh's -w list; "unknown" is CML's
        # placeholder before a worker has an address
        if not _HOST.fullmatch(h.host) or h.host == "unknown":
            raise LaunchError(f"hostfile: invalid host name {h.host!r}")
        if h.slots <= 0:
            raise LaunchError(f"hostfile: host {h.host} has {h.slots} slots (must be >= 1)")
        if h.host in seen:
            raise LaunchError(f"hostfile: duplicate host {h.host}")
        seen.add(h.host)
    return hosts


def _env() -> jinja2.Environment:
    root = resources.files("envpipe_launch") / "hostfiles"
    loader = jinja2.FunctionLoader(lambda name: (root / name).read_text())
    return jinja2.Environment(loader=loader, undefined=jinja2.StrictUndefined, trim_blocks=True)


def render(hosts: list[Host], fmt: str = "deepspeed") -> str:
    if fmt not in FORMATS:
        raise LaunchError(f"unknown hostfile format {fmt!r} (choose from {', '.join(FORMATS)})")
    return _env().get_template(f"{fmt}.j2").render(hosts=check(hosts))


def parse(text: str, fmt: str = "deepspeed") -> list[Host]:
    """Read a hostfile a user gave us. Blank lines inside are refused: DeepSpeed's .deepspeed_env
    and some MPI parsers choke on them, and they usually mean a template or copy-paste slip."""
    pattern = _LINE.get(fmt)
    if pattern is None:
        raise LaunchError(f"unknown hostfile format {fmt!r}")
    lines = text.rstrip("\n").split("\n")
    hosts = []
    for n, raw in enumerate(lines, 1):
        line = raw.strip()
        if line.startswith("#"):
            continue
        if not line:
            raise LaunchError(f"hostfile line {n}: blank line")
        m = pattern.match(line)
        if not m:
            raise LaunchError(
                f"hostfile line {n}: expected {'host:N' if fmt == 'mvapich' else 'host slots=N'}, "
                f"got {line!r}"
            )
        hosts.append(Host(m.group(1), int(m.group(2))))
    return check(hosts)
