"""`engine.gguf.vocab`: tokenizer keys from an HF folder, as llama.cpp's converter derives them."""

from __future__ import annotations

import json

import pytest
from converter_fixtures import copy_hf, tiny_hf  # noqa: F401 (fixture)
from gguf import GGUFReader, TokenType

from engine.errors import ModelFileError
from engine.gguf.metadata import new_writer
from engine.gguf.vocab import Vocab, looks_special, vocab_from_hf, write_vocab


def test_padding_types_and_special_ids(tiny_hf, tmp_path):
    hf_dir = tiny_hf("gqa2-hv2")
    tok = json.loads((hf_dir / "tokenizer.json").read_text())
    n_real = len(tok["model"]["vocab"]) + len(tok["added_tokens"])
    vocab = vocab_from_hf(hf_dir, vocab_size=n_real + 7)

    assert vocab.tokens[n_real:] == [f"[PAD{i}]" for i in range(n_real, n_real + 7)]
    assert vocab.token_types[n_real:] == [TokenType.UNUSED] * 7
    for added in tok["added_tokens"]:
        expected = TokenType.CONTROL if added["content"].startswith("<|") else TokenType.USER_DEFINED
        assert vocab.tokens[added["id"]] == added["content"]
        assert vocab.token_types[added["id"]] == expected, added["content"]
    assert set(vocab.token_types[: len(tok["model"]["vocab"])]) == {TokenType.NORMAL}
    ids = {a["content"]: a["id"] for a in tok["added_tokens"]}
    assert vocab.special_ids == {"eos": ids["<|im_end|>"], "pad": ids["<|endoftext|>"], "bos": ids["<|endoftext|>"]}
    assert vocab.add_special == {"bos": False}
    assert vocab.chat_template == (hf_dir / "chat_template.jinja").read_text()


def test_vocab_size_smaller_than_tokenizer_is_refused(tiny_hf):
    with pytest.raises(ModelFileError, match="does not fit"):
        vocab_from_hf(tiny_hf("gqa2-hv2"), vocab_size=100)


def test_template_from_tokenizer_config_wins(tiny_hf, tmp_path):
    hf_dir = copy_hf(tiny_hf("gqa2-hv2"), tmp_path / "hf")
    cfg = json.loads((hf_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = "{{ messages[0]['content'] }}"
    (hf_dir / "tokenizer_config.json").write_text(json.dumps(cfg))
    assert vocab_from_hf(hf_dir).chat_template == "{{ messages[0]['content'] }}"


def test_write_vocab_key_types_and_order(tmp_path):
    vocab = Vocab(
        tokens=["a", "b", "ab", "<|im_end|>"],
        token_types=[1, 1, 1, 3],
        merges=["a b"],
        special_ids={"eos": 3, "pad": 3},
        add_special={"bos": False},
        chat_template="T",
    )
    writer = new_writer(tmp_path / "v.gguf")
    write_vocab(writer, vocab)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    writer.close()
    fields = {k: f for k, f in GGUFReader(tmp_path / "v.gguf").fields.items() if k.startswith("tokenizer.")}
    assert list(fields) == [
        "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
        "tokenizer.ggml.merges", "tokenizer.ggml.eos_token_id", "tokenizer.ggml.padding_token_id",
        "tokenizer.ggml.add_bos_token", "tokenizer.chat_template",
    ]
    assert fields["tokenizer.ggml.tokens"].contents() == vocab.tokens
    assert fields["tokenizer.ggml.eos_token_id"].types[0].name == "UINT32"
    assert fields["tokenizer.ggml.token_type"].types[-1].name == "INT32"
    assert fields["tokenizer.ggml.add_bos_token"].contents() is False


def test_looks_special():
    assert looks_special("<|im_start|>") and looks_special("<unused12>") and looks_special("<pad>")
    assert not looks_special("<think>") and not looks_special("<tool_call>")
    with pytest.raises(ValueError):
        Vocab(tokens=["a"], token_types=[1, 1], merges=[])
