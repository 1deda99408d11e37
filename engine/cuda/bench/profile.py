"""Per-kernel time breakdown of a launch sequence (e.g. one decode step), without a profiler.

CUPTI is blocked on the CMP 100-210 and sync-based profilers lie (anchor-qengine.md lesson 15), so:
record every launch one call of the sequence makes, then for each kernel name replay just that
kernel's launches (same grids, same arguments) from a CUDA graph and time them with events. The sum
of the parts can differ from the whole step (the whole overlaps kernel tails and pays no per-graph
cost per group); both are reported.
"""

from __future__ import annotations

from collections import defaultdict
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator

from engine.cuda.driver import CudaCard, Kernel
from engine.cuda.bench.microbench import time_graph_ms


@contextmanager
def recorded_launches() -> Iterator[list[tuple[Kernel, tuple, dict]]]:
    """Inside the block, every `Kernel.launch` is recorded (and still executed)."""
    launches: list[tuple[Kernel, tuple, dict]] = []
    original = Kernel.launch

    def recording(self: Kernel, *args: Any, **kwargs: Any) -> None:
        launches.append((self, args, kwargs))
        original(self, *args, **kwargs)

    Kernel.launch = recording  # type: ignore[method-assign]
    try:
        yield launches
    finally:
        Kernel.launch = original  # type: ignore[method-assign]


def replay(launches: Iterable[tuple[Kernel, tuple, dict]]) -> None:
    """Launch recorded launches again, in order, with their grids and arguments (inside a capture: a graph of them)."""
    for kernel, args, kwargs in launches:
        kernel.launch(*args, **kwargs)


def kernel_breakdown(card: CudaCard, step: Callable[[], None], reps: int = 10) -> dict[str, Any]:
    """Microseconds per call of `step`, whole and per kernel name (with launch counts)."""
    with recorded_launches() as launches:
        step()
    card.synchronize()
    whole_us = time_graph_ms(card, reps, lambda _: step()) * 1e3
    groups: dict[str, list[tuple[Kernel, tuple, dict]]] = defaultdict(list)
    for launch in launches:
        groups[launch[0].name].append(launch)
    parts = {}
    for name, group in groups.items():
        parts[name] = {"launches": len(group), "us": time_graph_ms(card, reps, lambda _, g=group: replay(g)) * 1e3}
    ordered = dict(sorted(parts.items(), key=lambda kv: -kv[1]["us"]))
    return {"whole_us": whole_us, "sum_of_parts_us": sum(p["us"] for p in parts.values()), "kernels": ordered}
