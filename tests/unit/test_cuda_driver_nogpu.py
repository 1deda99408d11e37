"""Without pycuda the CUDA package still imports, and using a card fails with one clear line."""

from __future__ import annotations

import importlib.util

import pytest

from engine.errors import RigllmError

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pycuda") is not None, reason="pycuda is installed here: tests/gpu covers the driver"
)


def test_missing_pycuda_is_reported_not_raised_at_import():
    from engine.cuda import driver

    reason = driver.gpu_unavailable_reason()
    assert reason is not None and "pycuda" in reason and "rigllm[gpu]" in reason


def test_opening_a_card_without_pycuda_raises_a_user_error():
    from engine.cuda.driver import CudaCard, CudaError

    with pytest.raises(CudaError, match="pycuda is not installed") as info:
        CudaCard(0)
    assert isinstance(info.value, RigllmError)
