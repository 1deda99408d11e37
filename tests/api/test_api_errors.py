"""Bad input gets OpenAI-shaped 4xx errors (never a 500), auth on and off, and `serve`'s bind guard."""

import httpx
import openai
import pytest

from engine.cli import main
from api_fixtures import live_server, model_backend

HELLO = [{"role": "user", "content": "Hello"}]
KEY = "sk-test-key"


@pytest.fixture(scope="module")
def keyed_server(loaded):
    with live_server(loaded, model_backend(loaded), api_key=KEY) as live:
        yield live


def refused(client, status, **kwargs):
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(**kwargs)
    assert info.value.status_code == status
    error = info.value.body
    assert set(error) >= {"message", "type", "param", "code"}, error
    return error


def test_n_above_eight_is_400(server):
    error = refused(server.client(), 400, model=server.model_id, messages=HELLO, n=9)
    assert error["param"] == "n"


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("presence_penalty", 3.0)])
def test_out_of_range_sampling_is_400(server, field, value):
    error = refused(server.client(), 400, model=server.model_id, messages=HELLO, **{field: value})
    assert error["param"] == field and field in error["message"]


def test_overlong_prompt_is_400_with_the_numbers(server):
    context = server.service.context_length
    error = refused(server.client(), 400, model=server.model_id, messages=[{"role": "user", "content": "a b " * context}])
    assert error["code"] == "context_length_exceeded" and f"context holds {context}" in error["message"]
    with pytest.raises(openai.BadRequestError):
        server.client().completions.create(model=server.model_id, prompt="a b " * context)


def test_unknown_model_is_404(server):
    refused(server.client(), 404, model="gpt-4o", messages=HELLO)
    with pytest.raises(openai.NotFoundError):
        server.client().models.retrieve("gpt-4o")


def test_unsupported_features_are_clear_400s(server):
    client = server.client()
    error = refused(client, 400, model=server.model_id, messages=HELLO, response_format={"type": "json_schema", "json_schema": {"name": "x"}})
    assert "needs json_schema.schema" in error["message"]
    image = [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AA=="}}]}]
    assert "takes no images" in refused(client, 400, model=server.model_id, messages=image)["message"]


@pytest.mark.parametrize("body", [
    b"{not json", b"[]", b'{"messages": "hi"}', b'{"messages": []}', b'{"messages": [{"role": "robot", "content": "x"}]}',
    b'{"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}',
    b'{"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}',
    b'{"messages": [{"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": "{oops"}}]}]}',
])
def test_malformed_bodies_are_400_not_500(server, body):
    r = httpx.post(f"{server.base_url}/chat/completions", content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["type"] == "invalid_request_error"


def test_text_parts_are_joined(server):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]
    r = server.client().chat.completions.create(model=server.model_id, messages=parts, max_tokens=2, temperature=0)
    assert r.usage.prompt_tokens == server.client().chat.completions.create(
        model=server.model_id, messages=HELLO, max_tokens=2, temperature=0).usage.prompt_tokens


def test_auth_off_accepts_any_key(server):
    assert server.client(api_key="anything").models.list().data


def test_auth_on_needs_the_key(keyed_server):
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="wrong").models.list()
    with pytest.raises(openai.AuthenticationError):
        keyed_server.client(api_key="wrong").chat.completions.create(model=keyed_server.model_id, messages=HELLO)
    assert httpx.get(f"{keyed_server.base_url}/models").status_code == 401
    good = keyed_server.client(api_key=KEY)
    assert good.models.list().data[0].id == keyed_server.model_id
    r = good.chat.completions.create(model=keyed_server.model_id, messages=HELLO, max_tokens=2)
    assert r.usage.completion_tokens <= 2
    assert httpx.get(f"{keyed_server.base_url.removesuffix('/v1')}/health").status_code == 200


def test_serve_refuses_public_bind_without_key(capsys):
    assert main(["serve", "--host", "0.0.0.0"]) == 2
    assert "without --api-key" in capsys.readouterr().err
