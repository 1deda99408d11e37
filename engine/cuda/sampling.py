"""Host side of sampling on the GPU (`cuda_src/sampling.cu`): the buffers of one sampling slot, the
parameter layout the kernels read, and the fixed launch sequence.

Only the chosen token id crosses PCIe (architecture rule 8). The launches also run for several logits rows
at once (`rows`, `row_slot`: sampling.cu's "Rows"), which is how a decode step samples all its slots
(engine.cuda.slot_sampling). The sequence is the same for every request (stages a request does not use
exit at once), so it can be captured in the decode graph; what
changes per request lives in the parameter buffer (`configure`) and the token counts (`reset_counts`,
`count_tokens`), and the draw counter in the parameter buffer advances on the device with every draw.
Semantics are `engine.generation.sampler.Sampler`'s; the kernel file explains how they are met
without sorting the vocabulary.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import numpy as np

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.token_masks import Constraints
from engine.generation.sampler import SamplingParams

# struct SampleParams in sampling.cu (float64 like the reference, so penalties round exactly as it does).
PARAMS_DTYPE = np.dtype(
    [
        ("temperature", "<f8"),
        ("top_p", "<f8"),
        ("min_p", "<f8"),
        ("repetition_penalty", "<f8"),
        ("presence_penalty", "<f8"),
        ("frequency_penalty", "<f8"),
        ("seed", "<u8"),
        ("counter", "<u8"),
        ("top_k", "<i4"),
        ("reserved", "<i4"),
    ]
)
# struct SampleState: the support is {key > final_key} plus the first final_ntie ids with key == final_key.
STATE_DTYPE = np.dtype(
    [
        ("final_key", "<u4"),
        ("final_ntie", "<i4"),
        ("done", "<i4"),
        ("n_finite", "<i4"),
        ("smax", "<f4"),
        ("inv_temp", "<f4"),
        ("topk_key", "<u4"),
        ("topk_ntie", "<i4"),
        ("active", "<i4", (2,)),
        ("prefix", "<u4"),
        ("reserved", "<i4"),
        ("target", "<u8"),
    ]
)
PARTIAL_BYTES = 16  # ArgmaxPartial and DrawPartial
HIST_BINS = 2048
SAMPLE_THREADS = 256
SELECT_SLOTS = 6  # 3 radix passes for top-k, then 3 for top-p


def pack_params(params: SamplingParams, seed: int, counter: int = 0) -> np.ndarray:
    """One `SampleParams` record for the device."""
    rec = np.zeros(1, PARAMS_DTYPE)
    for name in ("temperature", "top_p", "min_p", "repetition_penalty", "presence_penalty", "frequency_penalty"):
        rec[name] = float(getattr(params, name))
    rec["top_k"] = params.top_k
    rec["seed"] = seed
    rec["counter"] = counter
    return rec


@dataclass(frozen=True)
class Support:
    """One row's selected support: its `SampleState` and the per-slice sums of its weights (`DrawPartial`
    [parts]). A sampler keeps one; a speculative round keeps one per draft and target row."""

    state: DeviceBuffer
    draw_partials: DeviceBuffer

    def buffers(self) -> tuple[DeviceBuffer, DeviceBuffer]:
        return self.state, self.draw_partials


def alloc_support(card: CudaCard, parts: int, label: str, rows: int = 1) -> Support:
    return Support(card.alloc(STATE_DTYPE.itemsize * rows, f"{label}.state"),
                   card.alloc(PARTIAL_BYTES * parts * rows, f"{label}.draw_partials"))


def default_parts(card: CudaCard, vocab: int) -> int:
    """Blocks of the vocabulary-wide passes: two per SM, no more than the vocabulary fills."""
    return max(1, min(2 * card.sm_count, -(-vocab // SAMPLE_THREADS)))


@dataclass(frozen=True)
class Scratch:
    """What one sampling pass writes besides the slot's own state, for `rows` logits rows, row-major (row r of
    every array belongs to logits row r): penalised scores [rows][V], argmax partials [rows][parts], the
    support (state [rows], draw partials [rows][parts]), histograms [rows][HIST_BINS] and picks [rows]."""

    scores: DeviceBuffer
    partials: DeviceBuffer
    support: Support
    hist: DeviceBuffer
    token: DeviceBuffer
    vocab: int
    parts: int

    def row(self, r: int) -> "Scratch":
        """Row r alone (views): the scratch of a one-row pass."""
        v, p = self.vocab, self.parts
        return Scratch(self.scores.view(4 * v * r, 4 * v), self.partials.view(PARTIAL_BYTES * p * r, PARTIAL_BYTES * p),
                       Support(self.support.state.view(STATE_DTYPE.itemsize * r, STATE_DTYPE.itemsize),
                               self.support.draw_partials.view(PARTIAL_BYTES * p * r, PARTIAL_BYTES * p)),
                       self.hist.view(8 * HIST_BINS * r, 8 * HIST_BINS), self.token.view(4 * r, 4), v, p)

    def buffers(self) -> tuple[DeviceBuffer, ...]:
        return self.scores, self.partials, *self.support.buffers(), self.hist, self.token


def alloc_scratch(card: CudaCard, vocab: int, parts: int, rows: int, label: str) -> Scratch:
    scratch = Scratch(card.alloc(4 * vocab * rows, f"{label}.scores"),
                      card.alloc(PARTIAL_BYTES * parts * rows, f"{label}.partials"),
                      alloc_support(card, parts, label, rows), card.alloc(8 * HIST_BINS * rows, f"{label}.hist"),
                      card.alloc(4 * rows, f"{label}.token"), vocab, parts)
    scratch.hist.fill_zero()  # the kernels leave it zeroed after every pass
    return scratch


def launch_select(card: CudaCard, logits: DeviceBuffer, params: DeviceBuffer, counts: DeviceBuffer,
                  scores: DeviceBuffer, partials: DeviceBuffer, support: Support, hist: DeviceBuffer,
                  token: DeviceBuffer, vocab: int, parts: int, rows: int = 1, row_slot: DeviceBuffer | None = None,
                  stream: Stream | None = None, constraints: Constraints | None = None) -> None:
    """`GpuSampler.select`'s launches for `rows` logits rows ([rows][V] from `logits`) and row-major scratch;
    with `row_slot`, params, counts and `constraints` are every slot's ([slots] records, [slots][V]) and row r
    uses slot row_slot[r]'s. `constraints` (masks and logit_bias: engine.cuda.token_masks) need `scores` apart
    from `logits`: the bias is added to the raw logit after the plain pass."""
    if logits.nbytes < 4 * vocab * rows:
        raise ValueError(f"logits buffer of {logits.nbytes} bytes < {4 * vocab * rows} for {rows} rows of the vocabulary")
    if constraints is not None and scores.ptr == logits.ptr:
        raise ValueError("constrained sampling needs scores apart from the logits")
    k = card.kernel
    v, p, t = np.int32(vocab), np.int32(parts), SAMPLE_THREADS
    limits = constraints.args() if constraints is not None else (None, None, np.int32(0), None)
    k("sample_scores").launch((parts, rows), t, logits, counts, params, scores, partials, v, row_slot, *limits,
                              stream=stream)
    k("sample_prepare").launch((1, rows), t, partials, p, params, support.state, hist, counts, token, v, row_slot,
                               stream=stream)
    for slot in range(SELECT_SLOTS):
        k("sample_hist").launch((parts, rows), t, scores, v, support.state, hist, np.int32(slot), stream=stream)
        k("sample_select").launch((1, rows), t, params, support.state, hist, np.int32(slot), row_slot, stream=stream)
    k("sample_draw_partial").launch((parts, rows), t, scores, v, support.state, support.draw_partials, stream=stream)


def launch_draw(card: CudaCard, scores: DeviceBuffer, params: DeviceBuffer, support: Support, counts: DeviceBuffer,
                token: DeviceBuffer, vocab: int, parts: int, rows: int = 1, row_slot: DeviceBuffer | None = None,
                stream: Stream | None = None) -> None:
    """`GpuSampler.draw`'s launch for `rows` rows (see `launch_select`)."""
    card.kernel("sample_draw").launch(
        (1, rows), SAMPLE_THREADS, scores, np.int32(vocab), params, support.state, support.draw_partials,
        np.int32(parts), counts, token, row_slot, stream=stream,
    )


class GpuSampler:
    """The device buffers of one sampling slot over a `vocab`-sized logits row, and its launches.

    `parts` is the number of blocks of the vocabulary-wide passes (default: two per SM); it changes
    speed only. All launches go to `stream` (default: the card's), none synchronizes, so `sample` and
    `argmax` can be captured in a CUDA graph.
    """

    def __init__(self, card: CudaCard, vocab: int, label: str = "sampler", parts: int | None = None,
                 params: DeviceBuffer | None = None, counts: DeviceBuffer | None = None, scratch: Scratch | None = None,
                 constraints: Constraints | None = None):
        """`params` and `counts`: the slot's request state where a decoder keeps every slot's side by side
        (engine.cuda.slot_sampling); `scratch`: a one-row scratch it shares between its slots' samplers (their
        passes run one at a time on the card's stream). Each is allocated here when not given. `constraints`:
        the slot's mask entry and logit_bias (engine.cuda.token_masks), which `sample` applies."""
        if vocab < 1:
            raise ValueError(f"vocabulary size {vocab} must be positive")
        self.card = card
        self.vocab = vocab
        self.parts = scratch.parts if scratch is not None else parts if parts is not None else default_parts(card, vocab)
        self.params = params if params is not None else card.alloc(PARAMS_DTYPE.itemsize, f"{label}.params")
        self.counts = counts if counts is not None else card.alloc(4 * vocab, f"{label}.counts")
        self.constraints = constraints
        scratch = scratch if scratch is not None else alloc_scratch(card, vocab, self.parts, 1, label)
        self.scratch = scratch
        self.support, self.partials, self.hist, self.scores, self.token = (
            scratch.support, scratch.partials, scratch.hist, scratch.scores, scratch.token)
        if counts is None:
            self.counts.fill_zero()

    def configure(self, params: SamplingParams, counter: int = 0) -> int:
        """Write a request's parameters (a seedless request gets a fresh random seed); returns the seed."""
        seed = params.seed if params.seed is not None else secrets.randbits(64)
        self.params.upload(pack_params(params, seed, counter))
        return seed

    def reset_counts(self, stream: Stream | None = None) -> None:
        """Forget the token history (new request)."""
        self.counts.fill_zero(stream)

    def count_tokens(self, ids: DeviceBuffer, n: int, stream: Stream | None = None, delta: int = 1) -> None:
        """Add n token ids (int32 on the device; ids outside the vocabulary, e.g. -1 padding, are skipped) to the
        history the penalties see, `delta` times each (-1 takes them back)."""
        if n < 1 or ids.nbytes < 4 * n:
            raise ValueError(f"{n} ids need {4 * n} bytes, the buffer has {ids.nbytes}")
        blocks = min(-(-n // SAMPLE_THREADS), 4 * self.card.sm_count)
        self.card.kernel("token_counts_add").launch(
            blocks, SAMPLE_THREADS, self.counts, ids, np.int32(n), np.int32(self.vocab), np.int32(delta), stream=stream
        )

    def sample(self, logits: DeviceBuffer, stream: Stream | None = None) -> None:
        """Penalise, filter and draw from fp32 `logits` [vocab]; the id (-1 on NaN/+inf logits) goes to `token`.

        The pick is added to the counts and, unless greedy, the draw counter advances by one. The slot's
        constraints (when it has them) apply.
        """
        self.select(logits, self.scores, self.support, self.token, stream, self.constraints)
        self.draw(self.scores, self.support, self.counts, self.token, stream)

    def select(self, logits: DeviceBuffer, scores: DeviceBuffer, support: Support, token: DeviceBuffer,
               stream: Stream | None = None, constraints: Constraints | None = None) -> None:
        """The first part of `sample`: penalties (by this sampler's counts) and `constraints` if given into
        `scores` (which may be `logits` itself when there are none: speculative rounds, never constrained),
        then the support of the request's filters into `support`. A greedy request's pick, or -1 for a row
        with NaN/+inf, is written to `token` here already."""
        launch_select(self.card, logits, self.params, self.counts, scores, self.partials, support, self.hist, token,
                      self.vocab, self.parts, stream=stream, constraints=constraints)

    def draw(self, scores: DeviceBuffer, support: Support, counts: DeviceBuffer, token: DeviceBuffer,
             stream: Stream | None = None) -> None:
        """The second part of `sample`: one draw from the selected support into `token`, added to `counts`
        (a speculative draft's pick goes to a scratch count, since it may be rejected)."""
        launch_draw(self.card, scores, self.params, support, counts, token, self.vocab, self.parts, stream=stream)

    def argmax(self, logits: DeviceBuffer, stream: Stream | None = None, token: DeviceBuffer | None = None) -> None:
        """Greedy without penalties or counts: the arg-max of `logits` (lowest id on ties, -1 on NaN/+inf), into
        `token` (default: this sampler's; a speculative round puts several picks side by side)."""
        if logits.nbytes < 4 * self.vocab:
            raise ValueError(f"logits buffer of {logits.nbytes} bytes < {4 * self.vocab} for the vocabulary")
        k = self.card.kernel
        k("argmax_partial").launch(self.parts, SAMPLE_THREADS, logits, np.int32(self.vocab), self.partials, stream=stream)
        k("argmax_final").launch(1, SAMPLE_THREADS, self.partials, np.int32(self.parts),
                                 self.token if token is None else token, stream=stream)

    def read_token(self) -> int:
        """The last id written to `token` (waits for the work before it)."""
        return int(self.token.download(np.int32, 1)[0])

    def read_state(self) -> np.ndarray:
        """The selection state of the last `sample` (a `STATE_DTYPE` record), for tests and debugging."""
        return self.support.state.download(STATE_DTYPE, 1)[0]

    def read_params(self) -> np.ndarray:
        """The parameter record as the device holds it now (the counter advances with each draw)."""
        return self.params.download(PARAMS_DTYPE, 1)[0]

    def free(self) -> None:
        """Free what this sampler allocated (tests; a decoder's samplers live as long as its card)."""
        for buf in (self.params, self.counts, *self.scratch.buffers()):
            buf.free()
