"""The incremental detokenizer: token by token it yields exactly decode(ids), never a broken character."""

from __future__ import annotations

import pytest
from gguf import TokenType
from tokenizer_fixtures import MULTILINGUAL_TEXTS, TOKENIZER_NAMES, qwen35_tokenizer, trained, trained_tokenizer

from engine.generation.detokenizer import IncrementalDetokenizer
from engine.generation.tokenizer import Tokenizer

TOKENIZERS = {"trained": trained_tokenizer, "qwen35": qwen35_tokenizer}


def _stream(tok: Tokenizer, ids: list[int], skip_special: bool = False) -> list[str]:
    detok = IncrementalDetokenizer(tok, skip_special=skip_special)
    pieces = [detok.add(i) for i in ids]
    pieces.append(detok.flush())
    return pieces


@pytest.mark.parametrize("which", TOKENIZER_NAMES)
def test_stream_equals_decode_without_replacement_chars(which: str) -> None:
    tok = TOKENIZERS[which]()
    split_chars = 0
    for text in MULTILINGUAL_TEXTS:
        ids = tok.encode(text)
        pieces = _stream(tok, ids)
        assert "".join(pieces) == tok.decode(ids) == text
        assert not any("\ufffd" in p for p in pieces)
        split_chars += sum(1 for i in ids if not _is_valid_utf8(tok.token_bytes(i)))
    assert split_chars > 0, "no token cut a character, so the hold-back path was not exercised"


def _is_valid_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def test_emoji_split_across_tokens_is_emitted_when_complete() -> None:
    tok = trained_tokenizer()
    ids = tok.encode("🦙")
    assert len(ids) > 1  # the trained vocabulary has no single token for it
    pieces = _stream(tok, ids)
    assert pieces[:-2] == [""] * (len(ids) - 1) and pieces[-2] == "🦙" and pieces[-1] == ""


def test_held_back_bytes_stay_bounded() -> None:
    """O(1) per token: at most an unfinished 3-byte tail is ever kept, however long the stream."""
    tok = trained_tokenizer()
    detok = IncrementalDetokenizer(tok)
    for i in tok.encode("日本語🦙👩\u200d💻" * 200):
        detok.add(i)
        assert len(detok._decoder.getstate()[0]) <= 3


def test_invalid_bytes_render_like_decode() -> None:
    """Byte-level tokens can spell invalid UTF-8; the stream shows U+FFFD exactly where decode does."""
    tok = trained_tokenizer()
    byte = {tok.token_bytes(i): i for i in range(tok.vocab_size) if len(tok.token_bytes(i)) == 1}
    cases = [
        [byte[b"a"], byte[b"\x80"], byte[b"b"]],  # stray continuation byte
        [byte[b"\xe6"], byte[b"\x97"], byte[b"a"]],  # truncated 3-byte sequence, then ASCII
        [byte[b"a"], byte[b"\xf0"], byte[b"\x9f"]],  # stream ends mid-character: flush emits U+FFFD
    ]
    for ids in cases:
        assert "".join(_stream(tok, ids)) == tok.decode(ids)
        assert "\ufffd" in tok.decode(ids)


def test_skip_special_stream_matches_decode() -> None:
    tok = trained_tokenizer()
    ids = tok.encode("<|im_start|>assistant\n<think>\n🦙\n</think>\n\nok<|im_end|>")
    assert "".join(_stream(tok, ids, skip_special=True)) == tok.decode(ids, skip_special=True)
    assert "".join(_stream(tok, ids)) == tok.decode(ids)


def test_flush_resets_for_the_next_stream() -> None:
    tok = trained_tokenizer()
    detok = IncrementalDetokenizer(tok)
    first = tok.encode("🦙")
    detok.add(first[0])
    assert detok.flush() == "\ufffd"
    assert "".join(detok.add(i) for i in first) == "🦙"


def test_unused_token_adds_nothing() -> None:
    t = trained()
    tok = Tokenizer(t.tokens + ["[PAD1024]"], t.token_types + [int(TokenType.UNUSED)], t.merges, t.pre)
    assert IncrementalDetokenizer(tok).add(1024) == ""
