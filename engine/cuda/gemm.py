"""Host side of the prefill GEMM (`cuda_src/gemm_q8.cu`): grid sizing and argument order.

The GEMM takes the same weights (`Q8Weight`, stacked matrices included) and quantized activations
(`Q8Activations`) as the GEMV and writes the same output layout (segment i of a stacked weight is its
own [T][rows_i] matrix), so a runner can pick GEMV or GEMM per call by token count alone. Any token
count works; the kernel is built for prefill chunks (tens to hundreds of tokens), where each weight
tile is reused by every token tile (64 tokens, or 16 and 32 for short chunks: `gemm_token_tile`), while the GEMV
reads weights once for up to 8 tokens.
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
# The GEMMs' narrower token tiles (gemm_q8.cu's and gemm_kq.cu's TJ = 1, 2: 16 and 32 tokens a CTA, the same bits),
# built in the two-tile staging only, by the suffix their kernels add; the 64-token tile has none.
GEMM_TOKEN_TILES = {16: "_t16", 32: "_t32", GEMM_TILE_TOKENS: ""}
# Two tiles, measured on the H200 (9B gate+up at 256 tokens, tests/gpu/results/…-s14c-bench-9b-*.json): Q8_0 91.7
# against 87.8 TOPS, Q4_K 74.3 / 72.2, Q5_K 72.1 / 70.9, Q6_K 72.1 / 71.3. Not measured on a Volta card.
DEFAULT_GEMM_STAGING = "_db"


def gemm_kernel(base: str, staging: str) -> str:
    """The kernel `base` (e.g. gemm_q8_0_q8_1) in `staging`, one of GEMM_STAGINGS."""
    if staging not in GEMM_STAGINGS:
        raise ValueError(f"no GEMM staging {staging!r}: {GEMM_STAGINGS}")
    return base + staging


def gemm_grid(rows: int, n_tokens: int, tile_tokens: int = GEMM_TILE_TOKENS) -> tuple[int, int]:
    """(token tiles, row tiles): token tiles vary fastest so CTAs sharing a weight tile run together."""
    return (-(-n_tokens // tile_tokens), -(-rows // GEMM_TILE_ROWS))


def gemm_token_tile(n_tokens: int) -> int:
    """The GEMMs' token tile for a chunk of n_tokens: 16 up to 16 tokens, 32 up to 32, 64 beyond.

    Measured on the H200 as a request meets it, eager 9B prefills timed by events, the median of 9 rounds with every
    GEMM in one tile (s22e, tests/gpu/results/2026-12-04-h200-s22e-eager-tiles.*; ms in the 16 / 32 / 64-token tiles):
    Q8_0 16 tokens 15.0 / 16.1 / 18.4, 32 tokens 18.7 / 16.4 / 18.7, 54 tokens 29.7 / 20.7 / 19.4, 96 tokens 43.4 /
    29.9 / 27.3; Q4_K_M 16 tokens 15.0 / 16.7 / 21.9, 32 tokens 19.2 / 17.2 / 22.2, 54 tokens 31.9 / 22.1 / 22.7.
    A narrow tile computes less padding and gives a 4096-row matrix more CTAs than its 64 row tiles, but stages
    fewer DP4As per barrier. (Chunks replayed back to back from a graph, s22c, favoured the 32-token tile up to 96
    tokens; eager prefills did not beyond 32.) Not measured on a Volta card, whose 80 SMs fill at fewer CTAs."""
    return 16 if n_tokens <= 16 else 32 if n_tokens <= 32 else GEMM_TILE_TOKENS


def tiled_gemm_kernel(base: str, n_tokens: int, staging: str, tile_tokens: int | None) -> tuple[str, int]:
    """(kernel, token tile) of GEMM `base` (e.g. gemm_q8_0_q8_1) in `staging` for n_tokens; `tile_tokens`, a key of
    GEMM_TOKEN_TILES, overrides `gemm_token_tile`. The narrower tiles exist in the default staging only: the other
    staging takes the 64-token tile."""
    if tile_tokens is None:
        tile_tokens = gemm_token_tile(n_tokens) if staging == DEFAULT_GEMM_STAGING else GEMM_TILE_TOKENS
    if tile_tokens not in GEMM_TOKEN_TILES or (tile_tokens != GEMM_TILE_TOKENS and staging != DEFAULT_GEMM_STAGING):
        raise ValueError(f"no {tile_tokens}-token GEMM tile in staging {staging!r}")
    return gemm_kernel(base, staging) + GEMM_TOKEN_TILES[tile_tokens], tile_tokens


def gemm_q8(
    card: CudaCard,
    w: Q8Weight,
    x: Q8Activations,
    y: DeviceBuffer,
    n_tokens: int,
    residual: DeviceBuffer | None = None,
    stream: Stream | None = None,
    staging: str = DEFAULT_GEMM_STAGING,
    tile_tokens: int | None = None,
) -> None:
    """y = W x (+ residual) for n_tokens tokens; `residual` has the output's layout and may be `y`. `tile_tokens`:
    see `tiled_gemm_kernel`."""
    kernel, tile = tiled_gemm_kernel("gemm_q8_0_q8_1", n_tokens, staging, tile_tokens)
    ends = matmul_args(w, x, y, n_tokens, residual)
    card.kernel(kernel).launch(
        gemm_grid(w.rows, n_tokens, tile),
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
