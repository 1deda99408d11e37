"""MTP ("nextn") drafter head (spec §6.10), GGUF block index L + k.

    e   = rmsnorm(embed[x_{t+1}], enorm);  hh = rmsnorm(h_t, hnorm)    # h_t: trunk hidden after output_norm
    z   = eh_proj · [e ; hh]                                          # embedding first
    z   = attention decoder block L + k (its own KV cache)
    out = rmsnorm(z, shared_head_norm)  → logits with the shared LM head

Position of the MTP attention: llama.cpp takes it from the caller and the sources disagree on t
vs t+1 (spec §13 UNCONFIRMED); the default here is the MTP cache's own running position, which
equals the trunk row's position t when the head is fed every trunk row of a text sequence.
There is no transformers implementation of this block (transformers drops `mtp.*` weights).
"""

from __future__ import annotations

import numpy as np

from engine.gguf.config import ModelConfig
from engine.reference.block import DecoderBlock
from engine.reference.linear import Linear, WeightTable
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope, as_positions, text_positions
from engine.reference.state import SequenceState


class MtpHead:
    """MTP block k: drafts the token after next from (trunk hidden at t, token t+1)."""

    def __init__(
        self,
        table: WeightTable,
        cfg: ModelConfig,
        k: int,
        rope: Rope,
        embedding: np.ndarray,
        lm_head: Linear,
        output_norm: np.ndarray,
    ):
        self.cfg = cfg
        self.k = k
        i = cfg.n_layers + k
        p = f"blk.{i}.nextn."
        d = cfg.d_model
        self.eh_proj = table.linear(p + "eh_proj.weight", d, 2 * d)
        self.enorm = table.tensor(p + "enorm.weight", (d,))
        self.hnorm = table.tensor(p + "hnorm.weight", (d,))
        # Optional per-block tensors; Qwen3.5 files omit them and share the trunk's (spec §4.4).
        head_norm, embed, head = p + "shared_head_norm.weight", p + "embed_tokens.weight", p + "shared_head_head.weight"
        self.head_norm = table.tensor(head_norm, (d,)) if table.has(head_norm) else output_norm
        self.embedding = table.tensor(embed, (cfg.vocab_size, d)) if table.has(embed) else embedding
        self.lm_head = table.linear(head, cfg.vocab_size, d) if table.has(head) else lm_head
        self.block = DecoderBlock(table, cfg, i, rope)

    @staticmethod
    def present(table: WeightTable, cfg: ModelConfig, k: int) -> bool:
        """Whether the weights carry MTP block k (a GGUF may declare nextn layers yet omit them)."""
        return table.has(f"blk.{cfg.n_layers + k}.nextn.eh_proj.weight")

    def forward(
        self,
        hidden: np.ndarray,
        next_tokens: np.ndarray,
        state: SequenceState,
        positions: np.ndarray | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """(logits [T, V], out [T, D]) for trunk hidden rows [T, D] and the tokens that followed them.

        `out` can be fed back as `hidden` for a further draft step. Uses and extends only this
        head's own KV cache in `state`.
        """
        mtp_state = state.mtp[self.k]
        tokens = np.asarray(next_tokens, dtype=np.int64).reshape(-1)
        n_tok = tokens.shape[0]
        if hidden.shape != (n_tok, self.cfg.d_model):
            raise ValueError(f"hidden must be [{n_tok}, {self.cfg.d_model}], got {hidden.shape}")
        pos = text_positions(mtp_state.next_position, n_tok) if positions is None else as_positions(positions, n_tok)
        e = rmsnorm(self.embedding[tokens], self.enorm, self.cfg.rms_eps)
        hh = rmsnorm(hidden, self.hnorm, self.cfg.rms_eps)
        z = self.eh_proj(np.concatenate([e, hh], axis=-1))
        z = self.block(z, pos, mtp_state.kv)
        mtp_state.next_position = int(pos.max()) + 1
        out = rmsnorm(z, self.head_norm, self.cfg.rms_eps)
        return self.lm_head(out), out
