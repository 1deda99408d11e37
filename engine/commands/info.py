"""`rigllm info FILE`: validate a model file and report its shape, sizes and per-card split."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "info",
        help="describe a Qwen3.5/3.6 GGUF: parameters, layers, types, sizes, per-card split",
        description="Validate a qwen35 GGUF and print its architecture, parameter counts, layer pattern, context, "
        "tensor types, weight bytes, KV bytes per token for each KV format, GDN state bytes and the per-card "
        "split for 1-4 cards of 16 GB.",
    )
    parser.add_argument("file", help="the .gguf model file")
    parser.add_argument("--json", action="store_true", help="print machine-readable JSON")
    parser.add_argument(
        "--context", type=int, default=None, help="context (tokens) for the per-card split; default: the model's"
    )
    parser.add_argument(
        "--kv",
        default=None,
        help="KV format for the per-card split (f16, k8v8, k8v4, k8v3, k4v4, k3v3, or any k<bits>v<bits>); "
        "default: k8v3",
    )
    for side in ("k", "v"):
        parser.add_argument(
            f"--{side}-bits", type=int, default=None,
            help=f"bits of the {side.upper()} cache (16, 8, 4, 3), overriding --kv's {side.upper()} side",
        )
    parser.add_argument("--no-mtp", action="store_true", help="plan without the MTP block even if the file has one")
    parser.add_argument("--split", metavar="LAYERS",
                        help="plan these layers per card instead (e.g. 22,22,20 for three cards), as generate/serve "
                             "--split would load them")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json

    from engine.errors import RigllmError
    from engine.model.kv_formats import DEFAULT_LONG_CONTEXT_FORMAT
    from engine.model.memory_plan import resolve_kv_format
    from engine.commands.info_text import render_text
    from engine.model.model_info import describe
    from engine.commands.placement_args import parse_split
    from engine.gguf.loader import load_model

    if args.context is not None and args.context < 1:
        raise RigllmError(f"--context must be at least 1, not {args.context}")
    kv = resolve_kv_format(args.kv or DEFAULT_LONG_CONTEXT_FORMAT, args.k_bits, args.v_bits)
    split = parse_split(args.split) if args.split else None
    model = load_model(args.file)
    info = describe(model, args.context, kv.name, with_mtp=False if args.no_mtp else None, split=split)
    print(json.dumps(info, indent=2) if args.json else render_text(info))
    return 0
