"""Slots through the API: the next turn of a chat prefills only what follows the kept turn boundary (and
answers what a cold server answers); clients that leave free their slots."""

import time

import httpx
import pytest

from engine.generation.chat_prompt import build_chat_prompt
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.generation.serving.model_service import ModelService
from api_fixtures import ScriptedBackend, live_server, model_backend

OFF = {"chat_template_kwargs": {"enable_thinking": False}}


@pytest.fixture(scope="module")
def loaded():
    return load_model(ensure_demo_model())


def chat(server, messages, max_tokens=8):
    r = server.client().chat.completions.create(model=server.model_id, messages=messages, max_tokens=max_tokens,
                                                temperature=0, extra_body=OFF)
    return r.choices[0].message.content, r.usage


def test_follow_up_turn_prefills_only_its_new_tokens(loaded):
    first = [{"role": "user", "content": "Tell me about the mining rig in the garage."}]
    with live_server(loaded, model_backend(loaded)) as server:
        answer, usage1 = chat(server, first)
        second = first + [{"role": "assistant", "content": answer}, {"role": "user", "content": "And the fans?"}]
        answer2, usage2 = chat(server, second)
        service = server.service
        prompt1 = build_chat_prompt(service.template, service.tokenizer, first, enable_thinking=False).token_ids
        prompt2 = build_chat_prompt(service.template, service.tokenizer, second, enable_thinking=False).token_ids
    boundary = service.turn_start(prompt1)
    assert usage1.prompt_tokens_details.cached_tokens == 0
    assert 0 < boundary and prompt2[:boundary] == prompt1[:boundary]
    assert usage2.prompt_tokens == len(prompt2)
    assert usage2.prompt_tokens_details.cached_tokens == boundary, "the kept turn boundary was not reused"
    with live_server(loaded, model_backend(loaded)) as cold:
        cold_answer, cold_usage = chat(cold, second)
    assert cold_usage.prompt_tokens_details.cached_tokens == 0
    assert answer2 == cold_answer


def test_disconnected_streams_free_their_slots(loaded):
    tokenizer = ModelService.from_loaded(loaded).tokenizer
    endless = tokenizer.encode("la la la")  # the last token repeats: never an end token
    backend = lambda: ScriptedBackend(loaded.config, tokenizer.vocab_size, lambda _: endless, 0.005)  # noqa: E731
    with live_server(loaded, backend, slots=4) as server:
        root = server.base_url.removesuffix("/v1")
        client = server.client()
        streams = [client.chat.completions.create(model=server.model_id, max_tokens=500, stream=True, extra_body=OFF,
                                                  messages=[{"role": "user", "content": f"Story {i}"}])
                   for i in range(3)]
        for s in streams:
            next(iter(s))
        health = httpx.get(f"{root}/health").json()
        assert health["active"] == 3 and health["slots"] >= 3
        for s in streams:
            s.close()
        deadline = time.monotonic() + 10
        while httpx.get(f"{root}/health").json()["active"]:
            assert time.monotonic() < deadline, "slots stayed busy for clients that left"
            time.sleep(0.05)
