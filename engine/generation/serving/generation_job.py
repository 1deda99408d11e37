"""One request's generation: what to generate (`Job`), and the text pipeline its tokens go through.

The scheduler feeds a job's tokens, one at a time and interleaved with other jobs, into its
`JobOutput`: detokenizer → stop strings → output parser (reasoning / content / tool calls), the same
pipeline `rigllm generate` uses. Results reach the requester through the job's `sink` as `Piece`
batches and one final `Finished` (or `Failed`); the sink is called on the scheduler's thread, so the
server's sink hops to its event loop and the desktop app's emits a Qt signal.
"""

from __future__ import annotations

import asyncio
import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.generation.detokenizer import IncrementalDetokenizer
from engine.generation.grammar.constraint import GrammarConstraint
from engine.generation.logprobs import TokenLogprob
from engine.generation.output_parser import THINK_CLOSE, OutputParser, ParseEvent
from engine.generation.sampler import SamplingParams
from engine.generation.token_mask import TokenMask, only_token
from engine.generation.tokenizer import Tokenizer
from engine.generation.serving.stop_strings import StopMatcher
from engine.vision.multimodal_prompt import MultimodalPrompt


@dataclass(frozen=True)
class LogprobEntry:
    """One generated token's logprobs with the tokens' bytes resolved; `text_offset` is where its text
    starts in the generated text (characters, before the reply parser trims it)."""

    token: bytes
    logprob: float
    top: tuple[tuple[bytes, float], ...]
    text_offset: int


@dataclass(frozen=True)
class Piece:
    """Parsed output that became final after one token, and the logprobs of the tokens whose text is
    now final (with `Job.top_logprobs` set; the two need not arrive together)."""

    events: list[ParseEvent]
    logprobs: list[LogprobEntry] = field(default_factory=list)


@dataclass(frozen=True)
class Finished:
    finish_reason: str  # "stop", "length" or "tool_calls"
    prompt_tokens: int
    completion_tokens: int
    reasoning_tokens: int
    cached_tokens: int = 0  # prompt tokens restored from a kept state instead of prefilled
    prefill_seconds: float = 0.0  # from the job's start on a slot to its first token
    decode_seconds: float = 0.0  # from the first token to the last
    image_tokens: int = 0  # prompt tokens that were image embeddings (included in prompt_tokens)
    draft_tokens: int = 0  # MTP drafts verified while generating (speculative decoding)
    accepted_draft_tokens: int = 0  # of them, the ones the model accepted


@dataclass(frozen=True)
class Failed:
    message: str
    status: int = 500  # the HTTP status a non-streamed reply gets (503: overload or shutdown, not a bug)


@dataclass(frozen=True)
class Progress:
    """Where a job stands, for a requester that shows it (the desktop app's "processing prompt N / M"):
    prompt tokens done (kept-state tokens included) of the prompt's total, tokens generated so far, and
    the seconds since the job took its slot. Reported after each prefill chunk and each generated token."""

    prompt_done: int
    prompt_tokens: int
    cached_tokens: int
    generated: int
    seconds: float


Event = Piece | Finished | Failed


@dataclass
class Job:
    """What to generate and where to send it; `cancelled` is set when the requester goes away.

    `turn_start`: how many prompt tokens precede the last turn (the chat's generation header). The
    state there is kept, so the next request of the same conversation, whose prompt extends it,
    prefills only what follows.

    `multimodal`: set when the prompt holds images; `prompt_ids` are then its ids (pads expanded) and
    the slot backend prefills them with the image rows and M-RoPE positions. Such a job neither reuses
    a kept state nor leaves one: states are keyed by token ids, and every image's pads have the same ids.
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
    top_logprobs: int | None = None  # None: no logprobs; else how many alternatives per token (0-20)
    constraint: GrammarConstraint | None = None  # JSON / forced tool call grammar: a token mask for every pick
    thinking_budget: int | None = None  # reasoning tokens after which `</think>` is forced (None: no limit)
    logit_bias: dict[int, float] | None = None  # added to the raw logits before sampling (by the backend)
    multimodal: MultimodalPrompt | None = None
    speculative: bool = True  # draft with the model's MTP head when the backend speculates (API: "speculative")
    deadline: float | None = None  # time.monotonic() past which the reply ends with "length" (API: "deadline_seconds")
    cancelled: threading.Event = field(default_factory=threading.Event)
    on_progress: Callable[[Progress], None] | None = None  # called on the scheduler's thread; must not block

    def post(self, item: Event) -> None:
        self.sink(item)


DEFAULT_MAX_EVENTS = 4096  # events one request may have waiting unread before it is dropped
DEFAULT_STALL_SECONDS = 30.0  # how long its oldest unread event may wait


class AsyncSink:
    """A sink for a requester on an asyncio loop: events are queued on that loop, thread-safely.

    The queue is bounded: a reader that stops reading (a stalled stream) while its job keeps
    generating is dropped once `max_events` wait or the oldest has waited `stall_seconds`: the job
    is cancelled (its slot frees at the scheduler's next turn) and the reader, should it resume,
    gets a `Failed` as its last event. `abort` ends a request the same way from any thread (the
    server's shutdown deadline).
    """

    def __init__(self, loop: asyncio.AbstractEventLoop, max_events: int = DEFAULT_MAX_EVENTS,
                 stall_seconds: float = DEFAULT_STALL_SECONDS):
        self.loop = loop
        self.events: asyncio.Queue[Event] = asyncio.Queue()
        self._max_events = max_events
        self._stall_seconds = stall_seconds
        self._put_times: collections.deque[float] = collections.deque()
        self._cancelled = threading.Event()  # replaced by the job's own (`bind`)
        self.ended = False  # a terminal event was queued: later ones are dropped

    def bind(self, job: Job) -> None:
        """Cancel `job` when this sink drops its reader."""
        self._cancelled = job.cancelled

    def __call__(self, item: Event) -> None:
        try:
            self.loop.call_soon_threadsafe(self._put, item)
        except RuntimeError:  # the loop has closed (the server stopped): nobody is left to read it
            pass

    def abort(self, message: str, status: int = 503) -> None:
        """End the request now with `message` (thread-safe); its job is cancelled."""
        self._cancelled.set()
        self(Failed(message, status))

    async def get(self) -> Event:
        item = await self.events.get()
        if self._put_times:
            self._put_times.popleft()
        return item

    def _put(self, item: Event) -> None:
        if self.ended:
            return
        now = time.monotonic()
        if len(self._put_times) >= self._max_events or (self._put_times and now - self._put_times[0] > self._stall_seconds):
            self._cancelled.set()
            item = Failed("the client stopped reading the response, so the request was dropped", 503)
        self.ended = not isinstance(item, Piece)
        self.events.put_nowait(item)
        self._put_times.append(now)


class JobOutput:
    """Turns a job's generated tokens into posted events and decides when the job is done.

    Logprob entries wait until their token's text has passed the stop-string matcher, so they arrive
    in order and with (or before) their text. When a stop string cuts the text, a token whose text
    starts before the cut keeps its entry and the tokens after it get none. A token that ends inside a
    multi-byte character counts as holding that character's position.
    """

    def __init__(self, job: Job, tokenizer: Tokenizer):
        self.job = job
        self._tokenizer = tokenizer
        self._detok = IncrementalDetokenizer(tokenizer)
        self._stops = StopMatcher(job.stop)
        self._parser = OutputParser(thinking=job.thinking, tools=job.tools, stream_calls=True)
        self._reasoning_open = job.thinking
        self._raw = ""
        self.generated = 0
        self.reasoning_tokens = 0
        self.draft_tokens = self.accepted_draft_tokens = 0
        self._produced = 0  # characters of generated text so far
        self._passed = 0  # characters of it the stop matcher let through
        self._held: list[tuple[int, LogprobEntry]] = []  # (character where the token's text ends, entry)
        if job.reply_prefix:
            self._reasoning_open = False  # a forced reply start closes any reasoning block first
            self._emit(self._parser.feed(job.reply_prefix))

    @property
    def reasoning_open(self) -> bool:
        """Still inside the reply's reasoning (JSON mode constrains only what follows it)."""
        return self._reasoning_open

    @property
    def complete(self) -> bool:
        """The grammar is complete (JSON closed, the forced call written), so the reply is over."""
        return self.job.constraint is not None and self.job.constraint.complete

    @property
    def masked(self) -> bool:
        """May the job's picks need a token mask (`next_mask`)? Then the backend takes one token per step."""
        return self.job.constraint is not None or self.job.thinking_budget is not None

    def next_mask(self) -> TokenMask | None:
        """The tokens the next pick may take (over the tokenizer's vocabulary; a model's padding rows beyond it
        are never allowed): only the forced token once the thinking budget is spent, the grammar's set after
        the reasoning (JSON mode constrains what follows it), else None (any token)."""
        forced = self.forced_token()
        if forced is not None:
            return only_token(forced, self._tokenizer.vocab_size)
        if self.job.constraint is None or self._reasoning_open:
            return None
        return self.job.constraint.mask(self.job.max_tokens - self.generated)

    def forced_token(self) -> int | None:
        """`</think>` once the reasoning has used the job's thinking budget, else None: closing the
        reasoning early keeps the rest of `max_tokens` for the answer (and its grammar)."""
        budget = self.job.thinking_budget
        if budget is None or not self._reasoning_open or self.reasoning_tokens < budget:
            return None
        return self._tokenizer.token_to_id(THINK_CLOSE)

    def count_drafts(self, drafted: int, accepted: int) -> None:
        """A speculative step's drafts and how many of them were accepted (for `usage` and the app)."""
        self.draft_tokens += drafted
        self.accepted_draft_tokens += accepted

    def add(self, token: int, logprob: TokenLogprob | None = None) -> bool:
        """Take one generated token (not an end token) and its logprobs (when the job asked for them);
        True when a stop string ended the output. A constrained job's grammar takes the token (it was picked
        under `next_mask`'s grammar set)."""
        if self.job.constraint is not None and not self._reasoning_open:
            self.job.constraint.accept(token)
        self.generated += 1
        if self._reasoning_open:
            self.reasoning_tokens += 1
        text = self._detok.add(token)
        if self._reasoning_open:
            self._raw += text
            self._reasoning_open = THINK_CLOSE not in self._raw
        if logprob is not None:
            start = self._produced
            self._held.append((max(start + len(text), start + 1), self._entry(logprob, start)))
        self._produced += len(text)
        visible = self._stops.feed(text)
        self._passed += len(visible)
        self._emit(self._parser.feed(visible), self._release(final=False))
        return self._stops.hit

    def finish(self, stop_reason: str, prompt_tokens: int, cached_tokens: int, prefill_seconds: float,
               decode_seconds: float) -> Finished:
        """Flush what is held back and post the final event. `stop_reason`: "stop" or "length"."""
        tail = self._stops.feed(self._detok.flush())
        tail += self._stops.flush()
        self._passed += len(tail)
        truncated = stop_reason == "length"
        self._emit(self._parser.feed(tail) + self._parser.finish(truncated), self._release(final=True))
        if self._parser.cut_call:  # the budget ended inside a call: it was dropped, so the reply is "length"
            reason = stop_reason
        else:
            reason = self._parser.finish_reason or ("stop" if self._stops.hit else stop_reason)
        images = self.job.multimodal
        done = Finished(reason, prompt_tokens, self.generated, self.reasoning_tokens, cached_tokens,
                        prefill_seconds, decode_seconds, len(images.embedding_rows) if images is not None else 0,
                        self.draft_tokens, self.accepted_draft_tokens)
        self.job.post(done)
        return done

    def _entry(self, logprob: TokenLogprob, text_offset: int) -> LogprobEntry:
        piece = self._tokenizer.token_bytes
        return LogprobEntry(piece(logprob.token), logprob.logprob,
                            tuple((piece(t), lp) for t, lp in logprob.top), text_offset)

    def _release(self, final: bool) -> list[LogprobEntry]:
        """The held entries whose text has passed the stop matcher (all that ever will, when `final`)."""
        if self._stops.hit or final:  # after a stop string, only tokens whose text starts before the cut
            ready = [entry for _, entry in self._held if not self._stops.hit or entry.text_offset < self._passed]
            self._held = []
            return ready
        n = 0
        while n < len(self._held) and self._held[n][0] <= self._passed:
            n += 1
        ready, self._held = [entry for _, entry in self._held[:n]], self._held[n:]
        return ready

    def _emit(self, events: list[ParseEvent], logprobs: list[LogprobEntry] | None = None) -> None:
        if events or logprobs:
            self.job.post(Piece(events, logprobs or []))
