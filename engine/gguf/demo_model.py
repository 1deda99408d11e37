"""The small demo model the app and `rigllm generate` use when no model is given.

It has random weights, so it produces fluent-looking nonsense; it exists so that a fresh install can
exercise the whole path (tokenizer, chat template, engine, sampler, UI) without a multi-GB download,
and its `general.name` says so. It is written with numpy and gguf only (no torch), from a fixed
seed, with a byte-level BPE tokenizer trained on the built-in corpus and rigllm's fallback chat
template, and cached in the user's data folder. The cache is rebuilt when the file is missing or
its recorded version differs; the version covers the model recipe, the corpus and the template, so
changing any of them refreshes every user's copy.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.generation.chat_template import FALLBACK_TEMPLATE_PATH
from engine.generation.demo_corpus import DEMO_CORPUS
from engine.generation.train_tokenizer import TrainedTokenizer, train_byte_level_bpe
from engine.gguf.config import ModelConfig
from engine.gguf.synthetic import write_random_model
from engine.gguf.vocab import Vocab
from engine.paths import user_data_dir

DEMO_RECIPE_VERSION = 1  # bump when DEMO_CONFIG, the seed or the weight type changes
DEMO_NAME = "rigllm demo (random weights)"
DEMO_FILE = "rigllm-demo-random-q8_0.gguf"
DEMO_SEED = 20260214
DEMO_WEIGHT_TYPE = "q8_0"
DEMO_CONFIG = ModelConfig(
    d_model=256,
    d_ff=768,
    n_layers=8,  # GDN ×3, attention, GDN ×3, attention
    n_mtp=0,
    n_head=4,
    n_head_kv=2,
    head_dim=64,
    rope_dims=16,
    rope_sections=(3, 3, 2, 0),
    rope_theta=10_000_000.0,
    rms_eps=1e-6,
    context_length=4096,
    ssm_conv_kernel=4,
    ssm_d_state=32,
    ssm_n_k_heads=2,
    ssm_n_v_heads=4,
    ssm_d_inner=4 * 32,
    vocab_size=1024,
    tied_embeddings=True,
)


def demo_version(template: str) -> str:
    """Recipe version plus a hash of everything else the file is made from."""
    digest = hashlib.sha256(("\x00".join(DEMO_CORPUS) + "\x01" + template).encode("utf-8")).hexdigest()
    return f"{DEMO_RECIPE_VERSION}-{digest[:16]}"


def demo_vocab(template: str) -> Vocab:
    """The demo tokenizer: BPE trained on the built-in corpus, Qwen3.5 specials, Qwen3.5 eos/pad roles."""
    return trained_vocab(train_byte_level_bpe(DEMO_CORPUS, DEMO_CONFIG.vocab_size), template)


def trained_vocab(trained: TrainedTokenizer, template: str | None) -> Vocab:
    """The GGUF vocabulary of a tokenizer trained here, with Qwen3.5's eos/pad roles (demo and fixtures)."""
    return Vocab(
        tokens=trained.tokens,
        token_types=trained.token_types,
        merges=trained.merges,
        special_ids={"eos": trained.token_id("<|im_end|>"), "pad": trained.token_id("<|endoftext|>")},
        add_special={"bos": False},
        chat_template=template,
        pre=trained.pre,
    )


def write_demo_model(path: str | Path) -> Path:
    """Write the demo model to `path` (the same bytes every time for the same corpus and template)."""
    template = FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8")
    return write_random_model(
        path, DEMO_CONFIG, DEMO_WEIGHT_TYPE, seed=DEMO_SEED, vocab=demo_vocab(template), name=DEMO_NAME
    )


def ensure_demo_model() -> Path:
    """The cached demo model's path, (re)building it first if it is missing or out of date."""
    folder = user_data_dir() / "demo"
    path = folder / DEMO_FILE
    stamp = folder / "version.txt"
    version = demo_version(FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8"))
    if path.is_file() and stamp.is_file() and stamp.read_text(encoding="utf-8").strip() == version:
        return path
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{DEMO_FILE}.{os.getpid()}.partial"
    try:
        write_demo_model(partial)
        os.replace(partial, path)  # atomic: a concurrent reader sees the old file or the new one
    finally:
        partial.unlink(missing_ok=True)
    stamp.write_text(version + "\n", encoding="utf-8")
    return path
