"""The released Qwen3.5 text-model shapes (spec §7.1) as `ModelConfig`s, for synthetic full-size models.

Only sizes whose hyperparameters the spec confirms are here: 0.8B (tied embeddings, no MTP block
written: its MTP is UNCONFIRMED), 9B and 27B (untied, one MTP block each).
"""

from __future__ import annotations

from engine.errors import RigllmError
from engine.gguf.config import DEFAULT_ROPE_SECTIONS, ModelConfig

_COMMON = dict(
    head_dim=256,
    rope_dims=64,
    rope_sections=DEFAULT_ROPE_SECTIONS,
    rope_theta=10_000_000.0,
    rms_eps=1e-6,
    context_length=262_144,
    ssm_conv_kernel=4,
    ssm_d_state=128,
    ssm_n_k_heads=16,
    vocab_size=248_320,
)

# The file types of full-size synthetic benchmark models: the matrix types the GPU runs (no fp32 weights on the card)
SYNTHETIC_WEIGHTS = ("q8_0", "q4_k_m", "q5_k_m", "q6_k")

SHAPES: dict[str, ModelConfig] = {
    "0.8b": ModelConfig(
        d_model=1024, d_ff=3584, n_layers=24, n_mtp=0, n_head=8, n_head_kv=2,
        ssm_n_v_heads=16, ssm_d_inner=16 * 128, tied_embeddings=True, **_COMMON,  # type: ignore[arg-type]
    ),
    "9b": ModelConfig(
        d_model=4096, d_ff=12288, n_layers=32, n_mtp=1, n_head=16, n_head_kv=4,
        ssm_n_v_heads=32, ssm_d_inner=32 * 128, tied_embeddings=False, **_COMMON,  # type: ignore[arg-type]
    ),
    "27b": ModelConfig(
        d_model=5120, d_ff=17408, n_layers=64, n_mtp=1, n_head=24, n_head_kv=4,
        ssm_n_v_heads=48, ssm_d_inner=48 * 128, tied_embeddings=False, **_COMMON,  # type: ignore[arg-type]
    ),
}


def shape_config(name: str) -> ModelConfig:
    """The `ModelConfig` of a released size ("0.8b", "9b", "27b")."""
    try:
        return SHAPES[name.lower()]
    except KeyError:
        raise RigllmError(f"unknown model shape '{name}' (known: {', '.join(SHAPES)})") from None
