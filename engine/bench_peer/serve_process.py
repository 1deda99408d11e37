"""`rigllm serve` as a child process on a free loopback port, for benchmarks that must time the real server.

A child, not uvicorn in a thread of the benchmark: the clients' threads parse SSE in Python, and in one
process they would take the GIL from the server's event loop and scheduler, slowing what is measured.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.errors import RigllmError

ROOT = Path(__file__).resolve().parents[2]  # the child imports the same engine package as this process
READY_TIMEOUT_S = 900.0  # a 27B Q8_0 file read from a cold disk and uploaded takes minutes
STOP_TIMEOUT_S = 60.0


def free_port() -> int:
    """A loopback port nobody holds now (the child binds it a moment later; another taker in between is
    unlikely on a benchmark machine, and would show as the child failing to start)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def serve_command(model: Path, backend: str, port: int, slots: int, context: int) -> list[str]:
    """The `rigllm serve` command line. `--mtp off`: `rigllm bench`'s concurrent streams decode without
    drafts, and a random-weight MTP head's drafts would nearly all be rejected, so speculation would only
    add verify cost. `--no-snapshots`: chat-turn states stay in memory, off the user's data folder."""
    return [sys.executable, "-m", "engine.cli", "serve", str(model.resolve()), "--backend", backend, "--host", "127.0.0.1",
            "--port", str(port), "--slots", str(slots), "--context", str(context), "--mtp", "off", "--no-snapshots"]


def _healthy(root: str) -> bool:
    try:
        with urllib.request.urlopen(f"{root}/health", timeout=5) as answer:
            return answer.status == 200
    except (urllib.error.URLError, OSError):
        return False  # not listening yet, or 503 while the model loads


def _tail(log: Path, chars: int = 3000) -> str:
    return log.read_text(encoding="utf-8", errors="replace")[-chars:] if log.is_file() else ""


@contextmanager
def serving(model: Path, backend: str, slots: int, context: int, log: Path,
            ready_timeout: float = READY_TIMEOUT_S) -> Iterator[str]:
    """The base URL (ending in `/v1`) of `rigllm serve MODEL` once its /health answers 200; the child's
    output goes to `log`. After the block it is stopped with SIGTERM (as `systemctl stop` does, so it
    frees the card itself), and killed only if it has not exited within STOP_TIMEOUT_S."""
    port = free_port()
    root = f"http://127.0.0.1:{port}"
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "wb") as out:
        child = subprocess.Popen(serve_command(model, backend, port, slots, context), cwd=ROOT,
                                 stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + ready_timeout
        while not _healthy(root):
            if child.poll() is not None:
                raise RigllmError(f"rigllm serve exited with {child.returncode} before it was ready:\n{_tail(log)}")
            if time.monotonic() > deadline:
                raise RigllmError(f"rigllm serve was not ready after {ready_timeout:.0f} s:\n{_tail(log)}")
            time.sleep(0.2)
        yield f"{root}/v1"
    finally:
        child.terminate()
        try:
            child.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()
