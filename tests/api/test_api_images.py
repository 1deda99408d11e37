"""Images through the API: `image_url` data URLs on a tiny random multimodal model, served on the reference backend.

What the server answers is compared with running engine.vision and the reference model directly (the
path `rigllm generate --image` uses): the same tokens and the same logprobs (to 1e-4), so image rows,
M-RoPE positions and decoding at "largest position + 1" must all be right; the server prefills in
7-token chunks, so images are cut across chunks. Bad images, a model without an mmproj and a backend
without the image path are 400s.
"""

from __future__ import annotations

import base64
import io
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import openai
import pytest
from PIL import Image

from api_fixtures import ScriptedBackend, live_server
from engine.backends import open_backend
from engine.generation.chat_prompt import build_chat_prompt
from engine.generation.chat_template import ChatTemplate
from engine.generation.tokenizer import Tokenizer
from engine.gguf.loader import LoadedModel, load_model
from engine.reference.model import ReferenceModel
from engine.vision.chat_images import collect_images
from engine.vision.encoder import ImageEncoder
from engine.vision.multimodal_prompt import build_multimodal_prompt
from engine.vision.prompt_backend import ImagePromptBackend

MAX_TOKENS = 6
NO_THINK = {"chat_template_kwargs": {"enable_thinking": False}}
PREFILL_CHUNK = 7  # small, so the prefill cuts through images


@dataclass(frozen=True)
class TinyVlm:
    text_gguf: Path
    mmproj: Path


@pytest.fixture(scope="module")
def tiny_vlm(tmp_path_factory: pytest.TempPathFactory) -> TinyVlm:
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.gguf.convert import convert
    from engine.vision.convert_mmproj import convert_mmproj
    from engine.fixtures.tiny_vision import make_tiny_vlm

    root = tmp_path_factory.mktemp("api-vlm")
    hf_dir = make_tiny_vlm(root / "hf", "gqa2-hv2", seed=0)
    text = convert(hf_dir, root / "model.gguf", "f32")
    return TinyVlm(text, convert_mmproj(hf_dir, root / "mmproj-model.gguf", "f32"))


@pytest.fixture(scope="module")
def loaded(tiny_vlm: TinyVlm) -> LoadedModel:
    return load_model(tiny_vlm.text_gguf)


def chunked_reference(loaded: LoadedModel):
    backend = open_backend("reference", loaded)
    backend.prefill_chunk = PREFILL_CHUNK  # HostSlots takes a backend's own prefill chunk
    return backend


@pytest.fixture(scope="module")
def server(loaded):
    with live_server(loaded, lambda: chunked_reference(loaded)) as live:
        yield live


def data_url(height: int, width: int, seed: int) -> str:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def image_part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


ONE = [{"role": "user", "content": [{"type": "text", "text": "What is this?"}, image_part(data_url(70, 130, 1))]}]
TWO = [{"role": "user", "content": [image_part(data_url(200, 90, 2)), {"type": "text", "text": "versus"},
                                    {"type": "image_url", "image_url": data_url(64, 64, 3)}]}]  # bare-string form too


@dataclass(frozen=True)
class Expected:
    token_bytes: list[bytes]
    logprobs: list[float]
    prompt_tokens: int
    image_tokens: int


def direct(loaded: LoadedModel, mmproj: Path, messages: list[dict]) -> Expected:
    """Greedy decoding of `messages` with engine.vision and the reference model, no server involved."""
    tokenizer = Tokenizer.from_model_file(loaded.file)
    text = build_chat_prompt(ChatTemplate.for_model(loaded.file.fields), tokenizer, messages,
                             enable_thinking=False).text
    encoder = ImageEncoder.open(mmproj, loaded.config.d_model, loaded.path.name)
    prompt = build_multimodal_prompt(tokenizer, text, [encoder.encode(im) for im in collect_images(messages)])
    backend = ImagePromptBackend(ReferenceModel.from_model_file(loaded.file), prompt)
    sequence = backend.new_sequence()
    logits = backend.forward_last(prompt.token_ids, sequence)
    tokens, logprobs = [], []
    for _ in range(MAX_TOKENS):
        token = int(np.argmax(logits))
        if token in tokenizer.eos_ids:
            break
        shifted = logits.astype(np.float64) - logits.max()
        tokens.append(tokenizer.token_bytes(token))
        logprobs.append(float(shifted[token] - np.log(np.exp(shifted).sum())))
        logits = backend.forward_last([token], sequence)
    return Expected(tokens, logprobs, len(prompt.token_ids), len(prompt.embedding_rows))


def ask(server, messages: list[dict], stream: bool):
    """(token bytes, logprobs, usage) of a greedy reply with logprobs."""
    args = dict(model=server.model_id, messages=messages, max_tokens=MAX_TOKENS, temperature=0, logprobs=True,
                extra_body=NO_THINK)
    client = server.client()
    if stream:
        chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **args))
        entries = [e for c in chunks if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
        usage = chunks[-1].usage
    else:
        r = client.chat.completions.create(**args)
        entries, usage = r.choices[0].logprobs.content, r.usage
    return [bytes(e.bytes) for e in entries], [e.logprob for e in entries], usage


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
@pytest.mark.parametrize("messages", [ONE, TWO], ids=["one-image", "two-images"])
def test_images_give_the_reference_tokens(server, loaded, tiny_vlm, messages, stream):
    want = direct(loaded, tiny_vlm.mmproj, messages)
    tokens, logprobs, usage = ask(server, messages, stream)
    assert tokens == want.token_bytes
    np.testing.assert_allclose(logprobs, want.logprobs, rtol=0, atol=1e-4)
    assert usage.prompt_tokens == want.prompt_tokens  # every image's tokens counted
    assert usage.prompt_tokens_details.image_tokens == want.image_tokens > 0
    assert usage.completion_tokens == len(want.token_bytes)


def test_an_image_request_leaves_no_state_for_another_image(server, loaded, tiny_vlm):
    """Same text, another image of the same size (so the same token ids): nothing may be reused."""
    first = [{"role": "user", "content": [image_part(data_url(96, 96, 10)), {"type": "text", "text": "and?"}]}]
    second = [{"role": "user", "content": [image_part(data_url(96, 96, 11)), {"type": "text", "text": "and?"}]}]
    ask(server, first, stream=False)
    tokens, logprobs, usage = ask(server, second, stream=False)
    want = direct(loaded, tiny_vlm.mmproj, second)
    assert usage.prompt_tokens_details.cached_tokens == 0
    assert tokens == want.token_bytes
    np.testing.assert_allclose(logprobs, want.logprobs, rtol=0, atol=1e-4)


def bad_request(server, content, role: str = "user") -> str:
    with pytest.raises(openai.BadRequestError) as info:
        server.client().chat.completions.create(model=server.model_id, max_tokens=1,
                                                messages=[{"role": role, "content": content}])
    return info.value.body["message"]


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "https URLs are not fetched"),
    ("data:image/png;base64,@@@", "base64 data is invalid"),
    ("data:image/png;base64," + base64.b64encode(b"not a picture").decode(), "not a recognised image file"),
    ("data:text/plain;base64,aGk=", "not an image"),
], ids=["http", "bad-base64", "not-an-image", "wrong-type"])
def test_bad_images_are_400(server, url, message):
    assert message in bad_request(server, [image_part(url)])


def test_other_bad_image_requests_are_400(server):
    audio = {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}
    assert "not supported" in bad_request(server, [audio])
    assert "needs its image_url" in bad_request(server, [{"type": "image_url"}])
    assert "System message cannot contain images" in bad_request(server, [image_part(data_url(32, 32, 4))], "system")


def test_model_without_mmproj_refuses_images(tiny_vlm, tmp_path):
    lonely = tmp_path / "model.gguf"
    shutil.copy(tiny_vlm.text_gguf, lonely)
    alone = load_model(lonely)
    with live_server(alone, lambda: open_backend("reference", alone)) as live:
        assert "no mmproj" in bad_request(live, [image_part(data_url(32, 32, 5))])
        assert "no mmproj" in bad_request(live, [image_part("data:image/png;base64,AA==")])  # said before judging it
        r = live.client().chat.completions.create(model=live.model_id, max_tokens=1,
                                                  messages=[{"role": "user", "content": "text still works"}])
        assert r.usage.completion_tokens == 1


def test_backend_without_the_image_path_refuses_images_before_queueing(loaded):
    """A slot backend without `prefill_embedded` (CUDA opened without an mmproj; a scripted one here): a clear 400,
    and an image too large for the context is refused with the numbers before the tower runs."""
    tokenizer = Tokenizer.from_model_file(loaded.file)
    eos = min(tokenizer.eos_ids)
    scripted = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, lambda _ids: [eos])  # noqa: E731
    with live_server(loaded, scripted, context_length=48) as live:
        assert "opened without the model's vision tower" in bad_request(live, [image_part(data_url(32, 32, 6))])
        too_big = bad_request(live, [image_part(data_url(256, 256, 7))])
        assert "with its 1 image(s) is" in too_big and "the context holds 48" in too_big


def test_images_the_backend_cannot_run_cost_no_tower_time(loaded, monkeypatch):
    """With the worker's `supports_images` passed in, the refusal comes before the vision tower runs."""
    from engine.generation.serving.request_error import APIError
    from engine.generation.serving.model_service import ModelService
    from engine.server.wire import ChatCompletionRequest
    from engine.server.request_jobs import chat_job

    service = ModelService.from_loaded(loaded)
    encoded = []
    monkeypatch.setattr(service.vision.encoder, "encode", encoded.append)
    request = ChatCompletionRequest(messages=ONE)
    with pytest.raises(APIError, match="opened without the model's vision tower") as info:
        chat_job(service, request, lambda _event: None, backend_takes_images=False)
    assert info.value.status == 400 and encoded == []


def bomb_data_url(side: int = 13000) -> str:
    """A PNG whose header says side x side RGB (~0.5 GB decoded) in ~0.5 MB: zero rows, compressed as
    they are made, so the test itself never holds the pixels."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    packer = zlib.compressobj(9)
    row = b"\0" * (1 + 3 * side)
    idat = b"".join(packer.compress(row) for _ in range(side)) + packer.flush()
    png = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0))
           + chunk(b"IDAT", idat) + chunk(b"IEND", b""))
    return "data:image/png;base64," + base64.b64encode(png).decode()


def peak_rss_growth(action) -> int:
    """Bytes the process's peak resident memory rose by while `action()` ran (the server runs in-process)."""
    def status(field: str) -> int:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
        raise AssertionError(field)

    Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
    before = status("VmHWM")
    action()
    return status("VmHWM") - before


MEMORY_BOUND = 100 << 20  # one decoded bomb alone would be ~507 MB
REFUSED_WITHIN = 2.0


def test_an_image_bomb_is_refused_from_its_header_and_costs_no_memory(server):
    import time

    bomb = image_part(bomb_data_url())
    answers = []

    def send():
        started = time.monotonic()
        answers.append(bad_request(server, [bomb] * 4))
        answers.append(time.monotonic() - started)

    growth = peak_rss_growth(send)
    assert "megapixels" in answers[0] and answers[1] < REFUSED_WITHIN
    assert growth < MEMORY_BOUND, f"peak memory grew by {growth >> 20} MiB"
    assert "at most 8 per request" in bad_request(server, [image_part(data_url(8, 8, 9))] * 9)


def test_a_model_without_vision_refuses_a_bomb_from_the_message_structure(tiny_vlm, tmp_path):
    lonely = tmp_path / "model.gguf"
    shutil.copy(tiny_vlm.text_gguf, lonely)
    alone = load_model(lonely)
    bomb = image_part(bomb_data_url())
    with live_server(alone, lambda: open_backend("reference", alone)) as live:
        answers = []
        growth = peak_rss_growth(lambda: answers.append(bad_request(live, [bomb] * 4)))
        assert "no mmproj" in answers[0] and growth < MEMORY_BOUND
