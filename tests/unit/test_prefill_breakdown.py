"""The prefill-chunk breakdown of `rigllm bench` (issue 30 item 2), host side: the GEMMs' operation count is
the trunk's matrices (checked against the file's tensors), a chunk runs through the GEMM, the GDN chunked
form and flash prefill, and only the GEMM kernels count toward the GEMMs' TOPS. The stand-in card runs no
kernel, so the per-kernel times here are made up by the test; the H200 run measures them."""

from __future__ import annotations

import numpy as np
import pytest

from engine.cuda.bench import prefill_breakdown as pb
from engine.cuda.gemm import DEFAULT_GEMM_STAGING, tiled_gemm_kernel
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import upload_weights
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from fake_card import FakeCard


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def test_the_gemm_operations_are_the_trunks_matrices(demo):
    cfg = demo.config
    matrices = [t for name, t in demo.file.tensors.items()
                if name.startswith("blk.") and int(name.split(".")[1]) < cfg.n_layers and len(t.numpy_shape) == 2
                and "conv1d" not in name]
    assert pb.gemm_ops_per_token(cfg) == 2 * sum(int(np.prod(t.numpy_shape)) for t in matrices)


def test_a_chunk_is_broken_down_and_only_gemms_make_the_tops(demo, monkeypatch):
    card = FakeCard()
    dec = SlotDecoder(card, demo.config, upload_weights(card, demo.file, demo.config), 96, 1, 32)

    def by_launches(card_: FakeCard, step) -> dict:
        card_.launches.clear()
        step()
        names = [name for name, *_ in card_.launches]
        kernels = {name: {"launches": names.count(name), "us": 10.0 * names.count(name)} for name in set(names)}
        return {"whole_us": 10.0 * len(names), "sum_of_parts_us": 10.0 * len(names), "kernels": kernels}

    monkeypatch.setattr(pb, "kernel_breakdown", by_launches)
    b = pb.prefill_breakdown(dec, 40, 100.0)
    assert (b["tokens"], b["depth"], dec.seqs[0].next_position) == (32, 40, 40)
    names = set(b["kernels"])
    gemm, _ = tiled_gemm_kernel("gemm_q8_0_q8_1", 32, DEFAULT_GEMM_STAGING, None)  # a 32-token chunk's tile
    assert {gemm, "gdn_chunk_prefill"} <= names and any(n.startswith("attn_prefill") for n in names)
    gemms = sum(k["us"] for n, k in b["kernels"].items() if n.startswith("gemm_"))
    assert b["gemm_us"] == gemms < b["whole_us"]
    assert b["gemm_tops"] == pytest.approx(pb.gemm_ops_per_token(demo.config) * 32 / (gemms * 1e-6) / 1e12)
    assert b["gemm_fraction_of_dp4a_peak"] == pytest.approx(b["gemm_tops"] / 100.0)
    assert "of DP4A peak" in pb.render_prefill_breakdown(b)[0]
