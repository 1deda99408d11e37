"""Block-sparse prefill over the quantised KV cache (cuda_src/sparse_kv.cu) against float64 attention.

Each case fills a layer's cache with reference-encoded rows (tests/gpu/test_kv_cache.py's `Layer`: rows
past the prompt are all-0xFF bytes, i.e. NaN scales/norms, so reading them shows), builds the block index
on the GPU from dense and A-shape heads (the kinds a quantised cache serves), and checks:
- sparse_prefill_<fmt> + attn_merge_gate against float64 masked softmax attention over the reference's
  decode of the stored cache, masked by numpy's block index: ATTN_TOL = 1e-4 of max|y| (kv_prefill's);
- with a 100% budget, the output equals kv_prefill's bit for bit (same split ranges, the same per-row
  arithmetic: sparse_kv.cu's header).
Every format, head widths 256 (27B's heads) and 128 (the trained fixture), unaligned positions, splits.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.attention_kernels import (
    QUANTISED_KERNEL_FORMATS,
    AttnDims,
    alloc_partials,
    attn_merge_gate,
    kv_prefill,
    rotate_q,
)
from engine.cuda.kv_cache import domain_width
from engine.cuda.sparse_attention import (
    BLOCK,
    SparseGeometry,
    alloc_scratch,
    build_index,
    pattern_table,
    sparse_prefill_kv,
)
from engine.reference.sparse_attention import DENSE, Pattern, block_index
from tests.gpu.gpu_fixtures import assert_equal, assert_within
from tests.gpu.test_kv_cache import ATTN_TOL, F32, Layer, random_keys, random_values

A_SHAPES = [Pattern("a_shape", sink=1, window=2), DENSE, Pattern("a_shape", sink=0, window=1),
            Pattern("a_shape", sink=2, window=3)]


class SparseCase:
    """One quantised layer with a prompt's rows, its queries and gate on the card."""

    def __init__(self, card, rng, tables, fmt_name: str, dims: AttnDims, pos: int, n_tok: int):
        self.card, self.tables, self.dims, self.pos, self.n_tok = card, tables, dims, pos, n_tok
        self.total = pos + n_tok
        self.layer = Layer(card, tables, fmt_name, dims, capacity=self.total + 77)
        shape = (self.total, dims.n_head_kv, dims.head_dim)
        self.layer.fill(random_keys(rng, shape), random_values(rng, shape))
        self.q = (2.0 * rng.standard_normal((n_tok, dims.n_head, dims.head_dim))).astype(np.float32)
        self.gate = rng.standard_normal((n_tok, dims.n_head * dims.head_dim)).astype(np.float32)
        self.layer.step.upload(np.array([pos, n_tok], np.int32))
        q_dev = card.upload(self.q, "sparse kv q")
        if self.layer.fmt.k.rotated:
            width = domain_width(self.layer.fmt.k, dims.head_dim)
            self.q_dom = card.alloc(n_tok * dims.n_head * width * F32, "sparse kv q_rot")
            rotate_q(card, q_dev, self.q_dom, n_tok * dims.n_head, dims.head_dim, tables)
        else:
            self.q_dom = q_dev
        self.gate_dev = card.upload(self.gate, "sparse kv gate")
        self.geo = SparseGeometry(pos, n_tok)
        self.scratch = alloc_scratch(card, dims, n_tok, self.layer.capacity)

    def merged(self, parts, n_splits: int) -> np.ndarray:
        d = self.dims
        y = self.card.alloc(self.n_tok * d.n_head * d.head_dim * F32, "sparse kv y")
        attn_merge_gate(self.card, d, parts, self.n_tok, n_splits, self.gate_dev, d.n_head * d.head_dim, d.head_dim, y)
        return y.download(np.float32, (self.n_tok, d.n_head * d.head_dim))

    def sparse(self, patterns: list[Pattern], n_splits: int) -> np.ndarray:
        d, layer = self.dims, self.layer
        table = self.card.upload(pattern_table(patterns), "sparse kv patterns")
        build_index(self.card, d, self.scratch, table, {p.kind for p in patterns}, self.q_dom, layer.cache.k.codes,
                    layer.step, self.geo, layer.capacity)
        parts = alloc_partials(self.card, self.n_tok * d.n_head, n_splits, d.head_dim, "sparse kv")
        sparse_prefill_kv(self.card, d, self.q_dom, layer.cache, layer.step, self.scratch.index, parts, self.geo,
                          n_splits, self.tables)
        return self.merged(parts, n_splits)

    def dense(self, n_splits: int) -> np.ndarray:
        d = self.dims
        parts = alloc_partials(self.card, self.n_tok * d.n_head, n_splits, d.head_dim, "sparse kv dense")
        kv_prefill(self.card, d, self.q_dom, self.layer.cache, self.layer.step, parts, self.n_tok, n_splits, self.tables)
        return self.merged(parts, n_splits)

    def expected(self, patterns: list[Pattern]) -> np.ndarray:
        """float64 attention over the stored cache, masked by numpy's block index and causality, times sigmoid(gate)."""
        d = self.dims
        keys, values = self.layer.stored(self.total)  # [S, Hkv, Dh], decoded by the reference codecs
        rows = self.pos + np.arange(self.n_tok)
        key_block = np.arange(self.total) // BLOCK
        out = np.zeros((self.n_tok, d.n_head, d.head_dim))
        for h, p in enumerate(patterns):
            k, v = keys[:, h // d.group].astype(np.float64), values[:, h // d.group].astype(np.float64)
            index = block_index(p, self.q[:, h], k.astype(np.float32), self.pos, BLOCK)
            allowed = index[rows // BLOCK - self.pos // BLOCK][:, key_block] & (np.arange(self.total)[None] <= rows[:, None])
            s = np.where(allowed, self.q[:, h].astype(np.float64) @ k.T / np.sqrt(d.head_dim), -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ v
        return out.reshape(self.n_tok, -1) / (1.0 + np.exp(-self.gate.astype(np.float64)))


@pytest.fixture(scope="module")
def tables(card):
    from engine.cuda.kv_cache import upload_kv_tables

    return upload_kv_tables(card)


DIMS = [AttnDims(24, 4, 256), AttnDims(4, 2, 128)]


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", DIMS, ids=["27b", "fixture"])
@pytest.mark.parametrize("pos, n_tok, n_splits", [(0, 300, 1), (100, 333, 3), (640, 129, 2)])
def test_sparse_prefill_over_stored_codes_matches_float64(card, rng, tables, fmt_name, dims, pos, n_tok, n_splits):
    case = SparseCase(card, rng, tables, fmt_name, dims, pos, n_tok)
    patterns = [A_SHAPES[h % len(A_SHAPES)] for h in range(dims.n_head)]
    y = case.sparse(patterns, n_splits)
    want = case.expected(patterns)
    assert_within(y, want, ATTN_TOL * np.abs(want).max(),
                  f"sparse {fmt_name} H={dims.n_head}/{dims.n_head_kv} Dh={dims.head_dim} pos={pos} T={n_tok}")


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("dims", DIMS, ids=["27b", "fixture"])
def test_full_budget_equals_kv_prefill_bit_for_bit(card, rng, tables, fmt_name, dims):
    case = SparseCase(card, rng, tables, fmt_name, dims, 200, 260)
    full = [Pattern("a_shape", sink=0, window=case.geo.n_kb)] * dims.n_head
    for n_splits in (1, 3):
        assert_equal(case.sparse(full, n_splits), case.dense(n_splits), f"{fmt_name} full budget, {n_splits} splits")
