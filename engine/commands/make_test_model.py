"""`rigllm make-test-model OUT`: write a random-weight test model (tiny HF+GGUF, full-size shape, or the demo)."""

from __future__ import annotations

import argparse

from engine.commands.convert import TYPES

SHAPE_TYPES = (*TYPES, "q4_k_m", "q5_k_m", "q6_k")  # mirrors engine.gguf.tensor_plan.WEIGHT_TYPES (a unit test checks)


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "make-test-model",
        help="write a random-weight test model: tiny HF checkpoint + GGUF, a full-size shape, or the demo model",
        description="Random weights say nothing about quality; these files are for tests, speed and memory work. "
        "--variant writes a tiny HF folder plus its GGUF into OUT (needs the dev extra: torch, transformers); "
        "--shape writes a full-size synthetic GGUF to OUT in constant memory; --demo writes the demo model to OUT.",
    )
    parser.add_argument("out", help="output folder (--variant) or .gguf file (--shape, --demo)")
    kind = parser.add_mutually_exclusive_group(required=True)
    kind.add_argument("--variant", help="tiny HF model variant (see the error message for the list)")
    kind.add_argument("--shape", choices=("0.8b", "9b", "27b"), help="released Qwen3.5 size, random weights")
    kind.add_argument("--demo", action="store_true", help="the small demo model the app uses without a model")
    parser.add_argument("--type", choices=SHAPE_TYPES, default=None,
                        help="weight type (default: f32 for --variant, q8_0 for --shape); the K-quant types "
                        "(llama.cpp's per-tensor choices) are for --shape only")
    parser.add_argument("--seed", type=int, default=0, help="random seed (default 0)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from engine.errors import RigllmError

    out = Path(args.out)
    if args.demo:
        if args.type is not None or args.seed != 0:
            raise RigllmError("--demo has a fixed recipe; --type and --seed do not apply")
        from engine.fixtures.demo_model import write_demo_model

        write_demo_model(out)
    elif args.shape:
        from engine.gguf.shapes import shape_config
        from engine.fixtures.synthetic import write_random_model

        def progress(done: int, total: int) -> None:
            print(f"\r{done / 1e9:6.2f} / {total / 1e9:.2f} GB", end="", file=sys.stderr, flush=True)

        write_random_model(
            out, shape_config(args.shape), args.type or "q8_0", seed=args.seed,
            name=f"rigllm synthetic Qwen3.5-{args.shape.upper()} shape (random weights)", progress=progress,
        )
        print(file=sys.stderr)
    else:
        from importlib.util import find_spec

        if args.type is not None and args.type not in TYPES:
            raise RigllmError(f"--type {args.type} is for --shape; --variant writes {', '.join(TYPES)}")
        if find_spec("torch") is None or find_spec("transformers") is None:
            raise RigllmError("--variant needs torch and transformers (pip install 'rigllm[dev]')")
        from engine.fixtures.tiny_models import VARIANTS, make_tiny_model

        if args.variant not in VARIANTS:
            raise RigllmError(f"unknown variant '{args.variant}' (known: {', '.join(VARIANTS)})")
        make_tiny_model(out, args.variant, args.seed, gguf_type=args.type or "f32")
    print(f"wrote {out}", file=sys.stderr)
    return 0
