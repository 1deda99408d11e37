"""The sparse-prefill host launches (engine/cuda/sparse_attention.py) match the kernels' C signatures.

No GPU here: a recording card takes the launches, and every argument list is checked against the
parameter list parsed from cuda_src/sparse_attention.cu (count, and pointer / int / float in each
place), so a launcher and its kernel cannot drift apart silently. What the kernels compute is
tests/gpu/test_sparse_attention.py's job.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from engine.cuda.attention_kernels import AttnDims, alloc_partials
from engine.cuda.sparse_attention import (
    BLOCK,
    KIND_CODE,
    SparseGeometry,
    alloc_scratch,
    build_index,
    pattern_table,
    sparse_prefill_f16,
)
from engine.errors import RigllmError
from engine.reference.sparse_attention import DENSE, Pattern
from tests.unit.fake_card import FakeBuffer, FakeCard

SOURCE = Path(__file__).resolve().parents[2] / "cuda_src" / "sparse_attention.cu"
_ENTRY = re.compile(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\) )?(\w+)\(([^)]*)\)', re.DOTALL)


def signatures() -> dict[str, list[str]]:
    """Kernel name → parameter kinds ('ptr', 'int', 'float'), with the per-Dh macro expanded."""
    text = SOURCE.read_text()
    macro = re.search(r"#define SPARSE_ENTRIES\(DH\)(.*?)\n\n", text, re.DOTALL).group(1).replace("\\\n", "\n")
    expanded = text + "".join(macro.replace("##DH", str(d)).replace("<DH", f"<{d}") for d in (32, 64, 256))
    out = {}
    for name, params in _ENTRY.findall(expanded):
        if "##" in name:
            continue
        kinds = []
        for p in params.split(","):
            p = p.strip()
            kinds.append("ptr" if "*" in p else "float" if p.startswith("float") else "int")
        out[name] = kinds
    return out


class RecordingCard(FakeCard):
    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, tuple]] = []

    def kernel(self, name: str):
        card = self

        class Kernel:
            def launch(self, grid, block, *args, shared: int = 0, stream=None) -> None:
                card.calls.append((name, args))

        return Kernel()


def kind_of(arg) -> str:
    if arg is None or isinstance(arg, FakeBuffer):
        return "ptr"
    if isinstance(arg, np.int32):
        return "int"
    if isinstance(arg, np.float32):
        return "float"
    raise AssertionError(f"unlaunchable argument {arg!r}")


@pytest.mark.parametrize("head_dim", [32, 64, 256])
def test_every_launch_matches_its_kernel_signature(head_dim):
    sigs = signatures()
    assert {"sparse_pool_q", "sparse_vs_select", f"sparse_prefill_d{head_dim}", "sparse_topk_select"} <= set(sigs)
    card = RecordingCard()
    dims = AttnDims(8, 2, head_dim)
    geo = SparseGeometry(pos=100, n_tokens=300)
    scratch = alloc_scratch(card, dims, geo.n_tokens, capacity=1024)
    patterns = [Pattern("a_shape", sink=1, window=2), Pattern("vertical_slash", vertical=2, slash=2),
                Pattern("block_topk", topk=3), DENSE] * 2
    table = card.upload(pattern_table(patterns), "patterns")
    q = card.alloc(geo.n_tokens * dims.n_head * head_dim * 4, "q")
    k = card.alloc(dims.n_head_kv * 1024 * head_dim * 2, "k")
    step = card.upload(np.array([geo.pos, geo.n_tokens], np.int32), "step")
    build_index(card, dims, scratch, table, {p.kind for p in patterns}, q, k, step, geo, 1024)
    parts = alloc_partials(card, geo.n_tokens * dims.n_head, 2, head_dim)
    sparse_prefill_f16(card, dims, q, k, k, step, scratch.index, parts, geo, 1024, 2)
    names = [name for name, _ in card.calls]
    assert names == ["sparse_pool_q", "sparse_pool_k", f"sparse_vs_stats_d{head_dim}", "sparse_vs_rows",
                     f"sparse_vs_mass_d{head_dim}", "sparse_vs_select", "sparse_index_fill", "sparse_topk_select",
                     f"sparse_prefill_d{head_dim}"]
    for name, args in card.calls:
        assert [kind_of(a) for a in args] == sigs[name], name


def test_only_the_passes_a_profile_needs_are_launched():
    card = RecordingCard()
    dims = AttnDims(4, 1, 64)
    geo = SparseGeometry(pos=0, n_tokens=256)
    scratch = alloc_scratch(card, dims, 256, 256)
    table = card.upload(pattern_table([Pattern("a_shape", sink=1, window=1)] * 4), "patterns")
    build_index(card, dims, scratch, table, {"a_shape"}, card.alloc(4, "q"), card.alloc(4, "k"),
                card.alloc(8, "step"), geo, 256)
    assert [name for name, _ in card.calls] == ["sparse_index_fill"]


def test_pattern_table_and_geometry():
    table = pattern_table([DENSE, Pattern("a_shape", sink=2, window=5), Pattern("vertical_slash", vertical=3, slash=4),
                           Pattern("block_topk", topk=7)])
    assert table.tolist() == [[0, 0, 0, 0], [1, 2, 5, 0], [2, 3, 4, 0], [3, 7, 0, 0]]
    assert KIND_CODE == {"dense": 0, "a_shape": 1, "vertical_slash": 2, "block_topk": 3}
    source = SOURCE.read_text()
    assert "SP_DENSE = 0, SP_A_SHAPE = 1, SP_VERTICAL_SLASH = 2, SP_BLOCK_TOPK = 3" in source
    assert f"constexpr int SP_BLOCK = {BLOCK};" in source
    geo = SparseGeometry(pos=100, n_tokens=300)  # rows 100..399: query blocks 1..6, key blocks 0..6
    assert (geo.qb0, geo.n_qb, geo.n_kb, geo.words) == (1, 6, 7, 1)
    with pytest.raises(RigllmError, match="at most"):
        alloc_scratch(FakeCard(), AttnDims(4, 1, 64), 256, 4097 * BLOCK)


def kv_signatures() -> dict[str, list[str]]:
    """sparse_kv.cu's entry points (SPARSE_KV_ENTRY expanded per format and Dh), as `signatures`."""
    text = SOURCE.with_name("sparse_kv.cu").read_text()
    macro = re.search(r"#define SPARSE_KV_ENTRY\(FMT, KC, VC, DH\)(.*?)\n\n", text, re.DOTALL).group(1)
    params = _ENTRY.search(macro.replace("\\\n", "\n").replace("##FMT##_d##DH", "")).group(2)
    kinds = ["ptr" if "*" in p else "float" if p.strip().startswith("float") else "int" for p in params.split(",")]
    formats = re.findall(r"^SPARSE_KV_FORMAT\((\w+),", text, re.MULTILINE)
    widths = re.findall(r"SPARSE_KV_ENTRY\(FMT, KC, VC, (\d+)\)", text)
    return {f"sparse_prefill_{f}_d{d}": kinds for f in formats for d in widths}


@pytest.mark.parametrize("fmt", ["k8v8", "k8v4", "k8v3", "k4v4", "k3v3"])
@pytest.mark.parametrize("head_dim", [128, 256])
def test_the_quantised_cache_launch_matches_its_kernel_signature(fmt, head_dim):
    from engine.cuda.kv_cache import alloc_kv_layer
    from engine.cuda.sparse_attention import sparse_prefill_kv
    from engine.model.kv_formats import kv_format

    sigs = kv_signatures()
    card = RecordingCard()
    dims = AttnDims(8, 2, head_dim)
    geo = SparseGeometry(pos=100, n_tokens=300)
    cache = alloc_kv_layer(card, kv_format(fmt), dims.n_head_kv, head_dim, 1024, "kv")
    parts = alloc_partials(card, geo.n_tokens * dims.n_head, 2, head_dim)
    sparse_prefill_kv(card, dims, card.alloc(4, "q"), cache, card.alloc(8, "step"), card.alloc(4, "index"), parts,
                      geo, 2, card.alloc(4, "tables"))
    (name, args), = card.calls
    assert name == f"sparse_prefill_{fmt}_d{head_dim}" and [kind_of(a) for a in args] == sigs[name]
    with pytest.raises(RigllmError, match="head_dim 64"):
        sparse_prefill_kv(card, AttnDims(8, 2, 64), card.alloc(4, "q"), cache, card.alloc(8, "step"),
                          card.alloc(4, "index"), parts, geo, 2, card.alloc(4, "tables"))
