"""click parameter types that check one option's value where it is parsed.

A bad value becomes click's one-line usage error naming the option ("Invalid value for '--x': ..."),
before any backend starts, so no check is left to a place where something already exists or runs.
"""

from __future__ import annotations

import math
import os
import re
import stat
from collections.abc import Callable
from typing import Any

import click

from . import hostfile, kube_syntax
from .job import JOB_NAME_MAX, JOB_NAME_RULE

MAX_SECONDS = 86_400.0  # one day: any wait longer than that is a typo
_ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")  # what a shell exports (DeepSpeed's env file goes through one)


class Seconds(click.ParamType):
    """A finite number of seconds in (0, MAX_SECONDS], or [0, MAX_SECONDS] with `zero_ok`."""

    name = "seconds"

    def __init__(self, zero_ok: bool = False) -> None:
        self.zero_ok = zero_ok

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        try:
            seconds = float(value)
        except (TypeError, ValueError):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        low_ok = seconds >= 0 if self.zero_ok else seconds > 0
        if not (math.isfinite(seconds) and low_ok and seconds <= MAX_SECONDS):
            low = "[0" if self.zero_ok else "(0"
            self.fail(f"{value!r} is not a number of seconds in {low}, {MAX_SECONDS:g}]", param, ctx)
        return seconds


class EnvPair(click.ParamType):
    """KEY=VALUE with KEY a shell variable name; VALUE on one line (DeepSpeed's env file is line-based)."""

    name = "KEY=VALUE"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        key, sep, val = str(value).partition("=")
        if not sep or not _ENV_KEY.fullmatch(key):
            self.fail(f"expected KEY=VALUE, KEY a variable name ([A-Za-z_][A-Za-z0-9_]*), got {value!r}", param, ctx)
        if any(c in val for c in "\n\r\0") or not _utf8(val):
            self.fail(f"the value of {key} must be one line of UTF-8 text, got {val!r}", param, ctx)
        return str(value)


def _utf8(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # bytes of argv that were not UTF-8 (Python keeps them as surrogates)
        return False
    return True


class RegularFile(click.ParamType):
    """An existing regular file (not /dev/zero, a FIFO or a directory, which would hang or fail later)."""

    name = "file"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        path = str(value)
        try:
            mode = os.stat(path).st_mode
        except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
            self.fail(f"{path!r}: {getattr(e, 'strerror', None) or e}", param, ctx)
        if not stat.S_ISREG(mode):
            self.fail(f"{path!r} is not a regular file", param, ctx)
        return path


class Checked(click.ParamType):
    """A string that `ok` accepts; `rule` says what is expected."""

    def __init__(self, name: str, ok: Callable[[str], bool], rule: str) -> None:
        self.name, self.ok, self.rule = name, ok, rule

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> str:
        if not self.ok(str(value)):
            self.fail(f"{value!r}: {self.rule}", param, ctx)
        return str(value)


HOST = Checked("host", hostfile.is_host, "a host name or IPv4 address (letters, digits, '.', '-', '_')")
NAMESPACE = Checked(
    "namespace",
    kube_syntax.is_dns1123_label,
    "a namespace is 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit "
    "(a DNS label, RFC 1123)",
)
JOB_NAME = Checked("name", lambda s: kube_syntax.is_dns1035_label(s, JOB_NAME_MAX), JOB_NAME_RULE)
IMAGE = Checked(
    "image",
    kube_syntax.is_image_reference,
    "not an image reference ([registry[:port]/]repository[:tag][@digest], repository in lowercase)",
)
QUEUE = Checked(
    "queue",
    lambda s: kube_syntax.is_dns1123_subdomain(s, kube_syntax.LABEL_MAX),
    "a Kueue LocalQueue name is 1-63 lowercase letters, digits, '-' and '.', starting and ending with a "
    "letter or digit (an object name that is also the value of the kueue.x-k8s.io/queue-name label)",
)
