"""Host side of log-probabilities on the card (`cuda_src/logprobs.cu`): one slot's buffers, its two launches
after the sampler, and the record read back.

A request with `top_logprobs` downloads LOGPROB_DTYPE (176 bytes) per token instead of its logits row
(about 1 MB at the Qwen3.5 vocabulary; issue 28: ~4 ms per token per slot over a CMP's PCIe Gen1 x1).
The launches are captured in every decode graph; a slot's `wanted` flag, written per request, lets them
return at once for requests that asked for nothing, so asking does not change the graph.
"""

from __future__ import annotations

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.sampling import SAMPLE_THREADS
from engine.generation.logprobs import MAX_TOP_LOGPROBS, TokenLogprob

LOGPROB_TOP = MAX_TOP_LOGPROBS  # LOGPROB_TOP in logprobs.cu
# struct LogprobRow in logprobs.cu
LOGPROB_DTYPE = np.dtype([("lse", "<f8"), ("token_logit", "<f4"), ("token", "<i4"),
                          ("top_id", "<i4", (LOGPROB_TOP,)), ("top_logit", "<f4", (LOGPROB_TOP,))])
PARTIAL_BYTES = 8  # struct LogprobPartial


class GpuLogprobs:
    """The logprob buffers of one slot over a `vocab`-sized logits row. `out` is where its record goes
    (LOGPROB_DTYPE.itemsize bytes; e.g. the slot's place in a buffer read back once for all slots)."""

    def __init__(self, card: CudaCard, vocab: int, out: DeviceBuffer, label: str = "logprobs", parts: int | None = None):
        if out.nbytes < LOGPROB_DTYPE.itemsize:
            raise ValueError(f"a logprob record needs {LOGPROB_DTYPE.itemsize} bytes, '{out.label}' has {out.nbytes}")
        self.card, self.vocab, self.out = card, vocab, out
        self.parts = parts if parts is not None else max(1, min(2 * card.sm_count, -(-vocab // SAMPLE_THREADS)))
        self.wanted = card.alloc(4, f"{label}.wanted")
        self.partials = card.alloc(PARTIAL_BYTES * self.parts, f"{label}.partials")
        self.cand_logit = card.alloc(4 * LOGPROB_TOP * self.parts, f"{label}.cand_logit")
        self.cand_id = card.alloc(4 * LOGPROB_TOP * self.parts, f"{label}.cand_id")
        self.wanted.fill_zero()

    def want(self, on: bool) -> None:
        """Compute this slot's record from now on (a request with top_logprobs), or skip it."""
        self.wanted.upload(np.array([1 if on else 0], np.int32))

    def compute(self, logits: DeviceBuffer, token: DeviceBuffer, stream: Stream | None = None) -> None:
        """The record of fp32 `logits` [vocab] and the sampler's pick in `token` (launch after the sampler)."""
        if logits.nbytes < 4 * self.vocab:
            raise ValueError(f"logits buffer of {logits.nbytes} bytes < {4 * self.vocab} for the vocabulary")
        v = np.int32(self.vocab)
        self.card.kernel("logprob_partial").launch(self.parts, SAMPLE_THREADS, logits, v, self.wanted,
                                                   self.partials, self.cand_logit, self.cand_id, stream=stream)
        self.card.kernel("logprob_final").launch(1, SAMPLE_THREADS, logits, v, self.wanted, self.partials,
                                                 self.cand_logit, self.cand_id, np.int32(self.parts), token, self.out,
                                                 stream=stream)


def token_logprob_of(record: np.ndarray, top_n: int) -> TokenLogprob:
    """A downloaded LOGPROB_DTYPE record as the scheduler's TokenLogprob with `top_n` alternatives (0..20)."""
    if not 0 <= top_n <= LOGPROB_TOP:
        raise ValueError(f"top_n must be in [0, {LOGPROB_TOP}], got {top_n}")
    lse = float(record["lse"])
    top = tuple((int(i), float(x) - lse) for i, x in zip(record["top_id"][:top_n], record["top_logit"][:top_n])
                if i >= 0)
    return TokenLogprob(int(record["token"]), float(record["token_logit"]) - lse, top)
