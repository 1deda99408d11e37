"""The SwiGLU kernel (cuda_src/elementwise.cu) against numpy on random inputs, and the MTP head's row pick.

`swiglu_q8_1`: silu(gate) * up with the reference's `silu` (engine.reference.activations), fp32 within
SWIGLU_TOL = 1e-6 of max|ref| (expf against numpy's exp, a few ulp); its Q8_1 output must be exactly the
quantisation of its own fp32 output.

`copy_last_step_row`: a copy, so bit for bit: row min(max(n, 1), rows) - 1 for the step record's n.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.mtp import copy_last_step_row
from engine.cuda.q8_layout import quantize_q8_1
from engine.reference.activations import silu
from tests.gpu.gpu_fixtures import assert_equal, assert_within

SWIGLU_TOL = 1e-6
F32 = 4


def run_swiglu(card, stacked: np.ndarray, n: int, up_col: int, threads: int, fp32_out: bool, quantize: bool):
    """swiglu_q8_1 over the rows of `stacked`: gate = columns [0, n), up = columns [up_col, up_col + n)."""
    n_rows, stride = stacked.shape
    src = card.upload(stacked, "test gate+up")
    y = card.alloc(n_rows * n * F32, "test y") if fp32_out else None
    yq = card.alloc(n_rows * n, "test yq") if quantize else None
    yd = card.alloc(n_rows * n // 32 * F32, "test yd") if quantize else None
    warps = n_rows * n // 32
    card.kernel("swiglu_q8_1").launch(
        -(-warps * 32 // threads), threads, src, src.view(up_col * F32, src.nbytes - up_col * F32), np.int32(stride),
        np.int32(n), np.int32(n_rows), y, yq, yd, None, np.int64(0),
    )
    out = {}
    if fp32_out:
        out["y"] = y.download(np.float32, (n_rows, n))
    if quantize:
        out["yq"] = yq.download(np.int8, (n_rows, n))
        out["yd"] = yd.download(np.float32, (n_rows, n // 32))
    return out


@pytest.mark.parametrize(
    "n, n_rows, stacked, threads",
    [(128, 1, True, 256), (12288, 1, True, 256), (17408, 3, True, 128), (3584, 17, False, 256), (96, 65, False, 96)],
)
def test_swiglu(card, rng, n, n_rows, stacked, threads):
    """Gate and up side by side in one [T, 2n] GEMV output (up = gate + n) or in separate padded rows."""
    width = 2 * n if stacked else 2 * n + 40  # separate: gate at [0, n), up at [n + 40, 2n + 40)
    rows = (3.0 * rng.standard_normal((n_rows, width))).astype(np.float32)
    rows[:, :32] *= 30.0  # silu far into both tails
    up_col = n if stacked else n + 40
    gate, up = rows[:, :n], rows[:, up_col : up_col + n]
    want = silu(gate) * up
    out = run_swiglu(card, rows, n, up_col, threads, fp32_out=True, quantize=True)
    what = f"swiglu n={n} rows={n_rows}"
    assert_within(out["y"], want, SWIGLU_TOL * float(np.max(np.abs(want))), what)
    want_q, want_d = quantize_q8_1(out["y"])
    assert_equal(out["yd"], want_d, f"{what}: Q8_1 scales")
    assert_equal(out["yq"], want_q, f"{what}: Q8_1 values")
    alone = run_swiglu(card, rows, n, up_col, threads, fp32_out=False, quantize=True)
    assert_equal(alone["yq"], out["yq"], f"{what}: Q8_1 values without the fp32 output requested")
    assert_equal(alone["yd"], out["yd"], f"{what}: Q8_1 scales without the fp32 output requested")


@pytest.mark.parametrize("width, rows", [(4096, 2), (5120, 3), (96, 8), (300, 1)])
def test_copy_last_step_row_copies_the_row_its_step_record_counts_to(card, rng, width, rows):
    """Every count 1..rows picks its row; a count past the rows picks the last, one below 1 the first: never the
    canary row the source holds after its `rows` rows."""
    src = rng.standard_normal((rows + 1, width)).astype(np.float32)  # the last row is a canary the kernel never reads
    source = card.upload(src, "test rows")
    step = card.alloc(8, "test step")
    out = card.alloc(F32 * width, "test out")
    for n, want in [(n, n - 1) for n in range(1, rows + 1)] + [(rows + 1, rows - 1), (0, 0), (-3, 0)]:
        step.upload(np.asarray([17, n], np.int32))
        copy_last_step_row(card, source, width, rows, step, out)
        card.synchronize()
        assert_equal(out.download(np.float32, width), src[want], f"n={n}")
