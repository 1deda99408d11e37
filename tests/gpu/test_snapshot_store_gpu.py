"""Saved conversation states on the CUDA backend: a state saved to disk and restored into a new
backend (as after a restart) continues exactly like the backend that never stopped, in every KV
format; and the restore-versus-re-prefill time of a long chat (printed with -s, for the notes)."""

from __future__ import annotations

import os
import time

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.model.kv_formats import CUDA_KERNEL_FORMATS
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.generation.snapshot_store import SnapshotStore
from engine.generation.snapshot_store_format import SnapshotIdentity
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model

WANT_LOGITS = SlotRequest(SamplingParams(temperature=0.0), (), host_logits=True)


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def _tokens(vocab: int, n: int, seed: int) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


def _logits_after(gpu: CudaBackend, parts: list[list[int]]) -> np.ndarray:
    gpu.reset_slot(0)
    for part in parts:
        gpu.prefill_slot(0, part)
    return gpu.begin(0, WANT_LOGITS).logits


@pytest.mark.parametrize("kv", CUDA_KERNEL_FORMATS)
def test_a_state_saved_to_disk_restores_exactly_in_a_new_backend(demo, tmp_path, kv):
    first, second = _tokens(demo.config.vocab_size, 300, 1), _tokens(demo.config.vocab_size, 7, 2)
    identity = SnapshotIdentity("demo", kv, "t")
    gpu = CudaBackend(demo, context=512, chunk=64, slots=1, kv=kv)
    try:
        want = _logits_after(gpu, [first, second])
        gpu.reset_slot(0)
        gpu.prefill_slot(0, first)
        assert SnapshotStore(tmp_path, identity, demo.config, 1 << 30).save(first, gpu.snapshot_slot(0))
    finally:
        gpu.close()
    fresh = CudaBackend(demo, context=512, chunk=64, slots=2, kv=kv)
    try:
        n, snap = SnapshotStore(tmp_path, identity, demo.config, 1 << 30).longest_prefix(first + second)
        assert n == len(first)
        fresh.restore_slot(1, snap)
        fresh.prefill_slot(1, second)
        got = fresh.begin(1, WANT_LOGITS).logits
    finally:
        fresh.close()
    assert np.array_equal(got, want)


def test_restore_time_versus_re_prefill_of_a_long_chat(demo, tmp_path):
    """Not a pass/fail number: prints the times for the notes (run with -s). RIGLLM_SNAPSHOT_BENCH_MODEL
    names a real GGUF to time instead of the demo model (e.g. a 9B on the H200, 32K tokens)."""
    bench_path = os.environ.get("RIGLLM_SNAPSHOT_BENCH_MODEL")
    model = load_model(bench_path) if bench_path else demo
    context = min(model.config.context_length, 32768)
    n = context - 64
    chat = _tokens(model.config.vocab_size, n, 3)
    identity = SnapshotIdentity(model.path.stem, "k8v3", "t")
    store = SnapshotStore(tmp_path, identity, model.config, 1 << 36)
    gpu = CudaBackend(model, context=context, slots=1, kv="k8v3")
    try:
        start = time.perf_counter()
        gpu.reset_slot(0)
        gpu.prefill_slot(0, chat)
        gpu.begin(0, WANT_LOGITS)
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        snap = gpu.snapshot_slot(0)
        store.save(chat, snap)
        save = time.perf_counter() - start
        start = time.perf_counter()
        _, loaded = SnapshotStore(tmp_path, identity, model.config, 1 << 36).longest_prefix(chat + [1])
        gpu.restore_slot(0, loaded)
        restore = time.perf_counter() - start
    finally:
        gpu.close()
    size = store.disk_bytes
    print(f"\n[snapshot] {n} tokens k8v3 {model.path.name}: prefill {prefill:.3f}s, snapshot+save {save:.3f}s "
          f"({size / 2**20:.1f} MiB), load+restore {restore:.3f}s")
    assert loaded is not None
