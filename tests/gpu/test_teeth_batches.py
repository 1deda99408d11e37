"""Mixed batches (issue 25): a slot decoded next to others gets exactly the logits it gets alone, and a greedy
slot's pick is the arg-max of its logits.

What the kernels promise, and so why the bound is bit-for-bit equality: in a batched step (run_batch) every
row goes through the T-token GEMV, whose per-token sum is the same sequence of fmaf over the same 16-byte
slices in the same lane order for every T and every variant (gemv_q8.cu: the slice loop steps 32*U slices
with the U slices taken in order, then warp_sum's xor tree, which gemv_warp_store runs as a reduce-scatter),
the row-sliced RMSNorm (NORM_SLICES_DECODE, bit-identical for any row count), elementwise SwiGLU/quantize, and
per-sequence attention and GDN launches with one token each and the same split count as a lone decode step.
tests/gpu/results logged 0.00e+00 for test_slots.py::test_batched_step_equals_each_slot_alone.

Neighbours: a sampled slot (temperature 0.8, top-k 20), a greedy slot that skips every fourth step (so
the step graphs cover different slot sets), and a greedy slot that speculates with the fixture's MTP head
between the batched steps (a slot stepped alone takes a speculative round, which rewrites the shared
logits, ids and hidden buffers), with prompts of 37, 201 and 120 tokens beside the subject's 150.
"""

from __future__ import annotations

import numpy as np

from engine.cuda.backend import CudaBackend
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from tests.teeth import FIXTURE_Q8, fixture_samples

GREEDY = SamplingParams(temperature=0.0)
STEPS = 40


def test_a_slot_in_a_mixed_batch_decodes_exactly_as_alone():
    loaded = load_model(FIXTURE_Q8)
    texts = fixture_samples(loaded, length=260)
    subject_prompt = texts[0][:150]
    forced = texts[0][150 : 150 + STEPS]  # teacher-forced: the same tokens in both runs
    assert len(forced) == STEPS and len(texts[2]) >= 201, [len(t) for t in texts]
    neighbours = {2: (texts[1][:37], SlotRequest(SamplingParams(temperature=0.8, top_k=20, seed=11), texts[1][:37])),
                  3: (texts[2][:201], SlotRequest(GREEDY, texts[2][:201], speculative=False)),
                  0: (texts[1][:120], SlotRequest(GREEDY, texts[1][:120], speculative=True))}
    subject_request = SlotRequest(GREEDY, subject_prompt, host_logits=True, speculative=False)
    gpu = CudaBackend(loaded, context=512, chunk=64, slots=4, draft_tokens=2)
    try:
        gpu.reset_slot(1)
        gpu.prefill_slot(1, subject_prompt)
        pick = gpu.begin(1, subject_request)
        alone, alone_picks = [pick.logits], [pick.token]
        for t in forced:
            pick = gpu.step({1: t})[1]
            alone.append(pick.logits)
            alone_picks.append(pick.token)

        last = {}
        for slot, (prompt, request) in neighbours.items():  # begin picks from the latest prefill's logits
            gpu.reset_slot(slot)
            gpu.prefill_slot(slot, prompt)
            last[slot] = gpu.begin(slot, request).token
        gpu.reset_slot(1)
        gpu.prefill_slot(1, subject_prompt)
        pick = gpu.begin(1, subject_request)
        together, together_picks, rounds = [pick.logits], [pick.token], 0
        for i, t in enumerate(forced):
            if i % 3 == 1:  # the speculating neighbour alone: a speculative round between the batched steps
                spec_pick = gpu.step({0: last[0]})[0]
                last[0] = (spec_pick.token, *spec_pick.extra)[-1]
                rounds += spec_pick.drafted > 0
            feeds = {1: t, 2: last[2], 0: last[0]}
            if i % 4 != 3:
                feeds[3] = last[3]
            picks = gpu.step(feeds)
            for slot in feeds:
                if slot != 1:
                    last[slot] = picks[slot].token
            together.append(picks[1].logits)
            together_picks.append(picks[1].token)
    finally:
        gpu.close()

    print(f"mixed batch: {len(together)} positions, {rounds} speculative rounds of the neighbour between them")
    assert rounds > 0, "the speculating neighbour never took a speculative round: the test lost its point"
    for i, (a, b) in enumerate(zip(alone, together)):
        if not np.array_equal(a, b):
            bad = np.flatnonzero(a != b)
            raise AssertionError(f"position {i}: {bad.size} of {a.size} logits differ from the slot alone, first at "
                                 f"{bad[0]} ({b[bad[0]]!r} vs {a[bad[0]]!r}); max |diff| {np.abs(a - b).max():.3e}")
    for name, logits, picks in (("alone", alone, alone_picks), ("together", together, together_picks)):
        argmax = [int(np.argmax(row)) for row in logits]
        wrong = [i for i, (p, m) in enumerate(zip(picks, argmax)) if p != m]
        assert not wrong, (f"{name}: the greedy pick is not the arg-max of its logits at {len(wrong)} positions, first "
                           f"{wrong[0]}: picked {picks[wrong[0]]}, arg-max {argmax[wrong[0]]}")
