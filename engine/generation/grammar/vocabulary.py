"""The model's vocabulary as llguidance sees it: every token's bytes, which ids are special, which end.

llguidance never matches a special token against grammar text, so only control tokens (the ones the
detokenizer drops, like `<|im_end|>`) are special here; `<tool_call>` and the like are the text they spell.

Building it walks all tokens once (about a second for a 248K vocabulary, measured on the dev box), so
it is made once per `Tokenizer` and kept beside it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Sequence

import llguidance

from engine.generation.tokenizer import Tokenizer

_made: "weakref.WeakKeyDictionary[Tokenizer, llguidance.LLTokenizer]" = weakref.WeakKeyDictionary()
_lock = threading.Lock()


class _Tokens:
    """The duck-typed tokenizer `llguidance.TokenizerWrapper` wraps (its attributes and `__call__`)."""

    def __init__(self, tokenizer: Tokenizer):
        self._tokenizer = tokenizer
        self.tokens: Sequence[bytes] = [tokenizer.token_bytes(i) for i in range(tokenizer.vocab_size)]
        # Control tokens only: user-defined ones (`<tool_call>`, `</think>`) are text the grammars spell.
        self.special_token_ids = sorted(i for i in tokenizer.special_ids if not tokenizer.token_bytes(i, True))
        self.eos_token_id = min(tokenizer.eos_ids) if tokenizer.eos_ids else None
        self.bos_token_id = None

    def __call__(self, text: str) -> list[int]:
        """llguidance tokenizes a grammar's forced text with this and allows its first token, so the
        text's `<tool_call>` must become that one token, as the model writes it."""
        return self._tokenizer.encode(text, parse_special=True)


def grammar_vocabulary(tokenizer: Tokenizer) -> llguidance.LLTokenizer:
    """llguidance's view of `tokenizer`, built on first use; every end-of-generation id ends a grammar."""
    with _lock:
        made = _made.get(tokenizer)
        if made is None:
            if not tokenizer.eos_ids:
                raise ValueError("constrained decoding needs a vocabulary with an end-of-generation token")
            wrapper = llguidance.TokenizerWrapper(_Tokens(tokenizer))
            made = _made[tokenizer] = llguidance.LLTokenizer(wrapper, eos_token=sorted(tokenizer.eos_ids))
        return made
