"""Streaming token ids → text that never shows a half-finished character.

A byte-level BPE token can end in the middle of a UTF-8 sequence (emoji and CJK are often split across
two or three tokens). Re-decoding the whole history each step would fix that at O(n) per token; instead
the bytes of each token go into Python's incremental UTF-8 decoder, which returns every complete
character at once and keeps only the unfinished tail (at most 3 bytes) for the next token. Invalid
bytes become U+FFFD exactly as `Tokenizer.decode` would render them, so the concatenated stream equals
`decode(ids)`.
"""

from __future__ import annotations

import codecs

from engine.generation.tokenizer import Tokenizer


class IncrementalDetokenizer:
    """Feed one id at a time with `add`; each call returns the text that became final; `flush` ends it."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = False):
        self._tokenizer = tokenizer
        self._skip_special = skip_special
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def add(self, token_id: int) -> str:
        """The new final text after `token_id` (may be "" while a multi-byte character is incomplete)."""
        return self._decoder.decode(self._tokenizer.token_bytes(token_id, self._skip_special))

    def flush(self) -> str:
        """Whatever is still held back, an unfinished sequence rendered as U+FFFD; resets the stream."""
        text = self._decoder.decode(b"", final=True)
        self._decoder.reset()
        return text
