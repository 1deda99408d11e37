"""A sparse profile applied to the CUDA forward pass: which prefill chunks of which layers go sparse, and how.

The rule is the reference's (engine.reference.sparse_prefill), so both backends run the same attention:
a chunk of an attention layer is sparse when the profile names the layer, the chunk holds at least two
tokens (decode stays dense) and the sequence reaches the profile's minimum length with this chunk
(`pos + n >= min_length`, the reference's `cache.length`). Layers whose heads are all dense keep the
dense kernel (the same result, and faster). Per sparse chunk: the block index is built on the card
(engine.cuda.sparse_attention.build_index), the sparse flash kernel writes the split partials, and the
caller merges them with the output gate as for dense prefill.

KV formats: over the fp16 cache every pattern kind runs; over a quantised cache the flash kernel reads
the stored codes (cuda_src/sparse_kv.cu), but only dense and A-shape heads are served, because the
vertical-slash and block top-k index passes score fp16 keys. A profile with other kinds is refused
with a quantised format, naming the way out (an A-shape-only calibration, or --kv f16).
The index geometry (grids, strides) is sized on the host from the sequence's position, so a sparse
chunk must run eagerly, never inside a captured graph (decode graphs never reach it: one token is dense).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.cuda.attention_kernels import AttnDims, Partials, kernel_format
from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.kv_cache import KVLayerCache
from engine.cuda.sparse_attention import (
    BLOCK, KEYLESS_KINDS, KV_HEAD_DIMS, SparseGeometry, alloc_scratch, build_index, pattern_table, sparse_prefill_f16,
    sparse_prefill_kv,
)
from engine.errors import RigllmError
from engine.model.kv_formats import KVFormat
from engine.reference.sparse_attention import DENSE
from engine.sparse.profile import SparseProfile


@dataclass(frozen=True)
class _LayerPatterns:
    table: DeviceBuffer  # pattern_table on the card
    kinds: frozenset[str]


class SparsePrefill:
    """The profile's patterns uploaded for the layers of one card, and the index scratch they share."""

    def __init__(self, card: CudaCard, profile: SparseProfile, dims: AttnDims, layers: list[int], max_tokens: int,
                 capacity: int, kv: KVFormat):
        """`layers`: this card's attention layers; `max_tokens`: the prefill chunk; `capacity`: the sequences'
        context (one scratch serves every slot: chunks run one at a time on a card)."""
        if profile.block != BLOCK:
            raise RigllmError(f"the sparse profile uses {profile.block}-token blocks; the GPU kernels need {BLOCK}: "
                              f"run `rigllm calibrate-sparse MODEL --block {BLOCK}`")
        quantised = kv.name != "f16"
        if quantised:
            kernel_format(kv)  # a format without kernels is refused by name
            if dims.head_dim not in KV_HEAD_DIMS:
                raise RigllmError(f"sparse prefill over a quantised KV cache has kernels for head_dim {KV_HEAD_DIMS}, "
                                  f"not {dims.head_dim}: use --kv f16 with the sparse profile")
        self.card, self.dims, self.min_length = card, dims, profile.min_length
        self.layers: dict[int, _LayerPatterns] = {}
        for layer in layers:
            patterns = profile.patterns(layer)
            if patterns is None or all(p == DENSE for p in patterns):
                continue
            if len(patterns) != dims.n_head:
                raise RigllmError(f"the sparse profile has {len(patterns)} heads at layer {layer}, the model "
                                  f"{dims.n_head}: it was made for another model")
            kinds = frozenset(p.kind for p in patterns)
            if quantised and not kinds <= KEYLESS_KINDS:
                raise RigllmError(
                    f"with KV format {kv.name}, sparse prefill serves A-shape and dense heads only (layer {layer} has "
                    f"{', '.join(sorted(kinds - KEYLESS_KINDS))}, whose index scores fp16 keys): calibrate with "
                    "`rigllm calibrate-sparse MODEL --block 64 --kinds a_shape`, or use --kv f16")
            self.layers[layer] = _LayerPatterns(card.upload(pattern_table(patterns), f"sparse.patterns{layer}"), kinds)
        self.scratch = alloc_scratch(card, dims, max_tokens, capacity) if self.layers else None

    def applies(self, layer: int | None, pos: int, n_tokens: int) -> bool:
        """Whether the chunk of n_tokens at `pos` of `layer` runs sparse (the module docstring's rule)."""
        return layer in self.layers and n_tokens >= 2 and pos + n_tokens >= self.min_length

    def attend(self, layer: int, q: DeviceBuffer, cache: KVLayerCache, step: DeviceBuffer, parts: Partials, pos: int,
               n_tokens: int, n_splits: int, tables: DeviceBuffer | None = None) -> None:
        """Index + sparse flash prefill of one chunk into `parts` for attn_merge_gate. `q`: attn_prep's q for
        the fp16 cache, the K codec's domain (as kv_prefill takes it) for a quantised one, with `tables`.
        `step` must hold [pos, n_tokens] (the kernels read the position there, the host sizes grids from it).
        `n_splits`: the dense prefill's: with the same key ranges per split, each row's arithmetic is the
        dense kernel's, so a profile whose index is causal gives bit-identical outputs."""
        lp, geo = self.layers[layer], SparseGeometry(pos, n_tokens)
        assert self.scratch is not None  # layers exist, so the scratch does
        build_index(self.card, self.dims, self.scratch, lp.table, set(lp.kinds), q, cache.k.codes, step, geo,
                    cache.capacity)
        if cache.format.name == "f16":
            sparse_prefill_f16(self.card, self.dims, q, cache.k.codes, cache.v.codes, step, self.scratch.index, parts,
                               geo, cache.capacity, n_splits)
        else:
            assert tables is not None, "a quantised cache needs the codec tables"
            sparse_prefill_kv(self.card, self.dims, q, cache, step, self.scratch.index, parts, geo, n_splits, tables)
