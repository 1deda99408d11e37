"""Each per-shape GEMV choice (engine.cuda.gemv.SHAPE_GEMV) is what the committed sweep of its width measured:
the fastest variant on a matrix of that shape, at least SHAPE_GAIN faster there than the width's default (for a
shape several matrices share, on their launches together), so the table cannot drift from the measurements
it cites; and a GEMV launch picks it, falling back to DEFAULT_GEMV for every other shape."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.cuda.gemv import (DEFAULT_GEMV, GEMV_VARIANTS, SHAPE_GAIN, SHAPE_GEMV, alloc_q8_activations, gemv_q8,
                              gemv_variant, upload_q8_weight)
from fake_card import FakeCard

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
SWEEPS = {t: RESULTS / f"2026-12-03-h200-s{11 if t <= 3 else 9}-gemv-sweep-9b-t{t}.json" for t in range(1, 9)}


def shape_times(sweep: dict) -> dict[tuple[int, int], dict[str, float]]:
    """(rows, k) -> variant -> µs of that shape's launches per step (bytes / GB/s x launches)."""
    times: dict[tuple[int, int], dict[str, float]] = {}
    for m in sweep["matrices"]:
        nbytes = m["rows"] * m["k"] * 34 / 32  # Q8_0: 32 int8 + one fp16 scale per 32 values
        per_shape = times.setdefault((m["rows"], m["k"]), {})
        for variant, gbps in m["gb_per_s"].items():
            per_shape[variant] = per_shape.get(variant, 0.0) + m["count_per_token"] * nbytes / gbps / 1e3
    return times


@pytest.mark.parametrize("key", sorted(SHAPE_GEMV))
def test_every_shape_choice_is_its_sweeps_measured_best(key):
    tokens, rows, k = key
    assert tokens in SWEEPS, f"no committed sweep on the current kernels for T={tokens}"
    times = shape_times(json.loads(SWEEPS[tokens].read_text()))[(rows, k)]
    chosen, default = SHAPE_GEMV[key], DEFAULT_GEMV[tokens]
    assert chosen in GEMV_VARIANTS[tokens] and chosen == min(times, key=times.__getitem__)
    assert times[default] / times[chosen] >= SHAPE_GAIN


@pytest.mark.parametrize("tokens", sorted(SWEEPS))
def test_no_shape_the_sweeps_found_faster_is_left_out(tokens):
    for (rows, k), times in shape_times(json.loads(SWEEPS[tokens].read_text())).items():
        best = min(times, key=times.__getitem__)
        if times[DEFAULT_GEMV[tokens]] / times[best] >= SHAPE_GAIN:
            assert SHAPE_GEMV.get((tokens, rows, k)) == best, (tokens, rows, k)


def test_a_launch_takes_its_shapes_variant_else_the_widths_default():
    card = FakeCard()
    rng = np.random.default_rng(0)

    def launched(rows: int, k: int, tokens: int) -> str:
        parts = [(rng.integers(-8, 8, (rows, k), dtype=np.int8), np.ones((rows, k // 32), np.float16))]
        w = upload_q8_weight(card, parts, "w")
        x = alloc_q8_activations(card, k, tokens, "x")
        y = card.alloc(4 * rows * tokens, "y")
        card.launches.clear()
        gemv_q8(card, w, x, y, tokens)
        return card.launches[-1][0]

    assert launched(12352, 4096, 8) == SHAPE_GEMV[(8, 12352, 4096)] == gemv_variant(8, 12352, 4096)
    assert launched(12352, 4096, 1) == DEFAULT_GEMV[1]
    assert launched(4096, 4096, 1) == SHAPE_GEMV[(1, 4096, 4096)] != DEFAULT_GEMV[1]
    assert launched(256, 512, 8) == DEFAULT_GEMV[8]
