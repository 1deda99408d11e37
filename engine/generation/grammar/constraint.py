"""One job's grammar while it decodes: a bitset of the allowed tokens per step, and the token taken.

The interface is "a bitset per step" (int32 words, bit `i % 32` of word `i // 32` set when token `i` is
allowed, llguidance's layout): the step's token mask (engine.generation.token_mask), which the backend
applies where it samples (the CUDA backend uploads the words to the card).
"""

from __future__ import annotations

import llguidance
import llguidance.numpy
import numpy as np

from engine.generation.grammar.json_closing import JsonCloser
from engine.generation.token_mask import TokenMask, allowed_tokens, mask_of, mask_words


class GrammarError(ValueError):
    """The grammar cannot be compiled (a bad schema, an unsupported construct)."""


class GrammarConstraint:
    """An llguidance matcher over the job's vocabulary; `grammar` is llguidance's JSON or Lark text;
    `closer`, for a JSON grammar, narrows the bitset near the end of the budget so the value closes."""

    def __init__(self, vocabulary: llguidance.LLTokenizer, grammar: str, vocab_size: int,
                 closer: JsonCloser | None = None):
        self._closer = closer
        self._matcher = llguidance.LLMatcher(vocabulary, grammar, log_level=0)
        if self._matcher.is_error():
            raise GrammarError(self._matcher.get_error())
        self.vocab_size = vocab_size
        self._words = llguidance.numpy.allocate_token_bitmask(1, max(vocab_size, vocabulary.vocab_size))

    @property
    def complete(self) -> bool:
        """The grammar can take no more tokens (e.g. the JSON object closed), so the reply is over."""
        return self._matcher.is_stopped()

    def bitset(self) -> np.ndarray:
        """The allowed next tokens as int32 words (a view, valid until the next call)."""
        llguidance.numpy.fill_next_token_bitmask(self._matcher, self._words, 0)
        if self._matcher.is_error():
            raise GrammarError(self._matcher.get_error())
        return self._words[0]

    def mask(self, remaining: int) -> TokenMask:
        """The step's token mask over `vocab_size` tokens (a new array); `remaining`: tokens left, this one
        included (near the end a JSON closer narrows it so the value can still close)."""
        words = self.bitset()[: mask_words(self.vocab_size)].view(np.uint32).copy()
        if self.vocab_size % 32:
            words[-1] &= np.uint32((1 << (self.vocab_size % 32)) - 1)
        if self._closer is None or not self._closer.tight(remaining):
            return words
        return mask_of(self._closer.narrow(allowed_tokens(words, self.vocab_size), remaining))

    def allowed(self, remaining: int) -> np.ndarray:
        """`mask` as one bool per token."""
        return allowed_tokens(self.mask(remaining), self.vocab_size)

    def accept(self, token: int) -> None:
        """Advance past the token the job took (it must be one the last bitset allowed)."""
        if not self._matcher.consume_token(token):
            raise GrammarError(f"token {token} is not allowed by the grammar: {self._matcher.get_error()}")
        if self._closer is not None:
            self._closer.accept(token)
