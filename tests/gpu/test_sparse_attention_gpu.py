"""Block-sparse prefill (cuda_src/sparse_attention.cu) against the numpy sparse reference.

Each case fills an fp16 cache (rows past the chunk hold NaN, so reading past the visible keys shows),
puts T random queries at position pos, builds the block index on the GPU from a mix of per-head
patterns, and checks:
- the index, bit for bit, against `engine.reference.sparse_attention.block_index` on the same fp16
  keys (dense and A-shape are integer rules; block top-k and vertical-slash rank fp32 sums, and with
  at most ~20 random blocks a near-tie within fp32 rounding is a ~1e-4 event, so exact equality is
  asked; a failure there names the head and row to look at);
- sparse_prefill + attn_merge_gate against float64 masked softmax attention over the GPU's own index,
  times the sigmoid gate: SPARSE_TOL = 1e-4 of max|y| (the dense kernels' ATTN_TOL);
- a 100% budget (every pattern sized past the chunk) gives the causal index and dense attention.
Positions include unaligned ones (a chunk starting mid-block, so a query block is split between
chunks) and several splits (partials merged by attn_merge_gate).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.attention_kernels import (
    AttnDims,
    Partials,
    alloc_partials,
    attn_merge_gate,
)
from engine.cuda.sparse_attention import (
    BLOCK,
    SparseGeometry,
    alloc_scratch,
    build_index,
    pattern_table,
    sparse_prefill_f16,
)
from engine.reference.sparse_attention import DENSE, Pattern, block_index
from tests.gpu.gpu_fixtures import assert_equal, assert_within

SPARSE_TOL = 1e-4
F16_NAN = np.float16(np.nan)

MIXED = [Pattern("a_shape", sink=1, window=2), Pattern("vertical_slash", vertical=2, slash=2),
         Pattern("block_topk", topk=3), DENSE]


class Case:
    """One layer's fp16 cache, the chunk's queries and gate, on the card."""

    def __init__(self, card, rng: np.random.Generator, dims: AttnDims, pos: int, n_tok: int, capacity: int):
        self.card, self.dims, self.pos, self.n_tok, self.capacity = card, dims, pos, n_tok, capacity
        kv_len = pos + n_tok
        shape = (dims.n_head_kv, kv_len, dims.head_dim)
        self.keys = rng.standard_normal(shape).astype(np.float16)
        self.values = (2.0 * rng.standard_normal(shape)).astype(np.float16)
        self.q = (rng.standard_normal((n_tok, dims.n_head, dims.head_dim)) / 2).astype(np.float32)
        self.gate = rng.standard_normal((n_tok, dims.n_head * dims.head_dim)).astype(np.float32)
        full = np.full((dims.n_head_kv, capacity, dims.head_dim), F16_NAN, np.float16)
        full[:, :kv_len] = self.keys
        self.k_dev = card.upload(full, "sparse test k")
        full[:, :kv_len] = self.values
        self.v_dev = card.upload(full, "sparse test v")
        self.q_dev = card.upload(self.q, "sparse test q")
        self.gate_dev = card.upload(self.gate, "sparse test gate")
        self.step = card.upload(np.array([pos, n_tok], np.int32), "sparse test step")
        self.geo = SparseGeometry(pos, n_tok)
        self.scratch = alloc_scratch(card, dims, n_tok, capacity)

    def gpu_index(self, patterns: list[Pattern]) -> np.ndarray:
        """The index the GPU builds, as bool [H, n_qb, n_kb]."""
        table = self.card.upload(pattern_table(patterns), "sparse test patterns")
        build_index(self.card, self.dims, self.scratch, table, {p.kind for p in patterns}, self.q_dev, self.k_dev,
                    self.step, self.geo, self.capacity)
        g = self.geo
        words = self.card.download(self.scratch.index, np.uint32, self.dims.n_head * g.n_qb * g.words)
        bits = np.unpackbits(words.reshape(-1, 1).view(np.uint8), axis=1, bitorder="little")
        return bits.reshape(self.dims.n_head, g.n_qb, g.words * 32)[:, :, : g.n_kb].astype(bool)

    def numpy_index(self, patterns: list[Pattern]) -> np.ndarray:
        keys = self.keys.astype(np.float32)
        return np.stack([block_index(p, self.q[:, h], keys[h // self.dims.group], self.pos, BLOCK)
                         for h, p in enumerate(patterns)])

    def gpu_output(self, n_splits: int) -> np.ndarray:
        """sparse_prefill over the index last built, merged with the gate: y [T, H*Dh]."""
        d = self.dims
        parts: Partials = alloc_partials(self.card, self.n_tok * d.n_head, n_splits, d.head_dim, "sparse test")
        sparse_prefill_f16(self.card, d, self.q_dev, self.k_dev, self.v_dev, self.step, self.scratch.index, parts,
                           self.geo, self.capacity, n_splits)
        y = self.card.alloc(self.n_tok * d.n_head * d.head_dim * 4, "sparse test y")
        attn_merge_gate(self.card, d, parts, self.n_tok, n_splits, self.gate_dev, d.n_head * d.head_dim, d.head_dim, y)
        return self.card.download(y, np.float32, (self.n_tok, d.n_head * d.head_dim))

    def expected(self, index: np.ndarray) -> np.ndarray:
        """float64 masked softmax attention over the index (and causality), times sigmoid(gate)."""
        d = self.dims
        kv_len = self.pos + self.n_tok
        out = np.zeros((self.n_tok, d.n_head, d.head_dim))
        rows = self.pos + np.arange(self.n_tok)
        key_block = np.arange(kv_len) // BLOCK
        for h in range(d.n_head):
            k = self.keys[h // d.group].astype(np.float64)
            v = self.values[h // d.group].astype(np.float64)
            s = self.q[:, h].astype(np.float64) @ k.T * d.head_dim**-0.5
            allowed = index[h][rows // BLOCK - self.pos // BLOCK][:, key_block] & (np.arange(kv_len)[None] <= rows[:, None])
            s = np.where(allowed, s, -np.inf)
            p = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v
        return out.reshape(self.n_tok, -1) / (1.0 + np.exp(-self.gate.astype(np.float64)))


CASES = [  # (n_head, n_head_kv, head_dim, pos, n_tok, n_splits)
    (8, 2, 256, 0, 300, 1),
    (8, 2, 256, 100, 333, 3),
    (4, 1, 256, 640, 129, 2),
    (4, 2, 64, 37, 500, 4),
    (4, 4, 32, 1000, 70, 2),
]


@pytest.mark.parametrize("n_head,n_head_kv,head_dim,pos,n_tok,n_splits", CASES)
def test_gpu_index_and_sparse_prefill_match_numpy(card, rng, n_head, n_head_kv, head_dim, pos, n_tok, n_splits):
    dims = AttnDims(n_head, n_head_kv, head_dim)
    case = Case(card, rng, dims, pos, n_tok, capacity=pos + n_tok + 77)
    patterns = [MIXED[h % len(MIXED)] for h in range(n_head)]
    got = case.gpu_index(patterns)
    want = case.numpy_index(patterns)
    for h, p in enumerate(patterns):
        assert_equal(got[h], want[h], f"index of head {h} ({p.label}), pos {pos}, T {n_tok}")
    y = case.gpu_output(n_splits)
    ref = case.expected(got)
    assert_within(y, ref, SPARSE_TOL * np.abs(ref).max(), f"sparse prefill pos {pos} T {n_tok} splits {n_splits}")
    assert np.isfinite(y).all()


def test_full_budget_is_the_causal_index_and_dense_attention(card, rng):
    dims = AttnDims(8, 2, 256)
    pos, n_tok = 200, 260
    case = Case(card, rng, dims, pos, n_tok, capacity=1024)
    n_kb = case.geo.n_kb
    full = [Pattern("a_shape", sink=0, window=n_kb), Pattern("vertical_slash", vertical=n_kb, slash=0),
            Pattern("vertical_slash", vertical=0, slash=n_kb), Pattern("block_topk", topk=n_kb)] * 2
    got = case.gpu_index(full)
    qb = np.arange(case.geo.qb0, case.geo.qb0 + case.geo.n_qb)
    causal = np.arange(n_kb)[None, :] <= qb[:, None]
    for h in range(dims.n_head):
        assert_equal(got[h], causal, f"full-budget index of head {h} ({full[h].label})")
    y = case.gpu_output(2)
    ref = case.expected(np.broadcast_to(causal, got.shape))
    assert_within(y, ref, SPARSE_TOL * np.abs(ref).max(), "full-budget sparse prefill vs dense")


def test_sparse_blocks_are_skipped_not_just_masked(card, rng):
    """A key block outside the index may hold NaN in the cache and the output stays finite and right."""
    dims = AttnDims(4, 1, 64)
    pos, n_tok = 256, 128
    case = Case(card, rng, dims, pos, n_tok, capacity=512)
    a_shape = [Pattern("a_shape", sink=1, window=1)] * 4  # reads block 0 and the diagonal only
    poisoned = np.array(case.keys)
    poisoned[:, 2 * BLOCK:3 * BLOCK] = F16_NAN  # key block 2: never read by query blocks 4, 5
    full = np.full((1, case.capacity, 64), F16_NAN, np.float16)
    full[:, : pos + n_tok] = poisoned
    case.k_dev.upload(full)
    got = case.gpu_index(a_shape)
    assert not got[:, :, 2].any()
    y = case.gpu_output(1)
    assert np.isfinite(y).all()
    ref = case.expected(got)
    assert_within(y, ref, SPARSE_TOL * np.abs(ref).max(), "A-shape prefill beside a poisoned block")
