"""One decoder block (spec §6.3): pre-norm mixer (GDN or gated attention) and pre-norm SwiGLU FFN.

The MTP block (spec §6.10) is an attention block of the same shape, so it reuses this class.
"""

from __future__ import annotations

import numpy as np

from engine.reference.hidden_trace import record
from engine.gguf.config import ModelConfig
from engine.reference.attention import AttentionWeights, gated_attention
from engine.reference.ffn import FfnWeights, swiglu
from engine.reference.gated_deltanet import GdnWeights, gated_deltanet
from engine.reference.linear import WeightTable
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope
from engine.reference.state import GdnLayerState, KVCache


class DecoderBlock:
    """Block `index`: h ← h + mixer(rmsnorm(h)); h ← h + FFN(rmsnorm(h)) (`post_attention_norm` is the pre-FFN norm)."""

    def __init__(self, table: WeightTable, cfg: ModelConfig, index: int, rope: Rope):
        self.cfg = cfg
        self.index = index
        self.rope = rope
        self.is_gdn = cfg.is_gdn(index)
        p = f"blk.{index}."
        self.attn_norm = table.tensor(p + "attn_norm.weight", (cfg.d_model,))
        self.ffn_norm = table.tensor(p + "post_attention_norm.weight", (cfg.d_model,))
        self.mixer: GdnWeights | AttentionWeights = (
            GdnWeights.load(table, cfg, index) if self.is_gdn else AttentionWeights.load(table, cfg, index)
        )
        self.ffn = FfnWeights.load(table, cfg, index)

    def __call__(self, h: np.ndarray, positions: np.ndarray, cache: KVCache | GdnLayerState) -> np.ndarray:
        """New residual stream [T, D] for h [T, D]; `cache` is this block's state and is updated."""
        a = rmsnorm(h, self.attn_norm, self.cfg.rms_eps)
        record(self.index, "norm", a)  # `rigllm debug compare`'s places (engine.reference.hidden_trace)
        if self.is_gdn:
            m = gated_deltanet(self.mixer, self.cfg, a, cache)  # type: ignore[arg-type]
        else:
            m = gated_attention(self.mixer, self.cfg, self.rope, a, positions, cache)  # type: ignore[arg-type]
        h = h + m
        record(self.index, "mixer", h)
        h = h + swiglu(self.ffn, rmsnorm(h, self.ffn_norm, self.cfg.rms_eps))
        record(self.index, "ffn", h)
        return h
