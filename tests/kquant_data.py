"""Random K-quant test data shared by the CPU and GPU tests: blocks with every bit pattern, and a tiny model shape.

`random_kquant_bytes` fills whole blocks with random bytes (so every scale/min bit, the Q5_K high bits and
the Q6_K signed scales all take both values) and then overwrites the fp16 super-block scales with finite
positive values: random fp16 bytes would include NaN and infinity.
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.gguf.config import DEFAULT_ROPE_SECTIONS, ModelConfig
from engine.gguf.kquant_blocks import BLOCK_BYTES, QK_K
from engine.fixtures.synthetic_vocab import QWEN35_VOCAB_SIZE

Q = GGMLQuantizationType
KQ_TYPES = (Q.Q4_K, Q.Q5_K, Q.Q6_K)
KQ_FILE_TYPES = ("q4_k_m", "q5_k_m", "q6_k")


def random_kquant_bytes(rng: np.random.Generator, qtype: GGMLQuantizationType, rows: int, k: int) -> np.ndarray:
    """uint8 [rows, k/256 · block bytes] of random `qtype` blocks with d (and dmin) in [0.5, 2) / 4096."""
    n = rows * (k // QK_K)
    blocks = rng.integers(0, 256, size=(n, BLOCK_BYTES[qtype]), dtype=np.uint8)
    scales = (rng.uniform(0.5, 2.0, size=(n, 2)) / 4096).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, 208:210] = scales[:, :2]
    else:
        blocks[:, 0:4] = scales
    return blocks.reshape(rows, -1)


def min_magnitude(raw: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """fp64 [rows, k]: |dmin · m| of every value (0 for Q6_K), from gguf's dequantize of the blocks with q = 0."""
    rows = raw.shape[0]
    if qtype == Q.Q6_K:
        return np.zeros((rows, raw.shape[1] // BLOCK_BYTES[qtype] * QK_K))
    blocks = raw.reshape(-1, BLOCK_BYTES[qtype]).copy()
    blocks[:, 16:] = 0  # qh and qs: every quant 0, value = -dmin·m
    return np.abs(dequantize(blocks, qtype).astype(np.float64)).reshape(rows, -1)


def kq_error_bound(raw: np.ndarray, qtype: GGMLQuantizationType, w: np.ndarray, x: np.ndarray,
                   rel: float = 1e-5) -> np.ndarray:
    """Per-output bound [t, rows] of an fp32 K-quant dot product: rel · Σ_k (|d·s·q| + |dmin·m|) |x|.

    The kernels sum the scale part d·s·Σqx and the min part dmin·m·Σx separately, so fp32 rounding scales
    with both parts (|d·s·q| = |w + dmin·m|), not with their difference |w|."""
    m = min_magnitude(raw, qtype)
    magnitude = np.abs(w) + 2 * m  # >= |w + m| + m = |d·s·q| + |dmin·m|
    return rel * (np.abs(x.astype(np.float64)) @ magnitude.T) + 1e-30


def kquant_tiny_config(tied: bool = False) -> ModelConfig:
    """A 4-layer qwen35 shape whose every matmul input width is a multiple of 256 (K-quant rows need it):
    D 256, F 512, 4 heads of 64 sharing one KV head, 2 GDN key and value heads of 128 (llama.cpp loads
    GDN layers with equal key and value head widths only); the real vocabulary size."""
    return ModelConfig(
        d_model=256, d_ff=512, n_layers=4, n_mtp=0, n_head=4, n_head_kv=1, head_dim=64, rope_dims=64,
        rope_sections=DEFAULT_ROPE_SECTIONS, rope_theta=10_000_000.0, rms_eps=1e-6, context_length=4096,
        ssm_conv_kernel=4, ssm_d_state=128, ssm_n_k_heads=2, ssm_n_v_heads=2, ssm_d_inner=256,
        tied_embeddings=tied, vocab_size=QWEN35_VOCAB_SIZE,
    )
