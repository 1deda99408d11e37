"""HF Qwen3.5 tensor → GGUF tensor: names and value transforms exactly as llama.cpp's converter (spec §5).

Pure numpy, one tensor at a time, so the converter can stream a checkpoint and the reference tests
can turn a transformers state dict into GGUF-layout weights without writing a file.
"""

from __future__ import annotations

import re
from typing import Iterator

import numpy as np

from engine.gguf.config import ModelConfig

_LAYER_RENAMES = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight",
    "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
    "linear_attn.in_proj_qkv.weight": "attn_qkv.weight",
    "linear_attn.in_proj_z.weight": "attn_gate.weight",
    "linear_attn.in_proj_b.weight": "ssm_beta.weight",
    "linear_attn.in_proj_a.weight": "ssm_alpha.weight",
    "linear_attn.out_proj.weight": "ssm_out.weight",
    "linear_attn.norm.weight": "ssm_norm.weight",
    "linear_attn.conv1d.weight": "ssm_conv1d.weight",
    "linear_attn.dt_bias": "ssm_dt.bias",
    "linear_attn.A_log": "ssm_a",
    # MTP block extras (after the mtp.* → model.layers.L.* remap below)
    "eh_proj.weight": "nextn.eh_proj.weight",
    "enorm.weight": "nextn.enorm.weight",
    "hnorm.weight": "nextn.hnorm.weight",
    "shared_head.norm.weight": "nextn.shared_head_norm.weight",
}
_GLOBAL_RENAMES = {
    "embed_tokens.weight": "token_embd.weight",
    "norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
_MTP_RENAMES = {"fc": "eh_proj", "pre_fc_norm_embedding": "enorm", "pre_fc_norm_hidden": "hnorm", "norm": "shared_head.norm"}
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def strip_hf_prefix(name: str, n_layers: int) -> str | None:
    """Canonical text-model name (`layers.N.x`, `embed_tokens.weight`, ...), or None for a tensor we skip.

    Handles `model.`, `model.language_model.` and top-level `lm_head`; maps `mtp.*` onto block `n_layers`
    (llama.cpp's nextn naming); drops vision tensors.
    """
    for prefix in ("model.language_model.", "language_model.model.", "model."):
        if name.startswith(prefix):
            name = name[len(prefix):]
            break
    if name.startswith(("visual.", "vision_tower.", "model.visual.")):
        return None
    if name.startswith("mtp."):
        parts = name.split(".", 3)
        if len(parts) == 4 and parts[1] == "layers" and parts[2].isdecimal():
            return f"layers.{n_layers + int(parts[2])}.{parts[3]}"
        if len(parts) == 3 and parts[1] in _MTP_RENAMES:
            return f"layers.{n_layers}.{_MTP_RENAMES[parts[1]]}.{parts[2]}"
        return None
    return name


def gguf_name(canonical: str) -> str | None:
    """GGUF name for a canonical HF name, or None if the converter would not write it."""
    if canonical in _GLOBAL_RENAMES:
        return _GLOBAL_RENAMES[canonical]
    m = _LAYER_RE.match(canonical)
    if m and m.group(2) in _LAYER_RENAMES:
        return f"blk.{m.group(1)}.{_LAYER_RENAMES[m.group(2)]}"
    return None


def reorder_v_heads(x: np.ndarray, axis: int, n_k_heads: int, v_per_k: int, head_dim: int) -> np.ndarray:
    """Grouped (by key head) → tiled V-head order along `axis` (llama.cpp `_reorder_v_heads`)."""
    shape = list(x.shape)
    axis %= x.ndim
    grouped = x.reshape(shape[:axis] + [n_k_heads, v_per_k, head_dim] + shape[axis + 1:])
    return np.ascontiguousarray(np.swapaxes(grouped, axis, axis + 1)).reshape(shape)


def transform(cfg: ModelConfig, canonical: str, data: np.ndarray) -> np.ndarray:
    """Apply the converter's value transforms to one tensor (numpy order in, numpy order out)."""
    if canonical.endswith(".A_log"):
        # exp in float64, rounded once: within 1 ulp of torch's float32 exp (llama.cpp's converter) for
        # every value and equal for ~99% of them; numpy's own float32 exp differs for ~40%.
        data = -np.exp(data.astype(np.float64)).astype(np.float32)
    elif "conv1d" in canonical:
        data = data.reshape(data.shape[0], -1)  # torch [Cc, 1, Kc] → [Cc, Kc]
    elif canonical.endswith("norm.weight") and not canonical.endswith("linear_attn.norm.weight"):
        data = data + 1

    hk, hv = cfg.ssm_n_k_heads, cfg.ssm_n_v_heads
    if hk != hv and ".linear_attn." in canonical:
        r, dv = hv // hk, cfg.ssm_d_head_v
        if ".in_proj_qkv." in canonical:
            qk = 2 * cfg.ssm_key_dim
            data = np.concatenate([data[:qk], reorder_v_heads(data[qk:], 0, hk, r, dv)], axis=0)
        elif ".in_proj_z." in canonical:
            data = reorder_v_heads(data, 0, hk, r, dv)
        elif ".in_proj_b." in canonical or ".in_proj_a." in canonical:
            data = reorder_v_heads(data, 0, hk, r, 1)
        elif canonical.endswith((".A_log", ".dt_bias")):
            data = reorder_v_heads(data, 0, hk, r, 1)
        elif ".conv1d." in canonical:
            qk = 2 * cfg.ssm_key_dim
            data = np.concatenate([data[:qk], reorder_v_heads(data[qk:], 0, hk, r, dv)], axis=0)
        elif ".out_proj." in canonical:
            data = reorder_v_heads(data, 1, hk, r, dv)
    return data


def target_name(cfg: ModelConfig, hf_name: str) -> tuple[str, str] | None:
    """(canonical name, GGUF name) an HF tensor is written as, or None when the GGUF omits it."""
    canonical = strip_hf_prefix(hf_name, cfg.n_layers)
    if canonical is None:
        return None
    if canonical.startswith("layers.") and int(canonical.split(".")[1]) >= cfg.n_blocks:
        return None  # MTP tensors when converting without the MTP block
    name = gguf_name(canonical)
    if name is None or (name == "output.weight" and cfg.tied_embeddings):
        return None
    return canonical, name


def gguf_shape(canonical: str, hf_shape: tuple[int, ...]) -> tuple[int, ...]:
    """Numpy-order shape `transform` gives a tensor of `hf_shape` (only conv1d changes: it is squeezed)."""
    if "conv1d" in canonical:
        return (hf_shape[0], int(np.prod(hf_shape[1:])))
    return hf_shape


def hf_to_gguf_tensors(cfg: ModelConfig, items: Iterator[tuple[str, np.ndarray]]) -> Iterator[tuple[str, np.ndarray]]:
    """Stream (HF name, array) pairs into (GGUF name, transformed array) pairs, skipping what GGUF omits."""
    for hf_name, data in items:
        target = target_name(cfg, hf_name)
        if target is not None:
            yield target[1], transform(cfg, target[0], data)
