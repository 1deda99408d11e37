"""The GPU vision tower (cuda_src/vision.cu, engine/cuda/vision.py) against the numpy tower and numpy kernels.

Kernel tests feed fp16-exact inputs (values rounded through float16 on the host) so the only error
left is the kernels' own: HFMA2 partial sums of 16 products in fp16, fp16 outputs. Bounds:
* GEMM: |err| ≤ 4e-3 · (|A|·|W|ᵀ) + 2e-3 · |out| + 1e-6 (up to 8 fp16 roundings per partial sum; fp16 GELU outputs);
* LayerNorm and the rotary split: fp16 output rounding, |err| ≤ 1e-3 · |ref| + 1e-3;
* position embeddings: fp32 arithmetic, 1e-5; patchify: exact;
* attention: |err| ≤ 4e-3 · max|v| (fp16 scores and output);
* whole tower (fp16 weights and activations through every block): max |err| ≤ 2e-2 · max|ref| and
  every token's cosine similarity with the fp32 reference ≥ 0.999.
Shapes include M, N and patch counts that are not multiples of 64, a K that is not a multiple of 32,
and the real head size 72.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.vision import GpuVisionTower
from engine.cuda.vision_kernels import (
    Epilogue,
    add_position_embeddings,
    attention,
    gemm,
    layernorm,
    patchify,
    split_qkv_rope,
)
from engine.vision.config import VisionConfig
from engine.vision.layers import apply_rotary, gelu_erf, gelu_tanh, layernorm as np_layernorm, rotary_2d_tables
from engine.vision.preprocess import PreparedImage
from engine.vision.random_mmproj import random_tower_weights
from engine.vision.tower import VisionTower, interpolated_positions, merge_order_coords
from tests.gpu.gpu_fixtures import assert_equal, assert_within


def f16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest float16 and back to float32 (inputs the kernels see exactly)."""
    return np.asarray(x, np.float32).astype(np.float16).astype(np.float32)


def config(n_embd: int, heads: int, n_ff: int, proj: int, side: int) -> VisionConfig:
    return VisionConfig(n_embd=n_embd, n_ff=n_ff, n_layers=2, n_head=heads, patch_size=16, merge_size=2,
                        image_size=16 * side, eps=1e-6, projection_dim=proj, image_mean=(0.5, 0.5, 0.5),
                        image_std=(0.5, 0.5, 0.5))


CONFIGS = {
    "tiny-hd16": config(32, 2, 48, 64, 4),
    "hd72-odd-ff": config(144, 2, 200, 96, 6),
}


def random_image(rng: np.random.Generator, height: int, width: int) -> PreparedImage:
    return PreparedImage(f16(rng.uniform(-1, 1, (3, height, width))), 16, 2)


@pytest.mark.parametrize("name, height, width", [("tiny-hd16", 64, 96), ("hd72-odd-ff", 160, 288), ("hd72-odd-ff", 32, 32)])
def test_tower_equals_numpy(card, rng, name, height, width):
    cfg = CONFIGS[name]
    weights = random_tower_weights(cfg, rng)
    image = random_image(rng, height, width)
    want = VisionTower(cfg, weights).encode(image)
    got = GpuVisionTower(card, cfg, weights).encode(image)
    assert_within(got, want, 2e-2 * np.abs(want).max(), f"{name} tower {height}x{width}")
    cosine = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.999, f"{name}: worst token cosine {cosine.min():.5f}"


@pytest.mark.parametrize("epilogue", list(Epilogue))
@pytest.mark.parametrize("m, n, k", [(70, 130, 200), (64, 64, 32), (5, 3, 2)])
def test_gemm(card, rng, epilogue, m, n, k):
    a = f16(rng.standard_normal((m, k)))
    w = f16(rng.standard_normal((n, k)) * k**-0.5)
    bias = rng.standard_normal(n).astype(np.float32)
    exact = a.astype(np.float64) @ w.T.astype(np.float64) + bias
    scale = np.abs(a).astype(np.float64) @ np.abs(w).T.astype(np.float64)
    residual = rng.standard_normal((m, n)).astype(np.float32)
    fp32_out = epilogue in (Epilogue.STORE, Epilogue.RESIDUAL)
    out = card.upload(residual, "test out") if fp32_out else card.alloc(m * n * 2, "test out")
    gemm(card, card.upload(a.astype(np.float16), "a"), card.upload(w.astype(np.float16), "w"),
         card.upload(bias, "bias"), out, m, n, k, epilogue)
    card.synchronize()
    if fp32_out:
        got = out.download(np.float32, (m, n))
        want = exact + (residual if epilogue == Epilogue.RESIDUAL else 0)
    else:
        got = out.download(np.float16, (m, n)).astype(np.float32)
        act = gelu_tanh if epilogue == Epilogue.GELU_TANH else gelu_erf
        want = act(exact.astype(np.float32))
        scale = scale * 1.2  # GELU's slope is at most ~1.13
    assert_within(got, want.astype(np.float32), 4e-3 * scale + 2e-3 * np.abs(want) + 1e-6, f"gemm {epilogue.name}")


def test_layernorm(card, rng):
    rows, width = 37, 144
    x = (rng.standard_normal((rows, width)) * 3 + 1).astype(np.float32)
    w, b = rng.standard_normal(width).astype(np.float32), rng.standard_normal(width).astype(np.float32)
    y = card.alloc(rows * width * 2, "y")
    layernorm(card, card.upload(x, "x"), card.upload(w, "w"), card.upload(b, "b"), y, rows, width, 1e-6)
    card.synchronize()
    want = np_layernorm(x, w, b, 1e-6)
    assert_within(y.download(np.float16, (rows, width)).astype(np.float32), want, 1e-3 * np.abs(want) + 1e-3, "layernorm")


def test_patchify_and_position_embeddings(card, rng):
    image = random_image(rng, 96, 160)
    gh, gw = image.grid
    n, width, side = gh * gw, 40, 4
    patches = card.alloc(image.pixels.size * 2, "patches")
    patchify(card, card.upload(image.pixels.astype(np.float16), "pixels"), 96, 160, 16, 2, patches)
    table = rng.standard_normal((side * side, width)).astype(np.float32)
    base = rng.standard_normal((n, width)).astype(np.float32)
    x = card.upload(base, "x")
    add_position_embeddings(card, x, card.upload(table, "table"), side, gh, gw, 2, width)
    card.synchronize()
    assert_equal(patches.download(np.float16, (n, 3 * 16 * 16)).astype(np.float32),
                 image.patches().reshape(n, -1), "patchify")
    rows, cols = merge_order_coords(gh, gw, 2)
    want = base + interpolated_positions(table, side, rows, cols, gh, gw)
    assert_within(x.download(np.float32, (n, width)), want, 1e-5, "position embeddings")


@pytest.mark.parametrize("head_dim", [16, 72])
def test_qkv_rope(card, rng, head_dim):
    gh, gw, heads = 6, 10, 3
    n, width = gh * gw, heads * head_dim
    qkv = rng.standard_normal((n, 3 * width)).astype(np.float32)
    q, k, v = (card.alloc(n * width * 2, name) for name in "qkv")
    split_qkv_rope(card, card.upload(qkv, "qkv"), n, heads, head_dim, gw, 2, q, k, v)
    card.synchronize()
    rows, cols = merge_order_coords(gh, gw, 2)
    cos, sin = rotary_2d_tables(rows.astype(np.float32), cols.astype(np.float32), head_dim)
    parts = qkv.reshape(n, 3, heads, head_dim)
    wants = [apply_rotary(parts[:, 0], cos, sin), apply_rotary(parts[:, 1], cos, sin), parts[:, 2]]
    for buf, want, what in zip((q, k, v), wants, "qkv"):
        got = buf.download(np.float16, (heads, n, head_dim)).astype(np.float32)
        want = want.transpose(1, 0, 2)
        assert_within(got, want, 1e-3 * np.abs(want) + 1e-3, f"rotary split {what}")


@pytest.mark.parametrize("head_dim", [16, 64, 72])
def test_attention(card, rng, head_dim):
    n, heads = 130, 2
    q, k, v = (f16(rng.standard_normal((heads, n, head_dim)) * s) for s in (1.5, 1.5, 1.0))
    out = card.alloc(n * heads * head_dim * 2, "out")
    attention(card, *(card.upload(t.astype(np.float16), name) for t, name in ((q, "q"), (k, "k"), (v, "v"))), out, n,
              heads, head_dim)
    card.synchronize()
    scores = q @ k.transpose(0, 2, 1) * head_dim**-0.5
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    want = (probs @ v).transpose(1, 0, 2).reshape(n, heads * head_dim)
    got = out.download(np.float16, (n, heads * head_dim)).astype(np.float32)
    assert_within(got, want, 4e-3 * np.abs(v).max(), f"attention d{head_dim}")
