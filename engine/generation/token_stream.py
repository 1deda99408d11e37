"""The autoregressive loop: prefill the prompt, then sample and feed back one token at a time.

Kept separate from text handling so the server, the app and the CLI share one loop and one set of
stop rules, and so timing (prefill vs decode tokens/s) is measured in one place.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Collection, Iterator, Sequence


from engine.generation.backend import Backend
from engine.generation.sampler import Sampler


@dataclass
class StreamStats:
    """Counts and wall times of one generation; filled in as the stream is consumed."""

    prompt_tokens: int = 0
    generated_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""  # "stop" (an end-of-generation token) or "length" (max_tokens reached)

    @property
    def prefill_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds > 0 else 0.0

    @property
    def decode_tokens_per_second(self) -> float:
        """Generated tokens over the time spent sampling and running decode steps (consumer time excluded)."""
        return self.generated_tokens / self.decode_seconds if self.decode_seconds > 0 else 0.0


@dataclass
class TokenStream:
    """Iterate to get generated token ids; end-of-generation tokens stop the stream and are not yielded."""

    backend: Backend
    prompt_ids: Sequence[int]
    sampler: Sampler
    max_tokens: int
    stop_ids: Collection[int]
    stats: StreamStats = field(default_factory=StreamStats)

    def __iter__(self) -> Iterator[int]:
        if not self.prompt_ids:
            raise ValueError("the prompt must contain at least one token")
        sequence = self.backend.new_sequence()
        history = list(self.prompt_ids)
        start = time.perf_counter()
        logits = self.backend.forward_last(self.prompt_ids, sequence)
        self.stats.prompt_tokens = len(self.prompt_ids)
        self.stats.prefill_seconds = time.perf_counter() - start
        self.stats.stop_reason = "length"
        on_device = getattr(self.backend, "decode_on_device", None)
        if on_device is not None:
            yield from self._on_device(on_device, sequence, history)
            return
        for step in range(self.max_tokens):
            start = time.perf_counter()
            token = self.sampler.sample(logits, history)
            if token in self.stop_ids:
                self.stats.stop_reason = "stop"
                self.stats.decode_seconds += time.perf_counter() - start
                return
            history.append(token)
            if step + 1 < self.max_tokens:
                logits = self.backend.forward_last([token], sequence)
            self.stats.decode_seconds += time.perf_counter() - start
            self.stats.generated_tokens += 1
            yield token

    def _on_device(self, decode_on_device, sequence, history: list[int]) -> Iterator[int]:
        """The backend chooses tokens itself (only ids cross PCIe); same stop rules and stats."""
        tokens = iter(decode_on_device(sequence, self.sampler.params, history, self.max_tokens, self.stop_ids))
        while True:
            start = time.perf_counter()
            token = next(tokens, None)
            self.stats.decode_seconds += time.perf_counter() - start
            if token is None:
                break
            self.stats.generated_tokens += 1
            yield token
        if self.stats.generated_tokens < self.max_tokens:
            self.stats.stop_reason = "stop"
