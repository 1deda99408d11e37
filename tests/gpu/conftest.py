"""tests/gpu runs on a machine with an NVIDIA GPU and pycuda; anywhere else every test here is skipped.

Kernels come from the usual lookup (engine.cuda.kernel_build): on a GPU machine without NVRTC 12.x
set RIGLLM_KERNEL_DIR to the folder `rigllm build-kernels --out DIR` wrote. One `CudaCard` (one CUDA
context, owned by pytest's main thread) serves the whole session; its kernels load on first use.

RIGLLM_EMULATED_CARD=1 runs them on the emulated card instead (tests/emu/README.md): the same kernels on the
CPU, for machines without a GPU. It cannot stand for the driver itself (test_driver.py skips there) nor for
timings (its events read 1 ms).
"""

from __future__ import annotations

import zlib
from collections.abc import Iterator

import numpy as np
import pytest

from tests.emu.card import install, requested

if requested():
    install()

from engine.cuda.driver import CudaCard, gpu_unavailable_reason  # noqa: E402  (after the emulated card's install)


@pytest.fixture(scope="session", autouse=True)
def _require_gpu() -> None:
    reason = gpu_unavailable_reason()
    if reason is not None:
        pytest.skip(f"GPU tests need pycuda and a CUDA GPU: {reason}")


@pytest.fixture(scope="session")
def card(_require_gpu: None) -> Iterator[CudaCard]:
    with CudaCard(0, name="test-card") as session_card:
        yield session_card


@pytest.fixture
def rng(request: pytest.FixtureRequest) -> np.random.Generator:
    """Random data generated per test, seeded from the test's id so a failure reproduces exactly."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
