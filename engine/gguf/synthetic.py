"""Write a valid qwen35 GGUF with random weights, streaming, for speed/memory tests and the demo model.

Random full-size shapes are for speed and memory work only (contracts.md: quality needs trained
models). The values are still chosen so a forward pass stays finite and unremarkable: matmul
weights uniform with std 1/sqrt(fan_in) (activations keep their scale through each projection),
norm weights 1 ± 0.1, `ssm_a = -exp(A_log)` with `A` in [1, 16] and `dt_bias` the inverse softplus
of a `dt` in [1e-3, 0.1] (transformers' initialisation), conv taps in ±0.5.

Memory stays flat whatever the size: tensors are generated, encoded and written one at a time,
each in row chunks of at most `CHUNK_ELEMENTS` values (engine.gguf.gguf_stream). Q8_0 matrices are
generated directly as blocks (a per-block f16 scale and uniform int8 values), which is both exact
Q8_0 data and several times faster than generating floats and quantizing them; K-quant matrices
likewise (`engine.gguf.kquant_blocks.random_kquant_rows`). The K-quant file types take llama.cpp's
quantizer's per-tensor types (`engine.gguf.tensor_plan`: Q6_K output and some attn_v/attn_qkv/ffn_down).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.gguf.config import ModelConfig
from engine.gguf.gguf_stream import PlannedTensor, TensorStream
from engine.gguf.kquant_blocks import KQUANT_TYPES, random_kquant_rows
from engine.gguf.metadata import (
    named_metadata,
    new_writer,
    write_general_keys,
    write_model_keys,
    write_quantization_version,
)
from engine.gguf.synthetic_vocab import QWEN35_VOCAB_SIZE, synthetic_qwen35_vocab
from engine.gguf.tensor_plan import file_type_of, planned_types
from engine.gguf.vocab import Vocab, write_vocab

CHUNK_ELEMENTS = 1 << 23  # values generated per chunk (32 MiB as float32)
Q8_BLOCK = 32

Progress = Callable[[int, int], None]  # (bytes written so far, total tensor bytes)


def write_random_model(
    path: str | Path,
    cfg: ModelConfig,
    weight_type: str = "q8_0",
    seed: int = 0,
    vocab: Vocab | None = None,
    chat_template: str | None = None,
    name: str | None = None,
    progress: Progress | None = None,
) -> Path:
    """Write `cfg` with random weights to `path` and return the path.

    `weight_type` is the file type ("f32", "f16", "bf16", "q8_0", "q4_k_m", "q5_k_m", "q6_k"); per-tensor
    types follow llama.cpp's converter rules (norms, 1-D tensors and `ssm_conv1d` stay F32), and its
    quantizer's for the K-quant types. Without `vocab`, `cfg.vocab_size`
    must be the real 248,320 and the generated Qwen3.5 vocabulary is used; `chat_template` (if given)
    replaces the vocabulary's template. The same arguments always give the same file.
    """
    file_type = file_type_of(weight_type)
    if vocab is None:
        if cfg.vocab_size != QWEN35_VOCAB_SIZE:
            raise ValueError(f"the generated vocabulary has {QWEN35_VOCAB_SIZE} tokens; pass a vocab for {cfg.vocab_size}")
        vocab = synthetic_qwen35_vocab(chat_template)
    elif chat_template is not None:
        vocab = dataclasses.replace(vocab, chat_template=chat_template)
    if len(vocab.tokens) != cfg.vocab_size:
        raise ValueError(f"vocab has {len(vocab.tokens)} tokens, the config says {cfg.vocab_size}")

    planned = [PlannedTensor(n, s, t) for n, s, t in planned_types(cfg, weight_type)]
    total_params = sum(t.n_elements for t in planned)
    meta = named_metadata(name or "rigllm synthetic (random weights)", total_params)

    path = Path(path)
    writer = new_writer(path)
    stream = TensorStream(writer, planned)
    write_general_keys(writer, meta)
    write_model_keys(writer, cfg, file_type)
    write_quantization_version(writer)
    write_vocab(writer, vocab)
    stream.write_metadata()

    total_bytes = sum(t.nbytes for t in planned)
    done = 0
    for index, t in enumerate(planned):
        rng = np.random.default_rng(np.random.SeedSequence([seed, index]))
        stream.write_tensor(t.name, random_tensor_chunks(t, rng))
        done += t.nbytes
        if progress is not None:
            progress(done, total_bytes)
    stream.close()
    return path


def random_tensor_chunks(t: PlannedTensor, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """The tensor's encoded bytes, row chunk by row chunk."""
    if len(t.shape) == 1:
        yield quantize(small_tensor_values(t.name, t.shape[0], rng), t.qtype)
        return
    rows, cols = int(np.prod(t.shape[:-1])), t.shape[-1]
    half_width = np.sqrt(3.0 / cols)  # uniform(-a, a) has std a/sqrt(3) = 1/sqrt(fan_in)
    if t.name.endswith(".ssm_conv1d.weight"):
        half_width = 0.5
    step = max(1, CHUNK_ELEMENTS // cols)
    for start in range(0, rows, step):
        n = min(step, rows - start)
        if t.qtype == GGMLQuantizationType.Q8_0:
            yield random_q8_0_rows(n, cols, half_width, rng)
        elif t.qtype in KQUANT_TYPES:
            yield random_kquant_rows(n, cols, half_width, t.qtype, rng)
        else:
            values = rng.random((n, cols), dtype=np.float32)
            values = (values * np.float32(2 * half_width) - np.float32(half_width)).astype(np.float32)
            yield quantize(values, t.qtype)


def random_q8_0_rows(n_rows: int, n_cols: int, half_width: float, rng: np.random.Generator) -> np.ndarray:
    """`n_rows` Q8_0 rows whose values are uniform on [-half_width, half_width] (scale · int8 in [-127, 127])."""
    n_blocks = n_cols // Q8_BLOCK
    out = np.empty((n_rows, n_blocks, 2 + Q8_BLOCK), dtype=np.uint8)
    scale = np.frombuffer(np.float16(half_width / 127.0).tobytes(), dtype=np.uint8)
    out[:, :, :2] = scale
    out[:, :, 2:] = rng.integers(-127, 128, size=(n_rows, n_blocks, Q8_BLOCK), dtype=np.int8).view(np.uint8)
    return out.reshape(n_rows, n_blocks * (2 + Q8_BLOCK))


def small_tensor_values(name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """Values of a 1-D tensor: norm gains near 1, negative decay rates, positive-softplus dt biases."""
    if name.endswith(".ssm_a"):
        return -np.exp(rng.uniform(np.log(1.0), np.log(16.0), n)).astype(np.float32)
    if name.endswith(".ssm_dt.bias"):
        dt = np.exp(rng.uniform(np.log(1e-3), np.log(1e-1), n))
        return (dt + np.log(-np.expm1(-dt))).astype(np.float32)  # softplus(dt_bias) == dt
    return (1.0 + rng.uniform(-0.1, 0.1, n)).astype(np.float32)
