"""Tiny seeded transformers Qwen3.5 models and their GGUF-layout weights, for the reference tests.

The HF default init (std 0.02, zero norm weights, dt_bias = 1) would hide bugs: near-zero logits,
norm offsets that cannot be told apart, decays so strong that no state survives a chunk boundary.
`perturbed_model` re-draws every parameter so that each of those mistakes shows in the logits.
`write_gguf` turns converted weights into a GGUF file (in a test's tmp dir) that both
`ModelFile` and llama.cpp load. torch and transformers are imported lazily (dev-only dependencies).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, LlamaFileType
from gguf.quants import quantize

from engine.gguf.config import ModelConfig
from engine.gguf.hf_tensors import hf_to_gguf_tensors
from engine.gguf.metadata import new_writer, write_model_keys, write_quantization_version
from engine.fixtures.synthetic_vocab import byte_symbols
from engine.gguf.vocab import Vocab, write_vocab
from engine.reference import ReferenceModel


@dataclass(frozen=True)
class TinyShape:
    """One tiny configuration; `hf_kwargs` go to `Qwen3_5TextConfig`."""

    name: str
    hf_kwargs: dict[str, Any] = field(default_factory=dict)


def _shape(name: str, layers: int, heads: int, kv_heads: int, head_dim: int, k_heads: int, v_heads: int,
           dk: int, dv: int, sections: list[int], tied: bool) -> TinyShape:
    return TinyShape(name, dict(
        vocab_size=256, hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
        num_attention_heads=heads, num_key_value_heads=kv_heads, head_dim=head_dim,
        linear_num_key_heads=k_heads, linear_num_value_heads=v_heads,
        linear_key_head_dim=dk, linear_value_head_dim=dv, linear_conv_kernel_dim=4,
        rope_parameters={"rope_type": "default", "rope_theta": 10_000_000.0, "partial_rotary_factor": 0.25,
                         "mrope_section": sections, "mrope_interleaved": True},
        tie_word_embeddings=tied, max_position_embeddings=1024, rms_norm_eps=1e-6,
    ))


# GQA ratio H/Hkv 1, 2, 4; value heads per key head 1, 2, 3; tied and untied; 6, 7 and 5 layers;
# rotary dims 8, 12, 16 (partial factor 0.25) with mrope sections summing to rope_dims / 2.
SHAPES = [
    _shape("gqa1_v1_tied_6l", 6, 2, 2, 32, 2, 2, 16, 8, [2, 1, 1], tied=True),
    _shape("gqa2_v2_untied_7l", 7, 4, 2, 48, 2, 4, 8, 16, [3, 2, 1], tied=False),
    _shape("gqa4_v3_tied_5l", 5, 4, 1, 64, 2, 6, 16, 16, [3, 3, 2], tied=True),
]


# Projections that write into the residual stream are drawn 0.3× smaller, as in trained models where
# each layer adds a modest update. Random GDN stacks amplify small changes strongly; this keeps them
# calmer (measured: fp32 gap to transformers 2.4e-5 → 9e-6, KERNEL-mode top-1 agreement 77% → 93%).
RESIDUAL_WRITERS = ("out_proj.weight", "o_proj.weight", "down_proj.weight")


def perturbed_model(shape: TinyShape, seed: int):
    """A `Qwen3_5ForCausalLM` in fp32 eval mode with every parameter redrawn from `seed`."""
    import torch
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    torch.manual_seed(seed)
    model = Qwen3_5ForCausalLM(Qwen3_5TextConfig(**shape.hf_kwargs)).float().eval()
    gen = torch.Generator().manual_seed(seed)

    def normal(t: torch.Tensor, mean: float, std: float) -> torch.Tensor:
        return torch.randn(t.shape, generator=gen) * std + mean

    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("linear_attn.norm.weight"):
                p.copy_(normal(p, 1.0, 0.3))  # plain weight: a spurious +1 would show
            elif name.endswith("norm.weight"):
                p.copy_(normal(p, 0.0, 0.3))  # zero-centred: a missing +1 would show
            elif name.endswith("A_log"):
                a = torch.rand(p.shape, generator=gen) * 0.3 + 0.02  # mild decay: state spans chunks
                a[0] = 0.02  # head 0 runs near softplus' threshold (see dt_bias): keep its decay mild too
                p.copy_(torch.log(a))
            elif name.endswith("dt_bias"):
                vals = normal(p, -1.0, 0.5)
                vals[0] = 20.0  # alpha + dt_bias crosses torch's softplus threshold (20) on head 0
                p.copy_(vals)
            elif name.endswith("conv1d.weight"):
                p.copy_(normal(p, 0.0, 0.5))
            elif name.endswith("embed_tokens.weight"):
                p.copy_(normal(p, 0.0, 0.2))  # small: a tied head must not just echo the input token
            elif name.endswith(RESIDUAL_WRITERS):
                p.copy_(normal(p, 0.0, 0.3 * p.shape[-1] ** -0.5))
            else:
                p.copy_(normal(p, 0.0, p.shape[-1] ** -0.5))
    return model


def model_config(model, n_mtp: int = 0) -> ModelConfig:
    return ModelConfig.from_hf_config(model.config.to_dict(), n_mtp=n_mtp)


def gguf_weights(model, cfg: ModelConfig, extra: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The model's state dict (plus `extra` HF-named tensors, e.g. `mtp.*`) converted to GGUF names/layout."""
    items = [(k, v.detach().numpy().astype(np.float32)) for k, v in model.state_dict().items()]
    items += list((extra or {}).items())
    return dict(hf_to_gguf_tensors(cfg, iter(items)))


def reference_for(model) -> ReferenceModel:
    """The exact-fp32 reference model holding `model`'s converted weights."""
    cfg = model_config(model)
    return ReferenceModel(cfg, gguf_weights(model, cfg))


def hf_logits(model, tokens: np.ndarray, position_ids: np.ndarray | None = None) -> np.ndarray:
    """transformers' logits [T, V] for one sequence (no cache); position_ids [3, T] for 3-D positions."""
    import torch

    kwargs = {}
    if position_ids is not None:
        kwargs["position_ids"] = torch.as_tensor(position_ids[:, None, :], dtype=torch.long)
    with torch.no_grad():
        out = model(input_ids=torch.as_tensor(tokens[None], dtype=torch.long), use_cache=False, **kwargs)
    return out.logits[0].numpy()


def max_relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """max over positions of ( max_v |a−b| / max_v |b| ): the error per row relative to that row's scale."""
    return float(np.max(np.max(np.abs(a - b), axis=-1) / np.max(np.abs(b), axis=-1)))


def random_tokens(n: int, vocab: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab, size=n, dtype=np.int64)


def random_mtp_tensors(model, seed: int) -> dict[str, np.ndarray]:
    """HF-named `mtp.*` tensors for `model` (transformers has no MTP module, so they are drawn here).

    Shapes follow the checkpoint layout: one attention decoder layer `mtp.layers.0.*` shaped like the
    model's first full-attention layer, `mtp.fc` [D, 2D], and the zero-centred norms
    `mtp.pre_fc_norm_embedding`, `mtp.pre_fc_norm_hidden`, `mtp.norm`.
    """
    rng = np.random.default_rng(seed)
    attn = model.config.layer_types.index("full_attention")
    prefix = f"model.layers.{attn}."
    d = model.config.hidden_size

    def draw(name: str, shape: tuple[int, ...]) -> np.ndarray:
        std = 0.3 if name.endswith("norm.weight") else shape[-1] ** -0.5
        return (rng.standard_normal(shape) * std).astype(np.float32)

    out = {
        "mtp.layers.0." + k[len(prefix):]: draw(k, tuple(v.shape))
        for k, v in model.state_dict().items()
        if k.startswith(prefix)
    }
    out["mtp.fc.weight"] = draw("mtp.fc.weight", (d, 2 * d))
    for name in ("pre_fc_norm_embedding", "pre_fc_norm_hidden", "norm"):
        out[f"mtp.{name}.weight"] = draw("norm.weight", (d,))
    return out


def q8_0_names(weights: dict[str, np.ndarray], keep_f32: tuple[str, ...] = ()) -> set[str]:
    """Matmul weights that can be stored as Q8_0 (input dim a multiple of 32), minus names ending in `keep_f32`."""
    return {
        n for n, w in weights.items()
        if w.ndim == 2 and w.shape[1] % 32 == 0 and "conv1d" not in n and not n.endswith(keep_f32)
    }


def write_gguf(path: Path, cfg: ModelConfig, weights: dict[str, np.ndarray], q8_0: set[str]) -> Path:
    """A loadable qwen35 GGUF of `weights` (names in `q8_0` quantized, the rest F32) with a 256-symbol
    byte vocabulary (llama.cpp refuses a file without tokenizer merges, so one merge is written)."""
    if cfg.vocab_size != 256:
        raise ValueError("the byte vocabulary has 256 tokens")
    writer = new_writer(path)
    write_model_keys(writer, cfg, LlamaFileType.MOSTLY_Q8_0 if q8_0 else LlamaFileType.ALL_F32)
    write_quantization_version(writer)
    write_vocab(writer, Vocab(tokens=byte_symbols(), token_types=[1] * 256, merges=["\u0120 \u0120"]))
    for name, data in weights.items():
        if name in q8_0:
            writer.add_tensor(name, quantize(data, GGMLQuantizationType.Q8_0), raw_dtype=GGMLQuantizationType.Q8_0)
        else:
            writer.add_tensor(name, np.ascontiguousarray(data, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
