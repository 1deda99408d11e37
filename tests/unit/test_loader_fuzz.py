"""Fuzzing: random truncations, bit flips and overwrites of a valid model never escape as anything
but a ModelFileError, never hang and never allocate much (fixed seeds, a few hundred cases).

Most mutations land in the header (keys, vocabulary, tensor infos), where a corrupt count or offset
could otherwise make a reader loop or allocate without bound; the rest land anywhere, including
tensor data, where the value checks (NaN, ssm_a sign) catch what matters.
"""

from __future__ import annotations

import time
import tracemalloc

import numpy as np
import pytest

from engine.errors import ModelFileError
from engine.gguf.loader import load_model
from engine.gguf.model_file import ModelFile
from tests.unit.loader_fixtures import write_tiny_model

SEED = 20261129
CASES = {"truncate": 80, "flip": 160, "overwrite": 100}
MAX_SECONDS_PER_CASE = 2.0
MAX_PEAK_BYTES = 64 << 20


def mutations(data: bytes, header_end: int, rng: np.random.Generator):
    """(description, mutated bytes) pairs, deterministic for the seed."""
    size = len(data)

    def position() -> int:
        return int(rng.integers(0, header_end if rng.random() < 0.75 else size))

    for _ in range(CASES["truncate"]):
        keep = position()
        yield f"truncate to {keep}", data[:keep]
    for _ in range(CASES["flip"]):
        out = bytearray(data)
        flips = []
        for _ in range(int(rng.integers(1, 4))):
            at, bit = position(), int(rng.integers(0, 8))
            out[at] ^= 1 << bit
            flips.append((at, bit))
        yield f"flip bits {flips}", bytes(out)
    for _ in range(CASES["overwrite"]):
        out = bytearray(data)
        at = position()
        patch = bytes(rng.choice([b"\xff" * 8, b"\x00" * 8, rng.bytes(8), (1 << 62).to_bytes(8, "little")]))
        out[at : at + 8] = patch[: max(0, min(8, size - at))]
        yield f"overwrite {patch.hex()} at {at}", bytes(out)


@pytest.mark.timeout(120)
def test_mutated_files_only_raise_model_file_errors(tmp_path):
    valid = write_tiny_model(tmp_path / "valid.gguf")
    data = valid.read_bytes()
    header_end = min(info.offset for info in ModelFile(valid).tensors.values())
    path = tmp_path / "mutated.gguf"
    outcomes = {"loaded": 0, "refused": 0}
    failures: list[str] = []

    tracemalloc.start()
    try:
        for description, mutated in mutations(data, header_end, np.random.default_rng(SEED)):
            path.unlink(missing_ok=True)  # a fresh inode: no earlier mapping ever sees these bytes
            path.write_bytes(mutated)
            tracemalloc.reset_peak()
            start = time.perf_counter()
            try:
                load_model(path)
                outcomes["loaded"] += 1
            except ModelFileError as err:
                outcomes["refused"] += 1
                if "\n" in str(err):
                    failures.append(f"{description}: multi-line message {str(err)!r}")
            except Exception as err:  # noqa: BLE001 - exactly what this test hunts for
                failures.append(f"{description}: {type(err).__name__}: {err}")
            elapsed = time.perf_counter() - start
            peak = tracemalloc.get_traced_memory()[1]
            if elapsed > MAX_SECONDS_PER_CASE:
                failures.append(f"{description}: took {elapsed:.1f} s")
            if peak > MAX_PEAK_BYTES:
                failures.append(f"{description}: allocated {peak >> 20} MiB")
    finally:
        tracemalloc.stop()

    assert not failures, "\n".join(failures[:20])
    assert outcomes["refused"] > sum(CASES.values()) // 2  # the mutations really break files
    assert outcomes["loaded"] > 0  # and some land in tensor data, which is only value-checked
