"""Multi-card speed: prefill and decode tokens/s for 1..N cards, pipelined against unpipelined prefill, and
the measured cost of one hop beside a model of the CMP's PCIe Gen1 x1 link (`rigllm bench --pipeline`).

The weights are random Q8_0 of a real shape, made on each card for its layers (no file). With several
logical cards on one GPU the cards' kernels are time-sliced, so there the pipeline can at best hide
hops and launch gaps; its real speed-up needs one GPU per card (contracts.md). The CMP hop model:
a Gen1 x1 link moves ≈ 250 MB/s each way (2.5 GT/s, 8b/10b), plus ≈ 10 µs per copy; a hop is one
D2H and one H2D of the fp32 hidden rows.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from engine.cuda.bench.speed import slot_decode_speed
from engine.cuda.backend import CudaBackend
from engine.generation.backend import CardSpec
from engine.cuda.bench.synthetic_weights import per_card_weights
from engine.gguf.config import ModelConfig

GEN1_X1_BYTES_PER_S = 250e6
COPY_LATENCY_S = 10e-6


def cmp_hop_seconds(rows: int, d_model: int) -> float:
    """Modelled hop on a CMP 100-210 link: D2H + H2D of `rows` fp32 hidden rows over PCIe Gen1 x1."""
    return 2 * (COPY_LATENCY_S + rows * d_model * 4 / GEN1_X1_BYTES_PER_S)


def pipeline_prefill_speed(pipe: CudaBackend, n_tokens: int, pipelined: bool) -> float:
    ids = np.random.default_rng(n_tokens).integers(0, pipe.config.vocab_size, n_tokens).astype(np.int32)
    pipe.reset_slot(0)
    start = time.perf_counter()
    if pipelined:
        pipe.prefill_slot(0, ids)
    else:  # each chunk through every card before the next starts
        for i in range(0, n_tokens, pipe.prefill_chunk):
            pipe.prefill_slot(0, ids[i : i + pipe.prefill_chunk])
    return n_tokens / (time.perf_counter() - start)


def pipeline_decode_speed(pipe: CudaBackend, streams: int, steps: int) -> float:
    """The pipeline has no sequences to set a depth on, so each slot gets a short real prompt first."""
    for slot in range(streams):
        pipe.reset_slot(slot)
        pipe.prefill_slot(slot, [1] * 16)
    return slot_decode_speed(pipe, streams, steps)


def run_pipeline_bench(cfg: ModelConfig, shape: str, card_counts: tuple[int, ...], devices: tuple[int, ...],
                       prompt: int = 4096, chunk: int = 256, steps: int = 48, streams: int = 4) -> dict[str, Any]:
    """Card i of a run sits on GPU devices[i % len(devices)]."""
    runs = {}
    for n in card_counts:
        specs = [CardSpec(devices[i % len(devices)]) for i in range(n)]
        pipe = CudaBackend(None, specs, context=prompt + 64, slots=streams, chunk=chunk, config=cfg,
                           weights_for=per_card_weights(cfg))
        try:
            run: dict[str, Any] = {
                "devices": [s.device for s in specs],
                "layers": [[s.start, s.stop] for s in pipe.spans],
                "prefill_tokens_per_s": pipeline_prefill_speed(pipe, prompt, pipelined=True),
                "prefill_unpipelined_tokens_per_s": pipeline_prefill_speed(pipe, prompt, pipelined=False),
                "decode_tokens_per_s": pipeline_decode_speed(pipe, 1, steps),
                f"decode_{streams}_streams_tokens_per_s": pipeline_decode_speed(pipe, streams, steps),
            }
            if n > 1:
                run["hop_seconds_1_row"] = pipe.hop_seconds(1)
                run[f"hop_seconds_{chunk}_rows"] = pipe.hop_seconds(chunk, repeats=10)
            runs[n] = run
        finally:
            pipe.close()
    return {
        "shape": shape, "prompt": prompt, "chunk": chunk,
        "cmp_hop_model_seconds": {"1_row": cmp_hop_seconds(1, cfg.d_model), f"{chunk}_rows": cmp_hop_seconds(chunk, cfg.d_model)},
        "cards": runs,
    }


def render_pipeline_table(r: dict[str, Any]) -> str:
    lines = [f"shape {r['shape']}, prompt {r['prompt']} tokens in chunks of {r['chunk']}",
             "cards  layers                    prefill t/s (unpipelined)   decode t/s (4 streams)   hop 1 row / chunk"]
    chunk_key = f"hop_seconds_{r['chunk']}_rows"
    for n, run in r["cards"].items():
        hop = (f"{run['hop_seconds_1_row'] * 1e6:.0f} us / {run[chunk_key] * 1e3:.2f} ms"
               if "hop_seconds_1_row" in run else "-")
        lines.append(f"{n:>5}  {str(run['layers']):<24}  {run['prefill_tokens_per_s']:>8.0f} ({run['prefill_unpipelined_tokens_per_s']:>6.0f})"
                     f"   {run['decode_tokens_per_s']:>8.1f} ({run['decode_4_streams_tokens_per_s']:>7.1f})   {hop}")
    m = r["cmp_hop_model_seconds"]
    per_chunk = m[f"{r['chunk']}_rows"]
    lines.append(f"CMP Gen1 x1 hop model: {m['1_row'] * 1e6:.0f} us per token, {per_chunk * 1e3:.1f} ms per chunk")
    return "\n".join(lines)
