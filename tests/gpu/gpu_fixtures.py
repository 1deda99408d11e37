"""Helpers shared by the GPU tests: random Q8 data in the device layouts, and comparisons that explain failures.

Every kernel test compares against numpy on fresh random inputs; when it fails, the message must say
by how much and where (max error, first bad index, the values there), because the GPU machine is
reached in short batched sessions and a bare `assert` costs a whole round trip.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np

from engine.cuda.gemv import Q8Activations, alloc_q8_activations, upload_q8_weight
from engine.cuda.q8_layout import QK, dequantize_q8_0, dequantize_q8_1, quantize_q8_1


def random_q8_weight(rng: np.random.Generator, rows: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(qs int8 [rows, k], d fp16 [rows, k/32], W float64 [rows, k]): random Q8_0 weights and their exact value."""
    qs = rng.integers(-127, 128, size=(rows, k), dtype=np.int8)
    d = (rng.uniform(0.5, 2.0, size=(rows, k // QK)) / 256).astype(np.float16)
    return qs, d, dequantize_q8_0(qs, d).astype(np.float64)


def random_activations(rng: np.random.Generator, tokens: int, k: int) -> np.ndarray:
    """fp32 [tokens, k] whose 32-blocks span six orders of magnitude, with one all-zero block per row."""
    blocks = k // QK
    scale = 10.0 ** rng.uniform(-3, 3, size=(tokens, blocks, 1))
    x = rng.standard_normal((tokens, blocks, QK)) * scale
    x[:, rng.integers(blocks), :] = 0.0
    return x.reshape(tokens, k).astype(np.float32)


def _where(index: tuple[int, ...], actual: np.ndarray, expected: np.ndarray) -> str:
    return f"first at index {index}: got {actual[index]!r}, expected {expected[index]!r}"


def assert_equal(actual: np.ndarray, expected: np.ndarray, what: str) -> None:
    """Bit-exact equality, reporting the count and first position of mismatches."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    bad = actual != expected
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} values differ; {_where(first, actual, expected)}")


def assert_within(actual: np.ndarray, expected: np.ndarray, bound: np.ndarray | float, what: str) -> None:
    """|actual - expected| <= bound elementwise (bound broadcast), reporting the worst and the first breach."""
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    err = np.abs(actual.astype(np.float64) - expected.astype(np.float64))
    limit = np.broadcast_to(np.asarray(bound, dtype=np.float64), err.shape)
    bad = ~(err <= limit)  # NaN counts as bad
    if bad.any():
        first = tuple(int(i) for i in np.argwhere(bad)[0])
        worst = np.unravel_index(int(np.nanargmax(np.where(bad, err / np.maximum(limit, 1e-300), 0))), err.shape)
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {bad.size} values off; max abs error {np.nanmax(err):.3e} "
            f"(worst {err[worst]:.3e} vs bound {limit[worst]:.3e} at {tuple(int(i) for i in worst)}); "
            f"{_where(first, actual, expected)}"
        )


def gemv_error_bound(w: np.ndarray, x: np.ndarray, rel: float = 1e-5) -> np.ndarray:
    """Per-output bound for an fp32 sum of the products W[r, k] x[t, k]: rel x sum_k |W x| ([t, rows]).

    Relative to the sum of magnitudes, not to |y|, because cancellation can make y tiny while fp32
    rounding scales with the terms; an indexing or scale bug gives errors of order 1 in these units.
    """
    return rel * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-30


def run_on_thread(fn: Callable[[], Any]) -> Any:
    """Run `fn` on a fresh thread (e.g. to own a second CUDA context) and return its result or raise its error."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as err:  # re-raised on the calling thread
            result["error"] = err

    thread = threading.Thread(target=target)
    thread.start()
    thread.join()
    if "error" in result:
        raise result["error"]
    return result.get("value")


def upload_activations(card, x: np.ndarray) -> tuple[Q8Activations, np.ndarray]:
    """Quantize x [T, K] on the host, upload it, and return it with the dequantized values the kernel sees."""
    xq, xd = quantize_q8_1(x)
    act = alloc_q8_activations(card, x.shape[1], x.shape[0], "test.x")
    act.xq.upload(xq)
    act.xd.upload(xd)
    return act, dequantize_q8_1(xq, xd)


def check_stacked_segments(card, rng: np.random.Generator, matmul: Callable[..., None], tokens: int, k: int,
                           row_counts: tuple[int, ...]) -> None:
    """Matrices stacked on one input (as GDN qkv, z, b, a): segment i of the output is its own [T][rows_i]."""
    parts = [random_q8_weight(rng, rows, k) for rows in row_counts]
    weight = upload_q8_weight(card, [(qs, d) for qs, d, _ in parts], "test.stacked")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    y = card.alloc(4 * weight.rows * tokens, "test.y")
    matmul(card, weight, act, y, tokens)
    for i, (_, _, w) in enumerate(parts):
        got = weight.segment_view(y, i, tokens).download(np.float32, (tokens, w.shape[0]))
        assert_within(got, x.astype(np.float64) @ w.T, gemv_error_bound(w, x), f"segment {i} T={tokens}")


def check_residual_epilogue(card, rng: np.random.Generator, matmul: Callable[..., None], tokens: int, rows: int,
                            k: int) -> None:
    """y = r + Wx into a separate buffer (r untouched), then r += Wx in place."""
    qs, d, w = random_q8_weight(rng, rows, k)
    weight = upload_q8_weight(card, [(qs, d)], "test.w")
    act, x = upload_activations(card, random_activations(rng, tokens, k))
    residual = rng.standard_normal((tokens, rows)).astype(np.float32)
    expected = residual.astype(np.float64) + x.astype(np.float64) @ w.T
    bound = gemv_error_bound(w, x) + 1e-6 * np.abs(residual)

    res_buf = card.upload(residual, "test.residual")
    y = card.alloc(4 * rows * tokens, "test.y")
    matmul(card, weight, act, y, tokens, residual=res_buf)
    assert_within(y.download(np.float32, (tokens, rows)), expected, bound, f"y = r + Wx, T={tokens}")
    np.testing.assert_array_equal(res_buf.download(np.float32, (tokens, rows)), residual)  # input untouched

    matmul(card, weight, act, res_buf, tokens, residual=res_buf)
    assert_within(res_buf.download(np.float32, (tokens, rows)), expected, bound, f"r += Wx in place, T={tokens}")


def check_same_bits(card, rng: np.random.Generator, matmul: Callable[..., None], weight: Any, act: Q8Activations,
                    tokens: int, variants: dict[str, dict[str, Any]]) -> None:
    """`matmul` (weight, act, y, tokens, residual=...) under each variant's keyword arguments writes the first
    variant's bits, with a residual; outputs start as NaN, so an element left unwritten fails."""
    rows = weight.rows
    residual = card.upload(rng.standard_normal(rows * tokens).astype(np.float32), "test.residual")
    outs = {}
    for name, kwargs in variants.items():
        y = card.upload(np.full(rows * tokens, np.nan, np.float32), f"test.y {name}")
        matmul(card, weight, act, y, tokens, residual=residual, **kwargs)
        outs[name] = y.download(np.float32, (tokens, rows))
    first = next(iter(outs.values()))
    for name, got in outs.items():
        np.testing.assert_array_equal(got, first, err_msg=name)
