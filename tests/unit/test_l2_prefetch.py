"""Which weight bytes the decode step's short kernels prefetch into L2 (engine/cuda/l2_prefetch.py), on a stand-in card:
the rule itself, and that every prefetching launch of a real decode step names the weight of the matmul after it,
with as many arguments as its C entry point takes. Whether a prefetch changes a bit is tests/gpu's question."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.gemv import MAX_GEMV_TOKENS, Q8Weight
from engine.cuda.kq_weight import KQWeight
from engine.cuda.l2_prefetch import L2_SHARE, NO_PREFETCH, before_gemv, grid_with_prefetch_blocks, leading_q8_buffer
from engine.cuda.matmul import MixedWeight
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import GdnWeights, upload_weights
from engine.fixtures.demo_model import ensure_demo_model
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.gguf.loader import load_model
from gguf import GGMLQuantizationType
from tests.unit.fake_card import FakeCard, entry_parameter_count

PREFETCHING = ("rmsnorm_q8_1", "swiglu_q8_1", "attn_prep", "gdn_recurrent_conv")
OWN_PREFETCH_BLOCKS = ("rmsnorm_q8_1", "swiglu_q8_1", "attn_prep")  # small grids: z layers of prefetching blocks


def q8(card: FakeCard, rows: int, k: int) -> Q8Weight:
    return Q8Weight(qs=card.alloc(rows * k, "qs"), d=card.alloc(rows * k // 16, "d"), rows=rows, k=k, segments=(rows,))


def test_a_gemv_sized_batch_prefetches_the_weights_leading_bytes_up_to_an_eighth_of_l2():
    card = FakeCard()
    big, small = q8(card, 4096, 4096), q8(card, 64, 256)
    got = before_gemv(card, big, 1)
    assert got.buf is big.qs and got.nbytes == card.l2_bytes // L2_SHARE == (60 << 20) // 8
    assert before_gemv(card, small, MAX_GEMV_TOKENS).nbytes == small.qs.nbytes  # all of a small matrix
    buf, nbytes = got.args()
    assert buf is big.qs and isinstance(nbytes, np.int64)


def test_prefill_chunks_and_a_missing_matmul_prefetch_nothing():
    card = FakeCard()
    assert before_gemv(card, q8(card, 256, 256), MAX_GEMV_TOKENS + 1) == NO_PREFETCH
    assert before_gemv(card, None, 1) == NO_PREFETCH
    assert NO_PREFETCH.args() == (None, np.int64(0))


def test_only_a_weight_whose_first_run_is_q8_0_is_prefetched():
    card = FakeCard()
    kq = KQWeight(data=card.alloc(144 * 16, "kq"), qtype=GGMLQuantizationType.Q4_K, rows=16, k=256, segments=(16,))
    first = q8(card, 32, 256)
    assert leading_q8_buffer(MixedWeight((first, kq))) is first.qs
    assert before_gemv(card, MixedWeight((first, kq)), 1).buf is first.qs
    for k_quant_first in (kq, MixedWeight((kq, first))):
        assert leading_q8_buffer(k_quant_first) is None
        assert before_gemv(card, k_quant_first, 1) == NO_PREFETCH


def test_small_grids_gain_prefetching_layers_that_reach_every_sm():
    card = FakeCard()
    some = before_gemv(card, q8(card, 4096, 4096), 1)
    assert grid_with_prefetch_blocks(card, (1, 8), some) == (1, 8, 1 + 17)  # 8 blocks: 17 layers of 8 >= 132 SMs
    assert grid_with_prefetch_blocks(card, 200, some) == (200, 1, 2)
    assert grid_with_prefetch_blocks(card, (1, 8), NO_PREFETCH) == (1, 8)
    assert grid_with_prefetch_blocks(card, 20, NO_PREFETCH) == 20


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def test_every_short_kernel_of_a_decode_step_prefetches_the_next_matmuls_weight(demo):
    card = FakeCard()
    dec = SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), context=128, slots=1, chunk=16)
    dec.prefill_slot(0, list(range(30)))
    dec.begin(0, SlotRequest(SamplingParams(temperature=0.0), list(range(30))))
    card.launches.clear()
    card.launch_args.clear()
    dec.step({0: 5})
    w = dec.fwd.w
    expected = {"rmsnorm_q8_1": [], "swiglu_q8_1": [], "attn_prep": [], "gdn_recurrent_conv": []}
    for layer in w.layers:
        gdn = isinstance(layer.mixer, GdnWeights)
        expected["rmsnorm_q8_1"] += [layer.mixer.in_proj if gdn else layer.mixer.qkv, layer.ffn.gate_up]
        expected["gdn_recurrent_conv" if gdn else "attn_prep"].append(layer.mixer.out_proj)
        expected["swiglu_q8_1"].append(layer.ffn.down)
    expected["rmsnorm_q8_1"].append(w.lm_head)
    for name in PREFETCHING:
        kernel_launches = [launch for launch in card.launches if launch[0] != "<replay>"]  # as launch_args lists them
        launches = [(grid, args) for (kernel, grid, *_), (_, args) in zip(kernel_launches, card.launch_args)
                    if kernel == name]
        assert len(launches) == len(expected[name]) > 0, name
        for (grid, args), weight in zip(launches, expected[name]):
            assert len(args) == entry_parameter_count(name), name
            assert args[-2] is leading_q8_buffer(weight), name
            assert args[-1] == min(leading_q8_buffer(weight).nbytes, card.l2_bytes // L2_SHARE), name
            if name in OWN_PREFETCH_BLOCKS:
                gx, gy, gz = grid if isinstance(grid, tuple) and len(grid) == 3 else (0, 0, 0)
                assert (gz - 1) * gx * gy >= card.sm_count, (name, grid)


def test_a_prefill_chunk_prefetches_nothing_but_the_head_after_its_last_row(demo):
    card = FakeCard()
    dec = SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), context=128, slots=1, chunk=16)
    card.launch_args.clear()
    dec.prefill_slot(0, list(range(16)))
    launches = [(kernel, args) for kernel, args in card.launch_args
                if kernel in ("rmsnorm_q8_1", "swiglu_q8_1", "attn_prep", "gdn_recurrent", "gdn_recurrent_conv")]
    *chunk, head_norm = launches
    assert chunk and all(args[-2] is None and args[-1] == 0 for _, args in chunk)
    assert head_norm[0] == "rmsnorm_q8_1" and head_norm[1][-2] is leading_q8_buffer(dec.fwd.w.lm_head)
