"""Sparse prefill wired into the CUDA forward pass, on a stand-in card (no GPU): which chunks and layers launch
the sparse kernels (over the fp16 cache and over a quantised one), that decode and short or early chunks
stay dense, and the refusals (kinds or head widths a quantised cache has no kernel for, a profile with
other blocks or head counts). What the kernels compute is tests/gpu's job."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from engine.commands.placement_args import add_placement_args, placement_options
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import upload_weights
from engine.errors import RigllmError
from engine.model.kv_formats import kv_format
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.fixtures.demo_model import ensure_demo_model
from engine.gguf.loader import load_model
from engine.reference.sparse_attention import DENSE, Pattern
from engine.sparse.profile import HeadChoice, SparseProfile
from fake_card import FakeCard

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "trained" / "fixture-q8_0.gguf"
MIN_LENGTH = 150
CHUNK = 64


@pytest.fixture(scope="module")
def demo():
    return load_model(ensure_demo_model())


def profile_for(layers: dict[int, list[Pattern]], block: int = 64, min_length: int = MIN_LENGTH) -> SparseProfile:
    return SparseProfile("test", block, min_length, 0.1, 512,
                         {layer: [HeadChoice(p, 0.0, 0.5) for p in heads] for layer, heads in layers.items()})


def decoder(demo, profile: SparseProfile | None, kv: str = "f16") -> tuple[FakeCard, SlotDecoder]:
    card = FakeCard()
    weights = upload_weights(card, demo.file, demo.config)
    return card, SlotDecoder(card, demo.config, weights, context=512, slots=1, chunk=CHUNK, kv=kv_format(kv),
                             sparse=profile)


def launches_per_chunk(card: FakeCard, dec: SlotDecoder, ids: list[int]) -> list[list[str]]:
    """Kernel names launched by each prefill chunk of `ids` (chunks of CHUNK tokens)."""
    out = []
    for start in range(0, len(ids), CHUNK):
        card.launches.clear()
        dec.prefill_part(dec.seqs[0], ids[start:start + CHUNK])
        out.append([name for name, *_ in card.launches])
    return out


def test_only_chunks_past_the_minimum_length_of_profiled_layers_go_sparse(demo):
    cfg = demo.config
    mixed = [Pattern("a_shape", sink=1, window=2), Pattern("vertical_slash", vertical=1, slash=1),
             Pattern("block_topk", topk=1), DENSE]
    profile = profile_for({cfg.attention_layers[0]: mixed, cfg.attention_layers[1]: [DENSE] * cfg.n_head})
    card, dec = decoder(demo, profile)
    assert set(dec.fwd.sparse.layers) == {cfg.attention_layers[0]}  # the all-dense layer keeps the dense kernel
    chunks = launches_per_chunk(card, dec, list(range(200)))  # chunks end at 64, 128, 192, 200
    sparse_name, dense_name = f"sparse_prefill_d{cfg.head_dim}", f"attn_prefill_d{cfg.head_dim}"
    assert [c.count(sparse_name) for c in chunks] == [0, 0, 1, 1]  # pos + n >= 150 from the third chunk
    assert [c.count(dense_name) for c in chunks] == [2, 2, 1, 0]
    assert chunks[3].count(f"attn_decode_d{cfg.head_dim}_g{cfg.n_head // cfg.n_head_kv}") == 1  # 8 rows: decode kernel
    assert {"sparse_pool_q", "sparse_vs_select", "sparse_index_fill", "sparse_topk_select"} <= set(chunks[2])
    dec.begin(0, SlotRequest(SamplingParams(temperature=0.0), ()))
    card.launches.clear()
    dec.fwd.set_batch([1], dec.seqs[0])
    dec.fwd.run(1, dec.seqs[0])  # a decode token past the minimum length stays dense
    names = [name for name, *_ in card.launches]
    assert not any(n.startswith("sparse_") for n in names) and any(n.startswith("attn_decode") for n in names)


def test_a_one_token_chunk_stays_dense_and_a_shape_needs_no_scoring_pass(demo):
    cfg = demo.config
    profile = profile_for({i: [Pattern("a_shape", sink=1, window=1)] * cfg.n_head for i in cfg.attention_layers},
                          min_length=0)
    card, dec = decoder(demo, profile)
    chunks = launches_per_chunk(card, dec, list(range(65)))  # 64 tokens, then 1
    assert chunks[0].count("sparse_index_fill") == 2 and chunks[0].count(f"sparse_prefill_d{cfg.head_dim}") == 2
    assert not any(n.startswith(("sparse_vs", "sparse_pool", "sparse_topk")) for n in chunks[0])
    assert not any(n.startswith("sparse_") for n in chunks[1])


def test_without_a_profile_nothing_sparse_is_allocated_or_launched(demo):
    card, dec = decoder(demo, None)
    assert dec.fwd.sparse is None
    chunks = launches_per_chunk(card, dec, list(range(200)))
    assert not any(n.startswith("sparse_") for c in chunks for n in c)


@pytest.fixture(scope="module")
def fixture():
    return load_model(FIXTURE)


@pytest.mark.parametrize("kv", ["k8v3", "k3v3"])
def test_a_quantised_cache_runs_a_shape_heads_over_the_stored_codes(fixture, kv):
    cfg = fixture.config
    profile = profile_for({cfg.attention_layers[0]: [Pattern("a_shape", sink=1, window=1), DENSE] * (cfg.n_head // 2)})
    card, dec = decoder(fixture, profile, kv)
    chunks = launches_per_chunk(card, dec, list(range(200)))
    sparse_name, dense_name = f"sparse_prefill_{kv}_d{cfg.head_dim}", f"kv_prefill_{kv}_d{cfg.head_dim}"
    assert [c.count(sparse_name) for c in chunks] == [0, 0, 1, 1]
    assert [c.count(dense_name) for c in chunks] == [1, 1, 0, 0]
    assert [c.count("sparse_index_fill") for c in chunks] == [0, 0, 1, 1]
    assert not any(n.startswith(("sparse_vs", "sparse_pool", "sparse_topk", "sparse_prefill_d")) for c in chunks for n in c)


def test_quantised_caches_refuse_what_their_kernels_cannot_serve(demo, fixture):
    cfg = fixture.config
    scoring = profile_for({cfg.attention_layers[0]: [Pattern("vertical_slash", vertical=1, slash=1)] * cfg.n_head})
    with pytest.raises(RigllmError, match="A-shape and dense heads only.*vertical_slash.*--kinds a_shape.*--kv f16"):
        decoder(fixture, scoring, "k3v3")
    decoder(fixture, scoring, "f16")  # every kind runs over the fp16 cache
    a_shape = profile_for({demo.config.attention_layers[0]: [Pattern("a_shape", sink=1, window=1)] * demo.config.n_head})
    with pytest.raises(RigllmError, match="head_dim \\(128, 256\\), not 64: use --kv f16"):
        decoder(demo, a_shape, "k8v3")


def test_profiles_the_kernels_cannot_run_are_refused(demo):
    layer, heads = demo.config.attention_layers[0], demo.config.n_head
    with pytest.raises(RigllmError, match="--block 64"):
        decoder(demo, profile_for({layer: [Pattern("a_shape", sink=1, window=1)] * heads}, block=32))
    with pytest.raises(RigllmError, match="another model"):
        decoder(demo, profile_for({layer: [Pattern("a_shape", sink=1, window=1)] * (heads + 1)}))


def test_generate_and_serve_take_the_sparse_switch():
    p = argparse.ArgumentParser()
    add_placement_args(p)
    assert placement_options(p.parse_args([]))["sparse"] is False
    assert placement_options(p.parse_args(["--sparse"]))["sparse"] is True


def test_a_model_with_an_mtp_head_prefills_sparse_while_the_head_stays_dense():
    """The MTP head's block runs through the same attention code with no layer index (its rows carry no
    sequence position); it must stay dense while the trunk's long chunks go sparse (an H200 run crashed here)."""
    from engine.cuda.weights import upload_mtp_weights

    fixture = load_model(FIXTURE)
    cfg = fixture.config
    card = FakeCard()
    weights = upload_weights(card, fixture.file, cfg)
    mtp = upload_mtp_weights(card, fixture.file, cfg, weights)
    profile = profile_for({i: [Pattern("a_shape", sink=1, window=2)] * cfg.n_head for i in cfg.attention_layers})
    dec = SlotDecoder(card, cfg, weights, context=512, slots=1, chunk=CHUNK, mtp=mtp, sparse=profile)
    ids = list(range(3 * CHUNK))
    card.launches.clear()
    dec.prefill_slot(0, ids)  # the trunk's chunks, each followed by the head's rows
    assert any(name.startswith("sparse_prefill") for name, *_ in card.launches)
    cache = dec.speculator.caches[0]
    assert cache.position + cache.owed_rows == len(ids)  # the head ran over every complete row
