"""Several slots' prefill chunks in one forward pass (issue 28: `SlotDecoder.feed_chunks`, `ForwardPass.run_sequences`,
`CudaBackend.prefill_slots`), on a stand-in card (no GPU): the matmuls launch once for all rows while each chunk's
mixers launch as its own pass would launch them, on its own slot's state; positions, first-pick rows and the MTP
head's bookkeeping follow each slot; what cannot share a pass is refused before anything launches; the bench's
burst measurement cuts its passes as the scheduler does. What the kernels compute together against alone is
tests/gpu/test_shared_prefill.py's."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.cuda.bench.arrivals import arrival_prefill, shared_passes
from engine.cuda.mtp import OWED_ROWS
from engine.cuda.prefill_chunks import PrefillChunk
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import upload_mtp_weights, upload_weights
from engine.errors import RigllmError
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.backend import CardSpec
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest, batches_prefill
from engine.gguf.loader import load_model
from engine.model.kv_formats import kv_format
from fake_card import FakeCard, address, owners_touched

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"
CHUNK = 64
LENGTHS = {0: 20, 1: 5, 2: 30}  # a 5-token chunk takes the decode-shaped mixers, the others the prefill ones
MIXERS = ("gdn_", "attn_", "kv_")


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def decoder(loaded, slots: int = 3, mtp: bool = False, kv: str = "f16") -> tuple[FakeCard, SlotDecoder]:
    card = FakeCard()
    weights = upload_weights(card, loaded.file, loaded.config)
    head = upload_mtp_weights(card, loaded.file, loaded.config, weights) if mtp else None
    return card, SlotDecoder(card, loaded.config, weights, context=256, slots=slots, chunk=CHUNK, mtp=head,
                             kv=kv_format(kv))


def chunks_of(lengths: dict[int, int]) -> list[tuple[int, PrefillChunk]]:
    return [(slot, PrefillChunk(np.arange(1, n + 1, dtype=np.int32))) for slot, n in lengths.items()]


def names(card: FakeCard) -> list[str]:
    return [name for name, *_ in card.launches]


def slot_of(dec: SlotDecoder, args: tuple) -> set[int]:
    """The slots whose state buffers a launch's arguments point into."""
    return owners_touched({slot: list(seq.buffers()) for slot, seq in enumerate(dec.seqs)}, args)


@pytest.mark.parametrize("kv", ["f16", "k8v3"])
def test_a_shared_pass_reads_the_weights_once_and_runs_each_chunks_mixers_on_its_own_state(demo, kv):
    """Also over a quantised cache, whose K/V rows each chunk stages and encodes into its own slot's cache."""
    card, dec = decoder(demo, kv=kv)
    alone_mixers: Counter = Counter()
    for slot, part in chunks_of(LENGTHS):
        card.launches.clear()
        dec.feed_chunk(slot, part)
        alone_mixers += Counter(n for n in names(card) if n.startswith(MIXERS))
        one_pass = names(card)
    matmuls_per_pass = sum(n.startswith(("gemm", "gemv")) for n in one_pass)
    for seq in dec.seqs:
        seq.reset()

    card.launches.clear()
    card.launch_args.clear()
    dec.feed_chunks(chunks_of(LENGTHS))
    shared = names(card)
    # the trunk's matmuls once for all rows; the LM head (one launch a pass) once a chunk, on its last row
    assert sum(n.startswith(("gemm", "gemv")) for n in shared) == matmuls_per_pass - 1 + len(LENGTHS)
    assert sum(n.startswith("embed") for n in shared) == 1
    assert Counter(n for n in shared if n.startswith(MIXERS)) == alone_mixers
    per_slot: Counter = Counter()
    for name, args in card.launch_args:
        if name.startswith(("gdn_recurrent", "gdn_chunk", "attn_prep" if kv == "f16" else "kv_encode")):
            touched = slot_of(dec, args)
            assert len(touched) == 1, f"{name} touches slots {touched}"
            per_slot[touched.pop()] += 1
    attention_launches = 1 if kv == "f16" else 2  # attn_prep writes f16 rows; else K and V each get a kv_encode
    layers = len(demo.config.gdn_layers) + attention_launches * len(demo.config.attention_layers)
    assert per_slot == {slot: layers for slot in LENGTHS}
    assert [dec.seqs[slot].next_position for slot in LENGTHS] == list(LENGTHS.values())


def test_each_slots_first_pick_reads_its_own_logits_row(demo):
    card, dec = decoder(demo)
    dec.feed_chunks(chunks_of(LENGTHS))
    for row, slot in enumerate(LENGTHS):
        card.launch_args.clear()
        dec.begin(slot, SlotRequest(SamplingParams(temperature=0.0), ()))
        (name, args), = [(n, a) for n, a in card.launch_args if n == "argmax_partial"]
        assert address(args[0]) == address(dec.fwd.logits_row(row))
    dec.feed_chunk(1, PrefillChunk(np.arange(3, dtype=np.int32)))  # a pass of its own: row 0 again
    card.launch_args.clear()
    dec.begin(1, SlotRequest(SamplingParams(temperature=0.0), ()))
    (name, args), = [(n, a) for n, a in card.launch_args if n == "argmax_partial"]
    assert address(args[0]) == address(dec.fwd.logits_row(0))


@pytest.mark.parametrize("case", ["one slot twice", "image chunk", "no room"])
def test_what_cannot_share_a_pass_is_refused_before_anything_runs(demo, case):
    card, dec = decoder(demo)
    chunks = chunks_of(LENGTHS)
    if case == "one slot twice":
        chunks.append((0, PrefillChunk(np.arange(3, dtype=np.int32))))
    elif case == "image chunk":
        chunks[1] = (1, PrefillChunk(chunks[1][1].ids, positions=np.zeros((5, 3), np.int32)))
    else:
        dec.seqs[2].next_position = 256 - 10
    card.launches.clear()
    with pytest.raises((ValueError, RigllmError)):
        dec.feed_chunks(chunks)
    assert card.launches == []
    assert [dec.seqs[slot].next_position for slot in LENGTHS] == [0, 0, 246 if case == "no room" else 0]


def test_the_mtp_head_owes_and_runs_each_slots_rows_as_after_its_own_pass():
    """Each slot's head runs every row of its chunk but the last, which it then owes: the same bookkeeping as after its
    own pass, and the owed row taken from that slot's last row of the pass (here every row of the head's input buffer
    holds its own index, which the stand-in card's norm leaves in place)."""
    fixture = load_model(FIXTURE)
    lengths = {0: 12, 1: 1, 2: 30}
    _, alone = decoder(fixture, mtp=True)
    for slot, part in chunks_of(lengths):
        alone.feed_chunk(slot, part)
    _, together = decoder(fixture, mtp=True)
    head, d = together.speculator.head, fixture.config.d_model
    rows = head.rows_in.nbytes // (4 * d)
    head.rows_in.upload(np.repeat(np.arange(rows, dtype=np.float32), d))
    together.feed_chunks(chunks_of(lengths))
    first = 0
    for slot, n in lengths.items():
        want, got = alone.speculator.caches[slot], together.speculator.caches[slot]
        assert (got.position, got.owed_rows, got.owed_tokens) == (want.position, want.owed_rows, want.owed_tokens)
        assert got.position == n - 1  # every row but the last, which is owed
        owed = got.owed.download(np.float32, d)
        assert (owed == OWED_ROWS + first + n - 1).all(), f"slot {slot} owes row {owed[0]}"
        first += n


def test_the_backend_shares_a_pass_over_every_card_and_refuses_what_it_cannot(demo):
    gpu = CudaBackend(demo, [CardSpec(0, 2 << 30)] * 2, context=256, chunk=CHUNK, slots=3, split=[4, 4],
                      card_factory=FakeCard, speculative=False)
    try:
        assert batches_prefill(gpu)
        lengths = {0: 20, 1: 12, 2: 30}
        gpu.prefill_slots({slot: list(range(1, n + 1)) for slot, n in lengths.items()})
        for stage in gpu.stages:
            assert [stage.decoder.seqs[slot].next_position for slot in lengths] == list(lengths.values())
        assert gpu.stages[-1].decoder._first_pick_rows == {0: 0, 1: 1, 2: 2}
        assert gpu.shares_prefill([9, 9]) and gpu.shares_prefill([5]) and not gpu.shares_prefill([40, 8])
        for parts in ({0: list(range(40)), 1: list(range(30))},  # 70 tokens: more than a chunk
                      {0: list(range(20)), 1: list(range(5))},  # 5 tokens take the GEMV alone: other bits
                      {0: list(range(20)), 1: []}):
            with pytest.raises(ValueError, match="cannot share a prefill pass"):
                gpu.prefill_slots(parts)
        for stage in gpu.stages:
            stage.decoder.seqs[2].next_position = 250
        with pytest.raises(RigllmError, match="exceed the context"):
            gpu.prefill_slots({0: list(range(20)), 2: list(range(20))})
        assert [stage.decoder.seqs[0].next_position for stage in gpu.stages] == [lengths[0]] * 2  # nothing ran
    finally:
        gpu.close()


def test_the_bench_cuts_shared_passes_as_the_scheduler_does_and_times_both_ways(demo):
    assert shared_passes([54] * 8, 256) == [[(i, 0, 54) for i in range(4)], [(i, 0, 54) for i in range(4, 8)]]
    assert shared_passes([300, 54], 256) == [[(0, 0, 256)], [(0, 256, 44), (1, 0, 54)]]
    assert shared_passes([10, 3, 20], 256) == [[(0, 0, 10), (2, 0, 20)], [(1, 0, 3)]]  # 3 tokens pass alone
    _, dec = decoder(demo, slots=4)
    result = arrival_prefill(dec, arrivals=(2, 4, 8), prompt_tokens=30, rounds=1)
    assert sorted(result["arrivals"]) == [2, 4]  # 8 arrivals need more slots than the decoder has
    assert result["arrivals"][4]["passes"] == 2  # two 30-token prompts a 64-token pass
    assert all(seq.next_position == 0 for seq in dec.seqs)
