"""RMSNorm and the attention prep (cuda_src/norm_rope.cu) against the numpy reference on random inputs.

Truths: `engine.reference.norms.rmsnorm` for `rmsnorm_q8_1`; for `attn_prep`, the reference's per-head
RMSNorm followed by `engine.reference.rope.Rope.apply` (IMROPE, angles from the same fp32 inv_freq table
the kernel is given); Q8_1 per `engine.reference.activation_rounding`.

Tolerances (relative to the largest reference magnitude of the compared array; any NaN fails):
- NORM_TOL = 1e-6: fp32 throughout, only the sum of squares is reduced in another order.
- PREP_TOL = 1e-5: adds sincosf against numpy's cos/sin of the same fp32 angle (a few ulp each).
- K cache: within one fp16 rounding of the reference (2^-11 relative) plus PREP_TOL; V cache: exactly the
  fp16 conversion of the input. Rows the batch does not own must keep their NaN sentinel.
- Q8_1 outputs: exactly the quantisation of the kernel's own fp32 output (same rule, same input).
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.reference.norms import rmsnorm
from engine.reference.rope import text_positions
from tests.gpu.attention_fixtures import (
    F32,
    SHAPE_08B,
    SHAPE_27B,
    SHAPE_DEMO,
    SHAPE_TINY,
    SHAPES,
    AttnShape,
    DeviceAttention,
    assert_close,
    assert_q8_1_of,
    random_gain,
    random_projections,
    reference_prep,
)
from tests.gpu.gpu_fixtures import assert_equal

NORM_TOL = 1e-6
PREP_TOL = 1e-5
EPS = 1e-6


def run_rmsnorm(card, x: np.ndarray, w: np.ndarray, threads: int, fp32_out: bool = True,
                quantize: bool = True, slices: int = 1) -> dict[str, np.ndarray]:
    """One rmsnorm_q8_1 launch over the rows of x (each row split over `slices` blocks); returns the outputs
    asked for and x as left on the card."""
    n_rows, n = x.shape
    x_dev = card.upload(x, "test x")
    y = card.alloc(x.nbytes, "test y") if fp32_out else None
    xq = card.alloc(n_rows * n, "test xq") if quantize else None
    xd = card.alloc(n_rows * n // 32 * F32, "test xd") if quantize else None
    card.kernel("rmsnorm_q8_1").launch(
        (n_rows, slices), threads, x_dev, np.int32(n), card.upload(w, "test w"), np.int32(n), np.float32(EPS), y, xq, xd,
        np.int32(n), None, np.int64(0),
    )
    out = {"x": x_dev.download(np.float32, x.shape)}
    if fp32_out:
        out["y"] = y.download(np.float32, x.shape)
    if quantize:
        out["xq"] = xq.download(np.int8, x.shape)
        out["xd"] = xd.download(np.float32, (n_rows, n // 32))
    return out


def random_rows(n_rows: int, n: int, rng: np.random.Generator) -> np.ndarray:
    """N(0, 2) rows scaled by 1e-3 to 1e3; row 0 has an all-zero 32-block, and with 3 or more rows the last
    row is all zeros (both must quantise to q = 0 with scale 0)."""
    x = (2.0 * rng.standard_normal((n_rows, n))).astype(np.float32)
    x *= np.float32(10.0) ** rng.integers(-3, 4, (n_rows, 1)).astype(np.float32)
    x[0, n - 32 :] = 0.0
    if n_rows >= 3:
        x[-1] = 0.0
    return x


@pytest.mark.parametrize(
    "n, n_rows, threads",
    [(64, 3, 256), (96, 5, 32), (1024, 1, 1024), (2048, 2, 64), (4096, 17, 256), (5120, 1, 1024), (5120, 65, 256)],
)
def test_rmsnorm_outputs(card, rng, n, n_rows, threads):
    x, w = random_rows(n_rows, n, rng), random_gain(n, rng)
    out = run_rmsnorm(card, x, w, threads)
    assert_equal(out["x"], x, "rmsnorm_q8_1 input after the launch (must be unchanged)")
    assert_close(f"rmsnorm n={n} rows={n_rows}", out["y"], rmsnorm(x, w, EPS), NORM_TOL)
    assert_q8_1_of(f"rmsnorm Q8_1 n={n} rows={n_rows}", out["xq"], out["xd"], out["y"])
    alone = run_rmsnorm(card, x, w, threads, fp32_out=False)  # quantised output only: the same bytes
    assert_equal(alone["xq"], out["xq"], "Q8_1 values without the fp32 output requested")
    assert_equal(alone["xd"], out["xd"], "Q8_1 scales without the fp32 output requested")
    fp32_only = run_rmsnorm(card, x, w, threads, quantize=False)
    assert_equal(fp32_only["y"], out["y"], "fp32 output without Q8_1 requested")


@pytest.mark.parametrize("n, n_rows, slices", [(4096, 1, 8), (5120, 1, 8), (5120, 3, 3), (96, 2, 4)])
def test_rmsnorm_split_over_blocks_gives_the_same_bits(card, rng, n, n_rows, slices):
    """The decode launch splits a row over several blocks; every output bit must equal the one-block launch."""
    x, w = random_rows(n_rows, n, rng), random_gain(n, rng)
    whole = run_rmsnorm(card, x, w, 1024)
    split = run_rmsnorm(card, x, w, 1024, slices=slices)
    for key in ("y", "xq", "xd"):
        assert_equal(split[key], whole[key], f"rmsnorm {key} with the row split over {slices} blocks")


def test_rmsnorm_fills_halves_of_a_wider_row(card, rng):
    """The MTP block's input: two norms write the two halves of one [T, 2D] row (strided in and out)."""
    n_rows, n, pad = 5, 256, 32
    parts = [random_rows(n_rows, n + pad, rng) for _ in range(2)]  # padded input rows: in_stride n + pad
    gains = [random_gain(n, rng) for _ in range(2)]
    y = card.alloc(n_rows * 2 * n * F32, "test y")
    xq = card.alloc(n_rows * 2 * n, "test xq")
    xd = card.alloc(n_rows * 2 * n // 32 * F32, "test xd")
    for half, (x, w) in enumerate(zip(parts, gains)):
        card.kernel("rmsnorm_q8_1").launch(
            n_rows, 128, card.upload(x, "test x"), np.int32(n + pad), card.upload(w, "test w"), np.int32(n),
            np.float32(EPS), y.view(half * n * F32, y.nbytes - half * n * F32), xq.view(half * n, xq.nbytes - half * n),
            xd.view(half * n // 32 * F32, xd.nbytes - half * n // 32 * F32), np.int32(2 * n), None, np.int64(0),
        )
    got = y.download(np.float32, (n_rows, 2 * n))
    want = np.concatenate([rmsnorm(x[:, :n], w, EPS) for x, w in zip(parts, gains)], axis=1)
    assert_close("two half-row norms", got, want, NORM_TOL)
    assert_q8_1_of("two half-row norms, Q8_1", xq.download(np.int8, (n_rows, 2 * n)),
                   xd.download(np.float32, (n_rows, 2 * n // 32)), got)


def check_prep(dev: DeviceAttention, shape: AttnShape, proj, pos: int, positions: np.ndarray, what: str) -> None:
    """Run attn_prep and compare q, the written cache rows, and the untouched rows with the reference."""
    n_tok = proj.n_tokens
    dev.set_pos(pos, n_tok)
    _, q_out = dev.prep(proj, positions)
    ref_positions = text_positions(pos, n_tok) if positions is None else positions
    want_q, want_k = reference_prep(shape, proj.qg, proj.k, dev.q_norm, dev.k_norm, ref_positions)
    q = q_out.download(np.float32, (n_tok, shape.n_head, shape.head_dim))
    assert_close(f"{what}: q", q, want_q, PREP_TOL)

    keys, values = dev.cache()
    rows = slice(pos, pos + n_tok)
    k_new = keys[:, rows].transpose(1, 0, 2).astype(np.float32)  # [T, Hkv, Dh]
    k_err = np.abs(k_new - want_k) - (2.0**-11 * np.abs(want_k) + PREP_TOL * np.max(np.abs(want_k)))
    assert np.all(k_err <= 0), (
        f"{what}: K cache row {pos + int(np.argwhere(k_err > 0)[0][0])} is more than one fp16 rounding from the "
        f"reference (worst excess {float(np.max(k_err)):.3g})"
    )
    want_v = proj.v.reshape(n_tok, shape.n_head_kv, shape.head_dim).astype(np.float16)
    assert_equal(values[:, rows].transpose(1, 0, 2), want_v, f"{what}: V cache rows against fp16(v)")
    outside = np.ones(dev.capacity, bool)
    outside[rows] = False
    for name, cache in (("K", keys), ("V", values)):
        touched = np.argwhere(~np.isnan(cache[:, outside].astype(np.float32)))
        assert len(touched) == 0, f"{what}: {name} cache written outside rows [{pos}, {pos + n_tok}): {touched[0]}"


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: s.name)
@pytest.mark.parametrize("n_tok", [1, 3, 17, 65])
@pytest.mark.parametrize("pos", [0, 300])
def test_attn_prep_text(card, rng, shape, n_tok, pos):
    dev = DeviceAttention(card, shape, capacity=pos + n_tok + 7, rng=rng)
    check_prep(dev, shape, random_projections(shape, n_tok, rng), pos, None, f"{shape.name} T={n_tok} pos={pos}")


def test_attn_prep_at_the_end_of_a_long_context(card, rng):
    """Angles near 2.6e5 rad (sincosf's slow argument reduction) and cache offsets past 2^26 elements."""
    pos, n_tok = 262_000, 3
    dev = DeviceAttention(card, SHAPE_08B, capacity=pos + n_tok + 1, rng=rng)
    check_prep(dev, SHAPE_08B, random_projections(SHAPE_08B, n_tok, rng), pos, None, "pos 262000")


@pytest.mark.parametrize("shape", [SHAPE_27B, SHAPE_DEMO, SHAPE_TINY], ids=lambda s: s.name)
def test_attn_prep_image_positions(card, rng, shape):
    """Explicit (t, h, w) positions that differ per component: each rotary pair must take its IMROPE section."""
    pos, n_tok, grid_w = 40, 12, 4
    dev = DeviceAttention(card, shape, capacity=pos + n_tok, rng=rng)
    cell = np.arange(n_tok)
    positions = np.stack([np.full(n_tok, 41), 41 + cell // grid_w, 41 + cell % grid_w], axis=1).astype(np.int64)
    check_prep(dev, shape, random_projections(shape, n_tok, rng), pos, positions, f"{shape.name} image positions")
