"""Hostfiles rendered from the jinja2 templates in hostfiles/, and checked before use."""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

import jinja2

from . import textfile
from .errors import LaunchError
from .job import MAX_PROCS_PER_NODE

FORMATS = ("deepspeed", "openmpi", "mvapich")
MAX_BYTES = 1 << 20  # a hostfile of 10,000 nodes is ~300 KB; anything larger is not a hostfile
# Letters, digits, '.', '-', '_': no whitespace (every format), ':' (MVAPICH's), ',' or '[' (pdsh's -w
# host lists and ranges), nothing a shell or the resolver would read otherwise.
_HOST = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._-]{0,252}")
# The lines each format's template produces; parse() accepts exactly these (plus # comments).
_LINE = {
    "deepspeed": re.compile(r"^(\S+)\s+slots=([0-9]+)$"),
    "openmpi": re.compile(r"^(\S+)\s+slots=([0-9]+)$"),
    "mvapich": re.compile(r"^([^\s:]+):([0-9]+)$"),
}


@dataclass(frozen=True)
class Host:
    host: str
    slots: int


def is_host(name: str) -> bool:
    """A host name or IPv4 address, and not "unknown" (CML's placeholder before a worker has an address)."""
    return _HOST.fullmatch(name) is not None and name != "unknown"


def check(hosts: list[Host]) -> list[Host]:
    """Refuse what DeepSpeed/MPI would reject later with a worse message."""
    if not hosts:
        raise LaunchError("hostfile: no hosts")
    seen: set[str] = set()
    for h in hosts:
        if not is_host(h.host):
            raise LaunchError(f"hostfile: invalid host name {h.host!r}")
        if not 1 <= h.slots <= MAX_PROCS_PER_NODE:
            raise LaunchError(f"hostfile: host {h.host} has {h.slots} slots (must be 1-{MAX_PROCS_PER_NODE})")
        if h.host in seen:
            raise LaunchError(f"hostfile: duplicate host {h.host}")
        seen.add(h.host)
    return hosts


@functools.cache  # one Environment keeps its compiled templates: a render is then ~0.1 ms, not ~7
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
    lines = text.rstrip("\n").split("\n") if text.strip() else []
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
        host, slots = m.groups()
        if len(slots.lstrip("0")) > len(str(MAX_PROCS_PER_NODE)):  # before int(), which refuses 5,000 digits
            raise LaunchError(f"hostfile line {n}: host {host} has too many slots (must be 1-{MAX_PROCS_PER_NODE})")
        hosts.append(Host(host, int(slots)))
    return check(hosts)


def read(path: str) -> list[Host]:
    """A DeepSpeed hostfile the user gave (`host slots=N` lines, UTF-8, at most MAX_BYTES)."""
    text = textfile.read_text(path, MAX_BYTES, "hostfile")
    try:
        return parse(text)
    except LaunchError as e:
        raise LaunchError(f"{path}: {e}") from e
