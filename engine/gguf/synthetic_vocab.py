"""A generated full-size Qwen3.5 vocabulary (248,320 ids) for synthetic full-size model files.

Synthetic GGUFs must look like real ones to every consumer (tokenizer, template, stop tokens,
memory planner), so the vocabulary has the real layout (contracts.md "Model files"): ids 0-255
are the 256 byte-level symbols in GPT-2 order (as in Qwen's vocabulary), then BPE tokens up to
id 248043, then the 33 special tokens at their real ids 248044-248076 (spec §3.3), then
`[PAD<id>]` fillers (type UNUSED) up to 248320, as llama.cpp's converter pads.

The BPE part is made, not learned: every merge appends one lowercase letter to an existing token
("Ġ" = space, a-z and A-Z start words), breadth first, so all merges are valid (both halves are
earlier tokens), the merge ranks follow token ids, and ordinary English text tokenizes into
multi-letter tokens. Any text tokenizes, because every byte has its own token.
"""

from __future__ import annotations

import string

from gguf import TokenType

from engine.model.special_tokens import QWEN35_FIRST_SPECIAL_ID, QWEN35_SPECIAL_TOKENS, special_token_type
from engine.gguf.vocab import Vocab

QWEN35_VOCAB_SIZE = 248_320
# Ids 248070-248076 are reserved specials whose names spec §3.3 leaves UNCONFIRMED; these are the
# audio/TTS placeholder names the Qwen3 omni-style vocabularies use at the same relative position.
RESERVED_SPECIAL_TOKENS: tuple[str, ...] = (
    "<|audio_start|>",
    "<|audio_end|>",
    "<tts_pad>",
    "<tts_text_bos>",
    "<tts_text_eod>",
    "<tts_text_bos_single>",
    "<|audio_pad|>",
)
ALL_SPECIAL_TOKENS = QWEN35_SPECIAL_TOKENS + RESERVED_SPECIAL_TOKENS


def byte_symbols() -> list[str]:
    """The 256 byte-level symbols in GPT-2's order: printable bytes as themselves, the rest shifted past 255."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + list(range(0xAE, 0xFF + 1))
    symbols = [chr(b) for b in printable]
    shifted = 0
    for b in range(256):
        if b not in printable:
            symbols.append(chr(256 + shifted))
            shifted += 1
    return symbols


def generated_merges(n_merges: int) -> tuple[list[str], list[str]]:
    """`n_merges` new tokens and their `"left right"` merge strings, breadth first by token length."""
    starts = ["\u0120"] + list(string.ascii_lowercase) + list(string.ascii_uppercase)
    letters = string.ascii_lowercase
    tokens: list[str] = []
    merges: list[str] = []
    frontier = starts
    while len(tokens) < n_merges:
        grown: list[str] = []
        for left in frontier:
            for right in letters:
                tokens.append(left + right)
                merges.append(f"{left} {right}")
                grown.append(left + right)
                if len(tokens) == n_merges:
                    return tokens, merges
        frontier = grown
    return tokens, merges


def synthetic_qwen35_vocab(chat_template: str | None) -> Vocab:
    """The full-size generated vocabulary, with Qwen3.5's eos/pad ids and `add_bos_token = false`."""
    symbols = byte_symbols()
    bpe_tokens, merges = generated_merges(QWEN35_FIRST_SPECIAL_ID - len(symbols))
    first_pad = QWEN35_FIRST_SPECIAL_ID + len(ALL_SPECIAL_TOKENS)
    tokens = symbols + bpe_tokens + list(ALL_SPECIAL_TOKENS) + [f"[PAD{i}]" for i in range(first_pad, QWEN35_VOCAB_SIZE)]
    types = (
        [int(TokenType.NORMAL)] * (len(symbols) + len(bpe_tokens))
        + [int(special_token_type(t)) for t in ALL_SPECIAL_TOKENS]
        + [int(TokenType.UNUSED)] * (QWEN35_VOCAB_SIZE - first_pad)
    )
    return Vocab(
        tokens=tokens,
        token_types=types,
        merges=merges,
        special_ids={
            "eos": QWEN35_FIRST_SPECIAL_ID + QWEN35_SPECIAL_TOKENS.index("<|im_end|>"),
            "pad": QWEN35_FIRST_SPECIAL_ID + QWEN35_SPECIAL_TOKENS.index("<|endoftext|>"),
        },
        add_special={"bos": False},
        chat_template=chat_template,
    )
