"""Train a small byte-level BPE tokenizer that behaves like Qwen3.5's, for tiny test models and the demo.

The learned vocabulary comes first, then Qwen3.5's special tokens (spec §3.3, in id order) exactly as
the real vocabulary has them after its BPE part, then `[PAD<id>]` placeholders up to `vocab_size` when
the corpus is too small to learn that many merges (the same filler llama.cpp's converter writes).
Training is deterministic: the `tokenizers` BPE trainer breaks count ties by pair ids, and the
initial alphabet is the fixed 256-symbol byte-level alphabet, so the same corpus gives the same
vocabulary and merges in every process.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass

from gguf import TokenType
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers, trainers

from engine.errors import RigllmError
from engine.generation.pretokenizer import configure_byte_level
from engine.model.special_tokens import QWEN35_SPECIAL_TOKENS, special_token_type

BYTE_ALPHABET_SIZE = 256
MIN_VOCAB_SIZE = BYTE_ALPHABET_SIZE + len(QWEN35_SPECIAL_TOKENS)


@dataclass(frozen=True)
class TrainedTokenizer:
    """A trained tokenizer plus the arrays a GGUF's `tokenizer.ggml.*` keys need.

    `tokens[i]` / `token_types[i]` describe id i (`len(tokens) == vocab_size`); `merges` are
    `"a b"` strings in rank order. `tokenizer` is the `tokenizers` object (specials registered as
    added tokens, no `[PAD]` fillers) — save it as `tokenizer.json` for an HF model folder.
    """

    tokenizer: Tokenizer
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str = "qwen35"

    def token_id(self, text: str) -> int:
        """The id of a token string (e.g. `"<|im_end|>"` for the GGUF's eos id)."""
        return self.tokens.index(text)


def train_byte_level_bpe(corpus: Iterable[str], vocab_size: int) -> TrainedTokenizer:
    """Learn byte-level BPE tokens from `corpus`, then append the specials (and fillers if needed).

    `vocab_size` is the total token count (the model's embedding rows), specials and fillers included;
    at most `vocab_size - len(QWEN35_SPECIAL_TOKENS)` tokens are learned.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise RigllmError(
            f"vocab_size {vocab_size} is too small: the 256 byte tokens and "
            f"{len(QWEN35_SPECIAL_TOKENS)} special tokens need at least {MIN_VOCAB_SIZE}"
        )
    tokenizer = Tokenizer(models.BPE())
    configure_byte_level(tokenizer, "qwen35")
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(QWEN35_SPECIAL_TOKENS),
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(list(corpus), trainer=trainer)
    for text in QWEN35_SPECIAL_TOKENS:
        added = AddedToken(text, special=special_token_type(text) == TokenType.CONTROL, normalized=False)
        tokenizer.add_tokens([added])

    by_id = {i: t for t, i in tokenizer.get_vocab(with_added_tokens=True).items()}
    n_real = len(by_id)
    if sorted(by_id) != list(range(n_real)):
        raise AssertionError("trained vocabulary ids are not contiguous")
    tokens = [by_id[i] for i in range(n_real)] + [f"[PAD{i}]" for i in range(n_real, vocab_size)]
    specials = set(QWEN35_SPECIAL_TOKENS)
    token_types = [
        int(special_token_type(t)) if t in specials else int(TokenType.NORMAL) for t in tokens[:n_real]
    ] + [int(TokenType.UNUSED)] * (vocab_size - n_real)
    return TrainedTokenizer(tokenizer, tokens, token_types, _merges_of(tokenizer))


def _merges_of(tokenizer: Tokenizer) -> list[str]:
    """The BPE merges as GGUF stores them; `tokenizers` serialises them as pairs (≥0.20) or strings."""
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    return [m if isinstance(m, str) else f"{m[0]} {m[1]}" for m in merges]
