"""Host side of the device KV cache (engine/cuda/kv_cache.py), without a GPU.

Plane sizes must add up to the format table's bytes per head vector (so the planner's numbers are the
allocations), and reference-encoded rows must survive the trip into the [Hkv][capacity][...] planes and
back byte for byte (the GPU tests fill caches and read them back this way). A fake card stands in for
`CudaCard`: its buffers keep the uploaded bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.kv_cache import (
    alloc_kv_layer,
    code_row_bytes,
    domain_width,
    download_side_rows,
    side_blocks,
    upload_side_rows,
)
from engine.model.kv_formats import FP16, INT8, WHT3, WHT4, kv_format
from engine.reference.kv_quant import codec_for


class FakeBuffer:
    def __init__(self, nbytes: int, label: str):
        self.nbytes, self.label = nbytes, label
        self.data = np.zeros(nbytes, np.uint8)

    def upload(self, array: np.ndarray) -> None:
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        assert raw.size <= self.nbytes
        self.data[: raw.size] = raw

    def download(self, dtype, shape) -> np.ndarray:
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        return self.data[:n].view(dtype).reshape(shape).copy()


class FakeCard:
    def __init__(self):
        self.allocated: list[FakeBuffer] = []

    def alloc(self, nbytes: int, label: str) -> FakeBuffer:
        self.allocated.append(FakeBuffer(nbytes, label))
        return self.allocated[-1]


@pytest.mark.parametrize("codec", [FP16, INT8, WHT4, WHT3], ids=lambda c: c.name)
@pytest.mark.parametrize("head_dim", [32, 64, 256])
def test_planes_add_up_to_the_format_table(codec, head_dim):
    assert code_row_bytes(codec, head_dim) + 2 * side_blocks(codec, head_dim) == codec.vector_bytes(head_dim)
    assert domain_width(codec, head_dim) == (max(128, head_dim) if codec.rotated else head_dim)


@pytest.mark.parametrize("fmt_name", ["f16", "k8v8", "k8v3", "k4v4", "k3v3"])
def test_layer_allocation_matches_the_planner(fmt_name):
    fmt = kv_format(fmt_name)
    card = FakeCard()
    cache = alloc_kv_layer(card, fmt, 4, 256, 1000, "t")
    assert cache.nbytes == 1000 * 4 * (fmt.k.vector_bytes(256) + fmt.v.vector_bytes(256))
    assert (cache.k.side is None) == (fmt.k == FP16) and len(cache.buffers()) == len(card.allocated)


@pytest.mark.parametrize("codec", [FP16, INT8, WHT4, WHT3], ids=lambda c: c.name)
@pytest.mark.parametrize("head_dim", [32, 256])
def test_rows_round_trip_through_the_planes(codec, head_dim):
    n_head_kv, capacity, rows = 3, 11, 7
    fmt = kv_format({FP16: "f16", INT8: "k8v8", WHT4: "k4v4", WHT3: "k3v3"}[codec])
    cache = alloc_kv_layer(FakeCard(), fmt, n_head_kv, head_dim, capacity, "t")
    x = np.random.default_rng(head_dim).standard_normal((rows, n_head_kv, head_dim)).astype(np.float16)
    enc = codec_for(codec, head_dim).encode(x.astype(np.float32))
    upload_side_rows(cache.k, head_dim, capacity, enc)
    back = download_side_rows(cache.k, n_head_kv, head_dim, capacity, rows)
    np.testing.assert_array_equal(back.side, enc.side)
    np.testing.assert_array_equal(back.codes, enc.codes)  # fp16: the fp16 values, widened
    # the plane is [Hkv][capacity][row bytes]: head 1, row 2 sits at (1 * capacity + 2) * row bytes
    start = (1 * capacity + 2) * code_row_bytes(codec, head_dim)
    stored = cache.k.codes.data[start : start + code_row_bytes(codec, head_dim)]
    want = enc.codes[2, 1].astype(np.float16) if codec == FP16 else enc.codes[2, 1]
    np.testing.assert_array_equal(stored, np.ascontiguousarray(want).view(np.uint8))
