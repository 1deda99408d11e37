"""The whole multimodal forward on the CUDA backend against the numpy reference (kernel-rounding mode).

A random text model and a random vision tower (engine.vision.random_mmproj, no torch needed). The
tower runs on the card (`CudaBackend.encode_image`); both backends then get the same image rows, so
this compares the LLM side: the image rows replacing the pad embeddings, the (t, h, w) positions of
image tokens, decode and a follow-up turn continuing at "largest position + 1". Teacher forcing: the
reference's greedy tokens are fed to both, logits compared after the prompt and after every fed token.

Tolerance: the measured noise floor of test_cuda_backend.py (the reference against itself with its
token embeddings and the image rows perturbed by 1e-6 and 1e-5 relative), times FLOOR_FACTOR, plus
fp32 agreement; greedy tokens must agree wherever the reference's top-2 margin exceeds twice that.
That floor is wide on random models in kernel-rounding mode (measured here: 5-15% of the logit
range, from Q8 rounding flips that grow layer by layer): it catches image rows that were not
spliced in (measured: 140% error), but not wrong M-RoPE positions (measured: 4-7%, inside the floor).
Positions are therefore checked by exact equalities on the card instead
(`test_positions_are_used_and_text_after_an_image_continues_exactly`), next to the host tests of
what goes into the position buffers (tests/unit/test_vision_backend_host.py) and the kernel test of
attn_prep's image positions (test_norm_rope.py).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.fixtures.synthetic import write_random_model
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.vision.config import VisionConfig
from engine.vision.multimodal_prompt import EncodedImage, MultimodalPrompt, expand_image_pads
from engine.vision.preprocess import PreparedImage
from engine.vision.random_mmproj import write_random_mmproj
from engine.vision.tower import VisionTower
from engine.vision.mmproj import load_mmproj
from tests.gpu.test_cuda_backend import FLOOR_FACTOR, FP32_AGREEMENT, PERTURBATIONS, reference, rel_error, tiny_config

GREEDY = SamplingParams(temperature=0.0)
LOGITS = SlotRequest(GREEDY, (), host_logits=True)
STEPS = 6  # forced tokens after each turn
CHUNK = 16  # small, so chunk boundaries fall inside the images


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("vlm")
    out = {}
    for name, loaded in (("demo", load_model(ensure_demo_model())),
                         ("gqa4-hv3-l6", load_model(write_random_model(folder / "tiny.gguf", tiny_config("gqa4-hv3-l6"),
                                                                       seed=4)))):
        cfg = VisionConfig(n_embd=32, n_ff=48, n_layers=2, n_head=2, patch_size=16, merge_size=2, image_size=64,
                           eps=1e-6, projection_dim=loaded.config.d_model, image_mean=(0.5, 0.5, 0.5),
                           image_std=(0.5, 0.5, 0.5))
        out[name] = (loaded, load_mmproj(write_random_mmproj(folder / f"mmproj-{name}.gguf", cfg, seed=5)))
    return out


def random_image(rng: np.random.Generator, height: int, width: int) -> PreparedImage:
    return PreparedImage(rng.uniform(-1, 1, (3, height, width)).astype(np.float32), 16, 2)


def image_prompt(rng: np.random.Generator, vocab: int, images: list[EncodedImage]) -> MultimodalPrompt:
    pad = vocab - 5
    ids = rng.integers(0, vocab - 10, 11).tolist()
    for _ in images:
        ids += [pad] + rng.integers(0, vocab - 10, 5).tolist()
    return expand_image_pads(ids, images, pad)


def reference_turns(model, prompt: MultimodalPrompt, embeddings: np.ndarray, follow_ups: list[list[int]],
                    forced: list[list[int]] | None) -> tuple[list[np.ndarray], list[list[int]]]:
    """Logits after the prompt, each forced token, each follow-up turn; forced tokens are the reference's
    own greedy picks when `forced` is None (returned for the other runs)."""
    state = model.new_state()
    rows = [model.logits(model.forward_hidden(prompt.token_ids, state, prompt.positions, embeddings,
                                              prompt.embedding_rows)[-1:])[0]]
    picked: list[list[int]] = []
    for turn in range(len(follow_ups) + 1):
        if turn:
            rows.append(model.forward(follow_ups[turn - 1], state)[-1])
        tokens = []
        for i in range(STEPS):
            tokens.append(int(rows[-1].argmax()) if forced is None else forced[turn][i])
            rows.append(model.forward([tokens[-1]], state)[-1])
        picked.append(tokens)
    return rows, picked


def backend_turns(backend, prompt: MultimodalPrompt, follow_ups: list[list[int]],
                  forced: list[list[int]]) -> list[np.ndarray]:
    """The same on slot 0 through the slot API (decode steps replay the captured graphs)."""
    backend.reset_slot(0)
    backend.prefill_embedded(0, prompt.segment(0, len(prompt.token_ids)))
    rows = [backend.begin(0, LOGITS).logits]
    for turn in range(len(follow_ups) + 1):
        if turn:
            backend.prefill_slot(0, follow_ups[turn - 1])
            rows.append(backend.begin(0, LOGITS).logits)
        for t in forced[turn]:
            rows.append(backend.step({0: t})[0].logits)
    return rows


def compare(loaded, prompt: MultimodalPrompt, follow_ups: list[list[int]], gpu,
            label: str) -> tuple[list[list[int]], list[np.ndarray]]:
    """Teacher-forced GPU logits within the floor of the reference's; returns (forced tokens, GPU rows)."""
    ref = reference(loaded)
    want, forced = reference_turns(ref, prompt, prompt.embeddings, follow_ups, None)
    floor = np.zeros(len(want))
    for size in PERTURBATIONS:
        noise = np.random.default_rng(2).standard_normal(prompt.embeddings.shape).astype(np.float32)
        noisy, _ = reference_turns(reference(loaded, perturb=size), prompt, prompt.embeddings * (1 + size * noise),
                                   follow_ups, forced)
        floor = np.maximum(floor, [rel_error(n, w) for n, w in zip(noisy, want)])
    got = backend_turns(gpu, prompt, follow_ups, forced)
    errors = [rel_error(g, w) for g, w in zip(got, want)]
    limit = FLOOR_FACTOR * max(floor) + FP32_AGREEMENT
    agree = sum(int(g.argmax()) == int(w.argmax()) for g, w in zip(got, want))
    print(f"{label}: GPU rel error max {max(errors):.2e} median {np.median(errors):.2e} (floor max {max(floor):.2e}, "
          f"limit {limit:.2e}); top-1 agree {agree}/{len(want)}")
    assert max(errors) < limit
    assert np.median(errors) < FLOOR_FACTOR * np.median(floor) + FP32_AGREEMENT
    for g, w in zip(got, want):
        top2 = np.sort(w)[-2:]
        if (top2[1] - top2[0]) / np.abs(w).max() > 2 * limit:
            assert int(g.argmax()) == int(w.argmax())
    return forced, got


def encoded(gpu, mmproj, image: PreparedImage) -> EncodedImage:
    """The card's tower output for `image`, checked against the numpy tower (fp16 tolerance of test_vision_gpu)."""
    got = gpu.encode_image(image)
    want = VisionTower.from_mmproj(mmproj).encode(image)
    cosine = np.sum(got * want, axis=1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1))
    assert cosine.min() >= 0.999
    return EncodedImage(image.merged_grid, got)


@pytest.mark.parametrize("name", ["demo", "gqa4-hv3-l6"])
def test_one_image_then_a_follow_up_turn_match_the_reference(models, name):
    loaded, mmproj = models[name]
    rng = np.random.default_rng(7)
    gpu = CudaBackend(loaded, context=256, chunk=CHUNK, mmproj=mmproj)
    try:
        assert gpu.supports_images
        image = encoded(gpu, mmproj, random_image(rng, 160, 96))  # 5×3 tokens: max(mh, mw) ≠ mh·mw
        prompt = image_prompt(rng, loaded.config.vocab_size, [image])
        follow_up = rng.integers(0, loaded.config.vocab_size - 10, 9).tolist()
        forced, rows = compare(loaded, prompt, [follow_up], gpu, f"{name} one image + follow-up")

        seq = gpu.new_sequence()  # slot 0, reset: greedy decoding on the card from the graphs, no host logits
        gpu.prefill_embedded(seq.slot, prompt.segment(0, len(prompt.token_ids)))
        assert gpu.slots.seqs[seq.slot].next_rope_position == prompt.next_position
        tokens = list(gpu.decode_on_device(seq, GREEDY, prompt.token_ids, STEPS))
        print(f"{name}: greedy on the card {tokens}, reference {forced[0]}")
        # the same states as the teacher-forced run while its argmax follows the reference's picks
        for i, token in enumerate(tokens):
            assert token == int(rows[i].argmax())
            if token != forced[0][i]:
                break
    finally:
        gpu.close()


@pytest.mark.parametrize("name", ["demo", "gqa4-hv3-l6"])
def test_several_images_in_one_message_match_the_reference(models, name):
    loaded, mmproj = models[name]
    rng = np.random.default_rng(8)
    gpu = CudaBackend(loaded, context=256, chunk=CHUNK, mmproj=mmproj)
    try:
        images = [encoded(gpu, mmproj, random_image(rng, h, w)) for h, w in ((64, 192), (128, 128), (32, 32))]
        prompt = image_prompt(rng, loaded.config.vocab_size, images)
        compare(loaded, prompt, [], gpu, f"{name} three images")
    finally:
        gpu.close()


def test_positions_are_used_and_text_after_an_image_continues_exactly(models):
    """Bit-exact on the card: (1) text run with explicit (p, p, p) positions equals text positions; (2) a
    follow-up prefilled after the image (positions from the slot's rope shift) equals the same tokens
    prefilled as part of the multimodal prompt (positions from the prompt builder, spec §9.6), with the
    same chunk boundaries; (3) giving the image rows text positions changes the logits."""
    loaded, mmproj = models["demo"]
    rng = np.random.default_rng(10)
    vocab = loaded.config.vocab_size
    gpu = CudaBackend(loaded, context=256, chunk=CHUNK, mmproj=mmproj)

    def logits_after(*parts) -> np.ndarray:
        gpu.reset_slot(0)
        for part in parts:
            if isinstance(part, list):
                gpu.prefill_slot(0, part)
            else:
                gpu.prefill_embedded(0, part)
        return gpu.begin(0, LOGITS).logits

    try:
        text = rng.integers(0, vocab - 10, 40).tolist()  # no image pad among them
        as_segment = expand_image_pads(text, [], vocab - 5).segment(0, len(text))
        np.testing.assert_array_equal(logits_after(as_segment), logits_after(text))

        image = random_image(rng, 64, 160)  # 2×5 tokens
        embedded = EncodedImage(image.merged_grid, gpu.encode_image(image))
        pad = vocab - 5
        before = 2 * CHUNK - image.n_tokens - 5
        ids = rng.integers(0, vocab - 10, before).tolist() + [pad] + rng.integers(0, vocab - 10, 5).tolist()
        prompt = expand_image_pads(ids, [embedded], pad)
        assert len(prompt.token_ids) % CHUNK == 0  # the follow-up starts a chunk either way
        follow_up = rng.integers(0, vocab - 10, 21).tolist()
        whole = expand_image_pads(ids + follow_up, [embedded], pad)
        split = logits_after(prompt.segment(0, len(prompt.token_ids)), follow_up)
        np.testing.assert_array_equal(split, logits_after(whole.segment(0, len(whole.token_ids))))

        text_positions = np.repeat(np.arange(len(whole.token_ids))[:, None], 3, axis=1)
        wrong = dataclasses.replace(whole, positions=text_positions)
        assert rel_error(logits_after(wrong.segment(0, len(wrong.token_ids))), split) > 1e-3
    finally:
        gpu.close()


def test_two_logical_cards_equal_one_card_with_images(models):
    loaded, mmproj = models["demo"]
    rng = np.random.default_rng(9)
    single = CudaBackend(loaded, context=256, chunk=CHUNK, mmproj=mmproj)
    try:
        image = random_image(rng, 96, 160)
        embeddings = single.encode_image(image)
        prompt = image_prompt(rng, loaded.config.vocab_size, [EncodedImage(image.merged_grid, embeddings)])
        forced = [rng.integers(0, loaded.config.vocab_size, STEPS).tolist() for _ in range(2)]
        follow_up = rng.integers(0, loaded.config.vocab_size, 7).tolist()
        want = backend_turns(single, prompt, [follow_up], forced)
    finally:
        single.close()
    pipe = CudaBackend(loaded, [CardSpec(0, 2 << 30)] * 2, context=256, chunk=CHUNK, split=[4, 4], mmproj=mmproj)
    try:
        np.testing.assert_array_equal(pipe.encode_image(image), embeddings)
        got = backend_turns(pipe, prompt, [follow_up], forced)
    finally:
        pipe.close()
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_generate_cli_with_an_image_on_the_cuda_backend(tmp_path):
    """`rigllm generate --image` on CUDA: the mmproj beside the model is loaded onto the card and used there."""
    import subprocess
    import sys

    from PIL import Image

    cfg = tiny_config("gqa4-hv3-l6")
    model = write_random_model(tmp_path / "model.gguf", cfg, seed=4)
    vision = VisionConfig(n_embd=32, n_ff=48, n_layers=2, n_head=2, patch_size=16, merge_size=2, image_size=64,
                          eps=1e-6, projection_dim=cfg.d_model, image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5))
    write_random_mmproj(tmp_path / "mmproj-model.gguf", vision, seed=5)
    picture = tmp_path / "pic.png"
    Image.fromarray(np.random.default_rng(1).integers(0, 256, (96, 128, 3), dtype=np.uint8)).save(picture)
    result = subprocess.run(
        [sys.executable, "-m", "engine.cli", "generate", str(model), "--backend", "cuda", "--image", str(picture),
         "--prompt", "what is it?", "--max-tokens", "4", "--no-think"],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "1 image(s), 12 image tokens, vision tower mmproj-model.gguf (on cuda)" in result.stderr
    assert "on the cuda backend" in result.stderr
