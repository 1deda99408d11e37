"""Every tensor a qwen35 GGUF holds for a `ModelConfig`: GGUF name and numpy-order shape (spec §4).

Writers that build a model from a config rather than from a checkpoint (synthetic and demo models)
take the tensor list from here. Order: `token_embd`, blocks 0..n_blocks-1 (GDN, attention or MTP
tensors), `output_norm`, then `output` unless the embeddings are tied.
"""

from __future__ import annotations

from engine.gguf.config import ModelConfig

Shape = tuple[int, ...]


def _ffn(cfg: ModelConfig, b: str) -> list[tuple[str, Shape]]:
    return [
        (f"{b}.ffn_gate.weight", (cfg.d_ff, cfg.d_model)),
        (f"{b}.ffn_up.weight", (cfg.d_ff, cfg.d_model)),
        (f"{b}.ffn_down.weight", (cfg.d_model, cfg.d_ff)),
    ]


def _gdn(cfg: ModelConfig, b: str) -> list[tuple[str, Shape]]:
    d, hv = cfg.d_model, cfg.ssm_n_v_heads
    return [
        (f"{b}.attn_norm.weight", (d,)),
        (f"{b}.attn_qkv.weight", (cfg.ssm_conv_dim, d)),
        (f"{b}.attn_gate.weight", (cfg.ssm_d_inner, d)),
        (f"{b}.ssm_beta.weight", (hv, d)),
        (f"{b}.ssm_alpha.weight", (hv, d)),
        (f"{b}.ssm_conv1d.weight", (cfg.ssm_conv_dim, cfg.ssm_conv_kernel)),
        (f"{b}.ssm_dt.bias", (hv,)),
        (f"{b}.ssm_a", (hv,)),
        (f"{b}.ssm_norm.weight", (cfg.ssm_d_head_v,)),
        (f"{b}.ssm_out.weight", (d, cfg.ssm_d_inner)),
        (f"{b}.post_attention_norm.weight", (d,)),
    ] + _ffn(cfg, b)


def _attention(cfg: ModelConfig, b: str) -> list[tuple[str, Shape]]:
    d = cfg.d_model
    return [
        (f"{b}.attn_norm.weight", (d,)),
        (f"{b}.attn_q.weight", (2 * cfg.q_dim, d)),
        (f"{b}.attn_k.weight", (cfg.kv_dim, d)),
        (f"{b}.attn_v.weight", (cfg.kv_dim, d)),
        (f"{b}.attn_q_norm.weight", (cfg.head_dim,)),
        (f"{b}.attn_k_norm.weight", (cfg.head_dim,)),
        (f"{b}.attn_output.weight", (d, cfg.q_dim)),
        (f"{b}.post_attention_norm.weight", (d,)),
    ] + _ffn(cfg, b)


def _mtp_extras(cfg: ModelConfig, b: str) -> list[tuple[str, Shape]]:
    d = cfg.d_model
    return [
        (f"{b}.nextn.eh_proj.weight", (d, 2 * d)),
        (f"{b}.nextn.enorm.weight", (d,)),
        (f"{b}.nextn.hnorm.weight", (d,)),
        (f"{b}.nextn.shared_head_norm.weight", (d,)),
    ]


def model_tensors(cfg: ModelConfig) -> list[tuple[str, Shape]]:
    """(GGUF name, numpy-order shape) of every tensor, in writing order."""
    out: list[tuple[str, Shape]] = [("token_embd.weight", (cfg.vocab_size, cfg.d_model))]
    for i in range(cfg.n_blocks):
        b = f"blk.{i}"
        if cfg.is_recurrent[i]:
            out += _gdn(cfg, b)
        else:
            out += _attention(cfg, b)
        if i >= cfg.n_layers:
            out += _mtp_extras(cfg, b)
    out.append(("output_norm.weight", (cfg.d_model,)))
    if not cfg.tied_embeddings:
        out.append(("output.weight", (cfg.vocab_size, cfg.d_model)))
    return out
