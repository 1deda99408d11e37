"""Host launchers of the vision-tower kernels (`cuda_src/vision.cu`): grid sizing, argument order, checks.

One function per kernel, each checking the buffer sizes it is given, so a wrong shape fails here with a
message instead of as a fault at the next synchronisation. Constants mirror the `#define`s of the .cu.
"""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream

GEMM_TILE = 64  # VIT_TILE
GEMM_THREADS = 256  # VIT_THREADS
ATTENTION_QUERIES = 64  # VIT_ATT_Q
ATTENTION_HEAD_SIZES = (16, 64, 72)  # the vit_attention_d* entry points
ELEMENTWISE_THREADS = 256
MAX_GRID_BLOCKS = 65535 * 16  # grid-stride kernels need no more blocks than this to fill any GPU
F16, F32 = 2, 4


class Epilogue(IntEnum):
    """What `gemm` does with acc + bias (VIT_EPI_* in vision.cu)."""

    STORE = 0  # fp32 out
    RESIDUAL = 1  # fp32 out += (the residual stream)
    GELU_TANH = 2  # fp16 out (the tower MLP's hidden layer)
    GELU_ERF = 3  # fp16 out (the merger's hidden layer)


def _need(buf: DeviceBuffer, nbytes: int, what: str) -> None:
    if buf.nbytes < nbytes:
        raise ValueError(f"{what}: buffer of {buf.nbytes} bytes, needs {nbytes}")


def _stride_grid(total: int) -> int:
    return max(1, min(-(-total // ELEMENTWISE_THREADS), MAX_GRID_BLOCKS))


def gemm(card: CudaCard, a: DeviceBuffer, w: DeviceBuffer, bias: DeviceBuffer, out: DeviceBuffer,
         m: int, n: int, k: int, epilogue: Epilogue, stream: Stream | None = None) -> None:
    """out [m][n] = epilogue(a [m][k] fp16 · w [n][k]ᵀ fp16 + bias [n] fp32); k must be even."""
    if k % 2:
        raise ValueError(f"gemm: K = {k} must be even (half2 loads)")
    _need(a, m * k * F16, "gemm input")
    _need(w, n * k * F16, "gemm weight")
    _need(bias, n * F32, "gemm bias")
    _need(out, m * n * (F32 if epilogue in (Epilogue.STORE, Epilogue.RESIDUAL) else F16), "gemm output")
    card.kernel("vit_gemm_f16").launch(
        (-(-n // GEMM_TILE), -(-m // GEMM_TILE)), GEMM_THREADS, a, w, bias, out,
        np.int32(m), np.int32(n), np.int32(k), np.int32(int(epilogue)), stream=stream,
    )


def layernorm(card: CudaCard, x: DeviceBuffer, weight: DeviceBuffer, bias: DeviceBuffer, y: DeviceBuffer,
              rows: int, width: int, eps: float, stream: Stream | None = None) -> None:
    """y [rows][width] fp16 = LayerNorm(x fp32) · weight + bias."""
    _need(x, rows * width * F32, "layernorm input")
    _need(y, rows * width * F16, "layernorm output")
    card.kernel("vit_layernorm_f16").launch(
        -(-rows * 32 // ELEMENTWISE_THREADS), ELEMENTWISE_THREADS, x, weight, bias, y,
        np.int32(rows), np.int32(width), np.float32(eps), stream=stream,
    )


def patchify(card: CudaCard, pixels: DeviceBuffer, height: int, width: int, patch: int, merge: int,
             out: DeviceBuffer, stream: Stream | None = None) -> None:
    """Pixels fp16 [3][height][width] → patch rows fp16 [patches][3·patch²] in merge order."""
    total = 3 * height * width
    _need(pixels, total * F16, "patchify pixels")
    _need(out, total * F16, "patchify output")
    card.kernel("vit_patchify").launch(
        _stride_grid(total), ELEMENTWISE_THREADS, pixels, np.int32(height), np.int32(width), np.int32(patch),
        np.int32(merge), out, stream=stream,
    )


def add_position_embeddings(card: CudaCard, x: DeviceBuffer, table: DeviceBuffer, side: int, grid_h: int,
                            grid_w: int, merge: int, width: int, stream: Stream | None = None) -> None:
    """x [patches][width] fp32 += the side×side table (fp32) interpolated to the grid, in merge order."""
    total = grid_h * grid_w * width
    _need(x, total * F32, "position embedding target")
    _need(table, side * side * width * F32, "position table")
    card.kernel("vit_pos_embed_add").launch(
        _stride_grid(total), ELEMENTWISE_THREADS, x, table, np.int32(side), np.int32(grid_h), np.int32(grid_w),
        np.int32(merge), np.int32(width), stream=stream,
    )


def split_qkv_rope(card: CudaCard, qkv: DeviceBuffer, n: int, heads: int, head_dim: int, grid_w: int, merge: int,
                   q: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, stream: Stream | None = None) -> None:
    """qkv fp32 [n][3·heads·hd] → q, k (2D-rotated), v fp16 [heads][n][hd]."""
    total = n * heads * head_dim
    _need(qkv, 3 * total * F32, "qkv")
    for buf, what in ((q, "q"), (k, "k"), (v, "v")):
        _need(buf, total * F16, what)
    card.kernel("vit_qkv_rope").launch(
        _stride_grid(total), ELEMENTWISE_THREADS, qkv, np.int32(n), np.int32(heads), np.int32(head_dim),
        np.int32(grid_w), np.int32(merge), q, k, v, stream=stream,
    )


def attention(card: CudaCard, q: DeviceBuffer, k: DeviceBuffer, v: DeviceBuffer, out: DeviceBuffer, n: int,
              heads: int, head_dim: int, stream: Stream | None = None) -> None:
    """out fp16 [n][heads·hd] = softmax(q kᵀ / sqrt(hd)) v per head, all n patches attending to each other."""
    if head_dim not in ATTENTION_HEAD_SIZES:
        raise ValueError(f"vision attention has kernels for head sizes {ATTENTION_HEAD_SIZES}, not {head_dim}")
    for buf, what in ((q, "q"), (k, "k"), (v, "v"), (out, "attention output")):
        _need(buf, n * heads * head_dim * F16, what)
    card.kernel(f"vit_attention_d{head_dim}").launch(
        (-(-n // ATTENTION_QUERIES), heads), ATTENTION_QUERIES, q, k, v, out, np.int32(n), np.int32(heads),
        np.float32(head_dim**-0.5), stream=stream,
    )
