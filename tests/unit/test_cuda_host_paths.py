"""The CUDA backend's host code on a stand-in card (no GPU): slots, KV formats, snapshots and the multi-card
pipeline build, prefill, step and hand off without Python-level errors, and launch only valid arguments.
Numbers are not checked here (no kernel runs): tests/gpu does that on the H200."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.cuda.bench.pipeline_bench import pipeline_decode_speed
from engine.cuda.logprobs import LOGPROB_MAX_PARTS, alloc_logprob_scratch, logprob_parts
from engine.cuda.sampling import default_parts
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import upload_weights
from engine.model.kv_formats import kv_format
from engine.generation.sampler import SamplingParams
from engine.errors import RigllmError
from engine.generation.slots import SlotRequest, SlotSnapshot
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from fake_card import FakeCard, entry_parameter_count


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


@pytest.mark.parametrize("kv", ["f16", "k8v3", "k3v3"])
def test_slot_decoder_runs_every_path(demo, kv):
    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    dec = SlotDecoder(card, demo.config, weights, context=96, slots=3, chunk=16, kv=kv_format(kv))
    greedy, sampled = SlotRequest(SamplingParams(temperature=0.0), [1, 2]), SlotRequest(SamplingParams(seed=1), [3])
    dec.prefill_slot(0, list(range(40)))
    dec.begin(0, greedy)
    dec.prefill_slot(1, [5, 6, 7])
    dec.begin(1, sampled)
    picks = dec.step({0: 1, 1: 2})
    assert set(picks) == {0, 1} and dec.seqs[0].next_position == 41
    snap = dec.snapshot_slot(0)
    dec.restore_slot(2, snap)
    assert dec.seqs[2].next_position == 41
    names = {name for name, *_ in card.launches}
    assert ("kv_encode_int8" in names) == kv.startswith("k8") and "attn_prep" in names


@pytest.mark.parametrize("kv", ["f16", "k8v3"])
def test_a_batched_step_launches_each_mixer_once_with_its_rows_slots(demo, kv):
    """Slot-indexed steps (engine.cuda.slot_batch): each layer's table lists every slot's state addresses in
    the kernels' order, the step buffer carries the rows' slots in the order the rows are fed, and a
    batched step launches each mixer kernel once per layer whatever its width (it used to launch them once
    per row)."""
    card = FakeCard()
    cfg = demo.config
    weights = upload_weights(card, demo.file, cfg)
    dec = SlotDecoder(card, cfg, weights, context=96, slots=4, chunk=16, kv=kv_format(kv))
    gdn, attn = cfg.gdn_layers[0], cfg.attention_layers[0]
    want_gdn = [p for seq in dec.seqs for p in (seq.gdn[gdn].conv.ptr, seq.gdn[gdn].recurrent.ptr)]
    want_attn = [p for seq in dec.seqs for side in (seq.kv[attn].k, seq.kv[attn].v)
                 for p in (side.codes.ptr, side.side.ptr if side.side is not None else 0)]
    assert dec.batch.tables[gdn].download(np.uint64, len(want_gdn)).tolist() == want_gdn
    assert dec.batch.tables[attn].download(np.uint64, len(want_attn)).tolist() == want_attn
    assert (want_attn[1] == 0) == (kv == "f16")
    greedy = SlotRequest(SamplingParams(temperature=0.0), [])
    for slot in (0, 2, 3):
        dec.prefill_slot(slot, [5, 6, 7 + slot])
        dec.begin(slot, greedy)
    card.launches.clear()
    dec.step({3: 1, 0: 2, 2: 3})
    rows = dec.batch.row_slot.download(np.int32, 3).tolist()
    assert rows == [0, 2, 3]  # rows follow the slots' order, as the picks' logits rows do
    names = [name for name, *_ in card.launches]
    assert names.count("gdn_recurrent_conv") == len(cfg.gdn_layers) and names.count("attn_prep") == len(cfg.attention_layers)
    assert "gdn_conv_silu" not in names  # one launch per GDN layer: the recurrence does the conv (issue 30)


def test_the_step_record_holds_every_slots_position_rope_position_and_mask_entry(demo):
    """The step buffer a batched step uploads: [slot][pos, 1], then [slot][t, h, w] (the next rope position, past
    an image's shift), the rows' slots, then each slot's mask entry (NO_MASK: a masked step uploads its slots'
    entries after its forward pass)."""
    from engine.cuda.slot_batch import ROPE_INTS, STEP_INTS
    from engine.cuda.token_masks import NO_MASK

    card = FakeCard()
    cfg = demo.config
    dec = SlotDecoder(card, cfg, upload_weights(card, demo.file, cfg), context=96, slots=3, chunk=16)
    for slot, n in enumerate((3, 5, 2)):
        dec.prefill_slot(slot, list(range(4, 4 + n)))
    dec.seqs[1].rope_shift = -2  # as after an image
    dec._write_steps([2, 0])
    host = dec._host_steps
    assert host[: STEP_INTS * 3].reshape(3, STEP_INTS).tolist() == [[3, 1], [5, 1], [2, 1]]
    rope = host[STEP_INTS * 3 : (STEP_INTS + ROPE_INTS) * 3].reshape(3, ROPE_INTS)
    assert rope.tolist() == [[3] * 3, [3] * 3, [2] * 3]
    rows_at = (STEP_INTS + ROPE_INTS) * 3
    assert host[rows_at : rows_at + 2].tolist() == [2, 0]
    assert host[dec._masks_at : dec._masks_at + 3].tolist() == [NO_MASK] * 3


def test_slot_layout_constants_mirror_common_cuh():
    """The step record and pointer-table widths the host writes are the ones the kernels read (common.cuh)."""
    import re

    from engine.cuda import slot_batch
    from engine.cuda.kernel_build import CUDA_SRC_DIR

    source = (CUDA_SRC_DIR / "common.cuh").read_text()
    defines = {name: int(value) for name, value in re.findall(r"#define (RIGLLM_\w+) (\d+)", source)}
    assert {k: defines[k] for k in ("RIGLLM_STEP_INTS", "RIGLLM_GDN_SLOT_PTRS", "RIGLLM_KV_SLOT_PTRS")} == {
        "RIGLLM_STEP_INTS": slot_batch.STEP_INTS, "RIGLLM_GDN_SLOT_PTRS": slot_batch.GDN_SLOT_PTRS,
        "RIGLLM_KV_SLOT_PTRS": slot_batch.KV_SLOT_PTRS}


def test_pipeline_hands_rows_between_cards(demo):
    pipe = CudaBackend(demo, [CardSpec(0)] * 3, context=96, slots=2, chunk=16, split=[3, 3, 2],
                       card_factory=FakeCard)
    try:
        assert [(s.start, s.stop) for s in pipe.spans] == [(0, 3), (3, 6), (6, 8)]
        pipe.prefill_slot(0, list(range(50)))  # four chunks through three cards
        pipe.begin(0, SlotRequest(SamplingParams(temperature=0.0), ()))
        pipe.step({0: 4})
        assert pipe.position(0) == 51
        seq = pipe.new_sequence()
        assert np.isfinite(pipe.forward_last([1, 2, 3], seq)).all()
        assert pipeline_decode_speed(pipe, 2, 3) > 0  # the pipeline bench's decode timing runs on the same slots
        assert pipe.position(1) == 16 + 1 + 3
    finally:
        pipe.close()


def test_uploading_weights_leaves_the_file_out_of_the_page_cache(demo, tmp_path):
    """Each tensor's pages are dropped once it is on the card, so a model larger than host RAM loads.

    A private, written-back copy of the file: pages another mapping in this process still holds (other
    tests' models) and pages not yet written back cannot leave the cache."""
    import os
    import shutil

    from engine.gguf.streaming_read import cached_fraction

    path = shutil.copy(demo.path, tmp_path / "copy.gguf")
    with open(path, "rb+") as fh:  # written back: dirty pages cannot be dropped from the cache
        os.fsync(fh.fileno())
    loaded = load_model(path)
    Path(path).read_bytes()  # now cached
    before = cached_fraction(path)
    if before is None:
        pytest.skip("mincore is not available here")
    upload_weights(FakeCard(), loaded.file, loaded.config)
    after = cached_fraction(path)
    # The demo model's tensors are small and uploaded out of file order, so readahead brings back some
    # pages already released (and pages shared with a neighbour stay); a real model's tensors are MBs.
    # Without the release the whole file stays cached (1.0).
    print(f"page cache: {before:.2f} of the file before the upload, {after:.2f} after")
    assert before > 0.9 and after < 0.7


def test_the_pipeline_runs_its_cards_on_threads_from_the_factory(demo):
    import threading

    made: list[str] = []

    def factory(target, name):
        made.append(name)
        return threading.Thread(target=target, name=name, daemon=True)

    pipe = CudaBackend(demo, [CardSpec(0)] * 2, context=64, chunk=16, card_factory=FakeCard, thread_factory=factory)
    try:
        pipe.prefill_slot(0, list(range(20)))
    finally:
        pipe.close()
    assert made == ["rigllm-card0", "rigllm-card1"]



def test_one_card_is_a_stage_run_inline_on_the_callers_thread(demo):
    """A single card gets no thread of its own: it is made, planned, loaded and driven on the thread that opened
    the backend (the serving worker's owns it), through the same stage path as several cards (the pipelined
    prefill of several chunks, the step, snapshots, the Backend protocol), and keeps the driver's card name."""
    import threading

    made: list[str] = []
    on: set[int] = set()

    class NotingCard(FakeCard):
        def kernel(self, name):
            on.add(threading.get_ident())
            return super().kernel(name)

    def factory(target, name):
        made.append(name)
        return threading.Thread(target=target, name=name, daemon=True)

    before = threading.active_count()
    gpu = CudaBackend(demo, context=96, chunk=16, slots=2, card_factory=NotingCard, thread_factory=factory)
    try:
        assert threading.active_count() == before and gpu.plan.cards[0].profile.name == "fake:0"
        seq = gpu.new_sequence()
        assert np.isfinite(gpu.forward_last(list(range(40)), seq)).all()  # three chunks
        assert len(list(gpu.decode_on_device(seq, SamplingParams(temperature=0.0), list(range(40)), 3))) == 3
        snapshot = gpu.snapshot_slot(0)
        gpu.restore_slot(1, snapshot)
        assert gpu.position(1) == gpu.position(0) == 42 and gpu.slots.seqs[1].next_position == 42
        with pytest.raises(RigllmError, match="2 card"):
            gpu.restore_slot(1, SlotSnapshot(snapshot.state * 2, 0))
    finally:
        gpu.close()
    assert made == [] and on == {threading.get_ident()}


@pytest.mark.parametrize("n_cards", [1, 2])
def test_a_cancelled_load_frees_every_card(demo, n_cards):
    """A progress callback that cancels the load mid-way leaves no card open, on one card as on several."""
    from engine.model.load_progress import LoadCancelled

    cards: list[FakeCard] = []

    class ClosingCard(FakeCard):
        closed = False

        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            cards.append(self)

        def close(self) -> None:
            self.closed = True

    def cancel(p) -> None:
        if p.stage.startswith("allocating slots"):
            raise LoadCancelled("cancelled")

    with pytest.raises(LoadCancelled):
        CudaBackend(demo, [CardSpec(0)] * n_cards, context=64, chunk=16, progress=cancel, card_factory=ClosingCard)
    assert len(cards) == n_cards and all(c.closed for c in cards)

def test_norms_split_each_row_over_blocks_for_gemv_sized_batches(demo):
    """A batched step (and a speculative verify) normalises its few rows as decode does, each row over
    NORM_SLICES_DECODE blocks (the same bits: tests/gpu/test_norm_rope.py); prefill chunks keep one block per row."""
    from engine.cuda.norm import NORM_SLICES_DECODE, NORM_THREADS_BATCH, NORM_THREADS_DECODE

    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    dec = SlotDecoder(card, demo.config, weights, context=96, slots=3, chunk=16)
    greedy = SlotRequest(SamplingParams(temperature=0.0), [])
    for slot in (0, 1):
        dec.prefill_slot(slot, [5, 6, 7])
        dec.begin(slot, greedy)
    card.launches.clear()
    dec.prefill_slot(2, list(range(16)))
    # the norm's own grid (a decode-sized one adds z layers of L2-prefetching blocks: engine/cuda/l2_prefetch.py)
    assert {(grid[:2], block) for name, grid, block, _ in card.launches if name == "rmsnorm_q8_1"} == {
        ((16, 1), NORM_THREADS_BATCH), ((1, NORM_SLICES_DECODE), NORM_THREADS_DECODE)}  # the layers; the last row's head norm
    card.launches.clear()
    dec.step({0: 1, 1: 2})
    assert {(grid[:2], block) for name, grid, block, _ in card.launches if name == "rmsnorm_q8_1"} == {
        ((2, NORM_SLICES_DECODE), NORM_THREADS_DECODE)}


def test_one_step_graph_per_batch_width_whatever_the_slots_and_modes(demo):
    """Every set of stepped slots of one width replays the same graph (issue 28: graphs keyed by slot sets
    and sampling modes numbered 80 for 4 slots and 6,560 for 8, captured again mid-serving): 84 distinct sets
    of 2 and 3 of 8 slots, greedy and sampled mixed, capture exactly two graphs, and the rows' slots each step
    writes follow the fed slots."""
    from itertools import combinations

    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    dec = SlotDecoder(card, demo.config, weights, context=96, slots=8, chunk=16)
    for slot in range(8):
        dec.prefill_slot(slot, [5, 6, 7])
        params = SamplingParams(temperature=0.0) if slot % 2 else SamplingParams(temperature=0.7, seed=slot)
        dec.begin(slot, SlotRequest(params, []))
    before = list(card.graphs)
    subsets = [s for n in (2, 3) for s in combinations(range(8), n)]
    for subset in subsets:
        picks = dec.step({slot: 1 for slot in subset})
        assert sorted(picks) == list(subset)
        assert dec.batch.row_slot.download(np.int32, len(subset)).tolist() == list(subset)
    assert len(subsets) == 84 and len(card.graphs) == len(before) + 2
    assert sorted(dec._graphs) == [2, 3]


def test_logprobs_come_from_the_card_record_and_do_not_change_the_step_graph(demo):
    """A request with top_logprobs gets them with each pick from the slot's 176-byte record (the kernels are
    in every step graph and return at once for slots that asked for nothing), so asking or not replays the
    same graph; a slot that asked for nothing gets no logprobs."""
    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    dec = SlotDecoder(card, demo.config, weights, context=96, slots=2, chunk=16)
    asking = SlotRequest(SamplingParams(temperature=0.0), [], logprobs=3)
    plain = SlotRequest(SamplingParams(temperature=0.0), [])
    dec.prefill_slot(0, [5, 6, 7])
    first = dec.begin(0, asking)
    dec.prefill_slot(1, [5, 6])
    assert first.logprobs is not None and len(first.logprobs.top) == 3 and dec.begin(1, plain).logprobs is None
    card.launches.clear()
    picks = dec.step({0: 1, 1: 2})
    assert len(picks[0].logprobs.top) == 3 and picks[1].logprobs is None
    assert [(name, grid) for name, grid, *_ in card.launches if name == "logprob_final"] == [("logprob_final", (1, 2))]  # one launch for both rows
    graphs = list(card.graphs)
    dec.begin(0, plain)
    dec.begin(1, asking)
    picks = dec.step({0: 3, 1: 4})
    assert picks[0].logprobs is None and len(picks[1].logprobs.top) == 3
    assert card.graphs == graphs  # the same slots: the same graph, whoever asks for logprobs
    assert [int(dec.logprobs[s].wanted.data.view(np.int32)[0]) for s in (0, 1)] == [0, 1]
    assert all(n == entry_parameter_count(name) for name, _, _, n in card.launches if name.startswith("logprob_"))


def test_logprobs_run_over_no_more_slices_than_the_final_launch_holds():
    """logprobs.cu's final launch stages one slice's list per thread (LOGPROB_MAX_PARTS of them in shared memory):
    a card whose sampler splits the vocabulary wider takes that many slices for logprobs, and more are refused."""
    card = FakeCard()  # an H200's 132 SMs: the sampler's 264 slices
    assert default_parts(card, 248320) == 264 and logprob_parts(card, 248320) == LOGPROB_MAX_PARTS == 256
    card.sm_count = 80  # a CMP 100-210's
    assert logprob_parts(card, 248320) == default_parts(card, 248320) == 160
    assert logprob_parts(card, 1000) == default_parts(card, 1000) == 4
    with pytest.raises(ValueError, match="1 to 256 slices, not 257"):
        alloc_logprob_scratch(card, LOGPROB_MAX_PARTS + 1, 1, "too.wide")


def test_a_logprob_record_reads_as_the_schedulers_token_logprob():
    from engine.cuda.logprobs import LOGPROB_DTYPE, token_logprob_of

    rec = np.zeros(1, LOGPROB_DTYPE)[0]
    rec["lse"], rec["token_logit"], rec["token"] = 2.5, 1.5, 7
    rec["top_id"][:] = -1
    rec["top_id"][:2] = (7, 3)
    rec["top_logit"][:2] = (1.5, 0.5)
    got = token_logprob_of(rec, 5)  # a vocabulary of two: the padding (-1) is dropped
    assert got.token == 7 and got.logprob == pytest.approx(-1.0) and got.top == ((7, -1.0), (3, -2.0))
    assert token_logprob_of(rec, 1).top == ((7, -1.0),) and token_logprob_of(rec, 0).top == ()
    with pytest.raises(ValueError):
        token_logprob_of(rec, 21)


def test_a_batch_of_records_reads_as_each_record_alone_in_python_floats():
    """token_logprobs_of's whole-array float64 arithmetic gives exactly what Python floats give record by record:
    float(x) - lse for every logit, padding ids dropped, each row's own top count."""
    from engine.cuda.logprobs import LOGPROB_DTYPE, LOGPROB_TOP, token_logprobs_of

    rng = np.random.default_rng(5)
    recs = np.zeros(4, LOGPROB_DTYPE)
    recs["lse"] = rng.normal(0, 30, 4)
    recs["token_logit"] = rng.normal(0, 30, 4)
    recs["token"] = rng.integers(0, 248320, 4)
    recs["top_id"] = rng.integers(0, 248320, (4, LOGPROB_TOP))
    recs["top_id"][2, 5:] = -1
    recs["top_logit"] = rng.normal(0, 30, (4, LOGPROB_TOP))
    top_ns = [20, 0, 20, 3]
    for rec, n, got in zip(recs, top_ns, token_logprobs_of(recs, top_ns)):
        lse = float(rec["lse"])
        want = tuple((int(i), float(x) - lse) for i, x in zip(rec["top_id"][:n], rec["top_logit"][:n]) if i >= 0)
        assert got.token == int(rec["token"]) and got.logprob == float(rec["token_logit"]) - lse and got.top == want
    assert token_logprobs_of(recs[[]], []) == []


def test_sampling_modes_are_data_one_graph_serves_greedy_and_sampled_slots(demo):
    """Switching a slot between greedy and sampled requests reuses the step graph (the mode is in the slot's
    parameter buffer, written at begin for greedy requests too)."""
    from engine.cuda.sampling import PARAMS_DTYPE

    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    dec = SlotDecoder(card, demo.config, weights, context=96, slots=2, chunk=16)
    sampled = SlotRequest(SamplingParams(temperature=0.8, top_k=40, seed=3), [1, 2])
    greedy = SlotRequest(SamplingParams(temperature=0.0), [])
    for slot in (0, 1):
        dec.prefill_slot(slot, [5, 6, 7])
    dec.begin(0, sampled)
    dec.begin(1, greedy)
    dec.step({0: 1, 1: 2})
    graphs = list(card.graphs)
    dec.begin(0, greedy)
    dec.begin(1, sampled)
    dec.step({0: 3, 1: 4})
    assert card.graphs == graphs
    temperatures = [float(s.params.data.view(PARAMS_DTYPE)[0]["temperature"]) for s in dec.samplers]
    assert temperatures == [0.0, 0.8]  # the greedy slot's buffer no longer holds the sampled request's mode


def test_a_launched_step_is_collected_like_a_step_and_its_idle_gap_counted(demo):
    """`launch` queues a step and returns; `collect` gives its picks. A step that follows another directly has
    its gap counted (a stand-in event says 1 ms); a prefill in between is not idle time. A slot that wants its
    logits rows is never launched (they are read after the step)."""
    card = FakeCard()
    dec = SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), context=64, slots=2, chunk=16)
    greedy = SlotRequest(SamplingParams(temperature=0.0), [])
    for slot in (0, 1):
        dec.prefill_slot(slot, [4, 5, 6])
        dec.begin(slot, greedy)
    assert dec.launch({0: 1, 1: 2}) and set(dec.collect()) == {0, 1}
    assert dec.launch({0: 3, 1: 4}) and set(dec.collect()) == {0, 1}
    assert dec.gaps.steps == 1 and dec.gaps.mean_ms == 1.0
    dec.prefill_slot(0, [7])
    assert dec.launch({0: 5}) and set(dec.collect()) == {0}
    assert dec.gaps.steps == 1 and dec.seqs[0].next_position == 3 + 2 + 1 + 1
    dec.begin(1, SlotRequest(SamplingParams(temperature=0.0), [], host_logits=True))
    assert not dec.launch({0: 1, 1: 2})
