"""The stored GPU mutations (tests/gpu/mutations/*.patch) still apply to this tree.

They are applied only on the GPU machine, by run_mutations.sh, which stops at the first that does not
apply; on 2026-12-02 one had gone stale after the K-quant change to engine/cuda/weights.py and the rest of
the mutation run was lost. `git apply --check` here catches that where every change is tested.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PATCHES = sorted((ROOT / "tests" / "gpu" / "mutations").glob("*.patch"))


def test_the_mutation_script_names_every_stored_patch():
    script = (ROOT / "tests" / "gpu" / "mutations" / "run_mutations.sh").read_text()
    assert PATCHES and all(p.stem in script for p in PATCHES)


@pytest.mark.parametrize("patch", PATCHES, ids=[p.stem for p in PATCHES])
def test_a_stored_mutation_applies_to_this_tree(patch):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    result = subprocess.run(["git", "apply", "--check", str(patch)], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, f"{patch.name} no longer applies; regenerate it against these files:\n{result.stderr}"
