"""`GpuVisionTower`: the Qwen3.5 ViT + merger on one card with the fp16 HFMA2 kernels of `cuda_src/vision.cu`.

The same steps as the numpy tower (engine/vision/tower.py), which the GPU tests compare it with:
weights go up once as fp16 matrices (the two temporal patch kernels summed in fp32 first) with fp32
biases, LayerNorm parameters and position table; per image, fp16 pixels go up (half the bytes of
fp32 over the CMP's PCIe Gen1 x1 link), scratch buffers sized for that image are allocated, the tower
runs, and the embeddings come back as fp32 [tokens, D] (or stay on the card, `encode_on_device`).
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Mapping

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.vision_kernels import (
    ATTENTION_HEAD_SIZES,
    F16,
    F32,
    Epilogue,
    add_position_embeddings,
    attention,
    gemm,
    layernorm,
    patchify,
    split_qkv_rope,
)
from engine.vision.mmproj import LoadedMmproj, mmproj_tensors
from engine.vision.config import VisionConfig
from engine.vision.encoder import ImageEncoder
from engine.vision.preprocess import PreparedImage


@dataclass(frozen=True)
class _BlockWeights:
    ln1_w: DeviceBuffer
    ln1_b: DeviceBuffer
    qkv_w: DeviceBuffer
    qkv_b: DeviceBuffer
    out_w: DeviceBuffer
    out_b: DeviceBuffer
    ln2_w: DeviceBuffer
    ln2_b: DeviceBuffer
    up_w: DeviceBuffer
    up_b: DeviceBuffer
    down_w: DeviceBuffer
    down_b: DeviceBuffer


class GpuVisionTower:
    """The vision tower's weights on `card` and the per-image launch sequence."""

    def __init__(self, card: CudaCard, cfg: VisionConfig, weights: Mapping[str, np.ndarray]):
        if cfg.head_dim not in ATTENTION_HEAD_SIZES:
            raise ValueError(f"no GPU attention kernel for vision head size {cfg.head_dim} ({ATTENTION_HEAD_SIZES})")
        for name, shape in mmproj_tensors(cfg):
            if weights[name].shape != shape:
                raise ValueError(f"{name}: shape {weights[name].shape}, expected {shape}")
        self.card = card
        self.cfg = cfg

        def half(name: str, array: np.ndarray) -> DeviceBuffer:
            return card.upload(np.asarray(array, np.float32).astype(np.float16), f"vision {name}")

        def single(name: str) -> DeviceBuffer:
            return card.upload(np.asarray(weights[name], np.float32), f"vision {name}")

        kernel = np.asarray(weights["v.patch_embd.weight"], np.float32) + np.asarray(weights["v.patch_embd.weight.1"], np.float32)
        self.patch_w = half("patch kernel", kernel.reshape(cfg.n_embd, -1))
        self.patch_b = single("v.patch_embd.bias")
        self.pos_table = single("v.position_embd.weight")
        self.blocks = []
        for i in range(cfg.n_layers):
            p = f"v.blk.{i}."
            self.blocks.append(_BlockWeights(
                single(p + "ln1.weight"), single(p + "ln1.bias"),
                half(p + "attn_qkv.weight", weights[p + "attn_qkv.weight"]), single(p + "attn_qkv.bias"),
                half(p + "attn_out.weight", weights[p + "attn_out.weight"]), single(p + "attn_out.bias"),
                single(p + "ln2.weight"), single(p + "ln2.bias"),
                half(p + "ffn_up.weight", weights[p + "ffn_up.weight"]), single(p + "ffn_up.bias"),
                half(p + "ffn_down.weight", weights[p + "ffn_down.weight"]), single(p + "ffn_down.bias"),
            ))
        self.post_w, self.post_b = single("v.post_ln.weight"), single("v.post_ln.bias")
        self.fc1_w, self.fc1_b = half("mm.0.weight", weights["mm.0.weight"]), single("mm.0.bias")
        self.fc2_w, self.fc2_b = half("mm.2.weight", weights["mm.2.weight"]), single("mm.2.bias")

    @classmethod
    def from_mmproj(cls, card: CudaCard, mmproj: LoadedMmproj) -> "GpuVisionTower":
        return cls(card, mmproj.config, {name: mmproj.file.tensor(name) for name, _ in mmproj_tensors(mmproj.config)})

    def encode(self, image: PreparedImage, stream: Stream | None = None) -> np.ndarray:
        """Embeddings [tokens, projection_dim] fp32 on the host, like `VisionTower.encode`."""
        with ExitStack() as scratch:
            out = self.encode_on_device(image, scratch, stream)
            (stream or self.card.stream).synchronize()
            return out.download(np.float32, (image.n_tokens, self.cfg.projection_dim))

    def encode_on_device(self, image: PreparedImage, scratch: ExitStack, stream: Stream | None = None) -> DeviceBuffer:
        """Queue the tower for one image; returns the fp32 [tokens, D] output buffer. Every buffer this
        allocates (the output included) is freed when `scratch` closes, after the caller has used it."""
        cfg, card = self.cfg, self.card
        if image.patch_size != cfg.patch_size or image.merge_size != cfg.merge_size:
            raise ValueError("the image was prepared for a different vision configuration")
        gh, gw = image.grid
        n, e, f = gh * gw, cfg.n_embd, cfg.n_ff
        tokens = image.n_tokens

        def alloc(nbytes: int, label: str) -> DeviceBuffer:
            buf = card.alloc(nbytes, f"vision {label}")
            scratch.callback(buf.free)
            return buf

        pixels = card.upload(image.pixels.astype(np.float16), "vision pixels")
        scratch.callback(pixels.free)
        patches = alloc(n * 3 * cfg.patch_size**2 * F16, "patches")
        x = alloc(n * e * F32, "residual")
        xn = alloc(n * e * F16, "normed")
        hidden = alloc(n * f * F16, "mlp hidden")
        qkv = alloc(n * 3 * e * F32, "qkv")
        q, k, v, att = (alloc(n * e * F16, name) for name in ("q", "k", "v", "attention"))
        merged = alloc(tokens * cfg.merged_width * F16, "merger hidden")
        out = alloc(tokens * cfg.projection_dim * F32, "embeddings")

        _, height, width = image.pixels.shape
        patchify(card, pixels, height, width, cfg.patch_size, cfg.merge_size, patches, stream)
        gemm(card, patches, self.patch_w, self.patch_b, x, n, e, 3 * cfg.patch_size**2, Epilogue.STORE, stream)
        add_position_embeddings(card, x, self.pos_table, cfg.pos_side, gh, gw, cfg.merge_size, e, stream)
        for b in self.blocks:
            layernorm(card, x, b.ln1_w, b.ln1_b, xn, n, e, cfg.eps, stream)
            gemm(card, xn, b.qkv_w, b.qkv_b, qkv, n, 3 * e, e, Epilogue.STORE, stream)
            split_qkv_rope(card, qkv, n, cfg.n_head, cfg.head_dim, gw, cfg.merge_size, q, k, v, stream)
            attention(card, q, k, v, att, n, cfg.n_head, cfg.head_dim, stream)
            gemm(card, att, b.out_w, b.out_b, x, n, e, e, Epilogue.RESIDUAL, stream)
            layernorm(card, x, b.ln2_w, b.ln2_b, xn, n, e, cfg.eps, stream)
            gemm(card, xn, b.up_w, b.up_b, hidden, n, f, e, Epilogue.GELU_TANH, stream)
            gemm(card, hidden, b.down_w, b.down_b, x, n, e, f, Epilogue.RESIDUAL, stream)
        # post LayerNorm per patch; 4 consecutive merge-order rows are one token's merger input
        layernorm(card, x, self.post_w, self.post_b, xn, n, e, cfg.eps, stream)
        gemm(card, xn, self.fc1_w, self.fc1_b, merged, tokens, cfg.merged_width, cfg.merged_width, Epilogue.GELU_ERF, stream)
        gemm(card, merged, self.fc2_w, self.fc2_b, out, tokens, cfg.projection_dim, cfg.merged_width, Epilogue.STORE, stream)
        return out


def gpu_image_encoder(card: CudaCard, mmproj: LoadedMmproj) -> ImageEncoder:
    """An `ImageEncoder` whose tower runs on `card` with the fp16 kernels (uploaded now; call on the card's thread)."""
    return ImageEncoder(mmproj, tower=GpuVisionTower.from_mmproj(card, mmproj))
