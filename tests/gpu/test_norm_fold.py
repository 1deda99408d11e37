"""The RMSNorm folded into the GEMV (cuda_src/norm_fold.cuh) gives the two launches' bits.

The fold sums in the decode norm's order, so its Q8_1 output and the GEMV's sums must equal rmsnorm_q8_1's (at the
decode shape, engine.cuda.norm.norm_shape) followed by the plain GEMV, bit for bit: any other order shows up as a
flipped int8 level or a last-bit difference in a row. Checked for every Q8_0 variant of each width and the K-quant
defaults, eagerly and replayed in a graph whose memset zeroes the launch's counter each time, with grids from one
block (every slice taken by that block in turn) to many waves; the counter then holds the slice count.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.gemv import GEMV_VARIANTS, MAX_GEMV_TOKENS, alloc_q8_activations, gemv_q8, upload_q8_weight
from engine.cuda.kq_weight import gemv_kq, upload_kq_weight
from engine.cuda.norm import norm_shape, rmsnorm_q8_1
from engine.cuda.norm_fold import FoldCounters, FoldedNorm
from tests.gpu.gpu_fixtures import assert_equal, random_q8_weight
from tests.kquant_data import KQ_TYPES, random_kquant_bytes

EPS = 1e-6


def norm_case(card, rng, tokens: int, k: int):
    """Residual-like rows (a few large channels, as a trained model's) and a norm weight around 1."""
    x = rng.standard_normal((tokens, k)).astype(np.float32) * np.float32(3.0)
    x[:, rng.integers(0, k, 8)] *= np.float32(40.0)
    w = (1.0 + 0.2 * rng.standard_normal(k)).astype(np.float32)
    return card.upload(x, "test.norm_x"), card.upload(w, "test.norm_w")


def two_launches(card, x, w, act, tokens: int, k: int, gemv) -> None:
    grid, threads = norm_shape(tokens)
    rmsnorm_q8_1(card, x, k, w, tokens, k, EPS, act.xq, act.xd, k, grid, threads)
    gemv(None)


def outputs(act, y, tokens: int, k: int, rows: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (act.xq.download(np.int8, (tokens, k)), act.xd.download(np.float32, (tokens, k // 32)),
            y.download(np.float32, (tokens, rows)))


def check_fold(card, x, w, tokens: int, k: int, rows: int, launch, what: str) -> None:
    """launch(act, y, norm): one GEMV of `tokens` rows; compares the fold (eager, then a graph replayed three
    times) with the norm kernel and the same GEMV."""
    plain_act, fold_act = (alloc_q8_activations(card, k, tokens, f"test.{n}") for n in ("plain", "fold"))
    plain_y, fold_y = (card.alloc(4 * rows * tokens, f"test.{n}_y") for n in ("plain", "fold"))
    two_launches(card, x, w, plain_act, tokens, k, lambda norm: launch(plain_act, plain_y, norm))
    want = outputs(plain_act, plain_y, tokens, k, rows)
    counters = FoldCounters(card, 1, "test.counters")
    slices = tokens * min(32, 64 // tokens)  # norm_fold.cuh's slice blocks

    def folded() -> None:
        counters.begin_pass()
        launch(fold_act, fold_y, FoldedNorm(x, w, EPS, counters.next()))

    folded()
    for name, got, expected in zip(("xq", "xd", "y"), outputs(fold_act, fold_y, tokens, k, rows), want):
        assert_equal(got, expected, f"{what}: folded {name} (eager)")
    assert counters.buf.download(np.uint32, 1)[0] == slices, f"{what}: slices counted"
    with card.capture("test.fold") as graph:
        folded()
    for replay in range(3):
        fold_act.xq.upload(np.zeros((tokens, k), np.int8))
        fold_y.upload(np.zeros((tokens, rows), np.float32))
        card.replay(graph)
        card.stream.synchronize()
        for name, got, expected in zip(("xq", "xd", "y"), outputs(fold_act, fold_y, tokens, k, rows), want):
            assert_equal(got, expected, f"{what}: folded {name} (graph replay {replay})")
    assert counters.buf.download(np.uint32, 1)[0] == slices, f"{what}: slices counted"


@pytest.mark.parametrize("tokens", range(1, MAX_GEMV_TOKENS + 1))
@pytest.mark.parametrize("rows,k", [(4096, 4096), (300, 5120), (24576, 4096)])
def test_every_q8_variant_folds_the_norm_bit_for_bit(card, rng, tokens, rows, k):
    x, w = norm_case(card, rng, tokens, k)
    qs, d, _ = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    for variant in GEMV_VARIANTS[tokens]:
        check_fold(card, x, w, tokens, k, rows,
                   lambda act, y, norm, v=variant: gemv_q8(card, weight, act, y, tokens, variant=v, norm=norm),
                   f"{variant} [{rows}x{k}]")


@pytest.mark.parametrize("tokens", [1, 3, 8])
def test_a_grid_smaller_than_the_slices_takes_them_in_turn(card, rng, tokens):
    """One block (max_blocks=1) must do all the slices itself before it may wait; four blocks share them."""
    k, rows = 4096, 64
    x, w = norm_case(card, rng, tokens, k)
    qs, d, _ = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    for blocks in (1, 4):
        check_fold(card, x, w, tokens, k, rows,
                   lambda act, y, norm, b=blocks: gemv_q8(card, weight, act, y, tokens, max_blocks=b, norm=norm),
                   f"max_blocks={blocks}")


@pytest.mark.parametrize("tokens", [1, 2, 8])
@pytest.mark.parametrize("qtype", KQ_TYPES, ids=lambda q: q.name)
def test_k_quant_gemvs_fold_the_norm_bit_for_bit(card, rng, qtype, tokens):
    rows, k = 2001, 5120
    x, w = norm_case(card, rng, tokens, k)
    weight = upload_kq_weight(card, qtype, [random_kquant_bytes(rng, qtype, rows, k)], k, "test.kq")
    check_fold(card, x, w, tokens, k, rows,
               lambda act, y, norm: gemv_kq(card, weight, act, y, tokens, norm=norm), f"{qtype.name} T={tokens}")
