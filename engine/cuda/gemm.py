"""Host side of the prefill GEMM (`cuda_src/gemm_q8.cu`): grid sizing and argument order.

The GEMM takes the same weights (`Q8Weight`, stacked matrices included) and quantized activations
(`Q8Activations`) as the GEMV and writes the same output layout (segment i of a stacked weight is its
own [T][rows_i] matrix), so a runner can pick GEMV or GEMM per call by token count alone. Any token
count works; the kernel is built for prefill chunks (tens to hundreds of tokens), where each weight
tile is reused by every 64-token tile, while the GEMV reads weights once for up to 8 tokens.
"""

from __future__ import annotations

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemv import Q8Activations, Q8Weight, matmul_args

# Mirrors GEMM_BR / GEMM_BT / GEMM_THREADS in gemm_q8.cu: one CTA computes a 64-row x 64-token tile.
GEMM_TILE_ROWS = 64
GEMM_TILE_TOKENS = 64
GEMM_THREADS = 256
# Every GEMM kernel (gemm_q8.cu, gemm_kq.cu) comes in two stagings of the same tile and the same bits, named by a
# suffix: one staged shared-memory tile (""), or two in turn ("_db": one barrier a stage instead of two).
# `rigllm bench` times both on the prefill shape for each weight type (its JSON's gemm "stagings_tops").
GEMM_STAGINGS = ("", "_db")
# Two tiles, measured on the H200 (9B gate+up at 256 tokens, tests/gpu/results/…-s14c-bench-9b-*.json): Q8_0 91.7
# against 87.8 TOPS, Q4_K 74.3 / 72.2, Q5_K 72.1 / 70.9, Q6_K 72.1 / 71.3. Not measured on a Volta card.
DEFAULT_GEMM_STAGING = "_db"


def gemm_kernel(base: str, staging: str) -> str:
    """The kernel `base` (e.g. gemm_q8_0_q8_1) in `staging`, one of GEMM_STAGINGS."""
    if staging not in GEMM_STAGINGS:
        raise ValueError(f"no GEMM staging {staging!r}: {GEMM_STAGINGS}")
    return base + staging


def gemm_grid(rows: int, n_tokens: int) -> tuple[int, int]:
    """(token tiles, row tiles): token tiles vary fastest so CTAs sharing a weight tile run together."""
    return (-(-n_tokens // GEMM_TILE_TOKENS), -(-rows // GEMM_TILE_ROWS))


def gemm_q8(
    card: CudaCard,
    w: Q8Weight,
    x: Q8Activations,
    y: DeviceBuffer,
    n_tokens: int,
    residual: DeviceBuffer | None = None,
    stream: Stream | None = None,
    staging: str = DEFAULT_GEMM_STAGING,
) -> None:
    """y = W x (+ residual) for n_tokens tokens; `residual` has the output's layout and may be `y`."""
    kernel = gemm_kernel("gemm_q8_0_q8_1", staging)
    ends = matmul_args(w, x, y, n_tokens, residual)
    card.kernel(kernel).launch(
        gemm_grid(w.rows, n_tokens),
        GEMM_THREADS,
        w.qs,
        w.d,
        x.xq,
        x.xd,
        y,
        residual,
        np.int32(w.rows),
        np.int32(w.k),
        *ends,
        np.int32(n_tokens),
        stream=stream,
    )
