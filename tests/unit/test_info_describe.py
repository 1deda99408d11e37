"""`describe()` and `render_text()`: the facts `rigllm info` reports, checked against the file itself."""

from __future__ import annotations

import pytest

from engine.errors import RigllmError
from engine.commands.info_text import format_count, render_text
from engine.model.model_info import describe, layer_pattern_text
from engine.gguf.loader import load_model
from engine.gguf.shapes import shape_config
from tests.unit.loader_fixtures import TINY, write_tiny_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(write_tiny_model(tmp_path_factory.mktemp("info") / "tiny.gguf"))


def test_counts_match_the_file(model):
    info = describe(model)
    tensors = model.file.tensors
    mtp = sum(t.n_elements for name, t in tensors.items() if name.startswith("blk.4."))
    assert info["parameters"] == {
        "trunk": sum(t.n_elements for t in tensors.values()) - mtp,
        "mtp": mtp,
        "total": sum(t.n_elements for t in tensors.values()),
    }
    assert info["layers"] == {"trunk": 4, "gdn": 3, "attention": 1, "mtp": 1, "pattern": "GGGA"}
    assert info["tensor_types"] == model.type_counts
    assert info["weight_bytes"]["file"] == sum(t.n_bytes for t in tensors.values())
    assert info["weight_bytes"]["requantised_tensors"] == 0
    assert (info["context_length"], info["vocab_size"], info["tied_embeddings"]) == (4096, TINY.vocab_size, False)


def test_kv_and_state_arithmetic(model):
    info = describe(model)
    # one attention layer, one KV head of 32: f16 K+V = 2 * 32 * 2 bytes; int8 = one 32-block of 34 bytes per side
    assert info["kv_bytes_per_token"]["f16"] == 128
    assert info["kv_bytes_per_token"]["k8v8"] == 68
    assert info["kv_bytes_per_token_with_mtp"]["f16"] == 256
    conv = 3 * (2 * 2 * 16 + 64) * 4  # (Kc - 1) * Cc * fp32
    recurrent = 4 * 16 * 16 * 4  # Hv * dk * dv * fp32
    assert info["gdn_state_bytes_per_sequence"] == {
        "conv": 3 * conv,
        "recurrent": 3 * recurrent,
        "total": 3 * (conv + recurrent),
    }


def test_plans_for_one_to_four_cards(model):
    info = describe(model, context=1000, kv_name="f16")
    assert [p["n_cards"] for p in info["plans"]] == [1, 2, 3, 4] and all(p["fits"] for p in info["plans"])
    for entry in info["plans"]:
        ranges = [(c["first_layer"], c["last_layer"]) for c in entry["cards"]]
        assert ranges[0][0] == 0 and ranges[-1][1] == 3
        assert all(a[1] + 1 == b[0] for a, b in zip(ranges, ranges[1:]))
        assert entry["cards"][0]["embedding"] and entry["cards"][-1]["head"] and entry["cards"][-1]["mtp"]
    assert info["plan_settings"]["context"] == 1000 and info["plan_settings"]["kv_format"] == "f16"
    assert describe(model, with_mtp=False)["plans"][0]["cards"][0]["mtp"] is False


def test_a_user_split_is_the_only_plan(model):
    info = describe(model, context=1000, kv_name="f16", split=(3, 1))
    assert info["plan_settings"]["split"] == [3, 1]
    [entry] = info["plans"]
    assert entry["n_cards"] == 2 and entry["fits"]
    assert [(c["first_layer"], c["last_layer"]) for c in entry["cards"]] == [(0, 2), (3, 3)]
    assert "layers per card 3,1 (given)" in render_text(info)
    [bad] = describe(model, split=(2, 1))["plans"]
    assert not bad["fits"] and "4 in all, not 2,1" in bad["error"]


def test_unknown_kv_format(model):
    with pytest.raises(RigllmError, match="unknown KV format 'q4'.*f16, k8v8"):
        describe(model, kv_name="q4")


def test_text_report(model):
    text = render_text(describe(model))
    assert "pattern       GGGA + M" in text
    assert "tensor types  Q8_0 x41, F32 x30" in text
    assert "KV per token  f16 128 B  k8v8 68 B" in text
    assert "  4 cards  card 0: layers 0-0" in text
    assert "k8v3 KV (K int8, V wht3)" in text
    assert "sizes only" not in text
    assert "note: KV format k16v3: sizes only" in render_text(describe(model, kv_name="k16v3"))


def test_layer_pattern_of_27b():
    cfg = shape_config("27b")
    assert layer_pattern_text(cfg.is_recurrent[: cfg.n_layers], 4) == " ".join(["GGGA"] * 16)


def test_format_count():
    assert [format_count(n) for n in (26_895_998_464, 424_694_272, 254_024, 12)] == [
        "26.896 B",
        "424.7 M",
        "254.0 K",
        "12",
    ]
