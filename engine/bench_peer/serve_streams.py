"""`python -m engine.bench_peer.serve_streams`: issue 28's server check, concurrent streams through `rigllm serve`.

Issue 28 asks that `rigllm serve` with 4 concurrent streams through the openai client reach at least 90%
of the aggregate decode tokens/s that `rigllm bench --synthetic SHAPE` reports under "concurrent_streams"
(its slots decoding together at depth 512, the step graph replayed back to back). This runs the real
server (a child process, engine.bench_peer.serve_process) on the same shape's synthetic GGUF
(engine.bench_peer.models, random weights, the real vocabulary and the bundled Qwen3.5 template) with
as many slots as the widest stream count, and times greedy streaming chat completions through the
official client (engine.bench_peer.stream_timing). Per stream count: one untimed warm-up round (it
captures that batch width's step graph), then `--reps` rounds, the median round by aggregate reported.
`--bench-json` (a `rigllm bench --json` file of the same card) adds the bench's numbers and the ratio.
`--response-format json_object` asks every stream for JSON: each step of its slot is then a masked one (the
grammar's mask made on the server's host every step), which is what the card's idle time per step shows.

The decode here starts at the prompt's depth (a few dozen tokens), not at 512: on the 9B shape the
KV cache read at 512 tokens is a fraction of a percent of the weight reads, so the depths compare.
`--shape demo --backend reference` runs the same path on the CPU with the small demo model. Needs the
openai package (the dev extra) beside the server's own dependencies.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

import openai
from prometheus_client.parser import text_string_to_metric_families

from engine.bench_peer.models import ensure_model
from engine.bench_peer.run import git_commit, gpu_state, positive_ints, run_command
from engine.bench_peer.serve_process import serving
from engine.bench_peer.stream_timing import PROMPT, concurrent_round, summarize
from engine.errors import RigllmError
from engine.fixtures.demo_model import DEMO_WEIGHT_TYPE, ensure_demo_model
from engine.gguf.shapes import SHAPES, SYNTHETIC_WEIGHTS

DEMO = "demo"
PROMPT_ROOM = 512  # context beside max_tokens for the templated prompt (a few dozen tokens; the margin is a few MiB)
WARMUP_TOKENS = 16


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m engine.bench_peer.serve_streams", description=__doc__.splitlines()[0])
    p.add_argument("--shape", choices=(*SHAPES, DEMO), default="9b",
                   help="synthetic model shape, or the demo model (with --backend reference: a CPU dry run)")
    p.add_argument("--weights", choices=SYNTHETIC_WEIGHTS, default="q8_0", help="synthetic file type")
    p.add_argument("--streams", type=positive_ints, default=(1, 2, 4, 8),
                   help="concurrent stream counts, comma-separated (the server gets as many slots as the largest)")
    p.add_argument("--max-tokens", type=int, default=256, help="tokens asked of each stream")
    p.add_argument("--reps", type=int, default=3, help="timed rounds per stream count (the median is reported)")
    p.add_argument("--backend", choices=("cuda", "reference"), default="cuda")
    p.add_argument("--models-dir", type=Path, default=Path(tempfile.gettempdir()) / "rigllm-peer-models",
                   help="folder of the synthetic GGUFs (written when missing; shared with engine.bench_peer.run)")
    p.add_argument("--bench-json", type=Path, help="a `rigllm bench --json` file: its concurrent_streams beside ours")
    p.add_argument("--json", type=Path, default=Path(os.environ.get("OUT", ".")) / "serve-streams.json",
                   help="results file (default $OUT/serve-streams.json)")
    p.add_argument("--log", type=Path, help="the server's output (default: beside --json, .server.log)")
    p.add_argument("--response-format", choices=("text", "json_object"), default="text",
                   help="json_object: every stream decodes under a JSON grammar's masks")
    return p


def model_file(shape: str, weights: str, folder: Path) -> Path:
    if shape == DEMO:
        if weights != DEMO_WEIGHT_TYPE:
            raise RigllmError(f"the demo model is {DEMO_WEIGHT_TYPE} only")
        return ensure_demo_model()
    return ensure_model(folder, shape, weights)


def measure(model: Path, backend: str, streams: tuple[int, ...], max_tokens: int, reps: int, context: int,
            log: Path, response_format: dict[str, Any] | None = None) -> dict[int, dict[str, Any]]:
    """Per stream count: the median round (by aggregate tokens/s) of `reps`, with every round's aggregate."""
    with serving(model, backend, max(streams), context, log) as base_url:
        with openai.OpenAI(base_url=base_url, api_key="bench", max_retries=0) as client:
            model_id = client.models.list().data[0].id
        results = {}
        for n in streams:
            concurrent_round(base_url, model_id, n, WARMUP_TOKENS, response_format)
            rounds = sorted((timed_round(base_url, model_id, n, max_tokens, response_format) for _ in range(reps)),
                            key=lambda r: r["aggregate_tokens_per_s"] or 0.0)
            results[n] = {**rounds[len(rounds) // 2],
                          "aggregate_runs": [r["aggregate_tokens_per_s"] for r in rounds]}
    return results


def timed_round(base_url: str, model_id: str, streams: int, max_tokens: int,
                response_format: dict[str, Any] | None = None) -> dict[str, Any]:
    """One round's summary, with the card's idle time between its decode steps when the server reports it
    (/metrics' rigllm_decode_idle_seconds over rigllm_decode_steps_followed, read before and after)."""
    before = decode_idle(base_url)
    summary = summarize(concurrent_round(base_url, model_id, streams, max_tokens, response_format), max_tokens)
    after = decode_idle(base_url)
    if before is not None and after is not None and after[0] > before[0]:
        steps, seconds = after[0] - before[0], after[1] - before[1]
        summary.update(idle_gap_steps=steps, idle_gap_mean_us=1e6 * seconds / steps)
    return summary


def decode_idle(base_url: str) -> tuple[float, float] | None:
    """(steps that followed a step, idle seconds before them) from the server's /metrics; None without them."""
    request = urllib.request.Request(base_url.removesuffix("/v1") + "/metrics",
                                     headers={"Authorization": "Bearer bench"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    values = {s.name: s.value for family in text_string_to_metric_families(text) for s in family.samples}
    steps, idle = values.get("rigllm_decode_steps_followed_total"), values.get("rigllm_decode_idle_seconds_total")
    return None if steps is None or idle is None else (steps, idle)


def bench_streams(path: Path) -> dict[int, float]:
    """Aggregate tokens/s per stream count from a `rigllm bench --json` file."""
    bench = json.loads(path.read_text())
    try:
        return {int(n): d["tokens_per_s"] for n, d in bench["concurrent_streams"]["streams"].items()}
    except KeyError:
        raise RigllmError(f"{path} has no concurrent_streams (is it `rigllm bench --synthetic ... --json`?)") from None


def with_bench(results: dict[int, dict[str, Any]], bench: dict[int, float]) -> None:
    """Add the bench's aggregate and our fraction of it to each stream count the bench measured."""
    for n, r in results.items():
        if n in bench and r["aggregate_tokens_per_s"] is not None:
            r["bench_aggregate_tokens_per_s"] = bench[n]
            r["fraction_of_bench"] = r["aggregate_tokens_per_s"] / bench[n]


def render_table(result: dict[str, Any]) -> str:
    """The short table printed last."""
    lines = [f"rigllm serve, {result['shape']} {result['weights']}, {result['backend']} backend, "
             f"{result['slots']} slots, max_tokens {result['max_tokens']}, {result.get('response_format', 'text')} "
             f"(median of {result['reps']} rounds)",
             "streams   aggregate t/s   per stream t/s   tokens   short   bench t/s   serve/bench   idle us/step"]
    for n, r in result["streams"].items():
        agg, per = r["aggregate_tokens_per_s"], r["per_stream_mean_tokens_per_s"]
        bench, frac, idle = r.get("bench_aggregate_tokens_per_s"), r.get("fraction_of_bench"), r.get("idle_gap_mean_us")
        lines.append(f"{n:>7}   {agg or 0:>13.1f}   {per or 0:>14.1f}   {r['completion_tokens']:>6}   "
                     f"{r['short_streams']:>5}   {'' if bench is None else f'{bench:.1f}':>9}   "
                     f"{'' if frac is None else f'{100 * frac:.0f}%':>11}   "
                     f"{'' if idle is None else f'{idle:.0f}':>12}")
    if any(r["short_streams"] for r in result["streams"].values()):
        lines.append("short: streams that ended before max_tokens (the model picked its end token); "
                     "their batch was narrower for the rest of the round")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.max_tokens < 2 or args.reps < 1:
        raise RigllmError("--max-tokens must be at least 2 and --reps at least 1")
    model = model_file(args.shape, args.weights, args.models_dir)
    log = args.log or args.json.with_suffix(".server.log")
    context = PROMPT_ROOM + args.max_tokens
    response_format = None if args.response_format == "text" else {"type": args.response_format}
    streams = measure(model, args.backend, args.streams, args.max_tokens, args.reps, context, log, response_format)
    if args.bench_json:
        with_bench(streams, bench_streams(args.bench_json))
    result = {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": git_commit(),
        "command": " ".join([sys.executable, "-m", "engine.bench_peer.serve_streams",
                             *(sys.argv[1:] if argv is None else argv)]),
        "gpus": gpu_state(), "kernel_dir": os.environ.get("RIGLLM_KERNEL_DIR"),
        "shape": args.shape, "weights": args.weights, "model": model.name, "backend": args.backend,
        "slots": max(args.streams), "context": context, "max_tokens": args.max_tokens,
        "reps": args.reps, "prompt": PROMPT, "response_format": args.response_format,
        "bench_json": str(args.bench_json) if args.bench_json else None,
        "streams": streams,
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1))
    print(render_table(result))
    return 0


if __name__ == "__main__":
    run_command(main)
