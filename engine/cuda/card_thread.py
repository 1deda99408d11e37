"""Where a card's work runs: a thread of its own (`CardThread`), or at once on the caller's (`InlineCard`).

Contexts are bound to the thread that made them (architecture.md: one thread per card), and a
thread per card is also what keeps several cards busy at once: one thread launching for three cards
stalls on the first full launch queue (anchor-qengine.md lesson 9). Work is submitted as callables;
the tasks of one card run in submission order, which is what keeps its GDN state and KV cache in
sequence order while chunks flow through a pipeline.

A backend of one card needs no thread of its own: the thread that opens it (the serving worker's, a
command's) already owns the card, and a second thread would only add two hand-offs to every call. So
one card runs inline: the same `submit`/`call` interface, each task run before `submit` returns.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol, TypeVar

T = TypeVar("T")
ThreadFactory = Callable[[Callable[[], None], str], Any]


class CardExecutor(Protocol):
    """Runs one card's tasks, in submission order, on the thread that owns the card's context."""

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        """Run `fn(*args)` after everything submitted before it; its outcome arrives in the future."""

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """`submit` and wait for the result (re-raising the task's exception here)."""

    def close(self) -> None:
        """Finish the submitted tasks and stop taking more."""


class CardThread:
    def __init__(self, name: str, thread_factory: ThreadFactory | None = None):
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


class InlineCard:
    """The card of a one-card backend, driven from the caller's thread (which made its context): each task
    runs inside `submit`, so the order is the order of the calls and nothing waits on another thread."""

    def submit(self, fn: Callable[..., T], *args: Any) -> Future:
        """Run `fn(*args)` now; its result or exception is in the returned (done) future, as on a thread."""
        future: Future = Future()
        try:
            future.set_result(fn(*args))
        except BaseException as err:  # delivered to whoever waits on the future, as CardThread does
            future.set_exception(err)
        return future

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        return fn(*args)

    def close(self) -> None:
        """Nothing runs after the call that submitted it."""


def card_executors(n_cards: int, thread_factory: ThreadFactory | None = None) -> list[CardExecutor]:
    """One executor per card: a single card runs inline on the caller's thread; several cards get a thread
    each from `thread_factory` (named rigllm-card0, rigllm-card1, ...)."""
    if n_cards == 1:
        return [InlineCard()]
    return [CardThread(f"rigllm-card{i}", thread_factory) for i in range(n_cards)]
