"""A thread that owns one card: everything touching that card's CUDA context runs on it, in order.

Contexts are bound to the thread that made them (architecture.md: one thread per card), and a
thread per card is also what keeps several cards busy at once: one thread launching for three cards
stalls on the first full launch queue (anchor-qengine.md lesson 9). Work is submitted as callables;
the tasks of one card run in submission order, which is what keeps its GDN state and KV cache in
sequence order while chunks flow through a pipeline.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

T = TypeVar("T")


class CardThread:
    def __init__(self, name: str, thread_factory: Callable[[Callable[[], None], str], Any] | None = None):
        """`thread_factory(target, name)`: the thread to run on (a plain daemon thread by default; the
        desktop app passes a QThread-backed one: contracts.md "Threads and ownership")."""
        self._tasks: queue.Queue[tuple[Callable[[], Any], Future] | None] = queue.Queue()
        if thread_factory is None:
            self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        else:
            self._thread = thread_factory(self._run, name)
        self._thread.start()

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        """Run `fn(*args)` on this card's thread after everything submitted before it."""
        future: Future = Future()
        self._tasks.put((lambda: fn(*args), future))
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`submit` and wait for the result (re-raising the task's exception here)."""
        return self.submit(fn, *args).result()

    def close(self) -> None:
        """Finish the queued tasks and end the thread."""
        if self._thread.is_alive():
            self._tasks.put(None)
            self._thread.join()

    def _run(self) -> None:
        while (task := self._tasks.get()) is not None:
            fn, future = task
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn())
            except BaseException as err:  # delivered to whoever waits on the future
                future.set_exception(err)
