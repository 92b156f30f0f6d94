"""Shared fixtures: the real measured profiles shipped with the package. DeepSpeed's CPU op of every test and
of every process a test starts is built in the venv's own folder (the Makefile's EXT_DIR), never in the
~/.cache folder other checkouts rebuild and lock.

Signals: a run started in the background of a non-interactive shell (`cmd &`, `nohup`) inherits SIGINT and
SIGQUIT (and with nohup SIGHUP) ignored, and an ignored signal stays ignored across exec: every process a test
starts would then ignore the Ctrl-C the launcher's and the supervisor's tests send it, and those tests fail
for how the suite was started (18 of them did on 2026-11-29, `.ci/run` under nohup). The suite takes them
back to their defaults, as a terminal gives them; an exec'd child then starts with the default too."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from envpipe.profile import Profile, embedded_profile_path, load_profile

if sys.prefix != sys.base_prefix:  # in a venv (else where the op goes is the user's to say)
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", os.path.join(sys.prefix, "torch_extensions"))

for _signal, _default in ((signal.SIGINT, signal.default_int_handler), (signal.SIGQUIT, signal.SIG_DFL),
                          (signal.SIGHUP, signal.SIG_DFL)):
    if signal.getsignal(_signal) == signal.SIG_IGN:
        signal.signal(_signal, _default)


@pytest.fixture(scope="session")
def gpt3() -> Profile:
    return load_profile(embedded_profile_path("gpt3-175b+a100_sxm_bf16"))


@pytest.fixture(scope="session")
def bloom() -> Profile:
    return load_profile(embedded_profile_path("bloom+a40_bf16"))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport() -> Iterator[None]:
    """Captured output with the hostile words' undecodable bytes (lone surrogates) escaped, so that a report can
    travel between processes (`make test`'s pytest-xdist workers send theirs as UTF-8: a worker died on
    tests/launch/test_words.py's DeepSpeed log line otherwise)."""
    outcome: Any = yield
    report = outcome.get_result()
    report.sections = [(title, text.encode("utf-8", "backslashreplace").decode("utf-8"))
                       for title, text in report.sections]
