"""The sparse prefill sweep (engine.cuda.bench.sparse_bench): its estimate's arithmetic, and its host code on a stand-in
card (no GPU), so the H200 run cannot stop on a Python error. Speeds themselves are the GPU's to measure."""

from __future__ import annotations

import json

import numpy as np
import pytest

from engine.cuda.bench.sparse_bench import (
    CROSS_CHECK_LENGTH,
    SPARSE_MIN_LENGTH,
    first_sparse_depth,
    prompt_seconds,
    render_sparse_sweep,
    sample_depths,
    sparse_sweep,
)
from engine.cuda.weights import upload_weights
from pathlib import Path
from engine.gguf.loader import load_model
from fake_card import FakeCard

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"


def test_an_affine_chunk_cost_integrates_exactly():
    chunk = 256
    cost = lambda d: 5.0 + 1e-3 * d  # noqa: E731  ms per chunk at depth d
    samples = {d: cost(d) for d in (0, 4096, 65280)}
    for length in (4096, 16384, 65536):
        exact = sum(cost(d) for d in range(0, length, chunk)) * 1e-3
        assert prompt_seconds(samples, length, chunk) == pytest.approx(exact, rel=1e-12)


def test_sampled_depths_bracket_the_sparse_threshold_and_end_every_prompt():
    chunk = 256
    depths = sample_depths((16384, 65536), chunk)
    first = first_sparse_depth(chunk)
    assert first + chunk >= SPARSE_MIN_LENGTH > first  # the first chunk SparsePrefill.applies to
    assert {0, first - chunk, first, 16384 - chunk, 65536 - chunk, CROSS_CHECK_LENGTH - chunk} <= set(depths)
    assert all(d % chunk == 0 for d in depths) and depths == sorted(set(depths))


class TimedFakeCard(FakeCard):
    """A stand-in whose events report a fixed 1 ms."""

    def event(self):
        class Event:
            def record(self, stream=None):
                return self

            def elapsed_ms(self, start):
                return 1.0

        return Event()


def test_the_sweep_runs_its_host_code_and_writes_json():
    fixture = load_model(FIXTURE)  # head_dim 128: the quantised sparse kernel's width
    card = TimedFakeCard()
    weights = upload_weights(card, fixture.file, fixture.config)
    r = sparse_sweep(card, fixture.config, weights, "fixture", (8192,), ("f16", "k3v3"), chunk=256, reps=1)
    assert set(r["chunk_ms"]) == {"dense f16", "dense k3v3", "sparse f16", "sparse k3v3"}
    assert set(r["chunk_ms"]["sparse f16"]) == set(r["sampled_depths"])
    assert set(r["attention_rel_error"]["by_depth"]) == {d for d in r["sampled_depths"] if d >= first_sparse_depth(256)}
    # 1 ms per chunk everywhere: tokens/s = 256 tokens per ms
    assert r["prefill_tokens_per_s"]["sparse f16"][8192] == pytest.approx(256e3)
    names = [name for name, *_ in card.launches]
    assert {"sparse_prefill_d128", "kv_prefill_k3v3_d128", "sparse_prefill_k3v3_d128"} <= set(names)
    json.dumps(r, default=str)
    assert "8192" in render_sparse_sweep(r) and np.isnan(r["attention_rel_error"]["by_depth"][first_sparse_depth(256)])
