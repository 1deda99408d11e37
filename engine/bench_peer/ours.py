"""rigllm's side of the peer benchmark: the `rigllm bench` functions on the same GGUF file llama.cpp reads.

The weights come from the file (load_model + upload_weights), not from `--synthetic`, so both engines
run the very same bytes. Ceilings (device copy, DP4A peak, GEMV read bandwidth on the LM head) are
measured on the same card in the same call (engine.cuda.bench.microbench), as `rigllm bench` does.
Prefill is `engine.cuda.bench.speed.prefill_speed` (CUDA events around the chunk loop), median of `reps`;
decode is `decode_speed` (the captured decode graph replayed per token; the KV cache is not filled to
the depth, because its values do not change the speed).
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

from engine.gguf.config import ModelConfig


def measure_ours(model_path: Path, shape: str, prompts: tuple[int, ...], depths: tuple[int, ...], steps: int = 64,
                 reps: int = 3, chunk: int = 256) -> tuple[ModelConfig, dict[str, Any]]:
    """(the model's config, our numbers and this card's ceilings) for one GGUF."""
    from engine.cuda.bench.speed import decode_bytes, decode_speed, prefill_speed
    from engine.cuda.driver import CudaCard
    from engine.cuda.bench.microbench import run_microbench
    from engine.cuda.slot_decoder import SlotDecoder
    from engine.cuda.weights import upload_weights
    from engine.gguf.loader import load_model

    loaded = load_model(model_path)
    cfg = loaded.config
    card = CudaCard(0)
    try:
        micro = run_microbench(card, shape)
        weights = upload_weights(card, loaded.file, cfg)
        capacity = max(max(prompts), max(depths) + steps + 2) + 8
        dec = SlotDecoder(card, cfg, weights, capacity, 1, chunk)
        prefill_speed(dec, min(512, max(prompts)))  # warm-up, as on llama.cpp's side
        runs = {n: [prefill_speed(dec, n) for _ in range(reps)] for n in prompts}
        decode = {d: decode_speed(dec, 1, d, steps) for d in depths}
        read_bytes = {d: decode_bytes(cfg, d, weights) for d in depths}  # the file's own matrix types
        device = card.device_name
    finally:
        card.close()
    return cfg, {
        "device": device,
        "chunk": chunk,
        "ceilings": {"copy_gb_per_s": micro["copy_gb_per_s"], "dp4a_tops": micro["dp4a_tops"],
                     "read_gb_per_s": max(g["gb_per_s"] for g in micro["gemv"])},
        "prefill_tokens_per_s": {n: statistics.median(r) for n, r in runs.items()},
        "prefill_runs": runs,
        "decode_steps": steps,
        "decode_tokens_per_s": decode,
        "decode_bytes_per_token": read_bytes,
    }
