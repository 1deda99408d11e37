"""Write the vision tower of an HF Qwen3.5 checkpoint as an mmproj GGUF, the way llama.cpp's converter does.

Same keys (and key order), tensor names, order, shapes, types and values as `convert_hf_to_gguf.py
--mmproj` (`Qwen3VLVisionModel`, llama-cpp-python 0.3.36), checked against it by the peer test; numpy
only, streamed one tensor at a time like the text converter. Transforms (spec §9.2): the Conv3d patch
kernel is split along time into `v.patch_embd.weight` and `v.patch_embd.weight.1`; everything else is a
rename. Types: 1-D tensors and the position embedding stay F32, the patch kernels are F16 in an F16
file and F32 otherwise, other matrices take the file type (Q8_0 falls back to F16 on rows that are not
whole 32-value blocks).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_VERSION, GGMLQuantizationType, GGUFWriter, LlamaFileType, Metadata, size_label
from gguf.quants import quantize

from engine.errors import ModelFileError
from engine.gguf.convert import read_config_json
from engine.gguf.gguf_stream import PlannedTensor, TensorStream
from engine.gguf.metadata import FILE_TYPES
from engine.vision.mmproj import CLIP_ARCH
from engine.gguf.safetensors_reader import SafetensorsCheckpoint
from engine.gguf.tensor_types import tensor_type
from engine.vision.config import PROJECTOR_TYPE, VisionConfig

MMPROJ_ARCHITECTURE = "Qwen3_5ForConditionalGeneration"
_BLOCK_RENAMES = {
    "norm1": "ln1",
    "norm2": "ln2",
    "attn.qkv": "attn_qkv",
    "attn.proj": "attn_out",
    "mlp.linear_fc1": "ffn_up",
    "mlp.linear_fc2": "ffn_down",
}
_GLOBAL_RENAMES = {
    "merger.norm": "v.post_ln",
    "merger.linear_fc1": "mm.0",
    "merger.linear_fc2": "mm.2",
    "patch_embed.proj": "v.patch_embd",
    "pos_embed": "v.position_embd",
}
_BLOCK_RE = re.compile(r"^blocks\.(\d+)\.(.+)\.(weight|bias)$")
PATCH_KERNEL = "visual.patch_embed.proj.weight"


def read_vision_config(hf_dir: Path) -> tuple[dict, VisionConfig]:
    """The raw config.json and the vision tower's `VisionConfig`; refuses folders without one."""
    raw = read_config_json(hf_dir)
    if MMPROJ_ARCHITECTURE not in (raw.get("architectures") or []) or "vision_config" not in raw:
        raise ModelFileError(
            f"{hf_dir}: has no vision tower (needs a {MMPROJ_ARCHITECTURE} checkpoint with a vision_config)"
        )
    if raw["vision_config"].get("deepstack_visual_indexes"):
        raise ModelFileError(f"{hf_dir}: the vision tower has deepstack layers, which Qwen3.5 vision does not")
    pre_path = hf_dir / "preprocessor_config.json"
    preprocessor = json.loads(pre_path.read_text(encoding="utf-8")) if pre_path.is_file() else {}
    return raw, VisionConfig.from_hf(raw, preprocessor)


def mmproj_name(hf_name: str) -> str | None:
    """GGUF base name (without `.weight`/`.bias`) of a `visual.*` tensor, or None for a non-vision tensor."""
    name = hf_name.removeprefix("model.")
    if not name.startswith("visual."):
        return None
    rest = name[len("visual."):]
    m = _BLOCK_RE.match(rest)
    if m and m.group(2) in _BLOCK_RENAMES:
        return f"v.blk.{m.group(1)}.{_BLOCK_RENAMES[m.group(2)]}.{m.group(3)}"
    stem, _, suffix = rest.rpartition(".")
    if stem in _GLOBAL_RENAMES and suffix in ("weight", "bias"):
        return f"{_GLOBAL_RENAMES[stem]}.{suffix}"
    raise ModelFileError(f"unexpected vision tensor '{hf_name}' (not part of a Qwen3.5 vision tower)")


def _qtype(name: str, shape: tuple[int, ...], file_type: LlamaFileType) -> GGMLQuantizationType:
    if name.startswith("v.patch_embd.weight"):
        return GGMLQuantizationType.F16 if file_type == LlamaFileType.MOSTLY_F16 else GGMLQuantizationType.F32
    if name == "v.position_embd.weight":
        return GGMLQuantizationType.F32
    return tensor_type(name, shape, file_type)


def _plan(ckpt: SafetensorsCheckpoint, file_type: LlamaFileType) -> list[tuple[str, int | None, PlannedTensor]]:
    """(HF name, temporal slice or None, planned tensor) in llama.cpp's writing order."""
    jobs = []
    for hf_name in ckpt.names():
        name = mmproj_name(hf_name)
        if name is None:
            continue
        shape = ckpt.entries[hf_name].shape
        if hf_name.removeprefix("model.") == PATCH_KERNEL:
            if len(shape) != 5 or shape[2] != 2:
                raise ModelFileError(f"{hf_name}: expected a Conv3d kernel with 2 time steps, got shape {list(shape)}")
            plain = (shape[0], shape[1], shape[3], shape[4])
            for t, gguf_name in enumerate((name, name + ".1")):
                jobs.append((hf_name, t, PlannedTensor(gguf_name, plain, _qtype(gguf_name, plain, file_type))))
        else:
            jobs.append((hf_name, None, PlannedTensor(name, shape, _qtype(name, shape, file_type))))
    return jobs


def write_mmproj_keys(writer: GGUFWriter, cfg: VisionConfig, file_type: LlamaFileType, meta: Metadata) -> None:
    """The key set and order of llama.cpp's `MmprojModel` + `Qwen3VLVisionModel.set_gguf_parameters`."""
    writer.add_type("mmproj")
    meta.set_gguf_meta_model(writer)
    writer.add_file_type(file_type)
    writer.add_clip_has_vision_encoder(True)
    writer.add_vision_projection_dim(cfg.projection_dim)
    writer.add_vision_image_size(cfg.image_size)
    writer.add_vision_patch_size(cfg.patch_size)
    writer.add_vision_embedding_length(cfg.n_embd)
    writer.add_vision_feed_forward_length(cfg.n_ff)
    writer.add_vision_block_count(cfg.n_layers)
    writer.add_vision_head_count(cfg.n_head)
    writer.add_vision_image_mean(list(cfg.image_mean))
    writer.add_vision_image_std(list(cfg.image_std))
    writer.add_clip_projector_type(PROJECTOR_TYPE)
    writer.add_vision_use_gelu(True)
    writer.add_vision_spatial_merge_size(cfg.merge_size)
    writer.add_vision_attention_layernorm_eps(cfg.eps)
    writer.add_vision_is_deepstack_layers([False] * cfg.n_layers)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def convert_mmproj(hf_dir: str | Path, out_path: str | Path, out_type: str = "f16") -> Path:
    """Write the vision tower of `hf_dir` to `out_path` as `out_type` ("f32", "f16", "bf16", "q8_0")."""
    if out_type not in FILE_TYPES:
        raise ModelFileError(f"output type must be one of {', '.join(FILE_TYPES)}, not '{out_type}'")
    file_type = FILE_TYPES[out_type]
    hf_dir, out_path = Path(hf_dir), Path(out_path)
    _, cfg = read_vision_config(hf_dir)
    with SafetensorsCheckpoint(hf_dir) as ckpt:
        jobs = _plan(ckpt, file_type)
        if not any(p.name == "v.patch_embd.weight" for _, _, p in jobs):
            raise ModelFileError(f"{hf_dir}: the checkpoint has no vision tensors (model.visual.*)")
        planned = [p for _, _, p in jobs]
        total = sum(p.n_elements for p in planned)
        meta = Metadata.load(None, hf_dir, None, total)
        meta.name = meta.name or hf_dir.name
        meta.size_label = meta.size_label or size_label(total, total, 0, 0)
        writer = GGUFWriter(out_path, CLIP_ARCH)
        stream = TensorStream(writer, planned)
        write_mmproj_keys(writer, cfg, file_type, meta)
        stream.write_metadata()
        for hf_name, t, p in jobs:
            data = ckpt.read(hf_name)
            if t is not None:
                data = np.ascontiguousarray(data[:, :, t])
            stream.write_tensor(p.name, [quantize(data, p.qtype)])
        stream.close()
    return out_path
