"""`rigllm bench --mtp`: what MTP speculative decoding costs and gives on one card (issue 13).

Measured, per draft count K, at one context depth:
- device time of a plain decode step (one token through the whole model + arg-max), of a verify step
  (K+1 tokens of one sequence through `ForwardPass.run_verify` + K+1 arg-maxes) and of a round's drafts (K MTP
  head calls, the first over the owed row padded to K+1, each with the LM head and an arg-max), each captured as a
  graph and replayed (`time_graph_ms`), so launch
  overhead stays out as it does in decoding. The issue's target is verify(K=1) <= 1.15 x decode at 512.
- device time of a whole round, greedy (head, verify, arg-maxes) and sampled (drafts drawn, verify, the
  card's acceptance rule: engine.cuda.speculative_sampling) under Qwen's recommended sampling
  (temperature 0.7, top-p 0.8, top-k 20).
- end to end: decode tokens/s through `SlotDecoder.step` with and without the head (graph replays, the
  host's share included), greedy and sampled, with the round time and the acceptance that run saw.
- several slots stepped together (issue 28 item 6): per slot count whose verify rows fit one GEMV (2..4 at K=1,
  2 at K=2), greedy, the time of a step that is one speculative round for all of them against a plain step over
  the same slots, end to end through `SlotDecoder.step`; and the device time of their drafts in one head pass per
  draft against each slot's drafts alone.

Random weights accept almost nothing (contracts.md: quality needs trained models), so the result also
carries a projection, labelled as such: tokens per round at the given per-draft acceptance a (1 + a for
K=1, 1 + a + a^2 for K=2, drafts assumed independent) over the measured end-to-end round time (which
includes a rollback copy each round, as a rejection does); for slots together, every slot's tokens per round over
the measured round time against the plain steps' tokens.
"""

from __future__ import annotations

import time
from typing import Any

from engine.cuda.bench.speed import GREEDY, decode_speed
from engine.cuda.driver import CudaCard
from engine.cuda.gemv import MAX_GEMV_TOKENS
from engine.cuda.bench.microbench import time_graph_ms
from engine.cuda.bench.profile import kernel_breakdown
from engine.cuda.slot_decoder import SlotDecoder
from engine.cuda.weights import ModelWeights, MtpWeights
from engine.generation.sampler import SamplingParams
from engine.generation.slots import SlotRequest
from engine.generation.speculative import DRAFT_TOKENS, SpeculationStats
from engine.gguf.config import ModelConfig

REPS = 16  # calls per timed graph
SAMPLED = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, seed=0)  # Qwen's recommended sampling


def tokens_per_round(acceptance: float, k: int) -> float:
    """Expected tokens a round emits when each draft is accepted with probability `acceptance`."""
    return sum(acceptance**i for i in range(k + 1))


def break_even_acceptance(round_over_step: float, k: int) -> float | None:
    """The per-draft acceptance above which rounds that cost `round_over_step` plain steps emit more tokens than
    those steps (0 when a round costs no more than a step; None when not even every draft accepted pays)."""
    if round_over_step <= 1.0:
        return 0.0
    if tokens_per_round(1.0, k) < round_over_step:
        return None
    low, high = 0.0, 1.0
    for _ in range(40):  # tokens_per_round rises with the acceptance
        mid = (low + high) / 2
        low, high = (mid, high) if tokens_per_round(mid, k) < round_over_step else (low, mid)
    return high


def _at_depth(dec: SlotDecoder, depth: int, slot: int = 0) -> None:
    """The slot as if `depth` tokens had been prefilled (cache contents do not change the speed) and the head
    owed its last row."""
    dec.seqs[slot].next_position = depth
    if dec.speculator:
        cache = dec.speculator.caches[slot]
        cache.reset()
        cache.position, cache.owed_rows = depth - 1, 1


def _device_times(dec: SlotDecoder, depth: int) -> dict[str, Any]:
    """Device ms of a decode step, a verify step and a round's drafts on slot 0 at `depth` (graphs of REPS calls), and
    the decode and verify steps per kernel (`kernel_breakdown`: where the verify's extra time goes)."""
    spec, fwd, seq, sampler, card = dec.speculator, dec.fwd, dec.seqs[0], dec.samplers[0], dec.card
    assert spec is not None
    k, cache = spec.k, spec.caches[0]
    _at_depth(dec, depth)
    seq.set_step(1)

    def decode(_: int) -> None:
        fwd.run(1, seq)  # the one-token pass of slot 0 (the slot-indexed step launches the same kernels)
        sampler.argmax(fwd.logits_row(0))

    decode_parts = kernel_breakdown(card, lambda: decode(0), REPS)  # its whole_us is the step's graph time
    seq.set_step(k + 1)

    def verify(_: int) -> None:
        fwd.run_verify(k + 1, seq, spec.rings[0], cache.owed)
        for t in range(k + 1):
            sampler.argmax(fwd.logits_row(t))

    verify_parts = kernel_breakdown(card, lambda: verify(0), REPS)
    cache.set_steps(1)
    # a greedy round's drafts: K head calls, the first over the owed row padded to K+1, each with its arg-max
    draft_ms = time_graph_ms(card, REPS, lambda _: spec._drafts_work([0], [True]))
    seq.set_step(k + 1)
    cache.set_steps(1)
    greedy_round_ms = time_graph_ms(card, REPS, lambda _: spec._round_work(0, greedy=True))
    sampler.configure(SAMPLED)
    sampled_round_ms = time_graph_ms(card, REPS, lambda _: spec._round_work(0, greedy=False))
    decode_ms, verify_ms = decode_parts["whole_us"] * 1e-3, verify_parts["whole_us"] * 1e-3
    return {"decode_step_ms": decode_ms, "verify_step_ms": verify_ms, "draft_ms": draft_ms,
            "verify_over_decode": verify_ms / decode_ms,
            "greedy_round_ms": greedy_round_ms, "sampled_round_ms": sampled_round_ms,
            "kernel_breakdown": {"decode": decode_parts, "verify": verify_parts}}


def _speculative_speed(dec: SlotDecoder, depth: int, steps: int, params: SamplingParams) -> dict[str, float]:
    """Speculative decoding of slot 0 from `depth` for `steps` rounds, through `step` as generation does."""
    m = _stepped(dec, depth, steps, 1, SlotRequest(params, ()))
    return {"tokens_per_s": m["tokens_per_s"], "round_ms": m["step_ms"], "acceptance": m["acceptance"],
            "tokens_per_round": m["tokens_per_round"]}


def _stepped(dec: SlotDecoder, depth: int, steps: int, width: int, request: SlotRequest) -> dict[str, float]:
    """Decode of slots 0..width-1 under `request` from `depth`, all fed every step, for `steps` steps through `step`
    as generation and serving do (a speculating request's steps are rounds, of all the slots at once); the
    acceptance counts cover the timed steps only."""
    assert dec.speculator is not None
    slots = range(width)
    for slot in slots:
        _at_depth(dec, depth, slot)
        dec.begin(slot, request)
    feeds = {slot: 1 for slot in slots}

    def step() -> int:
        picks = dec.step(feeds)
        feeds.update({slot: max(pick.tokens[-1], 0) for slot, pick in picks.items()})
        return sum(len(pick.tokens) for pick in picks.values())

    for _ in range(2):  # eager, then captured: the steps after replay graphs
        step()
    dec.speculator.stats = stats = SpeculationStats()
    t0 = time.perf_counter()
    emitted = sum(step() for _ in range(steps))
    elapsed = time.perf_counter() - t0
    for slot in slots:
        dec.reset_slot(slot)
    return {"tokens_per_s": emitted / elapsed, "step_ms": 1e3 * elapsed / steps, "tokens_per_step": emitted / steps,
            "acceptance": stats.acceptance_rate, "tokens_per_round": stats.tokens_per_verify}


def _draft_times(dec: SlotDecoder, depth: int, width: int) -> dict[str, float]:
    """Device ms of the greedy drafts of slots 0..width-1 in one head pass per draft (`draft_pass`), against the sum
    of each slot's drafts alone: what reading the head's weights and the LM head once for all of them saves."""
    spec = dec.speculator
    assert spec is not None
    for slot in range(width):
        _at_depth(dec, depth, slot)
        spec.caches[slot].set_steps(1)
    together = time_graph_ms(dec.card, REPS, lambda _: spec._drafts_work(list(range(width)), [True] * width))
    alone = sum(time_graph_ms(dec.card, REPS, lambda _, s=slot: spec._drafts_work([s], [True])) for slot in range(width))
    for slot in range(width):
        dec.reset_slot(slot)
    return {"drafts_together_ms": together, "drafts_each_alone_ms": alone}


def _slots_together(dec: SlotDecoder, depth: int, steps: int, acceptance: float) -> dict[int, dict[str, Any]]:
    """Greedy decode of 2 or more slots together, as speculative rounds and as plain steps (`_stepped`), for every
    slot count whose verify rows fit one GEMV, beyond the default SLOTS_TOGETHER too (these measurements are what it
    rests on), with the projection at `acceptance`; and the device time of their drafts in one pass against each
    slot's alone (`_draft_times`)."""
    spec = dec.speculator
    assert spec is not None
    k, out = spec.k, {}
    for width in range(2, min(dec.slot_count, MAX_GEMV_TOKENS // (k + 1)) + 1):
        spec.slots_together = width
        rounds = _stepped(dec, depth, steps, width, SlotRequest(GREEDY, ()))
        plain = _stepped(dec, depth, steps, width, SlotRequest(GREEDY, (), speculative=False))
        projected = width * tokens_per_round(acceptance, k) / (rounds["step_ms"] * 1e-3)
        ratio = rounds["step_ms"] / plain["step_ms"]
        out[width] = {"rounds": rounds, "plain": plain, "round_over_step": ratio,
                      "break_even_acceptance": break_even_acceptance(ratio, k), **_draft_times(dec, depth, width),
                      "projection": {"label": "PROJECTION, not a measurement: every slot's tokens per round at the "
                                              "stated acceptance over the measured round time",
                                     "acceptance": acceptance, "tokens_per_s": projected,
                                     "speedup_over_plain": projected / plain["tokens_per_s"]}}
    return out


def run_mtp_bench(card: CudaCard, cfg: ModelConfig, weights: ModelWeights, mtp: MtpWeights, shape: str, depth: int,
                  acceptance: float, steps: int = 64, chunk: int = 256) -> dict[str, Any]:
    """The measurements of the module docstring for K = 1 and 2, and the projections at `acceptance`."""
    capacity = depth + (max(DRAFT_TOKENS) + 1) * (steps + 4) + 8
    plain = SlotDecoder(card, cfg, weights, capacity, 1, chunk)
    plain_tps = decode_speed(plain, 1, depth, steps)
    plain_sampled_tps = decode_speed(plain, 1, depth, steps, SAMPLED)
    result: dict[str, Any] = {"mode": "mtp", "shape": shape, "depth": depth, "plain_decode_tokens_per_s": plain_tps,
                              "plain_sampled_decode_tokens_per_s": plain_sampled_tps, "sampling": SAMPLED.__dict__,
                              "draft_tokens": {}}
    for k in DRAFT_TOKENS:
        dec = SlotDecoder(card, cfg, weights, capacity, MAX_GEMV_TOKENS // (k + 1), chunk, mtp=mtp, draft_tokens=k)
        times = _device_times(dec, depth)
        measured = _speculative_speed(dec, depth, steps, GREEDY)
        per_round = tokens_per_round(acceptance, k)
        result["draft_tokens"][k] = {
            **times,
            "measured": measured,
            "measured_sampled": _speculative_speed(dec, depth, steps, SAMPLED),
            "projection": {
                "label": "PROJECTION, not a measurement: tokens per round at the stated acceptance over the "
                         "measured round time",
                "acceptance": acceptance,
                "tokens_per_round": per_round,
                "tokens_per_s": per_round / (measured["round_ms"] * 1e-3),
                "speedup_over_plain": per_round / (measured["round_ms"] * 1e-3) / plain_tps,
            },
            "slots_together": _slots_together(dec, depth, steps, acceptance),
        }
    return result


def fixture_acceptance(path: str, draft_tokens: int = 1, length: int = 256, samples: int = 10, seed: int = 0) -> dict[str, Any]:
    """Greedy MTP acceptance of a trained fixture (tests/fixtures/trained) on the CUDA backend, decoding the
    answers of `samples` arith prompts of `length` tokens (the task its head learned; the reference's
    numbers in the fixture's README are measured the same way), and the end-to-end decode speed of the
    answers of as many copy prompts with and without speculation: a trained head on the card, measured (a
    model this small is bound by launch latency, so the ratio says little about a 9B). Opens and closes
    its own card."""
    import numpy as np

    from engine.cuda.backend import CudaBackend
    from engine.errors import RigllmError
    from engine.fixtures.tasks import SampleBuilder
    from engine.generation.slots import decode_tokens
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.loader import load_model

    loaded = load_model(path)
    tokenizer = Tokenizer.from_model_file(loaded.file)
    backend = CudaBackend(loaded, context=length + 64, draft_tokens=draft_tokens)
    builder = SampleBuilder(lambda text: tokenizer.encode(text, parse_special=False))

    def run(task: str, speculative: bool) -> tuple[int, float]:
        """(answer tokens, seconds decoding them) over the task's samples (the same prompts every call)."""
        rng = np.random.default_rng([seed, sum(map(ord, task)), length])
        tokens, seconds = 0, 0.0
        for _ in range(samples):
            sample = builder.sample(task, rng, length)
            backend.reset_slot(0)
            backend.prefill_slot(0, sample.prompt_ids)
            t0 = time.perf_counter()
            tokens += sum(1 for _ in decode_tokens(backend, 0, GREEDY, sample.prompt_ids,
                                                   len(sample.answer_ids), (), lambda: False, speculative))
            seconds += time.perf_counter() - t0
        return tokens, seconds

    try:
        stats = backend.speculation_stats
        if stats is None:
            raise RigllmError(f"{path} has no MTP head")
        run("arith", True)
        result = {"fixture": path, "task": "arith", "length": length, "samples": samples,
                  "draft_tokens": draft_tokens, "acceptance": stats.acceptance_rate,
                  "tokens_per_verify": stats.tokens_per_verify, "rounds": stats.rounds}
        for speculative in (False, True):
            run("copy", speculative)  # warm-up: captures the graphs
        before = (stats.rounds, stats.accepted)
        speed = {}
        for speculative in (False, True):
            tokens, seconds = run("copy", speculative)
            speed["speculative" if speculative else "plain"] = tokens / seconds
        rounds, accepted = stats.rounds - before[0], stats.accepted - before[1]
        result["copy_decode_tokens_per_s"] = {**speed, "acceptance": accepted / max(1, rounds * draft_tokens)}
        return result
    finally:
        backend.close()


def render_mtp(r: dict[str, Any], fixture: dict[str, Any] | None = None) -> str:
    lines = []
    if fixture is not None:
        speed = fixture["copy_decode_tokens_per_s"]
        lines.append(f"trained fixture on this card, K={fixture['draft_tokens']}: arith acceptance "
                     f"{fixture['acceptance']:.0%}; copy answers {speed['plain']:.0f} t/s plain, "
                     f"{speed['speculative']:.0f} t/s speculative (acceptance {speed['acceptance']:.0%})")
    lines += [f"MTP on {r['shape']} at depth {r['depth']}: plain decode {r['plain_decode_tokens_per_s']:.1f} t/s greedy, "
             f"{r['plain_sampled_decode_tokens_per_s']:.1f} t/s sampled"]
    for k, d in r["draft_tokens"].items():
        m, ms, p = d["measured"], d["measured_sampled"], d["projection"]
        lines.append(
            f"K={k}: decode step {d['decode_step_ms']:.3f} ms, verify {d['verify_step_ms']:.3f} ms "
            f"({d['verify_over_decode']:.2f}x), draft {d['draft_ms']:.3f} ms; round {d['greedy_round_ms']:.3f} ms greedy, "
            f"{d['sampled_round_ms']:.3f} ms sampled; measured {m['tokens_per_s']:.1f} t/s greedy "
            f"(acceptance {m['acceptance']:.0%}, round {m['round_ms']:.2f} ms), {ms['tokens_per_s']:.1f} t/s sampled "
            f"(acceptance {ms['acceptance']:.0%}); PROJECTED at acceptance "
            f"{p['acceptance']:.0%}: {p['tokens_per_s']:.1f} t/s ({p['speedup_over_plain']:.2f}x plain)"
        )
        parts = d.get("kernel_breakdown")
        if parts:
            plain, verify = (_by_family(parts[side]["kernels"]) for side in ("decode", "verify"))
            extra = sorted(verify, key=lambda n: -(verify[n]["us"] - plain.get(n, {}).get("us", 0.0)))
            lines.append("  verify minus decode, us (launches): " + ", ".join(
                f"{n} {verify[n]['us'] - plain.get(n, {}).get('us', 0.0):+.0f} ({verify[n]['launches']})" for n in extra[:8]))
        for width, t in d.get("slots_together", {}).items():
            even = t.get("break_even_acceptance")
            lines.append(f"  {width} slots together: round {t['rounds']['step_ms']:.2f} ms against a plain step "
                         f"{t['plain']['step_ms']:.2f} ms ({t['round_over_step']:.2f}x, gains above acceptance "
                         f"{'never' if even is None else f'{even:.0%}'}), drafts "
                         f"{t['drafts_together_ms']:.3f} ms in one pass against {t['drafts_each_alone_ms']:.3f} ms "
                         f"each alone; PROJECTED at acceptance "
                         f"{t['projection']['acceptance']:.0%}: {t['projection']['tokens_per_s']:.1f} t/s "
                         f"({t['projection']['speedup_over_plain']:.2f}x plain)")
    return "\n".join(lines)


def _by_family(kernels: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per-kernel times summed over the GEMV variants (gemv_q8_t1_r4_u2 and gemv_q8_t2 are one family), so a
    verify's GEMVs compare with the decode step's."""
    out: dict[str, dict[str, Any]] = {}
    for name, v in kernels.items():
        family = "gemv_q8" if name.startswith("gemv_q8_t") else name
        slot = out.setdefault(family, {"launches": 0, "us": 0.0})
        slot["launches"] += v["launches"]
        slot["us"] += v["us"]
    return out
