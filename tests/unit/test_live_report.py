"""The GPU calls' live report (tests/gpu/live_report.py) writes each outcome as it happens, once per test."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_outcomes_and_failure_text_are_written_once_per_test(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok():\n    pass\n"
        "def test_bad():\n    assert 1 == 2, 'planted'\n"
        "@pytest.mark.skip(reason='not here')\ndef test_skipped():\n    pass\n")
    report = tmp_path / "live.txt"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "tests.gpu.live_report", "-o", "addopts=",
                    "-p", "no:cacheprovider", str(tmp_path / "test_sample.py")],
                   cwd=ROOT, env={"LIVE_REPORT": str(report), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
                   capture_output=True, text=True, timeout=120)
    lines = [line for line in report.read_text().splitlines() if line[:2].isdigit()]
    outcomes = sorted((line.split()[1], line.split()[-1].split("::")[-1]) for line in lines)
    assert outcomes == [("failed", "test_bad"), ("passed", "test_ok"), ("skipped", "test_skipped")]
    assert "planted" in report.read_text()
