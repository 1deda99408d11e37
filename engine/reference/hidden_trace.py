"""Hidden rows per (layer, sub-step) recorded during a forward pass, for `rigllm debug compare`.

Both backends record into the same structure at the same three places of every decoder block
(spec §6.3): "norm" (the mixer's input, rmsnorm(h) in fp32), "mixer" (the residual stream after
h += mixer(...)), "ffn" (the residual stream after h += FFN(...)). Rows are appended call after call, so
after a prefill and some decode steps each place holds [tokens, D] in feed order.

The reference records when a trace is active (`tracing`, a context variable: no argument threads through
the model, and nothing is recorded otherwise); the CUDA backend records when `ForwardPass.trace` is set,
on its eager path only (it downloads after each sub-step, so it is slow and never inside a graph).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

SUB_STEPS = ("norm", "mixer", "ffn")


class HiddenTrace:
    """fp32 rows per (layer, sub-step), in the order they were computed."""

    def __init__(self) -> None:
        self._rows: dict[tuple[int, str], list[np.ndarray]] = {}

    def record(self, layer: int, step: str, rows: np.ndarray) -> None:
        if step not in SUB_STEPS:
            raise ValueError(f"unknown sub-step '{step}' (known: {', '.join(SUB_STEPS)})")
        self._rows.setdefault((layer, step), []).append(np.array(rows, dtype=np.float32, copy=True))

    def places(self) -> list[tuple[int, str]]:
        """(layer, sub-step) in forward order."""
        return sorted(self._rows, key=lambda p: (p[0], SUB_STEPS.index(p[1])))

    @classmethod
    def merged(cls, traces: "list[HiddenTrace]") -> "HiddenTrace":
        """One trace of several that recorded disjoint layers (the cards of a pipeline)."""
        out = cls()
        for trace in traces:
            for place, rows in trace._rows.items():
                if place in out._rows:
                    raise ValueError(f"two traces recorded layer {place[0]} {place[1]}")
                out._rows[place] = list(rows)
        return out

    def rows(self, layer: int, step: str) -> np.ndarray:
        """All rows recorded at one place, [tokens, D]."""
        return np.concatenate(self._rows[(layer, step)])


_active: ContextVar[HiddenTrace | None] = ContextVar("hidden_trace", default=None)


@contextmanager
def tracing(trace: HiddenTrace) -> Iterator[HiddenTrace]:
    """Record the reference's hidden rows into `trace` while the block runs."""
    token = _active.set(trace)
    try:
        yield trace
    finally:
        _active.reset(token)


def record(layer: int, step: str, rows: np.ndarray) -> None:
    """Record into the active trace, if any (the reference's hook; a no-op otherwise)."""
    trace = _active.get()
    if trace is not None:
        trace.record(layer, step, rows)
