"""embed_q8_0 gathers and dequantises token-embedding rows bit-exactly (one fp32 product per value)."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.embedding import embed_q8_0
from engine.cuda.gemv import upload_q8_weight
from engine.cuda.q8_layout import dequantize_q8_0
from tests.gpu.gpu_fixtures import assert_equal


@pytest.mark.parametrize("vocab,dim,tokens", [(7, 32, 1), (1000, 96, 7), (5003, 4096, 300), (50, 5120, 64)])
def test_embedding_rows_are_exact(card, rng, vocab, dim, tokens):
    qs = rng.integers(-128, 128, size=(vocab, dim), dtype=np.int8)  # -128 too: GGUF files may hold it
    d = rng.standard_normal((vocab, dim // 32)).astype(np.float16)
    table = upload_q8_weight(card, [(qs, d)], "test.embd")
    ids = rng.integers(0, vocab, size=tokens).astype(np.int32)
    ids[0], ids[-1] = vocab - 1, 0  # both ends of the table
    out = card.alloc(4 * tokens * dim, "test.out")
    embed_q8_0(card, table, card.upload(ids, "test.ids"), out, tokens)
    assert_equal(out.download(np.float32, (tokens, dim)), dequantize_q8_0(qs, d)[ids], f"embedding of {tokens} ids")


def test_out_of_range_ids_give_nan_rows(card, rng):
    """An id outside the table is a bug upstream: its row is NaN (so sampling reports it), others are exact."""
    vocab, dim = 100, 64
    qs = rng.integers(-127, 128, size=(vocab, dim), dtype=np.int8)
    d = rng.uniform(0.1, 1.0, size=(vocab, dim // 32)).astype(np.float16)
    table = upload_q8_weight(card, [(qs, d)], "test.embd")
    ids = np.array([3, -1, vocab, 2**31 - 1, 99], np.int32)
    out = card.alloc(4 * len(ids) * dim, "test.out")
    embed_q8_0(card, table, card.upload(ids, "test.ids"), out, len(ids))
    got = out.download(np.float32, (len(ids), dim))
    assert np.isnan(got[1:4]).all(), f"rows of ids {ids[1:4].tolist()} should be NaN, got {got[1:4, :4]}"
    assert_equal(got[[0, 4]], dequantize_q8_0(qs, d)[[3, 99]], "in-range rows next to bad ones")


def test_ids_are_read_on_the_device_at_replay(card, rng):
    """Captured once, the gather embeds whatever id the buffer holds at each replay (the decode graph's use)."""
    vocab, dim = 64, 128
    qs = rng.integers(-127, 128, size=(vocab, dim), dtype=np.int8)
    d = rng.uniform(0.1, 1.0, size=(vocab, dim // 32)).astype(np.float16)
    table = upload_q8_weight(card, [(qs, d)], "test.embd")
    ids = card.alloc(4, "test.ids")
    out = card.alloc(4 * dim, "test.out")
    ids.upload(np.array([0], np.int32))
    with card.capture("test.embed") as graph:
        embed_q8_0(card, table, ids, out, 1)
    try:
        exact = dequantize_q8_0(qs, d)
        for token in (5, 63, 17):
            ids.upload(np.array([token], np.int32))
            card.replay(graph)
            assert_equal(out.download(np.float32, (1, dim)), exact[[token]], f"replay with id {token}")
    finally:
        graph.close()
