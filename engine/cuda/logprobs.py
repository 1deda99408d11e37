"""Host side of log-probabilities on the card (`cuda_src/logprobs.cu`): one slot's buffers, its two launches
after the sampler, and the record read back.

A request with `top_logprobs` downloads LOGPROB_DTYPE (176 bytes) per token instead of its logits row
(about 1 MB at the Qwen3.5 vocabulary; issue 28: ~4 ms per token per slot over a CMP's PCIe Gen1 x1).
The launches are captured in every decode graph; a slot's `wanted` flag, written per request, lets them
return at once for requests that asked for nothing, so asking does not change the graph. Like the sampler's,
the launches also run for several rows at once (`launch_logprobs`), each row with the flag of its slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.sampling import SAMPLE_THREADS, default_parts
from engine.generation.logprobs import MAX_TOP_LOGPROBS, TokenLogprob

LOGPROB_TOP = MAX_TOP_LOGPROBS  # LOGPROB_TOP in logprobs.cu
LOGPROB_MAX_PARTS = 256  # LOGPROB_MAX_PARTS in logprobs.cu: the final launch holds one slice's list per thread
# struct LogprobRow in logprobs.cu
LOGPROB_DTYPE = np.dtype([("lse", "<f8"), ("token_logit", "<f4"), ("token", "<i4"),
                          ("top_id", "<i4", (LOGPROB_TOP,)), ("top_logit", "<f4", (LOGPROB_TOP,))])
PARTIAL_BYTES = 8  # struct LogprobPartial
KEY_BYTES = 8  # ListKey: a candidate's logit and id as one sortable integer


def logprob_parts(card: CudaCard, vocab: int) -> int:
    """Slices of the logprob passes: the sampler's, at most LOGPROB_MAX_PARTS (an H200: 256 of 264; a CMP: 160)."""
    return min(default_parts(card, vocab), LOGPROB_MAX_PARTS)


@dataclass(frozen=True)
class LogprobScratch:
    """The partials of `rows` logits rows, row-major: (max, sum) [rows][parts], candidate keys [rows][parts][TOP]."""

    partials: DeviceBuffer
    candidates: DeviceBuffer
    parts: int

    def row(self, r: int) -> "LogprobScratch":
        p, c = self.parts, KEY_BYTES * LOGPROB_TOP * self.parts
        return LogprobScratch(self.partials.view(PARTIAL_BYTES * p * r, PARTIAL_BYTES * p),
                              self.candidates.view(c * r, c), p)


def alloc_logprob_scratch(card: CudaCard, parts: int, rows: int, label: str) -> LogprobScratch:
    if not 1 <= parts <= LOGPROB_MAX_PARTS:
        raise ValueError(f"logprobs run over 1 to {LOGPROB_MAX_PARTS} slices, not {parts}")
    return LogprobScratch(card.alloc(PARTIAL_BYTES * parts * rows, f"{label}.partials"),
                          card.alloc(KEY_BYTES * LOGPROB_TOP * parts * rows, f"{label}.candidates"), parts)


def launch_logprobs(card: CudaCard, logits: DeviceBuffer, vocab: int, wanted: DeviceBuffer, scratch: LogprobScratch,
                    token: DeviceBuffer, out: DeviceBuffer, rows: int = 1, row_slot: DeviceBuffer | None = None,
                    stream: Stream | None = None) -> None:
    """The records of `rows` logits rows ([rows][V]) and their picks (`token` [rows]) into `out` [rows]; with
    `row_slot`, `wanted` is every slot's flag and row r obeys slot row_slot[r]'s."""
    if logits.nbytes < 4 * vocab * rows:
        raise ValueError(f"logits buffer of {logits.nbytes} bytes < {4 * vocab * rows} for {rows} rows of the vocabulary")
    v, parts = np.int32(vocab), scratch.parts
    card.kernel("logprob_partial").launch((parts, rows), SAMPLE_THREADS, logits, v, wanted, scratch.partials,
                                          scratch.candidates, row_slot, stream=stream)
    card.kernel("logprob_final").launch((1, rows), SAMPLE_THREADS, logits, v, wanted, scratch.partials,
                                        scratch.candidates, np.int32(parts), token, out, row_slot, stream=stream)


class GpuLogprobs:
    """The logprob buffers of one slot over a `vocab`-sized logits row. `out` is where its record goes
    (LOGPROB_DTYPE.itemsize bytes). `wanted` (the slot's flag among every slot's) and `scratch` (one row,
    shared by a decoder's slots) are allocated here when not given (engine.cuda.slot_sampling gives them)."""

    def __init__(self, card: CudaCard, vocab: int, out: DeviceBuffer, label: str = "logprobs", parts: int | None = None,
                 wanted: DeviceBuffer | None = None, scratch: LogprobScratch | None = None):
        if out.nbytes < LOGPROB_DTYPE.itemsize:
            raise ValueError(f"a logprob record needs {LOGPROB_DTYPE.itemsize} bytes, '{out.label}' has {out.nbytes}")
        self.card, self.vocab, self.out = card, vocab, out
        parts = scratch.parts if scratch is not None else parts if parts is not None else logprob_parts(card, vocab)
        self.scratch = scratch if scratch is not None else alloc_logprob_scratch(card, parts, 1, label)
        self.parts = parts
        self.wanted = wanted if wanted is not None else card.alloc(4, f"{label}.wanted")
        self.wanted.fill_zero()

    def want(self, on: bool) -> None:
        """Compute this slot's record from now on (a request with top_logprobs), or skip it."""
        self.wanted.upload(np.array([1 if on else 0], np.int32))

    def compute(self, logits: DeviceBuffer, token: DeviceBuffer, stream: Stream | None = None) -> None:
        """The record of fp32 `logits` [vocab] and the sampler's pick in `token` (launch after the sampler)."""
        launch_logprobs(self.card, logits, self.vocab, self.wanted, self.scratch, token, self.out, stream=stream)


def token_logprobs_of(records: np.ndarray, top_ns: Sequence[int]) -> list[TokenLogprob]:
    """Downloaded LOGPROB_DTYPE records ([rows]) as the scheduler's TokenLogprobs, row r with `top_ns[r]` alternatives
    (0..20). Whole-array subtractions in float64 (float32 minus the float64 lse widens exactly: the same values as
    Python floats), then plain lists: a batched step's rows cost a few µs each on the host, where a record at a time
    through numpy scalars cost 16 µs (dev machine), time the card waits for. The card pads with id -1 only at the
    tail, so a list whose last id is a token is taken whole (4 rows: 14 against 22 µs filtering every pair)."""
    for top_n in top_ns:
        if not 0 <= top_n <= LOGPROB_TOP:
            raise ValueError(f"top_n must be in [0, {LOGPROB_TOP}], got {top_n}")
    lse = records["lse"]
    tokens, token_lps = records["token"].tolist(), (records["token_logit"] - lse).tolist()
    top_ids, top_lps = records["top_id"].tolist(), (records["top_logit"] - lse[:, None]).tolist()
    out = []
    for r, n in enumerate(top_ns):
        ids, lps = top_ids[r][:n], top_lps[r][:n]
        whole = not ids or ids[-1] >= 0
        out.append(TokenLogprob(tokens[r], token_lps[r],
                                tuple(zip(ids, lps)) if whole else tuple((i, x) for i, x in zip(ids, lps) if i >= 0)))
    return out


def token_logprob_of(record: np.ndarray, top_n: int) -> TokenLogprob:
    """One downloaded LOGPROB_DTYPE record as the scheduler's TokenLogprob with `top_n` alternatives (0..20)."""
    return token_logprobs_of(np.asarray(record).reshape(1), [top_n])[0]
