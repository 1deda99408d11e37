"""Upload a GGUF's weights to one card in the layouts the kernels read.

Matmul weights become Q8_0 structure-of-arrays (`engine.cuda.q8_layout`), or stay K-quant (Q4_K, Q5_K,
Q6_K in the layouts of `engine.cuda.kq_layout`, never re-rounded); weights that share an input
are stacked row-wise once here so each shared input is quantized once and read by one GEMV/GEMM:
ffn gate+up, the GDN in-projections (qkv, z, beta, alpha) and attention q, k, v. Q8_0 tensors are
split without re-rounding; F16/BF16/F32 matmul weights are requantized to Q8_0 at load (contracts.md
"Model files"), ssm_alpha/ssm_beta included — the reference's kernel-rounding mode keeps F32
alpha/beta unrounded, so a file with F32 alpha/beta differs from it by that requantization alone.
Norms, conv1d, ssm_a and dt bias stay fp32. A stack whose matrices differ in kind (a Q4_K_M file's Q6_K
attn_v beside Q4_K q and k) becomes a `MixedWeight` of same-kind runs (`engine.cuda.matmul`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.gemv import upload_q8_weight
from engine.cuda.kq_weight import upload_kq_weight
from engine.cuda.matmul import SingleWeight, Weight, same_kind_runs, stack
from engine.cuda.q8_layout import split_q8_0
from engine.model.load_progress import ProgressCounter
from engine.gguf.config import ModelConfig
from engine.gguf.kquant_blocks import KQUANT_TYPES
from engine.gguf.model_file import ModelFile


@dataclass(frozen=True)
class GdnWeights:
    attn_norm: DeviceBuffer
    in_proj: Weight  # segments: qkv (Cc), z (Cv), beta (Hv), alpha (Hv)
    conv_w: DeviceBuffer  # fp32 [Cc][Kc]
    ssm_a: DeviceBuffer
    dt_bias: DeviceBuffer
    ssm_norm: DeviceBuffer
    out_proj: Weight


@dataclass(frozen=True)
class AttentionWeights:
    attn_norm: DeviceBuffer
    qkv: Weight  # segments: q+gate (2*H*Dh), k (Hkv*Dh), v (Hkv*Dh)
    q_norm: DeviceBuffer
    k_norm: DeviceBuffer
    out_proj: Weight


@dataclass(frozen=True)
class FfnWeights:
    post_attention_norm: DeviceBuffer
    gate_up: Weight  # segments: gate (F), up (F)
    down: Weight


@dataclass(frozen=True)
class LayerWeights:
    mixer: GdnWeights | AttentionWeights
    ffn: FfnWeights


@dataclass(frozen=True)
class MtpWeights:
    """MTP block `index` (spec §6.10): its input projection and norms, and its decoder block (an attention
    layer with its FFN); the embedding and the LM head are the trunk's. The head runs on the card with the
    LM head, so over several cards that card holds its own copy of the token embedding (`embedding`)."""

    index: int  # block index in the file: n_layers + k
    eh_proj: Weight  # [D] x [2D], input = [enorm(embedding) ; hnorm(hidden)]
    enorm: DeviceBuffer
    hnorm: DeviceBuffer
    head_norm: DeviceBuffer  # shared_head_norm, or the trunk's output_norm when the file has none
    block: LayerWeights
    embedding: Weight  # token_embd on the head's card: the trunk's there (one card, tied embeddings), else a copy


@dataclass(frozen=True)
class ModelWeights:
    """The weights one card holds: trunk layers [first_layer, first_layer + len(layers)), the embedding
    on the card that starts the model, the final norm and LM head on the card that ends it."""

    token_embd: SingleWeight | None
    layers: tuple[LayerWeights, ...]
    output_norm: DeviceBuffer | None
    lm_head: SingleWeight | None  # token_embd itself when the embeddings are tied and one card holds both
    first_layer: int = 0

    @property
    def span(self) -> range:
        return range(self.first_layer, self.first_layer + len(self.layers))


def card_tensors(name: str, cfg: ModelConfig, span: range) -> bool:
    """Does the card holding trunk layers `span` need tensor `name`? (MTP blocks: `upload_mtp_weights`.)"""
    if name.startswith("blk."):
        return int(name.split(".")[1]) in span
    if name == "token_embd.weight":
        return span.start == 0 or (cfg.tied_embeddings and span.stop == cfg.n_layers)
    return span.stop == cfg.n_layers  # output_norm, output


def q8_parts(mf: ModelFile, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(qs int8 [rows, k], d fp16 [rows, k/32]) of a 2-D matmul weight, requantizing non-Q8_0 types."""
    info = mf.tensors[name]
    rows, k = info.numpy_shape
    if info.ggml_type == GGMLQuantizationType.Q8_0:
        raw = np.asarray(mf.raw(name))
    else:
        raw = quantize(mf.tensor(name), GGMLQuantizationType.Q8_0)
    return split_q8_0(raw, rows, k)


class _Uploader:
    """Uploads tensors of one file under labels that name the tensor, for the card's byte ledger;
    counts the file bytes of each uploaded tensor into `progress`."""

    def __init__(self, card: CudaCard, mf: ModelFile, progress: ProgressCounter | None):
        self.card, self.mf, self.progress = card, mf, progress

    def _done(self, *names: str) -> None:
        for name in names:  # on the card now: the host copy may leave the page cache
            self.mf.release(name)
        if self.progress is not None:
            self.progress.add(sum(self.mf.tensors[n].n_bytes for n in names))

    def f32(self, name: str) -> DeviceBuffer:
        buf = self.card.upload(np.ascontiguousarray(self.mf.tensor(name), dtype=np.float32), name)
        self._done(name)
        return buf

    def matrix(self, *names: str) -> Weight:
        """Matrices sharing one input, stacked: K-quant ones stay K-quant, every other type becomes Q8_0."""
        types = [self.mf.tensors[n].ggml_type for n in names]
        kinds = [t if t in KQUANT_TYPES else None for t in types]
        runs: list[SingleWeight] = []
        for r in same_kind_runs(kinds):
            run, qtype = names[r.start:r.stop], kinds[r.start]
            if qtype is None:
                runs.append(upload_q8_weight(self.card, [q8_parts(self.mf, n) for n in run], "+".join(run)))
            else:
                k = self.mf.tensors[run[0]].numpy_shape[1]
                runs.append(upload_kq_weight(self.card, qtype, [np.asarray(self.mf.raw(n)) for n in run], k, "+".join(run)))
        self._done(*names)
        return stack(runs)


def trunk_bytes(mf: ModelFile, cfg: ModelConfig, span: range | None = None) -> int:
    """File bytes of the tensors `upload_weights` uploads for the card holding trunk layers `span`."""
    span = range(cfg.n_layers) if span is None else span
    return sum(t.n_bytes for name, t in mf.tensors.items() if card_tensors(name, cfg, span))


def upload_weights(card: CudaCard, mf: ModelFile, cfg: ModelConfig, progress: ProgressCounter | None = None,
                   span: range | None = None) -> ModelWeights:
    """The trunk tensors of `mf` that the card holding trunk layers `span` (default: all) needs, on `card`
    (the MTP block is uploaded separately, when speculation is on: `upload_mtp_weights`)."""
    span = range(cfg.n_layers) if span is None else span
    up = _Uploader(card, mf, progress)
    layers = [_layer_weights(up, cfg, i) for i in span]
    embd = up.matrix("token_embd.weight") if card_tensors("token_embd.weight", cfg, span) else None
    ends = span.stop == cfg.n_layers
    lm_head = (embd if cfg.tied_embeddings else up.matrix("output.weight")) if ends else None
    return ModelWeights(embd if span.start == 0 else None, tuple(layers),
                        up.f32("output_norm.weight") if ends else None, lm_head, span.start)


def has_mtp(mf: ModelFile, cfg: ModelConfig) -> bool:
    """Does the file carry an MTP block 0 this backend runs (a GGUF may declare nextn layers yet omit them)?
    The card's head shares the trunk's embedding and LM head, as Qwen3.5/3.6 files do; a block with its own
    (`nextn.embed_tokens`, `nextn.shared_head_head`, spec §4.4) is left to the reference backend."""
    p = f"blk.{cfg.n_layers}.nextn."
    own = any(p + name in mf.tensors for name in ("embed_tokens.weight", "shared_head_head.weight"))
    return cfg.n_mtp > 0 and p + "eh_proj.weight" in mf.tensors and not own


def upload_mtp_weights(card: CudaCard, mf: ModelFile, cfg: ModelConfig, trunk: ModelWeights) -> MtpWeights:
    """MTP block 0 of `mf` on the card that holds the trunk's LM head (its shared head norm defaults to
    the trunk's output norm, spec §6.10), with the token embedding the head needs (`head_embedding`)."""
    if not has_mtp(mf, cfg) or trunk.output_norm is None:
        raise ValueError("MTP block 0 goes on the card with the LM head of a file that carries it")
    i = cfg.n_layers
    p = f"blk.{i}.nextn."
    up = _Uploader(card, mf, None)
    head_norm = up.f32(p + "shared_head_norm.weight") if p + "shared_head_norm.weight" in mf.tensors else trunk.output_norm
    return MtpWeights(i, up.matrix(p + "eh_proj.weight"), up.f32(p + "enorm.weight"), up.f32(p + "hnorm.weight"),
                      head_norm, _layer_weights(up, cfg, i),
                      head_embedding(cfg, trunk, lambda: up.matrix("token_embd.weight")))


def head_embedding(cfg: ModelConfig, trunk: ModelWeights, upload: Callable[[], Weight]) -> Weight:
    """The token embedding the MTP head reads on the card with the LM head: the trunk's own when that card
    has it (a single card; tied embeddings, where the LM head is the embedding), else `upload()` (a copy
    on the last of several cards, which the memory plan counts)."""
    if trunk.token_embd is not None:
        return trunk.token_embd
    if cfg.tied_embeddings and trunk.lm_head is not None:
        return trunk.lm_head
    return upload()


def _layer_weights(up: _Uploader, cfg: ModelConfig, i: int) -> LayerWeights:
    """Decoder block i (a trunk layer, or an MTP block's attention layer)."""
    p = f"blk.{i}."
    mixer: GdnWeights | AttentionWeights
    if cfg.is_gdn(i):
        mixer = GdnWeights(
            attn_norm=up.f32(p + "attn_norm.weight"),
            in_proj=up.matrix(p + "attn_qkv.weight", p + "attn_gate.weight", p + "ssm_beta.weight", p + "ssm_alpha.weight"),
            conv_w=up.f32(p + "ssm_conv1d.weight"),
            ssm_a=up.f32(p + "ssm_a"),
            dt_bias=up.f32(p + "ssm_dt.bias"),
            ssm_norm=up.f32(p + "ssm_norm.weight"),
            out_proj=up.matrix(p + "ssm_out.weight"),
        )
    else:
        mixer = AttentionWeights(
            attn_norm=up.f32(p + "attn_norm.weight"),
            qkv=up.matrix(p + "attn_q.weight", p + "attn_k.weight", p + "attn_v.weight"),
            q_norm=up.f32(p + "attn_q_norm.weight"),
            k_norm=up.f32(p + "attn_k_norm.weight"),
            out_proj=up.matrix(p + "attn_output.weight"),
        )
    ffn = FfnWeights(
        post_attention_norm=up.f32(p + "post_attention_norm.weight"),
        gate_up=up.matrix(p + "ffn_gate.weight", p + "ffn_up.weight"),
        down=up.matrix(p + "ffn_down.weight"),
    )
    return LayerWeights(mixer, ffn)
