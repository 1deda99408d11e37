"""Random model weights made directly on the card from a shape, for speed benchmarks (no file needed).

contracts.md "GPU machine practicalities": a 9B or 27B GGUF would take minutes to write and carry;
the kernels' speed does not depend on the values, so Q8_0 matrices are filled by a hash kernel and
the small fp32 tensors come from numpy. Scales are chosen so activations stay finite, nothing more.
"""

from __future__ import annotations

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.gemv import Q8Weight
from engine.cuda.q8_layout import QK
from engine.cuda.weights import AttentionWeights, FfnWeights, GdnWeights, LayerWeights, ModelWeights, MtpWeights
from engine.gguf.config import ModelConfig


def random_q8_weight(card: CudaCard, segments: tuple[int, ...], k: int, seed: int, label: str) -> Q8Weight:
    """A Q8_0 matrix (rows = sum of segments) with int8 values uniform in ±127 and scales near 1/(16·sqrt(k))."""
    rows = sum(segments)
    qs = card.alloc(rows * k, f"{label}.qs")
    d = card.alloc(2 * rows * (k // QK), f"{label}.d")
    blocks = min(card.sm_count * 32, max(1, (rows * k // 4 + 255) // 256))
    card.kernel("fill_random_q8_0").launch(
        blocks, 256, qs, d, np.int64(rows * k), np.uint32(seed), np.float32(1.0 / (127 * np.sqrt(k)))
    )
    return Q8Weight(qs=qs, d=d, rows=rows, k=k, segments=segments)


def random_model_weights(card: CudaCard, cfg: ModelConfig, seed: int = 0, span: range | None = None) -> ModelWeights:
    """Weights of the trunk layers `span` (default: all) and the embedding / head their card needs, laid out
    and stacked exactly as `upload_weights` does."""
    span = range(cfg.n_layers) if span is None else span
    make = _RandomWeights(card, cfg, seed)
    c = cfg
    layers = [make.layer(i) for i in span]
    ends = span.stop == c.n_layers
    token_embd = make.q8((c.vocab_size,), c.d_model, "token_embd") if span.start == 0 or (ends and c.tied_embeddings) else None
    lm_head = (token_embd if c.tied_embeddings else make.q8((c.vocab_size,), c.d_model, "output")) if ends else None
    return ModelWeights(token_embd if span.start == 0 else None, tuple(layers),
                        make.ones(c.d_model, "output_norm") if ends else None, lm_head, span.start)


def random_mtp_weights(card: CudaCard, cfg: ModelConfig, trunk: ModelWeights, seed: int = 1) -> MtpWeights:
    """MTP block 0 with random weights, laid out as `upload_mtp_weights` does (the head norm is the trunk's)."""
    if trunk.output_norm is None:
        raise ValueError("the MTP head goes on the card with the LM head")
    make = _RandomWeights(card, cfg, seed)
    i, d = cfg.n_layers, cfg.d_model
    return MtpWeights(i, make.q8((d,), 2 * d, f"blk.{i}.nextn.eh_proj"), make.ones(d, "nextn.enorm"),
                      make.ones(d, "nextn.hnorm"), trunk.output_norm, make.layer(i))


class _RandomWeights:
    """Makes random tensors of one model on a card: Q8_0 matrices by the hash kernel, small fp32 tensors by numpy."""

    def __init__(self, card: CudaCard, cfg: ModelConfig, seed: int):
        self.card, self.cfg = card, cfg
        self.rng = np.random.default_rng(seed)
        self.counter = iter(range(seed * 1000 + 1, 2**31))

    def ones(self, n: int, label: str) -> DeviceBuffer:
        return self.card.upload(np.ones(n, np.float32), label)

    def q8(self, segments: tuple[int, ...], k: int, label: str) -> Q8Weight:
        return random_q8_weight(self.card, segments, k, next(self.counter), label)

    def layer(self, i: int) -> LayerWeights:
        """Decoder block i (GDN or attention, by the config's pattern; an MTP block is attention)."""
        c, card, rng, p = self.cfg, self.card, self.rng, f"blk.{i}."
        mixer: GdnWeights | AttentionWeights
        if c.is_gdn(i):
            hv = c.ssm_n_v_heads
            mixer = GdnWeights(
                attn_norm=self.ones(c.d_model, p + "attn_norm"),
                in_proj=self.q8((c.ssm_conv_dim, c.ssm_d_inner, hv, hv), c.d_model, p + "in_proj"),
                conv_w=card.upload(rng.uniform(-0.5, 0.5, (c.ssm_conv_dim, c.ssm_conv_kernel)).astype(np.float32), p + "conv"),
                ssm_a=card.upload(-np.exp(rng.uniform(-1, 1, hv)).astype(np.float32), p + "ssm_a"),
                dt_bias=card.upload(rng.uniform(-1, 1, hv).astype(np.float32), p + "dt_bias"),
                ssm_norm=self.ones(c.ssm_d_head_v, p + "ssm_norm"),
                out_proj=self.q8((c.d_model,), c.ssm_d_inner, p + "ssm_out"),
            )
        else:
            mixer = AttentionWeights(
                attn_norm=self.ones(c.d_model, p + "attn_norm"),
                qkv=self.q8((2 * c.q_dim, c.kv_dim, c.kv_dim), c.d_model, p + "qkv"),
                q_norm=self.ones(c.head_dim, p + "q_norm"),
                k_norm=self.ones(c.head_dim, p + "k_norm"),
                out_proj=self.q8((c.d_model,), c.q_dim, p + "attn_output"),
            )
        ffn = FfnWeights(
            post_attention_norm=self.ones(c.d_model, p + "post_attention_norm"),
            gate_up=self.q8((c.d_ff, c.d_ff), c.d_model, p + "gate_up"),
            down=self.q8((c.d_model,), c.d_ff, p + "ffn_down"),
        )
        return LayerWeights(mixer, ffn)
