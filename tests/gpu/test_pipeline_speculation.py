"""MTP speculation over several cards (issue 28 item 6) gives exactly what speculation on one card gives: the
same tokens, greedy and sampled (same seed), with the same rounds and accepted drafts. Each card runs the
same kernels on the same rows as the one card does and the fp32 hidden rows cross host memory unchanged
(tests/gpu/test_pipeline.py: a split model's logits equal one card's bit for bit), and the head, its
embedding copy and the acceptance rule on the last card are the one card's; so no tolerance applies.
(Speculation on one card against plain decoding, and its distribution: tests/gpu/test_mtp_gpu.py.)

The cards are logical (contexts on GPU 0) unless RIGLLM_TEST_DEVICES lists GPUs to cycle through."""

from __future__ import annotations

import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from tests.gpu.test_mtp_gpu import decode, models, prompt_of  # noqa: F401  (models: the fixture)
from tests.gpu.test_pipeline import _even, cards

REQUESTS = {
    "greedy": SamplingParams(temperature=0.0),
    "sampled": SamplingParams(temperature=1.0, top_k=3, presence_penalty=0.3, seed=5),
}


@pytest.mark.parametrize("mode", sorted(REQUESTS))
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("name", ["friendly", "fixture"])
def test_speculation_over_three_cards_equals_speculation_on_one(models, name, k, mode):  # noqa: F811
    loaded = models[name]
    prompt, params = prompt_of(loaded), REQUESTS[mode]
    runs = {}
    for n in (1, 3):
        specs = cards(n, 2 << 30) if n > 1 else None
        gpu = CudaBackend(loaded, specs, context=256, chunk=32, draft_tokens=k,
                          split=_even(loaded, n) if n > 1 else None)
        try:
            tokens, _ = decode(gpu, prompt, 64, SlotRequest(params, prompt))
            stats = gpu.speculation_stats
            runs[n] = (tokens, stats.rounds, stats.accepted)
        finally:
            gpu.close()
    print(f"{name} K={k} {mode}: {runs[3][1]} rounds, {runs[3][2]} accepted drafts over three cards")
    assert runs[3][1] > 0
    if name == "friendly":
        assert 0 < runs[3][2] < runs[3][1] * k  # drafts accepted and rejected: both commit paths ran
    assert runs[3] == runs[1]
