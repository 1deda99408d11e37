"""Request fields mainstream clients send: `developer`, `n`, token-id and batched prompts, `echo`, any
int64 `seed`, legacy `functions`, and fields accepted and ignored; with the official openai client."""

import json

import openai
import pytest

HELLO = [{"role": "user", "content": "Hello"}]
OFF = {"chat_template_kwargs": {"enable_thinking": False}}


def chat(client, server, **kwargs):
    args = dict(model=server.model_id, messages=HELLO, max_tokens=8, temperature=0, extra_body=OFF)
    return client.chat.completions.create(**{**args, **kwargs})


def test_developer_is_the_system_role(client, server):
    as_developer = chat(client, server, messages=[{"role": "developer", "content": "Be brief."}, *HELLO])
    as_system = chat(client, server, messages=[{"role": "system", "content": "Be brief."}, *HELLO])
    assert as_developer.choices[0].message.content == as_system.choices[0].message.content
    assert as_developer.usage.prompt_tokens == as_system.usage.prompt_tokens


def test_n_choices_are_distinct_samples_each_replayable(client, server):
    r = chat(client, server, n=3, temperature=1.0, seed=7)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    assert len(set(texts)) > 1  # three seeds; the demo model's distribution is near uniform
    assert texts[0] == chat(client, server, temperature=1.0, seed=7).choices[0].message.content
    assert r.usage.completion_tokens == sum(1 for _ in r.choices) * 8
    assert r.usage.prompt_tokens == chat(client, server).usage.prompt_tokens  # counted once


def test_n_streams_every_choice(client, server):
    whole = chat(client, server, n=2, temperature=1.0, seed=3)
    texts = {0: "", 1: ""}
    usage = None
    for chunk in chat(client, server, n=2, temperature=1.0, seed=3, stream=True,
                      stream_options={"include_usage": True}):
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert [texts[0], texts[1]] == [c.message.content for c in whole.choices]
    assert usage.completion_tokens == whole.usage.completion_tokens


@pytest.mark.parametrize("n", [0, 9])
def test_n_out_of_range_is_400(client, server, n):
    with pytest.raises(openai.BadRequestError, match="n must be between 1 and 8"):
        chat(client, server, n=n)


def complete(client, server, **kwargs):
    return client.completions.create(**{"model": server.model_id, "max_tokens": 6, "temperature": 0, **kwargs})


def test_token_id_prompt_equals_its_text(client, server):
    ids = server.service.tokenizer.encode("Once upon a time")
    assert complete(client, server, prompt=ids).choices[0].text == \
        complete(client, server, prompt="Once upon a time").choices[0].text


def test_prompt_batch_gives_a_choice_per_prompt(client, server):
    prompts = ["Once upon a time", "The cat"]
    r = complete(client, server, prompt=prompts, n=2, temperature=1.0, seed=1)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    assert r.choices[2].text == complete(client, server, prompt="The cat", temperature=1.0, seed=1).choices[0].text


def test_echo_leads_with_the_prompt(client, server):
    plain = complete(client, server, prompt="Once upon a time").choices[0].text
    assert complete(client, server, prompt="Once upon a time", echo=True).choices[0].text == "Once upon a time" + plain


def test_token_ids_outside_the_vocabulary_are_400(client, server):
    with pytest.raises(openai.BadRequestError, match="outside the vocabulary"):
        complete(client, server, prompt=[1, 10**9])


@pytest.mark.parametrize("seed", [-1, -(2**63), 2**63 - 1])
def test_any_int64_seed(client, server, seed):
    assert chat(client, server, seed=seed, temperature=1.0).choices[0].finish_reason in ("stop", "length")


def test_seed_minus_one_is_random_not_a_fixed_seed(client, server):
    texts = {chat(client, server, seed=-1, temperature=1.0, max_tokens=12).choices[0].message.content
             for _ in range(3)}
    assert len(texts) > 1


def test_legacy_functions_are_tools(client, server):
    fn = {"name": "get_time", "parameters": {"type": "object", "properties": {"zone": {"type": "string",
                                                                                       "maxLength": 8}},
                                             "required": ["zone"]}}
    r = chat(client, server, functions=[fn], function_call={"name": "get_time"}, max_tokens=40)
    (call,) = r.choices[0].message.tool_calls
    assert call.function.name == "get_time" and set(json.loads(call.function.arguments)) == {"zone"}


def test_ignored_fields_are_accepted(client, server):
    r = chat(client, server, user="u1", metadata={"k": "v"}, store=False)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_logit_bias_forces_and_bans(client, server):
    tokenizer = server.service.tokenizer
    word = tokenizer.encode(" cat")[0]
    forced = chat(client, server, logit_bias={str(word): 100}, max_tokens=4, temperature=1.0, seed=2)
    assert forced.choices[0].message.content == tokenizer.decode([word]) * 4
    other = tokenizer.encode(" dog")[0]
    banned = chat(client, server, logit_bias={str(word): -100, str(other): 100}, max_tokens=4)
    assert banned.choices[0].message.content == tokenizer.decode([other]) * 4


def test_logit_bias_out_of_range_is_400(client, server):
    with pytest.raises(openai.BadRequestError, match="logit_bias"):
        chat(client, server, logit_bias={"1": 300})


def test_logit_bias_over_openais_300_tokens_is_400(client, server):
    with pytest.raises(openai.BadRequestError, match="at most 300"):
        chat(client, server, logit_bias={str(i): 1.0 for i in range(301)})
