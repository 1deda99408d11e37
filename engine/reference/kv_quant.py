"""KV cache codecs in numpy: encode/decode of head vectors, and the storage domain attention works in.

One codec per cache side (K or V), chosen by `engine.model.kv_formats` (`KVFormat.k` / `.v`):

* exact   (`fp16` in kv_formats) the reference keeps fp32 rows, as it always has (the GPU keeps fp16);
* int8    blocks of 32 values: codes q = rint(x / d) in [-127, 127] with d = fp16(max|x| / 127),
          the division by the fp16-rounded scale (so the stored pair reproduces x to d/2);
* wht4 / wht3  blocks of 128 values (a head narrower than 128, or a tail, is zero-padded to 128):
          y = R x with R = H·diag(s)/√128 (H the Sylvester Hadamard matrix, s the fixed random signs of
          `sign_vector()`), n = ‖y‖ (= ‖x‖), codes = Lloyd-Max quantisation of y/n with the codebook of
          kv_quant_codebook, stored with fp16(n). No norm re-correction: the Lloyd centroid condition
          already makes c[code] the conditional mean of the coordinate, so <q, n·c> is an unbiased
          estimate of <q, y> given the codes (anchor-qengine.md §2.7, lesson 13).

The bytes are exactly what the CUDA kernels store (cuda_src/kv_cache.cuh), per head vector:
codes  int8: `width` bytes; wht4: 64 bytes a block, value i of a block in byte i/2 (low nibble for even
       i); wht3: 48 bytes a block as three 16-byte bit planes, bit b of code i at plane b, byte i/8,
       bit i%8 (so 8 consecutive values are one byte of each plane);
side   fp16, one per block (int8 scale d, or wht block norm n).

Attention in the storage domain (the rotated-domain trick, contracts.md "KV cache formats"): R is
orthogonal, so q·x = (Rq)·(Rx): rotate q once (`to_domain`), score it against the stored centroids
times norms (`domain_values`), accumulate V's domain values and un-rotate the output once
(`from_domain`). For exact and int8 codecs the domain is the head vector itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.model.kv_formats import FP16, INT8, WHT3, WHT4, KVCodec
from engine.reference.kv_quant_codebook import BLOCK_DIM, CODEBOOK_3BIT, CODEBOOK_4BIT

SIGN_SEED = 0xCAFEF00D  # xorshift32 seed of the rotation signs (the anchor's; any fixed value would do)
INV_SQRT_BLOCK = np.float32(1.0 / np.sqrt(BLOCK_DIM))
INT8_BLOCK = 32


def sign_vector(seed: int = SIGN_SEED, n: int = BLOCK_DIM) -> np.ndarray:
    """±1 (float32) for each of the n coordinates: bit 31 of successive xorshift32 states (13, 17, 5).

    Written out instead of using a numpy generator so the sequence can never change with numpy.
    """
    state = seed & 0xFFFFFFFF
    out = np.empty(n, np.float32)
    for i in range(n):
        state ^= (state << 13) & 0xFFFFFFFF
        state ^= state >> 17
        state ^= (state << 5) & 0xFFFFFFFF
        out[i] = -1.0 if state >> 31 else 1.0
    return out


SIGNS = sign_vector()


def _fwht(x: np.ndarray) -> np.ndarray:
    """Unnormalised Walsh-Hadamard transform over the last axis (length 128), fp32, butterflies h = 1..64.

    The same additions in the same order as the kernels' shared-memory butterflies, so both round alike.
    """
    shape = x.shape
    y = np.ascontiguousarray(x, np.float32)
    h = 1
    while h < BLOCK_DIM:
        y = y.reshape(*shape[:-1], BLOCK_DIM // (2 * h), 2, h)
        a, b = y[..., 0, :], y[..., 1, :]
        y = np.stack([a + b, a - b], axis=-2)
        h *= 2
    return y.reshape(shape)


def _blocks(x: np.ndarray, block: int) -> np.ndarray:
    """x [..., width] zero-padded to whole blocks and reshaped [..., n_blocks, block] (fp32)."""
    width = x.shape[-1]
    padded = -(-width // block) * block
    x = np.asarray(x, np.float32)
    if padded != width:
        x = np.concatenate([x, np.zeros((*x.shape[:-1], padded - width), np.float32)], axis=-1)
    return x.reshape(*x.shape[:-1], padded // block, block)


def rotate(x: np.ndarray) -> np.ndarray:
    """R x per 128-block (x [..., width], zero-padded to whole blocks) → [..., n_blocks*128] fp32."""
    b = _blocks(x, BLOCK_DIM)
    y = _fwht(b * SIGNS) * INV_SQRT_BLOCK
    return y.reshape(*y.shape[:-2], -1)


def unrotate(y: np.ndarray, width: int) -> np.ndarray:
    """Rᵀ y per 128-block (y [..., n_blocks*128]) → the first `width` values, fp32."""
    b = y.reshape(*y.shape[:-1], -1, BLOCK_DIM).astype(np.float32)
    x = (_fwht(b) * INV_SQRT_BLOCK) * SIGNS
    return x.reshape(*x.shape[:-2], -1)[..., :width]


@dataclass(frozen=True)
class Encoded:
    """Stored rows of one cache side: `codes` [..., code_bytes] and `side` fp16 [..., n_blocks]."""

    codes: np.ndarray
    side: np.ndarray


class Codec:
    """One cache side's storage: encode/decode and the domain attention works in (see the module doc)."""

    def __init__(self, spec: KVCodec, width: int):
        self.spec, self.width = spec, width

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def exact(self) -> bool:
        return False

    @property
    def domain_width(self) -> int:
        return self.width

    def encode(self, x: np.ndarray) -> Encoded:
        raise NotImplementedError

    def domain_values(self, enc: Encoded) -> np.ndarray:
        """The stored values in the attention domain, fp32 [..., domain_width]."""
        raise NotImplementedError

    def to_domain(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(x, np.float32)

    def from_domain(self, y: np.ndarray) -> np.ndarray:
        return np.asarray(y, np.float32)

    def decode(self, enc: Encoded) -> np.ndarray:
        """Head vectors [..., width] as the cache holds them."""
        return self.from_domain(self.domain_values(enc))


class ExactCodec(Codec):
    """fp32 rows, unchanged (the reference's `fp16` side: see the module doc)."""

    @property
    def exact(self) -> bool:
        return True

    def encode(self, x: np.ndarray) -> Encoded:
        x = np.asarray(x, np.float32)
        return Encoded(x.copy(), np.zeros((*x.shape[:-1], 0), np.float16))

    def domain_values(self, enc: Encoded) -> np.ndarray:
        return enc.codes


class Int8Codec(Codec):
    """Per-32 symmetric int8 with an fp16 scale (ggml Q8_0's numbers, stored as two planes)."""

    def encode(self, x: np.ndarray) -> Encoded:
        b = _blocks(x, INT8_BLOCK)
        amax = np.max(np.abs(b), axis=-1, keepdims=True)
        d16 = (amax / np.float32(127.0)).astype(np.float16)
        d = d16.astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            q = np.where(d > 0, np.rint(b / np.where(d > 0, d, np.float32(1.0))), 0.0)
        q = np.clip(q, -127, 127).astype(np.int8)
        return Encoded(q.reshape(*q.shape[:-2], -1), d16[..., 0])

    def domain_values(self, enc: Encoded) -> np.ndarray:
        q = enc.codes.reshape(*enc.codes.shape[:-1], -1, INT8_BLOCK).astype(np.float32)
        v = q * enc.side.astype(np.float32)[..., None]
        return v.reshape(*v.shape[:-2], -1)[..., : self.width]


class RotatedCodec(Codec):
    """Random-sign Walsh-Hadamard rotation + Lloyd-Max codes + one fp16 norm per 128-block."""

    def __init__(self, spec: KVCodec, width: int, codebook: np.ndarray):
        super().__init__(spec, width)
        self.codebook = codebook.astype(np.float32)
        self.boundaries = (np.float32(0.5) * (self.codebook[:-1] + self.codebook[1:])).astype(np.float32)
        self.bits = spec.bits

    @property
    def domain_width(self) -> int:
        return -(-self.width // BLOCK_DIM) * BLOCK_DIM

    def to_domain(self, x: np.ndarray) -> np.ndarray:
        return rotate(x)

    def from_domain(self, y: np.ndarray) -> np.ndarray:
        return unrotate(y, self.width)

    def quantise(self, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(codes uint8 [..., nb, 128], norms fp32 [..., nb]) of rotated blocks y [..., nb, 128]."""
        norm = np.sqrt(np.sum(y * y, axis=-1, dtype=np.float32)).astype(np.float32)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.where(norm[..., None] > 0, y / np.where(norm > 0, norm, np.float32(1.0))[..., None], 0.0)
        codes = np.searchsorted(self.boundaries, u.astype(np.float32), side="left").astype(np.uint8)
        return codes, norm

    def encode(self, x: np.ndarray) -> Encoded:
        y = rotate(x)
        y = y.reshape(*y.shape[:-1], -1, BLOCK_DIM)
        codes, norm = self.quantise(y)
        return Encoded(self.pack(codes), norm.astype(np.float16))

    def pack(self, codes: np.ndarray) -> np.ndarray:
        """uint8 codes [..., nb, 128] → packed bytes [..., nb * 16 * bits] (layout in the module doc)."""
        if self.bits == 4:
            packed = codes[..., 0::2] | (codes[..., 1::2] << 4)
        else:
            bits = (codes[..., None, :] >> np.arange(3, dtype=np.uint8)[:, None]) & 1  # [..., nb, 3, 128]
            packed = np.packbits(bits.reshape(*bits.shape[:-1], 16, 8), axis=-1, bitorder="little")[..., 0]
        return packed.reshape(*codes.shape[:-2], -1).astype(np.uint8)

    def unpack(self, packed: np.ndarray) -> np.ndarray:
        """Packed bytes [..., nb * 16 * bits] → codes [..., nb, 128]."""
        p = packed.reshape(*packed.shape[:-1], -1, 16 * self.bits)
        if self.bits == 4:
            return np.stack([p & 0xF, p >> 4], axis=-1).reshape(*p.shape[:-1], BLOCK_DIM)
        planes = p.reshape(*p.shape[:-1], 3, 16)
        bits = np.unpackbits(planes[..., None], axis=-1, bitorder="little").reshape(*p.shape[:-1], 3, BLOCK_DIM)
        return (bits[..., 0, :] | (bits[..., 1, :] << 1) | (bits[..., 2, :] << 2)).astype(np.uint8)

    def domain_values(self, enc: Encoded) -> np.ndarray:
        c = self.codebook[self.unpack(enc.codes)] * enc.side.astype(np.float32)[..., None]
        return c.reshape(*c.shape[:-2], -1)


def codec_for(spec: KVCodec, width: int) -> Codec:
    """The reference codec implementing `spec` for head vectors of `width` values."""
    if spec == FP16:
        return ExactCodec(spec, width)
    if spec == INT8:
        return Int8Codec(spec, width)
    if spec == WHT4:
        return RotatedCodec(spec, width, CODEBOOK_4BIT)
    if spec == WHT3:
        return RotatedCodec(spec, width, CODEBOOK_3BIT)
    raise ValueError(f"no reference codec for KV codec {spec.name}")


def device_tables() -> np.ndarray:
    """The constants the CUDA kernels read (one float32 array, uploaded once per card; cuda_src/kv_cache.cuh):
    [0, 128) signs, [128, 144) 4-bit codebook, [144, 159) its boundaries, [159, 167) 3-bit codebook,
    [167, 174) its boundaries."""
    parts = [SIGNS]
    for book in (CODEBOOK_4BIT, CODEBOOK_3BIT):
        c = book.astype(np.float32)
        parts += [c, (np.float32(0.5) * (c[:-1] + c[1:])).astype(np.float32)]
    return np.concatenate(parts).astype(np.float32)
