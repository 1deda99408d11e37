"""CPU dry run of the peer benchmark's llama.cpp side (engine.bench_peer.llama_side) on a tiny synthetic
GGUF, with the CPU llama-cpp-python of the dev machine: the same code path the H200 run takes, down to the
child process and its JSON, only without CUDA. Skipped where llama_cpp is not installed; marker `peer`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from loader_fixtures import write_tiny_model

from engine.bench_peer import run
from engine.errors import RigllmError

pytestmark = pytest.mark.peer
pytest.importorskip("llama_cpp")

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("peer") / "tiny.gguf")


def test_llama_side_measures_prefill_and_decode_on_the_cpu(tiny, tmp_path):
    out = tmp_path / "r.json"
    cmd = [sys.executable, "-m", "engine.bench_peer.llama_side", str(tiny), "--cpu", "--threads", "1",
           "--prompts", "64,300", "--depths", "0,100", "--steps", "8", "--reps", "2", "--json", str(out)]
    result = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
                            env={"PATH": "/usr/bin:/bin", "GGML_CUDA_DISABLE_GRAPHS": "1"})
    assert result.returncode == 0, result.stderr[-2000:]
    r = json.loads(out.read_text())
    assert set(r["prefill_tokens_per_s"]) == {"64", "300"} and set(r["decode_tokens_per_s"]) == {"0", "100"}
    assert all(len(runs) == 2 for runs in r["prefill_runs"].values())
    assert all(v > 0 for v in [*r["prefill_tokens_per_s"].values(), *r["decode_tokens_per_s"].values()])
    assert r["n_ctx"] == 512 and r["n_batch"] == 512 and r["flash_attn"] == "auto"  # context fits 300 and 100+8
    assert r["environment"] == {"GGML_CUDA_DISABLE_GRAPHS": "1"} and r["gpu_offload"] is False


def test_a_build_without_gpu_offload_is_refused(tiny, tmp_path):
    args = run.parser().parse_args(["--prompts", "32", "--depths", "16", "--steps", "2", "--reps", "1"])
    with pytest.raises(RigllmError, match="no GPU offload"):
        run.run_llama(tmp_path, tiny, "default", {}, args, tmp_path)
