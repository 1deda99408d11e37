"""/tokenize and /detokenize on a live server: round trips, chat prompts counted as chat completions count them, 400s."""

import httpx
import pytest


HELLO = [{"role": "user", "content": "Hello there"}]


def post(server, route, body, prefix="/v1"):
    return httpx.post(server.base_url.removesuffix("/v1") + prefix + route, json=body, timeout=60)


@pytest.mark.parametrize("prefix", ["/v1", ""])
def test_text_round_trip(server, prefix):
    text = "Hello world, ünïcode 🙂 and <|im_start|> inside"
    r = post(server, "/tokenize", {"content": text}, prefix)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["count"] == len(body["tokens"]) > 0
    assert body["max_model_len"] == server.service.context_length
    assert server.service.tokenizer.token_to_id("<|im_start|>") in body["tokens"]  # specials match whole
    back = post(server, "/detokenize", {"tokens": body["tokens"]}, prefix)
    assert back.status_code == 200, back.text
    assert back.json() == {"content": text}


def test_chat_count_matches_chat_completion_usage(server):
    counted = post(server, "/tokenize", {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": False}}).json()
    reply = server.client().chat.completions.create(model=server.model_id, messages=HELLO, max_tokens=1,
                                                    extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert counted["count"] == reply.usage.prompt_tokens


def test_generation_prompt_is_optional(server):
    with_prompt = post(server, "/tokenize", {"messages": HELLO}).json()["tokens"]
    without = post(server, "/tokenize", {"messages": HELLO, "add_generation_prompt": False}).json()["tokens"]
    assert len(without) < len(with_prompt) and with_prompt[:len(without)] == without
    assert "assistant" not in post(server, "/detokenize", {"tokens": without}).json()["content"]


def test_overlong_text_is_counted_not_refused(server):
    context = server.service.context_length
    r = post(server, "/tokenize", {"content": "a b " * context})
    assert r.status_code == 200 and r.json()["count"] > context


@pytest.mark.parametrize("route, body, param", [
    ("/tokenize", {}, "content"),
    ("/tokenize", {"content": "x", "messages": HELLO}, "content"),
    ("/tokenize", {"content": 5}, "content"),
    ("/tokenize", {"messages": []}, "messages"),
    ("/tokenize", {"messages": HELLO, "chat_template_kwargs": {"enable_thinking": "yes"}}, "chat_template_kwargs"),
    ("/detokenize", {"tokens": [-1]}, "tokens.0"),
    ("/detokenize", {"tokens": [1, 10**30]}, "tokens.1"),
    ("/detokenize", {"tokens": ["a"]}, "tokens.0"),
    ("/detokenize", {}, "tokens"),
])
def test_bad_input_is_400(server, route, body, param):
    r = post(server, route, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param, error


def test_out_of_range_id_names_the_vocabulary(server):
    size = server.service.tokenizer.vocab_size
    error = post(server, "/detokenize", {"tokens": [size]}).json()["error"]
    assert f"0..{size - 1}" in error["message"]


def test_unknown_model_is_404(server):
    assert post(server, "/tokenize", {"model": "gpt-4o", "content": "x"}).status_code == 404
    assert post(server, "/detokenize", {"model": "gpt-4o", "tokens": [1]}).status_code == 404

