"""Shared pieces of the attention-path GPU tests (test_norm_rope.py, test_attention.py).

Head shapes and the reference config they imply, the launch geometry mirrored from
cuda_src/{norm_rope,attention}.cu, the launch sequence a runner issues for one attention layer
(attn_prep -> attn_decode / attn_prefill -> attn_merge_gate) on a card from tests/gpu/conftest.py, the
numpy truths those kernels are held to, and comparisons whose messages say where a mismatch is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engine.cuda.attention_kernels import (
    AttnDims, Partials, RopeArgs, attn_decode_f16, attn_merge_gate, attn_prefill_f16, attn_prep,
)

from engine.cuda.q8_layout import quantize_q8_1
from engine.gguf.config import ModelConfig
from engine.reference.norms import rmsnorm
from engine.reference.rope import Rope
from tests.gpu.gpu_fixtures import assert_equal, assert_within

F32 = 4
SPARE_COLUMNS = 5  # extra floats per stacked projection row, so row strides are no natural width
F16_NAN = np.float16(np.nan)


@dataclass(frozen=True)
class AttnShape:
    """Head layout of one attention layer (spec notation) and its rotary setup."""

    name: str
    n_head: int
    n_head_kv: int
    head_dim: int
    rope_dims: int
    sections: tuple[int, int, int]
    eps: float = 1e-6

    @property
    def group(self) -> int:
        return self.n_head // self.n_head_kv

    @property
    def q_width(self) -> int:
        return self.n_head * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.n_head_kv * self.head_dim

    @property
    def scale(self) -> np.float32:
        return np.float32(self.head_dim**-0.5)

    def config(self) -> ModelConfig:
        """A ModelConfig with this attention shape; attention and rope read only these fields."""
        return ModelConfig(
            d_model=1, d_ff=1, n_layers=4, n_mtp=0, n_head=self.n_head, n_head_kv=self.n_head_kv,
            head_dim=self.head_dim, rope_dims=self.rope_dims, rope_sections=(*self.sections, 0),
            rope_theta=10_000_000.0, rms_eps=self.eps, context_length=1 << 18, ssm_conv_kernel=4,
            ssm_d_state=1, ssm_n_k_heads=1, ssm_n_v_heads=1, ssm_d_inner=1, vocab_size=1, tied_embeddings=True,
        )


SHAPE_08B = AttnShape("0.8b", 8, 2, 256, 64, (11, 11, 10))
SHAPE_27B = AttnShape("27b", 24, 4, 256, 64, (11, 11, 10))
SHAPE_DEMO = AttnShape("demo_dh64", 4, 2, 64, 16, (3, 3, 2))  # engine/fixtures/demo_model.py
SHAPE_TINY = AttnShape("tiny_dh32_g4", 8, 2, 32, 8, (2, 1, 1))  # engine/fixtures/tiny_models.py head dims
SHAPE_TINY_MHA = AttnShape("tiny_dh32_g1", 4, 4, 32, 8, (2, 1, 1))
SHAPE_FIXTURE = AttnShape("fixture_dh128_g2", 4, 2, 128, 32, (6, 5, 5))  # tests/fixtures/trained
SHAPES = [SHAPE_08B, SHAPE_27B, SHAPE_DEMO, SHAPE_TINY, SHAPE_TINY_MHA, SHAPE_FIXTURE]


# ---- comparisons ---------------------------------------------------------------------------------
def assert_close(what: str, got: np.ndarray, want: np.ndarray, tol: float) -> None:
    """|got - want| <= tol x max|want| everywhere (NaN fails); the message names the worst and first breach."""
    assert_within(got, want, tol * max(float(np.max(np.abs(want))), 1e-30), what)


def assert_q8_1_of(what: str, xq: np.ndarray, xd: np.ndarray, x: np.ndarray) -> None:
    """(xq, xd) must be bit for bit the Q8_1 form of x (the oracle of cuda_src/quantize.cu)."""
    want_q, want_d = quantize_q8_1(x)
    assert_equal(xd, want_d, f"{what}: block scales")
    assert_equal(xq, want_q, f"{what}: quantised values")


# ---- the numpy truths ----------------------------------------------------------------------------
def random_gain(n: int, rng: np.random.Generator) -> np.ndarray:
    """A norm weight as GGUF stores it (+1 applied): around 1, never all ones."""
    return (1.0 + 0.3 * rng.standard_normal(n)).astype(np.float32)


def reference_prep(shape: AttnShape, qg: np.ndarray, k: np.ndarray, q_norm: np.ndarray, k_norm: np.ndarray,
                   positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """q [T, H, Dh] and k [T, Hkv, Dh] after the per-head RMSNorm and IMROPE, as engine.reference does them."""
    t = qg.shape[0]
    rope = Rope(shape.config())
    q = rmsnorm(qg.reshape(t, shape.n_head, 2, shape.head_dim)[:, :, 0], q_norm, shape.eps)
    kk = rmsnorm(k.reshape(t, shape.n_head_kv, shape.head_dim), k_norm, shape.eps)
    return rope.apply(q, positions), rope.apply(kk, positions)


def attention_over_cache(shape: AttnShape, q: np.ndarray, keys: np.ndarray, values: np.ndarray, pos: int,
                         gate: np.ndarray) -> np.ndarray:
    """y [T, H*Dh] = softmax(q·K^T·scale, causal) · V ⊙ sigmoid(gate), in float64.

    The kernel math on exactly the inputs the kernels saw: q [T, H, Dh] as attn_prep wrote it, the cache
    rows [0, pos+T) as stored (fp16 widened), gate [T, H, Dh]. Token t sees rows [0, pos + t].
    """
    t_new = q.shape[0]
    n = pos + t_new
    k64 = keys[:, :n].astype(np.float64)  # [Hkv, S, Dh]
    v64 = values[:, :n].astype(np.float64)
    kv_of_head = np.arange(shape.n_head) // shape.group
    scores = np.einsum("thd,hsd->ths", q.astype(np.float64), k64[kv_of_head]) * float(shape.scale)
    visible = np.arange(n)[None, None, :] <= (pos + np.arange(t_new))[:, None, None]
    scores = np.where(visible, scores, -np.inf)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True))
    probs /= probs.sum(axis=-1, keepdims=True)
    o = np.einsum("ths,hsd->thd", probs, v64[kv_of_head])
    return (o * (1.0 / (1.0 + np.exp(-gate.astype(np.float64))))).reshape(t_new, -1)


def gate_of(shape: AttnShape, qg: np.ndarray) -> np.ndarray:
    """The gate half of each head's [query | gate] rows (spec pitfall 4): [T, H, Dh]."""
    return qg.reshape(qg.shape[0], shape.n_head, 2, shape.head_dim)[:, :, 1]


# ---- one attention layer on a card ---------------------------------------------------------------
@dataclass
class Projections:
    """The q/gate, k and v GEMV outputs of T tokens side by side in one [T, width] matrix (as a fused
    QKV GEMV writes them), so every kernel reads them through row strides."""

    shape: AttnShape
    stacked: np.ndarray

    @property
    def n_tokens(self) -> int:
        return self.stacked.shape[0]

    @property
    def stride(self) -> int:
        return self.stacked.shape[1]

    @property
    def qg(self) -> np.ndarray:
        return self.stacked[:, : 2 * self.shape.q_width]

    @property
    def k(self) -> np.ndarray:
        start = 2 * self.shape.q_width
        return self.stacked[:, start : start + self.shape.kv_width]

    @property
    def v(self) -> np.ndarray:
        start = 2 * self.shape.q_width + self.shape.kv_width
        return self.stacked[:, start : start + self.shape.kv_width]


def random_projections(shape: AttnShape, n_tok: int, rng: np.random.Generator) -> Projections:
    width = 2 * shape.q_width + 2 * shape.kv_width + SPARE_COLUMNS
    return Projections(shape, (2.0 * rng.standard_normal((n_tok, width))).astype(np.float32))


class DeviceAttention:
    """One attention layer's constants and KV cache on a card, and the launches of one step.

    Cache rows that no step has written hold fp16 NaN, so a kernel that reads past the visible keys
    (or a masked weight meeting an unwritten row) turns the output into NaN instead of passing quietly.
    """

    def __init__(self, card, shape: AttnShape, capacity: int, rng: np.random.Generator):
        self.card, self.shape, self.capacity = card, shape, capacity
        self.q_norm = random_gain(shape.head_dim, rng)
        self.k_norm = random_gain(shape.head_dim, rng)
        self.q_norm_dev = card.upload(self.q_norm, "test q_norm")
        self.k_norm_dev = card.upload(self.k_norm, "test k_norm")
        self.inv_freq_dev = card.upload(Rope(shape.config()).inv_freq, "test inv_freq")
        self.step = card.upload(np.zeros(2, np.int32), "test step")
        cache = np.full((shape.n_head_kv, capacity, shape.head_dim), F16_NAN, np.float16)
        self.k_cache = card.upload(cache, "test k cache")
        self.v_cache = card.upload(cache, "test v cache")

    def fill_prefix(self, keys: np.ndarray, values: np.ndarray) -> None:
        """Write cache rows [0, P) of every KV head from fp16 arrays [Hkv, P, Dh] (rows beyond stay NaN)."""
        for buf, rows in ((self.k_cache, keys), (self.v_cache, values)):
            full = np.full((self.shape.n_head_kv, self.capacity, self.shape.head_dim), F16_NAN, np.float16)
            full[:, : rows.shape[1]] = rows
            buf.upload(full)

    def cache(self) -> tuple[np.ndarray, np.ndarray]:
        s = self.shape
        dims = (s.n_head_kv, self.capacity, s.head_dim)
        return self.k_cache.download(np.float16, dims), self.v_cache.download(np.float16, dims)

    def set_pos(self, pos: int, n_tokens: int) -> None:
        self.step.upload(np.array([pos, n_tokens], np.int32))

    def prep(self, proj: Projections, positions: np.ndarray | None = None):
        """attn_prep for the batch at the step's position; returns (stacked input buffer, q buffer)."""
        s, card = self.shape, self.card
        n_tok = proj.n_tokens
        stacked = card.upload(proj.stacked, "test qkv")
        q_col, k_col, v_col = 0, 2 * s.q_width, 2 * s.q_width + s.kv_width
        q_out = card.alloc(n_tok * s.q_width * F32, "test q")
        pos_dev = None if positions is None else card.upload(positions.astype(np.int32), "test positions")
        attn_prep(card, AttnDims(s.n_head, s.n_head_kv, s.head_dim),
                  self._column(stacked, q_col), proj.stride, self._column(stacked, k_col), proj.stride,
                  self._column(stacked, v_col), proj.stride, self.q_norm_dev, self.k_norm_dev,
                  RopeArgs(self.inv_freq_dev, s.rope_dims, s.sections[1], s.sections[2]), pos_dev, self.step, q_out,
                  self.k_cache, self.v_cache, n_tok, self.capacity, s.eps)
        return stacked, q_out

    @staticmethod
    def _column(buf, col: int):
        return buf.view(col * F32, buf.nbytes - col * F32)

    def partials(self, n_tok: int, n_splits: int):
        """Allocate (part_m, part_l, part_o) for n_tok tokens and n_splits splits."""
        s, card = self.shape, self.card
        rows = n_tok * s.n_head * n_splits
        return (card.alloc(rows * F32, "test part_m"), card.alloc(rows * F32, "test part_l"),
                card.alloc(rows * s.head_dim * F32, "test part_o"))

    @property
    def dims(self) -> AttnDims:
        return AttnDims(self.shape.n_head, self.shape.n_head_kv, self.shape.head_dim)

    def decode(self, q_out, parts, n_splits: int, n_tok: int = 1) -> None:
        attn_decode_f16(self.card, self.dims, q_out, self.k_cache, self.v_cache, self.step, Partials(*parts),
                        self.capacity, n_splits, n_tok)

    def prefill(self, q_out, parts, n_tok: int, n_splits: int) -> None:
        attn_prefill_f16(self.card, self.dims, q_out, self.k_cache, self.v_cache, self.step, Partials(*parts), n_tok,
                         self.capacity, n_splits)

    def merge(self, parts, n_tok: int, n_splits: int, stacked, stride: int, quantize: bool):
        """attn_merge_gate with the gate read straight from the q GEMV output; returns y (and yq, yd)."""
        s, card = self.shape, self.card
        y = card.alloc(n_tok * s.q_width * F32, "test y")
        yq = card.alloc(n_tok * s.q_width, "test yq") if quantize else None
        yd = card.alloc(n_tok * s.q_width // 32 * F32, "test yd") if quantize else None
        attn_merge_gate(card, self.dims, Partials(*parts), n_tok, n_splits, self._column(stacked, s.head_dim), stride,
                        2 * s.head_dim, y, yq, yd)
        out = y.download(np.float32, (n_tok, s.q_width))
        if not quantize:
            return out, None, None
        return (out, yq.download(np.int8, (n_tok, s.q_width)),
                yd.download(np.float32, (n_tok, s.q_width // 32)))

    def step_attention(self, proj: Projections, pos: int, n_splits: int, use_decode: bool,
                       quantize: bool = False):
        """One layer step: prep, attention (the decode kernel, a token per grid column, when asked; else
        prefill), merge."""
        n_tok = proj.n_tokens
        self.set_pos(pos, n_tok)
        stacked, q_out = self.prep(proj)
        parts = self.partials(n_tok, n_splits)
        if use_decode:
            self.decode(q_out, parts, n_splits, n_tok)
        else:
            self.prefill(q_out, parts, n_tok, n_splits)
        y, yq, yd = self.merge(parts, n_tok, n_splits, stacked, proj.stride, quantize)
        q = q_out.download(np.float32, (n_tok, self.shape.n_head, self.shape.head_dim))
        return q, y, yq, yd
