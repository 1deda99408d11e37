"""Images for a backend that holds its own vision tower (CUDA with an mmproj): the request thread's encoding
runs on the generation worker's thread (the card's owner), between scheduler turns, even while the
worker waits idle for jobs; the service switches to that route once the backend is open."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from test_vision_fixtures import random_image, tiny_vlm  # noqa: F401 (fixture)

from engine.errors import RigllmError
from engine.backends import open_backend
from engine.reference.backend import ReferenceBackend
from engine.generation.slots import HostSlots
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.multimodal_chat import Vision, vision_for_backend
from engine.generation.serving.owner_tasks import OwnerTasks
from engine.generation.serving.worker import GenerationWorker
from engine.vision.encoder import ImageEncoder
from engine.vision.preprocess import PreparedImage
from engine.vision.tower import VisionTower

WORKER_THREAD = "rigllm-generation"


class TowerSlots(HostSlots):
    """The reference slots plus a tower of their own, as the CUDA backend has: records where it runs."""

    def __init__(self, backend: ReferenceBackend, tower: VisionTower):
        super().__init__(backend, slot_count=2, speculative=False)
        self.tower = tower
        self.encoded_on: list[str] = []

    def encode_image(self, image: PreparedImage) -> np.ndarray:
        self.encoded_on.append(threading.current_thread().name)
        return self.tower.encode(image)


def test_owner_tasks_run_in_order_and_fail_once_closed():
    tasks = OwnerTasks()
    done: list[int] = []
    first, second = tasks.submit(lambda: done.append(1) or 1), tasks.submit(lambda: 1 / 0)
    tasks.run_pending()
    assert first.result() == 1 and done == [1]
    with pytest.raises(ZeroDivisionError):
        second.result()
    waiting = tasks.submit(lambda: 2)
    tasks.close()
    with pytest.raises(RigllmError, match="unloaded"):
        waiting.result()
    with pytest.raises(RigllmError, match="unloaded"):
        tasks.submit(lambda: 3)


def test_call_on_owner_wakes_an_idle_worker_and_runs_on_its_thread(tiny_vlm):
    loaded = load_model(tiny_vlm.text_gguf)
    service = ModelService.from_loaded(loaded)
    worker = GenerationWorker(lambda: open_backend("reference", loaded), service.tokenizer, slots=1)
    worker.start()
    try:
        assert worker.call_on_owner(lambda: threading.current_thread().name) == WORKER_THREAD
        assert not worker.encodes_images  # the reference slots have no tower of their own
        with pytest.raises(RigllmError, match="vision tower"):
            worker.encode_image(PreparedImage(np.zeros((3, 32, 32), np.float32), 16, 2))
    finally:
        worker.stop()
    with pytest.raises(RigllmError, match="unloaded"):
        worker.call_on_owner(lambda: None)


def test_a_backend_with_its_own_tower_encodes_the_requests_images(tiny_vlm):
    loaded = load_model(tiny_vlm.text_gguf)
    service = ModelService.from_loaded(loaded)
    assert service.vision.encoder is not None
    numpy_tower = VisionTower.from_mmproj(service.vision.encoder.mmproj)
    slots: list[TowerSlots] = []

    def open_slots():
        slots.append(TowerSlots(ReferenceBackend(loaded), numpy_tower))
        return slots[-1]

    worker = GenerationWorker(open_slots, service.tokenizer)
    worker.start()
    try:
        assert worker.encodes_images
        service.vision = vision_for_backend(service.vision, worker)
        picture = random_image(70, 100, 4)
        messages = [{"role": "user", "content": [{"type": "image", "image": picture}, {"type": "text", "text": "?"}]}]
        prepared = service.prepare_chat(messages, enable_thinking=False, backend_takes_images=worker.supports_images)
    finally:
        worker.stop()
    assert slots[0].encoded_on == [WORKER_THREAD]
    encoder = ImageEncoder(service.vision.encoder.mmproj, tower=numpy_tower)
    np.testing.assert_array_equal(prepared.multimodal.embeddings, encoder.encode(picture).embeddings)


def test_vision_for_a_backend_without_a_tower_is_unchanged(tiny_vlm):
    class NoTower:
        encodes_images = False

        def encode_image(self, image):
            raise AssertionError("not called")

    loaded = load_model(tiny_vlm.text_gguf)
    vision = ModelService.from_loaded(loaded).vision
    assert vision_for_backend(vision, NoTower()) is vision
    refused = Vision(None, "no images here")
    assert vision_for_backend(refused, NoTower()) is refused


def test_the_numpy_tower_loads_only_when_an_image_is_encoded(tiny_vlm):
    encoder = ImageEncoder.open(tiny_vlm.mmproj, load_model(tiny_vlm.text_gguf).config.d_model, "model")
    assert encoder._tower is None  # a GPU-served model never pays for the fp32 host copy
    encoder.encode(random_image(40, 40, 5))
    assert isinstance(encoder.tower, VisionTower)
