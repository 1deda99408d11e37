"""engine.gguf.streaming_read: exact chunk coverage, caller-owned ring buffers, and a file read under a memory limit."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from engine.errors import ModelFileError
from engine.generation.chat_template import FALLBACK_TEMPLATE_PATH
from engine.fixtures.demo_model import DEMO_CONFIG, demo_vocab, ensure_demo_model
from engine.gguf.streaming_read import StreamingReader, cached_fraction, load_eta, tensor_table
from engine.fixtures.synthetic import write_random_model

MIB = 1 << 20


def tensor_digest(path) -> str:
    """sha256 over every tensor's bytes in file order, read with plain seeks (independent of the reader)."""
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for t in tensor_table(path):
            fh.seek(t.offset)
            digest.update(fh.read(t.n_bytes))
    return digest.hexdigest()


def test_chunks_cover_every_tensor_in_file_order_with_progress():
    path = ensure_demo_model()
    reader = StreamingReader(path, chunk_bytes=64 * 1024, slots=3)
    pieces: dict[str, bytearray] = {}
    last_done, order = 0, []
    for chunk in reader.chunks():
        assert 0 < len(chunk.data) <= 64 * 1024
        assert chunk.offset == len(pieces.setdefault(chunk.tensor.name, bytearray()))
        pieces[chunk.tensor.name] += chunk.data
        if chunk.last:
            order.append(chunk.tensor.name)
        assert chunk.progress.done_bytes == last_done + len(chunk.data)
        last_done = chunk.progress.done_bytes
    tensors = tensor_table(path)
    assert order == [t.name for t in tensors]
    assert last_done == reader.total_bytes() == sum(t.n_bytes for t in tensors)
    assert chunk.progress.eta_s == 0 and chunk.progress.bytes_per_s > 0
    with open(path, "rb") as fh:
        for t in tensors:
            fh.seek(t.offset)
            assert bytes(pieces[t.name]) == fh.read(t.n_bytes), t.name


def test_caller_buffers_are_filled_in_place_and_a_name_filter_reads_only_those():
    path = ensure_demo_model()
    ring = [np.zeros(4096, dtype=np.uint8), np.zeros(8192, dtype=np.uint8)]  # stand-ins for pinned arrays
    reader = StreamingReader(path, buffers=ring)
    assert reader.chunk_bytes == 4096
    names = ["token_embd.weight", "output_norm.weight"]
    seen = set()
    for i, chunk in enumerate(reader.chunks(names)):
        slot = ring[i % 2]
        assert np.shares_memory(np.frombuffer(chunk.data, dtype=np.uint8), slot)
        seen.add(chunk.tensor.name)
    assert seen == set(names)
    with pytest.raises(ModelFileError, match="no tensor named nope"):
        next(reader.chunks(["nope"]))


def test_a_file_truncated_while_loading_is_a_clear_error(tmp_path):
    copy = tmp_path / "model.gguf"
    shutil.copy(ensure_demo_model(), copy)
    reader = StreamingReader(copy, chunk_bytes=MIB)
    os.truncate(copy, os.path.getsize(copy) - 1000)
    with pytest.raises(ModelFileError, match="truncated while loading"):
        for _ in reader.chunks():
            pass


def test_load_eta_is_set_by_the_slower_stage():
    # 10 GB from a 500 MB/s disk to 3 cards over 250 MB/s links: the busiest card (4 GB) takes 16 s > 20 s disk
    assert load_eta(10_000, [3_000, 4_000, 3_000], disk_bytes_per_s=500, link_bytes_per_s=250) == 20
    assert load_eta(10_000, [3_000, 4_000, 3_000], disk_bytes_per_s=2_000, link_bytes_per_s=250) == 16
    with pytest.raises(ValueError):
        load_eta(1, [1], 0, 1)


# The child opens the reader (the header is parsed through a short-lived map of the file), then caps its
# address space at what it already uses plus 96 MiB, far below the file, and streams every tensor.
# A control read of the whole file under the same cap must fail, or the cap proves nothing.
CHILD = """
import hashlib, json, resource, sys
from pathlib import Path
from engine.gguf.streaming_read import StreamingReader
path, drop = sys.argv[1], sys.argv[2] == "drop"
reader = StreamingReader(path, chunk_bytes=8 << 20, slots=2, drop_cache=drop)
vm = next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("VmSize:"))
cap = vm * 1024 + (96 << 20)
resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
digest = hashlib.sha256()
for chunk in reader.chunks():
    digest.update(chunk.data)
try:
    Path(path).read_bytes()
    control = "whole file read"
except MemoryError:
    control = "MemoryError"
print(json.dumps({"sha256": digest.hexdigest(), "control": control, "mb_per_s": chunk.progress.bytes_per_s / 1e6}))
"""


@pytest.fixture(scope="module")
def big_model(tmp_path_factory):
    """A ~300 MB random Q8_0 model, synced so that its pages are clean (droppable) in the page cache."""
    cfg = dataclasses.replace(DEMO_CONFIG, d_model=1024, d_ff=12288)
    path = write_random_model(tmp_path_factory.mktemp("big") / "big.gguf", cfg, "q8_0",
                              vocab=demo_vocab(FALLBACK_TEMPLATE_PATH.read_text(encoding="utf-8")))
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return path


def run_child(path, mode: str) -> dict:
    result = subprocess.run([sys.executable, "-c", CHILD, str(path), mode], capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="RLIMIT_AS, /proc and mincore are Linux's")
def test_a_file_larger_than_the_memory_cap_streams_and_leaves_the_page_cache_empty(big_model):
    assert os.path.getsize(big_model) > 250 * MIB
    expected = tensor_digest(big_model)
    report = run_child(big_model, "drop")
    assert report["control"] == "MemoryError"
    assert report["sha256"] == expected
    after = cached_fraction(big_model)
    assert after is not None and after < 0.1, after
    # Control for the cache claim: the same read without DONTNEED leaves the file cached.
    report = run_child(big_model, "keep")
    assert report["sha256"] == expected
    assert cached_fraction(big_model) > 0.8
