"""Host side of the K-quant kernels (cuda_src/gemv_kq.cu, gemm_kq.cu, embedding_kq.cu).

`KQWeight` is the K-quant twin of `Q8Weight`: one matrix, or several of one type stacked row-wise, in
the device layout of `engine.cuda.kq_layout`, with the same `segments` / `segment_view` contract, so a
caller runs either with the same activations and output buffers. The launch arguments mirror the
Q8_0 kernels' (weights, xq, xd, y, residual, rows, K, segment ends[, T]).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemm import DEFAULT_GEMM_STAGING, GEMM_THREADS, gemm_grid, tiled_gemm_kernel
from engine.cuda.gemv import MAX_GEMV_TOKENS, MAX_SEGMENTS, GemvLaunch, Q8Activations, matmul_args
from engine.cuda.kq_layout import device_layout
from engine.gguf.kquant_blocks import BLOCK_BYTES, KQUANT_TYPES, QK_K

Q = GGMLQuantizationType
KERNEL_TYPE_NAMES = {Q.Q4_K: "q4_k", Q.Q5_K: "q5_k", Q.Q6_K: "q6_k"}
KQ_GEMV_THREADS = 128
# Per token count, the plain kernel's rows per warp (mirrors RIGLLM_GEMV_KQ_TYPE in gemv_kq.cu; a unit test checks).
_PLAIN_ROWS = {t: 2 for t in range(1, MAX_GEMV_TOKENS + 1)}
# T = 1 variants (suffix -> launch shape), same for the three types; `kq_gemv_sweep` times them. `_p2` variants
# take two neighbouring slices per lane step (one header decode for both: gemv_kq.cu).
KQ_T1_VARIANTS = {"": GemvLaunch(2, 128), "_r1_u2": GemvLaunch(1, 128), "_r1_u4": GemvLaunch(1, 128),
                  "_r4_u1": GemvLaunch(4, 128), "_r4_u2": GemvLaunch(4, 128), "_r1_p2": GemvLaunch(1, 128),
                  "_p2": GemvLaunch(2, 128), "_r4_p2": GemvLaunch(4, 128)}
# Matrices of at least this many rows are "wide": enough warps at 4 rows each to fill the card. Narrower ones
# (the 4096-row output and down projections) want fewer rows per warp, so more warps share them.
WIDE_ROWS = 8192


@dataclass(frozen=True)
class T1Choice:
    """The T = 1 variant (a KQ_T1_VARIANTS suffix) for narrow and for wide matrices of one type."""

    narrow: str
    wide: str

    def for_rows(self, rows: int) -> str:
        return self.wide if rows >= WIDE_ROWS else self.narrow


# The T = 1 variant each type launches, by matrix width: the fastest per class in the H200 sweep of the 9B
# shape (`rigllm bench --synthetic 9b --weights q4_k_m|q5_k_m|q6_k --gemv-sweep 1`,
# tests/gpu/results/2026-12-03-h200-sweep-9b-*.json): per decode step 1463 us of Q4_K GEMVs against 1530 for
# the best single variant and 1653 for the plain kernel; Q5_K 1776 us, Q6_K 1826 us.
DEFAULT_KQ_T1 = {Q.Q4_K: T1Choice("_p2", "_r4_u1"), Q.Q5_K: T1Choice("_p2", "_r4_u1"), Q.Q6_K: T1Choice("_p2", "_p2")}
EMBED_THREADS = 256


@dataclass(frozen=True)
class KQWeight:
    """A K-quant matrix (or several of one type stacked row-wise) in its device layout."""

    data: DeviceBuffer
    qtype: GGMLQuantizationType
    rows: int
    k: int
    segments: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return self.data.nbytes

    def segment_view(self, y: DeviceBuffer, index: int, n_tokens: int) -> DeviceBuffer:
        """The [n_tokens][segments[index]] fp32 output of stacked matrix `index` inside output `y`."""
        start = sum(self.segments[:index])
        return y.view(4 * start * n_tokens, 4 * self.segments[index] * n_tokens)


def upload_kq_weight(card: CudaCard, qtype: GGMLQuantizationType, parts: Sequence[np.ndarray], k: int,
                     label: str) -> KQWeight:
    """Upload one or more GGUF `qtype` matrices (uint8 [rows_i, k/256 · block bytes]), stacked row-wise."""
    if qtype not in KQUANT_TYPES:
        raise ValueError(f"{label}: {qtype.name} is not a K-quant type")
    if not 1 <= len(parts) <= MAX_SEGMENTS:
        raise ValueError(f"{label}: 1 to {MAX_SEGMENTS} matrices can share one GEMV, not {len(parts)}")
    if k % QK_K:
        raise ValueError(f"{label}: {qtype.name} rows must hold a multiple of {QK_K} values, not {k}")
    row_bytes = k // QK_K * BLOCK_BYTES[qtype]
    for raw in parts:
        if raw.dtype != np.uint8 or raw.ndim != 2 or raw.shape[1] != row_bytes:
            raise ValueError(f"{label}: every part must be uint8 [rows, {row_bytes}] ({qtype.name} rows of {k} values)")
    stacked = np.concatenate(parts) if len(parts) > 1 else parts[0]
    rows = stacked.shape[0]
    return KQWeight(card.upload(device_layout(stacked, qtype, rows, k), label), qtype, rows, k,
                    tuple(p.shape[0] for p in parts))


def gemv_kernel(qtype: GGMLQuantizationType, n_tokens: int, variant: str | None = None,
                rows: int = 0) -> tuple[str, GemvLaunch]:
    """(kernel name, launch shape) of the `n_tokens`-token GEMV for `qtype` on a matrix of `rows` rows;
    `variant` is a KQ_T1_VARIANTS suffix (T = 1 only; default DEFAULT_KQ_T1[qtype] for that width)."""
    if not 1 <= n_tokens <= MAX_GEMV_TOKENS:
        raise ValueError(f"the GEMV takes 1..{MAX_GEMV_TOKENS} tokens, not {n_tokens}; use the GEMM")
    base = f"gemv_{KERNEL_TYPE_NAMES[qtype]}_t{n_tokens}"
    if n_tokens == 1:
        suffix = DEFAULT_KQ_T1[qtype].for_rows(rows) if variant is None else variant
        if suffix not in KQ_T1_VARIANTS:
            raise ValueError(f"unknown T=1 K-quant GEMV variant {suffix!r}; known: {', '.join(map(repr, KQ_T1_VARIANTS))}")
        return base + suffix, KQ_T1_VARIANTS[suffix]
    if variant is not None:
        raise ValueError(f"K-quant GEMV variants exist for T = 1 only, not {n_tokens}")
    return base, GemvLaunch(_PLAIN_ROWS[n_tokens], KQ_GEMV_THREADS)


def gemv_kq(card: CudaCard, w: KQWeight, x: Q8Activations, y: DeviceBuffer, n_tokens: int,
            residual: DeviceBuffer | None = None, stream: Stream | None = None, max_blocks: int | None = None,
            variant: str | None = None) -> None:
    """y = W x (+ residual) for 1..8 tokens, as `gemv_q8` does for Q8_0 weights."""
    kernel, launch = gemv_kernel(w.qtype, n_tokens, variant, w.rows)
    ends = matmul_args(w, x, y, n_tokens, residual)
    rows_per_block = launch.rows_per_warp * (launch.threads // 32)
    grid = -(-w.rows // rows_per_block)
    if max_blocks is not None:
        grid = max(1, min(grid, max_blocks))
    card.kernel(kernel).launch(grid, launch.threads, w.data, x.xq, x.xd, y, residual, np.int32(w.rows),
                               np.int32(w.k), *ends, stream=stream)


def gemm_kq(card: CudaCard, w: KQWeight, x: Q8Activations, y: DeviceBuffer, n_tokens: int,
            residual: DeviceBuffer | None = None, stream: Stream | None = None,
            staging: str = DEFAULT_GEMM_STAGING, tile_tokens: int | None = None) -> None:
    """y = W x (+ residual) for any token count, as `gemm_q8` does for Q8_0 weights."""
    kernel, tile = tiled_gemm_kernel(f"gemm_{KERNEL_TYPE_NAMES[w.qtype]}_q8_1", n_tokens, staging, tile_tokens)
    ends = matmul_args(w, x, y, n_tokens, residual)
    card.kernel(kernel).launch(
        gemm_grid(w.rows, n_tokens, tile), GEMM_THREADS, w.data, x.xq, x.xd, y, residual, np.int32(w.rows),
        np.int32(w.k), *ends, np.int32(n_tokens), stream=stream)


def embed_kq(card: CudaCard, table: KQWeight, ids: DeviceBuffer, out: DeviceBuffer, n_tokens: int,
             stream: Stream | None = None) -> None:
    """out[t] = dequantised table row ids[t] (fp32 [n_tokens][D]), bit for bit gguf-py's dequantize."""
    if len(table.segments) != 1:
        raise ValueError("the embedding table must be a single matrix, not a stack")
    if n_tokens < 1 or ids.nbytes < 4 * n_tokens or out.nbytes < 4 * n_tokens * table.k:
        raise ValueError(f"{n_tokens} tokens need {4 * n_tokens} bytes of ids and {4 * n_tokens * table.k} of output")
    card.kernel(f"embed_{KERNEL_TYPE_NAMES[table.qtype]}").launch(
        n_tokens, EMBED_THREADS, table.data, ids, out, np.int32(n_tokens), np.int32(table.k), np.int32(table.rows),
        stream=stream)
