"""Test helpers for the loader, info and planner tests: a tiny valid qwen35 GGUF and ways to break it.

Valid files come from the synthetic writer (engine.fixtures.synthetic) with a tiny config and a small
byte-level vocabulary. Broken files are made by reading a valid one back and rewriting it with
changed keys or tensors (`rewrite_gguf`), or by editing its bytes.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter

from engine.gguf.config import ModelConfig
from engine.gguf.model_file import ModelFile
from engine.fixtures.synthetic import write_random_model
from engine.fixtures.synthetic_vocab import byte_symbols, generated_merges
from engine.gguf.vocab import Vocab

N_MERGES = 32
TINY = ModelConfig(
    d_model=64,
    d_ff=256,  # ffn_down rows are 256 wide, so a Q4_K (256-value blocks) version of it can be written
    n_layers=4,
    n_mtp=1,
    n_head=2,
    n_head_kv=1,
    head_dim=32,
    rope_dims=8,
    rope_sections=(2, 1, 1, 0),
    rope_theta=10_000_000.0,
    rms_eps=1e-6,
    context_length=4096,
    ssm_conv_kernel=4,
    ssm_d_state=16,
    ssm_n_k_heads=2,
    ssm_n_v_heads=4,
    ssm_d_inner=64,
    vocab_size=256 + N_MERGES,
    tied_embeddings=False,
)


def tiny_vocab() -> Vocab:
    """256 byte symbols + 32 generated merges; `eos` is the last token."""
    merged, merges = generated_merges(N_MERGES)
    tokens = byte_symbols() + merged
    return Vocab(tokens=tokens, token_types=[1] * len(tokens), merges=merges, special_ids={"eos": len(tokens) - 1})


def write_tiny_model(path: Path, weight_type: str = "q8_0", **changes: Any) -> Path:
    """A valid tiny qwen35 GGUF; `changes` replace ModelConfig fields (e.g. tied_embeddings=True, n_mtp=0)."""
    cfg = dataclasses.replace(TINY, is_recurrent=(), **changes)  # () = recompute the layer pattern
    return write_random_model(path, cfg, weight_type=weight_type, seed=1, vocab=tiny_vocab())


def _value_type(value: Any) -> tuple[GGUFValueType, GGUFValueType | None]:
    def scalar(v: Any) -> GGUFValueType:
        if isinstance(v, bool):
            return GGUFValueType.BOOL
        if isinstance(v, int):
            return GGUFValueType.UINT32 if 0 <= v < 1 << 32 else GGUFValueType.INT64
        if isinstance(v, float):
            return GGUFValueType.FLOAT32
        return GGUFValueType.STRING

    if isinstance(value, list):
        sub = scalar(value[0])
        return GGUFValueType.ARRAY, GGUFValueType.INT32 if sub == GGUFValueType.UINT32 else sub
    return scalar(value), None


Tensors = dict[str, tuple[np.ndarray, GGMLQuantizationType | None]]


def read_gguf(path: Path) -> tuple[dict[str, Any], Tensors]:
    """Fields and tensors (stored bytes/values + the raw type for block-encoded ones) of a GGUF."""
    mf = ModelFile(path)
    tensors: Tensors = {}
    for name, info in mf.tensors.items():
        plain = info.ggml_type in (GGMLQuantizationType.F32, GGMLQuantizationType.F16)
        tensors[name] = (np.array(mf.raw(name)), None if plain else info.ggml_type)
    return dict(mf.fields), tensors


def write_gguf(path: Path, fields: Mapping[str, Any], tensors: Tensors) -> Path:
    """Write exactly these fields (types inferred) and tensors, in this order."""
    writer = GGUFWriter(path, "unused")
    writer.kv_data[0].clear()  # drop the architecture key GGUFWriter adds; `fields` carries its own
    for key, value in fields.items():
        writer.add_key_value(key, value, *_value_type(value))
    for name, (data, raw_type) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def rewrite_gguf(
    src: Path,
    dst: Path,
    set_fields: Mapping[str, Any] | None = None,
    drop_fields: tuple[str, ...] = (),
    set_tensors: Tensors | None = None,
    drop_tensors: tuple[str, ...] = (),
) -> Path:
    """A copy of `src` with keys/tensors replaced, added or removed."""
    fields, tensors = read_gguf(src)
    fields = {k: v for k, v in fields.items() if k not in drop_fields}
    fields.update(set_fields or {})
    tensors = {k: v for k, v in tensors.items() if k not in drop_tensors}
    tensors.update(set_tensors or {})
    return write_gguf(dst, fields, tensors)


def f32(values: np.ndarray) -> tuple[np.ndarray, None]:
    """A tensor entry stored as F32."""
    return np.ascontiguousarray(values, dtype=np.float32), None
