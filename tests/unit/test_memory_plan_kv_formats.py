"""KV format table: exact storage per head vector and per token (contracts.md "KV cache formats")."""

from __future__ import annotations

import pytest

from engine.errors import RigllmError
from engine.model.kv_formats import (
    DEFAULT_LONG_CONTEXT_FORMAT,
    FP16,
    INT8,
    KV_FORMATS,
    KV_FORMATS_VERSION,
    WHT3,
    WHT4,
    kv_format,
)
from engine.gguf.shapes import shape_config


def test_codec_bytes_for_a_256_wide_head():
    assert FP16.vector_bytes(256) == 512
    assert INT8.vector_bytes(256) == 8 * (32 + 2)  # Q8_0-like: 8.5 bits a value
    assert WHT4.vector_bytes(256) == 2 * (64 + 2)  # two 128-value rotated blocks + fp16 norms
    assert WHT3.vector_bytes(256) == 2 * (48 + 2)


def test_partial_blocks_are_padded():
    assert WHT3.vector_bytes(32) == WHT3.block_bytes == 50
    assert INT8.vector_bytes(40) == 2 * 34


def test_table():
    assert list(KV_FORMATS) == ["f16", "k8v8", "k8v4", "k8v3", "k4v4", "k3v3"]
    assert KV_FORMATS_VERSION == 1 and DEFAULT_LONG_CONTEXT_FORMAT in KV_FORMATS
    assert (kv_format("k8v3").k, kv_format("k8v3").v) == (INT8, WHT3)
    with pytest.raises(RigllmError, match="unknown KV format 'q8'"):
        kv_format("q8")


@pytest.mark.parametrize("size, per_token", [("0.8b", 12288), ("9b", 32768), ("27b", 65536)])
def test_f16_bytes_per_token_match_spec(size, per_token):
    """Spec §7.3: n_attn_layers x 2 x Hkv x 256 x 2 bytes."""
    assert kv_format("f16").bytes_per_token(shape_config(size)) == per_token


def test_quantised_formats_for_27b():
    cfg = shape_config("27b")
    assert kv_format("f16").bytes_per_token(cfg, with_mtp=True) == 68 * 1024  # spec §7.3: +4 KiB for the MTP block
    # llama.cpp log, 131072 cells of q8_0 KV: 4352 MiB
    assert kv_format("k8v8").bytes_per_token(cfg) * 131072 == 4352 << 20
    # contracts.md: K8/V3 at 256K is about 6.3 GB
    assert kv_format("k8v3").bytes_per_token(cfg) * 262144 == pytest.approx(6.3e9, rel=0.02)
    sizes = [f.bytes_per_token(cfg) for f in KV_FORMATS.values()]
    assert sizes == sorted(sizes, reverse=True)  # the table goes from largest to smallest
