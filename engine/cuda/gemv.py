"""Host side of the DP4A GEMV (`cuda_src/gemv_q8.cu`) and the Q8_1 quantizer (`cuda_src/quantize.cu`).

Owns what a caller should not have to know: the device layouts (`engine.cuda.q8_layout`), argument
order, grid sizes, and the row-range split of stacked weights. Matrices that share one input (ffn
gate+up; GDN qkv, z, b, a; attention q, k, v) are stacked row-wise once at upload and run as one GEMV;
segment i of the output is its own [T][rows_i] matrix, found with `Q8Weight.segment_view`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.q8_layout import CHUNK_BLOCKS, QK

GEMV_THREADS = 128
# Rows per warp for each token count: mirrors RIGLLM_GEMV_Q8(T, R, ...) in gemv_q8.cu (a unit test checks it).
# Only grid sizes depend on it; the kernel strides over row groups, so a mismatch costs speed, not results.
GEMV_ROWS_PER_WARP = {1: 2, 2: 2, 3: 2, 4: 2, 5: 4, 6: 4, 7: 4, 8: 4}
MAX_GEMV_TOKENS = max(GEMV_ROWS_PER_WARP)


@dataclass(frozen=True)
class GemvLaunch:
    """What the host needs to size a GEMV kernel's grid: rows per warp and threads per block."""

    rows_per_warp: int
    threads: int


# The kernels that can be swapped in for each token count (1: decode; 2-3: speculative verifies and two- or
# three-slot steps; 4-8: batched steps): T -> name -> launch shape. Mirrors gemv_q8.cu's RIGLLM_GEMV_Q8(T, R, ...),
# RIGLLM_GEMV_Q8_VARIANT(T, suffix, R, U, THREADS, ...) and RIGLLM_GEMV_Q8_PIPELINED lines (…_p: the next round's
# weights loaded while the current one multiplies); a unit test checks it; `microbench.gemv_sweep` times them.
# DEFAULT_GEMV[T] is the one a T-token GEMV launches unless SHAPE_GEMV names its matrix shape's; both follow
# engine.cuda.bench.gemv_choice's rule on the committed sweeps (tests/unit/test_gemv_shapes.py).
_VARIANT_SHAPES: dict[int, tuple[str, ...]] = {
    1: ("r1_u2", "r1_u4", "r2_u2", "r4_u1", "r4_u2", "r1_u2_p", "r2_u1_p", "r4_u1_p"),
    2: ("r1_u1", "r1_u2", "r2_u2", "r4_u1", "r2_u1_p", "r4_u1_p"),
    3: ("r1_u2", "r2_u2", "r4_u1", "r2_u1_p"),
    4: ("r1_u2", "r4_u1", "r2_u1_p", "r4_u1_p"),
    5: ("r1_u1", "r2_u1", "r4_u1_m3", "r2_u1_p"),
    6: ("r1_u1", "r2_u1", "r4_u1_m3", "r2_u1_p"),
    7: ("r1_u1", "r2_u1", "r4_u1_m3", "r2_u1_p"),
    8: ("r2_u1", "r1_u2", "r4_u1_m3", "r2_u1_p", "r4_u1_p"),
}
GEMV_VARIANTS = {
    t: {f"gemv_q8_t{t}": GemvLaunch(GEMV_ROWS_PER_WARP[t], GEMV_THREADS),
        **{f"gemv_q8_t{t}_{s}": GemvLaunch(int(s[1]), GEMV_THREADS) for s in shapes}}
    for t, shapes in _VARIANT_SHAPES.items()
}
# DEFAULT_GEMV[T]: the variant with the least GEMV time over a whole 9B step of the width's sweep (the rule of
# engine.cuda.bench.gemv_choice); SHAPE_GEMV: per matrix shape (tokens, rows, k), the variant that sweep measured
# at least SHAPE_GAIN faster than that default on the shape's matrices. Both from `rigllm bench --synthetic 9b
# --gemv-sweep T` on the H200, 2026-12-03, on the blocked payload (tests/gpu/results/2026-12-03-h200-s16c-gemv-sweep-
# 9b-t{1,2,5,6,7,8}.json and s16b's t3, t4: each width's last sweep after its variants last changed); test_gemv_shapes
# holds both tables to those files. Every variant of a width sums each row in the same order (a lane's blocks in
# chunk order, then the same shuffle tree), so the choice does not change outputs. A sweep times each matrix alone,
# out of the step's L2 and launch context, and varies by a few percent between runs, so its per-shape gains are upper
# bounds. Other shapes (the 27B's) run DEFAULT_GEMV. Re-run the sweeps on the target card: Volta's register file and
# SM count may rank the variants differently.
DEFAULT_GEMV = {1: "gemv_q8_t1", 2: "gemv_q8_t2_r1_u1", 3: "gemv_q8_t3_r4_u1", 4: "gemv_q8_t4_r4_u1_p",
                5: "gemv_q8_t5_r4_u1_m3", 6: "gemv_q8_t6_r4_u1_m3", 7: "gemv_q8_t7_r4_u1_m3", 8: "gemv_q8_t8_r4_u1_m3"}
SHAPE_GAIN = 1.03
SHAPE_GEMV: dict[tuple[int, int, int], str] = {
    (1, 4096, 4096): "gemv_q8_t1_r2_u1_p",
    (1, 4096, 12288): "gemv_q8_t1_r1_u2",
    (3, 4096, 12288): "gemv_q8_t3_r2_u1_p",
    (6, 248320, 4096): "gemv_q8_t6",
    (7, 248320, 4096): "gemv_q8_t7",
    (8, 248320, 4096): "gemv_q8_t8",
}
MAX_SEGMENTS = 4
QUANTIZE_THREADS = 256
BLOCK_PAYLOAD_THREADS = 256
MAX_BLOCK_PAYLOAD_GRID = 65536  # the permute kernel strides over (row, chunk) pairs past it


def gemv_variant(n_tokens: int, rows: int, k: int) -> str:
    """The GEMV kernel an `n_tokens`-token product with a rows x k matrix launches: its shape's measured best
    (SHAPE_GEMV), else the width's DEFAULT_GEMV."""
    return SHAPE_GEMV.get((n_tokens, rows, k), DEFAULT_GEMV[n_tokens])


@dataclass(frozen=True)
class Q8Weight:
    """A Q8_0 matrix (or several stacked row-wise) in the device layout: qs int8 [rows][k] with each row in the
    blocked payload (cuda_src/q8_blocked.cuh), d fp16 [rows][k/32]."""

    qs: DeviceBuffer
    d: DeviceBuffer
    rows: int
    k: int
    segments: tuple[int, ...]  # row counts of the stacked matrices, summing to `rows`

    @property
    def nbytes(self) -> int:
        return self.qs.nbytes + self.d.nbytes

    def segment_view(self, y: DeviceBuffer, index: int, n_tokens: int) -> DeviceBuffer:
        """The [n_tokens][segments[index]] fp32 output of stacked matrix `index` inside GEMV output `y`."""
        start = sum(self.segments[:index])
        return y.view(4 * start * n_tokens, 4 * self.segments[index] * n_tokens)


def upload_q8_weight(card: CudaCard, parts: Sequence[tuple[np.ndarray, np.ndarray]], label: str) -> Q8Weight:
    """Upload one or more (qs int8 [rows_i, k], d fp16 [rows_i, k/32]) matrices, stacked row-wise.

    qs arrives row-major and is permuted into the blocked payload on the card, in place (`q8_block_payload`: one
    read and one write of the matrix there, about 21 ms for a 9B's 8.6 GB at a CMP's 818 GB/s by that count, not
    measured), where a numpy pass over the weights would cost seconds of loading; the card is synchronized so
    that a launch fault shows here, naming the matrix."""
    if not 1 <= len(parts) <= MAX_SEGMENTS:
        raise ValueError(f"{label}: 1 to {MAX_SEGMENTS} matrices can share one GEMV, not {len(parts)}")
    k = parts[0][0].shape[1]
    for qs, d in parts:
        if qs.dtype != np.int8 or d.dtype != np.float16 or qs.ndim != 2 or qs.shape[1] != k:
            raise ValueError(f"{label}: every part must be qs int8 [rows, {k}] with d float16 [rows, {k // QK}]")
        if k % QK or d.shape != (qs.shape[0], k // QK):
            raise ValueError(f"{label}: d has shape {d.shape}, expected {(qs.shape[0], k // QK)}; k must be a multiple of {QK}")
    qs_all = np.concatenate([qs for qs, _ in parts]) if len(parts) > 1 else parts[0][0]
    d_all = np.concatenate([d for _, d in parts]) if len(parts) > 1 else parts[0][1]
    rows = qs_all.shape[0]
    qs_buf = card.upload(qs_all, f"{label}.qs")
    warps = rows * -(-(k // QK) // CHUNK_BLOCKS)
    grid = min(-(-warps // (BLOCK_PAYLOAD_THREADS // 32)), MAX_BLOCK_PAYLOAD_GRID)
    card.kernel("q8_block_payload").launch(grid, BLOCK_PAYLOAD_THREADS, qs_buf, np.int32(rows), np.int32(k))
    card.synchronize()
    return Q8Weight(qs=qs_buf, d=card.upload(d_all, f"{label}.d"), rows=rows, k=k,
                    segments=tuple(qs.shape[0] for qs, _ in parts))


@dataclass(frozen=True)
class Q8Activations:
    """Quantized activations for up to `max_tokens` rows of width k: xq int8 [T][k], xd fp32 [T][k/32]."""

    xq: DeviceBuffer
    xd: DeviceBuffer
    k: int
    max_tokens: int

    def rows(self, first: int, count: int) -> "Q8Activations":
        """Rows [first, first + count) (one sequence's rows of a pass over several: engine.cuda.forward)."""
        if first < 0 or count < 1 or first + count > self.max_tokens:
            raise ValueError(f"rows {first}..{first + count} of {self.max_tokens}")
        blocks = self.k // QK
        return Q8Activations(self.xq.view(first * self.k, count * self.k), self.xd.view(4 * first * blocks, 4 * count * blocks),
                             self.k, count)


def alloc_q8_activations(card: CudaCard, k: int, max_tokens: int, label: str) -> Q8Activations:
    if k % QK:
        raise ValueError(f"{label}: width {k} is not a multiple of {QK}")
    return Q8Activations(
        xq=card.alloc(k * max_tokens, f"{label}.xq"),
        xd=card.alloc(4 * (k // QK) * max_tokens, f"{label}.xd"),
        k=k,
        max_tokens=max_tokens,
    )


def quantize_q8_1(
    card: CudaCard,
    x: DeviceBuffer,
    out: Q8Activations,
    n_tokens: int,
    ld_x: int | None = None,
    stream: Stream | None = None,
) -> None:
    """Quantize rows x[t][0:k] (fp32, row stride `ld_x` floats, default k) for t < n_tokens into `out`."""
    ld = out.k if ld_x is None else ld_x
    if not 1 <= n_tokens <= out.max_tokens:
        raise ValueError(f"n_tokens {n_tokens} outside 1..{out.max_tokens}")
    if ld < out.k or x.nbytes < 4 * (ld * (n_tokens - 1) + out.k):
        raise ValueError(f"input of {x.nbytes} bytes cannot hold {n_tokens} rows of {out.k} at stride {ld}")
    threads = n_tokens * out.k // 4
    grid = (threads + QUANTIZE_THREADS - 1) // QUANTIZE_THREADS
    card.kernel("quantize_q8_1").launch(
        grid, QUANTIZE_THREADS, x, np.int64(ld), out.xq, out.xd, np.int32(out.k), np.int32(n_tokens), stream=stream
    )


def matmul_args(w: Q8Weight, x: Q8Activations, y: DeviceBuffer, n_tokens: int,
                residual: DeviceBuffer | None) -> list[np.int32]:
    """Check a GEMV/GEMM call's shapes and buffer sizes; return the segment-end arguments both kernels take."""
    if not 1 <= n_tokens <= x.max_tokens:
        raise ValueError(f"n_tokens {n_tokens} outside 1..{x.max_tokens} of the activation buffer")
    if x.k != w.k:
        raise ValueError(f"activations of width {x.k} do not fit W [{w.rows}, {w.k}]")
    out_bytes = 4 * w.rows * n_tokens
    for name, buf in (("output", y), ("residual", residual)):
        if buf is not None and buf.nbytes < out_bytes:
            raise ValueError(f"{name} buffer of {buf.nbytes} bytes < {out_bytes} needed")
    ends = [*accumulate(w.segments[:-1]), *[w.rows] * (MAX_SEGMENTS - len(w.segments))]
    return [np.int32(e) for e in ends]


def gemv_q8(
    card: CudaCard,
    w: Q8Weight,
    x: Q8Activations,
    y: DeviceBuffer,
    n_tokens: int,
    residual: DeviceBuffer | None = None,
    stream: Stream | None = None,
    max_blocks: int | None = None,
    variant: str | None = None,
) -> None:
    """y = W x (+ residual) for n_tokens (1..8) tokens; outputs split per stacked matrix (see module docstring).

    `residual` has the output's layout and may be `y` itself. `max_blocks` caps the grid (the kernel
    strides over row groups), e.g. to leave SMs to a concurrent stream. `variant` names a kernel of
    GEMV_VARIANTS[n_tokens] (default `gemv_variant` of the matrix's shape); every variant computes the same sums.
    """
    if n_tokens not in GEMV_ROWS_PER_WARP:
        raise ValueError(f"the GEMV takes 1..{MAX_GEMV_TOKENS} tokens, not {n_tokens}; use the GEMM")
    known = GEMV_VARIANTS[n_tokens]
    kernel = gemv_variant(n_tokens, w.rows, w.k) if variant is None else variant
    if kernel not in known:
        raise ValueError(f"unknown T={n_tokens} GEMV variant {kernel!r}; known: {', '.join(known)}")
    launch = known[kernel]
    ends = matmul_args(w, x, y, n_tokens, residual)
    rows_per_block = launch.rows_per_warp * (launch.threads // 32)
    grid = (w.rows + rows_per_block - 1) // rows_per_block
    if max_blocks is not None:
        grid = max(1, min(grid, max_blocks))
    card.kernel(kernel).launch(
        grid,
        launch.threads,
        w.qs,
        w.d,
        x.xq,
        x.xd,
        y,
        residual,
        np.int32(w.rows),
        np.int32(w.k),
        *ends,
        stream=stream,
    )
