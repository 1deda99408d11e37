"""The CUDA backend against the reference on the trained fixture, with bounds a one-layer bug cannot pass (issue 25).

Two comparisons per KV format, both over the fixture's own tasks (tests/teeth.py: 3 samples of ~560
tokens, 594 compared positions, a 290-token prefill crossing the 256-token prefill chunk and four
64-token GDN chunks, then one-token decode steps with 3- and 9-token chunks between them):

- whole model, teacher-forced logits: worst position within WHOLE_MODEL_FACTOR x the floor, top-1
  agreement >= 99% (f16, k8v8), >= the floor's own agreement - 1 point for the 3/4-bit formats;
- layer-local: every block replayed by the reference on the card's own inputs to it
  (engine.reference.layer_replay), per (layer, sub-step) worst row within LOCAL_MAX_FACTOR x the floor's
  worst and 90th percentile within LOCAL_P90_FACTOR x the floor's.

The floors are measured on every run (printed with the bounds): the same reference with every matmul and
block-norm output scaled by (1 + 2e-6 N(0,1)), the size of another fp32 summation order
(tests/teeth.py `summation_reorder`), against the clean reference. The reference stores K/V rounded to
fp16 first, as the card does. Bug effects measured on the CPU by planting them in the reference (README
"Correctness"): a q RoPE position off by one in the attention layer moves the logits by 6.6e-2 (whole
model) and its mixer rows by 9.4e-2 (layer-local, p90 6.7e-3); the same only on decode steps 1.9e-2
whole-model (inside the whole-model bound) and p90 2.6e-3 layer-local (10x over its bound); a zeroed KV
row 0.19 whole-model. A floor of ~1.2-1.8e-2 (whole model) and <= 3.5e-5 (layer-local p90) is what
correct code gives.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest

from engine.reference.hidden_trace import HiddenTrace
from engine.model.kv_formats import CUDA_KERNEL_FORMATS
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from tests.teeth import (
    FIXTURE_Q8,
    PREFILL,
    Comparison,
    LocalDiffs,
    check_layer_local,
    check_whole_model,
    feeds,
    fixture_samples,
    kernel_reference,
    positions_of,
    reference_floor_logits,
    reference_local_floor,
    reference_logits,
    reference_state,
    summation_reorder,
)

LOGITS = SlotRequest(SamplingParams(temperature=0.0), (), host_logits=True, speculative=False)
FULL_AGREEMENT_FORMATS = ("f16", "k8v8")
CONTEXT = 640


@functools.cache
def fixture():
    loaded = load_model(FIXTURE_Q8)
    return loaded, kernel_reference(loaded), fixture_samples(loaded)


@functools.cache
def reference_side(kv: str) -> tuple[np.ndarray, np.ndarray]:
    """(the reference's logits, its floor's logits) over every sample's feeds, in KV format kv."""
    loaded, model, samples = fixture()
    return reference_logits(model, samples, kv), reference_floor_logits(model, samples, kv)


@functools.cache
def local_floor(kv: str) -> LocalDiffs:
    loaded, model, samples = fixture()
    return reference_local_floor(loaded, model, samples, kv)


def min_agreement(kv: str, floor_agreement: float) -> float:
    """99% for f16 and k8v8 (issue 25); for the 3/4-bit formats the floor's own agreement less one point
    (their coarser codes make a flipped code move more: the CPU floor agreed on 98.65-99.5% of positions)."""
    return 0.99 if kv in FULL_AGREEMENT_FORMATS else min(0.99, floor_agreement - 0.01)


def slot_logits(backend, samples) -> np.ndarray:
    """Teacher-forced logits [positions, V] on slot 0: multi-token feeds through prefill_slot (prefill path,
    GEMV for 3 tokens, GEMM for 9 and the prompt), one-token feeds as decode steps (the captured graph)."""
    rows = []
    for tokens in samples:
        backend.reset_slot(0)
        started = False
        for chunk in feeds(tokens):
            if started and len(chunk) == 1:
                rows.append(backend.step({0: chunk[0]})[0].logits)
            else:
                backend.prefill_slot(0, chunk)
                rows.append(backend.begin(0, LOGITS).logits)
                started = True
    return np.stack(rows).astype(np.float64)


def traced_run(backend, forwards, samples) -> list[HiddenTrace]:
    """One trace per sample, every feed through the eager path (`forwards`: the ForwardPass of each card)."""
    traces = []
    for tokens in samples:
        per_card = [HiddenTrace() for _ in forwards]
        for fwd, trace in zip(forwards, per_card):
            fwd.trace = trace
        try:
            backend.reset_slot(0)
            for chunk in feeds(tokens):
                backend.prefill_slot(0, chunk)
        finally:
            for fwd in forwards:
                fwd.trace = None
        traces.append(HiddenTrace.merged(per_card))
    return traces


def check_against_reference(name: str, kv: str, logits: np.ndarray, traces: list[HiddenTrace]) -> None:
    loaded, model, samples = fixture()
    want, floor = reference_side(kv)
    check_whole_model(f"{name} whole model", logits, want, floor, min_agreement(kv, Comparison.of(floor, want).agreement),
                      positions_of(samples))
    diffs = LocalDiffs.empty()
    for tokens, trace in zip(samples, traces):
        diffs.add(model, trace, feeds(tokens), kv)
    check_layer_local(name, diffs, local_floor(kv))


@pytest.mark.parametrize("kv", CUDA_KERNEL_FORMATS)
def test_fixture_on_one_card_matches_the_reference(kv):
    from engine.cuda.backend import CudaBackend

    loaded, _, samples = fixture()
    gpu = CudaBackend(loaded, context=CONTEXT, chunk=256, kv=kv, speculative=False)
    try:
        logits = slot_logits(gpu, samples)
        traces = traced_run(gpu, [gpu.fwd], samples)
    finally:
        gpu.close()
    check_against_reference(f"fixture {kv}, one card", kv, logits, traces)


@pytest.mark.parametrize("kv", ["f16", "k8v8", "k3v3"])
@pytest.mark.parametrize("n_cards", [2, 4])
def test_fixture_on_logical_cards_matches_one_card_and_the_reference(kv, n_cards):
    """Layers split over n logical cards (RIGLLM_TEST_DEVICES picks the GPUs, as in test_pipeline.py): the same
    kernels on the same rows, so the logits must equal one card's bit for bit, and meet the reference bounds."""
    from engine.cuda.backend import CudaBackend
    from tests.gpu.test_pipeline import cards

    loaded, _, samples = fixture()
    single = CudaBackend(loaded, context=CONTEXT, chunk=256, kv=kv, speculative=False)
    try:
        want = slot_logits(single, samples)
    finally:
        single.close()
    split = [1] * n_cards if n_cards == loaded.config.n_layers else [2, 2]
    # without the MTP head, as the one-card run: its block would be traced as layer n_layers, which the replay lacks
    pipe = CudaBackend(loaded, cards(n_cards, 1 << 30), context=CONTEXT, chunk=256, split=split, kv=kv,
                       speculative=False)
    try:
        got = slot_logits(pipe, samples)
        traces = traced_run(pipe, [st.decoder.fwd for st in pipe.stages], samples)
    finally:
        pipe.close()
    differ = np.flatnonzero(~(got == want).all(axis=1))
    where = positions_of(samples)
    assert not differ.size, (f"{n_cards} cards {kv}: logits differ from one card's at {differ.size} positions, first "
                             f"{where[differ[0]]} (sample, token), max |diff| {np.abs(got - want).max():.3e}")
    check_against_reference(f"fixture {kv}, {n_cards} logical cards {split}", kv, got, traces)


@pytest.mark.parametrize("kv", ["f16", "k8v8", "k3v3"])
def test_fixture_speculative_verify_rows_match_the_reference(kv):
    """Speculative verifies of 3 tokens (K=2) after the prompt, each verifying the sample's next tokens (all
    accepted): every verify row's logits against the reference's at that position, with the whole-model bounds."""
    from engine.cuda.backend import CudaBackend

    loaded, model, samples = fixture()
    k = 2
    gpu = CudaBackend(loaded, context=CONTEXT, chunk=256, kv=kv, draft_tokens=k)
    got, chunks_per_sample = [], []
    try:
        dec, fwd, v = gpu.slots, gpu.fwd, loaded.config.vocab_size
        spec = dec.speculator
        for tokens in samples:
            dec.reset_slot(0)
            dec.prefill_slot(0, tokens[:PREFILL])
            seq = dec.seqs[0]
            chunks = [list(tokens[:PREFILL])]
            for at in range(PREFILL, len(tokens) - k, k + 1):
                rows = tokens[at : at + k + 1]
                fwd.ids.view(0, 4 * len(rows)).upload(np.asarray(rows, np.int32))
                seq.set_step(len(rows))
                fwd.run_verify(len(rows), seq, spec.rings[0], spec.caches[0].owed)
                got.append(fwd.logits.download(np.float32, (len(rows), v)))
                seq.next_position += len(rows)  # every draft accepted: the state after the last row stands
                chunks.append(rows)
            chunks_per_sample.append(chunks)
    finally:
        gpu.close()
    got_rows = np.concatenate(got).astype(np.float64)

    def every_row(m) -> np.ndarray:  # the reference's logits of every verified token, same feeds
        out = []
        for chunks in chunks_per_sample:
            state = reference_state(m, kv)
            for i, chunk in enumerate(chunks):
                logits = m.forward(chunk, state)
                if i:
                    out.append(logits)
        return np.concatenate(out).astype(np.float64)

    want = every_row(model)
    with summation_reorder():
        floor = every_row(model)
    where = [(s, PREFILL + i) for s, chunks in enumerate(chunks_per_sample) for i in range(sum(map(len, chunks[1:])))]
    check_whole_model(f"fixture {kv}, verify rows (K={k})", got_rows, want, floor,
                      min_agreement(kv, Comparison.of(floor, want).agreement), where)
