"""pytest plugin for GPU calls with a hard time limit: `-p tests.gpu.live_report`.

Every test's outcome and duration, and each failure's text, is appended to $LIVE_REPORT (default
live-report.txt) the moment pytest learns it, so a device call cut short still says which tests ran, which
failed and why (pytest's own summary and --junitxml are written only at the end: on 2026-12-02 two runs
killed at the call's limit left neither). Under xdist only the controller writes (it receives every worker's
reports), so each test has one line.
"""

from __future__ import annotations

import os
import time

import pytest

_state = {"path": "live-report.txt", "writer": True}


def pytest_configure(config: pytest.Config) -> None:
    _state["path"] = os.environ.get("LIVE_REPORT", "live-report.txt")
    _state["writer"] = not hasattr(config, "workerinput")  # an xdist worker: the controller writes its reports


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _state["writer"] or (report.when != "call" and not (report.failed or report.skipped)):
        return
    with open(_state["path"], "a") as f:
        f.write(f"{time.strftime('%H:%M:%S')} {report.outcome:7s} {report.duration:7.1f}s {report.when} {report.nodeid}\n")
        if report.failed:
            f.write(report.longreprtext[-6000:] + "\n----\n")
