"""Special tokens: matched whole only with parse_special, decoded per type, EOG set, bad vocabularies."""

from __future__ import annotations

from pathlib import Path

import llama_sdist
import pytest
from gguf import TokenType
from tokenizer_fixtures import (
    CHAT_TEXT,
    TOKENIZER_NAMES,
    qwen35_tokenizer,
    qwen35_vocab_path,
    trained,
    trained_tokenizer,
    write_vocab_gguf,
)

from engine.errors import ModelFileError
from engine.model.special_tokens import QWEN35_SPECIAL_TOKENS
from engine.generation.tokenizer import Tokenizer
from engine.gguf.model_file import ModelFile


def test_specials_matched_whole_with_parse_special() -> None:
    tok = trained_tokenizer()
    ids = tok.encode("<|im_start|>user\nhi<|im_end|><|im_start|>assistant\n<think>\n</think>")
    sid = tok.token_to_id
    assert ids[0] == sid("<|im_start|>")
    assert ids.count(sid("<|im_start|>")) == 2
    assert sid("<|im_end|>") in ids and sid("<think>") in ids and sid("</think>") == ids[-1]
    assert [i for i in ids if i in tok.special_ids] == [
        sid("<|im_start|>"), sid("<|im_end|>"), sid("<|im_start|>"), sid("<think>"), sid("</think>")
    ]


@pytest.mark.parametrize("which", TOKENIZER_NAMES)
def test_plain_text_mode_never_creates_special_ids(which: str) -> None:
    tok = trained_tokenizer() if which == "trained" else qwen35_tokenizer()
    ids = tok.encode(CHAT_TEXT, parse_special=False)
    assert not set(ids) & tok.special_ids
    assert tok.decode(ids) == CHAT_TEXT
    assert set(tok.encode(CHAT_TEXT)) & tok.special_ids


def test_every_qwen35_special_is_one_token_on_the_trained_vocab() -> None:
    tok = trained_tokenizer()
    for text in QWEN35_SPECIAL_TOKENS:
        assert tok.encode(text) == [tok.token_to_id(text)]
        assert len(tok.encode(text, parse_special=False)) > 1


def test_longest_special_wins_over_its_prefix() -> None:
    """llama.cpp partitions longest specials first: '<x>y' beats '<x>' even though '<x>' starts first."""
    t = trained()
    tokens = t.tokens + ["<x>", "<x>y"]
    types = t.token_types + [int(TokenType.CONTROL), int(TokenType.USER_DEFINED)]
    tok = Tokenizer(tokens, types, t.merges, "qwen35")
    short, long = len(t.tokens), len(t.tokens) + 1
    assert tok.encode("a<x>y<x>b<x>") == tok.encode("a") + [long, short] + tok.encode("b") + [short]


def test_decode_skip_special_drops_control_keeps_user_defined() -> None:
    """As llama.cpp's token_to_piece(special=false): `<|…|>` control tokens vanish, `<think>` stays text."""
    tok = trained_tokenizer()
    ids = tok.encode("<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "assistant\n<think>\nhmm\n</think>\n\nok"
    assert tok.decode(ids) == "<|im_start|>assistant\n<think>\nhmm\n</think>\n\nok<|im_end|>"


def test_unused_fillers_decode_to_nothing() -> None:
    t = trained()
    small = Tokenizer(*_padded(t, len(t.tokens) + 3))
    assert small.decode([len(t.tokens) + 1]) == ""


def _padded(t, size: int):
    extra = [f"[PAD{i}]" for i in range(len(t.tokens), size)]
    return t.tokens + extra, t.token_types + [int(TokenType.UNUSED)] * len(extra), t.merges, t.pre


def test_eos_ids_are_the_eog_strings_plus_the_gguf_eos() -> None:
    tok = trained_tokenizer()
    names = ["<|im_end|>", "<|endoftext|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>"]
    assert tok.eos_ids == {tok.token_to_id(n) for n in names}
    t = trained()
    odd = Tokenizer(t.tokens, t.token_types, t.merges, t.pre, eos_id=t.token_id("<think>"))
    assert odd.eos_ids == tok.eos_ids | {t.token_id("<think>")}


@llama_sdist.needs_sdist
def test_special_ids_are_control_and_user_defined_tokens() -> None:
    tok = trained_tokenizer()
    assert tok.special_ids == {tok.token_to_id(s) for s in QWEN35_SPECIAL_TOKENS}
    real = qwen35_tokenizer()
    assert {real.token_to_id(s) for s in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")} <= real.special_ids
    assert real.eos_ids == {151643, 151645}


@llama_sdist.needs_sdist
def test_vocab_only_gguf_of_another_architecture_opens(tmp_path: Path) -> None:
    mf = ModelFile(qwen35_vocab_path())
    assert mf.architecture == "qwen2" and not mf.tensors
    assert Tokenizer.from_model_file(mf).vocab_size == 151936

    path = tmp_path / "vocab.gguf"
    write_vocab_gguf(path, trained(), "qwen35", {})
    tok = Tokenizer.from_model_file(ModelFile(path))
    assert tok.encode(CHAT_TEXT) == trained_tokenizer().encode(CHAT_TEXT)
    assert tok.eos_ids == trained_tokenizer().eos_ids


def _fields(**changes):
    t = trained()
    fields = {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "qwen35",
        "tokenizer.ggml.tokens": t.tokens,
        "tokenizer.ggml.token_type": t.token_types,
        "tokenizer.ggml.merges": t.merges,
    }
    fields.update(changes)
    return {k: v for k, v in fields.items() if v is not None}


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tokenizer.ggml.model": None}, "no tokenizer"),
        ({"tokenizer.ggml.model": "llama"}, "tokenizer model 'llama' is not supported"),
        ({"tokenizer.ggml.pre": "falcon"}, "pre-tokenizer 'falcon' is not supported"),
        ({"tokenizer.ggml.pre": None}, "lacks 'tokenizer.ggml.pre'"),
        ({"tokenizer.ggml.merges": None}, "lacks 'tokenizer.ggml.merges'"),
        ({"tokenizer.ggml.token_type": [1, 1]}, "1024 tokens but 2 token types"),
        ({"tokenizer.ggml.merges": ["nosuch token"]}, "merges do not fit the vocabulary"),
        ({"tokenizer.ggml.merges": ["single"]}, "merge 0 .* is not two tokens"),
        ({"tokenizer.ggml.eos_token_id": 5000}, "eos id 5000 is outside"),
    ],
)
def test_bad_vocabularies_are_model_file_errors(changes: dict, message: str) -> None:
    with pytest.raises(ModelFileError, match=message):
        Tokenizer.from_fields(_fields(**changes))


def test_missing_token_types_mean_all_normal() -> None:
    tok = Tokenizer.from_fields(_fields(**{"tokenizer.ggml.token_type": None}))
    assert not tok.special_ids
    assert tok.decode(tok.encode("Hello <|im_end|>")) == "Hello <|im_end|>"
