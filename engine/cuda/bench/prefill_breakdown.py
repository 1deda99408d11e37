"""Where a prefill chunk's time goes (issue 30 item 2): one chunk of the decoder's prefill length at a depth,
per kernel (the DP4A GEMMs beside the GDN chunked form, flash prefill, the norms and the rest), and the
GEMMs' DP4A throughput inside the real prefill as a fraction of the peak measured in the same run.
`rigllm bench`'s `gemm` times the FFN gate+up GEMM alone; this is what the prefill's GEMMs reach among the
other kernels, with their real shapes. Kernels are timed as `profile.kernel_breakdown` times a decode step.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cuda.bench.microbench import decode_gemvs
from engine.cuda.bench.profile import kernel_breakdown
from engine.cuda.slot_decoder import SlotDecoder
from engine.gguf.config import ModelConfig

GEMM_KERNEL_PREFIX = "gemm_"  # gemm_q8_0_q8_1 and the K-quant gemm_<type>_q8_1


def gemm_ops_per_token(cfg: ModelConfig) -> int:
    """Integer operations (2 per multiply-add) of one prefill token through the trunk's matrices: every decode
    GEMV but the LM head, which a prefill chunk runs on its last row only."""
    return sum(2 * s.rows * s.k * s.count for s in decode_gemvs(cfg)) - 2 * cfg.vocab_size * cfg.d_model


def prefill_breakdown(dec: SlotDecoder, depth: int, dp4a_tops: float) -> dict[str, Any]:
    """Microseconds of one `dec.prefill_chunk`-token chunk of slot 0 continuing from `depth` (cache contents
    do not change the speed), whole and per kernel, and the GEMMs' TOPS against `dp4a_tops`."""
    seq, fwd, n = dec.seqs[0], dec.fwd, dec.prefill_chunk
    seq.next_position = depth
    fwd.set_batch(np.ones(n, np.int32), seq)
    parts = kernel_breakdown(dec.card, lambda: fwd.run(n, seq))
    gemm_us = sum(k["us"] for name, k in parts["kernels"].items() if name.startswith(GEMM_KERNEL_PREFIX))
    tops = gemm_ops_per_token(dec.config) * n / (gemm_us * 1e-6) / 1e12 if gemm_us > 0 else 0.0
    return {"tokens": n, "depth": depth, **parts, "gemm_us": gemm_us, "gemm_tops": tops,
            "gemm_fraction_of_dp4a_peak": tops / dp4a_tops}


def render_prefill_breakdown(b: dict[str, Any], top: int = 10) -> list[str]:
    lines = [f"prefill chunk of {b['tokens']} tokens at depth {b['depth']}: {b['whole_us']:.0f} us whole, "
             f"{b['sum_of_parts_us']:.0f} us as parts; its GEMMs {b['gemm_tops']:.1f} TOPS = "
             f"{100 * b['gemm_fraction_of_dp4a_peak']:.0f}% of DP4A peak"]
    for name, k in list(b["kernels"].items())[:top]:
        lines.append(f"  {name:<28} x{k['launches']:<4} {k['us']:>7.0f} us")
    return lines
