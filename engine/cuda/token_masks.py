"""Grammar masks and logit_bias on the card: what the sampler reads so that a constrained or biased request
picks on the card like any other, and only token ids come back (issue 28: the host used to download each
step's whole logits row, about 1 MB, to re-pick there).

A step's mask is a bitset over the vocabulary (uint32 words, bit v % 32 of word v // 32 set when token v is
allowed: llguidance's layout, engine.generation.token_mask). At the 248,320-token vocabulary one is 31 KB,
more than a step may move (≤ 8 KB per token), but a grammar's masks repeat: inside a JSON string, after a
key, inside a number, the same few sets come back again and again. So the card keeps a pool of recent masks
keyed by their content (`MaskPool`): a step uploads a mask only the first time it is seen (or after it was
evicted) and otherwise only its pool entry, one int in the step buffer the decoder uploads anyway. A mask
that is uploaded moves only the span of words where it differs from what its entry held before.

A request's logit_bias is constant, at most MAX_LOGIT_BIAS ids (OpenAI's limit; RIGLLM_MAX_LOGIT_BIAS in
sampling.cuh): one `LogitBias` record per slot, written when the request begins.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.errors import RigllmError
from engine.generation.token_mask import MAX_LOGIT_BIAS, TokenMask, mask_words

BIAS_DTYPE = np.dtype([("n", "<i4"), ("ids", "<i4", (MAX_LOGIT_BIAS,)), ("values", "<f4", (MAX_LOGIT_BIAS,))])
NO_MASK = -1  # a slot's mask entry when its step is not masked
DEFAULT_MASK_ENTRIES = 64  # 2 MB at the 248,320-token vocabulary; more than 8 slots' masks in one step


def pack_bias(bias: Mapping[int, float] | None, vocab: int) -> np.ndarray:
    """One `LogitBias` record (sampling.cuh) for a request's bias (token id → value; None or empty: none)."""
    rec = np.zeros(1, BIAS_DTYPE)
    items = sorted((bias or {}).items())
    if len(items) > MAX_LOGIT_BIAS:
        raise RigllmError(f"logit_bias has {len(items)} entries; at most {MAX_LOGIT_BIAS} are allowed")
    for i, (token, value) in enumerate(items):
        if not 0 <= token < vocab:
            raise RigllmError(f"logit_bias token {token} is outside the vocabulary of {vocab}")
        rec["ids"][0, i], rec["values"][0, i] = token, value
    rec["n"] = len(items)
    return rec


@dataclass(frozen=True)
class Constraints:
    """Where sampling.cu's sample_scores finds the constraints: `mask_entry` int32 [slots] (each slot's pool
    entry for this step, NO_MASK for none), `pool` ([entries][words] bitsets), `bias` (`LogitBias` [slots]).
    Batched passes index both by row_slot; a one-slot pass gets that slot's `view`."""

    mask_entry: DeviceBuffer
    pool: DeviceBuffer
    words: int
    bias: DeviceBuffer

    def view(self, slot: int) -> Constraints:
        return replace(self, mask_entry=self.mask_entry.view(4 * slot, 4),
                       bias=self.bias.view(BIAS_DTYPE.itemsize * slot, BIAS_DTYPE.itemsize))

    def args(self) -> tuple[DeviceBuffer, DeviceBuffer, np.int32, DeviceBuffer]:
        """sample_scores's constraint arguments."""
        return self.mask_entry, self.pool, np.int32(self.words), self.bias


class MaskPool:
    """Recently used masks on the card, by content; least recently used evicted first.

    Entries used by the step being written are the most recent, so with more entries than rows a step never
    evicts a mask it uses. Each entry has its own pinned staging row: an upload is stream-ordered and its
    source stays untouched until the entry is evicted again, long after that copy has run.

    The host does this for every masked row of every step while the card waits for the step's graph, so each
    lookup is a few whole-array numpy passes over the 7,760 words (no Python hash of 31 KB, no index lists).
    On the 2-core development machine, with a stand-in card, a new 248,320-token mask takes 18 µs and a known
    one 8 µs, against 37 and 18 with Python's hash and index lists. Since 2026-12-04 the fingerprint is one dot
    product instead of a product array and its sum, a full-width mask is read in place instead of copied, and a
    fresh mask's last differing word is found without a reversed pass: a new mask took 19-30 µs against 30-41
    before, in three alternating runs on the same (then noisy) machine, each the best of 30 x 300 lookups."""

    def __init__(self, card: CudaCard, vocab: int, entries: int = DEFAULT_MASK_ENTRIES, label: str = "masks"):
        self.card, self.words = card, mask_words(vocab)
        self.buffer = card.alloc(4 * self.words * entries, f"{label}.pool")
        self.buffer.fill_zero()
        width = self.words + self.words % 2  # an even count, so a row reads as uint64 for the fingerprint
        self._staging = card.pinned((entries, width), np.uint32)  # each row as the card's entry holds it
        self._staging[:] = 0
        self._mask = np.zeros(width, np.uint32)  # the mask looked up, padded with refusals to the pool's width
        self._differs = np.empty(width, bool)
        # Random odd multipliers, drawn per process: the fingerprint sum(word64 * multiplier) mod 2^64 tells
        # masks apart without a client being able to aim for a collision. A collision would cost only speed:
        # the entry's staging row, compared word by word, decides whether the entry holds the mask.
        self._multipliers = np.random.default_rng().integers(0, 2**64 - 1, width // 2, np.uint64, endpoint=True) | 1
        self._entries: OrderedDict[int, int] = OrderedDict()  # fingerprint → entry, oldest first
        self._free = list(range(entries - 1, -1, -1))
        self.uploads = self.uploaded_bytes = self.lookups = 0

    def entry(self, mask: TokenMask, stream: Stream | None = None) -> int:
        """The pool entry holding `mask` (uint32 words, or int32 as llguidance writes them; fewer words than
        the vocabulary's leave the rest disallowed), uploading it first when it is not there."""
        words = np.ascontiguousarray(mask).view(np.uint32)
        if words.ndim != 1 or words.size > self.words:
            raise ValueError(f"a mask is at most {self.words} words, got shape {mask.shape}")
        self.lookups += 1
        if words.size == self._mask.size and words.ctypes.data % 8 == 0:
            padded = words  # already the pool's width and readable as uint64: no copy
        else:
            padded = self._mask
            padded[: words.size] = words
            padded[words.size :] = 0
        key = int(np.dot(padded.view(np.uint64), self._multipliers))  # wraps mod 2^64 as the sum of products does
        entry = self._entries.pop(key, None)
        if entry is None:
            entry = self._free.pop() if self._free else self._entries.popitem(last=False)[1]
        self._entries[key] = entry  # the most recent now
        row = self._staging[entry]
        differs = np.not_equal(row, padded, out=self._differs)
        first = int(differs.argmax())
        if not differs[first]:
            return entry  # the card holds it already
        # a reversed view's argmax reads every word; a mask that differs in its last word (a fresh one) needs none
        last = differs.size - 1 if differs[-1] else differs.size - 1 - int(differs[::-1].argmax())
        row[first : last + 1] = padded[first : last + 1]
        # only the words from the first to the last that differ from what the entry held: never more than the
        # whole row, less when the two masks differ in part of the vocabulary only (two states that allow a few
        # ids each, both low in the vocabulary); masks that differ all over it still move their 31 KB
        self.buffer.view(4 * (self.words * entry + first), 4 * (last + 1 - first)).upload_async(
            row[first : last + 1], stream)
        self.uploads += 1
        self.uploaded_bytes += 4 * (last + 1 - first)
        return entry
