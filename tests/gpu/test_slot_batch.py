"""Slot-indexed decode steps (issue 28): one launch per mixer kernel for all rows of a batched step, each
row reading and advancing its own slot's GDN state and KV cache (engine.cuda.slot_batch).

The bound is bit-for-bit equality with the sequence's own one-token pass (`prefill_slot` of one token: the
kernels launched with that sequence's buffers directly), because a slot-indexed row runs the same
arithmetic in the same order: the T-token GEMV's per-token sums do not depend on T, the conv, recurrence,
prep, append and decode kernels only look their row's buffers up in the slot table, and the decode split
count is the same. Rows are stepped in an order unlike the slots' (slots 3, 0, 2 of 4, at depths 150, 37
and 201), for three steps, so wrong table entries, a row reading its neighbour's position or state, or a
state that does not advance would each change the logits. Every KV format with CUDA kernels is covered.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from engine.model.kv_formats import CUDA_KERNEL_FORMATS
from tests.teeth import FIXTURE_Q8, fixture_samples

STEPS = 3
GREEDY_LOGITS = SlotRequest(SamplingParams(temperature=0.0), (), host_logits=True, speculative=False)


@pytest.fixture(scope="module")
def fixture_model():
    return load_model(FIXTURE_Q8)


@pytest.mark.parametrize("kv", CUDA_KERNEL_FORMATS)
def test_slot_indexed_step_equals_each_sequence_own_pass(fixture_model, kv):
    texts = fixture_samples(fixture_model, length=260)
    cut = {3: (0, 150), 0: (1, 37), 2: (2, 201)}  # slot: (sample, prompt length)
    prompts = {slot: texts[k][:n] for slot, (k, n) in cut.items()}
    fed = {slot: list(texts[k][n : n + STEPS]) for slot, (k, n) in cut.items()}  # teacher-forced continuations
    gpu = CudaBackend(fixture_model, context=512, chunk=64, slots=4, kv=kv, speculative=False)
    try:
        snapshots = {}
        for slot, prompt in prompts.items():
            gpu.reset_slot(slot)
            gpu.prefill_slot(slot, prompt)
            gpu.begin(slot, GREEDY_LOGITS)
            snapshots[slot] = gpu.snapshot_slot(slot)
        batched: dict[int, list[np.ndarray]] = {slot: [] for slot in prompts}
        for i in range(STEPS):
            picks = gpu.step({slot: fed[slot][i] for slot in prompts})
            for slot in prompts:
                batched[slot].append(picks[slot].logits)

        own: dict[int, list[np.ndarray]] = {slot: [] for slot in prompts}
        for slot in prompts:
            gpu.restore_slot(slot, snapshots[slot])
            for i in range(STEPS):
                gpu.prefill_slot(slot, [fed[slot][i]])
                own[slot].append(gpu.begin(slot, GREEDY_LOGITS).logits)
    finally:
        gpu.close()
    for slot in prompts:
        for i in range(STEPS):
            diff = float(np.max(np.abs(batched[slot][i] - own[slot][i])))
            assert diff == 0.0, f"{kv}: slot {slot}, step {i}: slot-indexed row differs from its own pass by {diff:.3e}"
