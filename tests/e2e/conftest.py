"""Real containers (podman): collected only by `make e2e`, which sets ENVPIPE_E2E=1; `make test` and a
plain `pytest` leave this folder alone. Prints the measured durations of the run at its end."""

from __future__ import annotations

import os

import pytest

from tests.e2e.podman import Stopwatch

collect_ignore_glob = [] if os.environ.get("ENVPIPE_E2E") == "1" else ["*.py"]

STOPWATCH = Stopwatch()


@pytest.fixture(scope="session")
def stopwatch() -> Stopwatch:
    return STOPWATCH


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STOPWATCH.laps:
        terminalreporter.section("e2e durations (measured, this machine)")
        for line in STOPWATCH.lines():
            terminalreporter.write_line(line)
