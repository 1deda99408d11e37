"""Multimodal prompts: pad expansion, M-RoPE positions, and the whole forward against transformers.

The end-to-end check renders a real chat (two images of different grids between text, through the
chat template), converts the tiny HF model with rigllm (text GGUF + mmproj), runs the numpy tower
and `ReferenceModel` with image rows and 3-D positions, and compares the logits of every position
with `Qwen3_5ForConditionalGeneration` given the same pixels. Tolerance: max relative error per row
(max |diff| / max |logit|) ≤ 1e-4 (fp32 both; measured ≈ 1e-5), and identical argmax everywhere.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_vision_fixtures import hf_pixel_values, hf_vlm, random_image, tiny_vlm  # noqa: F401 (fixtures)

from engine.errors import RigllmError
from engine.generation.chat_prompt import build_chat_prompt
from engine.generation.chat_template import ChatTemplate
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import load_model
from engine.reference.model import ReferenceModel
from engine.vision.encoder import ImageEncoder
from engine.vision.multimodal_prompt import IMAGE_PAD, EncodedImage, build_multimodal_prompt, expand_image_pads

TOLERANCE = 1e-4
PAD = 9


def fake_image(mh: int, mw: int, width: int = 4) -> EncodedImage:
    return EncodedImage((mh, mw), np.arange(mh * mw * width, dtype=np.float32).reshape(mh * mw, width))


def test_positions_and_rows_follow_the_spec():
    # text (0..1), image 2×3 at p=2, text continues at 2 + 3, image 3×1 at p=6, then text at 6 + 3
    p = expand_image_pads([1, 2, PAD, 3, PAD, 4], [fake_image(2, 3), fake_image(3, 1)], PAD)
    assert p.token_ids == [1, 2] + [PAD] * 6 + [3] + [PAD] * 3 + [4]
    assert p.embedding_rows.tolist() == [2, 3, 4, 5, 6, 7, 9, 10, 11]
    want = [[0, 0, 0], [1, 1, 1],
            [2, 2, 2], [2, 2, 3], [2, 2, 4], [2, 3, 2], [2, 3, 3], [2, 3, 4],
            [5, 5, 5],
            [6, 6, 6], [6, 7, 6], [6, 8, 6],
            [9, 9, 9]]
    assert p.positions.tolist() == want
    assert p.next_position == 10
    assert p.embeddings.shape == (9, 4)


def test_segments_split_image_rows():
    p = expand_image_pads([1, PAD, 2], [fake_image(2, 2)], PAD)
    first, second = p.segment(0, 3), p.segment(3, len(p.token_ids))
    assert first.embedding_rows.tolist() == [1, 2] and second.embedding_rows.tolist() == [0, 1]
    np.testing.assert_array_equal(np.concatenate([first.embeddings, second.embeddings]), p.embeddings)
    np.testing.assert_array_equal(np.concatenate([first.positions, second.positions]), p.positions)


def test_marker_count_must_match_images():
    with pytest.raises(RigllmError, match="2 image markers but 1 images"):
        expand_image_pads([PAD, 1, PAD], [fake_image(1, 1)], PAD)


def test_text_only_prompt_is_plain():
    p = expand_image_pads([5, 6, 7], [], PAD)
    assert p.positions.tolist() == [[0, 0, 0], [1, 1, 1], [2, 2, 2]] and p.embedding_rows.size == 0


@pytest.fixture(scope="module")
def setup(tiny_vlm):
    loaded = load_model(tiny_vlm.text_gguf)
    tokenizer = Tokenizer.from_model_file(loaded.file)
    encoder = ImageEncoder.open(tiny_vlm.mmproj, loaded.config.d_model, loaded.path.name)
    return loaded, tokenizer, encoder, ReferenceModel.from_model_file(loaded.file)


def chat_prompt(loaded, tokenizer, encoder, images):
    content = [{"type": "text", "text": "Compare"}, {"type": "image_url", "image_url": {"url": "data:,"}},
               {"type": "text", "text": "with"}, {"type": "image"}, {"type": "text", "text": "please."}]
    text = build_chat_prompt(ChatTemplate.for_model(loaded.file.fields), tokenizer,
                             [{"role": "user", "content": content}]).text
    prepared = [encoder.prepare(im) for im in images]
    return build_multimodal_prompt(tokenizer, text, [encoder.encode(p) for p in prepared]), prepared


def test_whole_multimodal_forward_equals_transformers(setup, hf_vlm):
    import torch

    loaded, tokenizer, encoder, model = setup
    prompt, prepared = chat_prompt(loaded, tokenizer, encoder, [random_image(70, 130, 5), random_image(200, 90, 6)])
    got = model.logits(model.forward_hidden(prompt.token_ids, model.new_state(), prompt.positions,
                                            prompt.embeddings, prompt.embedding_rows))

    ids = torch.tensor([prompt.token_ids])
    mm_types = (ids == tokenizer.token_to_id(IMAGE_PAD)).int()
    grids = torch.tensor([[1, *p.grid] for p in prepared])
    pixels = torch.from_numpy(np.concatenate([hf_pixel_values(p.patches()) for p in prepared]))
    with torch.no_grad():
        want = hf_vlm(input_ids=ids, pixel_values=pixels, image_grid_thw=grids, mm_token_type_ids=mm_types,
                      use_cache=False).logits[0].numpy()
        hf_positions, _ = hf_vlm.model.get_rope_index(ids, mm_types, grids)
    np.testing.assert_array_equal(prompt.positions, hf_positions[:, 0].numpy().T)
    rel = np.max(np.abs(got - want), axis=-1) / np.max(np.abs(want), axis=-1)
    assert rel.max() <= TOLERANCE
    np.testing.assert_array_equal(got.argmax(-1), want.argmax(-1))


def test_chunked_prefill_cutting_through_an_image_equals_one_call(setup):
    loaded, tokenizer, encoder, model = setup
    prompt, _ = chat_prompt(loaded, tokenizer, encoder, [random_image(64, 64, 7), random_image(40, 300, 8)])
    whole_state = model.new_state()
    whole = model.forward_hidden(prompt.token_ids, whole_state, prompt.positions, prompt.embeddings,
                                 prompt.embedding_rows)
    cut = int(prompt.embedding_rows[3])  # inside the first image
    state = model.new_state()
    parts = []
    for start, stop in ((0, cut), (cut, len(prompt.token_ids))):
        s = prompt.segment(start, stop)
        parts.append(model.forward_hidden(s.token_ids, state, s.positions, s.embeddings, s.embedding_rows))
    np.testing.assert_allclose(np.concatenate(parts), whole, rtol=0, atol=1e-4)
    assert state.next_position == whole_state.next_position == prompt.next_position


def test_embeddings_need_their_rows(setup):
    *_, model = setup
    with pytest.raises(ValueError, match="go together"):
        model.forward_hidden([1, 2], model.new_state(), embeddings=np.zeros((1, model.cfg.d_model), np.float32))
    with pytest.raises(ValueError, match="shape"):
        model.forward_hidden([1, 2], model.new_state(), embeddings=np.zeros((1, 3), np.float32), embedding_rows=[0])
