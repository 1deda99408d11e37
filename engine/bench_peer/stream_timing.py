"""Concurrent streaming chat completions through the official openai client, timed as a user sees them.

Each stream is one thread with its own `openai.OpenAI` client (its own connection pool), started together
at a barrier. A stream's decode rate is its tokens after the first over the time from its first token to
its last; the round's aggregate is every token produced after the round's first token, over the time from
the first token of the first stream to the last token of the last stream (other streams' prefills, which
the server interleaves with decoding, fall inside that window, as they do for real clients).

Token counts come from the usage chunk (`stream_options.include_usage`): a chunk may hold several tokens,
or none while the detokenizer waits for a character's remaining bytes. Counted chunks stand in only
where a server sends no usage. A stream that stops before `max_tokens` (a random-weight model may pick
its end token) is reported as such, not padded. A round may ask for JSON (`response_format`): each stream then
decodes under a grammar's token masks, which the server computes on its host every step.
"""

from __future__ import annotations

import statistics
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import openai

from engine.errors import RigllmError

# Thinking off through the template, not `reasoning_effort="none"`: that sets a thinking budget of 0, which
# makes every job a masked one (its forced `</think>` is a mask), not what a plain round times.
NO_THINKING = {"chat_template_kwargs": {"enable_thinking": False}}
PROMPT = "Stream {index}: tell a long story about a lighthouse keeper and the ships she guides."
CLIENT_TIMEOUT_S = 600.0
BARRIER_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class StreamTiming:
    """One stream: when its request went out and its first and last tokens arrived (perf_counter seconds)."""

    sent: float
    first_token: float
    last_token: float
    completion_tokens: int
    prompt_tokens: int | None
    tokens_from: str  # "usage", or "chunks" where the server sent no usage
    finish_reason: str | None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """Tokens after the first over first → last token; None for a stream of fewer than two tokens."""
        span = self.last_token - self.first_token
        return (self.completion_tokens - 1) / span if self.completion_tokens > 1 and span > 0 else None


def _carries_tokens(chunk: Any) -> bool:
    """Whether a chunk's delta holds generated text (the first chunk is the role alone, the last the finish)."""
    if not chunk.choices:
        return False
    delta = chunk.choices[0].delta
    return bool(delta.content or getattr(delta, "reasoning_content", None) or delta.tool_calls)


def one_stream(base_url: str, model: str, index: int, max_tokens: int, start: threading.Barrier,
               response_format: dict[str, Any] | None = None) -> StreamTiming:
    """Stream one chat completion (greedy, thinking off, under `response_format` when given) once every stream of
    the round is ready."""
    extra = {} if response_format is None else {"response_format": response_format}
    first = last = None
    chunks, usage, finish = 0, None, None
    with openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0, timeout=CLIENT_TIMEOUT_S) as client:
        start.wait(timeout=BARRIER_TIMEOUT_S)  # if one thread failed first, the rest end here
        sent = time.perf_counter()
        stream = client.chat.completions.create(
            model=model, messages=[{"role": "user", "content": PROMPT.format(index=index)}], max_tokens=max_tokens,
            temperature=0, stream=True, stream_options={"include_usage": True}, extra_body=NO_THINKING, **extra)
        for chunk in stream:
            if _carries_tokens(chunk):
                last = time.perf_counter()
                first = first if first is not None else last
                chunks += 1
            if chunk.choices and chunk.choices[0].finish_reason:
                finish = chunk.choices[0].finish_reason
            if chunk.usage is not None:
                usage = chunk.usage
    if first is None or last is None:
        raise RigllmError(f"stream {index} produced no text (finish_reason {finish})")
    return StreamTiming(sent, first, last, usage.completion_tokens if usage else chunks,
                        usage.prompt_tokens if usage else None, "usage" if usage else "chunks", finish)


def concurrent_round(base_url: str, model: str, streams: int, max_tokens: int,
                     response_format: dict[str, Any] | None = None) -> list[StreamTiming]:
    """`streams` concurrent streams, one thread and client each; a stream's failure is raised here."""
    start = threading.Barrier(streams)
    with ThreadPoolExecutor(max_workers=streams) as pool:
        futures = [pool.submit(one_stream, base_url, model, i, max_tokens, start, response_format)
                   for i in range(streams)]
        return [f.result() for f in futures]


def summarize(timings: list[StreamTiming], max_tokens: int) -> dict[str, Any]:
    """The round's aggregate decode rate, its streams' own rates and what each stream returned."""
    window_start = min(t.first_token for t in timings)
    window = max(t.last_token for t in timings) - window_start
    total = sum(t.completion_tokens for t in timings)
    rates = [r for r in (t.decode_tokens_per_s for t in timings) if r is not None]
    return {
        "streams": len(timings),
        "aggregate_tokens_per_s": (total - 1) / window if window > 0 else None,
        "window_s": window,
        "completion_tokens": total,
        "per_stream_mean_tokens_per_s": statistics.fmean(rates) if rates else None,
        "short_streams": sum(t.completion_tokens < max_tokens for t in timings),
        "per_stream": [{"completion_tokens": t.completion_tokens, "prompt_tokens": t.prompt_tokens,
                        "tokens_from": t.tokens_from, "finish_reason": t.finish_reason,
                        "decode_tokens_per_s": t.decode_tokens_per_s, "time_to_first_token_s": t.first_token - t.sent,
                        "first_token_s": t.first_token - window_start, "last_token_s": t.last_token - window_start}
                       for t in timings],
    }
