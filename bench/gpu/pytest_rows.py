"""A pytest plugin (``-p bench.gpu.pytest_rows``): one JSON line per test outcome, appended to the file
named by ``GPU_CHECK_TEST_ROWS`` as each test ends, so that a run killed at its deadline still says
what finished. Under pytest-xdist the controller writes (it receives every worker's reports)."""
from __future__ import annotations

import json
import os

import pytest

ROWS_ENV = "GPU_CHECK_TEST_ROWS"
REASON_CHARS = 300
# A failure's traceback tail: where it was raised, and the frames just above, so that a failure seen
# only on the device can be followed up on a CPU (one line each said too little: 40 failures of the
# compiled formats on an H200 named an AttributeError and no frame).
TRACE_LINES, TRACE_CHARS = 24, 2400


def outcome(report: pytest.TestReport) -> str | None:
    """The test's outcome as this report decides it, or None when it decides nothing (a passed setup
    or teardown)."""
    if report.when == "call":
        return report.outcome
    if report.skipped:
        return "skipped"
    return "error" if report.failed else None


def reason(report: pytest.TestReport) -> str:
    """Why it did not pass, in one line: the skip reason, else the first ``E`` line of the traceback."""
    if report.passed:
        return ""
    if report.skipped and isinstance(report.longrepr, tuple):
        return str(report.longrepr[2])[:REASON_CHARS]
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    errors = [line[1:].strip() for line in lines if line.startswith("E ")]
    return (errors or lines[-1:] or [""])[0][:REASON_CHARS]


def trace(report: pytest.TestReport) -> str:
    """The last ``TRACE_LINES`` non-blank lines of a failure's traceback (at most ``TRACE_CHARS``)."""
    if report.passed or report.skipped:
        return ""
    lines = [line for line in report.longreprtext.splitlines() if line.strip()]
    return "\n".join(lines[-TRACE_LINES:])[-TRACE_CHARS:]


class RowWriter:
    """Appends a row per decided outcome to ``path``."""

    def __init__(self, path: str) -> None:
        self.path = path

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        decided = outcome(report)
        if decided is None:
            return
        with open(self.path, "a") as rows:
            row = {"id": report.nodeid, "outcome": decided, "reason": reason(report)}
            rows.write(json.dumps({**row, "trace": trace(report)} if decided in ("failed", "error") else row) + "\n")


def pytest_configure(config: pytest.Config) -> None:
    # An xdist worker's config carries ``workerinput`` (xdist's documented test); the worker's own
    # environment variable is no guide: a pytest started from inside a worker inherits it.
    path = os.environ.get(ROWS_ENV)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(RowWriter(path), "gpu_check_rows")
