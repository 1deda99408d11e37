"""Optional rounding of matmul inputs to Q8_1, so the reference sees what the DP4A kernels see.

contracts.md ("Numerics and comparisons between backends"): backend comparisons run the reference in
a mode that rounds activations exactly as the kernels do. The kernels multiply int8 weights (Q8_0)
with int8 activations: before every weight GEMV/GEMM the fp32 input row is quantised to Q8_1 in
blocks of 32 consecutive values along the input dimension, as ggml's CUDA `quantize_q8_1` does:

    amax = max|x| over the block
    d    = amax / 127                       (fp32)
    q    = 0 if amax == 0 else roundf(x / d) (round half away from zero; |q| ≤ 127)
    x'   = q · fp16(d)                       (the scale is stored as fp16; the dot product uses it)

A row whose length is not a multiple of 32 is padded with zeros for the block grouping (ggml pads the
same way). What is rounded, precisely: the input of every matmul against a model weight (`attn_qkv`,
`attn_gate`, `ssm_alpha`, `ssm_beta`, `ssm_out`, `attn_q/k/v/output`, `ffn_gate/up/down`, the LM head
and the MTP `eh_proj`), except weights listed as fp32 kernels (contracts.md "Model files": `ssm_alpha`
and `ssm_beta` stored as F32 run in fp32 kernels). Nothing else is rounded: the residual stream,
norms, RoPE, attention scores and softmax, the KV cache, the conv and the GDN state math stay fp32.
The weights are used as given: a Q8_0 or K-quant (Q4_K, Q5_K, Q6_K) file is exactly what the kernels
multiply, while for an F16/BF16/F32 file the GPU backend requantises large weights to Q8_0 at load and
the reference does not, so backend comparisons in this mode should use Q8_0 or K-quant files. The
K-quant kernels (cuda_src/gemv_kq.cu, gemm_kq.cu) take the same Q8_1 activations and compute each
32-value block exactly in integers, d·s·Σ(q·xq) − dmin·m·Σxq times the activation scale, so they
differ from this mode by fp32 summation order only (llama.cpp's MMVQ does the same, except that it
stores Σxq in fp16, a rounding our kernels do not have).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum

import numpy as np
from gguf import GGMLQuantizationType

from engine.gguf.model_file import TensorInfo
from engine.model.model_footprint import FP32_KERNEL_SUFFIXES

Q8_1_BLOCK = 32


class ActivationRounding(Enum):
    """How matmul inputs are treated: EXACT keeps fp32; KERNEL rounds them to Q8_1 like the DP4A kernels."""

    EXACT = "exact"
    KERNEL = "kernel"


def round_q8_1(x: np.ndarray) -> np.ndarray:
    """x with each 32-value block of the last axis replaced by its Q8_1 value (see module docstring)."""
    x = np.asarray(x, dtype=np.float32)
    n = x.shape[-1]
    pad = (-n) % Q8_1_BLOCK
    padded = np.concatenate([x, np.zeros(x.shape[:-1] + (pad,), np.float32)], axis=-1) if pad else x
    blocks = padded.reshape(padded.shape[:-1] + (-1, Q8_1_BLOCK))
    amax = np.max(np.abs(blocks), axis=-1, keepdims=True)
    d = amax / np.float32(127.0)
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(amax > 0, blocks / d, np.float32(0.0))
    whole = np.trunc(scaled)  # C roundf (half away from zero), exact: no `+0.5` rounding trap in fp32
    q = whole + np.where(np.abs(scaled - whole) >= 0.5, np.sign(scaled), np.float32(0.0))
    d16 = d.astype(np.float16).astype(np.float32)
    return (q * d16).reshape(padded.shape)[..., :n].astype(np.float32, copy=False)


def fp32_kernel_weights(tensors: Mapping[str, TensorInfo]) -> frozenset[str]:
    """Names of the matmul weights a GPU backend runs in fp32 for this file (their inputs are not rounded)."""
    return frozenset(
        name
        for name, info in tensors.items()
        if name.endswith(FP32_KERNEL_SUFFIXES) and info.ggml_type == GGMLQuantizationType.F32
    )
