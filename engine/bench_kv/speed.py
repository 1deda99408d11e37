"""Attention speed per KV format at depth, one layer on one GPU: `python -m engine.bench_kv.speed --out FILE`.

For each model shape (9B: 16 query / 4 KV heads, 27B: 24 / 4, head width 256) and context depth, one
layer's cache is allocated at the depth and filled with random bytes (valid codes, norms and scales
1.0: values do not change the speed), the position is set to depth - 1, and the decode attention
step (q rotation when keys are rotated, split-K decode, merge + gate) is replayed as a CUDA graph.
The decode is also timed with 2x and 4x forward.py's split count (`decode_us_by_splits`), since it is
latency-bound at 3 blocks per SM. Also timed: one 512-token prefill chunk at the same depth (encode of
the chunk's rows, rotation, prefill attention, merge). The f16 cache (attention.cu) is the baseline. Reported: µs per layer,
the KV bytes the decode step reads and the resulting read bandwidth, and the attention time per
decode token for all attention layers of the model (9B: 8, 27B: 16), which adds to the weight-bound
rest of the step. Kernel-level numbers; the model-level decode speed comes from `rigllm bench` once
forward.py runs these kernels.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import numpy as np

from engine.cuda.attention_kernels import (
    AttnDims,
    alloc_partials,
    attn_decode_f16,
    attn_merge_gate,
    attn_prefill_f16,
    decode_splits,
    kv_decode,
    kv_encode,
    kv_prefill,
    prefill_splits,
    rotate_q,
)
from engine.cuda.driver import CudaCard
from engine.cuda.kv_cache import alloc_kv_layer, domain_width, upload_kv_tables
from engine.cuda.bench.microbench import time_graph_ms
from engine.model.kv_formats import kv_format

SHAPES = {"9b": (AttnDims(16, 4, 256), 8), "27b": (AttnDims(24, 4, 256), 16)}
FORMATS = ("f16", "k8v8", "k8v4", "k8v3", "k4v4", "k3v3")
CHUNK = 512
SPLIT_FACTORS = (6, 12)  # decode splits = factor * SMs / n_head_kv, besides the default 3
F32 = 4


def _fill_random(card: CudaCard, cache, rng: np.random.Generator) -> None:
    for side in (cache.k, cache.v):
        if side.side is None:  # fp16 values
            side.codes.upload(rng.standard_normal(side.codes.nbytes // 2).astype(np.float16))
        else:
            side.codes.upload(rng.integers(0, 256, side.codes.nbytes, dtype=np.uint8))
            side.side.upload(np.ones(side.side.nbytes // 2, np.float16))


def bench_layer(card: CudaCard, tables, fmt_name: str, dims: AttnDims, depth: int, reps: int) -> dict[str, Any]:
    """Decode and prefill-chunk time of one layer at `depth` tokens."""
    rng = np.random.default_rng(0)
    fmt = kv_format(fmt_name)
    capacity = depth + CHUNK
    cache = alloc_kv_layer(card, fmt, dims.n_head_kv, dims.head_dim, capacity, f"bench.{fmt_name}")
    _fill_random(card, cache, rng)
    step = card.upload(np.array([depth - 1, 1], np.int32), "bench.step")
    width = domain_width(fmt.k, dims.head_dim)
    q = card.upload(rng.standard_normal((CHUNK, dims.n_head, dims.head_dim)).astype(np.float32), "bench.q")
    q_rot = card.alloc(CHUNK * dims.n_head * width * F32, "bench.qrot")
    gate = card.upload(rng.standard_normal((CHUNK, dims.n_head * dims.head_dim)).astype(np.float32), "bench.gate")
    y = card.alloc(CHUNK * dims.n_head * dims.head_dim * F32, "bench.y")
    staging = card.upload(rng.standard_normal((dims.n_head_kv, CHUNK, dims.head_dim)).astype(np.float16), "bench.stage")
    d_splits = decode_splits(card.sm_count, dims.n_head_kv)
    p_splits = prefill_splits(card.sm_count, CHUNK, dims, depth + CHUNK)
    parts = alloc_partials(card, CHUNK * dims.n_head, max(max(SPLIT_FACTORS) * d_splits // 3, p_splits), dims.head_dim,
                           "bench")
    f16 = fmt_name == "f16"

    def attend(n_tok: int, splits: int, decode: bool) -> None:
        q_dom = q
        if fmt.k.rotated:
            rotate_q(card, q, q_rot, n_tok * dims.n_head, dims.head_dim, tables)
            q_dom = q_rot
        if f16 and decode:
            attn_decode_f16(card, dims, q, cache.k.codes, cache.v.codes, step, parts, capacity, splits)
        elif f16:
            attn_prefill_f16(card, dims, q, cache.k.codes, cache.v.codes, step, parts, n_tok, capacity, splits)
        elif decode:
            kv_decode(card, dims, q_dom, cache, step, parts, splits, tables)
        else:
            kv_prefill(card, dims, q_dom, cache, step, parts, n_tok, splits, tables)
        attn_merge_gate(card, dims, parts, n_tok, splits, gate, dims.n_head * dims.head_dim, dims.head_dim, y)

    def prefill_chunk(_: int) -> None:
        if not f16:
            for side in (cache.k, cache.v):
                kv_encode(card, side, staging, CHUNK, step, CHUNK, dims.n_head_kv, dims.head_dim, capacity, tables)
        attend(CHUNK, p_splits, decode=False)

    decode_ms = time_graph_ms(card, reps, lambda _: attend(1, d_splits, decode=True))
    by_splits = {}
    for factor in SPLIT_FACTORS:  # more blocks than forward.py's 3 per SM: does the latency-bound decode gain?
        splits = factor * d_splits // 3
        by_splits[splits] = 1000 * time_graph_ms(card, reps, lambda _: attend(1, splits, decode=True))
    step.upload(np.array([depth, CHUNK], np.int32))
    prefill_ms = time_graph_ms(card, max(2, reps // 20), prefill_chunk)
    kv_bytes = depth * dims.n_head_kv * (fmt.k.vector_bytes(dims.head_dim) + fmt.v.vector_bytes(dims.head_dim))
    for buf in cache.buffers() + [q, q_rot, gate, y, staging, step, parts.m, parts.l, parts.o]:
        buf.free()
    return {
        "decode_us": 1000 * decode_ms,
        "decode_kv_bytes": kv_bytes,
        "decode_read_gbps": kv_bytes / (decode_ms * 1e-3) / 1e9,
        "decode_splits": d_splits,
        "decode_us_by_splits": by_splits,
        "prefill_chunk_us": 1000 * prefill_ms,
        "prefill_tokens_per_s_per_layer": CHUNK / (prefill_ms * 1e-3),
    }


def run(depths: list[int], reps: int, shapes: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"chunk": CHUNK, "results": []}
    with CudaCard(0, name="bench-kv") as card:
        out["device"] = card.name
        out["sm_count"] = card.sm_count
        tables = upload_kv_tables(card)
        for shape in shapes:
            dims, n_attn = SHAPES[shape]
            for depth in depths:
                for fmt_name in FORMATS:
                    r = bench_layer(card, tables, fmt_name, dims, depth, reps)
                    r.update(shape=shape, depth=depth, format=fmt_name, attention_layers=n_attn,
                             decode_attention_ms_per_token=n_attn * r["decode_us"] / 1000)
                    out["results"].append(r)
                    print(f"{shape:>4} depth {depth:>6} {fmt_name:>5}: decode {r['decode_us']:8.1f} us/layer "
                          f"({r['decode_read_gbps']:6.0f} GB/s of KV), "
                          f"{r['decode_attention_ms_per_token']:6.2f} ms/token "
                          f"over {n_attn} layers; prefill chunk {r['prefill_chunk_us']:9.1f} us/layer; decode by splits "
                          + " ".join(f"{k}:{v:.1f}" for k, v in r["decode_us_by_splits"].items()), flush=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--depths", default="32768,131072", help="comma-separated context depths")
    parser.add_argument("--shapes", default="9b,27b")
    parser.add_argument("--reps", type=int, default=50, help="graph-replayed decode steps per measurement")
    parser.add_argument("--out", default=None, help="write the JSON here")
    args = parser.parse_args(argv)
    result = run([int(d) for d in args.depths.split(",")], args.reps, args.shapes.split(","))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
