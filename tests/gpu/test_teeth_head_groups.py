"""Every head grouping a valid Qwen3.5-family GGUF may carry runs on the card (issue 25): attention with 3 and 5
query heads per KV head (outside the specialised decode kernels' 1, 2, 4, 6, 8: the any-group kernels
`*_gany`) in every KV format, and GDN with 1-4 value heads per key head.

Random-weight tiny models (head_dim 32, GDN heads of 16): their whole-model logits are chaotic under Q8_1
rounding (tests/gpu/test_cuda_backend.py's docstring), so the check is layer-local (tests/teeth.py): each
block replayed by the reference on the card's own inputs to it, within the bounds of the measured floor
(the reference summing in another order), over a 70-token prefill (crossing the 64-token GDN chunk) and
decode steps with 3- and 9-token chunks between them. Attention is replayed over the card's own stored K/V
rows (engine.reference.staged_kv.CardRowsKV), whose encoding is checked value by value instead: replayed over
its own cache, a quantised cache's single code rounded to the neighbouring level moved every later row that
attended to it, and four of these cases failed at the committed seeds for that alone (s16d; one still fails, below).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from engine.cuda.backend import CudaBackend
from engine.reference.hidden_trace import HiddenTrace
from engine.model.kv_formats import CUDA_KERNEL_FORMATS
from engine.gguf.config import ModelConfig
from engine.gguf.loader import load_model
from engine.fixtures.synthetic import write_random_model
from engine.fixtures.synthetic_vocab import QWEN35_VOCAB_SIZE
from engine.fixtures.tiny_models import TinyVariant, hf_config
from tests.teeth import LocalDiffs, check_layer_local, feeds, kernel_reference, reference_local_floor

PREFILL = 70
# (attention query heads, KV heads, GDN key heads, GDN value heads): groups 3 and 5, value/key ratios 1-4
GROUPINGS = {"g3-hv1": (6, 2, 2, 2), "g5-hv2": (10, 2, 2, 4), "g3-hv3": (3, 1, 2, 6), "g5-hv4": (5, 1, 1, 4)}


def grouped_config(name: str) -> ModelConfig:
    n_head, n_head_kv, n_k, n_v = GROUPINGS[name]
    variant = TinyVariant(n_layers=4, n_head=n_head, n_head_kv=n_head_kv, n_k_heads=n_k, n_v_heads=n_v, tied=False)
    cfg = ModelConfig.from_hf_config(hf_config(variant, {"<|endoftext|>": 0, "<|im_end|>": 1}))
    return dataclasses.replace(cfg, vocab_size=QWEN35_VOCAB_SIZE)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("groups")
    return {name: load_model(write_random_model(folder / f"{name}.gguf", grouped_config(name), seed=6))
            for name in GROUPINGS}


# Known to fail at these seeds (H200, 2026-12-04, s20d, 43af055): with attention replayed over the card's K/V rows, the
# three other quantised cases of g3-hv1 that failed since s16 pass, but in k8v3 layer 3's FFN has 4 rows of 160 over
# the max bound (isolated: p90 1.5e-7, worst 4.8e-4, the floor's worst 1.9e-7), one more than LOCAL_FLIP_ROWS allows,
# after 3.4e-4 in its mixer (the run stops there, before its stored-K/V share; g3-hv1's five other formats: 0 to
# 6.3e-3 of the values). strict: a change that makes it pass must remove this mark.
FLIP_COUNT_OVER = {("g3-hv1", "k8v3")}
CASES = [pytest.param(name, kv, marks=pytest.mark.xfail(strict=True, reason="one isolated flip row over the count"))
         if (name, kv) in FLIP_COUNT_OVER else (name, kv) for name in GROUPINGS for kv in CUDA_KERNEL_FORMATS]


@pytest.mark.parametrize("name, kv", CASES)
def test_any_head_grouping_runs_and_matches_the_reference_layer_by_layer(models, name, kv):
    loaded = models[name]
    cfg = loaded.config
    print(f"{name}: {cfg.n_head} query heads / {cfg.n_head_kv} KV heads (group {cfg.n_head // cfg.n_head_kv}), GDN "
          f"{cfg.ssm_n_v_heads} value heads / {cfg.ssm_n_k_heads} key heads, KV {kv}")
    tokens = np.random.default_rng(8).integers(0, cfg.vocab_size, 160).tolist()
    chunks = feeds(tokens, PREFILL)
    gpu = CudaBackend(loaded, context=256, chunk=64, kv=kv, speculative=False)  # warm-up used to refuse group 3
    try:
        trace = gpu.fwd.trace = HiddenTrace()
        seq = gpu.new_sequence()
        last = [gpu.forward_last(chunk, seq) for chunk in chunks]
        stored = gpu.stored_kv(seq.slot)
    finally:
        gpu.close()
    assert all(np.isfinite(row).all() for row in last)
    model = kernel_reference(loaded)
    diffs = LocalDiffs.empty()
    diffs.add(model, trace, chunks, kv, stored)
    floor = reference_local_floor(loaded, model, [tokens], kv, PREFILL, over_stored_kv=True)
    check_layer_local(f"{name} {kv}", diffs, floor)
