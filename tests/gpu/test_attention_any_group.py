"""The any-group decode kernels (attn_decode_d*_gany, kv_decode_*_d*_gany: one query head per block) for group
sizes without a specialised kernel, against the same float64 and reference truths and bounds as the
specialised ones (tests/gpu/test_attention.py, tests/gpu/test_kv_cache.py). Prefill kernels take any group already (their tiles hold rows t*G + g); they run here too."""

from __future__ import annotations

import pytest

from engine.cuda.attention_kernels import AttnDims, QUANTISED_KERNEL_FORMATS
from tests.gpu.attention_fixtures import AttnShape
from tests.gpu.test_attention import run_case as f16_case
from tests.gpu.test_kv_cache import run_case as kv_case
from tests.gpu.test_kv_cache import tables  # noqa: F401  (the module fixture the quantised cases use)

# (query heads, KV heads, head_dim): groups 3, 5, 7 and, for head_dim 128, 6 (no specialised quantised kernel)
ODD_GROUPS = [(6, 2, 32), (5, 1, 64), (21, 3, 256), (12, 2, 128), (10, 2, 128)]
ROPE = {32: (8, (2, 1, 1)), 64: (16, (3, 3, 2)), 128: (32, (6, 5, 5)), 256: (64, (11, 11, 10))}


def shape_of(n_head: int, n_head_kv: int, head_dim: int) -> AttnShape:
    rope_dims, sections = ROPE[head_dim]
    return AttnShape(f"g{n_head // n_head_kv}_dh{head_dim}", n_head, n_head_kv, head_dim, rope_dims, sections)


@pytest.mark.parametrize("heads", ODD_GROUPS, ids=lambda h: f"{h[0]}x{h[1]}_dh{h[2]}")
@pytest.mark.parametrize("n_tok, pos, n_splits, use_decode", [(1, 0, 1, True), (1, 700, 5, True), (3, 300, 7, True),
                                                             (17, 5, 4, False), (65, 300, 2, False)])
def test_f16_cache_any_group(card, rng, heads, n_tok, pos, n_splits, use_decode):
    f16_case(card, rng, shape_of(*heads), n_tok, pos, n_splits, use_decode)


@pytest.mark.parametrize("fmt_name", QUANTISED_KERNEL_FORMATS)
@pytest.mark.parametrize("heads", ODD_GROUPS, ids=lambda h: f"{h[0]}x{h[1]}_dh{h[2]}")
@pytest.mark.parametrize("n_tok, pos, n_splits, use_decode", [(1, 700, 5, True), (3, 300, 7, True), (17, 5, 4, False)])
def test_quantised_cache_any_group(card, rng, tables, fmt_name, heads, n_tok, pos, n_splits, use_decode):  # noqa: F811
    kv_case(card, rng, tables, fmt_name, AttnDims(*heads), n_tok, pos, n_splits, use_decode)
