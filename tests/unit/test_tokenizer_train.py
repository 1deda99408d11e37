"""The tokenizer trainer: deterministic, Qwen3.5 layout (learned, specials, fillers), GGUF-consistent."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from gguf import TokenType
from tokenizer_fixtures import CHAT_TEXT, MULTILINGUAL_TEXTS, tokenizer_from_trained, trained
from tokenizers import pre_tokenizers

from engine.errors import RigllmError
from engine.generation.demo_corpus import DEMO_CORPUS
from engine.model.special_tokens import QWEN35_SPECIAL_TOKENS
from engine.generation.train_tokenizer import MIN_VOCAB_SIZE, train_byte_level_bpe

_DUMP = (
    "import json; from engine.generation.demo_corpus import DEMO_CORPUS; "
    "from engine.generation.train_tokenizer import train_byte_level_bpe as t; "
    "r = t(DEMO_CORPUS, 1024); print(json.dumps([r.tokens, r.token_types, r.merges]))"
)


def test_training_is_deterministic_across_processes() -> None:
    here = trained()
    again = train_byte_level_bpe(DEMO_CORPUS, 1024)
    assert (again.tokens, again.token_types, again.merges) == (here.tokens, here.token_types, here.merges)
    out = subprocess.run([sys.executable, "-c", _DUMP], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == [here.tokens, here.token_types, here.merges]


def test_layout_learned_then_specials_then_fillers() -> None:
    t = train_byte_level_bpe(DEMO_CORPUS, 4096)  # more than the corpus can fill
    n_learned = 256 + len(t.merges)
    n_specials = len(QWEN35_SPECIAL_TOKENS)
    assert len(t.tokens) == len(t.token_types) == 4096
    assert t.tokens[n_learned : n_learned + n_specials] == list(QWEN35_SPECIAL_TOKENS)
    assert set(t.token_types[:n_learned]) == {int(TokenType.NORMAL)}
    for text in QWEN35_SPECIAL_TOKENS:
        want = TokenType.CONTROL if text.startswith("<|") else TokenType.USER_DEFINED
        assert t.token_types[t.token_id(text)] == want
    fillers = range(n_learned + n_specials, 4096)
    assert [t.tokens[i] for i in fillers] == [f"[PAD{i}]" for i in fillers]
    assert {t.token_types[i] for i in fillers} == {int(TokenType.UNUSED)}


def test_small_vocab_is_filled_exactly_by_learned_tokens() -> None:
    t = trained()
    assert len(t.tokens) == 1024 and t.tokens[-1] == QWEN35_SPECIAL_TOKENS[-1]
    assert 256 + len(t.merges) == 1024 - len(QWEN35_SPECIAL_TOKENS)


def test_merges_and_byte_alphabet_fit_the_vocabulary() -> None:
    t = trained()
    vocab = set(t.tokens)
    assert set(pre_tokenizers.ByteLevel.alphabet()) <= vocab
    for merge in t.merges:
        left, right = merge.split(" ")
        assert {left, right, left + right} <= vocab


def test_rigllm_tokenizer_encodes_like_the_trained_tokenizers_object() -> None:
    t = trained()
    ours = tokenizer_from_trained(t)
    for text in (*MULTILINGUAL_TEXTS, CHAT_TEXT):
        assert ours.encode(text) == t.tokenizer.encode(text).ids, text


def test_too_small_vocab_is_refused() -> None:
    with pytest.raises(RigllmError, match=f"at least {MIN_VOCAB_SIZE}"):
        train_byte_level_bpe(DEMO_CORPUS, MIN_VOCAB_SIZE - 1)


def test_demo_corpus_is_small_and_varied() -> None:
    text = "".join(DEMO_CORPUS)
    assert 2_000 < len(text.encode()) < 20_000
    for sample in ("我", "안", "م", "П", "न", "🦙", "def ", "<|im_start|>", "<tool_call>", "<think>"):
        assert sample in text
