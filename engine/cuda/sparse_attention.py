"""Host launches of the block-sparse prefill (cuda_src/sparse_attention.cu), one function per step.

`build_index` issues the index kernels for one layer's chunk (only the passes the layer's patterns
need), `sparse_prefill_f16` the flash kernel over the fp16 cache and `sparse_prefill_kv` the one over a
quantised cache (cuda_src/sparse_kv.cu: dense and A-shape heads, whose index reads no keys);
`attention_kernels.attn_merge_gate` then merges the partials as for dense prefill. Blocks are fixed at 64 tokens (`BLOCK`, the kernels' SP_BLOCK and the
dense kernels' split alignment), so profiles for the GPU must be calibrated with `--block 64`.
The position in `step` must equal the `pos` given here: grids and index strides are sized on the host
from it, the kernels read it from `step` like every other attention kernel.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.attention_kernels import HEAD_DIMS, AttnDims, Partials, kernel_format
from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.kv_cache import KVLayerCache
from engine.errors import RigllmError
from engine.reference.sparse_attention import KINDS, Pattern

BLOCK = 64
THREADS = 256
MAX_KEY_BLOCKS = 4096  # SP_MAX_KB: a selection ranks at most this many key blocks (262144 tokens)
LAST_QUERIES = 64  # the vertical-slash estimate's queries (SP_BLOCK)
KIND_CODE = {kind: code for code, kind in enumerate(KINDS)}  # the kernels' SP_DENSE.. order
F32 = 4
KV_HEAD_DIMS = (128, 256)  # sparse_kv.cu's head widths (the Qwen3.5/3.6 sizes and the trained fixtures)
KEYLESS_KINDS = frozenset({"dense", "a_shape"})  # kinds whose index reads no keys: all a quantised cache serves


def pattern_table(patterns: Sequence[Pattern]) -> np.ndarray:
    """int32 [n_head][4]: kind code and its two counts, as the kernels read them."""
    rows = []
    for p in patterns:
        a, b = {"dense": (0, 0), "a_shape": (p.sink, p.window), "vertical_slash": (p.vertical, p.slash),
                "block_topk": (p.topk, 0)}[p.kind]
        rows.append((KIND_CODE[p.kind], a, b, 0))
    return np.array(rows, np.int32).reshape(len(rows), 4)


@dataclass(frozen=True)
class SparseGeometry:
    """Block geometry of one chunk: T new tokens at cache rows pos..pos+T-1."""

    pos: int
    n_tokens: int

    @property
    def qb0(self) -> int:
        return self.pos // BLOCK

    @property
    def n_qb(self) -> int:
        return (self.pos + self.n_tokens - 1) // BLOCK - self.qb0 + 1

    @property
    def n_kb(self) -> int:
        return -(-(self.pos + self.n_tokens) // BLOCK)

    @property
    def words(self) -> int:
        return -(-self.n_kb // 32)


@dataclass
class SparseScratch:
    """Device buffers of the index build, sized for chunks of up to `max_tokens` in a `capacity` cache."""

    index: DeviceBuffer
    q_pool: DeviceBuffer
    k_pool: DeviceBuffer
    vs_m: DeviceBuffer
    vs_l: DeviceBuffer
    vs_row: DeviceBuffer
    vs_col: DeviceBuffer
    vs_diag: DeviceBuffer
    vs_bits: DeviceBuffer


def alloc_scratch(card: CudaCard, dims: AttnDims, max_tokens: int, capacity: int, label: str = "sparse") -> SparseScratch:
    n_kb = -(-capacity // BLOCK)
    if n_kb > MAX_KEY_BLOCKS:
        raise RigllmError(f"sparse prefill handles at most {MAX_KEY_BLOCKS * BLOCK} cached tokens, not {capacity}")
    n_qb, words = max_tokens // BLOCK + 2, -(-n_kb // 32)
    h, cols = dims.n_head, words * 32

    def buf(n: int, what: str) -> DeviceBuffer:
        return card.alloc(4 * n, f"{label}.{what}")

    return SparseScratch(
        index=buf(h * n_qb * words, "index"), q_pool=buf(h * n_qb * dims.head_dim, "q_pool"),
        k_pool=buf(dims.n_head_kv * n_kb * dims.head_dim, "k_pool"), vs_m=buf(h * LAST_QUERIES * cols, "vs_m"),
        vs_l=buf(h * LAST_QUERIES * cols, "vs_l"), vs_row=buf(h * LAST_QUERIES * 2, "vs_row"),
        vs_col=buf(h * cols, "vs_col"), vs_diag=buf(h * cols * 2, "vs_diag"), vs_bits=buf(h * 2 * words, "vs_bits"),
    )


def _check(dims: AttnDims, geo: SparseGeometry) -> None:
    if dims.head_dim not in HEAD_DIMS:
        raise RigllmError(f"no sparse attention kernel for head_dim {dims.head_dim} (built: {HEAD_DIMS})")
    if geo.n_kb > MAX_KEY_BLOCKS:
        raise RigllmError(f"sparse prefill handles at most {MAX_KEY_BLOCKS * BLOCK} cached tokens")


def build_index(card: CudaCard, dims: AttnDims, scratch: SparseScratch, patterns: DeviceBuffer, kinds: set[str],
                q: DeviceBuffer, k_cache: DeviceBuffer, step: DeviceBuffer, geo: SparseGeometry, capacity: int) -> None:
    """The chunk's block index into `scratch.index` ([n_head][n_qb][words] bits) from the layer's patterns.

    `patterns`: `pattern_table` on the card; `kinds`: the pattern kinds it holds (passes for absent
    kinds are not launched). q [T][n_head][Dh] fp32 and the fp16 cache as for attn_prefill_f16.
    """
    _check(dims, geo)
    h, t, words = dims.n_head, np.int32(geo.n_tokens), np.int32(geo.words)
    qb_grid = geo.n_tokens // BLOCK + 2
    if "block_topk" in kinds:
        card.kernel("sparse_pool_q").launch(qb_grid * h, dims.head_dim, q, step, scratch.q_pool, t, np.int32(h),
                                            np.int32(qb_grid))
        card.kernel("sparse_pool_k").launch(geo.n_kb * dims.n_head_kv, dims.head_dim, k_cache, step, scratch.k_pool, t,
                                            np.int32(capacity), np.int32(geo.n_kb))
    if "vertical_slash" in kinds:
        shape = (t, np.int32(h), np.int32(dims.n_head_kv), np.int32(capacity), words, np.int32(geo.n_kb), dims.scale)
        card.kernel(f"sparse_vs_stats_d{dims.head_dim}").launch(
            geo.n_kb * h, THREADS, q, k_cache, step, patterns, scratch.vs_m, scratch.vs_l, *shape)
        card.kernel("sparse_vs_rows").launch(h, LAST_QUERIES, step, patterns, scratch.vs_m, scratch.vs_l,
                                             scratch.vs_row, t, words)
        card.kernel(f"sparse_vs_mass_d{dims.head_dim}").launch(
            geo.n_kb * h, THREADS, q, k_cache, step, patterns, scratch.vs_row, scratch.vs_col, scratch.vs_diag, *shape)
        card.kernel("sparse_vs_select").launch(h, THREADS, step, patterns, scratch.vs_col, scratch.vs_diag,
                                               scratch.vs_bits, t, words)
    if kinds - {"block_topk"}:
        card.kernel("sparse_index_fill").launch(qb_grid * h, 128, step, patterns, scratch.vs_bits, scratch.index, t,
                                                words, np.int32(qb_grid))
    if "block_topk" in kinds:
        card.kernel("sparse_topk_select").launch(
            qb_grid * h, THREADS, step, patterns, scratch.q_pool, scratch.k_pool, scratch.index, t, np.int32(h),
            np.int32(dims.n_head_kv), np.int32(dims.head_dim), words, np.int32(qb_grid))


def sparse_prefill_f16(card: CudaCard, dims: AttnDims, q: DeviceBuffer, k_cache: DeviceBuffer, v_cache: DeviceBuffer,
                       step: DeviceBuffer, index: DeviceBuffer, parts: Partials, geo: SparseGeometry, capacity: int,
                       n_splits: int) -> None:
    """Flash prefill over the key blocks `index` names; partials for attn_merge_gate (n_splits as there)."""
    _check(dims, geo)
    qb_grid = geo.n_tokens // BLOCK + 2
    card.kernel(f"sparse_prefill_d{dims.head_dim}").launch(
        qb_grid * dims.n_head * n_splits, THREADS, q, k_cache, v_cache, step, index, *parts.args(),
        np.int32(geo.n_tokens), np.int32(dims.n_head), np.int32(dims.n_head_kv), np.int32(capacity),
        np.int32(n_splits), np.int32(geo.words), np.int32(qb_grid), dims.scale,
    )


def sparse_prefill_kv(card: CudaCard, dims: AttnDims, q_domain: DeviceBuffer, cache: KVLayerCache, step: DeviceBuffer,
                      index: DeviceBuffer, parts: Partials, geo: SparseGeometry, n_splits: int,
                      tables: DeviceBuffer) -> None:
    """`sparse_prefill_f16` over a quantised cache: q in the K codec's domain (rotate_q's output for rotated
    keys, as kv_prefill takes it), the stored codes read directly, partials for attn_merge_gate."""
    if dims.head_dim not in KV_HEAD_DIMS:
        raise RigllmError(f"no sparse kernel over a quantised KV cache for head_dim {dims.head_dim} "
                          f"(built: {KV_HEAD_DIMS})")
    _check(dims, geo)
    qb_grid = geo.n_tokens // BLOCK + 2
    card.kernel(f"sparse_prefill_{kernel_format(cache.format)}_d{dims.head_dim}").launch(
        qb_grid * dims.n_head * n_splits, THREADS, q_domain, cache.k.codes, cache.k.side, cache.v.codes, cache.v.side,
        step, index, *parts.args(), np.int32(geo.n_tokens), np.int32(dims.n_head), np.int32(dims.n_head_kv),
        np.int32(cache.capacity), np.int32(n_splits), np.int32(geo.words), np.int32(qb_grid), dims.scale, tables,
    )
