"""One request's generation: what to generate (`Job`), and the text pipeline its tokens go through.

The scheduler feeds a job's tokens, one at a time and interleaved with other jobs, into its
`JobOutput`: detokenizer → stop strings → output parser (reasoning / content / tool calls), the same
pipeline `rigllm generate` uses. Results reach the requester through the job's `sink` as `Piece`
batches and one final `Finished` (or `Failed`); the sink is called on the scheduler's thread, so the
server's sink hops to its event loop and the desktop app's emits a Qt signal.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.generation.detokenizer import IncrementalDetokenizer
from engine.generation.output_parser import THINK_CLOSE, OutputParser, ParseEvent
from engine.generation.sampler import SamplingParams
from engine.generation.tokenizer import Tokenizer
from engine.server.stop_strings import StopMatcher


@dataclass(frozen=True)
class Piece:
    """Parsed output that became final after one token."""

    events: list[ParseEvent]


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop", "length" or "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int = 0  # prompt tokens restored from a kept state instead of prefilled
    prefill_seconds: float = 0.0  # from the job's start on a slot to its first token
    decode_seconds: float = 0.0  # from the first token to the last


@dataclass(frozen=True)
class Failed:
    message: str


Event = Piece | Finished | Failed


@dataclass
class Job:
    """What to generate and where to send it; `cancelled` is set when the requester goes away.

    `turn_start`: how many prompt tokens precede the last turn (the chat's generation header). The
    state there is kept, so the next request of the same conversation, whose prompt extends it,
    prefills only what follows.
    """

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    thinking: bool
    tools: list[dict[str, Any]] | None
    stop: list[str]
    sink: Callable[[Event], None]
    turn_start: int = 0
    reply_prefix: str = ""  # the reply's forced start, part of the prompt: parsed as output, not counted
    cancelled: threading.Event = field(default_factory=threading.Event)

    def post(self, item: Event) -> None:
        self.sink(item)


class AsyncSink:
    """A sink for a requester on an asyncio loop: events are queued on that loop, thread-safely."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()

    def __call__(self, item: Event) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


class JobOutput:
    """Turns a job's generated tokens into posted events and decides when the job is done."""

    def __init__(self, job: Job, tokenizer: Tokenizer):
        self.job = job
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stops = StopMatcher(job.stop)
        self._parser = OutputParser(thinking=job.thinking, tools=job.tools)
        self._reasoning_open = job.thinking
        self._raw = ""
        self.generated = 0
        self.reasoning_tokens = 0
        if job.reply_prefix:
            self._reasoning_open = False  # a forced reply start closes any reasoning block first
            self._emit(self._parser.feed(job.reply_prefix))

    def add(self, token: int) -> bool:
        """Take one generated token (not an end token); True when a stop string ended the output."""
        self.generated += 1
        if self._reasoning_open:
            self.reasoning_tokens += 1
        text = self._detok.add(token)
        if self._reasoning_open:
            self._raw += text
            self._reasoning_open = THINK_CLOSE not in self._raw
        self._emit(self._parser.feed(self._stops.feed(text)))
        return self._stops.hit

    def finish(self, stop_reason: str, prompt_tokens: int, cached_tokens: int, prefill_seconds: float,
               decode_seconds: float) -> Finished:
        """Flush what is held back and post the final event. `stop_reason`: "stop" or "length"."""
        tail = self._stops.feed(self._detok.flush())
        self._emit(self._parser.feed(tail + self._stops.flush()) + self._parser.finish())
        reason = self._parser.finish_reason or ("stop" if self._stops.hit else stop_reason)
        done = Finished(reason, prompt_tokens, self.generated, self.reasoning_tokens, cached_tokens,
                        prefill_seconds, decode_seconds)
        self.job.post(done)
        return done

    def _emit(self, events: list[ParseEvent]) -> None:
        if events:
            self.job.post(Piece(events))
