"""Prompts rendered by rigllm equal transformers' rendering, for the official template and our fallback.

transformers' own renderer (`render_jinja_template`, what `apply_chat_template` calls) is the
reference for jinja semantics; the official Qwen3.5 template (from the llama-cpp-python sdist) is the
reference for what the fallback must produce; the tests that read it are peer tests (a download).
"""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from chat_template_fixtures import CONVERSATIONS, REFUSED, official_qwen35_template
from llama_sdist import needs_sdist
from engine.generation.chat_template import FALLBACK_TEMPLATE_PATH, ChatTemplate, ChatTemplateError

chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")

THINKING = [None, True, False]


@pytest.fixture(scope="module")
def official() -> str:
    return official_qwen35_template()


@pytest.fixture(scope="module")
def fallback() -> str:
    return FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8")


def transformers_render(source: str, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                        enable_thinking: bool | None, extra: dict[str, Any]) -> str:
    kwargs = dict(extra)
    if enable_thinking is not None:
        kwargs["enable_thinking"] = enable_thinking
    rendered, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=source, add_generation_prompt=True, **kwargs
    )
    return rendered[0]


@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_renderer_matches_transformers_on_the_fallback(fallback: str, case: str) -> None:
    """Needs no download: our jinja environment against transformers' on the bundled template."""
    messages, tools, extra = CONVERSATIONS[case]
    for enable_thinking in THINKING:
        expected = transformers_render(fallback, messages, tools, enable_thinking, extra)
        rendered = ChatTemplate(fallback).render(messages, tools=tools, enable_thinking=enable_thinking, **extra)
        assert rendered == expected


@needs_sdist
@pytest.mark.parametrize("enable_thinking", THINKING)
@pytest.mark.parametrize("case", sorted(CONVERSATIONS))
def test_renders_like_transformers_and_official(official: str, fallback: str, case: str,
                                                enable_thinking: bool | None) -> None:
    messages, tools, extra = CONVERSATIONS[case]
    expected = transformers_render(official, messages, tools, enable_thinking, extra)
    assert transformers_render(fallback, messages, tools, enable_thinking, extra) == expected
    for source in (official, fallback):
        rendered = ChatTemplate(source).render(messages, tools=tools, enable_thinking=enable_thinking, **extra)
        assert rendered == expected
    if enable_thinking is False:
        assert expected.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")
    else:  # the 4B/9B/27B templates think unless told not to
        assert expected.endswith("<|im_start|>assistant\n<think>\n")


@needs_sdist
def test_history_turns_without_generation_prompt(official: str, fallback: str) -> None:
    messages, tools, _ = CONVERSATIONS["grouped_tool_responses_and_answer"]
    expected, _ = chat_template_utils.render_jinja_template(
        conversations=[messages], tools=tools, chat_template=official, add_generation_prompt=False
    )
    for source in (official, fallback):
        assert ChatTemplate(source).render(messages, tools=tools, add_generation_prompt=False) == expected[0]


@needs_sdist
def test_json_string_arguments_render_like_mappings(official: str, fallback: str) -> None:
    """OpenAI clients send `arguments` as a JSON string; the prompt must be the one for the mapping."""
    messages, tools, _ = CONVERSATIONS["grouped_tool_responses_and_answer"]
    as_strings = [dict(m) for m in messages]
    as_strings[2] = {**messages[2], "tool_calls": [
        {**call, "function": {**call["function"], "arguments": json.dumps(call["function"]["arguments"])}}
        for call in messages[2]["tool_calls"]
    ]}
    expected = transformers_render(official, messages, tools, None, {})
    for source in (official, fallback):
        assert ChatTemplate(source).render(as_strings, tools=tools) == expected


@needs_sdist
@pytest.mark.parametrize("case", sorted(REFUSED))
def test_refuses_like_the_official_template(official: str, fallback: str, case: str) -> None:
    messages, message = REFUSED[case]
    with pytest.raises(Exception, match=re.escape(message)):
        transformers_render(official, messages, None, None, {})
    for source in (official, fallback):
        with pytest.raises(ChatTemplateError) as err:
            ChatTemplate(source).render(messages)
        assert str(err.value) == message


@needs_sdist
def test_fallback_keeps_the_official_tool_instructions_verbatim(official: str, fallback: str) -> None:
    """The instruction block is data the model was trained on; compare it directly, not only via renders."""
    messages, tools, _ = CONVERSATIONS["tools_only"]
    rendered = ChatTemplate(fallback).render(messages, tools=tools)
    start = rendered.index("If you choose to call a function")
    end = rendered.index("</IMPORTANT>") + len("</IMPORTANT>")
    block = rendered[start:end]
    assert block.replace("\n", "\\n") in official
