"""The Q8_0 GEMV tables (engine.cuda.gemv: DEFAULT_GEMV per width, SHAPE_GEMV per matrix shape) are what the
committed sweeps measured, by the one rule of engine.cuda.bench.gemv_choice, so they cannot drift from the
measurements they cite; and a GEMV launch picks its shape's entry, falling back to the width's default."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from engine.cuda.bench.gemv_choice import choose
from engine.cuda.gemv import (DEFAULT_GEMV, GEMV_VARIANTS, SHAPE_GAIN, SHAPE_GEMV, alloc_q8_activations, gemv_q8,
                              gemv_variant, upload_q8_weight)
from fake_card import FakeCard

RESULTS = Path(__file__).resolve().parents[1] / "gpu" / "results"
# each width's last sweep on the H200 after its variants last changed (gemv.py's table comment)
SWEEPS = {t: RESULTS / f"2026-12-03-h200-{'s16b' if t in (3, 4) else 's16c'}-gemv-sweep-9b-t{t}.json"
          for t in range(1, 9)}


@pytest.mark.parametrize("tokens", sorted(SWEEPS))
def test_each_widths_tables_are_its_sweeps_choice(tokens):
    sweep = json.loads(SWEEPS[tokens].read_text())
    assert set(sweep["matrices"][0]["gb_per_s"]) == set(GEMV_VARIANTS[tokens]), "the sweep predates the variants"
    default, entries = choose(sweep, SHAPE_GAIN)
    assert DEFAULT_GEMV[tokens] == default
    assert {key: v for key, v in SHAPE_GEMV.items() if key[0] == tokens} == entries


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

    assert launched(4096, 4096, 1) == SHAPE_GEMV[(1, 4096, 4096)] == gemv_variant(1, 4096, 4096) != DEFAULT_GEMV[1]
    assert launched(4096, 12288, 1) == SHAPE_GEMV[(1, 4096, 12288)] != DEFAULT_GEMV[1]
    assert launched(12352, 4096, 1) == DEFAULT_GEMV[1]
    assert launched(256, 512, 8) == DEFAULT_GEMV[8]
