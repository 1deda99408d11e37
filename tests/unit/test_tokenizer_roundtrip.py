"""encode → decode gives back the text, for a trained tokenizer and the real qwen35 vocabulary."""

from __future__ import annotations

import llama_sdist
import pytest
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import models

from engine.errors import ModelFileError
from engine.generation.pretokenizer import configure_byte_level

from tokenizer_fixtures import CHAT_TEXT, MULTILINGUAL_TEXTS, TOKENIZER_NAMES, qwen35_tokenizer, trained, trained_tokenizer

TOKENIZERS = {"trained": trained_tokenizer, "qwen35": qwen35_tokenizer}


@pytest.mark.parametrize("which", TOKENIZER_NAMES)
@pytest.mark.parametrize("parse_special", [False, True])
def test_round_trip_multilingual(which: str, parse_special: bool) -> None:
    tok = TOKENIZERS[which]()
    for text in MULTILINGUAL_TEXTS:
        ids = tok.encode(text, parse_special=parse_special)
        assert tok.decode(ids) == text, text
        assert all(0 <= i < tok.vocab_size for i in ids)
        assert not set(ids) & tok.special_ids, text


@pytest.mark.parametrize("which", TOKENIZER_NAMES)
def test_round_trip_chat_with_specials(which: str) -> None:
    tok = TOKENIZERS[which]()
    for parse_special in (True, False):
        assert tok.decode(tok.encode(CHAT_TEXT, parse_special=parse_special)) == CHAT_TEXT


@llama_sdist.needs_sdist
def test_no_bos_and_known_ids_on_real_vocab() -> None:
    tok = qwen35_tokenizer()
    assert tok.encode("\n") == [198]  # spec §3.3: "\n" = 198
    assert tok.encode("Hello world") == [9707, 1879]
    assert tok.encode("") == []


@llama_sdist.needs_sdist
def test_digits_split_one_by_one() -> None:
    tok = qwen35_tokenizer()
    ids = tok.encode("2026")
    assert [tok.decode([i]) for i in ids] == ["2", "0", "2", "6"]


@pytest.mark.parametrize(("pre", "pieces"), [("qwen35", 1), ("qwen2", 2)])
def test_combining_marks_split_per_pre_tokenizer(pre: str, pieces: int) -> None:
    """qwen35 keeps `e + U+0301` with its word (spec §10 `\\p{M}`); qwen2 cuts the mark off."""
    hf = HFTokenizer(models.BPE())
    configure_byte_level(hf, pre)
    assert len(hf.pre_tokenizer.pre_tokenize_str("cafe\u0301s")) == pieces


def test_unsupported_pre_tokenizer_is_a_model_file_error() -> None:
    with pytest.raises(ModelFileError, match="pre-tokenizer 'llama-bpe' is not supported"):
        configure_byte_level(HFTokenizer(models.BPE()), "llama-bpe")


def test_token_lookup_both_ways() -> None:
    tok = trained_tokenizer()
    t = trained()
    for i in (0, 100, len(t.tokens) - 1):
        assert tok.token_to_id(tok.id_to_token(i)) == i
    assert tok.token_to_id("<|im_end|>") == t.token_id("<|im_end|>")
    assert tok.token_to_id("definitely not a token") is None
    assert tok.vocab_size == len(t.tokens) == 1024
