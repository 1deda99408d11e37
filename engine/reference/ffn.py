"""SwiGLU feed-forward block (spec §6.4): down · (silu(gate · f) ⊙ (up · f))."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.activations import silu
from engine.reference.linear import Linear, WeightTable


@dataclass(frozen=True)
class FfnWeights:
    gate: Linear
    up: Linear
    down: Linear

    @classmethod
    def load(cls, table: WeightTable, cfg: ModelConfig, block: int) -> "FfnWeights":
        p = f"blk.{block}."
        return cls(
            gate=table.linear(p + "ffn_gate.weight", cfg.d_ff, cfg.d_model),
            up=table.linear(p + "ffn_up.weight", cfg.d_ff, cfg.d_model),
            down=table.linear(p + "ffn_down.weight", cfg.d_model, cfg.d_ff),
        )


def swiglu(w: FfnWeights, f: np.ndarray) -> np.ndarray:
    """FFN output [T, D] for normalised input f [T, D]."""
    return w.down(silu(w.gate(f)) * w.up(f))
