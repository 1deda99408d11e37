"""The K-quant kernels of cuda_src agree with the host's tables and build for sm_70 without spills.

The host launches `gemv_<type>_t<T>[suffix]` with the rows per warp of `KQ_T1_VARIANTS` (T = 1) or the
plain kernel's (T = 2..8): a stale entry would still compute right (warps stride over row groups) but size
the grid wrong, so the table is checked against RIGLLM_GEMV_KQ_TYPE in gemv_kq.cu. Every K-quant kernel the
forward pass runs is in kernel_limits.HOT_KERNELS (no spills there); the T = 1 variants are checked here.
"""

from __future__ import annotations

import re

import pytest

from engine.cuda.gemv import GemvLaunch, MAX_GEMV_TOKENS
from engine.cuda.kernel_build import CUDA_SRC_DIR, build_toolchain, compile_module
from engine.cuda.kernel_limits import HOT_KERNELS
from engine.cuda.kq_weight import DEFAULT_KQ_T1, KERNEL_TYPE_NAMES, KQ_T1_VARIANTS, WIDE_ROWS, gemv_kernel
from tests.unit.test_gemv_variants import _has_nvrtc

SOURCE = CUDA_SRC_DIR / "gemv_kq.cu"


def declared_shapes() -> dict[str, GemvLaunch]:
    """kernel suffix after gemv_<type>_ -> (R, THREADS) of each RIGLLM_GEMV_KQ_KERNEL line of the type macro."""
    text = SOURCE.read_text()
    lines = re.findall(r"RIGLLM_GEMV_KQ_KERNEL\(gemv_##TNAME##_(\w+), TYPE, (\d+), (\d+), \d+, [12], (\d+), \w+\)",
                       text)
    return {suffix: GemvLaunch(int(r), int(threads)) for suffix, _t, r, threads in lines}


def test_host_launch_shapes_match_the_kernel_source():
    declared = declared_shapes()
    for qtype, tname in KERNEL_TYPE_NAMES.items():
        assert f"RIGLLM_GEMV_KQ_TYPE({tname}," in SOURCE.read_text()
        for suffix, launch in KQ_T1_VARIANTS.items():
            assert gemv_kernel(qtype, 1, suffix) == (f"gemv_{tname}_t1{suffix}", declared[f"t1{suffix}"])
        for t in range(2, MAX_GEMV_TOKENS + 1):
            assert gemv_kernel(qtype, t) == (f"gemv_{tname}_t{t}", declared[f"t{t}"])
        choice = DEFAULT_KQ_T1[qtype]
        assert {choice.narrow, choice.wide} <= KQ_T1_VARIANTS.keys()
        assert gemv_kernel(qtype, 1, rows=WIDE_ROWS - 1)[0] == f"gemv_{tname}_t1{choice.narrow}"
        assert gemv_kernel(qtype, 1, rows=WIDE_ROWS)[0] == f"gemv_{tname}_t1{choice.wide}"


def test_the_kernels_the_forward_pass_runs_are_hot():
    for qtype, tname in KERNEL_TYPE_NAMES.items():
        for t in range(1, MAX_GEMV_TOKENS + 1):
            assert f"gemv_{tname}_t{t}" in HOT_KERNELS
        for suffix in (DEFAULT_KQ_T1[qtype].narrow, DEFAULT_KQ_T1[qtype].wide):
            assert f"gemv_{tname}_t1{suffix}" in HOT_KERNELS
        assert f"gemm_{tname}_q8_1" in HOT_KERNELS and f"embed_{tname}" in HOT_KERNELS


@pytest.mark.skipif(not _has_nvrtc(), reason="the `kernels` extra is not installed: pip install 'rigllm[kernels]'")
def test_every_kquant_kernel_builds_for_sm70_without_spills():
    chain, nvrtc = build_toolchain()
    resources = {}
    for module in ("gemv_kq", "gemm_kq", "embedding_kq"):
        resources.update(compile_module(CUDA_SRC_DIR / f"{module}.cu", chain, nvrtc, sass_archs=(70,)).resources)
    names = {f"gemv_{n}_t1{s}" for n in KERNEL_TYPE_NAMES.values() for s in KQ_T1_VARIANTS}
    names |= {f"gemv_{n}_t{t}" for n in KERNEL_TYPE_NAMES.values() for t in range(2, MAX_GEMV_TOKENS + 1)}
    names |= {f"{k}_{n}{s}" for n in KERNEL_TYPE_NAMES.values() for k, s in (("gemm", "_q8_1"), ("embed", ""))}
    missing = sorted(names - resources.keys())
    assert not missing, f"kernels missing from the build: {missing}"
    spilling = {v: resources[v] for v in sorted(names) if resources[v].spills}
    assert not spilling, f"K-quant kernels that spill on sm_70: {spilling}"
