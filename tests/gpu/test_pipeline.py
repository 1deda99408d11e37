"""Layers split over several cards compute exactly what one card computes: the same kernels run on the same
rows, and the fp32 hidden rows cross pinned host memory unchanged. The cards are logical (contexts on GPU
0) unless RIGLLM_TEST_DEVICES lists GPUs to cycle through (e.g. "0,1" on a two-GPU host)."""

from __future__ import annotations

import os

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.cuda.pipeline import BridgeModel
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.gguf.shapes import shape_config
from engine.fixtures.synthetic import write_random_model

DEVICES = [int(d) for d in os.environ.get("RIGLLM_TEST_DEVICES", "0").split(",")]
GREEDY = SamplingParams(temperature=0.0)
LOGITS = SlotRequest(GREEDY, (), host_logits=True)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    return {"demo": load_model(ensure_demo_model()),
            "0.8b": load_model(write_random_model(out / "0.8b.gguf", shape_config("0.8b"), seed=3))}


def cards(n: int, capacity: int) -> list[CardSpec]:
    return [CardSpec(DEVICES[i % len(DEVICES)], capacity) for i in range(n)]


def teacher_forced(backend, prompt: list[int], steps: int, chunk_tokens: list[int]) -> tuple[list[np.ndarray], list[int]]:
    """Logits after the prompt and after each forced token, and the greedy tokens, on slot 0."""
    backend.reset_slot(0)
    backend.prefill_slot(0, prompt)
    rows = [backend.begin(0, LOGITS).logits]
    for t in chunk_tokens[:steps]:
        rows.append(backend.step({0: t})[0].logits)
    return rows, [int(np.argmax(r)) for r in rows]


@pytest.mark.parametrize("name", ["demo", "0.8b"])
def test_one_to_four_logical_cards_equal_one_card(models, name):
    loaded = models[name]
    rng = np.random.default_rng(11)
    prompt = rng.integers(0, loaded.config.vocab_size, 300).tolist()  # several 64-token chunks: pipelined
    forced = rng.integers(0, loaded.config.vocab_size, 12).tolist()
    single = CudaBackend(loaded, context=512, chunk=64)
    try:
        want, want_greedy = teacher_forced(single, prompt, 12, forced)
    finally:
        single.close()
    for n in (1, 2, 3, 4):
        pipe = CudaBackend(loaded, cards(n, 2 << 30), context=512, chunk=64, split=_even(loaded, n))
        try:
            got, got_greedy = teacher_forced(pipe, prompt, 12, forced)
        finally:
            pipe.close()
        worst = max(float(np.abs(g - w).max()) for g, w in zip(got, want))
        print(f"{name}: {n} cards, spans {[(s.start, s.stop) for s in pipe.spans]}, max |diff| {worst:.2e}")
        assert got_greedy == want_greedy
        assert worst == 0.0


def _even(loaded, n: int) -> list[int]:
    base, extra = divmod(loaded.config.n_layers, n)
    return [base + (i < extra) for i in range(n)]


def test_pipeline_serves_slots_and_snapshots(models):
    """Batched steps over 3 slots, sampled and greedy, and a snapshot restored into another slot, on 3 cards."""
    loaded = models["demo"]
    rng = np.random.default_rng(5)
    prompts = [rng.integers(0, loaded.config.vocab_size, int(k)).tolist() for k in (40, 70, 130)]
    reqs = [SlotRequest(GREEDY, prompts[0]), SlotRequest(SamplingParams(temperature=0.9, seed=4), prompts[1]),
            SlotRequest(SamplingParams(temperature=0.5, top_k=10, seed=9), prompts[2])]

    def run(backend) -> list[list[int]]:
        out = []
        for slot, (p, r) in enumerate(zip(prompts, reqs)):
            backend.reset_slot(slot)
            backend.prefill_slot(slot, p)
            out.append([backend.begin(slot, r).token])
        for _ in range(15):
            picks = backend.step({s: out[s][-1] for s in range(3)})
            for s in range(3):
                out[s].append(picks[s].token)
        return out

    single = CudaBackend(loaded, context=256, chunk=64, slots=3)
    try:
        want = run(single)
    finally:
        single.close()
    pipe = CudaBackend(loaded, cards(3, 1 << 30), context=256, chunk=64, slots=3)
    try:
        assert run(pipe) == want
        pipe.reset_slot(0)
        pipe.prefill_slot(0, prompts[2][:100])
        snap = pipe.snapshot_slot(0)
        pipe.prefill_slot(0, prompts[2][100:])
        straight = pipe.begin(0, LOGITS).logits
        pipe.restore_slot(1, snap)
        pipe.prefill_slot(1, prompts[2][100:])
        assert np.array_equal(pipe.begin(1, LOGITS).logits, straight)
    finally:
        pipe.close()


def test_a_throttled_bridge_still_computes_the_same(models):
    loaded = models["demo"]
    prompt = list(range(1, 90))
    fast = CudaBackend(loaded, cards(2, 1 << 30), context=256, chunk=32)
    try:
        want, _ = teacher_forced(fast, prompt, 3, [5, 6, 7])
    finally:
        fast.close()
    slow = CudaBackend(loaded, cards(2, 1 << 30), context=256, chunk=32, bridge=BridgeModel(200e6, 1e-4))
    try:
        got, _ = teacher_forced(slow, prompt, 3, [5, 6, 7])
    finally:
        slow.close()
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


def test_a_split_that_does_not_fit_the_cards_is_refused(models):
    from engine.errors import RigllmError

    with pytest.raises(RigllmError, match="card|fit"):
        CudaBackend(models["0.8b"], cards(2, 300 << 20), context=4096)
