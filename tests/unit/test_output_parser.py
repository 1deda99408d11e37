"""The streaming output parser: reasoning/content split, tool calls, robustness, chunking invariance."""

from __future__ import annotations

import itertools
import json
import random
import re
from collections.abc import Callable
from typing import Any

import pytest

from engine.generation.chat_template import ChatTemplate
from engine.generation.output_parser import (
    ContentDelta,
    OutputParser,
    ParseEvent,
    ReasoningDelta,
    ToolCall,
    parse_output,
    thinking_from_prompt,
)

TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object", "properties": {
        "city": {"type": "string"}, "days": {"type": "integer"}, "code": {"type": "string"},
        "detail": {"type": "boolean"}, "filters": {"type": "object"}, "hours": {"type": "array"},
    }}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {"type": "object", "properties": {}}}},
]

WEATHER_XML = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nNew\nYork\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n<parameter=code>\n007\n</parameter>\n<parameter=detail>\ntrue\n</parameter>\n"
    '<parameter=filters>\n{"wind": true}\n</parameter>\n<parameter=hours>\n[6, 12]\n</parameter>\n'
    "<parameter=mood>\nnull\n</parameter>\n<parameter=extra>\n42\n</parameter>\n</function>\n</tool_call>"
)
WEATHER_ARGS = {"city": "New\nYork", "days": 3, "code": "007", "detail": True, "filters": {"wind": True},
                "hours": [6, 12], "mood": None, "extra": "42"}
TIME_XML = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>"
TIME_JSON = '<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC", "n": 1}}\n</tool_call>'

# name -> (text, thinking, tools, expected reasoning, expected content, expected [(name, arguments)])
Case = tuple[str, bool, list | None, str, str, list[tuple[str, dict[str, Any]]]]
WELL_FORMED: dict[str, Case] = {
    "reasoning_then_content": ("The user greets me.\nBe nice.\n\n</think>\n\nHello! How can I help?\n", True, None,
                               "The user greets me.\nBe nice.", "Hello! How can I help?", []),
    "stray_think_opener": ("<think>\n\nHmm.\n</think>\n\nHi", True, None, "Hmm.", "Hi", []),
    "reply_ends_while_thinking": ("\nStill thinking about a < b\n\n", True, None, "Still thinking about a < b", "", []),
    "thinking_off": ("\n\nHello\n\nworld </think>", False, None, "", "Hello\n\nworld </think>", []),
    "markup_without_tools_is_content": ("Sure.\n" + TIME_XML, False, None, "", "Sure.\n" + TIME_XML, []),
    "content_then_call": ("Check the weather.\n</think>\n\nLet me look that up.\n\n" + WEATHER_XML, True, TOOLS,
                          "Check the weather.", "Let me look that up.", [("get_weather", WEATHER_ARGS)]),
    "call_only": (TIME_XML, False, TOOLS, "", "", [("get_time", {})]),
    "multiple_calls_xml_and_json": (
        "</think>\n\n" + WEATHER_XML + "\n" + TIME_JSON + "\n" + TIME_XML + "\n", True, TOOLS,
        "", "", [("get_weather", WEATHER_ARGS), ("get_time", {"tz": "UTC", "n": 1}), ("get_time", {})]),
    "json_fallback_with_string_arguments": (
        '<tool_call>{"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}</tool_call>', False, TOOLS,
        "", "", [("get_weather", {"city": "Oslo"})]),
    "bare_function_and_stray_close": (
        "Looking.\n<function=get_weather>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>\n"
        "<function=get_time>\n</function>", False, TOOLS, "", "Looking.",
        [("get_weather", {"days": 2}), ("get_time", {})]),
    "two_functions_in_one_block": (
        "<tool_call>\n<function=get_time>\n</function>\n<function=get_weather>\n<parameter=city>\nRome\n</parameter>\n"
        "</function>\n</tool_call>", False, TOOLS, "", "", [("get_time", {}), ("get_weather", {"city": "Rome"})]),
    "missing_parameter_close_tolerated": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n<parameter=days>\n4\n</function>\n</tool_call>",
        False, TOOLS, "", "", [("get_weather", {"city": "Oslo", "days": 4})]),
    "reply_ends_inside_a_complete_block": ("<tool_call>\n<function=get_time>\n</function>\n", False, TOOLS,
                                           "", "", [("get_time", {})]),
    "text_after_a_call": (TIME_XML + "\nDone <b>now</b>.", False, TOOLS, "", "\nDone <b>now</b>.", [("get_time", {})]),
    "unknown_tool_keeps_raw_strings": (
        "<tool_call>\n<function=search>\n<parameter=q>\n123\n</parameter>\n</function>\n</tool_call>", False, TOOLS,
        "", "", [("search", {"q": "123"})]),
}

MALFORMED: dict[str, tuple[str, bool, str, list[str]]] = {
    # name -> (text, thinking, expected content, expected call names)
    "unclosed_block": ("Sure.\n<tool_call>\n<function=get_weather>\n", False,
                       "Sure.\n<tool_call>\n<function=get_weather>", []),
    "bad_json": ('Hi\n<tool_call>\n{"name": "get_time", "arguments": {oops}\n</tool_call>', False,
                 'Hi\n<tool_call>\n{"name": "get_time", "arguments": {oops}\n</tool_call>', []),
    "json_without_name": ('<tool_call>{"arguments": {}}</tool_call>', False,
                          '<tool_call>{"arguments": {}}</tool_call>', []),
    "xml_without_name": ("<tool_call>\n<function=>\n</function>\n</tool_call>", False,
                         "<tool_call>\n<function=>\n</function>\n</tool_call>", []),
    "stray_text_in_function": (
        "<tool_call>\n<function=get_time>\nnow please\n</function>\n</tool_call>", False,
        "<tool_call>\n<function=get_time>\nnow please\n</function>\n</tool_call>", []),
    "empty_block": ("<tool_call></tool_call>", False, "<tool_call></tool_call>", []),
    "unclosed_bare_function": ("Try <function=get_time> maybe", False, "Try <function=get_time> maybe", []),
    "bad_block_then_good_block": ("<tool_call>oops</tool_call>\n" + TIME_XML, True, "<tool_call>oops</tool_call>",
                                  ["get_time"]),
    "partial_tag_at_the_end": ("Compare a <tool_ca", False, "Compare a <tool_ca", []),
}


def counting_ids() -> Callable[[], str]:
    counter = itertools.count()
    return lambda: f"call_{next(counter)}"


def merged(events: list[ParseEvent]) -> list[ParseEvent]:
    """Adjacent reasoning or content deltas joined: what a client displays."""
    out: list[ParseEvent] = []
    for event in events:
        if out and not isinstance(event, ToolCall) and type(out[-1]) is type(event):
            out[-1] = type(event)(out[-1].text + event.text)
        else:
            out.append(event)
    return out


def stream(pieces: list[str], thinking: bool, tools: list | None) -> list[ParseEvent]:
    parser = OutputParser(thinking=thinking, tools=tools, call_id=counting_ids())
    events: list[ParseEvent] = []
    for piece in pieces:
        events += parser.feed(piece)
    events += parser.finish()
    assert all(not isinstance(e, (ContentDelta, ReasoningDelta)) or e.text for e in events)
    return events


def assert_chunking_invariant(text: str, thinking: bool, tools: list | None) -> None:
    whole = merged(stream([text], thinking, tools))
    assert merged(stream(list(text), thinking, tools)) == whole
    for cut in range(len(text) + 1):
        assert merged(stream([text[:cut], text[cut:]], thinking, tools)) == whole, f"split at {cut}"


@pytest.mark.parametrize("case", sorted(WELL_FORMED))
def test_well_formed(case: str) -> None:
    text, thinking, tools, reasoning, content, calls = WELL_FORMED[case]
    parsed = parse_output(text, thinking=thinking, tools=tools, call_id=counting_ids())
    assert parsed.reasoning_content == reasoning
    assert parsed.content == content
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in parsed.tool_calls] == calls
    assert [c["id"] for c in parsed.tool_calls] == [f"call_{i}" for i in range(len(calls))]
    assert all(c["type"] == "function" for c in parsed.tool_calls)
    assert parsed.finish_reason == ("tool_calls" if calls else None)
    assert_chunking_invariant(text, thinking, tools)


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_degrades_to_content(case: str) -> None:
    text, thinking, content, names = MALFORMED[case]
    if thinking:
        text = "</think>" + text
    parsed = parse_output(text, thinking=thinking, tools=TOOLS)
    assert parsed.content == content
    assert [c["function"]["name"] for c in parsed.tool_calls] == names
    assert_chunking_invariant(text, thinking, TOOLS)


def test_event_order_keeps_content_calls_and_later_text_apart() -> None:
    text = "Why not.\n</think>\n\nFirst this.\n" + TIME_XML + "\nThen that."
    events = stream([text], True, TOOLS)
    assert events == [
        ReasoningDelta("Why not."),
        ContentDelta("First this."),
        ToolCall(0, "call_0", "get_time", "{}"),
        ContentDelta("\nThen that."),
    ]


def test_only_possible_markup_and_trailing_whitespace_are_held_back() -> None:
    parser = OutputParser(thinking=True, tools=TOOLS, call_id=counting_ids())
    assert parser.feed("Plan: a<b") == [ReasoningDelta("Plan: a<b")]
    assert parser.feed(" and\n") == [ReasoningDelta(" and")]
    assert parser.feed("</thi") == []
    assert parser.feed("nk>\n\nAnswer") == [ContentDelta("Answer")]
    assert parser.feed(" is <tool_ca") == [ContentDelta(" is")]
    assert parser.feed("t>") == [ContentDelta(" <tool_cat>")]
    assert parser.feed(" <tool_call>\n<function=get_time>\n") == []
    assert parser.feed("</function>\n</tool_call>") == [ToolCall(0, "call_0", "get_time", "{}")]
    assert parser.finish() == []
    assert parser.finish_reason == "tool_calls"


def test_default_call_ids_are_openai_style_and_unique() -> None:
    parsed = parse_output(TIME_XML + TIME_XML, thinking=False, tools=TOOLS)
    ids = [c["id"] for c in parsed.tool_calls]
    assert all(re.fullmatch(r"call_[0-9a-f]{24}", i) for i in ids) and len(set(ids)) == 2


def test_feed_after_finish_is_a_bug() -> None:
    parser = OutputParser(thinking=False)
    parser.finish()
    with pytest.raises(RuntimeError):
        parser.feed("x")


def test_thinking_mode_is_read_from_the_rendered_prompt() -> None:
    template = ChatTemplate.fallback()
    user = [{"role": "user", "content": "Hi"}]
    assert thinking_from_prompt(template.render(user)) is True
    assert thinking_from_prompt(template.render(user, enable_thinking=False)) is False
    small_model_default_off = "{{ '<|im_start|>assistant\\n' }}{{ '<think>\\n' if enable_thinking else '' }}"
    assert thinking_from_prompt(ChatTemplate(small_model_default_off).render(user)) is False
    assert thinking_from_prompt(ChatTemplate(small_model_default_off).render(user, enable_thinking=True)) is True


def test_random_markup_never_raises_and_loses_no_text() -> None:
    """Fragments of every tag shuffled together: no exception, chunking-invariant, and when no call
    comes out the content is the whole reply (minus leading newlines and trailing whitespace)."""
    rng = random.Random(1234)
    pieces = ["<tool_call>", "</tool_call>", "<function=get_time>", "<function=", "</function>", "<parameter=x>",
              "</parameter>", "{\"name\": \"get_time\"}", "<think>", "</think>", "<tool_", "\n", " ", "text", "<", "{"]
    for _ in range(150):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 12)))
        parsed = parse_output(text, thinking=False, tools=TOOLS)
        if not parsed.tool_calls:
            assert parsed.content == text.lstrip("\n").rstrip()
        cut = rng.randint(0, len(text))
        for thinking in (False, True):
            whole = merged(stream([text], thinking, TOOLS))
            assert merged(stream(list(text), thinking, TOOLS)) == whole
            assert merged(stream([text[:cut], text[cut:]], thinking, TOOLS)) == whole


@pytest.mark.parametrize("text", [
    "Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nPar",  # inside a committed call
    "Sure.\n<tool_call>\n<function=get_wea",  # the head is not certain yet
    "Sure.\n<tool_c",  # a tag cut off
])
def test_a_reply_cut_by_its_budget_drops_the_call_it_was_writing(text):
    """finish(truncated=True): no half-built call is completed, and none of its markup becomes content."""
    parser = OutputParser(thinking=False, tools=TOOLS, stream_calls=True)
    events = parser.feed(text) + parser.finish(truncated=True)
    assert not any(isinstance(e, ToolCall) for e in events)
    assert "".join(e.text for e in events if isinstance(e, ContentDelta)) == "Sure."
    assert parser.cut_call == ("<function=" in text) and parser.finish_reason is None


def test_a_reply_cut_after_a_whole_call_keeps_it():
    parser = OutputParser(thinking=False, tools=TOOLS)
    text = "<tool_call>\n<function=get_time>\n</function>\n</tool_call>\nMore"
    events = parser.feed(text) + parser.finish(truncated=True)
    assert [e.name for e in events if isinstance(e, ToolCall)] == ["get_time"] and not parser.cut_call
