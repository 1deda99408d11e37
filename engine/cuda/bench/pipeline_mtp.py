"""`rigllm bench --synthetic SHAPE --pipeline N --mtp`: MTP speculation over N cards (issue 28 item 6).

Per draft count K, on one backend of N cards (random weights of the shape, a random MTP head on the last
card, which also holds its own copy of the embedding), slot 0 after a prompt of `depth` tokens:

- greedy decoding of `tokens` tokens plainly and speculatively (graphs captured by a warm-up run first), the
  host's share included: the plain step's time, the round's time (head on the last card, the K ids back to
  the host, the verify through every card with one hop per boundary, the rule, the commits), and whether
  the two token streams are identical (random weights accept almost no draft, so this checks the verify's
  row 0 and the rollback; tests/gpu/test_pipeline_speculation.py checks acceptances bit for bit);
- the measured hop of K+1 rows, and the CMP Gen1 x1 model of that hop (engine.cuda.bench.pipeline_bench);
- the graphs each card holds at the end (its decode graphs and its bounded speculation graphs).

The speed-up at a per-draft acceptance a is tokens_per_round(a, K) x plain step / round, labelled a
projection: a random head's acceptance says nothing, so a is measured elsewhere (the trained fixture's).
With several logical cards on one GPU the cards are time-sliced, as in the plain pipeline bench.

`project_cmp_rounds` carries a result to a rig of CMP cards (README, Benchmarks): a plain step there is the
card work of a CMP decode step projected elsewhere (the decode tables' t/s) plus one modelled hop of one row
per boundary; a round is that card work times the round's measured ratio to a plain step plus one modelled
hop of K+1 rows per boundary.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from engine.cuda.backend import CudaBackend
from engine.cuda.bench.mtp_bench import GREEDY, tokens_per_round
from engine.cuda.bench.pipeline_bench import cmp_hop_seconds
from engine.cuda.bench.synthetic_weights import per_card_weights, random_mtp_weights
from engine.cuda.driver import CudaCard
from engine.generation.backend import CardSpec
from engine.generation.slots import decode_tokens
from engine.gguf.config import ModelConfig


def _decode(pipe: CudaBackend, prompt: list[int], tokens: int, speculative: bool) -> tuple[list[int], float, int]:
    """(tokens, seconds, speculative rounds) of greedy decoding after `prompt` on slot 0."""
    stats = pipe.speculation_stats
    assert stats is not None
    pipe.reset_slot(0)
    pipe.prefill_slot(0, prompt)
    rounds = stats.rounds
    start = time.perf_counter()
    out = list(decode_tokens(pipe, 0, GREEDY, prompt, tokens, (), lambda: False, speculative))
    return out, time.perf_counter() - start, stats.rounds - rounds


def _first_difference(a: list[int], b: list[int]) -> int | None:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None if len(a) == len(b) else min(len(a), len(b)))


def run_pipeline_mtp_bench(cfg: ModelConfig, shape: str, n_cards: int, devices: tuple[int, ...], depth: int,
                           acceptance: float | None, draft_tokens: tuple[int, ...] = (1, 2), tokens: int = 64,
                           weight_type: str = "q8_0") -> dict[str, Any]:
    """Card i sits on GPU devices[i % len(devices)]."""
    specs = [CardSpec(devices[i % len(devices)]) for i in range(n_cards)]

    def mtp_for(card: CudaCard, trunk):
        return random_mtp_weights(card, cfg, trunk, weight_type=weight_type)

    prompt = np.random.default_rng(depth).integers(0, cfg.vocab_size, depth).tolist()
    runs: dict[int, Any] = {}
    for k in draft_tokens:
        pipe = CudaBackend(None, specs, context=depth + 4 * tokens, slots=1, config=cfg,
                           weights_for=per_card_weights(cfg, weight_type),
                           mtp_for=mtp_for, draft_tokens=k)
        try:
            for speculative in (False, True):  # warm-up: every graph captured
                _decode(pipe, prompt, tokens, speculative)
            plain, plain_s, _ = _decode(pipe, prompt, tokens, False)
            spec, spec_s, rounds = _decode(pipe, prompt, tokens, True)
            step_ms = 1e3 * plain_s / (tokens - 1)  # the first token comes from the prefill's logits
            round_ms = 1e3 * spec_s / max(1, rounds)
            run: dict[str, Any] = {
                "layers": [[s.start, s.stop] for s in pipe.spans],
                "plain_step_ms": step_ms, "plain_tokens_per_s": (tokens - 1) / plain_s,
                "round_ms": round_ms, "rounds": rounds, "round_over_step": round_ms / step_ms,
                "speculative_tokens_per_s": (len(spec) - 1) / spec_s,
                "acceptance_random_head": pipe.speculation_stats.acceptance_rate,
                "identical_to_plain": spec == plain, "first_difference": _first_difference(spec, plain),
                "hop_seconds_verify_rows": pipe.hop_seconds(k + 1) if n_cards > 1 else None,
                "cmp_hop_model_seconds_verify_rows": cmp_hop_seconds(k + 1, cfg.d_model),
                "graphs_per_card": [st.card.graph_count for st in pipe.stages],  # decode and speculation graphs
            }
            if acceptance is not None:
                per_round = tokens_per_round(acceptance, k)
                run["projection"] = {
                    "label": "PROJECTION at the given acceptance (random weights accept almost nothing)",
                    "acceptance": acceptance, "tokens_per_round": per_round,
                    "speedup_over_plain": per_round * step_ms / round_ms,
                }
            runs[k] = run
        finally:
            pipe.close()
    return {"shape": shape, "cards": n_cards, "devices": [s.device for s in specs], "depth": depth,
            "tokens": tokens, "weights": weight_type, "draft_tokens": runs}


def project_cmp_rounds(result: dict[str, Any], d_model: int, cmp_plain_tokens_per_s: float,
                       acceptances: tuple[float, ...]) -> dict[str, Any]:
    """Per K: the projected CMP plain t/s, round ms, and t/s at each per-draft acceptance (module docstring)."""
    boundaries = result["cards"] - 1
    card_work = 1.0 / cmp_plain_tokens_per_s
    plain = card_work + boundaries * cmp_hop_seconds(1, d_model)
    out: dict[str, Any] = {}
    for k, run in result["draft_tokens"].items():
        k = int(k)
        round_s = card_work * run["round_over_step"] + boundaries * cmp_hop_seconds(k + 1, d_model)
        out[str(k)] = {"plain_tokens_per_s": 1.0 / plain, "round_ms": 1e3 * round_s,
                       "tokens_per_s": {str(a): tokens_per_round(a, k) / round_s for a in acceptances}}
    return out


def render_pipeline_mtp(r: dict[str, Any]) -> str:
    lines = [f"MTP over {r['cards']} cards, {r['shape']} {r['weights']}, depth {r['depth']}, "
             f"{r['tokens']} greedy tokens"]
    for k, d in r["draft_tokens"].items():
        hop = d["hop_seconds_verify_rows"]
        line = (f"K={k}: plain step {d['plain_step_ms']:.2f} ms ({d['plain_tokens_per_s']:.1f} t/s), round "
                f"{d['round_ms']:.2f} ms ({d['round_over_step']:.2f}x a step, {d['rounds']} rounds), "
                f"identical to plain: {d['identical_to_plain']}")
        if hop is not None:
            line += f"; hop of {k + 1} rows {hop * 1e6:.0f} us measured"
        line += f"; graphs per card {'/'.join(str(n) for n in d['graphs_per_card'])}"
        p = d.get("projection")
        if p:
            line += (f"; PROJECTED at acceptance {p['acceptance']:.0%}: {p['tokens_per_round']:.2f} tokens per round, "
                     f"{p['speedup_over_plain']:.2f}x plain")
        lines.append(line)
    return "\n".join(lines)
