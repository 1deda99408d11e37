"""An image attached in the app reaches the model: the chat engine encodes it with the model's vision
projector (a tiny random multimodal model here) and the answer's prompt counts its image tokens."""

from __future__ import annotations

import io

import pytest
from PIL import Image

from app.chat_engine import ChatEngine, ModelInfo
from app.chat_records import Attachment, Message
from app.settings import AppSettings
from conftest import Recorder
from engine.backends import open_backend
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.worker import GenerationWorker


@pytest.fixture(scope="module")
def tiny_vlm_model(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.gguf.convert import convert
    from engine.vision.convert_mmproj import convert_mmproj
    from engine.fixtures.tiny_vision import make_tiny_vlm

    root = tmp_path_factory.mktemp("app-vlm")
    hf_dir = make_tiny_vlm(root / "hf", "gqa2-hv2", seed=0)
    text = convert(hf_dir, root / "model.gguf", "f32")
    convert_mmproj(hf_dir, root / "mmproj-model.gguf", "f32")  # found beside the model
    return load_model(text)


def png(size: tuple[int, int]) -> bytes:
    out = io.BytesIO()
    Image.new("RGB", size, (200, 30, 90)).save(out, "PNG")
    return out.getvalue()


def test_an_attached_image_is_encoded_and_counted(qtbot, tiny_vlm_model):
    service = ModelService.from_loaded(tiny_vlm_model)
    assert service.vision.encoder is not None, service.vision.unavailable
    worker = GenerationWorker(lambda: open_backend("reference", tiny_vlm_model), service.tokenizer)
    worker.start()
    engine = ChatEngine(tiny_vlm_model, service, worker, ModelInfo("tiny", "", "reference", 4096, "f16", (), vision=True))
    finished, failed = Recorder(engine.finished), Recorder(engine.failed)
    try:
        history = [Message("user", "what colour?", attachments=[Attachment("a.png", "image/png", png((64, 96)))])]
        engine.submit(history, AppSettings(max_tokens=3, thinking=False, temperature=0.0))
        qtbot.waitUntil(lambda: bool(finished.calls or failed.calls), timeout=60_000)
        assert not failed.calls, failed.calls
        done = finished.calls[0][1]
        assert done.image_tokens > 0 and done.prompt_tokens > done.image_tokens
    finally:
        engine.close()
