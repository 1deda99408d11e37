"""Saved conversation states through the API: a new worker on the same folder (a restart) restores
the chat's turn-boundary state instead of prefilling it, reported as cached prompt tokens.
RIGLLM_TEST_BACKEND=cuda runs the same tests on the GPU."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import openai
import pytest
from fastapi.testclient import TestClient

from engine.generation.snapshot_store import SUFFIX, SnapshotSettings
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import LoadedModel, load_model
from engine.server.app import FixedModel, create_app
from engine.generation.serving.model_service import ModelService
from engine.generation.serving.worker import GenerationWorker
from api_fixtures import model_backend

CHAT = [{"role": "user", "content": "Tell me about the rig in the garage and its cards. " * 6}]


@pytest.fixture(scope="module")
def loaded() -> LoadedModel:
    return load_model(ensure_demo_model())


@contextmanager
def serving(loaded: LoadedModel, root: Path, template_suffix: str = "") -> Iterator[openai.OpenAI]:
    """One 'process lifetime': a worker with the disk tier under `root`, the API on it; stopping the
    worker finishes the queued saves. `template_suffix` stands for an edited chat template."""
    service = ModelService.from_loaded(loaded)
    settings = SnapshotSettings.for_model(loaded.file, service.template.source + template_suffix, root=root)
    worker = GenerationWorker(model_backend(loaded), service.tokenizer, snapshots=settings)
    worker.start()
    try:
        with TestClient(create_app(FixedModel(service, worker)), base_url="http://localhost") as http:
            yield openai.OpenAI(base_url="http://localhost/v1", api_key="noop", http_client=http, max_retries=0)
    finally:
        worker.stop()


def _ask(client: openai.OpenAI, messages: list[dict]) -> openai.types.chat.ChatCompletion:
    return client.chat.completions.create(model=ensure_demo_model().stem, messages=messages, max_tokens=4, temperature=0)


def test_a_restart_restores_the_saved_turn_state(loaded, tmp_path):
    with serving(loaded, tmp_path) as client:
        first = _ask(client, CHAT)
        assert first.usage.prompt_tokens_details.cached_tokens == 0
    assert list(tmp_path.glob(f"*/*{SUFFIX}"))  # saved before the worker ended

    with serving(loaded, tmp_path) as client:  # a new worker, RAM cache empty
        again = _ask(client, CHAT)
        follow_up = _ask(client, CHAT + [{"role": "assistant", "content": first.choices[0].message.content or "ok"},
                                          {"role": "user", "content": "And the power supply?"}])
    cached = again.usage.prompt_tokens_details.cached_tokens
    assert 0 < cached < again.usage.prompt_tokens
    assert again.choices[0].message.content == first.choices[0].message.content  # greedy: the same answer
    assert follow_up.usage.prompt_tokens_details.cached_tokens >= cached


def test_another_template_does_not_restore(loaded, tmp_path):
    with serving(loaded, tmp_path) as client:
        _ask(client, CHAT)
    with serving(loaded, tmp_path, template_suffix="\n") as client:
        assert _ask(client, CHAT).usage.prompt_tokens_details.cached_tokens == 0
    assert len(list(tmp_path.glob(f"*/*{SUFFIX}"))) == 1  # the old file went; the new one was saved


def test_a_corrupt_or_truncated_snapshot_is_discarded_with_a_warning(loaded, tmp_path, caplog):
    """Finding 8: a file whose header is intact but whose payload is not was restored silently, and the
    answers built on it differed from a fresh server's. Its checksum now fails: the state is dropped
    with a WARNING and prefilled afresh, giving the fresh server's answer."""
    with serving(loaded, tmp_path) as client:
        first = _ask(client, CHAT)
    (saved,) = tmp_path.glob(f"*/*{SUFFIX}")
    data = bytearray(saved.read_bytes())
    for i in range(len(data) - 64, len(data)):  # the end of the last array: payload, not header
        data[i] ^= 0x5A
    saved.write_bytes(bytes(data))
    with caplog.at_level("WARNING", logger="engine.generation.snapshot_store"):
        with serving(loaded, tmp_path) as client:
            again = _ask(client, CHAT)
    assert again.usage.prompt_tokens_details.cached_tokens == 0
    assert again.choices[0].message.content == first.choices[0].message.content
    assert any(r.levelname == "WARNING" and "checksum" in r.getMessage() for r in caplog.records)

    (saved,) = tmp_path.glob(f"*/*{SUFFIX}")  # the fresh prefill saved a good one again; now cut it short
    saved.write_bytes(saved.read_bytes()[:-10])
    caplog.clear()
    with caplog.at_level("WARNING", logger="engine.generation.snapshot_store"):
        with serving(loaded, tmp_path) as client:
            assert _ask(client, CHAT).usage.prompt_tokens_details.cached_tokens == 0
    assert any(r.levelname == "WARNING" and "truncated" in r.getMessage() for r in caplog.records)
