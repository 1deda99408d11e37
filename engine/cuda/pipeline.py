"""Hidden rows moving through the CUDA backend's stages: the bridge between cards, and the pipelined prefill.

A hop is: D2H of the fp32 hidden rows into portable pinned memory on card i, a host wait for that copy
(the fence the CMP needs: anchor-qengine.md lesson 9), then H2D on card i+1. A decode step makes one
hop per boundary (engine.cuda.backend); a prefill's chunks flow through the cards, so card i works on
chunk c+1 while card i+1 works on chunk c, with two bridge buffers per boundary (`PipelinedPrefill`; a
"chunk" there is one forward pass, which may hold several slots' chunks).
`BridgeModel` can slow every hop down to the CMP's PCIe Gen1 x1 on a fast host link.

On a single card (one stage, run inline on the caller's thread) the same prefill runs each chunk at
once, in order, and no hop or buffer wait happens.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass

import numpy as np

from engine.cuda.card_thread import CardExecutor
from engine.cuda.prefill_chunks import PrefillChunk
from engine.cuda.stage import Stage


@dataclass(frozen=True)
class BridgeModel:
    """An optional slowdown of every hop, so a fast host link feels like the CMP's PCIe Gen1 x1."""

    bytes_per_second: float
    latency_seconds: float = 0.0

    def delay(self, nbytes: int) -> None:
        time.sleep(self.latency_seconds + nbytes / self.bytes_per_second)


PrefillPass = Sequence[tuple[int, PrefillChunk]]  # one forward pass: (slot, chunk) pairs, one after another in its rows


class PipelinedPrefill:
    """A prefill through every stage, pass by pass: each pass is one slot's chunk, or several slots' chunks sharing
    the pass (`SlotDecoder.feed_chunks`). Each pass runs on card i's executor and hands its hidden rows (through
    `hop`) to card i+1's; the bridge buffers' availability and the outcome are shared by the card threads, and a
    failure anywhere releases every waiting card."""

    def __init__(self, stages: Sequence[Stage], executors: Sequence[CardExecutor],
                 hop: Callable[[np.ndarray], np.ndarray], passes: Sequence[PrefillPass]):
        self.stages, self.executors, self.hop, self.passes = stages, executors, hop, passes
        self.free = [[threading.Event() for _ in range(2)] for _ in stages]  # per card: its two bridge buffers
        for events in self.free:
            for e in events:
                e.set()
        self.done: Future = Future()
        self.failed = False

    def run(self) -> None:
        """Start every pass on the first card and wait for the last one to leave the last card."""
        if not self.passes:
            return
        for c in range(len(self.passes)):
            self.executors[0].submit(self._chunk, 0, c, None)
        self.done.result()

    def _fail(self, err: BaseException) -> None:
        self.failed = True
        for events in self.free:  # no card may wait for a buffer that will never be released
            for e in events:
                e.set()
        if not self.done.done():
            self.done.set_exception(err)

    def _chunk(self, i: int, c: int, hidden: np.ndarray | None) -> None:
        """Pass c on card i (on card i's executor); hands its hidden rows to card i+1's executor."""
        if self.failed:
            return
        st, chunks, last = self.stages[i], self.passes[c], i == len(self.stages) - 1
        rows = sum(len(part.ids) for _, part in chunks)
        try:
            if last:
                st.decoder.feed_chunks(chunks, hidden)
            else:
                buf = st.out[c % 2]
                self.free[i][c % 2].wait()
                self.free[i][c % 2].clear()
                st.decoder.feed_chunks(chunks, hidden, out=buf)
            if i > 0:
                self.free[i - 1][c % 2].set()  # this card has copied the previous card's rows in
            if last:
                if c == len(self.passes) - 1:
                    self.done.set_result(None)
            else:
                self.executors[i + 1].submit(self._chunk, i + 1, c, self.hop(buf[:rows]))
        except BaseException as err:
            self._fail(err)
