"""Tool calls streamed in pieces (`stream_calls=True`): the head as soon as the call is certain, one
argument fragment per finished parameter, then the complete `ToolCall`; and what a committed call
does when its markup breaks afterwards."""

from __future__ import annotations

import json
import random

import pytest
from test_output_parser import MALFORMED, TOOLS, WELL_FORMED, counting_ids

from engine.generation.output_parser import (
    ContentDelta,
    OutputParser,
    ParseEvent,
    ReasoningDelta,
    ToolCall,
    ToolCallArguments,
    ToolCallStart,
    parse_output,
)

CALL = ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
        "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>")


def parser() -> OutputParser:
    return OutputParser(thinking=False, tools=TOOLS, call_id=counting_ids(), stream_calls=True)


def fed(pieces: list[str]) -> list[ParseEvent]:
    p = parser()
    events = [e for piece in pieces for e in p.feed(piece)]
    return events + p.finish()


def test_head_then_one_fragment_per_parameter_then_the_call():
    p = parser()
    assert p.feed("<tool_call>\n<function=get_weather>\n") == []  # not certain yet: could be prose
    assert p.feed("<parameter=") == [ToolCallStart(0, "call_0", "get_weather")]
    assert p.feed("city>\nParis\n") == []
    assert p.feed("</parameter>") == [ToolCallArguments(0, '{"city": "Paris"')]
    assert p.feed("\n<parameter=days>\n3\n</parameter>\n") == [ToolCallArguments(0, ', "days": 3')]
    assert p.feed("</function>") == [ToolCallArguments(0, "}"), ToolCall(0, "call_0", "get_weather",
                                                                       '{"city": "Paris", "days": 3}')]
    assert p.feed("\n</tool_call>") == [] and p.finish() == []
    assert p.finish_reason == "tool_calls"


def test_without_stream_calls_only_complete_calls_come_out():
    plain = OutputParser(thinking=False, tools=TOOLS, call_id=counting_ids())
    events = [e for ch in CALL for e in plain.feed(ch)] + plain.finish()
    assert events == [ToolCall(0, "call_0", "get_weather", '{"city": "Paris", "days": 3}')]


def calls_from_stream(events: list[ParseEvent]) -> list[tuple[str, str, str]]:
    """(id, name, joined arguments) per streamed call, checking the order head → fragments → ToolCall."""
    heads: dict[int, ToolCallStart] = {}
    fragments: dict[int, list[str]] = {}
    out = []
    for e in events:
        if isinstance(e, ToolCallStart):
            assert e.index not in heads and e.index == len(heads)
            heads[e.index], fragments[e.index] = e, []
        elif isinstance(e, ToolCallArguments):
            fragments[e.index].append(e.text)
        elif isinstance(e, ToolCall):
            head = heads[e.index]
            assert (e.id, e.name) == (head.id, head.name)
            assert "".join(fragments[e.index]) == e.arguments  # the stream says exactly what the call says
            out.append((e.id, e.name, e.arguments))
    assert len(out) == len(heads)
    return out


def text_of(events: list[ParseEvent], kind: type) -> str:
    return "".join(e.text for e in events if isinstance(e, kind))


@pytest.mark.parametrize("case", sorted(WELL_FORMED) + sorted(MALFORMED))
def test_streaming_changes_nothing_but_adds_the_pieces(case):
    """Every parser case: with stream_calls the same content, reasoning and calls, however the text is cut."""
    if case in WELL_FORMED:
        text, thinking, tools = WELL_FORMED[case][:3]
    else:
        text, thinking = MALFORMED[case][:2]
        text, tools = ("</think>" + text if thinking else text), TOOLS
    plain = parse_output(text, thinking=thinking, tools=tools, call_id=counting_ids())
    rng = random.Random(case)
    for pieces in ([text], list(text), _random_cuts(text, rng)):
        p = OutputParser(thinking=thinking, tools=tools, call_id=counting_ids(), stream_calls=True)
        events = [e for piece in pieces for e in p.feed(piece)] + p.finish()
        assert text_of(events, ContentDelta) == plain.content
        assert text_of(events, ReasoningDelta) == plain.reasoning_content
        assert [(i, n, json.loads(a)) for i, n, a in calls_from_stream(events)] == [
            (c["id"], c["function"]["name"], json.loads(c["function"]["arguments"])) for c in plain.tool_calls]


def _random_cuts(text: str, rng: random.Random) -> list[str]:
    cuts = sorted(rng.sample(range(len(text) + 1), k=min(4, len(text) + 1)))
    return [text[a:b] for a, b in zip([0] + cuts, cuts + [len(text)])]


def test_two_calls_stream_with_their_own_indexes():
    events = fed(list(CALL + "\n" + CALL.replace("Paris", "Rome")))
    assert [(e.index, e.text) for e in events if isinstance(e, ToolCallArguments)] == [
        (0, '{"city": "Paris"'), (0, ', "days": 3'), (0, "}"), (1, '{"city": "Rome"'), (1, ', "days": 3'), (1, "}")]


def test_a_call_without_parameters_streams_an_empty_object():
    events = fed(["<tool_call>\n<function=get_time>\n</function>\n</tool_call>"])
    assert events == [ToolCallStart(0, "call_0", "get_time"), ToolCallArguments(0, "{}"),
                      ToolCall(0, "call_0", "get_time", "{}")]


def test_json_fallback_streams_whole_at_the_block_end():
    events = fed(list('<tool_call>{"name": "get_time", "arguments": {"tz": "UTC"}}</tool_call>'))
    assert events == [ToolCallStart(0, "call_0", "get_time"), ToolCallArguments(0, '{"tz": "UTC"}'),
                      ToolCall(0, "call_0", "get_time", '{"tz": "UTC"}')]


# A call that was certain (its head may be on the wire) stays a call when its markup breaks later.
COMMITTED = {
    # name -> (text, expected arguments, expected content)
    "reply_ends_inside_a_value": ("Sure.\n<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n",
                                  {"city": "Oslo"}, "Sure."),
    "reply_ends_in_a_closing_tag": ("<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</param",
                                    {"days": 4}, ""),
    "reply_ends_between_parameters": ("<tool_call>\n<function=get_weather>\n<parameter=days>\n4\n</parameter>\n<para",
                                      {"days": 4}, ""),
    "stray_text_between_parameters": (
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nOslo\n</parameter>\nhurry\n</function>\n</tool_call>",
        {"city": "Oslo"}, "\nhurry\n</function>\n</tool_call>"),
    "parameter_without_a_name": ("<tool_call>\n<function=get_weather>\n<parameter=>\n1\n</parameter>\n</function>",
                                 {}, "\n<parameter=>\n1\n</parameter>\n</function>"),
    "stray_text_after_the_function": ("<tool_call>\n<function=get_time>\n</function>\noops\n</tool_call>", {},
                                      "\noops\n</tool_call>"),
}


@pytest.mark.parametrize("case", sorted(COMMITTED))
def test_committed_call_keeps_what_had_ended(case):
    text, arguments, content = COMMITTED[case]
    parsed = parse_output(text, thinking=False, tools=TOOLS)
    assert [json.loads(c["function"]["arguments"]) for c in parsed.tool_calls] == [arguments]
    assert parsed.content == content and parsed.finish_reason == "tool_calls"
    for pieces in ([text], list(text)):
        events = fed(pieces)
        (call,) = calls_from_stream(events)
        assert json.loads(call[2]) == arguments
        assert text_of(events, ContentDelta) == content


def test_prose_that_mentions_a_function_tag_is_not_a_call():
    for text in ("Use <function=get_time> for that.",
                 "<tool_call>\n<function=get_time>\nnow\n</function>\n</tool_call>"):
        events = fed(list(text))
        assert not any(isinstance(e, (ToolCallStart, ToolCall)) for e in events)
        assert text_of(events, ContentDelta) == text


def test_random_markup_streams_what_the_whole_parse_gives():
    """Fragments of every tag shuffled together (committed calls that break included): no exception,
    and the streamed content and calls equal the whole parse however the text is cut."""
    rng = random.Random(99)
    pieces = ["<tool_call>", "</tool_call>", "<function=get_weather>", "<function=", "</function>", "<parameter=days>",
              "<parameter=city>", "</parameter>", "<parameter=", "7", "\n", " ", "x", "<", "</para"]
    for _ in range(300):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(1, 14)))
        plain = parse_output(text, thinking=False, tools=TOOLS, call_id=counting_ids())
        for cut in ([text], list(text), _random_cuts(text, rng)):
            events = fed(cut)
            assert text_of(events, ContentDelta) == plain.content, text
            assert [(n, json.loads(a)) for _, n, a in calls_from_stream(events)] == [
                (c["function"]["name"], json.loads(c["function"]["arguments"])) for c in plain.tool_calls], text
