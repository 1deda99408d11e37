"""A tiny random model whose MTP head drafts well, for exercising speculation without a trained fixture.

A random MTP head is never accepted (measured: 0 of 60 greedy drafts), so accept paths, rollback of
accepted prefixes and the statistics of speculative sampling would go untested. Here the embeddings
have unit scale and the trunk's blocks write into the residual stream scaled by `mix`, which makes it
close to a bigram model (logits ≈ W_out · norm(embed[x_t])) while still depending on the context; the
head's `eh_proj` reads only the next token's embedding, so it predicts the same bigram one step
ahead. Drafts then agree with the target often but not always (more often as `mix` → 0). Quality
numbers need the trained fixtures (contracts.md); this model only gives the code paths something to
accept. Embeddings must be untied (a tied head would make every token predict itself).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import LlamaFileType

from engine.gguf.config import ModelConfig
from engine.gguf.metadata import new_writer, write_model_keys, write_quantization_version
from engine.gguf.synthetic import small_tensor_values
from engine.gguf.tensor_layout import model_tensors
from engine.gguf.vocab import Vocab, write_vocab
from engine.reference.model import ReferenceModel

_RESIDUAL_WRITERS = ("attn_output.weight", "ssm_out.weight", "ffn_down.weight")

TINY_CONFIG = ModelConfig(
    d_model=64, d_ff=128, n_layers=4, n_mtp=1, n_head=2, n_head_kv=1, head_dim=32, rope_dims=8,
    rope_sections=(2, 1, 1, 0), rope_theta=10_000_000.0, rms_eps=1e-6, context_length=1024,
    ssm_conv_kernel=4, ssm_d_state=16, ssm_n_k_heads=2, ssm_n_v_heads=2, ssm_d_inner=32, vocab_size=256,
    tied_embeddings=False,
)


def draft_friendly_weights(cfg: ModelConfig, seed: int, mix: float = 0.3) -> dict[str, np.ndarray]:
    """GGUF-named fp32 weights for `cfg` (which must have an MTP block); see the module docstring."""
    if cfg.n_mtp < 1 or cfg.tied_embeddings:
        raise ValueError("the configuration needs an MTP block and untied embeddings")
    rng = np.random.default_rng(seed)
    d = cfg.d_model
    weights = {}
    for name, shape in model_tensors(cfg):
        if len(shape) == 1:
            weights[name] = small_tensor_values(name, shape[0], rng)
            continue
        half_width = np.sqrt(3.0 / shape[-1])  # std 1/sqrt(fan_in): activations keep their scale
        if name.endswith("ssm_conv1d.weight"):
            half_width = 0.5
        elif name == "token_embd.weight":
            half_width = np.sqrt(3.0)  # std 1: the embedding dominates the residual stream
        w = rng.uniform(-half_width, half_width, shape).astype(np.float32)
        weights[name] = w * np.float32(mix) if name.endswith(_RESIDUAL_WRITERS) else w
    head = f"blk.{cfg.n_layers}.nextn."
    weights[head + "eh_proj.weight"] = np.concatenate([np.eye(d), np.zeros((d, d))], axis=1).astype(np.float32)
    weights[head + "enorm.weight"] = np.ones(d, np.float32)
    weights[head + "shared_head_norm.weight"] = weights["output_norm.weight"].copy()
    return weights


def draft_friendly_model(cfg: ModelConfig = TINY_CONFIG, seed: int = 0, mix: float = 0.3) -> ReferenceModel:
    """The exact-fp32 reference model of `draft_friendly_weights`."""
    return ReferenceModel(cfg, draft_friendly_weights(cfg, seed, mix))


def write_draft_friendly_model(path: str | Path, cfg: ModelConfig, vocab: Vocab, seed: int = 0,
                               mix: float = 0.3) -> Path:
    """The same weights as an F32 qwen35 GGUF with `vocab` (e.g. the demo's, for the chat template and tokenizer)."""
    if len(vocab.tokens) != cfg.vocab_size:
        raise ValueError(f"vocab has {len(vocab.tokens)} tokens, the config says {cfg.vocab_size}")
    writer = new_writer(path)
    write_model_keys(writer, cfg, LlamaFileType.ALL_F32)
    write_quantization_version(writer)
    write_vocab(writer, vocab)
    for name, data in draft_friendly_weights(cfg, seed, mix).items():
        writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return Path(path)
