"""What a burst of requests costs before its first tokens: N prompts arriving together, prefilled one pass each (as
the scheduler did before issue 28's shared passes) against passes they share (`SlotDecoder.feed_chunks`).

Most of a pass over a short prompt does not grow with its tokens (9B on the H200, s24a: one 54-token prompt 19.3 ms
a pass, two in one pass 27.8 ms, four 52.0 ms), so N arrivals prefilled alone cost N passes' fixed part, shared passes
one each. The shared passes are cut as the serving scheduler cuts them (`shared_passes`). Timed with CUDA events
around all of the arrivals' passes, Python launch cost included, best of `rounds`, the slots reset (untimed) first.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from engine.cuda.forward import shares_pass
from engine.cuda.prefill_chunks import PrefillChunk
from engine.cuda.slot_decoder import SlotDecoder
from engine.generation.slots import shared_pass

ARRIVALS = (2, 4, 8)
PROMPT_TOKENS = 54  # the serving benchmark's prompt (engine.bench_peer.serve_streams)


def shared_passes(lengths: list[int], chunk: int) -> list[list[tuple[int, int, int]]]:
    """Passes of (prompt, first token, count), cut as the scheduler cuts them (`slots.shared_pass`): each prompt's next
    part is what a pass of its own would take (at most a chunk), and the CUDA backend's rule (`forward.shares_pass`)
    says which may share."""
    done = [0] * len(lengths)
    passes = []
    while any(d < n for d, n in zip(done, lengths)):
        waiting = [(i, done[i], min(chunk, n - done[i])) for i, n in enumerate(lengths) if done[i] < n]
        parts = [waiting[j] for j in shared_pass([take for _, _, take in waiting], lambda c: shares_pass(c, chunk))]
        for i, _, take in parts:
            done[i] += take
        passes.append(parts)
    return passes


def arrival_prefill(dec: SlotDecoder, arrivals: tuple[int, ...] = ARRIVALS, prompt_tokens: int = PROMPT_TOKENS,
                    rounds: int = 3) -> dict[str, Any]:
    """Milliseconds to prefill each burst of `arrivals` prompts of `prompt_tokens` tokens alone and in shared passes
    (bursts larger than the decoder's slots are left out)."""
    card, out = dec.card, {}
    rng = np.random.default_rng(prompt_tokens)
    for n in (a for a in arrivals if a <= dec.slot_count):
        prompts = [rng.integers(0, dec.config.vocab_size, prompt_tokens).astype(np.int32) for _ in range(n)]
        passes = shared_passes([len(p) for p in prompts], dec.prefill_chunk)

        def alone() -> None:
            for slot, ids in enumerate(prompts):
                dec.prefill_slot(slot, ids)

        def shared() -> None:
            for parts in passes:
                dec.feed_chunks([(i, PrefillChunk(prompts[i][first:first + count])) for i, first, count in parts])

        times = {}
        for name, run in (("alone", alone), ("shared", shared)):
            best = float("inf")
            for _ in range(rounds):
                for slot in range(n):
                    dec.reset_slot(slot)
                card.synchronize()
                start, end = card.event(), card.event()
                start.record()
                run()
                end.record()
                end.synchronize()
                best = min(best, end.elapsed_ms(start))
            times[name] = best
        for slot in range(n):
            dec.reset_slot(slot)
        out[n] = {"alone_ms": times["alone"], "shared_ms": times["shared"],
                  "passes": len(passes),
                  "speedup": times["alone"] / times["shared"]}
    return {"prompt_tokens": prompt_tokens, "arrivals": out}


def render_arrivals(r: dict[str, Any]) -> list[str]:
    lines = [f"arrivals of {r['prompt_tokens']}-token prompts   prefilled alone   in shared passes"]
    for n, a in r["arrivals"].items():
        lines.append(f"{n:>8}   {a['alone_ms']:>14.1f} ms   {a['shared_ms']:>8.1f} ms in {a['passes']} "
                     f"({a['speedup']:.2f}x)")
    return lines
