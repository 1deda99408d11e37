"""Quantised KV cache kernels (cuda_src/kv_cache.cu) against the numpy codecs (engine/reference/kv_quant.py).

* encode: int8 codes and scales are bit-exact (same IEEE divisions, round-half-even); rotated codes may
  differ only where the float64 rotated coordinate lies within 2e-6 of a decision boundary (fp32 sums
  in another order), norms by at most one fp16 ulp. Rows outside pos..pos+T-1 stay untouched and rows
  past the capacity are dropped.
* q rotation: the same butterflies as the reference, so equal to 1e-6 relative.
* decode / prefill: caches filled with reference-encoded rows (keys with outlier channels, as RoPE'd
  keys have), unwritten rows holding NaN norms/scales; outputs (after attn_merge_gate) are held to the
  float64 attention over the reference's decoded cache, ATTN_TOL = 1e-4 of max|y| (attention.cu's
  tolerance: fp32 sums in a different order, __expf), for every format, head width and GQA group.
* the whole step (encode staged rows, rotate q, attend) with a fixed decode grid equals one prefill.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.attention_kernels import (
    KV_DECODE_GROUPS,
    QUANTISED_KERNEL_FORMATS,
    AttnDims,
    alloc_partials,
    attn_merge_gate,
    kv_decode,
    kv_encode,
    kv_prefill,
    rotate_q,
)
from engine.cuda.kv_cache import (
    KVLayerCache,
    alloc_kv_layer,
    code_row_bytes,
    domain_width,
    download_side_rows,
    side_blocks,
    upload_kv_tables,
    upload_side_rows,
)
from engine.model.kv_formats import INT8, WHT3, WHT4, kv_format
from engine.reference.kv_quant import Encoded, RotatedCodec, codec_for, rotate
from tests.gpu.gpu_fixtures import assert_equal, assert_within

ATTN_TOL = 1e-4
BOUNDARY_TOL = 2e-6
F32 = 4
DIMS = {
    "27b": AttnDims(24, 4, 256),
    "0.8b": AttnDims(8, 2, 256),
    "demo": AttnDims(4, 2, 64),
    "tiny": AttnDims(8, 2, 32),
    "tiny_mha": AttnDims(4, 4, 32),
}


@pytest.fixture(scope="module")
def tables(card):
    return upload_kv_tables(card)


def random_keys(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """Keys like normed, RoPE'd ones: N(0,1) with a few outlier channels (x8), rounded to fp16 values."""
    x = rng.standard_normal(shape)
    x[..., 1::37] *= 8.0
    return x.astype(np.float16).astype(np.float32)


def random_values(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return (2.0 * rng.standard_normal(shape)).astype(np.float16).astype(np.float32)


def garbage_cache(card, fmt_name: str, dims: AttnDims, capacity: int) -> KVLayerCache:
    """A cache whose every byte is 0xFF: codes are valid but norms/scales are fp16 NaN, so any read of an
    unwritten row turns the output into NaN."""
    cache = alloc_kv_layer(card, kv_format(fmt_name), dims.n_head_kv, dims.head_dim, capacity, "test.kv")
    for buf in cache.buffers():
        buf.upload(np.full(buf.nbytes, 0xFF, np.uint8))
    return cache


# ---- encode -----------------------------------------------------------------------------------------
def rotated_coordinates(x: np.ndarray) -> np.ndarray:
    """float64 unit-normalised rotated blocks [..., nb, 128] of x [..., Dh]."""
    y = rotate(x).astype(np.float64)
    y = y.reshape(*y.shape[:-1], -1, 128)
    n = np.linalg.norm(y, axis=-1, keepdims=True)
    return np.divide(y, n, out=np.zeros_like(y), where=n > 0)


def check_encoded(codec_spec, got: Encoded, want: Encoded, x: np.ndarray, what: str) -> None:
    if codec_spec == INT8:
        assert_equal(got.side, want.side, f"{what}: int8 scales")
        assert_equal(got.codes, want.codes, f"{what}: int8 codes")
        return
    ulps = np.abs(got.side.view(np.int16).astype(np.int32) - want.side.view(np.int16).astype(np.int32))
    assert ulps.max() <= 1, f"{what}: norms differ by {ulps.max()} fp16 ulps"
    codec = codec_for(codec_spec, x.shape[-1])
    assert isinstance(codec, RotatedCodec)
    got_codes, want_codes = codec.unpack(got.codes), codec.unpack(want.codes)
    differ = got_codes != want_codes
    if differ.any():
        u = rotated_coordinates(x)[differ]
        near = np.min(np.abs(u[:, None] - codec.boundaries[None, :].astype(np.float64)), axis=1)
        assert np.all(near < BOUNDARY_TOL), (
            f"{what}: {int(differ.sum())} codes differ, {int((near >= BOUNDARY_TOL).sum())} of them away from a "
            f"boundary (worst distance {near.max():.3e})"
        )
        assert differ.mean() < 1e-3, f"{what}: {differ.mean():.2%} of codes differ"


@pytest.mark.parametrize("codec_spec", [INT8, WHT4, WHT3], ids=lambda c: c.name)
@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
@pytest.mark.parametrize("n_tok, pos, capacity", [(1, 0, 4), (5, 7, 20), (9, 300, 305)])
def test_encode(card, rng, tables, codec_spec, head_dim, n_tok, pos, capacity):
    """Rows pos..pos+T-1 (those under the capacity) encoded as the reference does; other rows untouched."""
    n_head_kv = 3
    what = f"{codec_spec.name} Dh={head_dim} T={n_tok} pos={pos} capacity={capacity}"
    fmt = kv_format({INT8: "k8v8", WHT4: "k4v4", WHT3: "k3v3"}[codec_spec])
    dims = AttnDims(n_head_kv, n_head_kv, head_dim)
    cache = garbage_cache(card, fmt.name, dims, capacity)
    x = random_keys(rng, (n_tok, n_head_kv, head_dim))
    x[0, 0] = 0.0  # an all-zero row: scale/norm 0, decodes to zeros
    staging = card.upload(x.transpose(1, 0, 2).astype(np.float16), "test.staging")
    step = card.upload(np.array([pos, n_tok], np.int32), "test.step")
    kv_encode(card, cache.k, staging, n_tok, step, n_tok, n_head_kv, head_dim, capacity, tables)

    got = download_side_rows(cache.k, n_head_kv, head_dim, capacity, capacity)
    written = min(n_tok, capacity - pos)
    want = codec_for(codec_spec, head_dim).encode(x[:written])
    rows = slice(pos, pos + written)
    check_encoded(codec_spec, Encoded(got.codes[rows], got.side[rows]), want, x[:written], what)
    untouched = np.ones(capacity, bool)
    untouched[rows] = False
    raw_codes = got.codes[untouched].view(np.uint8)
    assert np.all(raw_codes == 0xFF), f"{what}: rows outside pos..pos+T-1 were written"
    assert np.all(np.isnan(got.side[untouched].astype(np.float32))), f"{what}: side data outside the rows written"
    assert side_blocks(codec_spec, head_dim) == got.side.shape[-1]
    assert code_row_bytes(codec_spec, head_dim) == got.codes.reshape(capacity, n_head_kv, -1).view(np.uint8).shape[-1]


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_rotate_q(card, rng, tables, head_dim):
    q = (3.0 * rng.standard_normal((7, head_dim))).astype(np.float32)
    width = domain_width(WHT3, head_dim)
    out = card.alloc(q.shape[0] * width * F32, "test.qrot")
    rotate_q(card, card.upload(q, "test.q"), out, q.shape[0], head_dim, tables)
    got = out.download(np.float32, (q.shape[0], width))
    assert_within(got, rotate(q), 1e-6 * np.abs(q).max(), f"kv_rotate_q Dh={head_dim}")


# ---- attention --------------------------------------------------------------------------------------
def float64_attention(q: np.ndarray, keys: np.ndarray, values: np.ndarray, pos: int, dims: AttnDims,
                      gate: np.ndarray) -> np.ndarray:
    """y [T, H*Dh]: causal softmax attention of q [T, H, Dh] over keys/values [S, Hkv, Dh] times sigmoid(gate)."""
    t = q.shape[0]
    kv_of = np.arange(dims.n_head) // dims.group
    s = np.einsum("thd,shd->ths", q.astype(np.float64), keys[:, kv_of].astype(np.float64)) / np.sqrt(dims.head_dim)
    visible = np.arange(keys.shape[0])[None, None, :] <= (pos + np.arange(t))[:, None, None]
    s = np.where(visible, s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    o = np.einsum("ths,shd->thd", p, values[:, kv_of].astype(np.float64))
    return (o / (1.0 + np.exp(-gate.astype(np.float64)))).reshape(t, -1)


class Layer:
    """One layer's quantised cache on the card, its step buffer, and the launches of one attention step."""

    def __init__(self, card, tables, fmt_name: str, dims: AttnDims, capacity: int):
        self.card, self.tables, self.dims, self.capacity = card, tables, dims, capacity
        self.fmt = kv_format(fmt_name)
        self.cache = garbage_cache(card, fmt_name, dims, capacity)
        self.step = card.upload(np.zeros(2, np.int32), "test.step")

    def fill(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Rows [0, S) from reference encodes of keys/values [S, Hkv, Dh]."""
        dh = self.dims.head_dim
        upload_side_rows(self.cache.k, dh, self.capacity, codec_for(self.fmt.k, dh).encode(keys))
        upload_side_rows(self.cache.v, dh, self.capacity, codec_for(self.fmt.v, dh).encode(values))

    def stored(self, rows: int) -> tuple[np.ndarray, np.ndarray]:
        """Rows [0, rows) decoded by the reference codecs: what the kernels must attend over."""
        d = self.dims
        k = download_side_rows(self.cache.k, d.n_head_kv, d.head_dim, self.capacity, rows)
        v = download_side_rows(self.cache.v, d.n_head_kv, d.head_dim, self.capacity, rows)
        return codec_for(self.fmt.k, d.head_dim).decode(k), codec_for(self.fmt.v, d.head_dim).decode(v)

    def append(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Encode the batch's rows [T, Hkv, Dh] on the card at the step's position (staging as attn_prep writes it)."""
        d, n_tok = self.dims, keys.shape[0]
        for side, rows in ((self.cache.k, keys), (self.cache.v, values)):
            staging = self.card.upload(rows.transpose(1, 0, 2).astype(np.float16), "test.staging")
            kv_encode(self.card, side, staging, n_tok, self.step, n_tok, d.n_head_kv, d.head_dim, self.capacity,
                      self.tables)

    def attend(self, q: np.ndarray, gate: np.ndarray, pos: int, n_splits: int, use_decode: bool) -> np.ndarray:
        """q, gate [T, H, Dh] at position pos → y [T, H*Dh] (rotate q if needed, attend, merge + gate)."""
        card, d = self.card, self.dims
        n_tok = q.shape[0]
        self.step.upload(np.array([pos, n_tok], np.int32))
        q_dev = card.upload(q, "test.q")
        if self.fmt.k.rotated:
            width = domain_width(self.fmt.k, d.head_dim)
            q_dom = card.alloc(n_tok * d.n_head * width * F32, "test.qrot")
            rotate_q(card, q_dev, q_dom, n_tok * d.n_head, d.head_dim, self.tables)
        else:
            q_dom = q_dev
        parts = alloc_partials(card, n_tok * d.n_head, n_splits, d.head_dim, "test")
        if use_decode:  # a token per grid column
            kv_decode(card, d, q_dom, self.cache, self.step, parts, n_splits, self.tables, n_tok)
        else:
            kv_prefill(card, d, q_dom, self.cache, self.step, parts, n_tok, n_splits, self.tables)
        y = card.alloc(n_tok * d.n_head * d.head_dim * F32, "test.y")
        attn_merge_gate(card, d, parts, n_tok, n_splits, card.upload(gate, "test.gate"), d.n_head * d.head_dim,
                        d.head_dim, y)
        return y.download(np.float32, (n_tok, d.n_head * d.head_dim))


def run_case(card, rng, tables, fmt_name: str, dims: AttnDims, n_tok: int, pos: int, n_splits: int,
             use_decode: bool) -> None:
    what = f"{fmt_name} H={dims.n_head}/{dims.n_head_kv} Dh={dims.head_dim} T={n_tok} pos={pos} splits={n_splits}"
    total = pos + n_tok
    layer = Layer(card, tables, fmt_name, dims, capacity=total + 3)
    shape = (total, dims.n_head_kv, dims.head_dim)
    layer.fill(random_keys(rng, shape), random_values(rng, shape))
    q = (2.0 * rng.standard_normal((n_tok, dims.n_head, dims.head_dim))).astype(np.float32)
    gate = rng.standard_normal(q.shape).astype(np.float32)
    y = layer.attend(q, gate, pos, n_splits, use_decode)
    keys, values = layer.stored(total)
    want = float64_attention(q, keys, values, pos, dims, gate)
    assert_within(y, want, ATTN_TOL * np.abs(want).max(), f"{what}: y against float64 over the stored cache")


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", list(DIMS.values()), ids=list(DIMS))
@pytest.mark.parametrize("kv_len, n_splits", [(1, 1), (300, 7), (5000, 64)])
def test_decode(card, rng, tables, fmt_name, dims, kv_len, n_splits):
    run_case(card, rng, tables, fmt_name, dims, 1, kv_len - 1, n_splits, use_decode=True)


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", [DIMS["27b"], DIMS["tiny"]], ids=["27b", "tiny"])
@pytest.mark.parametrize("n_tok, prefix, n_splits", [(2, 0, 3), (3, 300, 7), (8, 5000, 99)])
def test_decode_few_tokens(card, rng, tables, fmt_name, dims, n_tok, prefix, n_splits):
    """A speculative verify's launch: token t of the batch sees rows [0, prefix + t]."""
    run_case(card, rng, tables, fmt_name, dims, n_tok, prefix, n_splits, use_decode=True)


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("head_dim, group", [(d, g) for d, groups in KV_DECODE_GROUPS.items() for g in groups])
def test_decode_every_group(card, rng, tables, fmt_name, head_dim, group):
    run_case(card, rng, tables, fmt_name, AttnDims(2 * group, 2, head_dim), 1, 700, 5, use_decode=True)


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", [DIMS["27b"], DIMS["demo"], DIMS["tiny"]], ids=["27b", "demo", "tiny"])
@pytest.mark.parametrize("n_tok, prefix, n_splits", [(1, 0, 1), (17, 5, 4), (65, 300, 2), (200, 77, 5)])
def test_prefill(card, rng, tables, fmt_name, dims, n_tok, prefix, n_splits):
    run_case(card, rng, tables, fmt_name, dims, n_tok, prefix, n_splits, use_decode=False)


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", [DIMS["27b"], DIMS["tiny"]], ids=["27b", "tiny"])
def test_decode_steps_equal_one_prefill(card, tables, fmt_name, dims):
    """Encode + prefill 13 tokens, then encode + decode 27 one at a time (one fixed grid, the position from
    the step buffer), gives the outputs and the cache bytes of encoding and prefilling all 40 at once."""
    n_total, n_first = 40, 13
    rng = np.random.default_rng(11)
    shape = (n_total, dims.n_head_kv, dims.head_dim)
    keys, values = random_keys(rng, shape), random_values(rng, shape)
    q = (2.0 * rng.standard_normal((n_total, dims.n_head, dims.head_dim))).astype(np.float32)
    gate = rng.standard_normal(q.shape).astype(np.float32)

    whole = Layer(card, tables, fmt_name, dims, n_total + 2)
    whole.step.upload(np.array([0, n_total], np.int32))
    whole.append(keys, values)
    y_whole = whole.attend(q, gate, 0, 4, use_decode=False)

    stepwise = Layer(card, tables, fmt_name, dims, n_total + 2)
    stepwise.step.upload(np.array([0, n_first], np.int32))
    stepwise.append(keys[:n_first], values[:n_first])
    rows = [stepwise.attend(q[:n_first], gate[:n_first], 0, 4, use_decode=False)]
    for t in range(n_first, n_total):
        stepwise.step.upload(np.array([t, 1], np.int32))
        stepwise.append(keys[t : t + 1], values[t : t + 1])
        rows.append(stepwise.attend(q[t : t + 1], gate[t : t + 1], t, 16, use_decode=True))
    y_steps = np.concatenate(rows)
    assert_within(y_steps, y_whole, ATTN_TOL * np.abs(y_whole).max(), f"{fmt_name}: prefill + decode steps")
    for a, b in zip(whole.cache.buffers(), stepwise.cache.buffers()):
        assert_equal(b.download(np.uint8, b.nbytes), a.download(np.uint8, a.nbytes), f"{fmt_name}: {a.label} bytes")
    want = float64_attention(q, *whole.stored(n_total), 0, dims, gate)
    assert_within(y_whole, want, ATTN_TOL * np.abs(want).max(), f"{fmt_name}: one prefill against float64")
