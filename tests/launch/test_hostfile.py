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
        ([Host("node[1-3]", 1)], "invalid host name"),  # pdsh would read a range: three hosts
        ([Host("a", 257)], "257 slots"),
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
        ("a slots=" + "9" * 5000 + "\n", "line 1: host a has too many slots"),
        ("", "no hosts"),
    ],
)
def test_parse_refuses(text: str, message: str) -> None:
    with pytest.raises(LaunchError, match=message):
        hostfile.parse(text)


def test_comments_allowed_and_unknown_format() -> None:
    assert hostfile.parse("# cluster\na slots=2\n") == [Host("a", 2)]
    with pytest.raises(LaunchError, match="unknown hostfile format"):
        hostfile.render(HOSTS, "slurm")


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"\xff\xfe\x00 slots=1\n", r"not UTF-8 text \(byte 0\)"),
        (b"a slots=1\n" * 200_000, "larger than 1048576 bytes"),
        (b"a slots=1\n\nb slots=1\n", "hostfile line 2: blank line"),
    ],
)
def test_read_refuses_with_the_file_named(tmp_path, content: bytes, message: str) -> None:
    path = tmp_path / "hosts"
    path.write_bytes(content)
    with pytest.raises(LaunchError, match=message) as e:
        hostfile.read(str(path))
    assert str(path) in str(e.value)


def test_read_accepts_a_byte_order_mark(tmp_path) -> None:
    path = tmp_path / "hosts"
    path.write_bytes("\ufeffa slots=2\n".encode())
    assert hostfile.read(str(path)) == [Host("a", 2)]


def test_read_of_an_endless_file_stops(tmp_path) -> None:
    """/dev/zero reaches read() only past the CLI's regular-file check; read() still refuses it unread, and
    stops a regular file at its limit (test above)."""
    with pytest.raises(LaunchError, match="not a regular file"):
        hostfile.read("/dev/zero")
