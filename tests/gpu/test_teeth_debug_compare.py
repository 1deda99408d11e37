"""`rigllm debug compare --backend cuda` on the card (issue 25): the trained fixture's blocks, layer-local, stay
under the default threshold in f16 and a quantised format, the report names every place, and no attention layer's
stored K/V values differ from the reference's encoding in more than the bound's share."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.teeth import FIXTURE_Q8


@pytest.mark.parametrize("kv", ["f16", "k8v3"])
def test_debug_compare_on_the_card_finds_no_divergence_in_the_fixture(kv):
    result = subprocess.run(
        [sys.executable, "-m", "engine.cli", "debug", "compare", str(FIXTURE_Q8), "--backend", "cuda", "--kv", kv,
         "--layer-local", "--steps", "24", "--json"], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    print(json.dumps(report, indent=1))
    assert len(report["places"]) == 3 * 4
    assert report["first_over"] is None, f"{kv}: diverges at {report['first_over']}"
    assert report["stored_kv"]["differing"] and report["stored_kv"]["over"] == [], report["stored_kv"]
