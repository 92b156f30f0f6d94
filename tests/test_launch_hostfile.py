"""Hostfile templates (hostfiles/*.j2, loaded from the installed package) and their checks."""

from __future__ import annotations

import pytest
from envpipe_launch import hostfile
from envpipe_launch.errors import LaunchError
from envpipe_launch.hostfile import Host

HOSTS = [Host("10.0.0.1", 4), Host("10.0.0.2", 4)]


def test_formats() -> None:
    assert hostfile.render(HOSTS) == "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"
    assert hostfile.render(HOSTS, "openmpi") == "10.0.0.1 slots=4\n10.0.0.2 slots=4\n"
    assert hostfile.render(HOSTS, "mvapich") == "10.0.0.1:4\n10.0.0.2:4\n"


@pytest.mark.parametrize("fmt", hostfile.FORMATS)
def test_round_trip(fmt: str) -> None:
    assert hostfile.parse(hostfile.render(HOSTS, fmt), fmt) == HOSTS


@pytest.mark.parametrize(
    ("hosts", "message"),
    [
        ([Host("a", 1), Host("a", 2)], "duplicate host a"),
        ([Host("a", 0)], "0 slots"),
        ([], "no hosts"),
        ([Host("unknown", 1)], "invalid host name"),
        ([Host("a b", 1)], "invalid host name"),
        ([Host("a,b", 1)], "invalid host name"),
    ],
)
def test_bad_hosts(hosts: list[Host], message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        hostfile.render(hosts)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("a slots=1\n\nb slots=1\n", "line 2: blank line"),
        ("a slots=1\na slots=2\n", "duplicate host a"),
        ("a slots=0\n", "0 slots"),
        ("a:4\n", "expected host slots=N"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        hostfile.parse(text)


def test_comments_allowed_and_unknown_format() -> None:
    assert hostfile.parse("# cluster\na slots=2\n") == [Host("a", 2)]
    with pytest.raises(LaunchError, match="unknown hostfile format"):
        hostfile.render(HOSTS, "slurm")
