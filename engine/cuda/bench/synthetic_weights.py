"""Random model weights made directly on the card from a shape, for speed benchmarks (no file needed).

contracts.md "GPU machine practicalities": a 9B or 27B GGUF would take minutes to write and carry;
the kernels' speed does not depend on the values, so Q8_0 and K-quant matrices are filled by hash kernels
and the small fp32 tensors come from numpy. Scales are chosen so activations stay finite, nothing more.
Each matrix takes the type a `weight_type` file would give it (`engine.gguf.tensor_plan`: llama.cpp's
quantizer rules for q4_k_m / q5_k_m / q6_k), stacked as `upload_weights` stacks a file's tensors.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from gguf import GGMLQuantizationType

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.gemv import Q8Weight
from engine.cuda.kq_layout import device_bytes
from engine.cuda.kq_weight import KQWeight
from engine.cuda.matmul import SingleWeight, Weight, same_kind_runs, stack
from engine.cuda.q8_layout import QK
from engine.cuda.weights import (AttentionWeights, FfnWeights, GdnWeights, LayerWeights, ModelWeights, MtpWeights,
                                 head_embedding)
from engine.gguf.config import ModelConfig
from engine.gguf.kquant_blocks import BLOCK_BYTES, KQUANT_TYPES, QK_K
from engine.gguf.tensor_plan import planned_types
from engine.model.load_progress import ProgressCounter

Q = GGMLQuantizationType
# Largest quant value of the K types with minimums (half of it is the min term that centres a block)
_KQ_TOP = {Q.Q4_K: 15, Q.Q5_K: 31}


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


def random_kq_weight(card: CudaCard, qtype: GGMLQuantizationType, segments: tuple[int, ...], k: int, seed: int,
                     label: str) -> KQWeight:
    """A K-quant matrix (rows = sum of segments) with random payload and scales near 1/sqrt(k) over the quant range."""
    rows = sum(segments)
    nbytes = device_bytes(qtype, rows, k)
    data = card.alloc(nbytes, label)
    n_blocks = rows * (k // QK_K)
    grid = min(card.sm_count * 32, max(1, (nbytes // 4 + 255) // 256))
    card.kernel("fill_random_bytes").launch(grid, 256, data, np.int64(nbytes), np.uint32(seed))
    if qtype == Q.Q6_K:
        scale, min_scale, block_bytes = 1.0 / (32 * 128 * np.sqrt(k)), 0.0, 0
    else:
        top = _KQ_TOP[qtype]
        scale = 2.0 / (63 * top * np.sqrt(k))
        min_scale, block_bytes = scale * top / 2, BLOCK_BYTES[qtype]
    card.kernel("set_kq_scales").launch(min(grid, max(1, (n_blocks + 255) // 256)), 256, data, np.int64(nbytes),
                                        np.int64(n_blocks), np.int32(block_bytes), np.float32(scale),
                                        np.float32(min_scale))
    return KQWeight(data, qtype, rows, k, segments)


def random_model_weights(card: CudaCard, cfg: ModelConfig, seed: int = 0, span: range | None = None,
                         weight_type: str = "q8_0") -> ModelWeights:
    """Weights of the trunk layers `span` (default: all) and the embedding / head their card needs, typed as a
    `weight_type` file's, laid out and stacked exactly as `upload_weights` does."""
    span = range(cfg.n_layers) if span is None else span
    make = _RandomWeights(card, cfg, seed, weight_type)
    c = cfg
    layers = [make.layer(i) for i in span]
    ends = span.stop == c.n_layers
    token_embd = make.single("token_embd.weight", c.vocab_size, c.d_model) if span.start == 0 or (ends and c.tied_embeddings) else None
    lm_head = (token_embd if c.tied_embeddings else make.single("output.weight", c.vocab_size, c.d_model)) if ends else None
    return ModelWeights(token_embd if span.start == 0 else None, tuple(layers),
                        make.ones(c.d_model, "output_norm") if ends else None, lm_head, span.start)


def per_card_weights(cfg: ModelConfig, weight_type: str = "q8_0", seed: int = 7
                     ) -> Callable[[CudaCard, range, ProgressCounter], ModelWeights]:
    """A multi-card backend's `weights_for`: each card makes random weights of its own layers (the same seed on
    every card, so a split model is the same model whatever the split)."""
    def weights_for(card: CudaCard, span: range, counter: ProgressCounter) -> ModelWeights:
        return random_model_weights(card, cfg, seed=seed, span=span, weight_type=weight_type)

    return weights_for


def random_mtp_weights(card: CudaCard, cfg: ModelConfig, trunk: ModelWeights, seed: int = 1,
                       weight_type: str = "q8_0") -> MtpWeights:
    """MTP block 0 with random weights, laid out as `upload_mtp_weights` does (the head norm is the trunk's;
    on the last of several cards the head's copy of the embedding is random too, not the first card's)."""
    if trunk.output_norm is None:
        raise ValueError("the MTP head goes on the card with the LM head")
    make = _RandomWeights(card, cfg, seed, weight_type)
    i, d = cfg.n_layers, cfg.d_model
    return MtpWeights(i, make.single(f"blk.{i}.nextn.eh_proj.weight", d, 2 * d), make.ones(d, "nextn.enorm"),
                      make.ones(d, "nextn.hnorm"), trunk.output_norm, make.layer(i),
                      head_embedding(cfg, trunk, lambda: make.single("token_embd.weight", cfg.vocab_size, d)))


class _RandomWeights:
    """Makes random tensors of one model on a card: matrices by the hash kernels, small fp32 tensors by numpy."""

    def __init__(self, card: CudaCard, cfg: ModelConfig, seed: int, weight_type: str):
        self.card, self.cfg = card, cfg
        self.rng = np.random.default_rng(seed)
        self.counter = iter(range(seed * 1000 + 1, 2**31))
        self.types = {name: qtype for name, _, qtype in planned_types(cfg, weight_type)}

    def ones(self, n: int, label: str) -> DeviceBuffer:
        return self.card.upload(np.ones(n, np.float32), label)

    def matrix(self, names: tuple[str, ...], segments: tuple[int, ...], k: int, label: str) -> Weight:
        """Matrices `names` (rows `segments`) sharing one input: runs of one K type stay K-quant, the rest Q8_0."""
        kinds = [self.types[n] if self.types[n] in KQUANT_TYPES else None for n in names]
        return stack([self._run(kinds[r.start], segments[r.start:r.stop], k, label) for r in same_kind_runs(kinds)])

    def single(self, name: str, rows: int, k: int) -> SingleWeight:
        qtype = self.types[name]
        return self._run(qtype if qtype in KQUANT_TYPES else None, (rows,), k, name.removesuffix(".weight"))

    def _run(self, qtype: GGMLQuantizationType | None, segments: tuple[int, ...], k: int, label: str) -> SingleWeight:
        seed = next(self.counter)
        if qtype is None:
            return random_q8_weight(self.card, segments, k, seed, label)
        return random_kq_weight(self.card, qtype, segments, k, seed, label)

    def layer(self, i: int) -> LayerWeights:
        """Decoder block i (GDN or attention, by the config's pattern; an MTP block is attention)."""
        c, card, rng, p = self.cfg, self.card, self.rng, f"blk.{i}."
        mixer: GdnWeights | AttentionWeights
        if c.is_gdn(i):
            hv = c.ssm_n_v_heads
            mixer = GdnWeights(
                attn_norm=self.ones(c.d_model, p + "attn_norm"),
                in_proj=self.matrix(tuple(p + n for n in ("attn_qkv.weight", "attn_gate.weight", "ssm_beta.weight",
                                                          "ssm_alpha.weight")),
                                    (c.ssm_conv_dim, c.ssm_d_inner, hv, hv), c.d_model, p + "in_proj"),
                conv_w=card.upload(rng.uniform(-0.5, 0.5, (c.ssm_conv_dim, c.ssm_conv_kernel)).astype(np.float32), p + "conv"),
                ssm_a=card.upload(-np.exp(rng.uniform(-1, 1, hv)).astype(np.float32), p + "ssm_a"),
                dt_bias=card.upload(rng.uniform(-1, 1, hv).astype(np.float32), p + "dt_bias"),
                ssm_norm=self.ones(c.ssm_d_head_v, p + "ssm_norm"),
                out_proj=self.matrix((p + "ssm_out.weight",), (c.d_model,), c.ssm_d_inner, p + "ssm_out"),
            )
        else:
            mixer = AttentionWeights(
                attn_norm=self.ones(c.d_model, p + "attn_norm"),
                qkv=self.matrix((p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
                                (2 * c.q_dim, c.kv_dim, c.kv_dim), c.d_model, p + "qkv"),
                q_norm=self.ones(c.head_dim, p + "q_norm"),
                k_norm=self.ones(c.head_dim, p + "k_norm"),
                out_proj=self.matrix((p + "attn_output.weight",), (c.d_model,), c.q_dim, p + "attn_output"),
            )
        ffn = FfnWeights(
            post_attention_norm=self.ones(c.d_model, p + "post_attention_norm"),
            gate_up=self.matrix((p + "ffn_gate.weight", p + "ffn_up.weight"), (c.d_ff, c.d_ff), c.d_model, p + "gate_up"),
            down=self.matrix((p + "ffn_down.weight",), (c.d_model,), c.d_ff, p + "ffn_down"),
        )
        return LayerWeights(mixer, ffn)
