"""Flash attention (cuda_src/attention.cu) against numpy on random inputs: decode, prefill, merge + gate.

Each case runs the launches of one attention layer step (attn_prep, then attn_decode_d*_g* for one
token or attn_prefill_d* for any number, then attn_merge_gate) over a cache whose earlier rows hold
random fp16 keys/values and whose unwritten rows hold NaN, and holds the output to two truths:
- the same math in float64 on exactly what the kernels read (q as attn_prep wrote it, the cache as
  stored): ATTN_TOL = 1e-4 of max|y| (fp32 sums over up to 5000 keys in a different order, __expf);
- `engine.reference.attention.gated_attention` fed the same projections (its cache is fp32, ours fp16):
  REF_TOL = 5e-3 of max|y|, which the fp16 rounding of the new K/V rows (2^-11 relative) stays well
  inside while any layout mistake (q/gate interleave, GQA head mapping, causal limit) is far outside.
The Q8_1 output of the merge must be exactly the quantisation of its fp32 output.
Each launch's grid depends only on the batch size and the split count, never on the position: the
kernels read the length from the step buffer, so one launch configuration serves every position (what a
captured decode graph relies on; test_decode_steps_equal_one_prefill replays one decode grid 27 times).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.attention import AttentionWeights, gated_attention
from engine.reference.rope import Rope, text_positions
from engine.reference.state import KVCache
from tests.gpu.attention_fixtures import (
    F32,
    SHAPE_08B,
    SHAPE_27B,
    SHAPE_DEMO,
    SHAPE_TINY,
    SHAPE_TINY_MHA,
    SHAPES,
    AttnShape,
    DeviceAttention,
    Projections,
    assert_close,
    assert_q8_1_of,
    attention_over_cache,
    gate_of,
    random_projections,
)
from tests.gpu.gpu_fixtures import assert_equal

ATTN_TOL = 1e-4
REF_TOL = 5e-3


class _Given:
    """Stands in for one `Linear` of the reference layer: returns the projection rows the test drew."""

    def __init__(self, rows: np.ndarray):
        self.rows = rows

    def __call__(self, _x: np.ndarray) -> np.ndarray:
        return self.rows


def random_prefix(shape: AttnShape, n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Cached keys and values [Hkv, n, Dh] in fp16, at the magnitudes normed keys and raw values have."""
    dims = (shape.n_head_kv, n, shape.head_dim)
    return (rng.standard_normal(dims).astype(np.float16), (2.0 * rng.standard_normal(dims)).astype(np.float16))


def reference_layer(dev: DeviceAttention, proj: Projections, pos: int, prefix: tuple[np.ndarray, np.ndarray]):
    """engine.reference's gated attention (without the out projection) over the same prefix and projections."""
    shape = dev.shape
    cfg = shape.config()
    weights = AttentionWeights(
        q=_Given(proj.qg), k=_Given(proj.k), v=_Given(proj.v), out=lambda y: y, q_norm=dev.q_norm, k_norm=dev.k_norm
    )
    cache = KVCache(shape.n_head_kv, shape.head_dim)
    if pos:
        cache.append(*(rows.transpose(1, 0, 2).astype(np.float32) for rows in prefix))
    a = np.zeros((proj.n_tokens, 0), np.float32)
    return gated_attention(weights, cfg, Rope(cfg), a, text_positions(pos, proj.n_tokens), cache)


def run_case(card, rng: np.random.Generator, shape: AttnShape, n_tok: int, pos: int, n_splits: int,
             use_decode: bool) -> None:
    what = f"{shape.name} T={n_tok} pos={pos} splits={n_splits} {'decode' if use_decode else 'prefill'}"
    dev = DeviceAttention(card, shape, capacity=pos + n_tok + 3, rng=rng)
    prefix = random_prefix(shape, pos, rng)
    dev.fill_prefix(*prefix)
    proj = random_projections(shape, n_tok, rng)
    q, y, yq, yd = dev.step_attention(proj, pos, n_splits, use_decode, quantize=True)
    keys, values = dev.cache()
    want = attention_over_cache(shape, q, keys, values, pos, gate_of(shape, proj.qg))
    assert_close(f"{what}: y against float64 over the cache", y, want, ATTN_TOL)
    assert_close(f"{what}: y against engine.reference", y, reference_layer(dev, proj, pos, prefix), REF_TOL)
    assert_q8_1_of(f"{what}: Q8_1 of y", yq, yd, y)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("kv_len", [1, 5, 300, 5000])
@pytest.mark.parametrize("n_splits", [1, 7, 64])
def test_decode(card, rng, shape, kv_len, n_splits):
    run_case(card, rng, shape, 1, kv_len - 1, n_splits, use_decode=True)


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("n_tok", [2, 3, 8])
@pytest.mark.parametrize("prefix, n_splits", [(0, 1), (5, 7), (300, 64), (4000, 99)])
def test_decode_few_tokens(card, rng, shape, n_tok, prefix, n_splits):
    """The decode kernel over a few new tokens (a speculative verify): token t sees rows [0, prefix + t]."""
    run_case(card, rng, shape, n_tok, prefix, n_splits, use_decode=True)


@pytest.mark.parametrize("shape", [SHAPE_27B, SHAPE_TINY], ids=lambda s: s.name)
@pytest.mark.parametrize("prefix, n_splits", [(0, 16), (700, 99)])
def test_a_few_token_decode_equals_one_token_decodes_bit_for_bit(card, rng, shape, prefix, n_splits):
    """Token t's partials of a 3-token decode launch are the bits of a one-token decode at position prefix + t
    over the same cache and q row: a verify's logits equal plain decode steps' exactly."""
    n_tok = 3
    dev = DeviceAttention(card, shape, capacity=prefix + n_tok + 3, rng=rng)
    dev.fill_prefix(*random_prefix(shape, prefix, rng))
    dev.set_pos(prefix, n_tok)
    _, q_out = dev.prep(random_projections(shape, n_tok, rng))
    together = dev.partials(n_tok, n_splits)
    dev.decode(q_out, together, n_splits, n_tok)
    rows = shape.n_head * n_splits  # one token's partial rows
    m, l, o = (buf.download(np.float32, (n_tok, rows, width)) for buf, width in zip(together, (1, 1, shape.head_dim)))
    for t in range(n_tok):
        dev.set_pos(prefix + t, 1)
        alone = dev.partials(1, n_splits)
        dev.decode(q_out.view(t * shape.q_width * F32, shape.q_width * F32), alone, n_splits)
        m1, l1, o1 = (buf.download(np.float32, (rows, width)) for buf, width in zip(alone, (1, 1, shape.head_dim)))
        what = f"{shape.name} prefix {prefix} token {t}"
        assert_equal(m[t], m1, f"{what} part_m")
        assert_equal(l[t], l1, f"{what} part_l")
        written = np.isfinite(m1[:, 0])  # an empty split leaves its o unwritten
        assert_equal(o[t][written], o1[written], f"{what} part_o")


@pytest.mark.parametrize("shape", [SHAPE_08B, SHAPE_27B, SHAPE_DEMO, SHAPE_TINY], ids=lambda s: s.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17, 65])
@pytest.mark.parametrize("prefix", [0, 5, 300])
@pytest.mark.parametrize("n_splits", [1, 4])
def test_prefill(card, rng, shape, n_tok, prefix, n_splits):
    run_case(card, rng, shape, n_tok, prefix, n_splits, use_decode=False)


@pytest.mark.parametrize(
    "shape, n_tok, prefix, n_splits",
    [(SHAPE_27B, 17, 5000, 1), (SHAPE_27B, 17, 5000, 8), (SHAPE_08B, 300, 0, 1), (SHAPE_08B, 300, 0, 3),
     (SHAPE_TINY_MHA, 65, 1000, 16), (SHAPE_DEMO, 200, 77, 5)],
    ids=lambda v: getattr(v, "name", str(v)),
)
def test_prefill_long(card, rng, shape, n_tok, prefix, n_splits):
    run_case(card, rng, shape, n_tok, prefix, n_splits, use_decode=False)


@pytest.mark.parametrize("shape", [SHAPE_27B, SHAPE_TINY], ids=lambda s: s.name)
def test_decode_steps_equal_one_prefill(card, shape):
    """Prefill 13 tokens then decode 27 one at a time (one fixed grid, position from the step buffer) gives
    the outputs and the cache of prefilling all 40 at once."""
    n_total, n_first, seed = 40, 13, 5
    proj = random_projections(shape, n_total, np.random.default_rng(99))
    whole = DeviceAttention(card, shape, capacity=n_total + 2, rng=np.random.default_rng(seed))
    _, y_whole, _, _ = whole.step_attention(proj, 0, 4, use_decode=False)

    stepwise = DeviceAttention(card, shape, capacity=n_total + 2, rng=np.random.default_rng(seed))
    rows = [stepwise.step_attention(Projections(shape, proj.stacked[:n_first]), 0, 4, use_decode=False)[1]]
    for t in range(n_first, n_total):
        rows.append(stepwise.step_attention(Projections(shape, proj.stacked[t : t + 1]), t, 16, use_decode=True)[1])
    assert_close(f"{shape.name}: prefill + decode steps against one prefill", np.concatenate(rows), y_whole, ATTN_TOL)
    for name, a, b in zip("KV", whole.cache(), stepwise.cache()):
        assert_equal(b[:, :n_total], a[:, :n_total], f"{shape.name}: {name} cache after prefill + decode steps")


def reference_merge(part_m, part_l, part_o, gate):
    """Float64 merge of split partials [rows, S] / [rows, S, Dh] (m = -inf: empty split) times sigmoid(gate)."""
    m = part_m.astype(np.float64)
    top = np.max(m, axis=1, keepdims=True)
    weight = np.where(np.isneginf(m), 0.0, np.exp(m - top))
    o_parts = np.where(np.isneginf(m)[..., None], 0.0, part_o.astype(np.float64))
    o = np.einsum("rs,rsd->rd", weight, o_parts) / np.sum(weight * part_l, axis=1, keepdims=True)
    return o / (1.0 + np.exp(-gate.astype(np.float64)))


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_merge_gate(card, rng, head_dim):
    """Synthetic partials with empty splits (their o is NaN: never read) and the gate in its own buffer."""
    n_tok, n_head, n_splits = 3, 4, 5
    rows = n_tok * n_head
    part_m = (3.0 * rng.standard_normal((rows, n_splits))).astype(np.float32)
    part_l = rng.uniform(0.5, 50.0, (rows, n_splits)).astype(np.float32)
    part_o = (10.0 * rng.standard_normal((rows, n_splits, head_dim))).astype(np.float32)
    empty = rng.random((rows, n_splits)) < 0.3
    empty[:, 0] = False  # every row saw at least one key
    part_m[empty], part_l[empty], part_o[empty] = -np.inf, 0.0, np.nan
    gate = (2.0 * rng.standard_normal((n_tok, n_head * head_dim))).astype(np.float32)
    y = card.alloc(gate.nbytes, "test y")
    yq = card.alloc(gate.size, "test yq")
    yd = card.alloc(gate.size // 32 * F32, "test yd")
    card.kernel("attn_merge_gate").launch(
        rows, head_dim, card.upload(part_m, "test m"), card.upload(part_l, "test l"), card.upload(part_o, "test o"),
        np.int32(n_splits), card.upload(gate, "test gate"), np.int32(n_head * head_dim), np.int32(head_dim),
        np.int32(n_head), y, yq, yd,
    )
    got = y.download(np.float32, gate.shape)
    want = reference_merge(part_m, part_l, part_o, gate.reshape(rows, head_dim)).reshape(gate.shape)
    assert_close(f"merge Dh={head_dim}", got, want, ATTN_TOL)
    xq, xd = yq.download(np.int8, gate.shape), yd.download(np.float32, (n_tok, gate.shape[1] // 32))
    assert_q8_1_of(f"merge Dh={head_dim}, Q8_1", xq, xd, got)
