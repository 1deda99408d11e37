"""`rigllm info` as a user runs it: broken files give exit code 2 and one clear stderr line, no traceback."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType

from tests.unit.loader_fixtures import rewrite_gguf, write_tiny_model


def rigllm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "engine.cli", *args], capture_output=True, text=True, timeout=120)


@pytest.fixture(scope="module")
def valid(tmp_path_factory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("cli") / "tiny.gguf")


def broken_files(valid: Path, folder: Path) -> dict[str, Path]:
    truncated = folder / "truncated.gguf"
    truncated.write_bytes(valid.read_bytes()[:5000])
    not_gguf = folder / "notes.gguf"
    not_gguf.write_text("just some text\n")
    q4_0 = (np.zeros((64, 144), dtype=np.uint8), GGMLQuantizationType.Q4_0)  # 8 Q4_0 blocks of 18 bytes per row
    return {
        "bad magic": not_gguf,
        "truncated": truncated,
        "MoE models are not supported": rewrite_gguf(
            valid, folder / "moe.gguf", set_fields={"general.architecture": "qwen35moe"}
        ),
        "use a Q8_0, Q6_K, Q5_K_M or Q4_K_M GGUF": rewrite_gguf(valid, folder / "q4_0.gguf",
                                                               set_tensors={"blk.2.ffn_down.weight": q4_0}),
    }


def test_broken_files_exit_2_with_one_line(valid, tmp_path):
    for fragment, path in broken_files(valid, tmp_path).items():
        result = rigllm("info", str(path))
        assert result.returncode == 2, result.stderr
        assert result.stdout == ""
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        assert lines[0].startswith(f"rigllm: error: {path.name}: ") and fragment in lines[0]


def test_json_report(valid):
    result = rigllm("info", str(valid), "--json", "--context", "2048", "--kv", "f16")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["architecture"] == "qwen35" and info["layers"]["pattern"] == "GGGA"
    assert info["plan_settings"]["context"] == 2048 and len(info["plans"]) == 4


def test_bad_option_value(valid):
    result = rigllm("info", str(valid), "--kv", "k2v2")
    assert result.returncode == 2 and result.stderr.splitlines() == [
        "rigllm: error: unknown KV format 'k2v2' (choose one of f16, k8v8, k8v4, k8v3, k4v4, k3v3, "
        "or k<bits>v<bits> with bits 16, 8, 4, 3)"
    ]


def test_separate_k_and_v_bits(valid):
    result = rigllm("info", str(valid), "--json", "--kv", "k8v8", "--v-bits", "3")
    assert result.returncode == 0, result.stderr
    settings = json.loads(result.stdout)["plan_settings"]
    assert (settings["kv_format"], settings["kv_k"], settings["kv_v"]) == ("k8v3", "int8", "wht3")
    text = rigllm("info", str(valid), "--k-bits", "3", "--v-bits", "3")
    assert text.returncode == 0 and "k3v3 KV (K wht3, V wht3)" in text.stdout
