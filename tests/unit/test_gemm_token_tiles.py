"""The prefill GEMMs' token tile on the host: short chunks launch the 16- and 32-token kernels with their grids
(gemm.gemm_token_tile, measured in s22e), for Q8_0 and K-quant weights, and a narrow tile is refused in the staging
that has none (test_gemm_sampling_mirrors checks the kernels exist). tests/gpu holds every tile to the 64-token
tile's bits."""

from __future__ import annotations

import pytest

from gguf import GGMLQuantizationType

from engine.cuda.gemm import gemm_q8
from engine.cuda.gemv import Q8Activations, Q8Weight
from engine.cuda.kq_weight import KQWeight, gemm_kq
from fake_card import FakeCard


def weight_and_input(card: FakeCard, rows: int, k: int, tokens: int) -> tuple[Q8Weight, Q8Activations]:
    w = Q8Weight(card.alloc(rows * k, "w.qs"), card.alloc(2 * rows * k // 32, "w.d"), rows, k, (rows,))
    x = Q8Activations(card.alloc(tokens * k, "x.q"), card.alloc(4 * tokens * k // 32, "x.d"), k, tokens)
    return w, x


@pytest.mark.parametrize("tokens,kernel,token_tiles", [
    (9, "gemm_q8_0_q8_1_db_t16", 1), (16, "gemm_q8_0_q8_1_db_t16", 1), (17, "gemm_q8_0_q8_1_db_t32", 1),
    (32, "gemm_q8_0_q8_1_db_t32", 1), (33, "gemm_q8_0_q8_1_db", 1), (54, "gemm_q8_0_q8_1_db", 1),
    (256, "gemm_q8_0_q8_1_db", 4)])
def test_a_chunk_launches_its_token_tiles_kernel_and_grid(tokens, kernel, token_tiles):
    card = FakeCard()
    w, x = weight_and_input(card, 4096 + 32, 256, tokens)
    gemm_q8(card, w, x, card.alloc(4 * w.rows * tokens, "y"), tokens)
    kq = KQWeight(w.qs, GGMLQuantizationType.Q4_K, w.rows, w.k, w.segments)
    gemm_kq(card, kq, x, card.alloc(4 * w.rows * tokens, "y"), tokens)
    assert [launch[:3] for launch in card.launches] == [(kernel, (token_tiles, 65), 256),
                                                        (kernel.replace("q8_0", "q4_k"), (token_tiles, 65), 256)]


def test_a_narrow_tile_is_refused_outside_the_default_staging():
    card = FakeCard()
    w, x = weight_and_input(card, 64, 256, 16)
    with pytest.raises(ValueError, match="16-token"):
        gemm_q8(card, w, x, card.alloc(4 * 64 * 16, "y"), 16, staging="", tile_tokens=16)
    with pytest.raises(ValueError, match="48-token"):
        gemm_q8(card, w, x, card.alloc(4 * 64 * 16, "y"), 16, tile_tokens=48)
    assert not card.launches
