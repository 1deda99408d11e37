"""`rigllm eval-fixture MODEL`: task accuracy per context length of a trained fixture, and MTP acceptance.

The trained fixtures (tests/fixtures/trained, issue 14) have learned tasks with exact answers, so this
is how a backend, KV format or other setting is judged on quality: the same deterministic samples,
scored as whole-answer accuracy per (task, context length). With the reference backend it also
measures the MTP head's draft acceptance (K=1) while the answers are decoded.
"""

from __future__ import annotations

import argparse

DEFAULT_LENGTHS = "512,2048"


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "eval-fixture",
        help="score a trained fixture model: accuracy per task and context length, MTP acceptance",
        description="Runs the fixture's synthetic tasks (recall, copy, arith) at each context length with greedy "
        "decoding and prints accuracy (whole answer right) per cell, plus MTP draft acceptance and tokens per "
        "verify (K=1) when the reference backend runs a model with an MTP head.",
    )
    parser.add_argument("model", help="fixture GGUF (e.g. tests/fixtures/trained/fixture-q8_0.gguf)")
    parser.add_argument("--task", default="recall,copy,arith", help="comma-separated tasks (default: all three)")
    parser.add_argument("--lengths", default=DEFAULT_LENGTHS, help=f"context lengths in tokens (default {DEFAULT_LENGTHS})")
    parser.add_argument("--samples", type=int, default=20, help="samples per task and length (default 20)")
    parser.add_argument("--seed", type=int, default=0, help="sample seed (default 0; training used other samples)")
    parser.add_argument("--backend", choices=("reference", "cuda"), default="reference", help="default: reference")
    parser.add_argument("--sparse", action="store_true",
                        help="prefill with the calibrated sparse attention profile beside the model (either backend; "
                             "the cuda backend needs a profile made with --block 64)")
    parser.add_argument("--kv-format", help="KV cache format, e.g. k8v3 (default f16; either backend)")
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON to PATH ('-' for stdout)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from engine.errors import RigllmError
    from engine.fixtures.evaluate import evaluate
    from engine.fixtures.tasks import TASKS
    from engine.backends import open_backend
    from engine.reference.backend import ReferenceBackend
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.loader import load_model

    tasks = [t.strip() for t in args.task.split(",") if t.strip()]
    unknown = [t for t in tasks if t not in TASKS]
    if unknown or not tasks:
        raise RigllmError(f"unknown task(s) {', '.join(unknown) or '(none)'} (known: {', '.join(TASKS)})")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        raise RigllmError(f"--lengths must be comma-separated integers, not '{args.lengths}'") from None
    if min(lengths) < 128:
        raise RigllmError("context lengths below 128 tokens leave no room for the task items")
    if args.samples < 1:
        raise RigllmError("--samples must be at least 1")
    if args.kv_format is not None:
        from engine.model.kv_formats import kv_format_of

        kv_format_of(args.kv_format)  # unknown names fail here with the list of formats

    loaded = load_model(args.model)
    tokenizer = Tokenizer.from_model_file(loaded.file)
    backend = open_backend(args.backend, loaded, context=max(lengths) + 64, sparse=args.sparse,
                           kv=args.kv_format or "f16")
    # the reference evaluator keeps its own sequence state (it also runs the MTP head); the card's is the backend's
    runner_kv = args.kv_format if isinstance(backend, ReferenceBackend) else None
    setting = {"model": Path(args.model).name, "backend": backend.name, "kv_format": args.kv_format or "f16",
               "sparse": args.sparse}
    print(f"{setting['model']}  backend={setting['backend']}  kv={setting['kv_format']}  "
          f"sparse={'on' if args.sparse else 'off'}  samples={args.samples}")
    print(f"{'task':<8}{'length':>8}{'accuracy':>10}{'tokens':>8}{'mtp acc':>9}{'tok/verify':>11}")

    def show(score) -> None:
        s = score.summary()
        mtp = s.get("mtp") or {}
        acc, tok = mtp.get("acceptance"), mtp.get("tokens_per_verify")
        print(
            f"{s['task']:<8}{s['length']:>8}{s['accuracy']:>10.3f}{s['token_accuracy']:>8.3f}"
            f"{'' if acc is None else f'{acc:.3f}':>9}{'' if tok is None else f'{tok:.3f}':>11}",
            flush=True,
        )

    try:
        scores = evaluate(backend, tokenizer, tasks, lengths, args.samples, args.seed, runner_kv, progress=show)
    finally:
        backend.close()
    result = {"setting": setting, "samples": args.samples, "seed": args.seed, "cells": [s.summary() for s in scores]}
    if args.json == "-":
        json.dump(result, sys.stdout, indent=2)
        print()
    elif args.json:
        Path(args.json).write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
    return 0
