"""Host side of the Gated DeltaNet kernels (`cuda_src/gdn.cu`): launch geometry, argument order, checks.

Per GDN layer and batch of T tokens a runner calls `gdn_mixer` (or its parts): the causal conv + SiLU,
which also advances the conv state; then either the recurrent kernel (decode, short verify batches: the
state stays in registers across the tokens) or the chunked form followed by the gated RMSNorm (prompt
chunks). One token per row (a decode token, a slot batch) takes a single launch: the recurrent kernel's
conv form does the conv of the channels each block reads. The result is y [T][Cv] fp32, optionally also
Q8_1 for the ssm_out GEMV. The state is a sequence's `GdnState` (engine.cuda.sequence): fp32 conv [Kc-1][Cc]
(oldest first) and recurrent [Hv][dk][dv]; zeroing and snapshots are that module's driver memsets and copies.

A speculative verify passes a `GdnRing`: the conv and recurrent kernels then also write the state after
each of the batch's first T-1 tokens, so accepting j of the drafts is a copy of ring slot j (`commit`)
instead of a re-run of the accepted tokens.

The four in-projection outputs can sit anywhere (a stacked GEMV output, an fp32 alpha/beta kernel's
buffer): each is a `Rows` view with its own row stride.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemv import Q8Activations
from engine.cuda.l2_prefetch import NO_PREFETCH, L2Prefetch
from engine.cuda.q8_layout import QK
from engine.cuda.sequence import GdnState
from engine.cuda.slot_batch import SlotRows, slot_args
from engine.gguf.config import ModelConfig

# Mirrors of the #defines in gdn.cu (a unit test checks them against the source).
CONV_K = 4  # GDN_CONV_K
CONV_TILE = 16  # GDN_CONV_TILE: tokens per conv thread
MAX_DK = 128  # GDN_MAX_DK
RECURRENT_THREADS = 256  # GDN_RECURRENT_THREADS
RECURRENT_COLS = 16  # GDN_RECURRENT_COLS: value columns per recurrent block
RECURRENT_BLOCKS_PER_SM = 4  # GDN_RECURRENT_MIN_BLOCKS: resident recurrent blocks per SM (both forms)
WIDE_COLS = 2 * RECURRENT_COLS  # value columns per gdn_recurrent_wide block
CHUNK_THREADS = 256  # GDN_CHUNK_THREADS
CHUNK_COLS = 32  # GDN_CHUNK_COLS: value columns per chunked-form block
CHUNK_SMEM_BYTES = 4 * 23168  # 4 * GDN_CHUNK_SMEM_FLOATS: above 48 KiB, so the launch opts in

CONV_THREADS = 128  # these two kernels work with any multiple of 32
NORM_THREADS = 128
F32 = 4
_MAX_GRID_YZ = 65535

# Batches up to this many tokens take the recurrent kernel, longer ones the chunked form. A first guess
# (the chunked form's fixed cost per 64-token chunk is about that of 8-16 recurrent tokens), to be
# replaced by the GPU benchmark's crossover.
RECURRENT_MAX_TOKENS = 8


@dataclass(frozen=True)
class GdnDims:
    """Head counts and dims of a GDN layer (spec notation), checked against what the kernels support."""

    n_k_heads: int  # Hk
    n_v_heads: int  # Hv
    d_k: int  # dk
    d_v: int  # dv

    def __post_init__(self) -> None:
        if min(self.n_k_heads, self.n_v_heads, self.d_k, self.d_v) < 1 or self.n_v_heads % self.n_k_heads:
            raise ValueError(f"GDN heads Hk={self.n_k_heads}, Hv={self.n_v_heads}: Hv must be a multiple of Hk")
        if self.d_k > MAX_DK:
            raise ValueError(f"GDN key head dim {self.d_k} > {MAX_DK}, the most the delta-rule kernels hold")

    @classmethod
    def from_config(cls, cfg: ModelConfig) -> "GdnDims":
        if cfg.ssm_conv_kernel != CONV_K:
            raise ValueError(f"GDN conv width {cfg.ssm_conv_kernel}: the conv kernel is built for {CONV_K}")
        return cls(cfg.ssm_n_k_heads, cfg.ssm_n_v_heads, cfg.ssm_d_state, cfg.ssm_d_head_v)

    @property
    def ck(self) -> int:
        return self.n_k_heads * self.d_k

    @property
    def cv(self) -> int:
        return self.n_v_heads * self.d_v

    @property
    def cc(self) -> int:
        return 2 * self.ck + self.cv


class GdnConstants(Protocol):
    """The small fp32 tensors of a GDN layer on the device; `engine.cuda.weights.GdnWeights` is one."""

    @property
    def conv_w(self) -> DeviceBuffer: ...  # [Cc][Kc]

    @property
    def ssm_a(self) -> DeviceBuffer: ...  # [Hv], already -exp(A_log)

    @property
    def dt_bias(self) -> DeviceBuffer: ...  # [Hv]

    @property
    def ssm_norm(self) -> DeviceBuffer: ...  # [dv]


def counter_count(dims: GdnDims, rows: int = 1) -> int:
    """uint32 arrival counters a recurrent launch of `rows` slot rows uses: per row, one per value head (the gated
    norm's) and one per key head (the fused conv's state advance), gdn.cu's [rows][Hv + Hk]."""
    return (dims.n_v_heads + dims.n_k_heads) * rows


def alloc_head_counters(card: CudaCard, dims: GdnDims, label: str, rows: int = 1) -> DeviceBuffer:
    """The recurrent kernels' arrival counters (`counter_count`, zeroed; every launch leaves them zero): one set
    per row of a slot-indexed launch. Launches that share them must not run concurrently: give each stream its
    own."""
    counters = card.alloc(4 * counter_count(dims, rows), label)
    counters.fill_zero()
    return counters


@dataclass(frozen=True)
class Rows:
    """A [T][width] fp32 matrix in a buffer: row t starts `stride` floats after row t - 1."""

    buf: DeviceBuffer
    stride: int

    def check(self, what: str, width: int, n_tokens: int) -> None:
        if self.stride < width or self.buf.nbytes < F32 * (self.stride * (n_tokens - 1) + width):
            raise ValueError(
                f"{what}: {self.buf.nbytes} bytes at row stride {self.stride} cannot hold {n_tokens} rows of {width}"
            )


@dataclass(frozen=True)
class GdnInputs:
    """The in-projection outputs of a batch: mix [T][Cc] (raw attn_qkv), z [T][Cv], b and alpha [T][Hv]."""

    mix: Rows
    z: Rows
    b: Rows
    alpha: Rows

    def check(self, dims: GdnDims, n_tokens: int) -> None:
        for what, rows, width in (("mix", self.mix, dims.cc), ("z", self.z, dims.cv), ("b", self.b, dims.n_v_heads),
                                  ("alpha", self.alpha, dims.n_v_heads)):
            rows.check(what, width, n_tokens)


@dataclass(frozen=True)
class GdnRing:
    """One layer's states after each of a verify's first `slots` tokens: conv [slots][Kc-1][Cc], recurrent
    [slots][Hv][dk][dv] (fp32, the layouts of `GdnState`)."""

    conv: DeviceBuffer
    recurrent: DeviceBuffer
    slots: int

    def check(self, state: GdnState, n_tokens: int) -> None:
        if n_tokens - 1 > self.slots or n_tokens > CONV_TILE:
            raise ValueError(f"a ring of {self.slots} slots holds the states of a verify of at most "
                             f"{min(self.slots + 1, CONV_TILE)} tokens, not {n_tokens}")
        _check_out("conv ring", self.conv, self.slots * state.conv.nbytes)
        _check_out("recurrent ring", self.recurrent, self.slots * state.recurrent.nbytes)

    def commit(self, state: GdnState, slot: int, stream: Stream | None = None) -> None:
        """Make the state after token `slot` (0-based) of the last verify the current one (device copies)."""
        if not 0 <= slot < self.slots:
            raise ValueError(f"ring slot {slot} outside 0..{self.slots - 1}")
        for dst, ring in ((state.conv, self.conv), (state.recurrent, self.recurrent)):
            dst.copy_from(ring.view(slot * dst.nbytes, dst.nbytes), stream=stream)


def alloc_gdn_ring(card: CudaCard, state: GdnState, slots: int, label: str) -> GdnRing:
    """A ring of `slots` states shaped like `state`."""
    if slots < 1:
        raise ValueError(f"a GDN ring needs at least one slot, not {slots}")
    return GdnRing(card.alloc(slots * state.conv.nbytes, f"{label}.conv"),
                   card.alloc(slots * state.recurrent.nbytes, f"{label}.rec"), slots)


def _check_tokens(n_tokens: int) -> None:
    if not 1 <= n_tokens <= CONV_TILE * _MAX_GRID_YZ:
        raise ValueError(f"a GDN batch holds 1..{CONV_TILE * _MAX_GRID_YZ} tokens, not {n_tokens}")


def _check_out(what: str, buf: DeviceBuffer, nbytes: int) -> None:
    if buf.nbytes < nbytes:
        raise ValueError(f"{what} buffer of {buf.nbytes} bytes < {nbytes} needed")


def _q8_args(
    dims: GdnDims, y_q8: Q8Activations | None, n_tokens: int
) -> tuple[DeviceBuffer | None, DeviceBuffer | None]:
    """(xq, xd) for the kernels' optional Q8_1 output (null pointers when not asked for)."""
    if y_q8 is None:
        return None, None
    if dims.d_v % QK or y_q8.k != dims.cv or n_tokens > y_q8.max_tokens:
        raise ValueError(
            f"Q8_1 output needs dv % {QK} == 0 (dv={dims.d_v}) and room for {n_tokens} rows of {dims.cv} "
            f"(has {y_q8.max_tokens} of {y_q8.k}); quantize y with quantize_q8_1 instead"
        )
    return y_q8.xq, y_q8.xd


def _one_state(state: GdnState | None, slots: SlotRows | None, ring: GdnRing | None) -> None:
    """A launch continues either one sequence's `state` or, slot-indexed, one state per row (no ring)."""
    if (state is None) == (slots is None) or (slots is not None and ring is not None):
        raise ValueError("a GDN launch takes one sequence's state, or slot rows (without a ring)")


def gdn_conv_silu(
    card: CudaCard, dims: GdnDims, weights: GdnConstants, state: GdnState | None, mix: Rows, conv_out: DeviceBuffer,
    n_tokens: int, stream: Stream | None = None, ring: GdnRing | None = None, slots: SlotRows | None = None,
) -> None:
    """conv_out [T][Cc] = SiLU(causal conv of mix after the conv state); the conv state advances by T rows
    (and `ring` gets the states after the first T-1 of them). With `slots` (engine.cuda.slot_batch) row t
    is instead the one new token of its slot's sequence, whose own conv state advances."""
    _check_tokens(n_tokens)
    _one_state(state, slots, ring)
    if ring is not None:
        ring.check(state, n_tokens)
    mix.check("mix", dims.cc, n_tokens)
    _check_out("conv output", conv_out, F32 * n_tokens * dims.cc)
    blocks = -(-dims.cc // CONV_THREADS)
    grid = (blocks, 1, n_tokens) if slots is not None else (blocks, -(-n_tokens // CONV_TILE))
    card.kernel("gdn_conv_silu").launch(
        grid, CONV_THREADS, mix.buf, np.int64(mix.stride), weights.conv_w, state.conv if state else None, conv_out,
        np.int32(dims.cc), np.int32(1 if slots is not None else n_tokens), ring.conv if ring is not None else None,
        *slot_args(slots), stream=stream,
    )


def recurrent_form(card: CudaCard, dims: GdnDims, slot_rows: int | None, conv: bool = False) -> tuple[str, int]:
    """The recurrent kernel for a slot batch of `slot_rows` rows (None: one sequence's tokens) and its columns per
    block; `conv`: its form that also does the conv of a one-token row (gdn.cu gdn_recurrent_conv). The narrow form
    spreads a row's state over the most blocks, which suits one wave; once a slot batch's narrow blocks exceed one
    wave of the card (8 rows of the 9B: 2,048 blocks against the H200's 528 resident), the wide form's half as
    many blocks of twice the columns run in half the waves. Both give the same bits (gdn.cu). One sequence (a
    decode token, a verify with its ring) keeps the narrow form on every card: the wide form was measured and
    tested on slot batches only."""
    name = "gdn_recurrent_conv" if conv else "gdn_recurrent"
    narrow_blocks = dims.n_v_heads * -(-dims.d_v // RECURRENT_COLS) * (slot_rows or 0)
    if narrow_blocks > RECURRENT_BLOCKS_PER_SM * card.sm_count:
        return f"{name}_wide", WIDE_COLS
    return name, RECURRENT_COLS


def gdn_recurrent(
    card: CudaCard, dims: GdnDims, weights: GdnConstants, state: GdnState | None, conv_out: DeviceBuffer | None,
    inputs: GdnInputs, y: DeviceBuffer, counters: DeviceBuffer, n_tokens: int, eps: float,
    y_q8: Q8Activations | None = None, stream: Stream | None = None, ring: GdnRing | None = None,
    slots: SlotRows | None = None, prefetch: L2Prefetch = NO_PREFETCH,
) -> None:
    """Token-by-token delta rule + gated norm (rms eps `eps`): y [T][Cv] (and its Q8_1 copy); the recurrent
    state advances (and `ring` gets the states after the first T-1 tokens). With `slots` row t is the one
    new token of its slot's sequence (its own state; `counters` then holds T sets of counters). `prefetch`: the
    out projection's leading weight bytes (engine.cuda.l2_prefetch).

    `conv_out` None: the kernel also does the conv + SiLU of the rows' tokens from `inputs.mix` and advances the
    conv state, as gdn_conv_silu would (gdn_recurrent_conv, same bits, one launch instead of two): for one token
    per row only (a decode token, or slot rows), never with a ring."""
    _check_tokens(n_tokens)
    _one_state(state, slots, ring)
    if ring is not None:
        ring.check(state, n_tokens)
    inputs.check(dims, n_tokens)
    conv = conv_out is None
    if conv and (ring is not None or (slots is None and n_tokens != 1)):
        raise ValueError("the recurrent kernel does the conv for one token per row, without a ring; "
                         f"run gdn_conv_silu first for {n_tokens} tokens of one sequence")
    if not conv:
        _check_out("conv output", conv_out, F32 * n_tokens * dims.cc)
    _check_out("y", y, F32 * n_tokens * dims.cv)
    _check_out("counters", counters, 4 * counter_count(dims, n_tokens if slots is not None else 1))
    yq, yd = _q8_args(dims, y_q8, n_tokens)
    name, cols = recurrent_form(card, dims, n_tokens if slots is not None else None, conv)
    grid = (dims.n_v_heads, -(-dims.d_v // cols)) + ((n_tokens,) if slots is not None else ())
    conv_args = ((inputs.mix.buf, np.int64(inputs.mix.stride), weights.conv_w, state.conv if state else None)
                 if conv else (None, np.int64(0), None, None))
    card.kernel(name).launch(
        grid, RECURRENT_THREADS, conv_out, *conv_args, inputs.z.buf,
        np.int64(inputs.z.stride), inputs.b.buf, np.int64(inputs.b.stride), inputs.alpha.buf,
        np.int64(inputs.alpha.stride), weights.ssm_a, weights.dt_bias, weights.ssm_norm,
        state.recurrent if state else None, y, yq, yd, counters, np.int32(1 if slots is not None else n_tokens),
        np.int32(dims.n_k_heads), np.int32(dims.n_v_heads), np.int32(dims.d_k), np.int32(dims.d_v), np.float32(eps),
        ring.recurrent if ring is not None else None, *slot_args(slots), *prefetch.args(), stream=stream,
    )


def gdn_chunk_prefill(
    card: CudaCard, dims: GdnDims, weights: GdnConstants, state: GdnState, conv_out: DeviceBuffer,
    inputs: GdnInputs, o: DeviceBuffer, n_tokens: int, stream: Stream | None = None,
) -> None:
    """Chunked delta rule (spec §6.8) from the cached state: raw outputs o [T][Cv]; the recurrent state advances."""
    _check_tokens(n_tokens)
    inputs.check(dims, n_tokens)
    _check_out("conv output", conv_out, F32 * n_tokens * dims.cc)
    _check_out("o", o, F32 * n_tokens * dims.cv)
    kernel = card.kernel("gdn_chunk_prefill")
    kernel.set_max_dynamic_shared(CHUNK_SMEM_BYTES)
    kernel.launch(
        (dims.n_v_heads, -(-dims.d_v // CHUNK_COLS)), CHUNK_THREADS, conv_out, inputs.b.buf, np.int64(inputs.b.stride),
        inputs.alpha.buf, np.int64(inputs.alpha.stride), weights.ssm_a, weights.dt_bias, state.recurrent, o,
        np.int64(dims.cv), np.int32(n_tokens), np.int32(dims.n_k_heads), np.int32(dims.n_v_heads),
        np.int32(dims.d_k), np.int32(dims.d_v), shared=CHUNK_SMEM_BYTES, stream=stream,
    )


def gdn_gated_norm(
    card: CudaCard, dims: GdnDims, weights: GdnConstants, o: DeviceBuffer, z: Rows, y: DeviceBuffer, n_tokens: int,
    eps: float, y_q8: Q8Activations | None = None, stream: Stream | None = None,
) -> None:
    """y [T][Cv] = rmsnorm(o, eps) * silu(z) per value head (and its Q8_1 copy); y may be o itself."""
    _check_tokens(n_tokens)
    z.check("z", dims.cv, n_tokens)
    _check_out("o", o, F32 * n_tokens * dims.cv)
    _check_out("y", y, F32 * n_tokens * dims.cv)
    yq, yd = _q8_args(dims, y_q8, n_tokens)
    card.kernel("gdn_gated_norm").launch(
        n_tokens * dims.n_v_heads, NORM_THREADS, o, np.int64(dims.cv), z.buf, np.int64(z.stride), weights.ssm_norm, y,
        np.int64(dims.cv), yq, yd, np.int32(dims.n_v_heads), np.int32(dims.d_v), np.float32(eps),
        stream=stream,
    )


def gdn_mixer(
    card: CudaCard, dims: GdnDims, weights: GdnConstants, state: GdnState | None, inputs: GdnInputs,
    conv_out: DeviceBuffer, y: DeviceBuffer, counters: DeviceBuffer, n_tokens: int, eps: float,
    y_q8: Q8Activations | None = None, recurrent: bool | None = None, stream: Stream | None = None,
    ring: GdnRing | None = None, slots: SlotRows | None = None, fuse_conv: bool = True,
    prefetch: L2Prefetch = NO_PREFETCH,
) -> None:
    """Spec §6.7 steps 2-8 for a batch, continuing `state`: conv, delta rule, gated norm into y [T][Cv]
    (and its Q8_1 copy, the ssm_out GEMV's input). `eps` is the model's rms_eps.

    `recurrent` picks the delta-rule form (default: recurrent up to RECURRENT_MAX_TOKENS tokens); both are
    the same function of the inputs and the state, so the choice is only about speed. `ring` (speculative
    verify) keeps the per-token states and needs the recurrent form, as do `slots` (a slot-indexed step:
    each row continues its own slot's state instead of `state`). One token per row without a ring (a decode
    token, slot rows) takes one launch, the recurrent kernel doing the conv too, unless `fuse_conv` is False
    (the tests' two-launch baseline: the same bits). `prefetch` goes to the recurrent kernel (the chunked form
    runs for prefill chunks, which do not prefetch).
    """
    use_recurrent = n_tokens <= RECURRENT_MAX_TOKENS if recurrent is None else recurrent
    if (ring is not None or slots is not None) and not use_recurrent:
        raise ValueError("per-token states (a GDN ring) and slot-indexed rows need the recurrent form")
    if use_recurrent and fuse_conv and ring is None and (slots is not None or n_tokens == 1):
        gdn_recurrent(card, dims, weights, state, None, inputs, y, counters, n_tokens, eps, y_q8, stream, None, slots,
                      prefetch)
        return
    gdn_conv_silu(card, dims, weights, state, inputs.mix, conv_out, n_tokens, stream, ring, slots)
    if use_recurrent:
        gdn_recurrent(card, dims, weights, state, conv_out, inputs, y, counters, n_tokens, eps, y_q8, stream, ring,
                      slots, prefetch)
    else:
        gdn_chunk_prefill(card, dims, weights, state, conv_out, inputs, y, n_tokens, stream)
        gdn_gated_norm(card, dims, weights, y, inputs.z, y, n_tokens, eps, y_q8, stream)

