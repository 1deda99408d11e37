"""Split a streamed Qwen3.5 reply into reasoning, content and tool calls (spec §11.3, §11.4).

The parser is fed text deltas as tokens are decoded and returns events at once; it holds back only
text that could still turn out to be markup: the tail that might be the start of `</think>`,
`<tool_call>` or `<function=`, plus trailing whitespace (reasoning loses its surrounding newlines,
content its trailing whitespace and the blank line before a call). Splitting the same text differently
only changes how deltas are cut, never the merged result; `parse_output` is the same machinery fed once.

Tool calls: every call ends in one complete `ToolCall` event (what `collect()`-style consumers and the
desktop app use). With `stream_calls=True` a call also streams as OpenAI streams it: `ToolCallStart`
(index, id, name) as soon as the call is certain, then `ToolCallArguments` fragments of the argument
JSON as each `<parameter=…>` element ends (`{"city": "Paris"`, `, "days": 3`, `}`), then the
`ToolCall`. An XML call is certain once `<function=NAME>` is followed by `<parameter=` or `</function>`
(engine.generation.tool_call_stream); a JSON-fallback block, or one whose head is not certain, is
buffered until `</tool_call>` and then streams all at once, as before.

Rules:
* Thinking on: the prompt already ends with `<think>\\n`, so everything up to the first `</think>` is
  reasoning (a stray `<think>` the model repeats at the start is dropped). If the reply ends before
  `</think>`, all of it was reasoning. Thinking off: everything is content.
* Content starts after its leading newlines. With tools in the request, `<tool_call>…</tool_call>`
  blocks (XML or the JSON fallback) and bare `<function=…>…</function>` elements (pitfall 17; a
  `</tool_call>` right after one is dropped) become OpenAI `tool_calls`, argument values converted
  by the request's tool schemas. Without tools the markup stays content: the client asked for no calls.
* A block that is malformed before its call is certain (bad JSON, no name, stray text after the head)
  or never closed is shown verbatim as content; a block the reply ends inside is still accepted when
  its body is complete. Nothing raises.
* A call that is certain is committed, because its head may already be on the wire and OpenAI clients
  cannot take a delta back: if its markup then breaks (stray text where a tag belongs), the call is
  closed with the parameters that had ended and the text from the break on is shown as content; if
  the reply ends inside it, the parameter being written is taken as it stands (as a missing
  `</parameter>` is tolerated), a tag cut off by the end is dropped, and the call is closed. The result
  is the same whether or not `stream_calls` is on, and however the text was cut.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from engine.generation.tool_call_stream import (
    PARAMETER_OPEN,
    WAIT,
    Head,
    OpenCall,
    Parameter,
    read_head,
    read_parameter,
)
from engine.generation.tool_call_syntax import (
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    ParsedCall,
    parse_function_elements,
    parse_tool_call_body,
)

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
CALL_OPEN = "<tool_call>"
CALL_CLOSE = "</tool_call>"


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ContentDelta:
    text: str


@dataclass(frozen=True)
class ToolCall:
    """A complete call; `index` counts calls in this reply from 0, `arguments` is a JSON object string."""

    index: int
    id: str
    name: str
    arguments: str

    def as_openai(self) -> dict[str, Any]:
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolCallStart:
    """A call's head, streamed before its arguments (only with `stream_calls`); its `ToolCall` follows."""

    index: int
    id: str
    name: str


@dataclass(frozen=True)
class ToolCallArguments:
    """A fragment of call `index`'s argument JSON (only with `stream_calls`); the fragments join to valid JSON."""

    index: int
    text: str


ParseEvent = ReasoningDelta | ContentDelta | ToolCall | ToolCallStart | ToolCallArguments


@dataclass(frozen=True)
class ParsedOutput:
    """A whole reply. `finish_reason` is "tool_calls" when a call was made, else None (keep your own)."""

    reasoning_content: str
    content: str
    tool_calls: list[dict[str, Any]]
    finish_reason: str | None


def thinking_from_prompt(prompt: str) -> bool:
    """The parser's `thinking` flag for a rendered prompt: does it end inside an open `<think>` block?

    Read it from the prompt rather than the request, because the default differs by template
    (0.8B/2B think only when asked; 4B/9B/27B unless told not to, spec §11.4).
    """
    return prompt.rfind(THINK_OPEN) > prompt.rfind(THINK_CLOSE)


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


def _partial_tag_length(text: str, tags: Sequence[str]) -> int:
    """Length of the tail of `text` that is a proper prefix of one of `tags` (0 if none).

    Every tag has its only `<` in front, so the one candidate tail starts at the last `<`.
    """
    start = text.rfind("<")
    if start < 0:
        return 0
    tail = text[start:]
    return len(tail) if any(len(tail) < len(tag) and tag.startswith(tail) for tag in tags) else 0


class OutputParser:
    """Incremental parser for one reply: `feed` each decoded delta, then `finish` once."""

    def __init__(self, *, thinking: bool, tools: Sequence[Mapping[str, Any]] | None = None,
                 call_id: Callable[[], str] = new_call_id, stream_calls: bool = False) -> None:
        """`stream_calls`: also emit `ToolCallStart` and `ToolCallArguments` (for OpenAI streaming)."""
        self._tools = list(tools) if tools else None
        self._call_tags = (CALL_OPEN, FUNCTION_OPEN) if self._tools else ()
        self._call_id = call_id
        self._stream_calls = stream_calls
        self._call: OpenCall | None = None
        self._state = "reasoning_start" if thinking else "content_start"
        self._buf = ""
        self._events: list[ParseEvent] = []
        self.tool_call_count = 0
        self.cut_call = False  # finish(truncated=True) dropped a call the reply was still writing
        self._truncated = False
        self._finished = False

    @property
    def finish_reason(self) -> str | None:
        """The finish_reason hint: "tool_calls" once a call was emitted, else None (keep stop/length)."""
        return "tool_calls" if self.tool_call_count else None

    def feed(self, delta: str) -> list[ParseEvent]:
        if self._finished:
            raise RuntimeError("OutputParser.feed after finish")
        self._buf += delta
        return self._advance(final=False)

    def finish(self, truncated: bool = False) -> list[ParseEvent]:
        """Flush everything held back; the reply is over.

        `truncated`: it was cut by its token budget. A call it was still writing is then dropped (a
        streamed head cannot be taken back, but no half-built call is completed and none of its markup
        is shown as content; `cut_call` says so), and so is a held tail that could be call markup.
        """
        if self._finished:
            return []
        self._truncated = truncated
        if truncated and self._state in ("call", "block", "bare"):
            if self._call is not None:
                self.tool_call_count -= 1
                self._call = None
            self.cut_call, self._buf, self._state = True, "", "content"
        events = self._advance(final=True)
        self._finished = True
        return events

    def _advance(self, final: bool) -> list[ParseEvent]:
        handlers = {
            "reasoning_start": self._reasoning_start,
            "reasoning": self._reasoning,
            "content_start": self._content_start,
            "content": self._content,
            "block": self._block,
            "bare": self._bare,
            "after_bare": self._after_bare,
            "call": self._in_call,
            "after_function": self._after_function,
        }
        while handlers[self._state](final):
            pass
        events, self._events = self._events, []
        return events

    # Each state handler consumes what it can from the buffer and returns True when another handler
    # (or the same one, after a state change) may make further progress.

    def _reasoning_start(self, final: bool) -> bool:
        self._buf = self._buf.lstrip("\n")
        if self._buf.startswith(THINK_OPEN):
            self._buf = self._buf[len(THINK_OPEN):]
            return True
        if not self._buf or (THINK_OPEN.startswith(self._buf) and not final):
            return False
        self._state = "reasoning"
        return True

    def _reasoning(self, final: bool) -> bool:
        end = self._buf.find(THINK_CLOSE)
        if end >= 0:
            self._emit(ReasoningDelta, self._buf[:end].rstrip("\n"))
            self._buf = self._buf[end + len(THINK_CLOSE):]
            self._state = "content_start"
            return True
        keep = len(self._buf) if final else len(self._buf) - _partial_tag_length(self._buf, (THINK_CLOSE,))
        self._release(ReasoningDelta, keep, "\n", final)
        return False

    def _content_start(self, final: bool) -> bool:
        self._buf = self._buf.lstrip("\n")
        if not self._buf:
            return False
        self._state = "content"
        return True

    def _content(self, final: bool) -> bool:
        starts = [i for i in (self._buf.find(tag) for tag in self._call_tags) if i >= 0]
        if starts:
            at = min(starts)
            pre = self._buf[:at].rstrip()
            self._emit(ContentDelta, pre)
            self._buf = self._buf[len(pre):]  # the block keeps its leading whitespace in case it degrades
            self._state = "block" if self._buf.lstrip().startswith(CALL_OPEN) else "bare"
            return True
        whole = final and not self._truncated
        keep = len(self._buf) if whole else len(self._buf) - _partial_tag_length(self._buf, self._call_tags)
        self._release(ContentDelta, keep, None, final)
        return False

    def _block(self, final: bool) -> bool:
        body_start = self._buf.find(CALL_OPEN) + len(CALL_OPEN)
        opened = self._open_call(body_start, in_block=True, final=final)
        if opened is not None:
            return opened
        end = self._buf.find(CALL_CLOSE, body_start)
        if end < 0 and not final:
            return False
        raw = self._buf[: end + len(CALL_CLOSE)] if end >= 0 else self._buf
        body = self._buf[body_start:end] if end >= 0 else self._buf[body_start:]
        self._buf = self._buf[len(raw):]
        self._close(raw, parse_tool_call_body(body, self._tools), final)
        self._state = "content"
        return True

    def _bare(self, final: bool) -> bool:
        opened = self._open_call(0, in_block=False, final=final)
        if opened is not None:
            return opened
        end = self._buf.find(FUNCTION_CLOSE)
        if end < 0 and not final:
            return False
        raw = self._buf[: end + len(FUNCTION_CLOSE)] if end >= 0 else self._buf
        self._buf = self._buf[len(raw):]
        made_calls = self._close(raw, parse_function_elements(raw, self._tools), final)
        self._state = "after_bare" if made_calls else "content"
        return True

    def _after_bare(self, final: bool) -> bool:
        rest = self._buf.lstrip()
        if rest.startswith(CALL_CLOSE):
            self._buf = rest[len(CALL_CLOSE):]
        elif CALL_CLOSE.startswith(rest) and not final:
            return False
        self._state = "content"
        return True

    def _close(self, raw: str, calls: list[ParsedCall] | None, final: bool) -> bool:
        """Emit the parsed calls, or the block's own text as content when it is malformed."""
        if calls is None:
            self._emit(ContentDelta, raw.rstrip() if final and not self._buf else raw)
            return False
        for call in calls:
            arguments = json.dumps(call.arguments, ensure_ascii=False)
            index, call_id = self.tool_call_count, self._call_id()
            if self._stream_calls:
                self._events += [ToolCallStart(index, call_id, call.name), ToolCallArguments(index, arguments)]
            self._events.append(ToolCall(index, call_id, call.name, arguments))
            self.tool_call_count += 1
        return True

    # A call read piece by piece (engine.generation.tool_call_stream): "call" holds the buffer from
    # just after its head or its last parameter; "after_function" follows its `</function>` in a block.

    def _open_call(self, start: int, in_block: bool, final: bool) -> bool | None:
        """Commit to the XML call starting after whitespace at `start`, if its head is certain.

        True: committed (state "call"); False: wait for more text; None: not streamable here, so the
        caller handles the text as a whole block.
        """
        rest = self._buf[start:]
        at = start + len(rest) - len(rest.lstrip())
        text = self._buf[at:]
        if not text.startswith(FUNCTION_OPEN):
            return False if not final and FUNCTION_OPEN.startswith(text) and text else None
        head = read_head(text, final)
        if head == WAIT:
            return False
        if not isinstance(head, Head):
            return None
        self._call = OpenCall(self.tool_call_count, self._call_id(), head.name, in_block, self._tools)
        self.tool_call_count += 1
        if self._stream_calls:
            self._events.append(ToolCallStart(self._call.index, self._call.id, head.name))
        self._buf = text[head.end:]
        self._state = "call"
        return True

    def _in_call(self, final: bool) -> bool:
        call = self._call
        assert call is not None
        text = self._buf.lstrip()
        if text.startswith(FUNCTION_CLOSE):
            self._buf = text[len(FUNCTION_CLOSE):]
            self._end_call("after_function" if call.in_block else "after_bare")
            return True
        if text.startswith(PARAMETER_OPEN):
            parameter = read_parameter(text, final)
            if parameter == WAIT:
                return False
            if isinstance(parameter, Parameter):
                self._arguments(call.add(parameter))
                self._buf = text[parameter.end:]
                return True
        elif not text or _partial_tag_length(text, (FUNCTION_CLOSE, PARAMETER_OPEN)) == len(text):
            if not final:
                return False
            self._buf = ""  # the reply ended between parameters, perhaps inside a tag: nothing of it to show
        self._end_call("content")  # broken markup or the end: keep what had ended; the rest is content
        return True

    def _after_function(self, final: bool) -> bool:
        """After a call's `</function>` inside `<tool_call>`: another call, the block's end, or stray text."""
        text = self._buf.lstrip()
        if text.startswith(CALL_CLOSE):
            self._buf = text[len(CALL_CLOSE):]
            self._state = "content"
            return True
        if text.startswith(FUNCTION_OPEN):
            opened = self._open_call(0, in_block=True, final=final)
            if opened is not None:
                return opened
        elif not final and (not text or _partial_tag_length(text, (CALL_CLOSE, FUNCTION_OPEN)) == len(text)):
            return False
        self._state = "content"  # stray text, an uncertain call or the reply's end: shown as content
        return True

    def _arguments(self, text: str) -> None:
        if self._stream_calls:
            assert self._call is not None
            self._events.append(ToolCallArguments(self._call.index, text))

    def _end_call(self, next_state: str) -> None:
        call = self._call
        assert call is not None
        self._arguments(call.close())
        self._events.append(ToolCall(call.index, call.id, call.name, json.dumps(call.arguments, ensure_ascii=False)))
        self._call = None
        self._state = next_state

    def _release(self, kind: type[ReasoningDelta] | type[ContentDelta], keep: int, strip: str | None,
                 final: bool) -> None:
        """Emit the first `keep` characters except trailing whitespace, which waits for more text.

        At the end of the reply that trailing whitespace is dropped.
        """
        ready = self._buf[:keep].rstrip(strip)
        self._emit(kind, ready)
        self._buf = "" if final else self._buf[len(ready):]

    def _emit(self, kind: type[ReasoningDelta] | type[ContentDelta], text: str) -> None:
        if not text:
            return
        if self._events and type(self._events[-1]) is kind:
            self._events[-1] = kind(self._events[-1].text + text)
        else:
            self._events.append(kind(text))


def parse_output(text: str, *, thinking: bool, tools: Sequence[Mapping[str, Any]] | None = None,
                 call_id: Callable[[], str] = new_call_id) -> ParsedOutput:
    """A whole reply at once, through the same parser the stream uses."""
    parser = OutputParser(thinking=thinking, tools=tools, call_id=call_id)
    events = parser.feed(text) + parser.finish()
    return ParsedOutput(
        reasoning_content="".join(e.text for e in events if isinstance(e, ReasoningDelta)),
        content="".join(e.text for e in events if isinstance(e, ContentDelta)),
        tool_calls=[e.as_openai() for e in events if isinstance(e, ToolCall)],
        finish_reason=parser.finish_reason,
    )
