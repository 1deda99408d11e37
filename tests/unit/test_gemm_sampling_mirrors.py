"""The host mirrors of device structs and tile constants agree with the CUDA sources, as compiled.

engine/cuda/sampling.py writes `SampleParams` and reads `SampleState` as numpy records, and
engine/cuda/gemm.py sizes grids from the GEMM tile; a drift would make the kernels read garbage
parameters or skip rows without any error. The checks compile small sources that include the kernel
file (NVRTC, compute_70; no GPU needed): constants by static_assert, struct layouts by emitting
sizeof/offsetof into a device array whose initializer the PTX spells out (NVRTC does not treat
offsetof as a constant expression, so static_assert cannot check offsets). Skips only when the
`kernels` extra (NVRTC 12.x) is missing.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from engine.cuda import gemm, sampling
from engine.cuda.kernel_build import CUDA_SRC_DIR, NVRTC_OPTIONS, PTX_ARCH, build_toolchain
from engine.errors import RigllmError


@pytest.fixture(scope="module")
def compile_ptx():
    try:
        chain, nvrtc = build_toolchain()
    except RigllmError as err:
        pytest.skip(f"the `kernels` extra is needed to compile: {err}")

    def compile_source(source: str, name: str) -> str:
        result = nvrtc.compile(source, name, f"compute_{PTX_ARCH}", (CUDA_SRC_DIR, *chain.include_dirs), NVRTC_OPTIONS)
        return result.image.decode()

    return compile_source


# Structs whose layout the test compiles, with the numpy mirror that names the fields to check.
MIRRORS = {"SampleParams": sampling.PARAMS_DTYPE, "SampleState": sampling.STATE_DTYPE}


def layout_array(c_name: str) -> str:
    """A device array [sizeof, offsetof(field)...] in the mirror's field order."""
    values = [f"sizeof({c_name})", *(f"offsetof({c_name}, {field})" for field in MIRRORS[c_name].names)]
    return f'extern "C" __device__ const unsigned long long layout_{c_name}[] = {{{", ".join(values)}}};'


def read_layout(ptx: str, c_name: str) -> dict[str, int]:
    """{"sizeof": ..., field: offset} from the PTX initializer of `layout_<c_name>` (trailing zero bytes omitted)."""
    match = re.search(rf"layout_{c_name}\[(\d+)\] = \{{([^}}]*)\}}", ptx)
    assert match, f"layout_{c_name} not found in the PTX"
    raw = bytes(int(b) for b in match.group(2).split(","))
    raw += bytes(int(match.group(1)) - len(raw))
    names = ["sizeof", *MIRRORS[c_name].names]
    return dict(zip(names, (int(v) for v in np.frombuffer(raw, dtype="<u8"))))


def layout_mismatches(ptx: str, c_name: str, dtype: np.dtype) -> list[str]:
    """Differences between the compiled layout and `dtype`, field by field."""
    compiled = read_layout(ptx, c_name)
    expected = {"sizeof": dtype.itemsize, **{f: dtype.fields[f][1] for f in dtype.names}}
    return [f"{c_name}.{n}: C {compiled.get(n)}, numpy {e}" for n, e in expected.items() if compiled.get(n) != e]


@pytest.fixture(scope="module")
def sampling_ptx(compile_ptx) -> str:
    source = "\n".join(
        [
            '#include "sampling.cu"',
            "#include <cuda/std/cstddef>",
            *(layout_array(name) for name in MIRRORS),
            f'static_assert(sizeof(ArgmaxPartial) == {sampling.PARTIAL_BYTES}, "ArgmaxPartial");',
            f'static_assert(sizeof(DrawPartial) == {sampling.PARTIAL_BYTES}, "DrawPartial");',
            f'static_assert(SAMPLE_BINS == {sampling.HIST_BINS}, "histogram bins");',
            f'static_assert(SAMPLE_THREADS == {sampling.SAMPLE_THREADS}, "block size");',
        ]
    )
    return compile_ptx(source, "sampling_layout.cu")


@pytest.mark.parametrize("c_name", sorted(MIRRORS))
def test_sampling_structs_match_their_numpy_mirrors(sampling_ptx, c_name):
    assert layout_mismatches(sampling_ptx, c_name, MIRRORS[c_name]) == []


def test_a_drifted_mirror_is_caught(sampling_ptx):
    """The comparison itself can fail: a mirror with two fields swapped is reported."""
    names = list(sampling.PARAMS_DTYPE.names)
    names[0], names[1] = names[1], names[0]
    swapped = np.dtype([(n, sampling.PARAMS_DTYPE.fields[n][0]) for n in names])
    assert layout_mismatches(sampling_ptx, "SampleParams", swapped) == [
        "SampleParams.top_p: C 8, numpy 0",
        "SampleParams.temperature: C 0, numpy 8",
    ]


def test_gemm_tile_matches_the_launcher(compile_ptx):
    checks = [
        '#include "gemm_q8.cu"',
        f'static_assert(GEMM_BR == {gemm.GEMM_TILE_ROWS}, "rows per tile");',
        f'static_assert(GEMM_BT == {gemm.GEMM_TILE_TOKENS}, "tokens per tile");',
        f'static_assert(GEMM_THREADS == {gemm.GEMM_THREADS}, "block size");',
    ]
    compile_ptx("\n".join(checks), "gemm_layout.cu")


def test_grid_covers_every_row_and_token():
    assert gemm.gemm_grid(rows=12288, n_tokens=256) == (4, 192)
    assert gemm.gemm_grid(rows=4128, n_tokens=300) == (5, 65)
    assert gemm.gemm_grid(rows=1, n_tokens=1) == (1, 1)


def test_every_gemm_staging_and_token_tile_is_a_kernel_of_the_sources_and_others_are_refused():
    """Each weight type's GEMM in every staging, and in the default staging's narrower token tiles, which every
    chunk length's tile (`gemm_token_tile`) names."""
    q8 = re.findall(r"^RIGLLM_GEMM_Q8\((\w+),", (CUDA_SRC_DIR / "gemm_q8.cu").read_text(), re.MULTILINE)
    kq = re.findall(r"^RIGLLM_GEMM_KQ\((\w+),", (CUDA_SRC_DIR / "gemm_kq.cu").read_text(), re.MULTILINE)
    bases = ["gemm_q8_0_q8_1", *(f"gemm_{t}_q8_1" for t in ("q4_k", "q5_k", "q6_k"))]
    narrow = [suffix for suffix in gemm.GEMM_TOKEN_TILES.values() if suffix]
    assert sorted(q8 + kq) == sorted([gemm.gemm_kernel(b, s) for b in bases for s in gemm.GEMM_STAGINGS]
                                     + [gemm.gemm_kernel(b, gemm.DEFAULT_GEMM_STAGING) + t for b in bases for t in narrow])
    assert {gemm.gemm_token_tile(n) for n in range(1, 2049)} == set(gemm.GEMM_TOKEN_TILES)
    assert gemm.DEFAULT_GEMM_STAGING in gemm.GEMM_STAGINGS
    with pytest.raises(ValueError, match="no GEMM staging"):
        gemm.gemm_q8(None, None, None, None, 1, staging="_fast")
