"""`rigllm bench`: prefill and decode speed of one model on one card, as fractions of measured ceilings.

Everything is measured in one run on the same card: the ceilings (device copy, DP4A peak, the GEMV's
read bandwidth on the LM head, the largest matrix — the read ceiling contracts.md asks decode to be
compared with), then prefill at several prompt lengths (real chunked prefill, timed with CUDA events
around the whole chunk loop, Python launch cost included), then decode at several depths (the
captured decode graph replayed token by token through `SlotDecoder.step`, writing the token and
position and reading back the token id, exactly as generation does; the KV cache is filled to the
depth without prefilling it, because its values do not change the speed), then aggregate decode
tokens/s with 1, 2, 4 and 8 streams decoding together (continuous batching: one batched step per
token of every stream), a burst of prompts arriving together prefilled alone against shared passes
(engine/cuda/bench/arrivals.py), where a prefill chunk's time goes per kernel (engine/cuda/bench/prefill_breakdown.py:
the GEMMs' DP4A fraction inside the real prefill), and what logprobs, logit_bias and grammar masks add to a
step and move over PCIe (engine/cuda/bench/constrained_steps.py).

CMP 100-210 projections (anchor-qengine.md §6): decode = the fraction of the H200 read ceiling
reached, applied to the CMP's 818 GB/s measured read bandwidth, over the same bytes per token;
prefill = the H200 time scaled by the ratio of DP4A peaks (measured here / 17.2 TOPS), i.e. assuming
the prefill is compute-bound on DP4A and fp32 FMA alike (their H200/CMP ratios are 7.7 and ~6.8).
These are projections, not measurements, and are labelled so in the output. A second decode projection
takes each kernel of the step by what bounds it (engine/cuda/bench/cmp_model.py: bandwidth-bound kernels
at their fraction of 818 GB/s, latency-bound ones at clock-scaled time). The step's floor under its launch
structure (engine/cuda/bench/decode_bounds.py: each GEMV's measured fixed cost, each other launch at an empty
graph node) is set beside the measured step and the 80% target.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from engine.cuda.driver import CudaCard
from gguf import GGMLQuantizationType

from engine.cuda.bench.arrivals import arrival_prefill, render_arrivals
from engine.cuda.bench.constrained_steps import constrained_step_costs, render_constrained
from engine.cuda.bench.slot_depth import slots_at_depth
from engine.cuda.bench.cmp_model import CMP_READ_GBPS, project_step, render_projection, state_bytes
from engine.cuda.bench.decode_bounds import decode_bounds, render_bounds
from engine.cuda.bench.microbench import run_microbench, time_graph_ms
from engine.cuda.bench.norm_shapes import norm_shapes, render_norm_shapes
from engine.cuda.bench.prefill_breakdown import prefill_breakdown, render_prefill_breakdown
from engine.cuda.bench.profile import kernel_breakdown
from engine.cuda.bench.synthetic_weights import random_kq_weight, random_q8_weight
from engine.cuda.gemm import DEFAULT_GEMM_STAGING, GEMM_STAGINGS, gemm_q8
from engine.cuda.gemv import Q8Weight, alloc_q8_activations
from engine.cuda.kq_weight import KQWeight, gemm_kq
from engine.cuda.matmul import MixedWeight
from engine.cuda.slot_decoder import MAX_SLOTS, SlotDecoder, step_launches
from engine.cuda.weights import GdnWeights, ModelWeights
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotBackend, SlotRequest
from engine.gguf.config import ModelConfig

CMP_DP4A_TOPS = 17.2
QENGINE = {  # anchor-qengine.md §0, measured by qengine on CMP 100-210 cards
    "9b": {"decode_tps_plain": 60.0, "decode_tps_mtp": 70.4, "prefill_tps": {297: 594, 1160: 683, 4620: 584, 18400: 393}},
    "27b": {"decode_tps_plain_3cards": 22.0, "decode_tps_mtp_3cards": 27.1, "prefill_tps_3cards": {297: 212, 1160: 264, 4620: 268, 18400: 203}},
}


GREEDY = SamplingParams(temperature=0.0)

def q8_bytes(rows: int, k: int) -> int:
    return rows * k + 2 * rows * (k // 32)


def kquant_types_of(weights: ModelWeights) -> set:
    """The K-quant types among the model's matrices (for the GEMM measurements)."""
    found = set()
    for m in _matrices(weights):
        for run in (m.runs if isinstance(m, MixedWeight) else (m,)):
            if isinstance(run, KQWeight):
                found.add(run.qtype)
    return found


def _matrices(weights: ModelWeights) -> list:
    out = [weights.lm_head] if weights.lm_head is not None else []
    for layer in weights.layers:
        mixer = layer.mixer
        out += [mixer.in_proj, mixer.out_proj] if isinstance(mixer, GdnWeights) else [mixer.qkv, mixer.out_proj]
        out += [layer.ffn.gate_up, layer.ffn.down]
    return out


def matrix_read_bytes(weights: ModelWeights, cfg: ModelConfig) -> int:
    """Weight bytes one decode token reads from `weights` as stored on the card (any mix of Q8_0 and K-quant
    matrices): every trunk matrix, the LM head and one embedding row."""
    total = sum(m.nbytes for m in _matrices(weights))
    if weights.token_embd is not None:
        total += weights.token_embd.nbytes // cfg.vocab_size
    return total


def decode_bytes(cfg: ModelConfig, depth: int, weights: ModelWeights | None = None) -> int:
    """Bytes one decode token reads: every trunk weight but the embedding table (one row), the LM head,
    the GDN state (read and written), and the fp16 KV cache up to `depth`. Weights are counted as Q8_0 of
    the shape, or as the matrices of `weights` hold them when given (K-quant models)."""
    c = cfg
    state = sum(state_bytes(c, depth).values())
    if weights is not None:
        return state + matrix_read_bytes(weights, cfg)
    per_gdn = q8_bytes(c.ssm_conv_dim + c.ssm_d_inner + 2 * c.ssm_n_v_heads, c.d_model) + q8_bytes(c.d_model, c.ssm_d_inner)
    per_attn = q8_bytes(2 * c.q_dim + 2 * c.kv_dim, c.d_model) + q8_bytes(c.d_model, c.q_dim)
    ffn = q8_bytes(2 * c.d_ff, c.d_model) + q8_bytes(c.d_model, c.d_ff)
    return (state + len(c.gdn_layers) * per_gdn + len(c.attention_layers) * per_attn + c.n_layers * ffn
            + q8_bytes(c.vocab_size, c.d_model) + q8_bytes(1, c.d_model))


def prefill_speed(dec: SlotDecoder, n_tokens: int) -> float:
    """Tokens per second of a fresh prefill of n_tokens random ids into slot 0, in chunks."""
    ids = np.random.default_rng(n_tokens).integers(0, dec.config.vocab_size, n_tokens).astype(np.int32)
    dec.reset_slot(0)
    card = dec.card
    card.synchronize()
    start, end = card.event(), card.event()
    start.record()
    dec.prefill_slot(0, ids)
    end.record()
    end.synchronize()
    return n_tokens / (end.elapsed_ms(start) * 1e-3)


def decode_speed(dec: SlotDecoder, streams: int, depth: int, steps: int, params: SamplingParams = GREEDY) -> float:
    """Aggregate tokens per second of `steps` graph-replayed steps of slots 0..streams-1 at `depth` (greedy
    unless `params` say otherwise)."""
    with slots_at_depth(dec, streams, depth):
        return slot_decode_speed(dec, streams, steps, params)


def slot_decode_speed(slots: SlotBackend, streams: int, steps: int, params: SamplingParams = GREEDY) -> float:
    """Aggregate tokens per second of `steps` steps (greedy unless `params` say otherwise) of slots
    0..streams-1 of any slot backend (one card or a pipeline), whose slots hold their context already; the
    first step, untimed, captures the graphs."""
    request = SlotRequest(params, ())
    for slot in range(streams):
        slots.begin(slot, request)
    feeds = {slot: 1 for slot in range(streams)}
    slots.step(feeds)
    t0 = time.perf_counter()
    for _ in range(steps):
        feeds = {slot: max(p.token, 0) for slot, p in slots.step(feeds).items()}
    return streams * steps / (time.perf_counter() - t0)


def kv_sweep(card: CudaCard, cfg: ModelConfig, weights: ModelWeights, formats: tuple[str, ...],
             prompts: tuple[int, ...], depths: tuple[int, ...], chunk: int = 256, decode_steps: int = 32) -> dict[str, Any]:
    """Prefill and decode tokens/s per KV cache format (whole model, one sequence), for the long-context table."""
    import gc

    from engine.model.kv_formats import kv_format

    out: dict[str, Any] = {}
    capacity = max(max(prompts, default=0), max(depths, default=0) + decode_steps + 2) + 8
    for name in formats:
        dec = SlotDecoder(card, cfg, weights, capacity, 1, chunk, kv_format(name))
        out[name] = {"prefill_tokens_per_s": {n: prefill_speed(dec, n) for n in prompts},
                     "decode_tokens_per_s": {d: decode_speed(dec, 1, d, decode_steps) for d in depths}}
        for buf in dec.seqs[0].buffers():
            buf.free()
        del dec
        gc.collect()
    return {"capacity": capacity, "formats": out}


def render_kv_sweep(r: dict[str, Any]) -> str:
    lines = ["format   " + "   ".join(f"prefill {n}" for n in next(iter(r["formats"].values()))["prefill_tokens_per_s"])
             + "   " + "   ".join(f"decode @{d}" for d in next(iter(r["formats"].values()))["decode_tokens_per_s"])]
    for name, f in r["formats"].items():
        cells = [f"{v:>9.0f}" for v in f["prefill_tokens_per_s"].values()] + \
                [f"{v:>10.1f}" for v in f["decode_tokens_per_s"].values()]
        lines.append(f"{name:<8} " + "   ".join(cells))
    return "\n".join(lines)


def gemm_tops(card: CudaCard, cfg: ModelConfig, n_tokens: int, qtype: GGMLQuantizationType | None = None) -> dict[str, Any]:
    """DP4A TOPS of the prefill GEMM on the FFN gate+up shape (the largest prefill matmul), with Q8_0 weights
    or K-quant `qtype` ones (2 · rows · K · tokens operations either way, so fractions of the peak compare)."""
    rows, k = 2 * cfg.d_ff, cfg.d_model
    if qtype is None:
        w: Q8Weight | KQWeight = random_q8_weight(card, (cfg.d_ff, cfg.d_ff), k, 77, "bench.gemm.w")
        buffers = [w.qs, w.d]
    else:
        w = random_kq_weight(card, qtype, (cfg.d_ff, cfg.d_ff), k, 77, "bench.gemm.w")
        buffers = [w.data]
    x = alloc_q8_activations(card, k, n_tokens, "bench.gemm.x")
    x.xq.fill_zero()
    x.xd.fill_zero()
    y = card.alloc(4 * rows * n_tokens, "bench.gemm.y")
    ops = 2 * rows * k * n_tokens
    gemm = gemm_q8 if qtype is None else gemm_kq
    try:  # the same tile staged both ways (gemm.GEMM_STAGINGS); the default's is the one prefill runs
        ms = {staging: time_graph_ms(card, 10, lambda _, s=staging: gemm(card, w, x, y, n_tokens, staging=s))
              for staging in GEMM_STAGINGS}
    finally:
        for buf in (*buffers, x.xq, x.xd, y):
            buf.free()
    return {"type": "Q8_0" if qtype is None else qtype.name, "rows": rows, "k": k, "tokens": n_tokens,
            "us": ms[DEFAULT_GEMM_STAGING] * 1e3, "tops": ops / (ms[DEFAULT_GEMM_STAGING] * 1e-3) / 1e12,
            "stagings_tops": {staging or "single": ops / (t * 1e-3) / 1e12 for staging, t in ms.items()}}


def run_bench(card: CudaCard, cfg: ModelConfig, weights: ModelWeights, shape: str, prompts: tuple[int, ...],
              depths: tuple[int, ...], chunk: int = 256, decode_steps: int = 64,
              streams: tuple[int, ...] = (1, 2, 4, 8)) -> dict[str, Any]:
    """All measurements for one model; see the module docstring for the method. Decode bytes are the
    matrices as `weights` store them (Q8_0 or K-quant), so read fractions compare across weight types;
    the K-quant GEMMs the model holds are timed beside the Q8_0 one."""
    micro = run_microbench(card, shape if shape in ("0.8b", "9b", "27b") else "9b")
    read_ceiling = max(g["gb_per_s"] for g in micro["gemv"])
    gemm = gemm_tops(card, cfg, chunk)
    kq_gemms = [{**g, "fraction_of_dp4a_peak": g["tops"] / micro["dp4a_tops"]}
                for g in (gemm_tops(card, cfg, chunk, q) for q in sorted(kquant_types_of(weights)))]
    capacity = max(max(prompts), max(depths) + decode_steps + 2) + 8
    dec = SlotDecoder(card, cfg, weights, capacity, 1, chunk)
    prefill = {n: prefill_speed(dec, n) for n in prompts}
    prefill_parts = prefill_breakdown(dec, max(prompts) - chunk, micro["dp4a_tops"]) if max(prompts) >= chunk else None
    decode = {}
    for depth in depths:
        tps = decode_speed(dec, 1, depth, decode_steps)
        nbytes = decode_bytes(cfg, depth, weights)
        gbps = nbytes * tps / 1e9
        decode[depth] = {
            "tokens_per_s": tps, "bytes_per_token": nbytes, "gb_per_s": gbps,
            "fraction_of_read_ceiling": gbps / read_ceiling, "fraction_of_copy": gbps / micro["copy_gb_per_s"],
            "projected_cmp_tokens_per_s": CMP_READ_GBPS * 1e9 * (gbps / read_ceiling) / nbytes,
        }
    seq, fwd = dec.seqs[0], dec.fwd
    seq.next_position = depths[0]
    fwd.set_batch(np.ones(1, np.int32), seq)
    breakdown = {"depth": depths[0],
                 **kernel_breakdown(card, lambda: (fwd.run(1, seq), dec.samplers[0].sample(fwd.logits)))}
    batched = SlotDecoder(card, cfg, weights, depths[0] + decode_steps + 8, min(MAX_SLOTS, max(streams)), chunk)
    multi = {}
    for n in streams:
        tps = decode_speed(batched, n, depths[0], decode_steps)
        multi[n] = {"tokens_per_s": tps, "per_stream_tokens_per_s": tps / n}
    wide = min(max(streams), batched.slot_count)  # where the batched step's time goes at the widest batch
    with slots_at_depth(batched, wide, depths[0]):
        batched.prepare_step(list(range(wide)))
        wide_breakdown = {"depth": depths[0], "streams": wide, **kernel_breakdown(
            card, lambda: step_launches(batched.fwd, batched.batch, batched.sampling, wide))}
    arrivals = arrival_prefill(batched)
    constrained = constrained_step_costs(batched, tuple(n for n in (1, 4) if n <= batched.slot_count), depths[0],
                                         decode_steps)
    dp4a_ratio = micro["dp4a_tops"] / CMP_DP4A_TOPS
    speedup = None
    if 4096 in prefill:
        speedup = prefill[4096] / max(d["tokens_per_s"] for d in decode.values())
    return {
        "shape": shape,
        "chunk": chunk,
        "ceilings": {"copy_gb_per_s": micro["copy_gb_per_s"], "read_gb_per_s": read_ceiling, "dp4a_tops": micro["dp4a_tops"]},
        "gemm": {**gemm, "fraction_of_dp4a_peak": gemm["tops"] / micro["dp4a_tops"],
                 # its instruction mix's own ceiling: 8 DP4As per fold (microbench dp4a_fold_ceilings)
                 "fraction_of_fold_ceiling": gemm["tops"] / micro["dp4a_fold_ceilings"]["8"]["tops"]},
        "gemm_kquant": kq_gemms,
        "weight_read_bytes": matrix_read_bytes(weights, cfg),
        "prefill_tokens_per_s": prefill,
        "projected_cmp_prefill_tokens_per_s": {n: tps / dp4a_ratio for n, tps in prefill.items()},
        "decode": decode,
        "concurrent_streams": {"depth": depths[0], "streams": multi},
        "arrival_prefill": arrivals,
        "prefill_4k_vs_fastest_decode": speedup,
        "prefill_kernel_breakdown": prefill_parts,
        "decode_kernel_breakdown": breakdown,
        "batched_step_kernel_breakdown": wide_breakdown,
        "constrained_steps": constrained,
        "rmsnorm_shapes": norm_shapes(card, cfg.d_model, cfg.rms_eps),
        "cmp_kernel_model": project_step(cfg, breakdown, read_ceiling, matrix_read_bytes(weights, cfg)),
        # the line is fitted to the microbenchmark's Q8_0 GEMVs: a K-quant step's launches are not priced by it
        "decode_bounds": (None if kquant_types_of(weights) else
                          decode_bounds(breakdown, micro, read_ceiling, decode[depths[0]]["bytes_per_token"])),
        "qengine_cmp": QENGINE.get(shape),
        "microbench": micro,
    }


def render_table(r: dict[str, Any]) -> str:
    """The short human table printed after the JSON is written."""
    c = r["ceilings"]
    lines = [
        f"shape {r['shape']}: ceilings copy {c['copy_gb_per_s']:.0f} GB/s, GEMV read {c['read_gb_per_s']:.0f} GB/s, "
        f"DP4A {c['dp4a_tops']:.1f} TOPS",
        f"prefill GEMM at {r['gemm']['tokens']} tokens: {r['gemm']['tops']:.1f} TOPS = "
        f"{100 * r['gemm']['fraction_of_dp4a_peak']:.0f}% of DP4A peak, "
        f"{100 * r['gemm']['fraction_of_fold_ceiling']:.0f}% of its mix's ceiling",
        *(f"  {g['type']} GEMM: {g['tops']:.1f} TOPS = {100 * g['fraction_of_dp4a_peak']:.0f}% of DP4A peak"
          for g in r.get("gemm_kquant", ())),
        *(f"  {g['type']} GEMM staged " + ", ".join(f"{n} {t:.1f}" for n, t in g["stagings_tops"].items()) + " TOPS"
          for g in (r["gemm"], *r.get("gemm_kquant", ())) if g.get("stagings_tops")),
        "DP4A with a Q8 fold per 8 / 4 DP4As: " + " / ".join(
            f"{f['tops']:.1f} TOPS ({100 * f['fraction_of_dp4a_peak']:.0f}%)"
            for f in r["microbench"]["dp4a_fold_ceilings"].values()),
        "prompt   prefill t/s   projected CMP t/s",
    ]
    for n, tps in r["prefill_tokens_per_s"].items():
        lines.append(f"{n:>6}   {tps:>11.0f}   {r['projected_cmp_prefill_tokens_per_s'][n]:>17.0f}")
    if r.get("prefill_kernel_breakdown"):
        lines.extend(render_prefill_breakdown(r["prefill_kernel_breakdown"]))
    lines.append("depth    decode t/s   GB/s   % read ceiling   projected CMP t/s")
    for depth, d in r["decode"].items():
        lines.append(f"{depth:>6}   {d['tokens_per_s']:>10.1f}   {d['gb_per_s']:>4.0f}   "
                     f"{100 * d['fraction_of_read_ceiling']:>14.0f}   {d['projected_cmp_tokens_per_s']:>17.1f}")
    m = r["concurrent_streams"]
    lines.append(f"streams at depth {m['depth']}   aggregate t/s   per stream t/s")
    for n, d in m["streams"].items():
        lines.append(f"{n:>7}   {d['tokens_per_s']:>13.1f}   {d['per_stream_tokens_per_s']:>14.1f}")
    if "arrival_prefill" in r:
        lines.extend(render_arrivals(r["arrival_prefill"]))
    b = r["decode_kernel_breakdown"]
    lines.append(f"decode step at depth {b['depth']}: {b['whole_us']:.0f} us whole, {b['sum_of_parts_us']:.0f} us as parts:")
    for name, k in list(b["kernels"].items())[:8]:
        lines.append(f"  {name:<28} x{k['launches']:<4} {k['us']:>7.0f} us")
    w = r.get("batched_step_kernel_breakdown")
    if w is not None:
        lines.append(f"batched step of {w['streams']} streams: {w['whole_us']:.0f} us whole, {w['sum_of_parts_us']:.0f} us "
                     "as parts:")
        for name, k in list(w["kernels"].items())[:10]:
            lines.append(f"  {name:<28} x{k['launches']:<4} {k['us']:>7.0f} us")
    if "constrained_steps" in r:
        lines.extend(render_constrained(r["constrained_steps"]))
    if r.get("decode_bounds"):
        lines.append(render_bounds(r["decode_bounds"]))
    if "rmsnorm_shapes" in r:
        lines.append(render_norm_shapes(r["rmsnorm_shapes"]))
    if "cmp_kernel_model" in r:
        lines.append(render_projection(r["cmp_kernel_model"]))
    if r["prefill_4k_vs_fastest_decode"] is not None:
        lines.append(f"4K prefill is {r['prefill_4k_vs_fastest_decode']:.1f}x faster than decoding the same tokens")
    return "\n".join(lines)
