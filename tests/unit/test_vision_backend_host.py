"""The CUDA backend's image path on a stand-in card (no GPU): image rows reach the hidden rows, (t, h, w)
positions reach every attention prep, decode and follow-up text continue at "largest position + 1",
the vision tower is loaded onto the first card and counted in the memory plan. The arithmetic is
tests/gpu/test_vision_backend_gpu.py's job; here no kernel runs, so the hidden rows of a pass hold
exactly what the host put there."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.cuda.prefill_chunks import embedded_runs
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import upload_weights
from engine.errors import RigllmError
from engine.model.memory_plan import CardProfile, plan
from engine.model.model_footprint import footprint_of
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest, supports_images
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.vision.mmproj import load_mmproj
from engine.vision.config import VisionConfig
from engine.vision.device_footprint import tower_footprint, tower_scratch_bytes, tower_weight_bytes, with_tower
from engine.vision.multimodal_prompt import EncodedImage, MultimodalPrompt, PromptSegment, expand_image_pads
from engine.vision.preprocess import PreparedImage
from engine.vision.random_mmproj import write_random_mmproj
from fake_card import FakeCard

PAD = 7  # any id serves as the image pad here: its embedding is replaced
POSITIONS_ARG = 9  # attn_prep's `positions` argument


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


@pytest.fixture(scope="module")
def mmproj(demo, tmp_path_factory):
    cfg = VisionConfig(n_embd=32, n_ff=48, n_layers=2, n_head=2, patch_size=16, merge_size=2, image_size=64,
                       eps=1e-6, projection_dim=demo.config.d_model, image_mean=(0.5, 0.5, 0.5),
                       image_std=(0.5, 0.5, 0.5))
    return load_mmproj(write_random_mmproj(tmp_path_factory.mktemp("mm") / "mmproj.gguf", cfg, seed=2))


def image_prompt(d_model: int, grids: list[tuple[int, int]], before: int = 5, after: int = 4) -> MultimodalPrompt:
    """Text, then one `<|image_pad|>` per grid with text between, then text; random image embeddings."""
    rng = np.random.default_rng(3)
    ids = list(range(20, 20 + before))
    for k, _ in enumerate(grids):
        ids += [PAD] + list(range(40 + 10 * k, 43 + 10 * k))
    ids += list(range(100, 100 + after))
    images = [EncodedImage(g, rng.standard_normal((g[0] * g[1], d_model)).astype(np.float32)) for g in grids]
    return expand_image_pads(ids, images, PAD)


def decoder(demo, card: FakeCard, chunk: int, slots: int = 1) -> SlotDecoder:
    return SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), context=128, slots=slots,
                       chunk=chunk)


def prep_positions(card: FakeCard) -> list:
    return [args[POSITIONS_ARG] for name, args in card.launch_args if name == "attn_prep"]


def test_image_rows_replace_the_embeddings_and_positions_reach_attention(demo):
    card = FakeCard()
    dec = decoder(demo, card, chunk=64)
    prompt = image_prompt(demo.config.d_model, [(3, 4)])
    n, d = len(prompt.token_ids), demo.config.d_model
    card.launch_args.clear()
    dec.prefill_embedded(0, prompt.segment(0, n))
    hidden = dec.fwd.h.download(np.float32, (n, d))  # no kernel ran: the rows are what the host wrote
    np.testing.assert_array_equal(hidden[prompt.embedding_rows], prompt.embeddings)
    np.testing.assert_array_equal(dec.fwd.positions.download(np.int32, (n, 3)), prompt.positions)
    passed = prep_positions(card)
    assert len(passed) == len(demo.config.attention_layers)
    assert all(p is not None and p.owner is dec.fwd.positions for p in passed)
    seq = dec.seqs[0]
    assert seq.next_position == n and seq.next_rope_position == prompt.next_position < n


def test_text_passes_keep_text_positions(demo):
    card = FakeCard()
    dec = decoder(demo, card, chunk=16)
    card.launch_args.clear()  # the warm-up's decode passes read the slots' rope rows
    dec.prefill_slot(0, list(range(30)))
    assert prep_positions(card) and all(p is None for p in prep_positions(card))
    assert dec.seqs[0].rope_shift == 0


def test_a_chunked_image_prompt_carries_each_chunks_rows_and_positions(demo):
    card = FakeCard()
    dec = decoder(demo, card, chunk=8)
    prompt = image_prompt(demo.config.d_model, [(2, 5), (3, 1)])  # 10 + 3 image rows, chunks cut through them
    n, d = len(prompt.token_ids), demo.config.d_model
    uploads: list[tuple[np.ndarray, np.ndarray]] = []
    real_run = dec.fwd.run

    def run(count, seq, positions=None, embedded=()):
        real_run(count, seq, positions, embedded)
        uploads.append((dec.fwd.h.download(np.float32, (count, d)), dec.fwd.positions.download(np.int32, (count, 3))))

    dec.fwd.run = run
    dec.prefill_embedded(0, prompt.segment(0, n))
    rows = np.concatenate([h for h, _ in uploads])
    np.testing.assert_array_equal(rows[prompt.embedding_rows], prompt.embeddings)
    np.testing.assert_array_equal(np.concatenate([p for _, p in uploads]), prompt.positions)
    assert dec.seqs[0].next_rope_position == prompt.next_position


def test_decode_and_a_follow_up_turn_continue_at_the_largest_position_plus_one(demo):
    card = FakeCard()
    dec = decoder(demo, card, chunk=64, slots=2)
    prompt = image_prompt(demo.config.d_model, [(4, 2)])
    n = len(prompt.token_ids)
    dec.prefill_embedded(1, prompt.segment(0, n))
    dec.begin(1, SlotRequest(SamplingParams(temperature=0.0), prompt.token_ids))
    card.launch_args.clear()
    dec.step({1: 5})
    steps = dec.steps.download(np.int32, 5 * 2)
    assert list(steps[2:4]) == [n, 1]  # slot 1's cache row and batch size
    assert list(steps[4 + 3 : 4 + 6]) == [prompt.next_position] * 3  # slot 1's decode rope position
    # the captured graph's prep reads every slot's rope positions there, row 0 at its slot (1)
    assert all(p is dec.batch.rope for p in prep_positions(card)) and dec.batch.row_slot.download(np.int32, 1)[0] == 1
    seq = dec.seqs[1]
    assert (seq.next_position, seq.next_rope_position) == (n + 1, prompt.next_position + 1)

    dec.prefill_slot(1, [1, 2, 3])  # the next turn's text
    want = np.repeat(np.arange(prompt.next_position + 1, prompt.next_position + 4)[:, None], 3, axis=1)
    np.testing.assert_array_equal(dec.fwd.positions.download(np.int32, (3, 3)), want)
    assert seq.next_rope_position == prompt.next_position + 4


def test_image_states_are_not_snapshotted_and_a_restore_clears_the_shift(demo):
    card = FakeCard()
    dec = decoder(demo, card, chunk=64, slots=2)
    dec.prefill_slot(0, [1, 2, 3])
    text_state = dec.snapshot_slot(0)
    prompt = image_prompt(demo.config.d_model, [(3, 3)])
    dec.prefill_embedded(1, prompt.segment(0, len(prompt.token_ids)))
    with pytest.raises(ValueError, match="images"):
        dec.snapshot_slot(1)
    dec.restore_slot(1, text_state)
    assert dec.seqs[1].rope_shift == 0 and dec.seqs[1].next_position == 3


def test_embedded_runs_split_at_gaps_and_keep_order():
    emb = np.arange(5 * 2, dtype=np.float32).reshape(5, 2)
    runs = embedded_runs(PromptSegment([0] * 12, np.zeros((12, 3), np.int64), np.array([3, 4, 5, 9, 10]), emb))
    assert [(first, len(block)) for first, block in runs] == [(3, 3), (9, 2)]
    np.testing.assert_array_equal(np.concatenate([b for _, b in runs]), emb)
    assert embedded_runs(PromptSegment([1], np.zeros((1, 3), np.int64), np.zeros(0, np.int64),
                                       np.zeros((0, 2), np.float32))) == []


def test_the_backend_loads_the_tower_on_its_card_within_the_plan(demo, mmproj):
    cards: list[FakeCard] = []

    def fake(index, capacity_bytes=None, name=None):
        cards.append(FakeCard(index, capacity_bytes, name))
        return cards[-1]

    plain = CudaBackend(demo, context=64, chunk=32, card_factory=fake)
    assert not supports_images(plain) and plain.images is None
    with pytest.raises(RigllmError, match="mmproj"):
        plain.encode_image(PreparedImage(np.zeros((3, 64, 64), np.float32), 16, 2))
    text_bytes = cards[-1].allocated_bytes

    gpu = CudaBackend(demo, context=64, chunk=32, mmproj=mmproj, card_factory=fake)
    card = cards[-1]
    assert supports_images(gpu)
    tower = tower_footprint(mmproj.config)
    assert card.allocated_bytes - text_bytes == tower.weight_bytes  # the tower's weights, nothing else
    assert gpu.plan.cards[0].total_bytes - plain.plan.cards[0].total_bytes == tower.weight_bytes + tower.scratch_bytes
    assert any("vision tower" in note for note in gpu.plan.notes)

    image = PreparedImage(np.zeros((3, 96, 64), np.float32), 16, 2)  # 6×4 patches, 3×2 tokens
    before = card.allocated_bytes
    out = gpu.encode_image(image)
    assert out.shape == (6, demo.config.d_model)
    assert card.allocated_bytes - before == tower_scratch_bytes(mmproj.config, 6)


def test_footprint_counts_fp16_matrices_once_for_both_patch_kernels(mmproj):
    cfg = mmproj.config
    e, p = cfg.n_embd, cfg.patch_size
    fp32 = 4 * (e + cfg.pos_side**2 * e + cfg.n_layers * (2 * e + 3 * e + e + 2 * e + cfg.n_ff + e) + 2 * e
                + cfg.merged_width + cfg.projection_dim)
    fp16 = 2 * (e * 3 * p * p + cfg.n_layers * (3 * e * e + e * e + 2 * cfg.n_ff * e) + cfg.merged_width**2
                + cfg.projection_dim * cfg.merged_width)
    assert tower_weight_bytes(cfg) == fp32 + fp16
    assert tower_footprint(cfg).max_tokens == 4096  # the default pixel bound (no bounds in the file)


def test_a_tower_that_does_not_fit_is_refused_with_the_reason(demo, mmproj):
    fp = footprint_of(demo)
    card = CardProfile("small card", 600 << 20, reserve_bytes=0, margin=0.0)
    plan(fp, [card], 256)  # the text model fits
    with_vision = with_tower(fp, mmproj.config)
    assert with_tower(fp, None) is fp
    fits = plan(with_vision, [card], 256).cards[0]
    assert fits.total_bytes - plan(fp, [card], 256).cards[0].total_bytes == sum(with_vision.vision_bytes)
    with pytest.raises(RigllmError, match="vision tower takes"):
        plan(dataclasses.replace(fp, vision_bytes=(500 << 20, 200 << 20)), [card], 256)


def test_the_pipeline_keeps_the_tower_on_the_first_card(demo, mmproj):
    pipe = CudaBackend(demo, [CardSpec(0)] * 2, context=96, slots=1, chunk=16, split=[4, 4],
                       card_factory=FakeCard, mmproj=mmproj)
    try:
        assert supports_images(pipe) and pipe.images is not None
        first, second = (st.card for st in pipe.stages)
        assert pipe.images.tower.card is first
        assert second.allocated_bytes < first.allocated_bytes
        prompt = image_prompt(demo.config.d_model, [(3, 4)])
        n = len(prompt.token_ids)
        pipe.prefill_embedded(0, prompt.segment(0, n))  # two chunks through two cards
        for st in pipe.stages:
            seq = st.decoder.seqs[0]
            assert (seq.next_position, seq.next_rope_position) == (n, prompt.next_position)
        assert second.launch_args and all(p is not None for p in prep_positions(second))
        pipe.begin(0, SlotRequest(SamplingParams(temperature=0.0), ()))
        pipe.step({0: 4})
        assert pipe.position(0) == n + 1
        assert pipe.encode_image(PreparedImage(np.zeros((3, 64, 64), np.float32), 16, 2)).shape == (4, 256)
    finally:
        pipe.close()


def test_plans_made_before_loading_count_the_mmproj_beside_the_model(demo, mmproj, tmp_path):
    import shutil

    from engine.vision.mmproj_pairing import paired_vision_config
    from engine.server.admin_footprint import footprint_from_json, footprint_to_json

    model = tmp_path / "model.gguf"
    shutil.copy(demo.path, model)
    assert paired_vision_config(model, demo.config.d_model) is None
    shutil.copy(mmproj.path, tmp_path / "mmproj-model.gguf")
    assert paired_vision_config(model, demo.config.d_model) == mmproj.config
    assert paired_vision_config(model, 2 * demo.config.d_model) is None  # another model size: unusable, not planned
    fp = with_tower(footprint_of(demo), mmproj.config)
    assert footprint_from_json(footprint_to_json(fp)) == fp
