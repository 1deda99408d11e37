"""KV codecs (engine/reference/kv_quant.py): rotation, encode/decode bounds, byte layout, format names.

Error bounds: int8 reproduces each value to half its block's scale (d = fp16(max|x|/127)), plus fp16
scale rounding; the rotated codecs' relative RMS error on Gaussian head vectors is the codebook's
distortion (√0.0345 ≈ 0.186 for 3 bits, √0.0095 ≈ 0.097 for 4 bits), held here to 0.20 and 0.105.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.errors import RigllmError
from engine.model.kv_formats import FP16, INT8, WHT3, WHT4, kv_format, kv_format_for_bits, kv_format_of
from engine.reference.kv_quant import (
    BLOCK_DIM,
    SIGNS,
    ExactCodec,
    RotatedCodec,
    codec_for,
    rotate,
    sign_vector,
    unrotate,
)

WIDTHS = [32, 64, 256]


def test_rotation_is_orthogonal_and_fixed():
    r = rotate(np.eye(BLOCK_DIM, dtype=np.float32))  # row i = R e_i, i.e. Rᵀ
    np.testing.assert_allclose(r @ r.T, np.eye(BLOCK_DIM), atol=2e-6)
    x = np.random.default_rng(1).standard_normal((3, 256)).astype(np.float32)
    np.testing.assert_allclose(unrotate(rotate(x), 256), x, atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(rotate(x), axis=-1), np.linalg.norm(x, axis=-1), rtol=1e-6)
    np.testing.assert_array_equal(sign_vector(), SIGNS)
    assert set(np.unique(SIGNS)) == {-1.0, 1.0} and abs(SIGNS.sum()) < 24  # balanced-ish random signs
    assert not np.array_equal(sign_vector(seed=1), SIGNS)


def test_rotation_spreads_an_outlier_channel():
    """Why the rotation is there: one huge channel becomes 128 equal-magnitude coordinates."""
    x = np.zeros(BLOCK_DIM, np.float32)
    x[7] = 100.0
    np.testing.assert_allclose(np.abs(rotate(x)), 100.0 / np.sqrt(BLOCK_DIM), rtol=1e-6)


@pytest.mark.parametrize("spec", [INT8, WHT4, WHT3], ids=lambda s: s.name)
@pytest.mark.parametrize("width", WIDTHS)
def test_stored_bytes_match_the_format_table(spec, width):
    codec = codec_for(spec, width)
    enc = codec.encode(np.ones((2, 3, width), np.float32))
    assert enc.codes.shape[:2] == enc.side.shape[:2] == (2, 3) and enc.side.dtype == np.float16
    assert enc.codes.shape[-1] * enc.codes.itemsize + 2 * enc.side.shape[-1] == spec.vector_bytes(width)


@pytest.mark.parametrize("width", WIDTHS)
def test_int8_error_is_half_a_step(width):
    rng = np.random.default_rng(width)
    x = (rng.standard_normal((50, width)) * 10.0 ** rng.uniform(-3, 3, (50, 1))).astype(np.float32)
    x[0, :5] = 0.0
    x[1] = 0.0  # an all-zero vector stays zero (scale 0)
    codec = codec_for(INT8, width)
    enc = codec.encode(x)
    step = np.repeat(enc.side.astype(np.float64), 32, axis=-1)[:, :width]
    err = np.abs(codec.decode(enc).astype(np.float64) - x)
    assert np.all(err <= 0.5 * step * (1 + 1e-6) + 1e-30)
    assert np.all(codec.decode(enc)[1] == 0.0) and np.abs(enc.codes).max() == 127


@pytest.mark.parametrize("spec, bound", [(WHT4, 0.105), (WHT3, 0.20)], ids=lambda v: getattr(v, "name", str(v)))
@pytest.mark.parametrize("width", WIDTHS)
def test_rotated_error_is_the_codebook_distortion(spec, bound, width):
    rng = np.random.default_rng(width)
    x = rng.standard_normal((400, width)).astype(np.float32)
    x[:, 3] *= 20.0  # an outlier channel (common in keys) is spread by the rotation
    codec = codec_for(spec, width)
    err = codec.decode(codec.encode(x)) - x
    rel = np.sqrt(np.sum(err**2) / np.sum(x**2))
    assert bound * 0.7 < rel < bound
    zero = codec.encode(np.zeros((1, width), np.float32))
    assert np.all(codec.decode(zero) == 0.0)


@pytest.mark.parametrize("spec", [WHT4, WHT3], ids=lambda s: s.name)
def test_packing_round_trips_and_places_codes(spec):
    codec = codec_for(spec, 256)
    assert isinstance(codec, RotatedCodec)
    codes = np.random.default_rng(3).integers(0, 1 << spec.bits, (5, 2, BLOCK_DIM)).astype(np.uint8)
    packed = codec.pack(codes)
    np.testing.assert_array_equal(codec.unpack(packed), codes)
    if spec.bits == 4:  # value i in byte i/2, low nibble for even i
        assert packed[0, 1] == codes[0, 0, 2] | (codes[0, 0, 3] << 4)
    else:  # bit b of code i at plane b (16 bytes each), byte i/8, bit i%8
        i, b = 77, 2
        assert (packed[0, b * 16 + i // 8] >> (i % 8)) & 1 == (codes[0, 0, i] >> b) & 1
        assert (packed[0, 48 + b * 16 + i // 8] >> (i % 8)) & 1 == (codes[0, 1, i] >> b) & 1


def test_domains():
    x = np.random.default_rng(4).standard_normal((2, 64)).astype(np.float32)
    exact = codec_for(FP16, 64)
    assert isinstance(exact, ExactCodec) and exact.domain_width == 64
    np.testing.assert_array_equal(exact.decode(exact.encode(x)), x)
    wht = codec_for(WHT3, 64)
    assert wht.domain_width == 128
    # scores in the rotated domain equal scores against the decoded vectors
    enc = wht.encode(x)
    q = np.random.default_rng(5).standard_normal(64).astype(np.float32)
    np.testing.assert_allclose(wht.domain_values(enc) @ wht.to_domain(q), wht.decode(enc) @ q, rtol=1e-5, atol=1e-5)


def test_format_names():
    assert kv_format("k16v16") is kv_format("f16") and kv_format_of(None).name == "f16"
    assert kv_format("k8v3") is kv_format_for_bits(8, 3)
    odd = kv_format("k16v3")
    assert (odd.name, odd.k, odd.v) == ("k16v3", FP16, WHT3)
    assert kv_format_of(odd) is odd and kv_format_of("k3v8").k == WHT3
    with pytest.raises(RigllmError, match="unknown KV format 'k5v3'"):
        kv_format("k5v3")
    with pytest.raises(RigllmError, match="KV bits must be one of 16, 8, 4, 3, not 2"):
        kv_format_for_bits(8, 2)
