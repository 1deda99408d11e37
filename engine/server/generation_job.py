"""One request's generation, run on the worker thread: tokens → text → stop strings → parsed events.

The pipeline is the one `rigllm generate` uses (TokenStream, IncrementalDetokenizer, OutputParser);
results travel to the request's event loop as `Piece` batches and one final `Finished` (or `Failed`).
"""

from __future__ import annotations

import asyncio
import threading
from dataclasses import dataclass, field
from typing import Any

from engine.generation.backend import Backend
from engine.generation.detokenizer import IncrementalDetokenizer
from engine.generation.output_parser import THINK_CLOSE, OutputParser, ParseEvent
from engine.generation.sampler import Sampler, SamplingParams
from engine.generation.token_stream import TokenStream
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


@dataclass(frozen=True)
class Failed:
    message: str


@dataclass
class Job:
    """What to generate and where to send it; `cancelled` is set when the client goes away."""

    prompt_ids: list[int]
    params: SamplingParams
    max_tokens: int
    thinking: bool
    tools: list[dict[str, Any]] | None
    stop: list[str]
    loop: asyncio.AbstractEventLoop
    events: asyncio.Queue = field(default_factory=asyncio.Queue)
    cancelled: threading.Event = field(default_factory=threading.Event)

    def post(self, item: Piece | Finished | Failed) -> None:
        self.loop.call_soon_threadsafe(self.events.put_nowait, item)


def run_job(backend: Backend, tokenizer: Tokenizer, job: Job) -> Finished:
    """Generate until an end token, a stop string, max_tokens or cancellation; post pieces as they come."""
    stream = TokenStream(backend, job.prompt_ids, Sampler(job.params), job.max_tokens, tokenizer.eos_ids)
    detok = IncrementalDetokenizer(tokenizer)
    stops = StopMatcher(job.stop)
    parser = OutputParser(thinking=job.thinking, tools=job.tools)
    reasoning_open, reasoning_tokens, raw = job.thinking, 0, ""

    def emit(events: list[ParseEvent]) -> None:
        if events:
            job.post(Piece(events))

    for token in stream:
        if reasoning_open:
            reasoning_tokens += 1
        text = detok.add(token)
        if reasoning_open:
            raw += text
            reasoning_open = THINK_CLOSE not in raw
        emit(parser.feed(stops.feed(text)))
        if stops.hit or job.cancelled.is_set():
            break
    tail = stops.feed(detok.flush())
    emit(parser.feed(tail + stops.flush()) + parser.finish())
    stats = stream.stats
    reason = parser.finish_reason or ("stop" if stops.hit else stats.stop_reason)
    return Finished(reason, stats.prompt_tokens, stats.generated_tokens, reasoning_tokens)
