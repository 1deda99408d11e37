"""Several slots prefilled in one forward pass (issue 28: requests that arrive together share a pass, so the weights
are read once for all of them) continue exactly as if each had been prefilled alone.

Why the bound is bit-for-bit equality where every slot's part is longer than 8 tokens: such a part takes the GEMM
alone and in the shared pass, and the GEMM gives every row the same bits for any token count and tile (gemm_q8.cu:
each output sums its blocks in the same order with the same fold); the row-sliced RMSNorm and the elementwise SwiGLU
are per row; each part's GDN and attention launches, and its final norm and LM head on its last row, are the ones its
own pass makes (`ForwardPass.run_sequences`). So the first pick's logits,
every later step's, the MTP head's cache position and owed row, and the speculative rounds after it must all be
equal. (A part of at most 8 tokens would take the GEMV alone and the GEMM in a shared pass: other sums, so the backend
never lets one share: `CudaBackend.shares_prefill`.)
"""

from __future__ import annotations

import queue
from typing import Any

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.serving.generation_job import Job
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.scheduler import Scheduler
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from tests.teeth import FIXTURE_Q8, fixture_samples

GREEDY = SamplingParams(temperature=0.0)
CHUNK = 64
STEPS = 12


def prompts_of(loaded, lengths: dict[int, int]) -> tuple[dict[int, list[int]], dict[int, list[int]]]:
    """Each slot's prompt (a fixture sample's first `length` tokens) and the tokens that follow it (teacher-forced)."""
    texts = fixture_samples(loaded, length=200)
    prompts = {slot: texts[slot % len(texts)][slot:slot + n] for slot, n in lengths.items()}
    forced = {slot: texts[slot % len(texts)][slot + n:slot + n + STEPS] for slot, n in lengths.items()}
    return prompts, forced


def logits_after(gpu: CudaBackend, prompts: dict[int, list[int]], forced: dict[int, list[int]],
                 together: bool) -> dict[int, np.ndarray]:
    """[1 + STEPS, V] logits per slot: the first pick's, then after each forced token (the slots stepped together)."""
    request = SlotRequest(GREEDY, (), host_logits=True, speculative=False)
    for slot in prompts:
        gpu.reset_slot(slot)
    if together:
        gpu.prefill_slots(prompts)
        rows = {slot: [gpu.begin(slot, request).logits] for slot in prompts}
    else:
        rows = {}
        for slot, prompt in prompts.items():
            gpu.prefill_slot(slot, prompt)
            rows[slot] = [gpu.begin(slot, request).logits]
    for i in range(STEPS):
        picks = gpu.step({slot: forced[slot][i] for slot in prompts})
        for slot in prompts:
            rows[slot].append(picks[slot].logits)
    return {slot: np.stack(r) for slot, r in rows.items()}


@pytest.mark.parametrize("n_cards", [1, 2])
def test_slots_prefilled_together_continue_bit_for_bit_as_alone(n_cards):
    loaded = load_model(FIXTURE_Q8)
    prompts, forced = prompts_of(loaded, {0: 21, 2: 9, 3: 30})  # 60 tokens: one pass of the 64-token chunk
    cards = [CardSpec(0, 2 << 30)] * n_cards
    gpu = CudaBackend(loaded, cards, context=256, chunk=CHUNK, slots=4, speculative=False)
    try:
        alone = logits_after(gpu, prompts, forced, together=False)
        together = logits_after(gpu, prompts, forced, together=True)
    finally:
        gpu.close()
    for slot in prompts:
        diff = float(np.abs(together[slot] - alone[slot]).max())
        print(f"{n_cards} card(s), slot {slot} ({len(prompts[slot])} tokens): max |together - alone| {diff:.3e}")
        np.testing.assert_array_equal(together[slot], alone[slot], err_msg=f"slot {slot}")


def test_the_mtp_head_takes_each_slots_rows_of_a_shared_pass():
    """A speculating slot's head is fed its own rows of the shared pass: the same head position, owed row and head KV
    cache as after its own prefill, and the same greedy tokens, drafts and acceptances in the speculative rounds
    after."""
    loaded = load_model(FIXTURE_Q8)
    prompts, _ = prompts_of(loaded, {1: 40, 0: 17})
    request = SlotRequest(GREEDY, (), speculative=True)

    def head_state(cache) -> tuple[int, int, bytes, bytes]:
        kv = b"".join(buf.download(np.uint8, buf.nbytes).tobytes() for buf in cache.cache.buffers())
        return cache.position, cache.owed_rows, cache.owed.download(np.uint8, cache.owed.nbytes).tobytes(), kv

    def run(together: bool) -> tuple[dict[int, tuple], dict[int, list[int]], tuple[int, int]]:
        gpu = CudaBackend(loaded, context=256, chunk=CHUNK, slots=2, draft_tokens=2)
        try:
            for slot in prompts:
                gpu.reset_slot(slot)
            if together:
                gpu.prefill_slots(prompts)
            heads, tokens = {}, {}
            for slot, prompt in prompts.items():
                if not together:
                    gpu.prefill_slot(slot, prompt)
                heads[slot] = head_state(gpu.slots.speculator.caches[slot])
                tokens[slot] = [gpu.begin(slot, request).token]
            for slot in prompts:  # each alone: speculative rounds
                while len(tokens[slot]) < 24:
                    pick = gpu.step({slot: tokens[slot][-1]})[slot]
                    tokens[slot] += pick.tokens
            stats = gpu.speculation_stats
            return heads, tokens, (stats.drafted, stats.accepted)
        finally:
            gpu.close()

    heads_alone, tokens_alone, drafts_alone = run(False)
    heads_together, tokens_together, drafts_together = run(True)
    print(f"MTP head after a shared pass: positions {[h[0] for h in heads_together.values()]}, "
          f"(drafted, accepted) {drafts_together} (alone {drafts_alone})")
    assert drafts_alone[0] > 0, "no speculative round drafted: the comparison lost its point"
    assert heads_together == heads_alone
    assert tokens_together == tokens_alone
    assert drafts_together == drafts_alone


class OnePassEach:
    """The CUDA backend without the `PrefillBatcher` capability: the scheduler then prefills one job per pass."""

    def __init__(self, backend: CudaBackend):
        self._backend = backend

    def __getattr__(self, name: str) -> Any:
        if name == "prefill_slots":
            raise AttributeError(name)
        return getattr(self._backend, name)


def test_jobs_arriving_together_are_served_as_they_are_one_pass_each():
    """Four jobs queued at once (greedy and seeded sampling, one with logprobs), their prompts of 9 to 20 tokens in one
    shared pass of the 64-token chunk: every event each job receives equals what it receives when the scheduler gives
    each prompt its own pass (no speculation, so a slot decoding alone takes plain steps in both runs)."""
    demo = load_model(ensure_demo_model())
    service = ModelService.from_loaded(demo)
    rng = np.random.default_rng(23)
    asks = [rng.integers(0, demo.config.vocab_size, n).tolist() for n in (12, 15, 9, 20)]
    params = [GREEDY, SamplingParams(temperature=0.8, seed=5), GREEDY, SamplingParams(temperature=0.7, top_k=40, seed=9)]

    def serve(wrap: bool) -> tuple[dict[int, list], list[tuple[str, int]]]:
        gpu = CudaBackend(demo, context=256, chunk=CHUNK, slots=4, speculative=False)
        passes: list[tuple[str, int]] = []
        plain_slot, plain_slots = gpu.prefill_slot, gpu.prefill_slots
        gpu.prefill_slot = lambda slot, ids: (passes.append(("one", len(ids))), plain_slot(slot, ids))[1]
        gpu.prefill_slots = lambda parts: (passes.append(("shared", len(parts))), plain_slots(parts))[1]
        events: dict[int, list] = {i: [] for i in range(len(asks))}
        jobs: queue.Queue = queue.Queue()
        for i, (prompt, p) in enumerate(zip(asks, params)):
            jobs.put(Job(prompt, p, 24, False, None, [], events[i].append, top_logprobs=3 if i == 2 else None))
        jobs.put(None)
        try:
            Scheduler(OnePassEach(gpu) if wrap else gpu, service.tokenizer).run(jobs)  # type: ignore[arg-type]
        finally:
            gpu.close()
        return events, passes

    together, shared_passes = serve(False)
    one_each, single_passes = serve(True)
    print(f"passes together: {shared_passes}; one each: {single_passes}")
    assert shared_passes == [("shared", 4)] and single_passes == [("one", len(a)) for a in asks]
    for i in range(len(asks)):
        final_together, final_alone = together[i][-1], one_each[i][-1]
        assert [repr(e) for e in together[i][:-1]] == [repr(e) for e in one_each[i][:-1]], f"job {i}"
        assert (final_together.finish_reason, final_together.completion_tokens) == (
            final_alone.finish_reason, final_alone.completion_tokens), f"job {i}"
