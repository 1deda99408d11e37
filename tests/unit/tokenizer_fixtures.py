"""Shared tokenizer test data: multilingual strings, a trained tiny tokenizer, the real qwen35 vocabulary.

The real vocabulary and its test vectors come from the llama-cpp-python sdist through
`tests/llama_sdist.py` (downloaded into a cache once, or skipped when offline).
"""

from __future__ import annotations

import sys
from functools import lru_cache
from pathlib import Path

import gguf
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/, for llama_sdist

import llama_sdist  # noqa: E402

from engine.generation.demo_corpus import DEMO_CORPUS  # noqa: E402
from engine.generation.tokenizer import Tokenizer  # noqa: E402
from engine.generation.train_tokenizer import TrainedTokenizer, train_byte_level_bpe  # noqa: E402

MULTILINGUAL_TEXTS: tuple[str, ...] = (
    "Hello world",
    " Hello World! It's a test; we'RE sure, I'VE seen it.",
    "我想在apple工作1314151天～ 今天天气很好。",
    "日本語のテキスト、ひらがな・カタカナ。",
    "안녕하세요 세계, 한국어 문장입니다.",
    "مرحبا بالعالم، هذه جملة عربية.",
    "שלום עולם",
    "नमस्ते दुनिया, हिन्दी में मात्राएँ",
    "ภาษาไทยมีสระและวรรณยุกต์ที่ซ้อนกัน",
    "កាន់តែពិសេសអាច😁",
    "Emoji 🚀 🦙🦙 😶\u200d🌫️ 👩\u200d💻 👨\u200d👩\u200d👧\u200d👦 🇩🇪🇯🇵 👍🏽 ✅",
    "Combining: e\u0301 a\u0308 o\u0303\u0301 Z\u0351\u036b\u0343a\u0310\u0352 n\u0303",
    "Precomposed vs decomposed: é e\u0301 Å A\u030a",
    "Math 𝕳𝖊𝖑𝖑𝖔 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and rare CJK 𠀀𠀁",
    "def f(x):\n\treturn {'a': [1, 2, 3], \"b\": x ** 2}  # comment\n",
    "    indented\n\n\n\t\t tabs   and   runs of   spaces     \n",
    "line one\r\nline two\r\n\r\n",
    "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
    "3.3 3..3 3...3 1234567890 -42 +7 50% $19.99",
    "''''''```````\"\"\"\"......!!!!!!?????? ------=======",
    "no-break\u00a0space, ideographic\u3000space, zero\u200bwidth, bom\ufeff, line\u2028sep",
    "   ",
    "",
)

CHAT_TEXT = (
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nHi 👋<|im_end|>\n"
    "<|im_start|>assistant\n<think>\nThe user greets.\n</think>\n\nHello!<|im_end|>\n"
    "<|im_start|>assistant\n<tool_call>\n<function=f>\n</function>\n</tool_call><|im_end|><|endoftext|>"
)


# The tokenizers tests run on: "qwen35" reads the real vocabulary from the sdist, so it is a peer test.
TOKENIZER_NAMES = ["trained", pytest.param("qwen35", marks=llama_sdist.needs_sdist)]


@lru_cache(maxsize=1)
def trained() -> TrainedTokenizer:
    """A 1024-token tokenizer trained on the demo corpus (the specials follow the learned tokens)."""
    return train_byte_level_bpe(DEMO_CORPUS, 1024)


def tokenizer_from_trained(t: TrainedTokenizer) -> Tokenizer:
    return Tokenizer(t.tokens, t.token_types, t.merges, t.pre, eos_id=t.token_id("<|im_end|>"))


@lru_cache(maxsize=1)
def trained_tokenizer() -> Tokenizer:
    return tokenizer_from_trained(trained())


@lru_cache(maxsize=1)
def qwen35_vocab_path() -> Path:
    return llama_sdist.sdist_file(llama_sdist.QWEN35_VOCAB)


@lru_cache(maxsize=1)
def qwen35_tokenizer() -> Tokenizer:
    from engine.gguf.model_file import ModelFile

    return Tokenizer.from_model_file(ModelFile(qwen35_vocab_path()))


def vocab_test_vectors(vocab_relpath: str) -> list[tuple[str, list[int]]]:
    """llama.cpp's `<vocab>.inp/.out` pairs, parsed as tests/test-tokenizer-0.cpp reads them."""
    inp = llama_sdist.sdist_file(vocab_relpath + ".inp").read_bytes().decode("utf-8")
    out = llama_sdist.sdist_file(vocab_relpath + ".out").read_text(encoding="utf-8").splitlines()
    sep = "\n__ggml_vocab_test__\n"
    inputs: list[str] = []
    pos = 0
    while pos < len(inp):
        nxt = inp.find(sep, pos)
        if nxt < 0:
            inputs.append(inp[pos:])
            break
        inputs.append(inp[pos:nxt])
        pos = nxt + len(sep)
    if len(inputs) != len(out):
        raise AssertionError(f"{vocab_relpath}: {len(inputs)} inputs but {len(out)} outputs")
    return [(s, [int(x) for x in o.split()]) for s, o in zip(inputs, out)]


def write_vocab_gguf(path: Path, t: TrainedTokenizer, arch: str, hparams: dict[str, int | float]) -> None:
    """A vocabulary-only GGUF holding `t` (plus `arch.<key>` hparams so llama.cpp's loader accepts it)."""
    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in hparams.items():
        full = f"{arch}.{key}"
        if isinstance(value, float):
            writer.add_float32(full, value)
        else:
            writer.add_uint32(full, value)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(t.pre)
    writer.add_token_list(t.tokens)
    writer.add_token_types(t.token_types)
    writer.add_token_merges(t.merges)
    writer.add_eos_token_id(t.token_id("<|im_end|>"))
    writer.add_pad_token_id(t.token_id("<|endoftext|>"))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
