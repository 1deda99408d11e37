"""The T=1 GEMV variants of cuda_src/gemv_q8.cu agree with the host's table and build without spills.

The host sizes grids from `GEMV_T1_VARIANTS` (rows per warp, threads per block); a stale entry would
still compute right (the kernel strides over row groups) but launch a wrong-sized grid and time badly,
so the table is checked against the source. The variants are not in kernel_limits.HOT_KERNELS (only the
one DECODE_GEMV names runs in decode), so their no-spill rule is checked here, on the sm_70 report.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from engine.cuda.gemv import DECODE_GEMV, GEMV_ROWS_PER_WARP, GEMV_T1_VARIANTS, GemvLaunch
from engine.cuda.kernel_build import CUDA_SRC_DIR, build_toolchain, compile_module

SOURCE = CUDA_SRC_DIR / "gemv_q8.cu"


def declared_variants() -> dict[str, GemvLaunch]:
    """Kernel name -> launch shape of every RIGLLM_GEMV_Q8_T1(suffix, R, U, THREADS, MIN_BLOCKS) line, plus gemv_q8_t1."""
    text = SOURCE.read_text()
    found = {
        f"gemv_q8_t1_{suffix}": GemvLaunch(int(r), int(threads))
        for suffix, r, threads in re.findall(r"^RIGLLM_GEMV_Q8_T1\((\w+), (\d+), \d+, (\d+), \d+\)", text, re.M)
    }
    [r1] = re.findall(r"^RIGLLM_GEMV_Q8\(1, (\d+), \d+, \d+\)", text, re.M)
    found["gemv_q8_t1"] = GemvLaunch(int(r1), 128)
    return found


def test_variant_table_matches_the_kernel_source():
    assert declared_variants() == GEMV_T1_VARIANTS
    assert GEMV_T1_VARIANTS["gemv_q8_t1"].rows_per_warp == GEMV_ROWS_PER_WARP[1]
    assert DECODE_GEMV in GEMV_T1_VARIANTS
    assert all(g.threads % 32 == 0 and g.rows_per_warp <= 32 for g in GEMV_T1_VARIANTS.values())


def _has_nvrtc() -> bool:
    try:
        return importlib.util.find_spec("nvidia.cuda_nvrtc") is not None
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return False


@pytest.mark.skipif(not _has_nvrtc(), reason="the `kernels` extra is not installed: pip install 'rigllm[kernels]'")
def test_every_variant_builds_for_sm70_without_spills():
    chain, nvrtc = build_toolchain()
    resources = compile_module(SOURCE, chain, nvrtc, sass_archs=(70,)).resources
    missing = sorted(set(GEMV_T1_VARIANTS) - resources.keys())
    assert not missing, f"variants missing from the build: {missing}"
    spilling = {v: resources[v] for v in GEMV_T1_VARIANTS if resources[v].spills}
    assert not spilling, f"T=1 GEMV variants that spill on sm_70: {spilling}"
