"""The planner with K and V formats chosen separately, and the issue's 27B 256K target (issue 6).

The 27B shape at 262144 tokens with 3-bit K and V must plan onto three 16 GB cards together with the
weights (Q8_0), the GDN state of one sequence and the scratch. The plan is printed (run pytest with -s
to see it) so the report can quote it.
"""

from __future__ import annotations

import pytest

from engine.errors import RigllmError
from engine.model.kv_formats import kv_format
from engine.model.memory_plan import cards_16gb, format_bytes, plan, resolve_kv_format
from engine.model.model_footprint import footprint_for
from engine.gguf.shapes import shape_config


def describe_plan(p) -> str:
    lines = [f"{p.context} tokens, KV {p.kv_format} (K {p.kv_k}, V {p.kv_v}), MTP {'on' if p.with_mtp else 'off'}"]
    for c in p.cards:
        lines.append(
            f"  {c.profile.name}: layers {c.layers.start}-{c.layers.stop - 1}  weights {format_bytes(c.weight_bytes)}"
            f"  KV {format_bytes(c.kv_bytes)}  GDN state {format_bytes(c.state_bytes)}  scratch "
            f"{format_bytes(c.scratch_bytes)}  total {format_bytes(c.total_bytes)} of "
            f"{format_bytes(c.profile.usable_bytes)}  free {format_bytes(c.free_bytes)}"
        )
    return "\n".join(lines)


@pytest.mark.parametrize("with_mtp", [False, True], ids=["no-mtp", "mtp"])
def test_27b_at_256k_with_3bit_k_and_v_fits_three_16gb_cards(with_mtp):
    cfg = shape_config("27b")
    fp = footprint_for(cfg)
    p = plan(fp, cards_16gb(3), 262144, k_bits=3, v_bits=3, with_mtp=with_mtp)
    print("\n" + describe_plan(p))
    assert (p.kv_format, p.kv_k, p.kv_v) == ("k3v3", "wht3", "wht3")
    assert all(c.free_bytes > 0 for c in p.cards)
    n_attn = len(cfg.attention_layers) + (1 if with_mtp else 0)
    # 2 sides x 4 KV heads x 2 blocks of (48 B codes + 2 B norm) per token and attention layer
    assert sum(c.kv_bytes for c in p.cards) == 262144 * n_attn * 2 * 4 * 2 * 50
    assert sum(c.kv_bytes for c in p.cards) < 3.6e9  # the "about 3.5 GB"
    assert sum(c.state_bytes for c in p.cards) == 48 * (cfg.ssm_conv_kernel - 1) * cfg.ssm_conv_dim * 4 + 144 * 2**20
    blocks = cfg.n_blocks if with_mtp else cfg.n_layers
    weights = sum(fp.block_bytes[:blocks]) + fp.embedding_bytes + fp.head_bytes
    assert sum(c.weight_bytes for c in p.cards) >= weights  # every weight (+ the tied LM head copy, if any)
    with pytest.raises(RigllmError, match="short by"):  # the same on two cards does not fit
        plan(fp, cards_16gb(2), 262144, k_bits=3, v_bits=3, with_mtp=with_mtp)


def test_separate_bits_override_a_format():
    assert resolve_kv_format(None, None, None).name == "f16"
    assert resolve_kv_format("k8v3", None, None).name == "k8v3"
    assert resolve_kv_format("k8v3", 3, None).name == "k3v3"
    assert resolve_kv_format(kv_format("k8v8"), None, 4).name == "k8v4"
    assert resolve_kv_format(None, 16, 3).name == "k16v3"
    fp = footprint_for(shape_config("9b"))
    by_name = plan(fp, cards_16gb(1), 32768, kv_format("k8v4"))
    by_bits = plan(fp, cards_16gb(1), 32768, k_bits=8, v_bits=4)
    assert by_name == by_bits
    with pytest.raises(RigllmError, match="KV bits must be one of"):
        plan(fp, cards_16gb(1), 32768, k_bits=5, v_bits=4)


def test_kv_bytes_scale_with_each_side():
    fp = footprint_for(shape_config("9b"))
    sizes = {(k, v): sum(c.kv_bytes for c in plan(fp, cards_16gb(2), 65536, k_bits=k, v_bits=v).cards)
             for k in (16, 8, 4, 3) for v in (16, 8, 4, 3)}
    for v in (16, 8, 4, 3):
        assert sizes[(16, v)] > sizes[(8, v)] > sizes[(4, v)] > sizes[(3, v)]
    assert sizes[(8, 3)] == sizes[(3, 8)]  # sides cost the same per bit width
