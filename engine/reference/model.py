"""`ReferenceModel`: the numpy fp32 forward pass of the Qwen3.5/3.6 text model (spec §6).

It is the executable specification the CUDA backend is tested against, so it favours clarity over
speed: vectorised over heads and tokens, no caching tricks beyond the per-sequence state the model
itself defines. Weights are GGUF-named tensors in numpy order (what `ModelFile.tensor` returns or
`hf_to_gguf_tensors` yields).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

import numpy as np

from engine.gguf.config import ModelConfig
from engine.gguf.model_file import ModelFile
from engine.reference.activation_rounding import ActivationRounding, fp32_kernel_weights
from engine.reference.block import DecoderBlock
from engine.reference.linear import Linear, WeightTable
from engine.reference.mtp import MtpHead
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope, as_positions, text_positions
from engine.reference.state import SequenceState


class ReferenceModel:
    """The trunk (embedding, L blocks, final norm, LM head) plus any MTP heads present in the weights."""

    def __init__(
        self,
        cfg: ModelConfig,
        weights: Mapping[str, np.ndarray],
        rounding: ActivationRounding = ActivationRounding.EXACT,
        fp32_weights: Collection[str] = (),
    ):
        """`fp32_weights`: matmul weights whose inputs stay unrounded in KERNEL mode (see activation_rounding)."""
        self.cfg = cfg
        self.rounding = rounding
        table = WeightTable(weights, rounding, fp32_weights)
        self.rope = Rope(cfg)
        self.embedding = table.tensor("token_embd.weight", (cfg.vocab_size, cfg.d_model))
        self.blocks = [DecoderBlock(table, cfg, i, self.rope) for i in range(cfg.n_layers)]
        self.output_norm = table.tensor("output_norm.weight", (cfg.d_model,))
        head = "output.weight" if table.has("output.weight") else "token_embd.weight"
        self.lm_head: Linear = table.linear(head, cfg.vocab_size, cfg.d_model)
        self.mtp = [
            MtpHead(table, cfg, k, self.rope, self.embedding, self.lm_head, self.output_norm)
            for k in range(cfg.n_mtp)
            if MtpHead.present(table, cfg, k)
        ]

    @classmethod
    def from_model_file(
        cls, mf: ModelFile, rounding: ActivationRounding = ActivationRounding.EXACT
    ) -> "ReferenceModel":
        """Load every tensor eagerly as fp32 (the reference is for small models and checks)."""
        vocab = mf.tensors["token_embd.weight"].numpy_shape[0] if mf.has("token_embd.weight") else 0
        cfg = ModelConfig.from_gguf_fields(mf.fields, vocab_size=vocab, tied_embeddings=not mf.has("output.weight"))
        weights = {name: mf.tensor(name) for name in mf.tensors}
        return cls(cfg, weights, rounding, fp32_kernel_weights(mf.tensors))

    def new_state(self) -> SequenceState:
        """A fresh sequence: empty caches, zero GDN states, next position 0."""
        return SequenceState(self.cfg)

    def forward_hidden(
        self,
        token_ids: Sequence[int] | np.ndarray,
        state: SequenceState,
        positions: np.ndarray | None = None,
        embeddings: np.ndarray | None = None,
        embedding_rows: Sequence[int] | np.ndarray | None = None,
    ) -> np.ndarray:
        """Final-normed hidden states [T, D] (the MTP input) for a batch continuing `state`.

        `positions`: [T] or [T, 3] (t, h, w); default: consecutive text positions from
        `state.next_position`. Afterwards `state.next_position` is the largest position used + 1
        (M-RoPE "last position + 1", not a token count).
        `embeddings` [K, D] replace the token embeddings of batch rows `embedding_rows` [K] (image
        rows in place of their `<|image_pad|>` tokens, spec §9.5); the ids there still count as tokens.
        """
        if state.cfg != self.cfg:
            raise ValueError("state belongs to a different model configuration")
        tokens = np.asarray(token_ids, dtype=np.int64).reshape(-1)
        n_tok = tokens.shape[0]
        if n_tok == 0:
            raise ValueError("forward needs at least one token")
        if tokens.min() < 0 or tokens.max() >= self.cfg.vocab_size:
            raise ValueError(f"token id out of range [0, {self.cfg.vocab_size})")
        pos = text_positions(state.next_position, n_tok) if positions is None else as_positions(positions, n_tok)

        h = self.embedding[tokens]
        if embeddings is not None or embedding_rows is not None:
            h = _with_embeddings(h, embeddings, embedding_rows)
        for block in self.blocks:
            cache = state.gdn[block.index] if block.is_gdn else state.kv[block.index]
            h = block(h, pos, cache)
        state.n_tokens += n_tok
        state.next_position = int(pos.max()) + 1
        return rmsnorm(h, self.output_norm, self.cfg.rms_eps)

    def logits(self, hidden: np.ndarray) -> np.ndarray:
        """LM head: hidden [T, D] (final-normed) → logits [T, V]."""
        return self.lm_head(hidden)

    def forward(
        self, token_ids: Sequence[int] | np.ndarray, state: SequenceState, positions: np.ndarray | None = None
    ) -> np.ndarray:
        """Logits [T, V] for a batch of any length continuing `state` (prefill or decode)."""
        return self.logits(self.forward_hidden(token_ids, state, positions))


def _with_embeddings(h: np.ndarray, embeddings: np.ndarray | None, rows: Sequence[int] | np.ndarray | None) -> np.ndarray:
    """A copy of token embeddings h [T, D] with rows `rows` replaced by `embeddings` [K, D]."""
    if embeddings is None or rows is None:
        raise ValueError("embeddings and embedding_rows go together")
    idx = np.asarray(rows, dtype=np.int64).reshape(-1)
    values = np.asarray(embeddings, dtype=np.float32)
    if values.shape != (idx.shape[0], h.shape[1]):
        raise ValueError(f"embeddings must have shape ({idx.shape[0]}, {h.shape[1]}), got {values.shape}")
    if idx.size and (idx.min() < 0 or idx.max() >= h.shape[0]):
        raise ValueError(f"embedding rows out of range [0, {h.shape[0]})")
    out = h.copy()
    out[idx] = values
    return out
