"""Same ids and bytes as llama.cpp's tokenizer (llama-cpp-python 0.3.36) on the same GGUF vocabularies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))  # tokenizer_fixtures

import llama_sdist  # noqa: E402
from tokenizer_fixtures import (  # noqa: E402
    CHAT_TEXT,
    MULTILINGUAL_TEXTS,
    qwen35_tokenizer,
    qwen35_vocab_path,
    tokenizer_from_trained,
    trained,
    vocab_test_vectors,
    write_vocab_gguf,
)

from engine.generation.tokenizer import Tokenizer  # noqa: E402
from engine.gguf.model_file import ModelFile  # noqa: E402

pytestmark = pytest.mark.peer
llama_cpp = pytest.importorskip("llama_cpp")

# hparams llama.cpp needs to load a vocabulary-only file of architecture qwen2 (those of the qwen35 vocab).
_QWEN2_KEYS = ("block_count", "context_length", "embedding_length", "feed_forward_length",
               "attention.head_count", "attention.head_count_kv", "rope.freq_base",
               "attention.layer_norm_rms_epsilon")


def _llama(path: Path):
    return llama_cpp.Llama(model_path=str(path), vocab_only=True, verbose=False)


@pytest.fixture(scope="module")
def real() -> tuple[Tokenizer, object]:
    return qwen35_tokenizer(), _llama(qwen35_vocab_path())


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[Tokenizer, object]:
    fields = ModelFile(qwen35_vocab_path()).fields
    hparams = {key: fields[f"qwen2.{key}"] for key in _QWEN2_KEYS}
    path = tmp_path_factory.mktemp("vocab") / "trained-vocab.gguf"
    write_vocab_gguf(path, trained(), "qwen2", hparams)
    return tokenizer_from_trained(trained()), _llama(path)


def _texts() -> list[str]:
    vectors = [text for text, _ in vocab_test_vectors(llama_sdist.QWEN35_VOCAB)]
    return [*vectors, *MULTILINGUAL_TEXTS, CHAT_TEXT, "<|im_end|><|im_start|><think></think>"]


@pytest.mark.parametrize("which", ["real", "tiny"])
def test_same_ids_with_special_parsing(which: str, request: pytest.FixtureRequest) -> None:
    ours, llm = request.getfixturevalue(which)
    for text in _texts():
        assert ours.encode(text) == llm.tokenize(text.encode(), add_bos=False, special=True), text


def test_same_ids_without_special_parsing_on_the_real_vocab(real) -> None:
    """The real vocab's user-defined tokens are only `[PAD…]` placeholders, so llama.cpp (which still
    matches user-defined tokens with special=false) and rigllm (which never does) agree here."""
    ours, llm = real
    for text in _texts():
        assert ours.encode(text, parse_special=False) == llm.tokenize(text.encode(), add_bos=False, special=False)


@pytest.mark.parametrize("which", ["real", "tiny"])
def test_same_bytes_when_decoding(which: str, request: pytest.FixtureRequest) -> None:
    ours, llm = request.getfixturevalue(which)
    for text in _texts():
        ids = ours.encode(text)
        assert b"".join(ours.token_bytes(i) for i in ids) == llm.detokenize(ids, special=True)
        assert b"".join(ours.token_bytes(i, skip_special=True) for i in ids) == llm.detokenize(ids, special=False)


@pytest.mark.parametrize("which", ["real", "tiny"])
def test_same_end_of_generation_set(which: str, request: pytest.FixtureRequest) -> None:
    """llama.cpp also stops on any token spelled `</s>` (a PaddleOCR rule it applies to every vocabulary),
    promoting it to control; in Qwen's vocabulary `</s>` is ordinary text (HTML), so rigllm does not."""
    ours, llm = request.getfixturevalue(which)
    vocab = llm._model.vocab
    theirs = {i for i in range(ours.vocab_size) if llama_cpp.llama_vocab_is_eog(vocab, i)}
    assert ours.eos_ids == {i for i in theirs if ours.id_to_token(i) != "</s>"}
