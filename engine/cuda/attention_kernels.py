"""Host launches of the attention kernels, one function per launch (cuda_src/attention.cu and kv_cache.cu).

The launch geometry of each kernel lives here once, so the forward pass and the GPU tests issue the
same launches. Shapes, in the kernels' terms:
  q        [T][n_head][Dh] fp32 from attn_prep (normed, rotated by RoPE, unscaled)
  q_domain q in the K codec's attention domain: q itself for fp16/int8 keys, `rotate_q`'s output
           [T][n_head][ceil(Dh/128)*128] for rotated (wht) keys
  staging  fp16 [n_head_kv][stage_rows][Dh]: the batch's new K (or V) rows, row t = token t
  partials fp32 part_m/part_l [T*n_head][n_splits], part_o [T*n_head][n_splits][Dh]
Per-step values (position) come from the `step` buffer, so decode grids never depend on the position.
Prep, append and decode also run slot-indexed (`slots`, engine.cuda.slot_batch): token t is then the one
new token of slot row_slot[t], whose step record, rope positions and cache the kernel looks up, with
`step` the base of every slot's records and the cache arguments unused.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.kv_cache import KVLayerCache, KVSide
from engine.cuda.l2_prefetch import NO_PREFETCH, L2Prefetch, grid_with_prefetch_blocks
from engine.cuda.slot_batch import KV_SLOT_PTRS, SlotRows, slot_args
from engine.errors import RigllmError
from engine.model.kv_formats import CUDA_KERNEL_FORMATS, FP16, KVFormat

F32 = 4
DECODE_THREADS = 128  # 32 * DECODE_WARPS (attention.cu) = 32 * KV_DECODE_WARPS (kv_cache.cu)
PREFILL_THREADS = 256  # FLASH_THREADS (cuda_src/attention_tile.cuh)
PREFILL_ROWS = 64  # FLASH_BQ (attention_tile.cuh): query rows (token, head of the group) per prefill block
ENCODE_THREADS = 128  # KV_ENCODE_THREADS
ROTATE_THREADS = 128  # kv::BLOCK
HEAD_DIMS = (32, 64, 128, 256)  # instantiated head widths (128: the trained fixtures)
GROUPS = (1, 2, 4, 6, 8)  # GQA group sizes of the fp16 decode kernels (attention.cu), every head width
KV_DECODE_GROUPS = {256: GROUPS, 128: (1, 2, 4), 64: (1, 2, 4), 32: (1, 2, 4)}  # kv_cache.cu's decode entries
F16_DECODE_GROUPS = {d: GROUPS for d in HEAD_DIMS}  # attention.cu's fp16 decode entries (prefill: every group)
# Other group sizes take the any-group decode kernels (`*_gany`: one query head per block, KV rows read once
# per query head): every group size runs, the specialised ones read each KV row once for the whole group.
QUANTISED_KERNEL_FORMATS = tuple(f for f in CUDA_KERNEL_FORMATS if f != "f16")  # kv_cache.cu entry points
MAX_PREFILL_SPLITS = 8


@dataclass(frozen=True)
class AttnDims:
    """The head layout one layer's launches need."""

    n_head: int
    n_head_kv: int
    head_dim: int

    @property
    def group(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def scale(self) -> np.float32:
        return np.float32(1.0 / np.sqrt(self.head_dim))


@dataclass
class Partials:
    """Split partials (m, l, o) for up to `rows` = T * n_head query rows and `n_splits` splits."""

    m: DeviceBuffer
    l: DeviceBuffer
    o: DeviceBuffer

    def args(self) -> tuple[DeviceBuffer, DeviceBuffer, DeviceBuffer]:
        return self.m, self.l, self.o


def alloc_partials(card: CudaCard, rows: int, n_splits: int, head_dim: int, label: str = "attn") -> Partials:
    n = rows * n_splits
    return Partials(card.alloc(F32 * n, f"{label}.part_m"), card.alloc(F32 * n, f"{label}.part_l"),
                    card.alloc(F32 * n * head_dim, f"{label}.part_o"))


def decode_splits(sm_count: int, n_head_kv: int) -> int:
    """Decode splits: about 3 blocks per SM over the KV heads (forward.py's rule)."""
    return max(1, -(-3 * sm_count // n_head_kv))


def prefill_splits(sm_count: int, n_tokens: int, dims: AttnDims, kv_len: int) -> int:
    """Prefill splits: fill ~2 blocks per SM, at most MAX_PREFILL_SPLITS, and no split under 256 keys."""
    q_tiles = -(-n_tokens * dims.group // PREFILL_ROWS)
    return max(1, min(MAX_PREFILL_SPLITS, -(-2 * sm_count // (q_tiles * dims.n_head_kv)), -(-kv_len // 256)))


def _check_shape(dims: AttnDims) -> None:
    if dims.head_dim not in HEAD_DIMS or dims.n_head % dims.n_head_kv:
        raise RigllmError(
            f"no attention kernel for head_dim {dims.head_dim} with {dims.n_head} query heads over "
            f"{dims.n_head_kv} KV heads (built: head_dim {', '.join(map(str, HEAD_DIMS))}, any whole group)"
        )


def _decode_launch(prefix: str, dims: AttnDims, built: dict[int, tuple[int, ...]], n_splits: int
                   ) -> tuple[str, int, tuple[np.int32, ...]]:
    """(kernel name, grid.y, trailing arguments) of a decode launch: the group's own kernel, grid over KV heads,
    or the any-group kernel, grid over query heads with the group size as its last argument."""
    _check_shape(dims)
    if dims.group in built[dims.head_dim]:
        return f"{prefix}_d{dims.head_dim}_g{dims.group}", dims.n_head_kv * n_splits, ()
    return f"{prefix}_d{dims.head_dim}_gany", dims.n_head * n_splits, (np.int32(dims.group),)


def kernel_format(fmt: KVFormat) -> str:
    """The kv_cache.cu name of a quantised format; a user error for pairs without kernels."""
    if fmt.name not in QUANTISED_KERNEL_FORMATS:
        raise RigllmError(
            f"KV format {fmt.name} has no CUDA kernels (built: f16, {', '.join(QUANTISED_KERNEL_FORMATS)})"
        )
    return fmt.name


# ---- prep (norm_rope.cu) ----------------------------------------------------------------------------
@dataclass(frozen=True)
class RopeArgs:
    """RoPE inputs of attn_prep: inv_freq [rope_dims/2] fp32 and the M-RoPE sections (h, w)."""

    inv_freq: DeviceBuffer
    rope_dims: int
    sec_h: int
    sec_w: int


def attn_prep(card: CudaCard, dims: AttnDims, qg: DeviceBuffer, qg_stride: int, k: DeviceBuffer, k_stride: int,
              v: DeviceBuffer, v_stride: int, q_norm: DeviceBuffer, k_norm: DeviceBuffer, rope: RopeArgs,
              positions: DeviceBuffer | None, step: DeviceBuffer, q_out: DeviceBuffer, k_dst: DeviceBuffer | None,
              v_dst: DeviceBuffer | None, n_tokens: int, capacity: int, eps: float, stage_rows: int = 0,
              slots: SlotRows | None = None, prefetch: L2Prefetch = NO_PREFETCH) -> None:
    """q/k RMSNorm + RoPE; q → q_out, K and V as fp16 into the cache at rows pos.. (k_dst/v_dst = the fp16
    cache) or, with stage_rows > 0, into staging rows 0.. for `kv_encode` (k_dst/v_dst = staging).
    Slot-indexed, `positions` is every slot's [slot][3] rope positions and k_dst/v_dst are None unless staging.
    `prefetch`: the output projection's leading weight bytes (engine.cuda.l2_prefetch)."""
    grid = grid_with_prefetch_blocks(card, n_tokens * (dims.n_head + dims.n_head_kv), prefetch)
    card.kernel("attn_prep").launch(
        grid, dims.head_dim, qg, np.int32(qg_stride), k, np.int32(k_stride),
        v, np.int32(v_stride), q_norm, k_norm, rope.inv_freq, positions, step, *slot_args(slots), q_out, k_dst, v_dst,
        np.int32(dims.n_head), np.int32(dims.n_head_kv), np.int32(rope.rope_dims), np.int32(rope.sec_h),
        np.int32(rope.sec_w), np.int32(capacity), np.float32(eps), np.int32(stage_rows), *prefetch.args(),
    )


# ---- fp16 cache (attention.cu) --------------------------------------------------------------------
def attn_decode_f16(card: CudaCard, dims: AttnDims, q: DeviceBuffer, k_cache: DeviceBuffer | None,
                    v_cache: DeviceBuffer | None, step: DeviceBuffer, parts: Partials, capacity: int, n_splits: int,
                    n_tokens: int = 1, slots: SlotRows | None = None) -> None:
    """Flash decode of n_tokens new tokens, each on its own (common.cuh's decode_block): a decode step, or
    a short verify whose token t then gets exactly the partials a one-token decode at pos + t would, or
    (`slots`, caches None) one token of each row's slot."""
    name, blocks, tail = _decode_launch("attn_decode", dims, F16_DECODE_GROUPS, n_splits)
    card.kernel(name).launch(
        (n_tokens, blocks), DECODE_THREADS, q, k_cache, v_cache, step, *slot_args(slots), *parts.args(),
        np.int32(capacity), np.int32(n_splits), dims.scale, *tail,
    )


def attn_prefill_f16(card: CudaCard, dims: AttnDims, q: DeviceBuffer, k_cache: DeviceBuffer, v_cache: DeviceBuffer,
                     step: DeviceBuffer, parts: Partials, n_tokens: int, capacity: int, n_splits: int) -> None:
    _check_shape(dims)
    q_tiles = -(-n_tokens * dims.group // PREFILL_ROWS)
    card.kernel(f"attn_prefill_d{dims.head_dim}").launch(
        q_tiles * dims.n_head_kv * n_splits, PREFILL_THREADS, q, k_cache, v_cache, step, *parts.args(),
        np.int32(n_tokens), np.int32(dims.n_head), np.int32(dims.n_head_kv), np.int32(capacity), np.int32(n_splits),
        dims.scale,
    )


def attn_merge_gate(card: CudaCard, dims: AttnDims, parts: Partials, n_tokens: int, n_splits: int, gate: DeviceBuffer,
                    gate_row_stride: int, gate_head_stride: int, y: DeviceBuffer | None,
                    yq: DeviceBuffer | None = None, yd: DeviceBuffer | None = None) -> None:
    """Merge the splits, apply sigmoid(gate); y fp32 [T][H*Dh] and/or Q8_1 (yq, yd) (attention.cu)."""
    card.kernel("attn_merge_gate").launch(
        n_tokens * dims.n_head, dims.head_dim, *parts.args(), np.int32(n_splits), gate, np.int32(gate_row_stride),
        np.int32(gate_head_stride), np.int32(dims.n_head), y, yq, yd,
    )


# ---- quantised cache (kv_cache.cu) ----------------------------------------------------------------
def kv_encode(card: CudaCard, side: KVSide, staging: DeviceBuffer, stage_rows: int, step: DeviceBuffer,
              n_tokens: int, n_head_kv: int, head_dim: int, capacity: int, tables: DeviceBuffer,
              slots: SlotRows | None = None) -> None:
    """Encode the batch's staged rows of one side into cache rows pos..pos+T-1 (pos from `step`). Slot-indexed,
    `side` only names the codec (any slot's side of this layer) and `slots.table` must start at this side's
    (codes, side) entry pair: the layer's table for K, 16 bytes into it for V (`side_rows`)."""
    if side.codec == FP16 or side.side is None:
        raise RigllmError("fp16 cache rows are written by attn_prep, not kv_encode")
    codes, planes = (side.codes, side.side) if slots is None else (None, None)
    card.kernel(f"kv_encode_{side.codec.name}").launch(
        n_tokens * n_head_kv, ENCODE_THREADS, staging, np.int32(stage_rows), step, *slot_args(slots), codes, planes,
        np.int32(n_head_kv), np.int32(head_dim), np.int32(capacity), tables,
    )


def side_rows(slots: SlotRows, value_side: bool) -> SlotRows:
    """`slots` for kv_encode of the K side (the layer's table as is) or the V side (its entries 2 and 3 first)."""
    if not value_side:
        return slots
    table, k_side_bytes = slots.table, 8 * KV_SLOT_PTRS // 2
    return SlotRows(slots.row_slot, table.view(k_side_bytes, table.nbytes - k_side_bytes))


def rotate_q(card: CudaCard, q: DeviceBuffer, q_rot: DeviceBuffer, n_rows: int, head_dim: int,
             tables: DeviceBuffer) -> None:
    """q [n_rows][Dh] → R q [n_rows][ceil(Dh/128)*128] (n_rows = T * n_head), for caches with rotated keys."""
    card.kernel("kv_rotate_q").launch(n_rows, ROTATE_THREADS, q, q_rot, np.int32(head_dim), tables)


def kv_decode(card: CudaCard, dims: AttnDims, q_domain: DeviceBuffer, cache: KVLayerCache, step: DeviceBuffer,
              parts: Partials, n_splits: int, tables: DeviceBuffer, n_tokens: int = 1,
              slots: SlotRows | None = None) -> None:
    """attn_decode_f16 over a quantised cache. Slot-indexed, `cache` only names the format and capacity (any
    slot's cache of this layer): each row reads its own slot's."""
    name, blocks, tail = _decode_launch(f"kv_decode_{kernel_format(cache.format)}", dims, KV_DECODE_GROUPS, n_splits)
    planes = ((cache.k.codes, cache.k.side, cache.v.codes, cache.v.side) if slots is None else (None,) * 4)
    card.kernel(name).launch(
        (n_tokens, blocks), DECODE_THREADS, q_domain, *planes, step, *slot_args(slots), *parts.args(),
        np.int32(cache.capacity), np.int32(n_splits), dims.scale, tables, *tail,
    )


def kv_prefill(card: CudaCard, dims: AttnDims, q_domain: DeviceBuffer, cache: KVLayerCache, step: DeviceBuffer,
               parts: Partials, n_tokens: int, n_splits: int, tables: DeviceBuffer) -> None:
    _check_shape(dims)
    q_tiles = -(-n_tokens * dims.group // PREFILL_ROWS)
    card.kernel(f"kv_prefill_{kernel_format(cache.format)}_d{dims.head_dim}").launch(
        q_tiles * dims.n_head_kv * n_splits, PREFILL_THREADS, q_domain, cache.k.codes, cache.k.side, cache.v.codes,
        cache.v.side, step, *parts.args(), np.int32(n_tokens), np.int32(dims.n_head), np.int32(dims.n_head_kv),
        np.int32(cache.capacity), np.int32(n_splits), dims.scale, tables,
    )
