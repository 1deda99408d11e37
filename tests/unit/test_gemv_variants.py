"""The T=1 and T=2 GEMV variants of cuda_src/gemv_q8.cu agree with the host's table and build without spills.

The host sizes grids from `GEMV_VARIANTS` (rows per warp, threads per block); a stale entry would
still compute right (the kernel strides over row groups) but launch a wrong-sized grid and time badly,
so the table is checked against the source. The variants are not in kernel_limits.HOT_KERNELS (only the
ones DEFAULT_GEMV names run), so their no-spill rule is checked here, on the sm_70 report.
"""

from __future__ import annotations

import importlib.util
import re

import pytest

from engine.cuda.gemv import DEFAULT_GEMV, GEMV_ROWS_PER_WARP, GEMV_VARIANTS, GemvLaunch
from engine.cuda.kernel_build import CUDA_SRC_DIR, build_toolchain, compile_module

SOURCE = CUDA_SRC_DIR / "gemv_q8.cu"


def declared_variants() -> dict[int, dict[str, GemvLaunch]]:
    """T -> kernel name -> launch shape of every RIGLLM_GEMV_Q8_VARIANT(T, suffix, R, U, THREADS, MIN_BLOCKS)
    and RIGLLM_GEMV_Q8_PIPELINED(...) line (named with a _p suffix), plus each T's plain gemv_q8_t<T>."""
    text = SOURCE.read_text()
    found: dict[int, dict[str, GemvLaunch]] = {}
    for form, t, suffix, r, threads in re.findall(
            r"^RIGLLM_GEMV_Q8_(VARIANT|PIPELINED)\((\d+), (\w+), (\d+), \d+, (\d+), \d+\)", text, re.M):
        name = f"gemv_q8_t{t}_{suffix}" + ("_p" if form == "PIPELINED" else "")
        found.setdefault(int(t), {})[name] = GemvLaunch(int(r), int(threads))
    for t in found:
        [r] = re.findall(rf"^RIGLLM_GEMV_Q8\({t}, (\d+), \d+, \d+\)", text, re.M)
        found[t][f"gemv_q8_t{t}"] = GemvLaunch(int(r), 128)
    return found


def test_variant_table_matches_the_kernel_source():
    assert declared_variants() == GEMV_VARIANTS
    for t, variants in GEMV_VARIANTS.items():
        assert variants[f"gemv_q8_t{t}"].rows_per_warp == GEMV_ROWS_PER_WARP[t]
        assert DEFAULT_GEMV[t] in variants
        assert all(g.threads % 32 == 0 and g.rows_per_warp <= 32 for g in variants.values())


def _has_nvrtc() -> bool:
    try:
        return importlib.util.find_spec("nvidia.cuda_nvrtc") is not None
    except ModuleNotFoundError:  # no `nvidia` namespace package at all
        return False


@pytest.mark.skipif(not _has_nvrtc(), reason="the `kernels` extra is not installed: pip install 'rigllm[kernels]'")
def test_every_variant_builds_for_sm70_without_spills():
    chain, nvrtc = build_toolchain()
    resources = compile_module(SOURCE, chain, nvrtc, sass_archs=(70,)).resources
    names = {name for variants in GEMV_VARIANTS.values() for name in variants}
    missing = sorted(names - resources.keys())
    assert not missing, f"variants missing from the build: {missing}"
    spilling = {v: resources[v] for v in sorted(names) if resources[v].spills}
    assert not spilling, f"GEMV variants that spill on sm_70: {spilling}"
