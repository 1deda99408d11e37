"""The K-quant kernels (gemv_kq.cu, gemm_kq.cu, embedding_kq.cu) against numpy on random blocks.

Weights are random bytes in every bit (kquant_data.random_kquant_bytes), so every 6-bit scale/min
packing case, the Q5_K fifth bits and the signed Q6_K scales occur; their exact values come from
gguf-py's `dequantize` of the same bytes (the reference's own path), and the activations are the
Q8_1 values the kernel multiplies, so float64 numpy gives the exact answer. The kernels may differ by
fp32 rounding only, bounded per output by 1e-5 · Σ_k (|d·s·q| + |dmin·m|) |x| (kq_error_bound: the scale
and min parts are summed apart, so rounding scales with both); a layout, scale or sign bug is of order
1 in those units. The embedding gather must equal gguf's dequantize bit for bit.

Shapes are odd on purpose: row counts that are not multiples of the rows per block or the 64-row GEMM
tile, K = 256 (one super-block: 8 of 32 lanes busy), 5120 (160 slices: five per lane) and 12288.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf.quants import dequantize

from engine.cuda.gemm import GEMM_STAGINGS, GEMM_TILE_TOKENS, GEMM_TOKEN_TILES
from engine.cuda.gemv import MAX_GEMV_TOKENS, upload_q8_weight
from engine.cuda.kq_weight import KQ_T1_VARIANTS, embed_kq, gemm_kq, gemv_kq, upload_kq_weight
from engine.cuda.matmul import matmul, stack
from tests.gpu.gpu_fixtures import (
    assert_equal,
    assert_within,
    check_same_bits,
    gemv_error_bound,
    random_activations,
    random_q8_weight,
    upload_activations,
)
from tests.kquant_data import KQ_TYPES, kq_error_bound, random_kquant_bytes

GEMV_SHAPES = [(1, 256), (13, 512), (37, 5120), (77, 12288), (1000, 4096)]
GEMM_SHAPES = [(1, 256), (100, 4096), (130, 5120)]
GEMM_TOKENS = [9, 30, 64, 65, 200]  # the 16-, 32- and 64-token tiles (gemm.gemm_token_tile)


def kq_case(card, rng, qtype, rows, k, tokens):
    raw = random_kquant_bytes(rng, qtype, rows, k)
    w = dequantize(raw, qtype).astype(np.float64).reshape(rows, k)
    weight = upload_kq_weight(card, qtype, [raw], k, "test.kq")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    return raw, w, weight, act, x


def check_matmul(card, rng, kernel, qtype, rows: int, k: int, tokens: int) -> None:
    raw, w, weight, act, x = kq_case(card, rng, qtype, rows, k, tokens)
    y = card.alloc(4 * rows * tokens, "test.y")
    kernel(card, weight, act, y, tokens)
    assert_within(y.download(np.float32, (tokens, rows)), x.astype(np.float64) @ w.T,
                  kq_error_bound(raw, qtype, w, x), f"{kernel.__name__} {qtype.name} T={tokens} [{rows}x{k}]")


@pytest.mark.parametrize("tokens", range(1, MAX_GEMV_TOKENS + 1))
@pytest.mark.parametrize("rows,k", GEMV_SHAPES)
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_gemv_matches_numpy(card, rng, qtype, rows, k, tokens):
    check_matmul(card, rng, gemv_kq, qtype, rows, k, tokens)


@pytest.mark.parametrize("rows,k", [(2001, 5120), (9, 256)])  # 160 slices (80 pairs); one super-block
@pytest.mark.parametrize("variant", list(KQ_T1_VARIANTS))
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_t1_variants_and_a_single_block_grid(card, rng, qtype, variant, rows, k):
    raw, w, weight, act, x = kq_case(card, rng, qtype, rows, k, 1)
    want, bound = x.astype(np.float64) @ w.T, kq_error_bound(raw, qtype, w, x)
    for max_blocks in (None, 1):
        y = card.alloc(4 * rows, "test.y")
        gemv_kq(card, weight, act, y, 1, max_blocks=max_blocks, variant=variant)
        assert_within(y.download(np.float32, (1, rows)), want, bound,
                      f"gemv {qtype.name} variant {variant!r} max_blocks={max_blocks}")


@pytest.mark.parametrize("tokens", GEMM_TOKENS)
@pytest.mark.parametrize("rows,k", GEMM_SHAPES)
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_gemm_matches_numpy(card, rng, qtype, rows, k, tokens):
    check_matmul(card, rng, gemm_kq, qtype, rows, k, tokens)


@pytest.mark.parametrize("rows,k,tokens", [(2001, 5120, 200), (9, 256, 65)])
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_both_gemm_stagings_give_the_same_bits(card, rng, qtype, rows, k, tokens):
    """The GEMM staged in one tile and in two in turn (gemm_kq.cu) sums every output in the same order."""
    _, _, weight, act, _ = kq_case(card, rng, qtype, rows, k, tokens)
    check_same_bits(card, rng, gemm_kq, weight, act, tokens,
                    {f"{qtype.name} staging {s!r}": {"staging": s, "tile_tokens": GEMM_TILE_TOKENS}
                     for s in GEMM_STAGINGS})


@pytest.mark.parametrize("rows,k,tokens", [(2001, 5120, 54), (9, 256, 17), (130, 4096, 100)])
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_every_gemm_token_tile_gives_the_64_token_tiles_bits(card, rng, qtype, rows, k, tokens):
    """The 16- and 32-token tiles (gemm_kq.cu's TJ) sum every output in the 64-token tile's order."""
    _, _, weight, act, _ = kq_case(card, rng, qtype, rows, k, tokens)
    tiles = sorted(GEMM_TOKEN_TILES, reverse=True)  # the 64-token tile first: the others are held to it
    check_same_bits(card, rng, gemm_kq, weight, act, tokens,
                    {f"{qtype.name} {t}-token tile": {"tile_tokens": t} for t in tiles})


@pytest.mark.parametrize("tokens", [1, 3, 8, 70])
def test_mixed_stack_segments_and_residual(card, rng, tokens):
    """A stack as a Q4_K_M file gives it (Q4_K q, Q4_K k, Q6_K v, then a Q8_0 matrix): every segment is its
    own [T][rows_i] matrix, and the residual epilogue works in place on the whole output."""
    k = 512
    row_counts = (70, 21, 13, 5)
    kinds = (KQ_TYPES[0], KQ_TYPES[0], KQ_TYPES[2], None)
    raws = [random_kquant_bytes(rng, q, r, k) if q is not None else None for q, r in zip(kinds, row_counts)]
    ws, bounds_parts = [], []
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    kq = upload_kq_weight(card, kinds[0], raws[:2], k, "test.q4")
    v = upload_kq_weight(card, kinds[2], raws[2:3], k, "test.q6")
    qs, d, w8 = random_q8_weight(rng, row_counts[3], k)
    runs = [kq, v, upload_q8_weight(card, [(qs, d)], "test.q8")]
    weight = stack(runs)
    for q, raw, rows in zip(kinds, raws, row_counts):
        if q is None:
            ws.append(w8)
            bounds_parts.append(gemv_error_bound(w8, x))
        else:
            w = dequantize(raw, q).astype(np.float64).reshape(rows, k)
            ws.append(w)
            bounds_parts.append(kq_error_bound(raw, q, w, x))
    residual = rng.standard_normal((tokens, sum(row_counts))).astype(np.float32)
    buf = card.alloc(4 * weight.rows * tokens, "test.y")
    # the residual buffer holds each segment's [T][rows_i] block in the output's layout
    start = 0
    layout = []
    for rows in row_counts:
        layout.append(residual[:, start:start + rows])
        start += rows
    buf.upload(np.concatenate([r.reshape(-1) for r in layout]))
    matmul(card, weight, act, buf, tokens, residual=buf)
    for i, (w, bound, r) in enumerate(zip(ws, bounds_parts, layout)):
        got = weight.segment_view(buf, i, tokens).download(np.float32, (tokens, w.shape[0]))
        assert_within(got, r.astype(np.float64) + x.astype(np.float64) @ w.T, bound + 1e-6 * np.abs(r),
                      f"mixed stack segment {i} ({kinds[i].name if kinds[i] else 'Q8_0'}) T={tokens}")


@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_embedding_rows_equal_gguf_dequantize(card, rng, qtype):
    vocab, dim = 300, 768
    raw = random_kquant_bytes(rng, qtype, vocab, dim)
    table = upload_kq_weight(card, qtype, [raw], dim, "test.embd")
    ids = np.array([0, 299, 7, 7, 150, 42], np.int32)
    out = card.alloc(4 * len(ids) * dim, "test.out")
    embed_kq(card, table, card.upload(ids, "test.ids"), out, len(ids))
    want = dequantize(raw, qtype).reshape(vocab, dim)[ids]
    assert_equal(out.download(np.float32, (len(ids), dim)).view(np.uint32), want.view(np.uint32),
                 f"embed {qtype.name} (fp32 bit patterns)")


@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_embedding_of_an_id_outside_the_table_is_nan(card, rng, qtype):
    raw = random_kquant_bytes(rng, qtype, 10, 256)
    table = upload_kq_weight(card, qtype, [raw], 256, "test.embd")
    out = card.alloc(4 * 2 * 256, "test.out")
    embed_kq(card, table, card.upload(np.array([3, 10], np.int32), "test.ids"), out, 2)
    rows = out.download(np.float32, (2, 256))
    assert np.isfinite(rows[0]).all() and np.isnan(rows[1]).all(), "id 10 of a 10-row table must give a NaN row"
