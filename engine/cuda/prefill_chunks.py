"""A prompt cut into prefill chunks, as every card of the CUDA backend takes them.

A chunk is at most `chunk` tokens (the forward pass's buffers hold that many rows). A text chunk is its
token ids; a chunk of a multimodal prompt segment also carries its tokens' (t, h, w) rope positions
(every card's attention reads them) and its image rows' embeddings (the first card splices them into the
hidden rows in place of the pad token's). One cut serves a card's own `SlotDecoder.prefill_slot` and the
staged backend's pipelined prefill alike, so both take the same chunk boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.vision.multimodal_prompt import PromptSegment


@dataclass(frozen=True)
class PrefillChunk:
    """One prefill chunk: its token ids, and for an image prompt its rope positions [n][3] and image rows as
    (first row, [k][D] fp32 embeddings) runs."""

    ids: np.ndarray
    positions: np.ndarray | None = None
    embedded: list[tuple[int, np.ndarray]] | None = None


def text_chunks(token_ids: Sequence[int], chunk: int) -> list[PrefillChunk]:
    """Text tokens in chunks of `chunk` (the last may be shorter)."""
    ids = np.asarray(token_ids, dtype=np.int32)
    return [PrefillChunk(ids[i : i + chunk]) for i in range(0, len(ids), chunk)]


def segment_chunks(segment: PromptSegment, chunk: int) -> list[PrefillChunk]:
    """A multimodal prompt segment in chunks of `chunk`, each with its positions and image rows."""
    return [PrefillChunk(np.asarray(p.token_ids, np.int32), p.positions, embedded_runs(p))
            for p in segment.chunks(chunk)]


def embedded_runs(segment: PromptSegment) -> list[tuple[int, np.ndarray]]:
    """The segment's image rows as (first row, [k][D] fp32 embeddings) runs of consecutive rows: one copy
    into the hidden rows per run (an image's pads are consecutive)."""
    rows = np.asarray(segment.embedding_rows, dtype=np.int64)
    if rows.size == 0:
        return []
    order = np.argsort(rows, kind="stable")
    rows, emb = rows[order], np.asarray(segment.embeddings, np.float32)[order]
    breaks = np.flatnonzero(np.diff(rows) != 1) + 1
    return [(int(r[0]), np.ascontiguousarray(e)) for r, e in zip(np.split(rows, breaks), np.split(emb, breaks))]
