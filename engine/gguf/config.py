"""`ModelConfig`: every hyperparameter of a Qwen3.5/3.6 dense hybrid, read from GGUF keys or an HF config.

One frozen object is shared by the converter, the validator, the reference backend and the memory
planner, so the layer pattern and the derived widths (spec §1, §3.1) are computed in exactly one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from engine.errors import ModelFileError

ARCH = "qwen35"
DEFAULT_ROPE_SECTIONS = (11, 11, 10, 0)


@dataclass(frozen=True)
class ModelConfig:
    """Hyperparameters in spec notation (qwen35-spec.md §1); widths are element counts."""

    d_model: int  # D
    d_ff: int  # F
    n_layers: int  # L: trunk layers (block_count - n_mtp)
    n_mtp: int  # MTP ("nextn") blocks appended after the trunk
    n_head: int  # H
    n_head_kv: int  # Hkv
    head_dim: int  # Dh (key_length == value_length)
    rope_dims: int  # R
    rope_sections: tuple[int, int, int, int]
    rope_theta: float
    rms_eps: float
    context_length: int
    ssm_conv_kernel: int  # Kc
    ssm_d_state: int  # dk
    ssm_n_k_heads: int  # Hk
    ssm_n_v_heads: int  # Hv
    ssm_d_inner: int  # Cv = Hv * dv
    vocab_size: int  # V
    tied_embeddings: bool
    is_recurrent: tuple[bool, ...] = field(default=())  # per block, length n_layers + n_mtp
    full_attention_interval: int = 4

    def __post_init__(self) -> None:
        if not self.is_recurrent:
            object.__setattr__(self, "is_recurrent", layer_pattern(self.n_layers, self.n_mtp, self.full_attention_interval))

    # ---- derived widths -------------------------------------------------------------------
    @property
    def n_blocks(self) -> int:
        return self.n_layers + self.n_mtp

    @property
    def ssm_d_head_v(self) -> int:  # dv
        return self.ssm_d_inner // self.ssm_n_v_heads

    @property
    def ssm_key_dim(self) -> int:  # Ck
        return self.ssm_n_k_heads * self.ssm_d_state

    @property
    def ssm_conv_dim(self) -> int:  # Cc
        return 2 * self.ssm_key_dim + self.ssm_d_inner

    @property
    def q_dim(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def gdn_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if self.is_recurrent[i]]

    @property
    def attention_layers(self) -> list[int]:
        return [i for i in range(self.n_layers) if not self.is_recurrent[i]]

    def is_gdn(self, layer: int) -> bool:
        return self.is_recurrent[layer]

    # ---- constructors ---------------------------------------------------------------------
    @classmethod
    def from_gguf_fields(cls, fields: Mapping[str, Any], vocab_size: int, tied_embeddings: bool) -> "ModelConfig":
        """Build from decoded GGUF key/values (`{name: python value}`); raises ModelFileError on a missing key."""

        def key(name: str, default: Any = None) -> Any:
            full = f"{ARCH}.{name}"
            if full in fields:
                return fields[full]
            if default is None:
                raise ModelFileError(f"missing GGUF key '{full}'")
            return default

        n_blocks = int(key("block_count"))
        n_mtp = int(key("nextn_predict_layers", 0))
        sections = tuple(int(s) for s in key("rope.dimension_sections", DEFAULT_ROPE_SECTIONS))
        sections = (sections + (0, 0, 0, 0))[:4]
        interval = int(key("full_attention_interval", 4))
        recurrent_override = fields.get(f"{ARCH}.attention.recurrent_layers")
        if recurrent_override is not None:
            recurrent = tuple(bool(x) for x in recurrent_override)
            if len(recurrent) != n_blocks:
                raise ModelFileError(
                    f"'{ARCH}.attention.recurrent_layers' has {len(recurrent)} entries, block_count is {n_blocks}"
                )
        else:
            recurrent = layer_pattern(n_blocks - n_mtp, n_mtp, interval)
        key_length = int(key("attention.key_length"))
        value_length = int(key("attention.value_length", key_length))
        if key_length != value_length:
            raise ModelFileError(f"attention key_length {key_length} != value_length {value_length}")
        return cls(
            d_model=int(key("embedding_length")),
            d_ff=int(key("feed_forward_length")),
            n_layers=n_blocks - n_mtp,
            n_mtp=n_mtp,
            n_head=int(key("attention.head_count")),
            n_head_kv=int(key("attention.head_count_kv")),
            head_dim=key_length,
            rope_dims=int(key("rope.dimension_count")),
            rope_sections=sections,  # type: ignore[arg-type]
            rope_theta=float(key("rope.freq_base")),
            rms_eps=float(key("attention.layer_norm_rms_epsilon")),
            context_length=int(key("context_length")),
            ssm_conv_kernel=int(key("ssm.conv_kernel")),
            ssm_d_state=int(key("ssm.state_size")),
            ssm_n_k_heads=int(key("ssm.group_count")),
            ssm_n_v_heads=int(key("ssm.time_step_rank")),
            ssm_d_inner=int(key("ssm.inner_size")),
            vocab_size=vocab_size,
            tied_embeddings=tied_embeddings,
            is_recurrent=recurrent,
            full_attention_interval=interval,
        )

    @classmethod
    def from_hf_config(cls, hf: Mapping[str, Any], n_mtp: int = 0) -> "ModelConfig":
        """Build from an HF `config.json` dict (text config, or a multimodal one with `text_config`)."""
        hp = {**hf, **hf.get("text_config", {})}
        rope = hp.get("rope_parameters") or {}
        # Missing keys take transformers' Qwen3_5TextConfig defaults, so we convert what HF would load.
        head_dim = int(hp.get("head_dim") or 256)
        partial = float(rope.get("partial_rotary_factor", hp.get("partial_rotary_factor", 0.25)))
        sections = tuple(int(s) for s in rope.get("mrope_section", DEFAULT_ROPE_SECTIONS))
        sections = (sections + (0, 0, 0, 0))[:4]
        n_layers = int(hp["num_hidden_layers"])
        interval = int(hp.get("full_attention_interval", 4))
        layer_types = hp.get("layer_types")
        if layer_types:
            recurrent = tuple(t == "linear_attention" for t in layer_types) + (False,) * n_mtp
        else:
            recurrent = layer_pattern(n_layers, n_mtp, interval)
        return cls(
            d_model=int(hp["hidden_size"]),
            d_ff=int(hp["intermediate_size"]),
            n_layers=n_layers,
            n_mtp=n_mtp,
            n_head=int(hp["num_attention_heads"]),
            n_head_kv=int(hp["num_key_value_heads"]),
            head_dim=head_dim,
            rope_dims=int(head_dim * partial),
            rope_sections=sections,  # type: ignore[arg-type]
            rope_theta=float(rope.get("rope_theta", hp.get("rope_theta", 10_000.0))),
            rms_eps=float(hp.get("rms_norm_eps", 1e-6)),
            context_length=int(hp.get("max_position_embeddings", 32768)),
            ssm_conv_kernel=int(hp.get("linear_conv_kernel_dim", 4)),
            ssm_d_state=int(hp["linear_key_head_dim"]),
            ssm_n_k_heads=int(hp["linear_num_key_heads"]),
            ssm_n_v_heads=int(hp["linear_num_value_heads"]),
            ssm_d_inner=int(hp["linear_value_head_dim"]) * int(hp["linear_num_value_heads"]),
            vocab_size=int(hp["vocab_size"]),
            tied_embeddings=bool(hp.get("tie_word_embeddings", False)),
            is_recurrent=recurrent,
            full_attention_interval=interval,
        )


def layer_pattern(n_layers: int, n_mtp: int, interval: int) -> tuple[bool, ...]:
    """Recurrent (GDN) flag per block: every `interval`-th trunk layer is attention, MTP blocks too (spec §3.1)."""
    return tuple((i < n_layers) and ((i + 1) % interval != 0) for i in range(n_layers + n_mtp))
