"""On a machine with a GPU: the app loads the demo model on the CUDA backend and streams an answer.

Skipped without a usable GPU (CI); the lead runs it on the GPU machine.
"""

from __future__ import annotations

import pytest
from conftest import Recorder

from engine.cuda.driver import gpu_unavailable_reason

from app.chat_records import Message
from app.model_loader import LoadRequest, ModelLoader
from app.settings import AppSettings

pytestmark = pytest.mark.skipif(bool(gpu_unavailable_reason()), reason="no usable GPU")


def test_demo_model_loads_on_cuda_with_progress_and_answers(qtbot):
    loader = ModelLoader()
    progress, loaded, failed = Recorder(loader.progress), Recorder(loader.loaded), Recorder(loader.failed)
    loader.load(LoadRequest(None, "auto", 4096, "f16", (0,)))
    qtbot.waitUntil(lambda: bool(loaded.calls or failed.calls), timeout=300_000)
    assert not failed.calls, failed.calls
    engine = loaded.calls[0][0]
    try:
        assert engine.info.backend == "cuda" and engine.info.cards == (0,)
        assert progress.calls and progress.calls[-1][0].done_bytes == progress.calls[-1][0].total_bytes
        finished = Recorder(engine.finished)
        engine.submit([Message("user", "hello")], AppSettings(max_tokens=8, thinking=False, temperature=0.0))
        qtbot.waitUntil(lambda: bool(finished.calls), timeout=120_000)
        assert finished.calls[0][1].completion_tokens >= 1
    finally:
        engine.close()
        loader.shutdown()
