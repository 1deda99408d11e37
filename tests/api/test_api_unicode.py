"""Request bodies whose JSON escapes decode to unpaired surrogates get a 400 naming the field, on every route."""

import httpx
import pytest

from engine.server.wire import unpaired_surrogate_at


def test_finder_walks_values_and_keys():
    assert unpaired_surrogate_at({"a": ["ok", {"b": "é🙂"}]}) is None
    assert unpaired_surrogate_at({"a": ["ok", {"b": "x\ud83d"}]}) == "a.1.b"
    assert unpaired_surrogate_at({"k\udc00": 1}) == "k\\udc00"
    assert unpaired_surrogate_at("\ud800") == "body"


@pytest.mark.parametrize("route, body, where", [
    ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "a\\ud800"}]}', "messages.0.content"),
    ("/v1/completions", b'{"prompt": "\\udfff"}', "prompt"),
    ("/v1/completions", b'{"prompt": "hi", "model": "\\ud800"}', "model"),
    ("/v1/tokenize", b'{"content": "\\ud800"}', "content"),
    ("/v1/detokenize", b'{"tokens": [1], "model": "\\ud800"}', "model"),
    ("/v1/tokenize", b'{"content": "x", "chat_template_kwargs": {"\\ud800": 1}}', "chat_template_kwargs.\\ud800"),
])
def test_unpaired_surrogates_are_400(server, route, body, where):
    """JSON may escape lone surrogates; the tokenizer and the error response itself cannot encode them."""
    r = httpx.post(server.base_url.removesuffix("/v1") + route, content=body, headers={"content-type": "application/json"})
    assert r.status_code == 400, r.text
    assert f"{where}: the text is not valid Unicode" in r.json()["error"]["message"]
