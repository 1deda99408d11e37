"""Closing a JSON reply before `max_tokens` ends, on top of the grammar's bitset.

llguidance keeps every token valid but cannot say how many tokens the shortest completion needs, so
a model that rambles inside a string would be cut mid-object. `JsonCloser` tracks the nesting depth of
the text so far (brackets outside strings) and, once the tokens left are no more than what closing
needs, narrows the allowed tokens to the first non-empty class of: an end token, `"`, `}` or `]`, `:`,
`0`. None of them opens a container, so each level closes within six tokens (`"` `"` `:` `0` `}` at
worst, after a key had to be written). A schema may still demand properties the classes cannot write
(the grammar then allows only those, a key and a literal like `false`: about ten tokens in a small
vocabulary), so the reserve is `STEPS_PER_LEVEL` = 16 per open level, plus one.
"""

from __future__ import annotations

import numpy as np

from engine.generation.tokenizer import Tokenizer

STEPS_PER_LEVEL = 16
_CLASSES = (b'"', b"}]", b":", b"0")


class JsonCloser:
    def __init__(self, tokenizer: Tokenizer):
        self._classes = [self._ids(tokenizer, chars) for chars in _CLASSES]
        self._ends = np.array(sorted(tokenizer.eos_ids), dtype=np.int64)
        self._tokenizer = tokenizer
        self._depth = 0
        self._in_string = False
        self._escaped = False

    @staticmethod
    def _ids(tokenizer: Tokenizer, chars: bytes) -> np.ndarray:
        ids = [i for c in chars for i in [tokenizer.encode(chr(c), parse_special=False)] if len(i) == 1]
        return np.array([i[0] for i in ids], dtype=np.int64)

    def tight(self, remaining: int) -> bool:
        """Are `remaining` tokens (this one included) few enough that `narrow` may cut the allowed set?"""
        return remaining <= STEPS_PER_LEVEL * (self._depth + 1) + 1

    def narrow(self, allowed: np.ndarray, remaining: int) -> np.ndarray:
        """`allowed` narrowed to a closing class when `remaining` tokens (this one included) are tight."""
        if not self.tight(remaining):
            return allowed
        for ids in (self._ends, *self._classes):
            ids = ids[ids < allowed.size]
            hit = ids[allowed[ids]]
            if hit.size:
                narrowed = np.zeros_like(allowed)
                narrowed[hit] = True
                return narrowed
        return allowed

    def accept(self, token: int) -> None:
        """Track depth and string state over the token's bytes."""
        for byte in self._tokenizer.token_bytes(token):
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif byte == 0x5C:  # backslash
                    self._escaped = True
                elif byte == 0x22:
                    self._in_string = False
            elif byte == 0x22:
                self._in_string = True
            elif byte in b"{[":
                self._depth += 1
            elif byte in b"}]":
                self._depth -= 1
