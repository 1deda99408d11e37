"""`VisionTower`: the numpy fp32 Qwen3.5 ViT + 2×2 merger (spec §9.4), the executable specification of the GPU tower.

Image in (a `PreparedImage`), one text-width embedding per merged 2×2 block out, in row-major order
over the merged grid: the rows that replace that image's `<|image_pad|>` tokens. Every per-patch
quantity (patches, position embeddings, rotary angles) is in merge order, so a 2×2 block is four
consecutive rows and the merger is a reshape. Weights are the mmproj's, in numpy order.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

import numpy as np

from engine.vision.mmproj import LoadedMmproj, mmproj_tensors
from engine.vision.config import VisionConfig
from engine.vision.layers import apply_rotary, gelu_erf, gelu_tanh, layernorm, rotary_2d_tables
from engine.vision.preprocess import PreparedImage


def merge_order_coords(grid_h: int, grid_w: int, merge: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) in the patch grid of each patch, listed in merge order."""
    block_row, block_col, in_row, in_col = np.meshgrid(
        np.arange(grid_h // merge), np.arange(grid_w // merge), np.arange(merge), np.arange(merge), indexing="ij"
    )
    return (block_row * merge + in_row).ravel(), (block_col * merge + in_col).ravel()


def interpolated_positions(table: np.ndarray, side: int, rows: np.ndarray, cols: np.ndarray,
                           grid_h: int, grid_w: int) -> np.ndarray:
    """The learned side×side position grid sampled bilinearly (align_corners) at each patch: [n, E]."""

    def taps(index: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        src = index.astype(np.float32) * np.float32(side - 1) / np.float32(max(size - 1, 1))
        lo = np.floor(src)
        frac = (src - lo).astype(np.float32)
        lo = lo.astype(np.int64)
        return np.clip(lo, 0, side - 1), np.clip(lo + 1, 0, side - 1), frac

    y0, y1, fy = taps(rows, grid_h)
    x0, x1, fx = taps(cols, grid_w)
    one = np.float32(1.0)
    return (
        table[y0 * side + x0] * ((one - fy) * (one - fx))[:, None]
        + table[y0 * side + x1] * ((one - fy) * fx)[:, None]
        + table[y1 * side + x0] * (fy * (one - fx))[:, None]
        + table[y1 * side + x1] * (fy * fx)[:, None]
    )


@dataclass(frozen=True)
class _Block:
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    qkv_w: np.ndarray
    qkv_b: np.ndarray
    out_w: np.ndarray
    out_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    up_w: np.ndarray
    up_b: np.ndarray
    down_w: np.ndarray
    down_b: np.ndarray


class VisionTower:
    """Patch embedding, interpolated position embeddings, `n_layers` pre-norm blocks with 2D rotary, merger."""

    def __init__(self, cfg: VisionConfig, weights: Mapping[str, np.ndarray]):
        for name, shape in mmproj_tensors(cfg):
            if weights[name].shape != shape:
                raise ValueError(f"{name}: shape {weights[name].shape}, expected {shape}")
        self.cfg = cfg
        w = {k: np.asarray(v, dtype=np.float32) for k, v in weights.items()}
        # Both frames of a still image are the same picture, so the two temporal kernels act as one.
        kernel = w["v.patch_embd.weight"] + w["v.patch_embd.weight.1"]
        self.patch_w = kernel.reshape(cfg.n_embd, -1)
        self.patch_b = w["v.patch_embd.bias"]
        self.pos_table = w["v.position_embd.weight"]
        names = ("ln1.weight", "ln1.bias", "attn_qkv.weight", "attn_qkv.bias", "attn_out.weight", "attn_out.bias",
                 "ln2.weight", "ln2.bias", "ffn_up.weight", "ffn_up.bias", "ffn_down.weight", "ffn_down.bias")
        self.blocks = [_Block(*(w[f"v.blk.{i}.{n}"] for n in names)) for i in range(cfg.n_layers)]
        self.post_w, self.post_b = w["v.post_ln.weight"], w["v.post_ln.bias"]
        self.fc1_w, self.fc1_b = w["mm.0.weight"], w["mm.0.bias"]
        self.fc2_w, self.fc2_b = w["mm.2.weight"], w["mm.2.bias"]

    @classmethod
    def from_mmproj(cls, mmproj: LoadedMmproj) -> "VisionTower":
        """Load every tower tensor of a validated mmproj as fp32."""
        return cls(mmproj.config, {name: mmproj.file.tensor(name) for name, _ in mmproj_tensors(mmproj.config)})

    def patch_features(self, image: PreparedImage) -> np.ndarray:
        """Patch embeddings plus interpolated position embeddings, [gh·gw, E] in merge order."""
        cfg = self.cfg
        gh, gw = image.grid
        rows, cols = merge_order_coords(gh, gw, cfg.merge_size)
        x = image.patches().reshape(gh * gw, -1) @ self.patch_w.T + self.patch_b
        return x + interpolated_positions(self.pos_table, cfg.pos_side, rows, cols, gh, gw)

    def encode(self, image: PreparedImage) -> np.ndarray:
        """Embeddings [n_tokens, projection_dim] for one image (one attention segment)."""
        cfg = self.cfg
        if image.patch_size != cfg.patch_size or image.merge_size != cfg.merge_size:
            raise ValueError("the image was prepared for a different vision configuration")
        gh, gw = image.grid
        rows, cols = merge_order_coords(gh, gw, cfg.merge_size)
        cos, sin = rotary_2d_tables(rows.astype(np.float32), cols.astype(np.float32), cfg.head_dim)
        x = self.patch_features(image).astype(np.float32)
        for block in self.blocks:
            x = x + self._attention(block, layernorm(x, block.ln1_w, block.ln1_b, cfg.eps), cos, sin)
            h = layernorm(x, block.ln2_w, block.ln2_b, cfg.eps)
            x = x + gelu_tanh(h @ block.up_w.T + block.up_b) @ block.down_w.T + block.down_b
        x = layernorm(x, self.post_w, self.post_b, cfg.eps).reshape(-1, cfg.merged_width)
        return gelu_erf(x @ self.fc1_w.T + self.fc1_b) @ self.fc2_w.T + self.fc2_b

    def _attention(self, b: _Block, x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
        """Bidirectional multi-head attention over all patches of the image, q and k 2D-rotated."""
        n, cfg = x.shape[0], self.cfg
        qkv = (x @ b.qkv_w.T + b.qkv_b).reshape(n, 3, cfg.n_head, cfg.head_dim)
        q = apply_rotary(qkv[:, 0], cos, sin).transpose(1, 0, 2)  # [H, n, hd]
        k = apply_rotary(qkv[:, 1], cos, sin).transpose(1, 0, 2)
        v = qkv[:, 2].transpose(1, 0, 2)
        scores = (q @ k.transpose(0, 2, 1)) * np.float32(cfg.head_dim**-0.5)
        probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
        probs /= probs.sum(axis=-1, keepdims=True)
        o = (probs @ v).transpose(1, 0, 2).reshape(n, cfg.n_embd)
        return o @ b.out_w.T + b.out_b
