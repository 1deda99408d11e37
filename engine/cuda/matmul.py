"""One matmul entry point for every weight kind the forward pass holds: Q8_0, K-quant, or a stack of both.

A stack of matrices sharing one input (attention q, k, v; the GDN in-projections; ffn gate+up) is one
launch when its matrices have one kind. llama.cpp's Q4_K_M files mix types inside such stacks (attn_v
and the GDN attn_qkv of some layers are Q6_K while q/k/z are Q4_K; F32 alpha/beta become Q8_0), so a
`MixedWeight` holds runs of consecutive same-kind matrices, each uploaded as its own weight, and a
matmul launches each run on its rows of the output. The output layout is unchanged (segment i is its own
[T][rows_i] matrix), because a run starting at row `start` writes exactly the bytes from 4·T·start that
the segments it holds occupy; the shared Q8_1 input is still quantized once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Union

from engine.cuda.driver import CudaCard, DeviceBuffer, Stream
from engine.cuda.gemm import gemm_q8
from engine.cuda.gemv import MAX_GEMV_TOKENS, Q8Activations, Q8Weight, gemv_q8
from engine.cuda.kq_weight import KQWeight, embed_kq, gemm_kq, gemv_kq
from engine.cuda.embedding import embed_q8_0

SingleWeight = Union[Q8Weight, KQWeight]


@dataclass(frozen=True)
class MixedWeight:
    """Stacked matrices of different kinds: `runs` in row order, each a single-kind stack."""

    runs: tuple[SingleWeight, ...]

    @property
    def rows(self) -> int:
        return sum(r.rows for r in self.runs)

    @property
    def k(self) -> int:
        return self.runs[0].k

    @property
    def segments(self) -> tuple[int, ...]:
        return tuple(s for r in self.runs for s in r.segments)

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for r in self.runs)

    def segment_view(self, y: DeviceBuffer, index: int, n_tokens: int) -> DeviceBuffer:
        start = sum(self.segments[:index])
        return y.view(4 * start * n_tokens, 4 * self.segments[index] * n_tokens)


Weight = Union[Q8Weight, KQWeight, MixedWeight]


def same_kind_runs(kinds: Sequence[object]) -> list[range]:
    """Index ranges of the maximal runs of equal consecutive `kinds` (the matrices one launch can share)."""
    runs: list[range] = []
    start = 0
    for end in range(1, len(kinds) + 1):
        if end == len(kinds) or kinds[end] != kinds[start]:
            runs.append(range(start, end))
            start = end
    return runs


def stack(runs: list[SingleWeight]) -> Weight:
    """The weight of consecutive runs: the run itself when there is one."""
    if len(runs) == 1:
        return runs[0]
    if len({r.k for r in runs}) != 1:
        raise ValueError("stacked matrices must share their input width")
    return MixedWeight(tuple(runs))


def matmul(card: CudaCard, w: Weight, x: Q8Activations, y: DeviceBuffer, n_tokens: int,
           residual: DeviceBuffer | None = None, stream: Stream | None = None) -> None:
    """y = W x (+ residual): the GEMV for up to MAX_GEMV_TOKENS tokens, the GEMM beyond, by weight kind."""
    if isinstance(w, MixedWeight):
        start = 0
        for run in w.runs:
            offset, length = 4 * start * n_tokens, 4 * run.rows * n_tokens
            matmul(card, run, x, y.view(offset, length), n_tokens,
                   None if residual is None else residual.view(offset, length), stream)
            start += run.rows
        return
    few = n_tokens <= MAX_GEMV_TOKENS
    if isinstance(w, KQWeight):
        (gemv_kq if few else gemm_kq)(card, w, x, y, n_tokens, residual=residual, stream=stream)
    else:
        (gemv_q8 if few else gemm_q8)(card, w, x, y, n_tokens, residual=residual, stream=stream)


def embed(card: CudaCard, table: Weight, ids: DeviceBuffer, out: DeviceBuffer, n_tokens: int,
          stream: Stream | None = None) -> None:
    """out[t] = the fp32 embedding row ids[t], from a Q8_0 or K-quant table."""
    if isinstance(table, KQWeight):
        embed_kq(card, table, ids, out, n_tokens, stream)
    elif isinstance(table, Q8Weight):
        embed_q8_0(card, table, ids, out, n_tokens, stream)
    else:
        raise ValueError("the embedding table must be a single matrix, not a stack")
