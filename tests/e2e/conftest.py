"""Real containers (podman): collected only by `make e2e`, which sets ENVPIPE_E2E=1; `make test` and a
plain `pytest` leave this folder alone. Prints the measured durations of the run at its end."""

from __future__ import annotations

import os

import pytest

from tests.e2e.podman import Stopwatch

collect_ignore_glob = [] if os.environ.get("ENVPIPE_E2E") == "1" else ["*.py"]

STOPWATCH = Stopwatch()


def pytest_configure(config: pytest.Config) -> None:
    def say(line: str) -> None:  # past pytest's output capture: the stages of a build in a fixture too
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        capture = config.pluginmanager.get_plugin("capturemanager")
        if reporter is None or capture is None:
            print(line, flush=True)
            return
        with capture.global_and_fixture_disabled():
            reporter.ensure_newline()
            reporter.write_line(line)

    STOPWATCH.say = say


@pytest.fixture(scope="session")
def stopwatch() -> Stopwatch:
    return STOPWATCH


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """No progress dots: each test says its result in one line of its own (below)."""
    if report.when == "call":
        return report.outcome, "", ""
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when == "call":
        STOPWATCH.say(f"e2e: test {report.head_line}: {report.outcome} in {report.duration:.1f} s")


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if STOPWATCH.laps:
        terminalreporter.section("e2e durations (measured, this machine)")
        for line in STOPWATCH.lines():
            terminalreporter.write_line(line)
