"""Convert an HF Qwen3.5/3.6 checkpoint folder to a qwen35 GGUF, streaming, the way llama.cpp's converter does.

Same tensors, names, values, order, per-tensor types and key set as llama.cpp's `convert_hf_to_gguf.py`
(`Qwen3_5TextModel`, llama-cpp-python 0.3.36), checked tensor for tensor and key for key by the peer
test, but with numpy only: safetensors are memory-mapped (engine.gguf.safetensors_reader), each
tensor is transformed (engine.gguf.hf_tensors), encoded and written before the next is read, and the
two vocabulary-sized matrices go through in row chunks, so RAM stays at about one layer tensor.

The text model only: vision tensors are skipped (llama.cpp writes them to a separate mmproj file).
The MTP block is written when the checkpoint has `mtp.*` tensors, unless `include_mtp` is False.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from gguf.quants import quantize

from engine.errors import ModelFileError
from engine.gguf.config import ModelConfig
from engine.gguf.gguf_stream import PlannedTensor, TensorStream
from engine.gguf.hf_tensors import gguf_shape, target_name, transform
from engine.gguf.metadata import (
    FILE_TYPES,
    hf_card_metadata,
    new_writer,
    write_general_keys,
    write_model_keys,
    write_quantization_version,
)
from engine.gguf.safetensors_reader import SafetensorsCheckpoint
from engine.gguf.tensor_types import tensor_type
from engine.gguf.vocab import vocab_from_hf, write_vocab

SUPPORTED_ARCHITECTURES = ("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration")
CHUNKED_TENSORS = ("token_embd.weight", "output.weight")  # vocabulary-sized, rename-only: safe to split by rows
CHUNK_ELEMENTS = 1 << 22  # values per row chunk of a vocabulary matrix (16 MiB as float32)

Progress = Callable[[str, int, int], None]  # (tensor name, tensors done, tensor count)


def read_config_json(hf_dir: Path) -> dict:
    """An HF model folder's config.json as it is, with one-line errors for a missing or broken file."""
    path = hf_dir / "config.json"
    if not path.is_file():
        raise ModelFileError(f"{hf_dir}: no config.json (is this an HF model folder?)")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as err:
        raise ModelFileError(f"{path}: not valid JSON ({err})") from None


def read_hf_config(hf_dir: Path) -> dict:
    """config.json with the text config merged to the top level (as the converter sees it)."""
    raw = read_config_json(hf_dir)
    archs = raw.get("architectures") or []
    if not any(a in SUPPORTED_ARCHITECTURES for a in archs):
        raise ModelFileError(
            f"{hf_dir}: architecture {archs or 'unknown'} is not a Qwen3.5/3.6 dense model "
            f"(supported: {', '.join(SUPPORTED_ARCHITECTURES)})"
        )
    return {**raw, **raw.get("text_config", {})}


def count_mtp_layers(names: list[str]) -> int:
    """MTP blocks present in a checkpoint: one more than the highest `mtp.layers.N` index."""
    n = 0
    for name in names:
        parts = name.removeprefix("model.").split(".")
        if parts[0] == "mtp" and len(parts) > 2 and parts[1] == "layers" and parts[2].isdecimal():
            n = max(n, int(parts[2]) + 1)
    return n


def convert(
    hf_dir: str | Path,
    out_path: str | Path,
    out_type: str = "bf16",
    include_mtp: bool = True,
    progress: Progress | None = None,
) -> Path:
    """Write the text model of `hf_dir` to `out_path` as `out_type` ("f32", "f16", "bf16", "q8_0")."""
    if out_type not in FILE_TYPES:
        raise ModelFileError(f"output type must be one of {', '.join(FILE_TYPES)}, not '{out_type}'")
    file_type = FILE_TYPES[out_type]
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    hparams = read_hf_config(hf_dir)

    with SafetensorsCheckpoint(hf_dir) as ckpt:
        n_mtp = count_mtp_layers(ckpt.names()) if include_mtp else 0
        cfg = ModelConfig.from_hf_config(hparams, n_mtp=n_mtp)
        jobs: list[tuple[str, str, PlannedTensor]] = []  # (HF name, canonical name, planned tensor)
        for hf_name in ckpt.names():
            target = target_name(cfg, hf_name)
            if target is None:
                continue
            canonical, name = target
            shape = gguf_shape(canonical, ckpt.entries[hf_name].shape)
            jobs.append((hf_name, canonical, PlannedTensor(name, shape, tensor_type(name, shape, file_type))))
        if not any(p.name == "token_embd.weight" for _, _, p in jobs):
            raise ModelFileError(f"{hf_dir}: no embedding tensor found; is this a Qwen3.5 checkpoint?")

        planned = [p for _, _, p in jobs]
        vocab = vocab_from_hf(hf_dir, cfg.vocab_size)
        writer = new_writer(out_path)
        stream = TensorStream(writer, planned)
        write_general_keys(writer, hf_card_metadata(hf_dir, sum(p.n_elements for p in planned)))
        rope = hparams.get("rope_parameters") or hparams.get("rope_scaling") or {}
        write_model_keys(writer, cfg, file_type, sections_from_config="mrope_section" in rope)
        write_quantization_version(writer)
        write_vocab(writer, vocab)
        stream.write_metadata()

        for done, (hf_name, canonical, p) in enumerate(jobs, start=1):
            if p.name in CHUNKED_TENSORS:
                rows, cols = p.shape
                step = max(1, CHUNK_ELEMENTS // cols)
                chunks = (quantize(ckpt.read(hf_name, r, min(r + step, rows)), p.qtype) for r in range(0, rows, step))
                stream.write_tensor(p.name, chunks)
            else:
                stream.write_tensor(p.name, [quantize(transform(cfg, canonical, ckpt.read(hf_name)), p.qtype)])
            if progress is not None:
                progress(p.name, done, len(jobs))
        stream.close()
    return out_path
