"""ChatTemplate's environment (HF semantics, sandbox), template choice, and message normalisation."""

from __future__ import annotations

import re
from datetime import datetime

import numpy as np
import pytest

from engine.errors import RigllmError
from engine.generation.chat_template import ChatTemplate, ChatTemplateError, plain_data, prepare_messages

USER = [{"role": "user", "content": "hi"}]


def render(source: str, **kwargs) -> str:
    return ChatTemplate(source).render(USER, **kwargs)


def test_tojson_keeps_unicode_and_markup_and_takes_options() -> None:
    data = {"b": "ü <tag> & 'q'", "a": [1, 2]}
    assert render("{{ x | tojson }}", x=data) == '{"b": "ü <tag> & \'q\'", "a": [1, 2]}'
    assert render("{{ x | tojson(indent=2, sort_keys=true) }}", x=data) == (
        '{\n  "a": [\n    1,\n    2\n  ],\n  "b": "ü <tag> & \'q\'"\n}'
    )
    assert render("{{ x | tojson(separators=(',', ':'), ensure_ascii=true) }}", x={"k": "ü"}) == '{"k":"\\u00fc"}'


def test_blocks_are_trimmed_like_transformers() -> None:
    source = "{% for m in messages %}\n    {{ m.role }}\n{% endfor %}\n"
    assert render(source) == "    user\n"


def test_loop_controls_namespace_and_strftime_now() -> None:
    source = (
        "{% set ns = namespace(n=0) %}{% for i in range(10) %}{% if i == 3 %}{% break %}{% endif %}"
        "{% if i == 1 %}{% continue %}{% endif %}{% set ns.n = ns.n + i %}{% endfor %}"
        "{{ ns.n }}|{{ strftime_now('%Y') }}"
    )
    assert render(source) == f"2|{datetime.now().year}"


def test_raise_exception_becomes_a_user_error_with_the_template_message() -> None:
    with pytest.raises(ChatTemplateError) as err:
        render("{{ raise_exception('Only user and assistant roles are supported!') }}")
    assert str(err.value) == "Only user and assistant roles are supported!"
    assert isinstance(err.value, RigllmError)


def test_sandbox_refuses_python_internals() -> None:
    with pytest.raises(ChatTemplateError, match="unsafe|underscore"):
        render("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="underscore"):
        render("{% set ns = namespace(_x=1) %}")
    with pytest.raises(ChatTemplateError):  # the immutable sandbox refuses to modify the caller's data
        render("{{ messages.append(1) }}")


def test_syntax_error_is_reported_with_the_line() -> None:
    with pytest.raises(ChatTemplateError, match=r"does not compile: .* \(line 2\)"):
        ChatTemplate("ok\n{% if %}")


def test_enable_thinking_is_undefined_unless_given() -> None:
    source = "{{ 'undefined' if enable_thinking is not defined else enable_thinking }}"
    assert render(source) == "undefined"
    assert render(source, enable_thinking=False) == "False"
    assert render(source, enable_thinking=True) == "True"


def test_for_model_prefers_the_gguf_template_and_passes_its_special_tokens() -> None:
    fields = {
        "tokenizer.chat_template": "{{ bos_token }}[{{ messages[0].content }}]{{ eos_token }}",
        "tokenizer.ggml.tokens": ["<s>", "a", "</s>"],
        "tokenizer.ggml.bos_token_id": 0,
        "tokenizer.ggml.eos_token_id": 2,
    }
    template = ChatTemplate.for_model(fields)
    assert template.origin == "model's"
    assert template.render(USER) == "<s>[hi]</s>"


@pytest.mark.parametrize("fields", [{}, {"tokenizer.chat_template": "  "}])
def test_for_model_falls_back_to_the_bundled_template(fields: dict) -> None:
    template = ChatTemplate.for_model(fields)
    assert template.source == ChatTemplate.fallback().source
    assert template.render(USER) == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n"
    assert template.render(USER, enable_thinking=False).endswith("<think>\n\n</think>\n\n")


def test_prepare_messages_decodes_string_arguments_and_aliases_reasoning() -> None:
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "reasoning": "why",
         "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": '{"x": "007"}'}},
                        {"id": "d", "type": "function", "function": {"name": "g", "arguments": ""}}]},
    ]
    prepared = prepare_messages(messages)
    assert prepared[1]["reasoning_content"] == "why"
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == {"x": "007"}
    assert prepared[1]["tool_calls"][1]["function"]["arguments"] == {}
    assert messages[1]["tool_calls"][0]["function"]["arguments"] == '{"x": "007"}'  # caller's data untouched


@pytest.mark.parametrize("arguments, problem", [('{"x": ', "not valid JSON"), ("[1, 2]", "must be a JSON object")])
def test_bad_string_arguments_are_a_user_error(arguments: str, problem: str) -> None:
    call = {"id": "c", "type": "function", "function": {"name": "f", "arguments": arguments}}
    with pytest.raises(ChatTemplateError, match=re.escape(problem)):
        prepare_messages([{"role": "assistant", "content": "", "tool_calls": [call]}])


def test_plain_data_reduces_rich_objects_to_json_types() -> None:
    class Picture:
        pass

    data = {"n": np.int64(3), "f": np.float32(0.5), "b": np.bool_(False), "img": Picture(), "t": ("a", 1)}
    assert plain_data(data) == {"n": 3, "f": 0.5, "b": False, "img": "<Picture>", "t": ["a", 1]}
    assert type(plain_data(data)["n"]) is int
