"""`rigllm bench --sparse-sweep`: long-prompt prefill tokens/s, dense against sparse, estimated from sampled chunks.

A real 256K-token prefill of the 9B takes ~280 s on the H200, too long for a 30-minute GPU session, so
prompts are not run whole. Method (stated in the JSON as `method`):
1. Whole-model chunks (all layers, the real kernels, `chunk` tokens, timed with CUDA events around
   `SlotDecoder.prefill_part`, best of `reps`) at sampled depths: the sequence's position is set to the
   depth without prefilling (as bench.decode_speed does); the values in the cache do not change dense
   speed, nor sparse speed at a fixed pattern.
2. A prompt of L tokens is chunks at depths 0, chunk, ..., L - chunk; its time is the sum of the chunk
   times, each interpolated linearly between the sampled depths (np.interp). Dense attention's cost is
   affine in the depth, so the interpolation is exact up to timing noise; the sparse pattern below has a
   fixed cost past its window, and below the profile's minimum length the sparse path is the dense one
   (the dense samples are used there).
Synthetic weights cannot be calibrated, so speed uses a fixed profile: every head of every attention
layer A-shape, sink 1 block + window 32 blocks (64 + 2048 tokens), from `SPARSE_MIN_LENGTH` tokens on
(qengine's winning pattern, anchor-qengine.md §2.6). Sparse and dense run on the same decoder (the same
weights and cache), with the profile switched on and off, in every KV format asked for (f16 always;
k3v3 is the 256K case; A-shape is what the quantised sparse kernel serves).

Output error (fp16 cache only): after the sparse chunk at each depth, the last attention layer's attention output for that
chunk (its q, and its cache holding random fp16 K/V rows below the depth plus the chunk's own rows) is
computed by the dense and by the sparse kernels, merged with a constant gate; `attention_rel_error` is
‖y_sparse − y_dense‖ / ‖y_dense‖. Random weights and random cache rows: the attention is diffuse, so this
error is an upper-end illustration of what the pattern drops, not a quality number (trained models and
`rigllm calibrate-sparse` give those).

Cross-check: whole-prompt measurements taken earlier on the H200 (`WHOLE_PROMPT_MEASURED`) are set beside
the estimate for the same shape, format and length.
"""

from __future__ import annotations

import gc
import math
from typing import Any

import numpy as np

from engine.cuda.attention_kernels import attn_merge_gate, attn_prefill_f16, prefill_splits
from engine.cuda.driver import CudaCard, DeviceBuffer
from engine.cuda.sequence import DeviceSequence
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.sparse_attention import BLOCK
from engine.cuda.weights import ModelWeights
from engine.model.kv_formats import kv_format
from engine.gguf.config import ModelConfig
from engine.reference.sparse_attention import Pattern
from engine.sparse.profile import HeadChoice, SparseProfile

SPARSE_PATTERN = Pattern("a_shape", sink=1, window=32)
SPARSE_MIN_LENGTH = 4096
CROSS_CHECK_LENGTH = 18432
WHOLE_PROMPT_MEASURED = {  # (shape, kv format, prompt tokens) → tokens/s of a whole prefill, H200
    ("9b", "f16", 18432): 3771.0,
    ("9b", "k3v3", 262144): 944.0,
}
FILL_TILE = 4096  # random cache rows uploaded once and repeated down the cache
F32 = 4


def fixed_profile(cfg: ModelConfig) -> SparseProfile:
    """SPARSE_PATTERN on every head of every attention layer (error and density unknown: not calibrated)."""
    heads = [HeadChoice(SPARSE_PATTERN, math.nan, math.nan)] * cfg.n_head
    return SparseProfile("synthetic", BLOCK, SPARSE_MIN_LENGTH, math.nan, 0, {i: heads for i in cfg.attention_layers})


def first_sparse_depth(chunk: int) -> int:
    """Depth of the first chunk the profile makes sparse (SparsePrefill.applies: pos + n >= min_length)."""
    return max(0, -(-(SPARSE_MIN_LENGTH - chunk) // chunk) * chunk)


def sample_depths(lengths: tuple[int, ...], chunk: int) -> list[int]:
    """Chunk depths to time: 0, the last dense and first sparse chunk, 16K, and every requested prompt's
    (and the cross-check's) last chunk, each rounded down to a chunk boundary, sorted and unique."""
    first = first_sparse_depth(chunk)
    points = {0, first - chunk, first, 16384, CROSS_CHECK_LENGTH - chunk} | {n - chunk for n in lengths}
    return sorted({max(0, p // chunk * chunk) for p in points})


def prompt_seconds(samples: dict[int, float], length: int, chunk: int) -> float:
    """Estimated prefill time of `length` tokens: per-chunk times (ms) interpolated over the sampled depths."""
    depths = np.array(sorted(samples), np.float64)
    ms = np.array([samples[d] for d in sorted(samples)], np.float64)
    starts = np.arange(0, length, chunk, dtype=np.float64)
    return float(np.interp(starts, depths, ms).sum()) * 1e-3


def time_chunk(dec: SlotDecoder, seq: DeviceSequence, depth: int, ids: np.ndarray, reps: int) -> float:
    """Best of `reps` whole-model chunks of len(ids) tokens at `depth`, in ms."""
    card, best = dec.card, math.inf
    for _ in range(reps):
        seq.next_position = depth
        card.synchronize()
        start, end = card.event(), card.event()
        start.record()
        dec.prefill_part(seq, ids)
        end.record()
        best = min(best, end.elapsed_ms(start))
    return best


def fill_random_rows(card: CudaCard, seq: DeviceSequence, layer: int, rows: int, seed: int) -> None:
    """Random fp16 K and V (standard normal, the scale of normed keys) in cache rows [0, rows) of `layer`,
    a FILL_TILE-row random block repeated (device copies: filling 256K rows from the host would take seconds)."""
    cache, rng = seq.kv[layer], np.random.default_rng(seed)
    row_bytes = 2 * cache.head_dim
    for plane in (cache.k.codes, cache.v.codes):
        tile = card.upload(rng.standard_normal((FILL_TILE, cache.head_dim)).astype(np.float16), "sparse bench tile")
        for h in range(cache.n_head_kv):
            for r0 in range(0, rows, FILL_TILE):
                n = min(FILL_TILE, rows - r0)
                plane.view((h * cache.capacity + r0) * row_bytes, n * row_bytes).copy_from(tile, n * row_bytes)
        tile.free()


def attention_error(dec: SlotDecoder, seq: DeviceSequence, layer: int, depth: int, n: int, y: DeviceBuffer,
                    gate: DeviceBuffer) -> float:
    """Relative L2 error of the sparse against the dense attention output of the chunk just run (module doc)."""
    fwd, card = dec.fwd, dec.card
    assert fwd.sparse is not None
    dims, cache = fwd.dims, seq.kv[layer]
    seq.step.upload(np.array([depth, n], np.int32))
    splits = prefill_splits(card.sm_count, n, dims, depth + n)
    width = dims.n_head * dims.head_dim
    outs = []
    for sparse in (False, True):
        if sparse:
            fwd.sparse.attend(layer, fwd.q_out, cache, seq.step, fwd.parts, depth, n, splits)
        else:
            attn_prefill_f16(card, dims, fwd.q_out, cache.k.codes, cache.v.codes, seq.step, fwd.parts, n,
                             seq.capacity, splits)
        attn_merge_gate(card, dims, fwd.parts, n, splits, gate, width, dims.head_dim, y)
        outs.append(y.download(np.float32, (n, width)).astype(np.float64))
    dense, sparse_out = outs
    norm = np.linalg.norm(dense)
    return float(np.linalg.norm(sparse_out - dense) / norm) if norm > 0 else math.nan  # all-zero: undefined


def sparse_sweep(card: CudaCard, cfg: ModelConfig, weights: ModelWeights, shape: str, lengths: tuple[int, ...],
                 dense_formats: tuple[str, ...] = ("f16", "k3v3"), chunk: int = 256, reps: int = 2) -> dict[str, Any]:
    """Chunk times at sampled depths and the prompt estimates, dense and sparse per KV format."""
    capacity = max(*lengths, CROSS_CHECK_LENGTH)
    depths = sample_depths(lengths, chunk)
    ids = np.random.default_rng(7).integers(0, cfg.vocab_size, chunk).astype(np.int32)
    layer = cfg.attention_layers[-1]
    samples: dict[str, dict[int, float]] = {}
    errors: dict[int, float] = {}
    for fmt in dict.fromkeys(("f16", *dense_formats)):
        dec = SlotDecoder(card, cfg, weights, capacity, 1, chunk, kv_format(fmt), sparse=fixed_profile(cfg))
        seq, profile_on = dec.seqs[0], dec.fwd.sparse
        time_chunk(dec, seq, 0, ids, 1)  # loads every dense prefill kernel before anything is timed
        dec.fwd.sparse = None
        dense = samples[f"dense {fmt}"] = {d: time_chunk(dec, seq, d, ids, reps) for d in depths}
        dec.fwd.sparse = profile_on
        time_chunk(dec, seq, first_sparse_depth(chunk), ids, 1)  # loads the sparse kernels, untimed
        measure = fmt == "f16"  # the error is measured on the fp16 cache (random rows written directly)
        if measure:
            fill_random_rows(card, seq, layer, capacity, seed=1)
            width = cfg.n_head * cfg.head_dim
            y = card.alloc(F32 * chunk * width, "sparse bench y")
            gate = card.alloc(F32 * chunk * width, "sparse bench gate")
            gate.fill_zero()
        sparse_ms = {}
        for d in (d for d in depths if d >= first_sparse_depth(chunk)):
            sparse_ms[d] = time_chunk(dec, seq, d, ids, reps)
            if measure:
                errors[d] = attention_error(dec, seq, layer, d, chunk, y, gate)
        if measure:
            y.free()
            gate.free()
        # below the minimum length the sparse path is the dense one
        samples[f"sparse {fmt}"] = dict(sorted({**{d: t for d, t in dense.items() if d not in sparse_ms},
                                                **sparse_ms}.items()))
        for buf in seq.buffers():
            buf.free()
        del dec, seq
        gc.collect()
    estimate_lengths = sorted(set(lengths) | {CROSS_CHECK_LENGTH})
    tps = {name: {n: n / prompt_seconds(s, n, chunk) for n in estimate_lengths} for name, s in samples.items()}
    cross = [{"shape": s, "kv": f, "tokens": n, "measured_whole_prompt_tokens_per_s": v,
              "estimated_tokens_per_s": tps.get(f"dense {f}", {}).get(n)}
             for (s, f, n), v in WHOLE_PROMPT_MEASURED.items() if s == shape]
    return {
        "method": "whole-model chunks timed at sampled depths (position set without prefilling, best of reps), "
                  "prompt time = sum over its chunks of the chunk time interpolated linearly in depth",
        "chunk": chunk, "reps": reps, "capacity": capacity, "sampled_depths": depths,
        "sparse_profile": {"pattern": SPARSE_PATTERN.label, "sink_tokens": SPARSE_PATTERN.sink * BLOCK,
                           "window_tokens": SPARSE_PATTERN.window * BLOCK, "min_length": SPARSE_MIN_LENGTH,
                           "layers": "every attention layer, every head"},
        "chunk_ms": samples,
        "prefill_tokens_per_s": tps,
        "sparse_speedup_vs_dense": {f: {n: tps[f"sparse {f}"][n] / tps[f"dense {f}"][n] for n in estimate_lengths}
                                    for f in dict.fromkeys(("f16", *dense_formats))},
        "attention_rel_error": {"layer": layer, "data": "random weights, random fp16 cache rows (not a quality "
                                "number)", "by_depth": errors},
        "cross_check": cross,
    }


def render_sparse_sweep(r: dict[str, Any]) -> str:
    """The short table printed after the JSON: estimated prefill tokens/s per prompt length."""
    names = list(r["prefill_tokens_per_s"])
    lengths = list(r["prefill_tokens_per_s"][names[0]])
    speedups = r["sparse_speedup_vs_dense"]
    lines = ["prompt   " + "   ".join(f"{n:>12}" for n in names) + "   " +
             "   ".join(f"{'x ' + f:>8}" for f in speedups)]
    for n in lengths:
        cells = "   ".join(f"{r['prefill_tokens_per_s'][name][n]:>12.0f}" for name in names)
        lines.append(f"{n:>6}   {cells}   " + "   ".join(f"{s[n]:>8.2f}" for s in speedups.values()))
    errs = ", ".join(f"{d}: {e:.3f}" for d, e in r["attention_rel_error"]["by_depth"].items())
    lines.append(f"sparse attention rel error by depth (f16 cache, random data): {errs}")
    for c in (c for c in r["cross_check"] if c["estimated_tokens_per_s"] is not None):
        lines.append(f"cross-check {c['shape']} {c['kv']} {c['tokens']}: whole prompt "
                     f"{c['measured_whole_prompt_tokens_per_s']:.0f} t/s measured, "
                     f"{c['estimated_tokens_per_s']:.0f} t/s estimated here")
    return "\n".join(lines)
