"""Open a Qwen3.5 mmproj GGUF (llama.cpp's `clip` file with `clip.projector_type = qwen3vl_merger`) for use.

Like `load_model` for the text file: the header is parsed defensively, then identity, keys, tensor
presence, shapes and types are checked in one order, and the first problem is one `ModelFileError`
line naming the file. Names and shapes are the ones llama.cpp's converter writes (spec §9.2), listed
here in numpy order (`ne` reversed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import ModelFileError
from engine.gguf.header import show
from engine.gguf.model_file import SUPPORTED_TYPES, ModelFile
from engine.vision.config import PROJECTOR_TYPE, VisionConfig

CLIP_ARCH = "clip"
_INT_KEYS = {
    "n_embd": "clip.vision.embedding_length",
    "n_ff": "clip.vision.feed_forward_length",
    "n_layers": "clip.vision.block_count",
    "n_head": "clip.vision.attention.head_count",
    "patch_size": "clip.vision.patch_size",
    "merge_size": "clip.vision.spatial_merge_size",
    "image_size": "clip.vision.image_size",
    "projection_dim": "clip.vision.projection_dim",
}
_EPS_KEY = "clip.vision.attention.layer_norm_epsilon"
_MIN_PIXELS_KEY = "clip.vision.image_min_pixels"
_MAX_PIXELS_KEY = "clip.vision.image_max_pixels"
_LIMIT = 1 << 20  # far above any real width; bounds what a corrupt key can make us allocate
_PIXEL_LIMIT = 1 << 28  # image pixel bounds: far above any budget a vision tower can run


@dataclass(frozen=True)
class LoadedMmproj:
    """A validated mmproj file and its configuration."""

    file: ModelFile
    config: VisionConfig

    @property
    def path(self) -> Path:
        return self.file.path


def mmproj_tensors(cfg: VisionConfig) -> list[tuple[str, tuple[int, ...]]]:
    """Every tensor the tower reads, with its numpy-order shape."""
    e, f, m = cfg.n_embd, cfg.n_ff, cfg.merged_width
    p = cfg.patch_size
    out: list[tuple[str, tuple[int, ...]]] = [
        ("v.patch_embd.weight", (e, 3, p, p)),
        ("v.patch_embd.weight.1", (e, 3, p, p)),
        ("v.patch_embd.bias", (e,)),
        ("v.position_embd.weight", (cfg.pos_side**2, e)),
    ]
    for i in range(cfg.n_layers):
        b = f"v.blk.{i}."
        out += [
            (b + "ln1.weight", (e,)), (b + "ln1.bias", (e,)),
            (b + "attn_qkv.weight", (3 * e, e)), (b + "attn_qkv.bias", (3 * e,)),
            (b + "attn_out.weight", (e, e)), (b + "attn_out.bias", (e,)),
            (b + "ln2.weight", (e,)), (b + "ln2.bias", (e,)),
            (b + "ffn_up.weight", (f, e)), (b + "ffn_up.bias", (f,)),
            (b + "ffn_down.weight", (e, f)), (b + "ffn_down.bias", (e,)),
        ]
    out += [
        ("v.post_ln.weight", (e,)), ("v.post_ln.bias", (e,)),
        ("mm.0.weight", (m, m)), ("mm.0.bias", (m,)),
        ("mm.2.weight", (cfg.projection_dim, m)), ("mm.2.bias", (cfg.projection_dim,)),
    ]
    return out


def _int_key(fields: dict[str, Any], key: str, label: str, limit: int = _LIMIT) -> int:
    value = fields.get(key)
    if value is None:
        raise ModelFileError(f"{label}: missing key {key}; not a complete Qwen3.5 mmproj file")
    if not isinstance(value, int) or isinstance(value, bool) or not 0 < value <= limit:
        raise ModelFileError(f"{label}: key {key} = {show(value)} is not a positive integer in range")
    return value


def _triple(fields: dict[str, Any], key: str, label: str) -> tuple[float, float, float]:
    value = fields.get(key, [0.5, 0.5, 0.5])  # absent: Qwen3.5's own normalisation
    if not isinstance(value, list) or len(value) != 3 or not all(isinstance(x, (int, float)) for x in value):
        raise ModelFileError(f"{label}: key {key} = {show(value)} is not three numbers")
    return (float(value[0]), float(value[1]), float(value[2]))


def config_from_fields(fields: dict[str, Any], label: str) -> VisionConfig:
    """Check identity and keys of an mmproj header and build its `VisionConfig`."""
    arch = fields.get("general.architecture")
    if arch != CLIP_ARCH:
        hint = " (that is a text model file; pass the mmproj-*.gguf that came with it)" if arch == "qwen35" else ""
        raise ModelFileError(f"{label}: architecture {show(arch)} is not an mmproj ('clip') file{hint}")
    if fields.get("clip.has_vision_encoder") is not True:
        raise ModelFileError(f"{label}: has no vision encoder (clip.has_vision_encoder is not true)")
    projector = fields.get("clip.projector_type", fields.get("clip.vision.projector_type"))
    if projector != PROJECTOR_TYPE:
        raise ModelFileError(
            f"{label}: projector type {show(projector)} is not supported; rigllm runs Qwen3.5 vision "
            f"('{PROJECTOR_TYPE}')"
        )
    deepstack = fields.get("clip.vision.is_deepstack_layers", [])
    if any(deepstack):
        raise ModelFileError(f"{label}: has deepstack layers (a Qwen3-VL mmproj?); Qwen3.5 vision has none")
    ints = {name: _int_key(fields, key, label) for name, key in _INT_KEYS.items()}
    eps = fields.get(_EPS_KEY, 1e-6)
    if not isinstance(eps, float) or not 0 < eps < 1:
        raise ModelFileError(f"{label}: key {_EPS_KEY} = {show(eps)} is not a small positive number")
    cfg = VisionConfig(
        **ints,
        eps=eps,
        image_mean=_triple(fields, "clip.vision.image_mean", label),
        image_std=_triple(fields, "clip.vision.image_std", label),
        min_pixels=_int_key(fields, _MIN_PIXELS_KEY, label, _PIXEL_LIMIT) if _MIN_PIXELS_KEY in fields else None,
        max_pixels=_int_key(fields, _MAX_PIXELS_KEY, label, _PIXEL_LIMIT) if _MAX_PIXELS_KEY in fields else None,
    )
    if cfg.n_embd % cfg.n_head or cfg.head_dim % 4:
        raise ModelFileError(f"{label}: width {cfg.n_embd} over {cfg.n_head} heads does not give a head size divisible by 4")
    if cfg.image_size % cfg.patch_size:
        raise ModelFileError(f"{label}: image size {cfg.image_size} is not a multiple of the patch size {cfg.patch_size}")
    if min(cfg.image_std) <= 0:
        raise ModelFileError(f"{label}: image_std {cfg.image_std} has a non-positive entry")
    low, high = cfg.pixel_bounds()
    if not 0 < low <= high:
        raise ModelFileError(f"{label}: image pixel bounds {low}..{high} are not a valid range")
    return cfg


def load_mmproj(path: str | Path) -> LoadedMmproj:
    """Validate `path` as a Qwen3.5 mmproj GGUF; raises ModelFileError on the first problem."""
    mf = ModelFile(path)
    label = mf.path.name
    cfg = config_from_fields(mf.fields, label)
    for name, shape in mmproj_tensors(cfg):
        info = mf.tensors.get(name)
        if info is None:
            raise ModelFileError(f"{label}: missing tensor {name}")
        if info.numpy_shape != shape:
            raise ModelFileError(
                f"{label}: tensor {name} has shape {list(info.ne)} (ne), expected {list(reversed(shape))}"
            )
        if info.ggml_type not in SUPPORTED_TYPES:
            raise ModelFileError(
                f"{label}: tensor {name} has type {info.ggml_type.name}; rigllm reads Q8_0, F16, BF16 and F32 mmproj files"
            )
    return LoadedMmproj(mf, cfg)


def check_pairing(mmproj: LoadedMmproj, text_width: int, model_label: str) -> None:
    """Refuse an mmproj whose output width is not the text model's (it belongs to another model size)."""
    if mmproj.config.projection_dim != text_width:
        raise ModelFileError(
            f"{mmproj.path.name}: projects images to width {mmproj.config.projection_dim}, but {model_label} "
            f"has width {text_width}; use the mmproj made for that model"
        )
