"""The model's forward pass on one card: the kernel sequence for a batch of T tokens (spec §6).

Every buffer is allocated once, here, for at most `max_tokens` tokens per batch (the prefill chunk);
per-step values (position, token count) live in each sequence's `step` device buffer and the token
ids in `ids`, so decode can be captured as a CUDA graph and replayed with new values written there.

On several cards each card's pass covers its trunk layers only (`weights.span`): the first card embeds
the token ids, a later card starts from the hidden rows the previous card left in `h` (copied in by
the pipeline), and only the last card applies the final norm and LM head.

Image prompts (spec §9.5-9.6): a pass may replace some rows' token embeddings by host rows (the vision
tower's output for the image pads; first card only) and give attention per-token (t, h, w) rope
positions in a device buffer (`positions` [T][3] int32) instead of the text positions `pos + t`.

Three kinds of pass: `run` takes T tokens of one sequence (prefill, or one decode token), `run_slots`
one token of each of B sequences (continuous batching): the matmuls, norms and SwiGLU run once on the
B rows, so the weights are read once for all sequences, and the mixers (attention with its KV cache,
GDN with its state) run slot-indexed (engine.cuda.slot_batch): one launch per kernel for all B rows,
each row reading and advancing its own slot's state. `run_sequences` takes consecutive runs of rows,
each a prefill chunk of its own sequence (several requests arriving together): the matmuls, norms and
SwiGLU run once over all rows, each mixer once per run, as `run` would run it on that run alone. Where
every run has more than MAX_GEMV_TOKENS rows, its rows come out bit for bit as its own pass leaves them
(the GEMM and the prefill-shaped norm give a row the same bits at any row count); a shorter run would take
the GEMV alone, hence `shares_pass`. `run_verify` is `run` for a speculative verify (T <= 8 tokens through the
GEMV path): logits and normed hidden rows for every token, the GDN states after each token kept in rings for the
rollback, attention splits sized for the capacity so that a captured verify graph replays at any position.
`run_verifies` is several slots' verifies in one pass, shared as `run_sequences` shares prefill chunks: all rows
through the GEMV, each run's mixers as its own verify launches them (every row count of two or more gives a GEMV
row the same bits, so each slot's logits are its own verify's).

Activations: the residual stream `h` is fp32; every matmul input is Q8_1 (quantized by the
norm/gate/SwiGLU kernel that produces it); matmul outputs are fp32; the KV cache is fp16 or a
quantised format (K/V staged in fp16, then encoded); GDN state fp32 (architecture.md "Precision
contract").

Matmuls: T <= 8 runs the DP4A GEMV (weights read once for all tokens), larger T the DP4A GEMM tile, each
in its Q8_0 or K-quant form by weight type (engine.cuda.matmul).
Stacked weights write segment i as its own [T][rows_i] matrix (engine.cuda.gemv), which is why the
kernels below receive each segment's pointer and row stride separately.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from engine.cuda.attention_kernels import (
    MAX_PREFILL_SPLITS, AttnDims, RopeArgs, alloc_partials, attn_decode_f16, attn_merge_gate, attn_prefill_f16,
    attn_prep, decode_splits, kernel_format, kv_decode, kv_encode, kv_prefill, prefill_splits, rotate_q, side_rows,
)
from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.kv_cache import KVLayerCache, domain_width, upload_kv_tables
from engine.cuda.gdn import GdnDims, GdnInputs, GdnRing, Rows, alloc_head_counters, gdn_mixer
from engine.cuda.gemv import MAX_GEMV_TOKENS, Q8Activations, alloc_q8_activations, quantize_q8_1
from engine.cuda.l2_prefetch import NO_PREFETCH, before_gemv, grid_with_prefetch_blocks
from engine.cuda.matmul import Weight, embed, matmul
from engine.cuda.norm import norm_shape, rmsnorm_q8_1
from engine.cuda.sequence import F16_FORMAT, DeviceSequence
from engine.cuda.slot_batch import SlotBatch
from engine.cuda.sparse_prefill import SparsePrefill
from engine.cuda.weights import AttentionWeights, GdnWeights, LayerWeights, ModelWeights
from engine.reference.hidden_trace import HiddenTrace
from engine.model.kv_formats import KVFormat
from engine.gguf.config import ModelConfig
from engine.reference.rope import Rope

F32, F16 = 4, 2
SWIGLU_THREADS = 256


@dataclass(frozen=True)
class SequenceRows:
    """Rows [first, first + count) of a pass over several sequences: a prefill chunk of `seq` (`run_sequences`), or a
    speculative verify of it (`run_verifies`, whose GDN layers keep their states after each row in `rings`),
    continuing it at its `step`."""

    seq: DeviceSequence
    first: int
    count: int
    rings: Mapping[int, GdnRing] | None = None

    def of(self, rows: DeviceBuffer, width: int) -> DeviceBuffer:
        """These rows of a [T][width] fp32 matrix."""
        return matrix_rows(rows, width, self.first, self.count)


def shares_pass(counts: Sequence[int], max_tokens: int) -> bool:
    """Can runs of these token counts share one `run_sequences` pass of at most `max_tokens` rows, each coming out bit
    for bit as in a pass of its own? One run always does; several do when each has more than MAX_GEMV_TOKENS rows, so
    that each takes the GEMM and the prefill-shaped norm alone as well as together (a shorter one would take the GEMV
    alone: other sums)."""
    return (0 < len(counts) <= MAX_GEMV_TOKENS and min(counts) > 0 and sum(counts) <= max_tokens
            and (len(counts) == 1 or min(counts) > MAX_GEMV_TOKENS))


Owner = DeviceSequence | SlotBatch | tuple[SequenceRows, ...]  # (or anything shaped like a DeviceSequence: mtp.HeadRows)


class ForwardPass:
    """Buffers and launches of one model on one card (see the module docstring)."""

    def __init__(self, card: CudaCard, cfg: ModelConfig, weights: ModelWeights, max_tokens: int,
                 kv: KVFormat = F16_FORMAT):
        """`kv`: the sequences' cache format; a quantised one stages each batch's K/V rows in fp16 and encodes
        them into the cache, and (for rotated keys) rotates q once so attention scores in the rotated domain."""
        self.card, self.cfg, self.w, self.max_tokens, self.kv = card, cfg, weights, max_tokens, kv
        self.sparse: SparsePrefill | None = None  # set by the owner when a sparse profile is loaded
        c = cfg
        self.ids = card.alloc(4 * max_tokens, "ids")
        self.positions = card.alloc(4 * 3 * max_tokens, "rope positions")  # [T][3] (t, h, w) of a batch, when given
        self.h = card.alloc(F32 * max_tokens * c.d_model, "h")
        rows = [2 * c.d_ff]
        if c.gdn_layers:
            rows.append(c.ssm_conv_dim + c.ssm_d_inner + 2 * c.ssm_n_v_heads)
        if c.attention_layers:
            rows.append(2 * c.q_dim + 2 * c.kv_dim)
        self.proj = card.alloc(F32 * max_tokens * max(rows), "proj")
        self.q8: dict[int, Q8Activations] = {}
        for width in {c.d_model, c.d_ff, c.ssm_d_inner, c.q_dim}:
            self.q8[width] = alloc_q8_activations(card, width, max_tokens, f"x{width}")
        self.embeds = weights.token_embd is not None
        self.heads = weights.lm_head is not None
        if self.heads:
            self.logits = card.alloc(F32 * MAX_GEMV_TOKENS * c.vocab_size, "logits")  # [row][V]
        if c.gdn_layers:
            self.conv_out = card.alloc(F32 * max_tokens * c.ssm_conv_dim, "gdn.conv_out")
            self.gdn_y = card.alloc(F32 * max_tokens * c.ssm_d_inner, "gdn.y")
            self.gdn_dims = GdnDims.from_config(cfg)
            self.head_done = alloc_head_counters(card, self.gdn_dims, "gdn.head_done", rows=MAX_GEMV_TOKENS)
        if c.attention_layers:
            self.dims = AttnDims(c.n_head, c.n_head_kv, c.head_dim)
            sections = c.rope_sections
            self.rope = RopeArgs(card.upload(Rope(cfg).inv_freq.astype(np.float32), "rope.inv_freq"), c.rope_dims,
                                 sections[1], sections[2])
            self.q_out = card.alloc(F32 * max_tokens * c.q_dim, "attn.q")
            self.decode_splits = decode_splits(card.sm_count, c.n_head_kv)
            self.part_rows = max(self.decode_splits, MAX_PREFILL_SPLITS * max_tokens) * c.n_head
            self.parts = alloc_partials(card, self.part_rows, 1, c.head_dim)
            if kv != F16_FORMAT:
                kernel_format(kv)  # refuses a pair without kernels before anything else is allocated
                self.kv_tables = upload_kv_tables(card)
                stage_bytes = F16 * c.n_head_kv * max_tokens * c.head_dim
                self.stage_k = card.alloc(stage_bytes, "attn.stage_k")
                self.stage_v = card.alloc(stage_bytes, "attn.stage_v")
                self.q_rot = (card.alloc(F32 * max_tokens * c.n_head * domain_width(kv.k, c.head_dim), "attn.q_rot")
                              if kv.k.rotated else None)
        self._rings: dict[int, GdnRing] | None = None  # set during run_verify only
        # `rigllm debug compare`: when set, each block's sub-steps are downloaded into it (eager passes only)
        self.trace: HiddenTrace | None = None
        self._trace_rows: DeviceBuffer | None = None
        self._anywhere = False  # attention splits sized for the capacity (run_verify, run_block)

    # ---- helpers ---------------------------------------------------------------------------------
    def _matmul(self, w: Weight, x: Q8Activations, y: DeviceBuffer, n: int, residual: DeviceBuffer | None = None) -> None:
        matmul(self.card, w, x, y, n, residual=residual)

    def _segment(self, w: Weight, index: int, n: int) -> DeviceBuffer:
        return w.segment_view(self.proj, index, n)

    def _norm(self, x: DeviceBuffer, weight: DeviceBuffer, out: Q8Activations, n: int, then: Weight | None,
              y: DeviceBuffer | None = None) -> None:
        """RMSNorm of n rows of width D into Q8_1 `out` (and fp32 rows `y` when given), for the matmul by `then`
        (whose leading bytes it prefetches into L2; None when no matmul reads `out`)."""
        d = self.cfg.d_model
        grid, threads = norm_shape(n)
        rmsnorm_q8_1(self.card, x, d, weight, n, d, self.cfg.rms_eps, out.xq, out.xd, d, grid, threads, y,
                     prefetch=before_gemv(self.card, then, n))

    def logits_row(self, row: int) -> DeviceBuffer:
        v = self.cfg.vocab_size
        return self.logits.view(F32 * row * v, F32 * v)

    # ---- the pass --------------------------------------------------------------------------------
    def set_batch(self, token_ids: np.ndarray, seq: DeviceSequence) -> None:
        """Write the batch's ids, and the sequence's position and token count, where the kernels read them."""
        n = len(token_ids)
        if not 1 <= n <= self.max_tokens:
            raise ValueError(f"a batch holds 1..{self.max_tokens} tokens, not {n}")
        self.ids.view(0, 4 * n).upload(np.asarray(token_ids, dtype=np.int32))
        seq.set_step(n)

    def run(self, n: int, seq: DeviceSequence, positions: DeviceBuffer | None = None,
            embedded: Sequence[tuple[int, np.ndarray]] = ()) -> None:
        """The pass for the n tokens in `ids` (or hidden rows in `h`) continuing `seq` (at its `step`);
        the last token's logits → row 0 on the card with the head, else the n hidden rows stay in `h`.
        `positions`: the tokens' (t, h, w) rope positions ([n][3] int32, e.g. `self.positions`), None for
        text positions; `embedded`: (first row, fp32 [k][D] rows) that replace those rows' token embeddings."""
        cfg = self.cfg
        self._layers(n, seq, positions, embedded)
        if not self.heads:
            return
        x = self.q8[cfg.d_model]
        last = self.h.view(F32 * (n - 1) * cfg.d_model, F32 * cfg.d_model)
        self._norm(last, self.w.output_norm, x, 1, self.w.lm_head)
        matmul(self.card, self.w.lm_head, x, self.logits, 1)

    def run_verify(self, n: int, seq: DeviceSequence, rings: dict[int, GdnRing], hidden: DeviceBuffer | None) -> None:
        """This card's part of a speculative verify: the n <= 8 tokens in `ids` (a later card: the previous
        card's hidden rows, already in `h`) continuing `seq` (at its `step`); each GDN layer's states after
        tokens 0..n-2 → `rings[layer]`. On the card with the LM head, logits of row t → `logits_row(t)` and
        the final-normed hidden rows → `hidden` ([n][D] fp32, the MTP head's input); on another card the n
        hidden rows stay in `h` for the next."""
        cfg = self.cfg
        if not 1 <= n <= MAX_GEMV_TOKENS:
            raise ValueError(f"a verify runs 1..{MAX_GEMV_TOKENS} tokens, not {n}")
        self._rings, self._anywhere = rings, True
        try:
            self._layers(n, seq, None)  # speculation runs on text positions only
        finally:
            self._rings, self._anywhere = None, False
        if not self.heads:
            return
        x = self.q8[cfg.d_model]
        self._norm(self.h, self.w.output_norm, x, n, self.w.lm_head, y=hidden)
        matmul(self.card, self.w.lm_head, x, self.logits, n)

    def run_block(self, i: int, layer: LayerWeights, n: int, owner: DeviceSequence | tuple[SequenceRows, ...]) -> None:
        """Decoder block i (the MTP block, whose index follows the trunk's) on the n rows in `h`, continuing one
        sequence's cache of that block (or each run's, for runs of several); attention splits are sized for the
        capacity (a graph replays anywhere)."""
        self._anywhere = True
        try:
            self._layer(i, layer, n, owner, None)
        finally:
            self._anywhere = False

    def run_slots(self, n: int, batch: SlotBatch) -> None:
        """One token per row: row b of `ids` (or of `h` on a later card) continues the sequence in slot
        `batch.row_slot[b]`, at that slot's step record and rope position; the logits of row b →
        `logits_row(b)`. The rows' slots are read on the card, so a captured pass serves any set of slots."""
        cfg = self.cfg
        if not 1 <= n <= MAX_GEMV_TOKENS:
            raise ValueError(f"a batched step holds 1..{MAX_GEMV_TOKENS} sequences, not {n}")
        self._layers(n, batch, None)
        if not self.heads:
            return
        x = self.q8[cfg.d_model]
        self._norm(self.h, self.w.output_norm, x, n, self.w.lm_head)
        matmul(self.card, self.w.lm_head, x, self.logits, n)

    def run_sequences(self, runs: Sequence[SequenceRows]) -> None:
        """Each run's tokens continue its own sequence, one after another in `ids` (or hidden rows in `h` on a later
        card): run j's last token's logits → `logits_row(j)` on the card with the head, else the rows stay in `h`.
        Text positions only. Each sequence's `step` must hold its run's start and count (`set_step`). The head runs
        once per run, on one row, as `run` runs it: a K-quant GEMV's order of sums differs between one row and
        several (gemv_kq.cu's pair variants), and a run's logits must not depend on its neighbours."""
        d = self.cfg.d_model
        n = sum(r.count for r in runs)
        if not 1 <= len(runs) <= MAX_GEMV_TOKENS or n > self.max_tokens:
            raise ValueError(f"a pass over several sequences holds 1..{MAX_GEMV_TOKENS} runs and at most "
                             f"{self.max_tokens} rows, not {len(runs)} runs of {n}")
        if not _in_order(runs) or min(r.count for r in runs) < 1:
            raise ValueError("the runs must cover the rows in order, one after another, each at least one row")
        self._layers(n, tuple(runs), None)
        if not self.heads:
            return
        x = self.q8[d]
        for j, r in enumerate(runs):
            self._norm(matrix_rows(self.h, d, r.first + r.count - 1, 1), self.w.output_norm, x, 1, self.w.lm_head)
            matmul(self.card, self.w.lm_head, x, self.logits_row(j), 1)

    def run_verifies(self, runs: Sequence[SequenceRows], hidden: Sequence[DeviceBuffer | None]) -> None:
        """Several slots' speculative verifies in one pass (`run_verify` for each run, the weights read once for all):
        run j's tokens (x_n then its drafts) continue its own sequence, its GDN layers keep their states after each
        row in its `rings`; on the card with the LM head its final-normed rows → `hidden[j]` (the slot's MTP head
        input) and row t of the pass → `logits_row(t)`, else the rows stay in `h`. Each run comes out bit for bit as
        its own verify: every row count up to MAX_GEMV_TOKENS takes the GEMV and the decode-shaped norm, which give
        a row the same bits at any count of two or more, and the mixers launch on the run's rows as its own verify
        would launch them."""
        d = self.cfg.d_model
        n = sum(r.count for r in runs)
        if not 2 <= len(runs) <= n <= MAX_GEMV_TOKENS or len(hidden) != len(runs):
            raise ValueError(f"a verify over several slots holds 2 or more runs of {MAX_GEMV_TOKENS} rows in all, with a "
                             f"hidden buffer each, not {len(runs)} runs of {n} rows and {len(hidden)} buffers")
        if not _in_order(runs) or any(r.count < 2 or r.rings is None for r in runs):
            raise ValueError("the runs must cover the rows in order, each a verify of two or more rows with its rings")
        self._anywhere = True
        try:
            self._layers(n, tuple(runs), None)  # speculation runs on text positions only
        finally:
            self._anywhere = False
        if not self.heads:
            return
        x = self.q8[d]
        for r, out in zip(runs, hidden):  # each run's rows normed alone: the same shape, so the same bits, as together
            self._norm(r.of(self.h, d), self.w.output_norm, x.rows(r.first, r.count), r.count, self.w.lm_head, y=out)
        matmul(self.card, self.w.lm_head, x, self.logits, n)

    def _layers(self, n: int, owner: Owner, positions: DeviceBuffer | None,
                embedded: Sequence[tuple[int, np.ndarray]] = ()) -> None:
        if self.embeds:
            embed(self.card, self.w.token_embd, self.ids, self.h, n)
            for first, block in embedded:  # a synchronous copy: after the embedding it overwrites, before the layers
                matrix_rows(self.h, self.cfg.d_model, first, len(block)).upload(np.asarray(block, np.float32))
        for i, layer in zip(self.w.span, self.w.layers):
            self._layer(i, layer, n, owner, positions)

    def _layer(self, i: int, layer: LayerWeights, n: int, owner: Owner, positions: DeviceBuffer | None) -> None:
        """`owner`: one sequence owning all n rows (at `positions`, or its text positions when None), a slot
        batch whose row b is one token of its own slot's sequence, or runs of rows of several sequences."""
        x = self.q8[self.cfg.d_model]
        traced = self._traced_rows()
        mixer_in = layer.mixer.in_proj if isinstance(layer.mixer, GdnWeights) else layer.mixer.qkv
        self._norm(self.h, layer.mixer.attn_norm, x, n, mixer_in, y=traced)
        self._record(i, "norm", traced, n)
        if isinstance(layer.mixer, GdnWeights):
            self._gdn(i, layer.mixer, x, n, owner)
        else:
            self._attention(i, layer.mixer, x, n, owner, positions)
        self._record(i, "mixer", self.h, n)
        f = layer.ffn
        self._norm(self.h, f.post_attention_norm, x, n, f.gate_up)
        self._matmul(f.gate_up, x, self.proj, n)
        xf = self.q8[self.cfg.d_ff]
        warps = n * self.cfg.d_ff // 32
        prefetch = before_gemv(self.card, f.down, n)
        self.card.kernel("swiglu_q8_1").launch(
            grid_with_prefetch_blocks(self.card, -(-warps * 32 // SWIGLU_THREADS), prefetch), SWIGLU_THREADS,
            self._segment(f.gate_up, 0, n), self._segment(f.gate_up, 1, n), np.int32(self.cfg.d_ff),
            np.int32(self.cfg.d_ff), np.int32(n), None, xf.xq, xf.xd, *prefetch.args(),
        )
        self._matmul(f.down, xf, self.h, n, residual=self.h)
        self._record(i, "ffn", self.h, n)

    def _traced_rows(self) -> DeviceBuffer | None:
        """The fp32 rows the mixer's norm also writes while tracing (None, and no extra write, otherwise)."""
        if self.trace is None:
            return None
        if self._trace_rows is None:
            self._trace_rows = self.card.alloc(F32 * self.max_tokens * self.cfg.d_model, "trace.norm")
        return self._trace_rows

    def _record(self, i: int, step: str, rows: DeviceBuffer | None, n: int) -> None:
        """Download n rows of width D into the trace (waits for the stream: eager passes only)."""
        if self.trace is None or rows is None:
            return
        self.card.stream.synchronize()
        self.trace.record(i, step, rows.download(np.float32, (n, self.cfg.d_model)))

    def _gdn(self, i: int, w: GdnWeights, x: Q8Activations, n: int, owner: Owner) -> None:
        c = self.cfg
        self._matmul(w.in_proj, x, self.proj, n)
        widths = (c.ssm_conv_dim, c.ssm_d_inner, c.ssm_n_v_heads, c.ssm_n_v_heads)
        segments = [self._segment(w.in_proj, s, n) for s in range(4)]
        y = self.q8[c.ssm_d_inner]
        fused_q8 = c.ssm_d_head_v % 32 == 0  # the fused Q8_1 output needs whole 32-blocks per head
        prefetch = before_gemv(self.card, w.out_proj, n)
        if not isinstance(owner, tuple):
            inputs = GdnInputs(*(Rows(seg, width) for seg, width in zip(segments, widths)))
            state, slots = (None, owner.rows(i)) if isinstance(owner, SlotBatch) else (owner.gdn[i], None)
            gdn_mixer(self.card, self.gdn_dims, w, state, inputs, self.conv_out, self.gdn_y, self.head_done, n,
                      c.rms_eps, y_q8=y if fused_q8 else None, ring=self._rings[i] if self._rings is not None else None,
                      slots=slots, prefetch=prefetch)
        else:
            for r in owner:  # each run continues its own state, as its own pass would; the last one prefetches
                inputs = GdnInputs(*(Rows(r.of(seg, width), width) for seg, width in zip(segments, widths)))
                gdn_mixer(self.card, self.gdn_dims, w, r.seq.gdn[i], inputs, r.of(self.conv_out, c.ssm_conv_dim),
                          r.of(self.gdn_y, c.ssm_d_inner), self.head_done, r.count, c.rms_eps,
                          y_q8=y.rows(r.first, r.count) if fused_q8 else None,
                          ring=None if r.rings is None else r.rings[i],
                          prefetch=prefetch if r is owner[-1] else NO_PREFETCH)
        if not fused_q8:
            quantize_q8_1(self.card, self.gdn_y, y, n)
        self._matmul(w.out_proj, y, self.h, n, residual=self.h)

    def _attention(self, i: int, w: AttentionWeights, x: Q8Activations, n: int, owner: Owner,
                   positions: DeviceBuffer | None) -> None:
        c = self.cfg
        self._matmul(w.qkv, x, self.proj, n)
        qg, k, v = (self._segment(w.qkv, s, n) for s in range(3))
        xo = self.q8[c.q_dim]
        if isinstance(owner, SlotBatch):
            self._merge(n, self._attend_slots(i, owner, w, qg, k, v, n), qg, xo)
        elif not isinstance(owner, tuple):
            splits = self._attend(owner, owner.kv[i], w, qg, k, v, n, positions,
                                  layer=None if self._anywhere else i)  # a graph-captured verify never goes sparse
            self._merge(n, splits, qg, xo)
        else:
            for r in owner:  # each run attends over its own cache; the partials are reused run after run
                q_run = r.of(qg, 2 * c.q_dim)
                splits = self._attend(r.seq, r.seq.kv[i], w, q_run, r.of(k, c.kv_dim), r.of(v, c.kv_dim), r.count,
                                      None, layer=None if self._anywhere else i)
                self._merge(r.count, splits, q_run, xo.rows(r.first, r.count))
        self._matmul(w.out_proj, xo, self.h, n, residual=self.h)

    def _merge(self, n: int, splits: int, qg: DeviceBuffer, xo: Q8Activations) -> None:
        """The n rows' split partials merged and gated (the gate: each q row's second half) into Q8_1 `xo`."""
        c = self.cfg
        attn_merge_gate(self.card, self.dims, self.parts, n, splits,
                        qg.view(F32 * c.head_dim, qg.nbytes - F32 * c.head_dim), 2 * c.q_dim, 2 * c.head_dim, None,
                        xo.xq, xo.xd)

    def _attend(self, seq: DeviceSequence, cache: KVLayerCache, w: AttentionWeights, qg: DeviceBuffer,
                k: DeviceBuffer, v: DeviceBuffer, n: int, positions: DeviceBuffer | None,
                layer: int | None = None) -> int:
        """Attention of one sequence's n tokens into the split partials, whose count it returns: prep (norms,
        RoPE at `positions` or the text positions, KV append), flash attention over its cache. `layer` picks
        the sparse profile's patterns for a prefill chunk (`self.sparse`, whose grids are sized on the host,
        so never inside a captured graph); None (or no profile) is dense."""
        c, card, dims = self.cfg, self.card, self.dims
        quantised = self.kv != F16_FORMAT
        k_dst, v_dst = (self.stage_k, self.stage_v) if quantised else (cache.k.codes, cache.v.codes)
        attn_prep(card, dims, qg, 2 * c.q_dim, k, c.kv_dim, v, c.kv_dim, w.q_norm, w.k_norm, self.rope, positions,
                  seq.step, self.q_out, k_dst, v_dst, n, seq.capacity, c.rms_eps,
                  stage_rows=self.max_tokens if quantised else 0, prefetch=before_gemv(card, w.out_proj, n))
        sparse = layer is not None and self.sparse is not None and self.sparse.applies(layer, seq.next_position, n)
        few = n <= MAX_GEMV_TOKENS and not sparse  # decode kernels, a token each: see _attention_splits
        splits = self._attention_splits(n, few, seq.capacity if self._anywhere else seq.next_position + n)
        if not quantised:
            if few:
                attn_decode_f16(card, dims, self.q_out, k_dst, v_dst, seq.step, self.parts, seq.capacity, splits, n)
            elif sparse:
                self.sparse.attend(layer, self.q_out, cache, seq.step, self.parts, seq.next_position, n, splits)
            else:
                attn_prefill_f16(card, dims, self.q_out, k_dst, v_dst, seq.step, self.parts, n, seq.capacity, splits)
        else:
            for side, staged in ((cache.k, self.stage_k), (cache.v, self.stage_v)):
                kv_encode(card, side, staged, self.max_tokens, seq.step, n, c.n_head_kv, c.head_dim, seq.capacity,
                          self.kv_tables)
            q = self.q_out
            if self.q_rot is not None:
                rotate_q(card, self.q_out, self.q_rot, n * c.n_head, c.head_dim, self.kv_tables)
                q = self.q_rot
            if few:
                kv_decode(card, dims, q, cache, seq.step, self.parts, splits, self.kv_tables, n)
            elif sparse:
                self.sparse.attend(layer, q, cache, seq.step, self.parts, seq.next_position, n, splits, self.kv_tables)
            else:
                kv_prefill(card, dims, q, cache, seq.step, self.parts, n, splits, self.kv_tables)
        return splits

    def _attend_slots(self, i: int, batch: SlotBatch, w: AttentionWeights, qg: DeviceBuffer, k: DeviceBuffer,
                      v: DeviceBuffer, n: int) -> int:
        """`_attend` of layer i for a slot batch: row b is one decode token of slot row_slot[b] (slot-indexed
        launches: each row appends to and attends over its own slot's cache)."""
        c, card, dims = self.cfg, self.card, self.dims
        slots, like = batch.rows(i), batch.like.kv[i]  # any slot's cache: the format and capacity
        quantised = self.kv != F16_FORMAT
        stage = (self.stage_k, self.stage_v) if quantised else (None, None)
        attn_prep(card, dims, qg, 2 * c.q_dim, k, c.kv_dim, v, c.kv_dim, w.q_norm, w.k_norm, self.rope, batch.rope,
                  batch.steps, self.q_out, *stage, n, like.capacity, c.rms_eps,
                  stage_rows=self.max_tokens if quantised else 0, slots=slots,
                  prefetch=before_gemv(card, w.out_proj, n))
        splits = self._attention_splits(n, True, like.capacity)
        if not quantised:
            attn_decode_f16(card, dims, self.q_out, None, None, batch.steps, self.parts, like.capacity, splits, n,
                            slots=slots)
        else:
            for value_side, (side, staged) in enumerate(((like.k, self.stage_k), (like.v, self.stage_v))):
                kv_encode(card, side, staged, self.max_tokens, batch.steps, n, c.n_head_kv, c.head_dim, like.capacity,
                          self.kv_tables, slots=side_rows(slots, bool(value_side)))
            q = self.q_out
            if self.q_rot is not None:
                rotate_q(card, self.q_out, self.q_rot, n * c.n_head, c.head_dim, self.kv_tables)
                q = self.q_rot
            kv_decode(card, dims, q, like, batch.steps, self.parts, splits, self.kv_tables, n, slots=slots)
        return splits

    def _attention_splits(self, n: int, few: bool, kv_len: int) -> int:
        """Context splits of one attention launch. A few tokens (decode steps, speculative verifies, the MTP
        head's rows) take the decode kernel with the decode split count, as many as the partials hold: the
        prefill kernel's 64-row query tiles would sit mostly empty and its few splits leave the card idle (a
        2-token verify spent 71 µs per layer there against 15 µs for a decode step, H200 9B at depth 512).
        Longer chunks take the prefill kernel's rule for `kv_len` keys (a graph-captured call passes the
        capacity: it replays at any depth)."""
        if few:
            return max(1, min(self.decode_splits, self.part_rows // (n * self.cfg.n_head)))
        return prefill_splits(self.card.sm_count, n, self.dims, kv_len)


def _in_order(runs: Sequence[SequenceRows]) -> bool:
    """Do the runs cover a pass's rows in order, each starting where the one before ends?"""
    return [r.first for r in runs] == [sum(r.count for r in runs[:j]) for j in range(len(runs))]


def matrix_rows(buf: DeviceBuffer, width: int, first: int, count: int) -> DeviceBuffer:
    """Rows [first, first + count) of a [T][width] fp32 matrix."""
    return buf.view(F32 * first * width, F32 * count * width)
