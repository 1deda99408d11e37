"""Generation with images: greedy decoding after a multimodal prefill matches transformers, and `rigllm generate --image`."""

from __future__ import annotations

import argparse
import shutil

import numpy as np
import pytest
from test_vision_fixtures import hf_pixel_values, hf_vlm, random_image, tiny_vlm  # noqa: F401 (fixtures)

from engine.commands import generate as generate_cmd
from engine.cuda.driver import gpu_unavailable_reason
from engine.errors import RigllmError
from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.token_stream import TokenStream
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import load_model
from engine.reference.model import ReferenceModel
from engine.vision.encoder import ImageEncoder
from engine.vision.multimodal_prompt import IMAGE_PAD, IMAGE_MARKER, build_multimodal_prompt
from engine.vision.prompt_backend import ImagePromptBackend

N_NEW = 6


def test_greedy_decoding_after_an_image_equals_transformers_generate(tiny_vlm, hf_vlm):
    """Decode positions continue at "largest position + 1" (spec §9.6), as transformers' rope deltas do.

    Greedy tokens must be equal, and so must the logits of every decode step within 1e-4 relative:
    the tokens alone would not notice positions counted from the token count (measured: those shift
    the tiny model's logits by ~3%, but not its argmax).
    """
    import torch

    loaded = load_model(tiny_vlm.text_gguf)
    tokenizer = Tokenizer.from_model_file(loaded.file)
    encoder = ImageEncoder.open(tiny_vlm.mmproj, loaded.config.d_model, loaded.path.name)
    prepared = encoder.prepare(random_image(120, 40, 11))  # a tall grid: 5×2 tokens, so max(mh, mw) ≠ mh·mw
    text = f"<|im_start|>user\n{IMAGE_MARKER}describe<|im_end|>\n<|im_start|>assistant\n"
    prompt = build_multimodal_prompt(tokenizer, text, [encoder.encode(prepared)])
    backend = ImagePromptBackend(ReferenceModel.from_model_file(loaded.file), prompt)
    ours = list(TokenStream(backend, prompt.token_ids, Sampler(SamplingParams(temperature=0.0)), N_NEW, stop_ids=()))

    ids = torch.tensor([prompt.token_ids])
    with torch.no_grad():
        out = hf_vlm.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids),
            pixel_values=torch.from_numpy(hf_pixel_values(prepared.patches())),
            image_grid_thw=torch.tensor([[1, *prepared.grid]]),
            mm_token_type_ids=(ids == tokenizer.token_to_id(IMAGE_PAD)).int(),
            max_new_tokens=N_NEW, min_new_tokens=N_NEW, do_sample=False,
            return_dict_in_generate=True, output_logits=True)
    assert ours == out.sequences[0, ids.shape[1]:].tolist()

    sequence = backend.new_sequence()
    steps = [backend.forward_last(prompt.token_ids, sequence)]
    steps += [backend.forward_last([t], sequence) for t in ours[:-1]]
    for got, want in zip(steps, (step[0].numpy() for step in out.logits)):
        assert np.max(np.abs(got - want)) <= 1e-4 * np.max(np.abs(want))


def test_first_call_must_be_the_prompt(tiny_vlm):
    loaded = load_model(tiny_vlm.text_gguf)
    model = ReferenceModel.from_model_file(loaded.file)
    prompt = build_multimodal_prompt(Tokenizer.from_model_file(loaded.file), "hi", [])
    backend = ImagePromptBackend(model, prompt)
    with pytest.raises(ValueError, match="exactly the multimodal prompt"):
        backend.forward_last([1, 2, 3], backend.new_sequence())


def run(*argv: str) -> int:
    parser = argparse.ArgumentParser(prog="rigllm")
    generate_cmd.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(["generate", *argv])
    return args.func(args)


@pytest.fixture()
def picture(tmp_path):
    path = tmp_path / "pic.png"
    random_image(90, 120, 3).save(path)
    return path


def test_generate_with_images(tiny_vlm, picture, capsys):
    assert run(str(tiny_vlm.text_gguf), "--prompt", "what is it?", "--image", str(picture), "--image", str(picture),
               "--max-tokens", "3", "--backend", "reference", "--no-think") == 0
    err = capsys.readouterr().err
    assert "2 image(s), 24 image tokens, vision tower mmproj-model.gguf" in err  # 96×128 px → 3×4 tokens each
    assert "3 tokens (length)" in err


def test_generate_image_errors(tiny_vlm, picture, tmp_path):
    model = str(tiny_vlm.text_gguf)
    with pytest.raises(RigllmError, match="drop --raw"):
        run(model, "--prompt", "x", "--raw", "--image", str(picture))
    if gpu_unavailable_reason():  # images are no reason to refuse CUDA any more; a machine without a GPU is
        with pytest.raises(RigllmError, match="CUDA backend cannot run here"):
            run(model, "--prompt", "x", "--backend", "cuda", "--image", str(picture))
    lonely = tmp_path / "alone" / "model.gguf"
    lonely.parent.mkdir()
    shutil.copy(tiny_vlm.text_gguf, lonely)
    with pytest.raises(RigllmError, match="no mmproj"):
        run(str(lonely), "--prompt", "x", "--image", str(picture), "--backend", "reference")
    assert run(str(lonely), "--prompt", "x", "--image", str(picture), "--mmproj", str(tiny_vlm.mmproj),
               "--max-tokens", "1", "--backend", "reference") == 0
    broken = tmp_path / "broken.jpg"
    broken.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    with pytest.raises(RigllmError, match="broken.jpg"):
        run(model, "--prompt", "x", "--image", str(broken), "--backend", "reference")


def test_generate_without_images_is_unchanged(tiny_vlm, capsys):
    assert run(str(tiny_vlm.text_gguf), "--prompt", "hello", "--max-tokens", "2", "--backend", "reference") == 0
    assert "image" not in capsys.readouterr().err
