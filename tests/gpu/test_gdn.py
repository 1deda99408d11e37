"""Gated DeltaNet kernels (cuda_src/gdn.cu, launched through engine.cuda.gdn) against the numpy reference.

The reference is the mixer itself, `engine.reference.gated_deltanet.gated_deltanet`, fed the projection
rows a test draws (stand-ins for its `Linear`s), so the kernels are held to exactly what the CPU backend
computes: conv + SiLU with the conv state, L2 norms, gates, head pairing, the recurrent step or the
chunked form, and the gated RMSNorm. On the device the four projections sit side by side in one stacked
buffer with spare columns, so the row strides are exercised. Inputs are fresh random draws seeded from
the test id.

Tolerance: the kernels are fp32 with another summation order than numpy, so outputs and states must agree
within TOL = 1e-4 of the largest reference magnitude of the compared array (any NaN fails); a CPU
emulation of these kernels lands within 5e-7 of that scale, while a wrong index or formula is off by
order 1. The optional Q8_1 outputs must equal quantize_q8_1 of the fp32 output the kernel wrote, bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest

from engine.cuda.driver import DeviceBuffer
from engine.cuda.gdn import (
    CONV_K,
    RECURRENT_BLOCKS_PER_SM,
    RECURRENT_COLS,
    GdnDims,
    GdnInputs,
    Rows,
    alloc_head_counters,
    counter_count,
    gdn_conv_silu,
    gdn_mixer,
    recurrent_form,
)
from engine.cuda.gemv import alloc_q8_activations
from engine.cuda.q8_layout import quantize_q8_1
from engine.cuda.sequence import GdnState
from engine.cuda.slot_batch import SlotRows
from engine.gguf.config import ModelConfig
from engine.reference.activations import silu
from engine.reference.gated_deltanet import GdnWeights, causal_conv, gated_deltanet
from engine.reference.state import GdnLayerState
from tests.gpu.gpu_fixtures import assert_equal, assert_within

TOL = 1e-4
F32 = 4

SMALL = GdnDims(n_k_heads=2, n_v_heads=6, d_k=128, d_v=128)
SHAPE_9B = GdnDims(n_k_heads=16, n_v_heads=32, d_k=128, d_v=128)
SHAPE_27B = GdnDims(n_k_heads=16, n_v_heads=48, d_k=128, d_v=128)
TINY = GdnDims(n_k_heads=2, n_v_heads=6, d_k=16, d_v=8)  # head dims of the tiny test models
ODD = GdnDims(n_k_heads=3, n_v_heads=6, d_k=40, d_v=72)  # dims that are no multiple of any tile
NAMES = {SMALL: "small", SHAPE_9B: "9b", SHAPE_27B: "27b", TINY: "tiny_dk16_dv8", ODD: "odd_dk40_dv72"}


def shapes(*dims: GdnDims) -> list:
    return [pytest.param(d, id=NAMES[d]) for d in dims]


@dataclass(frozen=True)
class Layer:
    """Per-layer constants, drawn like a real checkpoint's (ssm_a in [-16, -1], dt in [1e-3, 0.1])."""

    dims: GdnDims
    conv_w: np.ndarray  # [Cc, 4]
    ssm_a: np.ndarray  # [Hv]
    dt_bias: np.ndarray  # [Hv]
    norm_w: np.ndarray  # [dv]
    eps: float = 1e-6


def random_layer(dims: GdnDims, rng: np.random.Generator) -> Layer:
    dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), dims.n_v_heads))
    return Layer(
        dims=dims,
        conv_w=rng.normal(0.0, 0.5, (dims.cc, CONV_K)).astype(np.float32),
        ssm_a=(-np.exp(rng.uniform(0.0, np.log(16.0), dims.n_v_heads))).astype(np.float32),
        dt_bias=(dt + np.log(-np.expm1(-dt))).astype(np.float32),  # inverse softplus of dt
        norm_w=(1.0 + 0.1 * rng.standard_normal(dims.d_v)).astype(np.float32),
    )


PARTS = ("mix", "z", "b", "alpha")


@dataclass(frozen=True)
class Projections:
    """The four in-projection outputs of T tokens side by side in one matrix [T, width]: mix | z | b | alpha."""

    dims: GdnDims
    stacked: np.ndarray

    @property
    def n_tokens(self) -> int:
        return self.stacked.shape[0]

    def column(self, part: str) -> int:
        d = self.dims
        return {"mix": 0, "z": d.cc, "b": d.cc + d.cv, "alpha": d.cc + d.cv + d.n_v_heads}[part]

    def on_card(self, card) -> GdnInputs:
        """The rows uploaded as one stacked buffer, each part a view of it at the stacked row stride."""
        stacked = card.upload(self.stacked, "test.gdn.proj")
        width = self.stacked.shape[1]
        return GdnInputs(**{p: Rows(stacked.view(F32 * self.column(p), stacked.nbytes - F32 * self.column(p)), width)
                            for p in PARTS})

    def part(self, part: str) -> np.ndarray:
        width = {"mix": self.dims.cc, "z": self.dims.cv, "b": self.dims.n_v_heads, "alpha": self.dims.n_v_heads}[part]
        return np.ascontiguousarray(self.stacked[:, self.column(part) : self.column(part) + width])


def random_projections(dims: GdnDims, n_tok: int, rng: np.random.Generator) -> Projections:
    """N(0, 1) projections; value head 0 gets alpha ~ N(0, 15), which crosses the softplus threshold of 20
    (tiny decays) and reaches decays near 1. Five spare columns keep the row stride off any natural width."""
    stacked = rng.standard_normal((n_tok, dims.cc + dims.cv + 2 * dims.n_v_heads + 5)).astype(np.float32)
    stacked[:, dims.cc + dims.cv + dims.n_v_heads] *= 15.0
    return Projections(dims, stacked)


def random_state(dims: GdnDims, rng: np.random.Generator, zero: bool = False) -> GdnLayerState:
    conv = np.zeros((CONV_K - 1, dims.cc), np.float32)
    recurrent = np.zeros((dims.n_v_heads, dims.d_k, dims.d_v), np.float32)
    if not zero:
        conv = rng.standard_normal(conv.shape).astype(np.float32)
        recurrent = rng.standard_normal(recurrent.shape).astype(np.float32)
    return GdnLayerState(conv=conv, recurrent=recurrent)


class _Given:
    """Stands in for one `Linear` of the reference mixer: returns the projection rows the test drew."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __call__(self, _x: np.ndarray) -> np.ndarray:
        return self.rows


def _config(dims: GdnDims, eps: float) -> ModelConfig:
    """A ModelConfig with this GDN shape; the mixer reads only the ssm_* fields and rms_eps."""
    return ModelConfig(
        d_model=1, d_ff=1, n_layers=1, n_mtp=0, n_head=1, n_head_kv=1, head_dim=1, rope_dims=0,
        rope_sections=(0, 0, 0, 0), rope_theta=1.0, rms_eps=eps, context_length=1, ssm_conv_kernel=CONV_K,
        ssm_d_state=dims.d_k, ssm_n_k_heads=dims.n_k_heads, ssm_n_v_heads=dims.n_v_heads, ssm_d_inner=dims.cv,
        vocab_size=1, tied_embeddings=True,
    )


def reference_step(layer: Layer, proj: Projections, state: GdnLayerState) -> np.ndarray:
    """The reference mixer's gated-norm output y [T, Cv] (before ssm_out); updates `state` in place."""
    weights = GdnWeights(
        qkv=_Given(proj.part("mix")), gate=_Given(proj.part("z")), beta=_Given(proj.part("b")),
        alpha=_Given(proj.part("alpha")), out=lambda y: y, conv=layer.conv_w, dt_bias=layer.dt_bias,
        a=layer.ssm_a, norm=layer.norm_w,
    )
    return gated_deltanet(weights, _config(layer.dims, layer.eps), np.zeros((proj.n_tokens, 0), np.float32), state)


@dataclass(frozen=True)
class DeviceConstants:
    """A layer's small fp32 tensors on the card (the `GdnConstants` the launchers read)."""

    conv_w: DeviceBuffer
    ssm_a: DeviceBuffer
    dt_bias: DeviceBuffer
    ssm_norm: DeviceBuffer

    @classmethod
    def upload(cls, card, layer: Layer) -> "DeviceConstants":
        return cls(*(card.upload(a, f"test.gdn.{name}") for name, a in (
            ("conv_w", layer.conv_w), ("ssm_a", layer.ssm_a), ("dt_bias", layer.dt_bias), ("ssm_norm", layer.norm_w))))


def assert_close(got: np.ndarray, want: np.ndarray, what: str) -> None:
    """Max abs error within TOL x max|want|."""
    assert_within(got, want, TOL * max(float(np.max(np.abs(want))), 1e-30), what)


class DeviceGdn:
    """One GDN layer on the card with one sequence's state, stepped through `gdn_mixer` as a runner does."""

    def __init__(self, card, layer: Layer, state: GdnLayerState):
        d = layer.dims
        self.card, self.layer, self.dims = card, layer, d
        self.weights = DeviceConstants.upload(card, layer)
        self.state = GdnState(conv=card.upload(state.conv, "test.gdn.conv"),
                              recurrent=card.upload(state.recurrent, "test.gdn.recurrent"))
        self.counters = alloc_head_counters(card, d, "test.gdn.counters")
        self.last_q8: tuple[np.ndarray, np.ndarray] | None = None  # (xq, xd) of the last step, when asked

    def step(self, proj: Projections, recurrent: bool | None = None, q8: bool = False, ring=None,
             fuse_conv: bool = True) -> np.ndarray:
        """Run T tokens; returns y [T, Cv]. `recurrent` picks the form (default: gdn_mixer's choice); `q8`
        also asks for the Q8_1 copy of y, left in `last_q8`; `ring` keeps the per-token states (a verify);
        `fuse_conv` False keeps a one-token step on two launches (conv, then the recurrence)."""
        d, card, n_tok = self.dims, self.card, proj.n_tokens
        inputs = proj.on_card(card)
        conv_out = card.alloc(F32 * n_tok * d.cc, "test.gdn.conv_out")
        y = card.alloc(F32 * n_tok * d.cv, "test.gdn.y")
        y_q8 = alloc_q8_activations(card, d.cv, n_tok, "test.gdn.y_q8") if q8 else None
        gdn_mixer(card, d, self.weights, self.state, inputs, conv_out, y, self.counters, n_tok, self.layer.eps, y_q8,
                  recurrent, ring=ring, fuse_conv=fuse_conv)
        card.synchronize()
        if y_q8 is not None:
            self.last_q8 = (y_q8.xq.download(np.int8, (n_tok, d.cv)), y_q8.xd.download(np.float32, (n_tok, d.cv // 32)))
        return y.download(np.float32, (n_tok, d.cv))

    def states(self) -> GdnLayerState:
        d = self.dims
        return GdnLayerState(
            conv=self.state.conv.download(np.float32, (CONV_K - 1, d.cc)),
            recurrent=self.state.recurrent.download(np.float32, (d.n_v_heads, d.d_k, d.d_v)),
        )


def assert_states_close(got: GdnLayerState, want: GdnLayerState, what: str) -> None:
    assert_close(got.conv, want.conv, f"{what}: conv state")
    assert_close(got.recurrent, want.recurrent, f"{what}: recurrent state")


def run_and_compare(dev: DeviceGdn, ref_state: GdnLayerState, proj: Projections, what: str,
                    recurrent: bool | None = None, q8: bool = False) -> np.ndarray:
    """One step on the device and in the reference (same inputs, same carried state); returns device y."""
    got = dev.step(proj, recurrent, q8)
    want = reference_step(dev.layer, proj, ref_state)
    assert_close(got, want, f"{what}: y")
    if q8:
        xq, xd = quantize_q8_1(got)
        assert_equal(dev.last_q8[0], xq, f"{what}: Q8_1 values of y")
        assert_equal(dev.last_q8[1], xd, f"{what}: Q8_1 scales of y")
    return got


# ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n_tok", [1, 2, 3, 5, 64])
def test_conv_silu_carries_the_state(card, rng, n_tok):
    """Two batches of T tokens after a random conv state: outputs and the state after each batch."""
    dims = GdnDims(n_k_heads=1, n_v_heads=1, d_k=100, d_v=133)  # Cc = 333: no multiple of the block
    layer = random_layer(dims, rng)
    weights = DeviceConstants.upload(card, layer)
    want_state = rng.standard_normal((CONV_K - 1, dims.cc)).astype(np.float32)
    state = GdnState(conv=card.upload(want_state, "conv.state"), recurrent=card.alloc(F32, "conv.unused"))
    stride = dims.cc + 8
    for batch in range(2):
        rows = rng.standard_normal((n_tok, stride)).astype(np.float32)
        out = card.alloc(F32 * n_tok * dims.cc, "conv.out")
        gdn_conv_silu(card, dims, weights, state, Rows(card.upload(rows, "conv.mix"), stride), out, n_tok)
        card.synchronize()
        conv, want_state = causal_conv(np.ascontiguousarray(rows[:, : dims.cc]), want_state, layer.conv_w)
        assert_close(out.download(np.float32, (n_tok, dims.cc)), silu(conv), f"batch {batch}: conv output")
        assert_close(state.conv.download(np.float32, (CONV_K - 1, dims.cc)), want_state, f"batch {batch}: conv state")


@pytest.mark.parametrize("dims", shapes(SMALL, SHAPE_9B, SHAPE_27B, TINY, ODD))
def test_decode_steps_carry_the_state(card, rng, dims):
    """Ten consecutive decode tokens from a random state: y (and its Q8_1 copy where dv % 32 == 0) every
    step, both states at the end, and the arrival counters back at zero."""
    layer = random_layer(dims, rng)
    ref_state = random_state(dims, rng)
    dev = DeviceGdn(card, layer, ref_state)
    for t in range(10):
        proj = random_projections(dims, 1, rng)
        run_and_compare(dev, ref_state, proj, f"{NAMES[dims]} token {t}", q8=dims.d_v % 32 == 0)
    assert_states_close(dev.states(), ref_state, NAMES[dims])
    counters = dev.counters.download(np.uint32, counter_count(dims))
    assert_equal(counters, np.zeros(counter_count(dims), np.uint32), "arrival counters")


@pytest.mark.parametrize("dims", shapes(SMALL, SHAPE_9B, SHAPE_27B, TINY, ODD))
def test_one_launch_decode_equals_conv_then_recurrence(card, rng, dims):
    """Issue 30: a decode token's one launch (gdn_recurrent_conv: the conv done by the blocks that read it, the
    q/k channels' state advanced by the last reader of their key head) against the two launches, from the same
    random state, five tokens: y, its Q8_1 copy, both states and the counters, bit for bit."""
    layer = random_layer(dims, rng)
    start = random_state(dims, rng)
    fused, split = DeviceGdn(card, layer, start), DeviceGdn(card, layer, start)
    q8 = dims.d_v % 32 == 0
    for t in range(5):
        proj = random_projections(dims, 1, rng)
        assert_equal(fused.step(proj, q8=q8), split.step(proj, q8=q8, fuse_conv=False), f"{NAMES[dims]} token {t}: y")
        if q8:
            assert_equal(fused.last_q8[0], split.last_q8[0], f"token {t}: Q8_1 values")
            assert_equal(fused.last_q8[1], split.last_q8[1], f"token {t}: Q8_1 scales")
    mine, theirs = fused.states(), split.states()
    assert_equal(mine.conv, theirs.conv, "conv state")
    assert_equal(mine.recurrent, theirs.recurrent, "recurrent state")
    assert_equal(fused.counters.download(np.uint32, counter_count(dims)), np.zeros(counter_count(dims), np.uint32),
                 "arrival counters")


@pytest.mark.parametrize("dims", shapes(SMALL, ODD))
def test_recurrent_kernel_on_short_batches(card, rng, dims):
    """Verify-sized batches (3, 2 and 5 tokens) through the recurrent kernel, continuing one state; the
    reference takes its chunked path for them (the two forms are the same function)."""
    layer = random_layer(dims, rng)
    ref_state = random_state(dims, rng)
    dev = DeviceGdn(card, layer, ref_state)
    for n_tok in (3, 2, 5):
        proj = random_projections(dims, n_tok, rng)
        run_and_compare(dev, ref_state, proj, f"batch of {n_tok}", recurrent=True, q8=dims.d_v % 32 == 0)
    assert_states_close(dev.states(), ref_state, NAMES[dims])


@pytest.mark.parametrize("initial", ["zero", "random"])
@pytest.mark.parametrize("n_tok", [1, 63, 64, 65, 200])
def test_chunked_prefill(card, rng, n_tok, initial):
    """The chunked form over T tokens (tail chunk padded) from a zero or a carried state, Q8_1 copy too."""
    layer = random_layer(SMALL, rng)
    ref_state = random_state(SMALL, rng, zero=initial == "zero")
    dev = DeviceGdn(card, layer, ref_state)
    proj = random_projections(SMALL, n_tok, rng)
    run_and_compare(dev, ref_state, proj, f"T={n_tok} from {initial}", recurrent=False, q8=True)
    assert_states_close(dev.states(), ref_state, f"T={n_tok} from {initial}")


@pytest.mark.parametrize("dims", shapes(SHAPE_9B, TINY, ODD))
def test_chunked_prefill_shapes(card, rng, dims):
    """Two prompt chunks (130 then 70 tokens, the second continuing the first's state) on other shapes."""
    layer = random_layer(dims, rng)
    ref_state = random_state(dims, rng)
    dev = DeviceGdn(card, layer, ref_state)
    for i, n_tok in enumerate((130, 70)):
        proj = random_projections(dims, n_tok, rng)
        run_and_compare(dev, ref_state, proj, f"{NAMES[dims]} prompt chunk {i}", recurrent=False)
    assert_states_close(dev.states(), ref_state, NAMES[dims])


def test_prefill_then_decode_equals_decode_only(card, rng):
    """A prompt in two chunks (70 + 30 tokens) then 5 decode tokens, against the same 105 tokens decoded one
    by one on the device: same outputs for the decoded tokens, same final states, and both match the
    reference."""
    layer = random_layer(SMALL, rng)
    start = random_state(SMALL, rng, zero=True)
    tokens = random_projections(SMALL, 105, rng)

    def rows(lo: int, hi: int) -> Projections:
        return Projections(SMALL, tokens.stacked[lo:hi])

    ref_state = GdnLayerState(start.conv.copy(), start.recurrent.copy())
    chunked = DeviceGdn(card, layer, start)
    split = [(0, 70), (70, 100)] + [(t, t + 1) for t in range(100, 105)]
    chunked_tail = [run_and_compare(chunked, ref_state, rows(lo, hi), f"tokens {lo}:{hi}") for lo, hi in split][-5:]

    one_by_one = DeviceGdn(card, layer, start)
    decoded = [one_by_one.step(rows(t, t + 1)) for t in range(105)][-5:]
    for t, (a, b) in enumerate(zip(chunked_tail, decoded)):
        assert_close(a, b, f"decode token {100 + t}: prefill-then-decode vs decode-only")
    assert_states_close(chunked.states(), one_by_one.states(), "prefill-then-decode vs decode-only")
    assert_states_close(chunked.states(), ref_state, "prefill-then-decode vs reference")


def test_restored_state_replays_bit_for_bit(card, rng):
    """Prefill, snapshot the state (device copies), decode three tokens, restore, decode them again: the
    outputs and states repeat bit for bit, so the kernels keep nothing outside the state buffers (what
    speculative rollback and prefix reuse rely on)."""
    layer = random_layer(SMALL, rng)
    dev = DeviceGdn(card, layer, random_state(SMALL, rng, zero=True))
    dev.step(random_projections(SMALL, 40, rng))
    snapshot = GdnState(conv=card.alloc(dev.state.conv.nbytes, "test.gdn.snap.conv"),
                        recurrent=card.alloc(dev.state.recurrent.nbytes, "test.gdn.snap.recurrent"))
    snapshot.conv.copy_from(dev.state.conv)
    snapshot.recurrent.copy_from(dev.state.recurrent)
    drafts = [random_projections(SMALL, 1, rng) for _ in range(3)]
    first = [dev.step(p) for p in drafts]
    after_first = dev.states()
    dev.state.conv.copy_from(snapshot.conv)
    dev.state.recurrent.copy_from(snapshot.recurrent)
    for i, p in enumerate(drafts):
        assert_equal(dev.step(p), first[i], f"token {i} after restore")
    again = dev.states()
    assert_equal(again.conv, after_first.conv, "conv state after restore")
    assert_equal(again.recurrent, after_first.recurrent, "recurrent state after restore")


@pytest.mark.parametrize("fuse_conv", [True, False], ids=["one_launch", "conv_then_recurrence"])
@pytest.mark.parametrize("rows", [2, 8])
def test_slot_rows_equal_each_sequence_stepped_alone(card, rng, rows, fuse_conv):
    """A slot-indexed step of the 9B shape (row b: one token of slot row_slot[b], slots in shuffled order, each
    with its own random state) against each sequence's own one-token step: y, its Q8_1 copy and both states bit
    for bit. At 8 rows the narrow kernel's 2,048 blocks pass one wave of the H200, so the step takes
    gdn_recurrent_wide, whose sums keep the narrow kernel's order (gdn.cu); at 2 rows it takes the narrow one.
    The batch runs as one launch (the conv forms) or as conv then recurrence; each sequence alone, as one launch."""
    dims = SHAPE_9B
    layer = random_layer(dims, rng)
    starts = [random_state(dims, rng) for _ in range(rows)]
    row_slot = rng.permutation(rows).astype(np.int32)
    proj = random_projections(dims, rows, rng)
    wide = dims.n_v_heads * (dims.d_v // RECURRENT_COLS) * rows > RECURRENT_BLOCKS_PER_SM * card.sm_count
    assert recurrent_form(card, dims, rows)[0] == ("gdn_recurrent_wide" if wide else "gdn_recurrent")

    alone = [DeviceGdn(card, layer, start) for start in starts]
    want = {}
    for b, slot in enumerate(row_slot):
        want[b] = alone[slot].step(Projections(dims, proj.stacked[b : b + 1]), q8=True)
        want[b, "q8"] = alone[slot].last_q8

    batched = [DeviceGdn(card, layer, start) for start in starts]
    table = card.upload(np.asarray([[d.state.conv.ptr, d.state.recurrent.ptr] for d in batched], np.uint64),
                        "test.gdn.slot_table")
    slots = SlotRows(card.upload(row_slot, "test.gdn.row_slot"), table)
    inputs = proj.on_card(card)
    conv_out = card.alloc(F32 * rows * dims.cc, "test.gdn.conv_out")
    y = card.alloc(F32 * rows * dims.cv, "test.gdn.y")
    y_q8 = alloc_q8_activations(card, dims.cv, rows, "test.gdn.y_q8")
    counters = alloc_head_counters(card, dims, "test.gdn.slot_counters", rows=rows)
    gdn_mixer(card, dims, batched[0].weights, None, inputs, conv_out, y, counters, rows, layer.eps, y_q8,
              slots=slots, fuse_conv=fuse_conv)
    card.synchronize()
    got = y.download(np.float32, (rows, dims.cv))
    xq, xd = y_q8.xq.download(np.int8, (rows, dims.cv)), y_q8.xd.download(np.float32, (rows, dims.cv // 32))
    for b, slot in enumerate(row_slot):
        assert_equal(got[b], want[b][0], f"row {b} (slot {slot}): y")
        assert_equal(xq[b], want[b, "q8"][0][0], f"row {b}: Q8_1 values")
        assert_equal(xd[b], want[b, "q8"][1][0], f"row {b}: Q8_1 scales")
        mine, theirs = batched[slot].states(), alone[slot].states()
        assert_equal(mine.conv, theirs.conv, f"slot {slot}: conv state")
        assert_equal(mine.recurrent, theirs.recurrent, f"slot {slot}: recurrent state")
    assert_equal(counters.download(np.uint32, counter_count(dims, rows)),
                 np.zeros(counter_count(dims, rows), np.uint32), "arrival counters")
