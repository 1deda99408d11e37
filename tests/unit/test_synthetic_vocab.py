"""`engine.fixtures.synthetic_vocab`: the generated 248,320-token vocabulary is a working byte-level BPE."""

from __future__ import annotations

import pytest
from gguf import TokenType
from tokenizers import Tokenizer, models

from engine.generation.pretokenizer import configure_byte_level
from engine.fixtures.synthetic_vocab import ALL_SPECIAL_TOKENS, byte_symbols, generated_merges, synthetic_qwen35_vocab


@pytest.fixture(scope="module")
def vocab():
    return synthetic_qwen35_vocab("TEMPLATE")


def test_layout(vocab):
    assert len(vocab.tokens) == 248_320 and len(set(vocab.tokens)) == 248_320
    assert vocab.tokens[:256] == byte_symbols() and len(set(byte_symbols())) == 256
    assert vocab.tokens[0] == "!" and vocab.tokens[220] == "\u0120"  # as in Qwen's vocabulary: ' ' -> 'Ġ' is id 220
    assert vocab.tokens[248044:248077] == list(ALL_SPECIAL_TOKENS) and len(ALL_SPECIAL_TOKENS) == 33
    assert vocab.token_id("<|im_end|>") == 248046 and vocab.token_id("<think>") == 248068
    assert vocab.token_id("<|file_sep|>") == 248065 and vocab.token_id("</tool_response>") == 248067
    assert vocab.special_ids == {"eos": 248046, "pad": 248044} and vocab.chat_template == "TEMPLATE"
    assert set(vocab.token_types[:248044]) == {TokenType.NORMAL}
    assert set(vocab.token_types[248077:]) == {TokenType.UNUSED}


def test_merges_are_valid_and_ranked_by_id(vocab):
    index = {t: i for i, t in enumerate(vocab.tokens)}
    assert len(vocab.merges) == 248044 - 256
    for rank, merge in enumerate(vocab.merges):
        left, right = merge.split(" ")
        merged = index[left + right]
        assert merged == 256 + rank
        assert index[left] < merged and index[right] < merged


def test_any_text_tokenizes_and_round_trips(vocab):
    bpe = models.BPE(vocab={t: i for i, t in enumerate(vocab.tokens[:248044])},
                     merges=[tuple(m.split(" ")) for m in vocab.merges])
    tok = Tokenizer(bpe)
    configure_byte_level(tok, "qwen35")
    for text in ["the quick brown fox jumps", "Hello World", "naïve café 東京 🚀\n\tx=1;", ""]:
        ids = tok.encode(text).ids
        assert tok.decode(ids) == text
    assert len(tok.encode(" the quick brown").ids) < len(" the quick brown") / 2  # multi-letter tokens


def test_generated_merges_count_is_exact():
    tokens, merges = generated_merges(1000)
    assert len(tokens) == len(merges) == 1000 and tokens[0] == "\u0120a" and merges[0] == "\u0120 a"
