"""The KV cache storage formats (contracts.md "KV cache formats"): exact bytes per head vector.

Each format fixes, per cache side (K and V), how a head vector of `Dh` values is stored:

* `fp16`     16 bits per value, no side data.
* `int8`     blocks of 32 values: 32 int8 codes + one fp16 scale (34 bytes, 8.5 bits per value; the
             same layout as ggml's Q8_0).
* `wht4`, `wht3`  blocks of 128 values, each rotated by a fixed Walsh-Hadamard transform and coded
             with a 16- or 8-entry Lloyd-Max codebook: 128 packed 4- or 3-bit codes + one fp16 block
             norm (66 / 50 bytes, 4.125 / 3.125 bits per value). A 256-wide head is two blocks.

A head vector whose width is not a multiple of the block is stored in whole blocks, the last one
zero-padded (only tiny test models hit this). These sizes are the contract the memory planner and
the cache allocator share; `KV_FORMATS_VERSION` changes whenever a layout does (byte order inside a
block, the rotation's sign seed, the codebook values). The numbers and the exact bytes are defined by
the numpy codecs in engine/reference/kv_quant.py (sign seed, packing) and kv_quant_codebook.py
(Lloyd-Max codebooks, with the code that derives them); cuda_src/kv_cache.cuh stores the same bytes.

A format is a K codec and a V codec chosen separately (keys are more sensitive: 3-bit MSE-coded keys
bias small-margin logits, anchor-qengine.md lesson 13). The table below names the combinations we
recommend; `kv_format("k<bits>v<bits>")` accepts any pair of 16, 8, 4 and 3.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from engine.errors import RigllmError
from engine.gguf.config import ModelConfig

KV_FORMATS_VERSION = 1


@dataclass(frozen=True)
class KVCodec:
    """How one side (K or V) of one head vector is stored: `bits` per value in blocks with side bytes."""

    name: str
    bits: int
    block: int  # values per block
    side_bytes: int  # per-block scale / norm bytes (fp16)
    rotated: bool  # Walsh-Hadamard rotated before coding

    @property
    def block_bytes(self) -> int:
        return self.block * self.bits // 8 + self.side_bytes

    def vector_bytes(self, width: int) -> int:
        """Bytes of one head vector of `width` values (whole blocks, the last zero-padded)."""
        return -(-width // self.block) * self.block_bytes


FP16 = KVCodec("fp16", bits=16, block=1, side_bytes=0, rotated=False)
INT8 = KVCodec("int8", bits=8, block=32, side_bytes=2, rotated=False)
WHT4 = KVCodec("wht4", bits=4, block=128, side_bytes=2, rotated=True)
WHT3 = KVCodec("wht3", bits=3, block=128, side_bytes=2, rotated=True)


@dataclass(frozen=True)
class KVFormat:
    """A named K/V pair of codecs, the unit a user picks (`--kv k8v3`)."""

    name: str
    k: KVCodec
    v: KVCodec
    description: str

    def bytes_per_token(self, cfg: ModelConfig, with_mtp: bool = False) -> int:
        """KV bytes one token adds across all attention layers (and the MTP block's, when enabled)."""
        n_layers = len(cfg.attention_layers) + (cfg.n_mtp if with_mtp else 0)
        per_head = self.k.vector_bytes(cfg.head_dim) + self.v.vector_bytes(cfg.head_dim)
        return n_layers * cfg.n_head_kv * per_head


KV_FORMATS: dict[str, KVFormat] = {
    f.name: f
    for f in (
        KVFormat("f16", FP16, FP16, "fp16 K and V (exact)"),
        KVFormat("k8v8", INT8, INT8, "8-bit K and V"),
        KVFormat("k8v4", INT8, WHT4, "8-bit K, 4-bit rotated V"),
        KVFormat("k8v3", INT8, WHT3, "8-bit K, 3-bit rotated V (default for long contexts)"),
        KVFormat("k4v4", WHT4, WHT4, "4-bit rotated K and V"),
        KVFormat("k3v3", WHT3, WHT3, "3-bit rotated K and V (smallest)"),
    )
}
DEFAULT_LONG_CONTEXT_FORMAT = "k8v3"
# Formats the CUDA backend has attention kernels for (f16: cuda_src/attention.cu; the rest: kv_cache.cu).
CUDA_KERNEL_FORMATS = ("f16", "k8v8", "k8v4", "k8v3", "k4v4", "k3v3")


CODECS_BY_BITS: dict[int, KVCodec] = {16: FP16, 8: INT8, 4: WHT4, 3: WHT3}
_PAIR = re.compile(r"k(\d+)v(\d+)")


def kv_format_for_bits(k_bits: int, v_bits: int) -> KVFormat:
    """The format storing K in `k_bits` and V in `v_bits` (each 16, 8, 4 or 3); a table entry when there is one."""
    for bits in (k_bits, v_bits):
        if bits not in CODECS_BY_BITS:
            raise RigllmError(f"KV bits must be one of {', '.join(map(str, CODECS_BY_BITS))}, not {bits}")
    k, v = CODECS_BY_BITS[k_bits], CODECS_BY_BITS[v_bits]
    for fmt in KV_FORMATS.values():
        if (fmt.k, fmt.v) == (k, v):
            return fmt
    return KVFormat(f"k{k_bits}v{v_bits}", k, v, f"{k.name} K, {v.name} V")


def kv_format(name: str) -> KVFormat:
    """Look a format up by name (a table entry, or any `k<bits>v<bits>`); a user error names the choices."""
    if name in KV_FORMATS:
        return KV_FORMATS[name]
    pair = _PAIR.fullmatch(name)
    if pair and int(pair[1]) in CODECS_BY_BITS and int(pair[2]) in CODECS_BY_BITS:
        return kv_format_for_bits(int(pair[1]), int(pair[2]))
    raise RigllmError(
        f"unknown KV format '{name}' (choose one of {', '.join(KV_FORMATS)}, or k<bits>v<bits> with bits 16, 8, 4, 3)"
    )


def kv_format_of(spec: "str | KVFormat | None") -> KVFormat:
    """A format from a name, a KVFormat, or None (= f16): what constructors taking a format accept."""
    if spec is None:
        return KV_FORMATS["f16"]
    return spec if isinstance(spec, KVFormat) else kv_format(spec)
