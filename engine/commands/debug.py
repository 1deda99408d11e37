"""`rigllm debug compare MODEL`: run two backends (or the reference's two modes) side by side on the same
tokens and print, per layer and sub-step (norm, mixer, FFN), how far their hidden rows differ, naming the
first place over a threshold (contracts.md "Numerics and comparisons between backends").

The baseline is always the reference in kernel-rounding mode (Q8_1 matmul inputs, K/V rounded to fp16
before storing, as the card does: engine.reference.staged_kv). The other side is `--backend cuda` (its
eager path with hidden-row capture on) or `--backend reference` (the reference in exact fp32 mode, so the
tool itself runs without a GPU). Feeds: the prompt in one call (the CUDA backend cuts it into its prefill
chunks), then `--steps` one-token decode steps teacher-forced with the baseline's greedy tokens.
`--layer-local` compares each block of the other side with the reference's replay of that block on the other
side's own inputs to it (engine.reference.layer_replay), so rounding does not accumulate over layers and
the first wrong block stands out. Its attention attends over the other side's own stored K/V rows
(engine.reference.staged_kv.CardRowsKV), whose values are checked against the reference's encoding instead: the
report lists each attention layer's share of differing values and the layers over STORED_KV_DIFFERING_BOUND.
"""

from __future__ import annotations

import argparse

import numpy as np

DEFAULT_PROMPT = ("The quick brown fox jumps over the lazy dog. [KEY=1234] Counting: one two three four five six "
                  "seven eight nine ten.\n?KEY=")
# Worst-row thresholds, measured on the trained fixture (README "Correctness"): whole-model rows of correct code
# differ by up to ~1.3e-2 after four layers of Q8_1 rounding flips; layer-local rows by <= 4.5e-3 (the reference
# summing in another order), where a q RoPE position off by one in a layer gives 9.4e-2, on decode steps only
# 1.5e-2. Pass --threshold for other models.
DEFAULT_THRESHOLD = 0.05
DEFAULT_LAYER_LOCAL_THRESHOLD = 0.01


def register(subparsers: argparse._SubParsersAction) -> None:
    debug = subparsers.add_parser("debug", help="diagnostics for model and backend developers")
    tools = debug.add_subparsers(dest="debug_command", required=True, metavar="TOOL")
    p = tools.add_parser(
        "compare", help="per-layer hidden-row differences between the reference and a backend",
        description="Feeds the same tokens to the reference (kernel-rounding mode) and to the chosen backend and "
        "prints the relative difference of the hidden rows after each block's norm, mixer and FFN, and of the "
        "logits; names the first (layer, sub-step) whose worst token is over --threshold.")
    p.add_argument("model", help="a qwen35 GGUF file (a Q8_0 file compares like with like)")
    p.add_argument("--backend", choices=("cuda", "reference"), default="cuda",
                   help="cuda (default), or reference: the reference's exact fp32 mode against its kernel mode")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="raw text fed as-is (no chat template)")
    p.add_argument("--steps", type=int, default=8, help="teacher-forced decode steps after the prompt (default 8)")
    p.add_argument("--kv", default="f16", help="KV cache format of both sides, e.g. k8v3 (default f16)")
    p.add_argument("--threshold", type=float, help=f"worst-row relative difference that counts as a divergence "
                   f"(default {DEFAULT_THRESHOLD}, with --layer-local {DEFAULT_LAYER_LOCAL_THRESHOLD})")
    p.add_argument("--layer-local", action="store_true",
                   help="compare each block with the reference's replay of it on the other side's own inputs "
                        "(engine.reference.layer_replay): differences do not accumulate, so the first bad block "
                        "stands out by orders of magnitude (logits stay whole-model); attention is replayed over "
                        "the other side's own K/V rows, and the report gives the share of them that differ from "
                        "the reference's encoding")
    p.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from engine.errors import RigllmError
    from engine.model.kv_formats import kv_format_of
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.loader import load_model
    from engine.reference.activation_rounding import ActivationRounding

    if args.steps < 0:
        raise RigllmError("--steps must be >= 0")
    kv_format_of(None if args.kv == "f16" else args.kv)  # refuses an unknown format before loading
    loaded = load_model(args.model)
    prompt = Tokenizer.from_model_file(loaded.file).encode(args.prompt, parse_special=False)
    if not prompt:
        raise RigllmError("the prompt is empty")
    if args.threshold is None:
        args.threshold = DEFAULT_LAYER_LOCAL_THRESHOLD if args.layer_local else DEFAULT_THRESHOLD
    baseline = ReferenceSide(loaded, ActivationRounding.KERNEL, args.kv)
    if args.backend == "reference":
        report = compare(baseline, ReferenceSide(loaded, ActivationRounding.EXACT, args.kv), prompt, args.steps,
                         args.threshold, args.layer_local, args.kv)
    else:
        other = CudaSide(loaded, args.kv, len(prompt) + args.steps + 1)
        try:
            report = compare(baseline, other, prompt, args.steps, args.threshold, args.layer_local, args.kv)
        finally:
            other.close()
    print(json.dumps(report.as_dict(), indent=1) if args.json else report.render())
    return 0


def compare(baseline, other, prompt: list[int], steps: int, threshold: float, layer_local: bool = False,
            kv: str = "f16"):
    """Feed the prompt and `steps` of the baseline's own greedy tokens to both sides (`feed(chunk)` → the last
    token's logits; `trace`), and compare their traces (engine.generation.hidden_compare); `layer_local`: the
    other side's trace against the baseline model's replay of each block on that trace's own inputs, attending
    over the other side's stored K/V rows (`stored_kv()`), whose differing shares the report then carries."""
    import dataclasses

    from engine.generation.hidden_compare import compare_traces
    from engine.reference.layer_replay import replay_layers
    from engine.reference.staged_kv import STORED_KV_DIFFERING_BOUND, card_rows_caches

    feeds, base_logits = [list(prompt)], [baseline.feed(list(prompt))]
    for _ in range(steps):  # the baseline's greedy continuation, one feed per token
        feeds.append([int(base_logits[-1].argmax())])
        base_logits.append(baseline.feed(feeds[-1]))
    other_logits = [other.feed(chunk) for chunk in feeds]
    if not layer_local:
        return compare_traces(baseline.trace, other.trace, base_logits, other_logits, threshold)
    caches = card_rows_caches(baseline.model.cfg, kv, other.stored_kv())
    base_trace = replay_layers(baseline.model, other.trace, feeds, kv, caches)
    report = compare_traces(base_trace, other.trace, base_logits, other_logits, threshold)
    return dataclasses.replace(report, stored_kv={i: c.differing_share for i, c in caches.items()},
                               stored_kv_bound=STORED_KV_DIFFERING_BOUND)


class ReferenceSide:
    """The reference on one fresh sequence (K/V rounded like the card's), recording its hidden rows."""

    def __init__(self, loaded, rounding, kv: str = "f16", model=None):
        """`model`: a ReferenceModel to use instead of loading one (tests plant bugs in it)."""
        from engine.reference.hidden_trace import HiddenTrace
        from engine.reference.model import ReferenceModel
        from engine.reference.staged_kv import card_like_state

        self.model = model or ReferenceModel.from_model_file(loaded.file, rounding=rounding)
        self.state = card_like_state(self.model, kv)
        self.trace = HiddenTrace()

    def feed(self, chunk: list[int]) -> np.ndarray:
        from engine.reference.hidden_trace import tracing

        with tracing(self.trace):
            return self.model.forward(chunk, self.state)[-1]

    def stored_kv(self) -> dict:
        """Its attention layers' stored K and V rows (`Encoded` pairs by layer)."""
        return {i: cache.encoded() for i, cache in self.state.kv.items()}


class CudaSide:
    """One CUDA card's eager path with hidden-row capture on; `close()` frees the card."""

    def __init__(self, loaded, kv: str, context: int):
        from engine.cuda.backend import CudaBackend
        from engine.reference.hidden_trace import HiddenTrace

        self.gpu = CudaBackend(loaded, context=max(context, 64), kv=kv, speculative=False)
        self.trace = self.gpu.fwd.trace = HiddenTrace()
        self.seq = self.gpu.new_sequence()

    def feed(self, chunk: list[int]) -> np.ndarray:
        return self.gpu.forward_last(chunk, self.seq)

    def stored_kv(self) -> dict:
        """Its attention layers' stored K and V rows, downloaded (`Encoded` pairs by layer)."""
        return self.gpu.stored_kv(self.seq.slot)

    def close(self) -> None:
        self.gpu.close()
