"""The GDN launchers (engine.cuda.gdn) agree with cuda_src/gdn.cu and refuse what the kernels cannot do.

No GPU needed: the source's #defines are evaluated here and compared with the Python mirrors that size
the grids and the dynamic shared memory; a drift would launch too few blocks or too little memory.
"""

from __future__ import annotations

import ast
import operator
import re
from pathlib import Path
from types import SimpleNamespace

import pytest

from engine.cuda import gdn
from engine.cuda.kernel_build import CUDA_SRC_DIR
from engine.cuda.kernel_limits import MAX_SHARED_BYTES
from engine.cuda.slot_batch import SlotRows
from engine.gguf.config import ModelConfig

SOURCE = (CUDA_SRC_DIR / "gdn.cu").read_text()
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv}


def _evaluate(node: ast.AST, values: dict[str, int]) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.Name):
        return values[node.id]
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        return _OPS[type(node.op)](_evaluate(node.left, values), _evaluate(node.right, values))
    raise ValueError(f"not integer arithmetic: {ast.dump(node)}")


def source_defines() -> dict[str, int]:
    """Every `#define GDN_*` of gdn.cu whose value is integer arithmetic on earlier ones, evaluated."""
    values: dict[str, int] = {}
    for name, text in re.findall(r"^#define (GDN_\w+) (.+)$", SOURCE, re.MULTILINE):
        try:
            values[name] = _evaluate(ast.parse(text.split("//")[0].strip(), mode="eval").body, values)
        except (SyntaxError, ValueError):  # float constants such as 1e-6f
            continue
    return values


def test_launch_constants_mirror_the_kernel_source():
    d = source_defines()
    mirrored = {
        "GDN_CONV_K": gdn.CONV_K,
        "GDN_CONV_TILE": gdn.CONV_TILE,
        "GDN_MAX_DK": gdn.MAX_DK,
        "GDN_RECURRENT_THREADS": gdn.RECURRENT_THREADS,
        "GDN_RECURRENT_COLS": gdn.RECURRENT_COLS,
        "GDN_RECURRENT_MIN_BLOCKS": gdn.RECURRENT_BLOCKS_PER_SM,
        "GDN_CHUNK_THREADS": gdn.CHUNK_THREADS,
        "GDN_CHUNK_COLS": gdn.CHUNK_COLS,
    }
    assert {k: d[k] for k in mirrored} == mirrored
    assert gdn.CHUNK_SMEM_BYTES == 4 * d["GDN_CHUNK_SMEM_FLOATS"] <= MAX_SHARED_BYTES


def test_launchers_name_kernels_of_the_source():
    kernels = set(re.findall(r'extern "C" __global__ void (?:__launch_bounds__\([^)]*\)\s*)?(\w+)\(', SOURCE))
    kernels |= set(re.findall(r'^RIGLLM_GDN_RECURRENT\((\w+),', SOURCE, re.MULTILINE))
    launched = set(re.findall(r'card\.kernel\("(\w+)"\)', Path(gdn.__file__).read_text()))
    assert launched and launched <= kernels, f"launched {sorted(launched)}, defined {sorted(kernels)}"


def _config(**gdn_fields: int) -> ModelConfig:
    fields = dict(ssm_conv_kernel=4, ssm_d_state=128, ssm_n_k_heads=16, ssm_n_v_heads=32, ssm_d_inner=32 * 128)
    fields.update(gdn_fields)
    return ModelConfig(
        d_model=1, d_ff=1, n_layers=1, n_mtp=0, n_head=1, n_head_kv=1, head_dim=1, rope_dims=0,
        rope_sections=(0, 0, 0, 0), rope_theta=1.0, rms_eps=1e-6, context_length=1, vocab_size=1,
        tied_embeddings=True, **fields,
    )


def test_dims_from_a_9b_config():
    dims = gdn.GdnDims.from_config(_config())
    assert (dims.n_k_heads, dims.n_v_heads, dims.d_k, dims.d_v) == (16, 32, 128, 128)
    assert (dims.ck, dims.cv, dims.cc) == (2048, 4096, 8192)


@pytest.mark.parametrize(
    "fields, message",
    [
        (dict(ssm_conv_kernel=3), "conv width 3"),
        (dict(ssm_d_state=256), "key head dim 256"),
        (dict(ssm_n_k_heads=12), "multiple of Hk"),
    ],
)
def test_dims_the_kernels_cannot_run_are_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        gdn.GdnDims.from_config(_config(**fields))


class _Buffer:
    """Stands in for a DeviceBuffer: the launchers only read sizes and pass buffers through."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes


class _RecordingCard:
    """Records (kernel, grid, block, shared, dynamic-shared opt-in) instead of launching."""

    def __init__(self, sm_count: int = 132):
        self.launches: list[tuple] = []
        self.opt_in: dict[str, int] = {}
        self.sm_count = sm_count

    def kernel(self, name: str):
        card = self

        class _Kernel:
            def set_max_dynamic_shared(self, nbytes: int) -> None:
                card.opt_in[name] = nbytes

            def launch(self, grid, block, *args, shared=0, stream=None) -> None:
                card.launches.append((name, grid, block, shared, card.opt_in.get(name, 0)))

        return _Kernel()


def _mixer_launches(dims: gdn.GdnDims, n_tokens: int, card: _RecordingCard | None = None, slot_rows: bool = False,
                    **kwargs) -> list[tuple]:
    """The launches of one gdn_mixer call: one sequence's tokens, or (slot_rows) one token per slot row."""
    big = _Buffer(1 << 30)
    rows = gdn.Rows(big, dims.cc + dims.cv + 2 * dims.n_v_heads)
    inputs = gdn.GdnInputs(rows, rows, rows, rows)
    card = card or _RecordingCard()
    weights = SimpleNamespace(conv_w=big, ssm_a=big, dt_bias=big, ssm_norm=big)
    state = None if slot_rows else SimpleNamespace(conv=big, recurrent=big)
    slots = SlotRows(big, big) if slot_rows else None
    gdn.gdn_mixer(card, dims, weights, state, inputs, big, big, big, n_tokens, 1e-6, slots=slots, **kwargs)
    return card.launches


def test_short_batches_take_the_recurrent_kernel():
    dims = gdn.GdnDims(16, 48, 128, 128)
    launches = _mixer_launches(dims, gdn.RECURRENT_MAX_TOKENS)
    assert [(name, grid, block) for name, grid, block, _, _ in launches] == [
        ("gdn_conv_silu", (-(-dims.cc // gdn.CONV_THREADS), 1), gdn.CONV_THREADS),
        ("gdn_recurrent", (48, 128 // gdn.RECURRENT_COLS), gdn.RECURRENT_THREADS),
    ]


def test_one_token_per_row_takes_one_launch_that_does_the_conv_too():
    """A decode token and slot rows: gdn_recurrent_conv alone (issue 30), unless the caller asks for the two
    launches (the GPU tests' bit-for-bit baseline); a verify with its ring keeps both."""
    dims = gdn.GdnDims(16, 48, 128, 128)
    assert [(n, g) for n, g, *_ in _mixer_launches(dims, 1)] == [("gdn_recurrent_conv", (48, 128 // gdn.RECURRENT_COLS))]
    assert [n for n, *_ in _mixer_launches(dims, 2, slot_rows=True)] == ["gdn_recurrent_conv_wide"]  # 768 blocks
    assert [n for n, *_ in _mixer_launches(dims, 1, fuse_conv=False)] == ["gdn_conv_silu", "gdn_recurrent"]
    ring = SimpleNamespace(check=lambda state, n: None, conv=_Buffer(1 << 30), recurrent=_Buffer(1 << 30))
    assert [n for n, *_ in _mixer_launches(dims, 1, ring=ring)] == ["gdn_conv_silu", "gdn_recurrent"]


def test_the_conv_form_refuses_what_it_cannot_do():
    dims = gdn.GdnDims(2, 6, 16, 72)
    big = _Buffer(1 << 30)
    rows = gdn.Rows(big, dims.cc + dims.cv + 2 * dims.n_v_heads)
    weights = SimpleNamespace(conv_w=big, ssm_a=big, dt_bias=big, ssm_norm=big)
    with pytest.raises(ValueError, match="conv for one token per row"):
        gdn.gdn_recurrent(_RecordingCard(), dims, weights, SimpleNamespace(conv=big, recurrent=big), None,
                          gdn.GdnInputs(rows, rows, rows, rows), big, big, 3, 1e-6)
    with pytest.raises(ValueError, match="counters"):
        gdn.gdn_recurrent(_RecordingCard(), dims, weights, SimpleNamespace(conv=big, recurrent=big), None,
                          gdn.GdnInputs(rows, rows, rows, rows), big, _Buffer(4 * dims.n_v_heads), 1, 1e-6)


@pytest.mark.parametrize("rows, sm_count, wide", [(1, 132, False), (2, 132, False), (3, 132, True), (8, 132, True),
                                                 (2, 68, True), (8, 2048, False)])
def test_slot_batches_past_one_wave_of_narrow_blocks_take_the_wide_form(rows, sm_count, wide):
    """The 9B shape's narrow form has 256 blocks a row; past RECURRENT_BLOCKS_PER_SM per SM (one wave) a slot
    batch launches gdn_recurrent_wide, half the blocks of twice the columns, one row per grid z."""
    dims = gdn.GdnDims(16, 32, 128, 128)
    card = _RecordingCard(sm_count)
    name, grid, block, _, _ = _mixer_launches(dims, rows, card=card, slot_rows=True)[-1]
    cols = gdn.WIDE_COLS if wide else gdn.RECURRENT_COLS
    assert (name, grid, block) == ("gdn_recurrent_conv_wide" if wide else "gdn_recurrent_conv",
                                   (32, 128 // cols, rows), gdn.RECURRENT_THREADS)
    assert gdn.recurrent_form(card, dims, rows, conv=True) == (name, cols)
    assert gdn.recurrent_form(card, dims, rows) == (name.replace("_conv", ""), cols)


def test_one_sequence_keeps_the_narrow_form_even_on_a_card_of_few_sms():
    """A 27B-shaped decode token or verify (one sequence, 384 narrow blocks) on a card of 68 SMs (272 resident)
    stays on the narrow kernel: the wide one was measured and GPU-tested on slot batches only."""
    dims = gdn.GdnDims(16, 48, 128, 128)
    launches = _mixer_launches(dims, 3, card=_RecordingCard(68))
    assert [(name, grid) for name, grid, *_ in launches][-1] == ("gdn_recurrent", (48, 128 // gdn.RECURRENT_COLS))
    assert gdn.recurrent_form(_RecordingCard(68), dims, None) == ("gdn_recurrent", gdn.RECURRENT_COLS)


def test_longer_batches_take_the_chunked_form_with_its_shared_memory_opt_in():
    dims = gdn.GdnDims(2, 6, 16, 72)
    n_tokens = gdn.RECURRENT_MAX_TOKENS + 1
    launches = _mixer_launches(dims, n_tokens)
    assert [name for name, *_ in launches] == ["gdn_conv_silu", "gdn_chunk_prefill", "gdn_gated_norm"]
    _, grid, _, shared, opt_in = launches[1]
    assert grid == (6, 3) and shared == opt_in == gdn.CHUNK_SMEM_BYTES
    assert launches[2][1] == n_tokens * 6
    forced = _mixer_launches(dims, 1, recurrent=False)
    assert [name for name, *_ in forced] == ["gdn_conv_silu", "gdn_chunk_prefill", "gdn_gated_norm"]


def test_buffers_too_small_and_unsupported_q8_outputs_are_refused():
    dims = gdn.GdnDims(2, 6, 16, 72)
    with pytest.raises(ValueError, match="cannot hold 3 rows"):
        gdn.Rows(_Buffer(4 * (2 * 100 + 99)), 100).check("mix", 100, 3)
    gdn.Rows(_Buffer(4 * (2 * 100 + 100)), 100).check("mix", 100, 3)  # exactly enough
    q8 = SimpleNamespace(k=dims.cv, max_tokens=4, xq=None, xd=None)
    with pytest.raises(ValueError, match="dv % 32"):
        _mixer_launches(dims, 2, y_q8=q8)
