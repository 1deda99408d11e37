"""`rigllm calibrate-sparse MODEL`: choose each attention head's sparse prefill pattern, save the profile.

Runs the reference forward over a calibration prompt (a text file, or the built-in demo corpus),
measures every head's relative error against dense attention for each candidate pattern, keeps the
cheapest within the tolerance, and writes `<model>.sparse.json` beside the model (engine.sparse).
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "calibrate-sparse",
        help="measure per-head sparse attention patterns for long prefill and save the profile beside the model",
        description="Runs one dense reference prefill over a calibration prompt and, for each attention head, keeps "
        "the cheapest pattern (A-shape, vertical-slash, block top-k, or dense) whose relative output error stays "
        "within the tolerance. The profile is written as <model>.sparse.json and is tied to that exact file.",
    )
    parser.add_argument("model", help="GGUF model file")
    parser.add_argument("--prompt-file", help="UTF-8 text to calibrate on (default: the built-in demo corpus)")
    parser.add_argument("--tokens", type=int, default=2048, help="calibration length in tokens; the text repeats to fill it (default 2048)")
    parser.add_argument("--tolerance", type=float, default=0.10, help="largest relative L2 error per head (default 0.10)")
    parser.add_argument("--block", type=int, default=64, help="block size in tokens (default 64)")
    parser.add_argument("--min-length", type=int, default=4096, help="prompts shorter than this stay dense (default 4096)")
    parser.add_argument("--kinds", default="a_shape,vertical_slash,block_topk",
                        help="pattern kinds to choose from, comma-separated (default: all three; dense is always "
                             "kept). The GPU with a quantised KV cache serves a_shape only")
    parser.add_argument("--output", help="profile path (default: <model>.sparse.json beside the model)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from engine.errors import RigllmError
    from engine.generation.demo_corpus import DEMO_CORPUS
    from engine.generation.tokenizer import Tokenizer
    from engine.gguf.loader import load_model
    from engine.reference.model import ReferenceModel
    from engine.sparse.calibrate import calibrate
    from engine.sparse.profile import (
        SparseProfile,
        model_identity,
        profile_path,
        save_profile,
    )

    if args.tokens < 2 * args.block or args.block < 1:
        raise RigllmError("--tokens must cover at least two blocks (--block ≥ 1)")
    if args.tolerance < 0:
        raise RigllmError("--tolerance must be non-negative")
    from engine.reference.sparse_attention import KINDS

    kinds = {k.strip() for k in args.kinds.split(",") if k.strip()}
    if not kinds or not kinds <= set(KINDS) - {"dense"}:
        raise RigllmError(f"--kinds takes some of a_shape, vertical_slash, block_topk, not '{args.kinds}'")
    loaded = load_model(args.model)
    text = Path(args.prompt_file).read_text(encoding="utf-8") if args.prompt_file else "".join(DEMO_CORPUS)
    ids = Tokenizer.from_model_file(loaded.file).encode(text, parse_special=False)
    if not ids:
        raise RigllmError("the calibration text encodes to no tokens")
    tokens = (ids * (args.tokens // len(ids) + 1))[: args.tokens]
    model = ReferenceModel.from_model_file(loaded.file)
    layers = calibrate(model, tokens, args.block, args.tolerance, kinds)
    profile = SparseProfile(model_identity(loaded.file), args.block, args.min_length, args.tolerance, len(tokens), layers)
    out = Path(args.output) if args.output else profile_path(Path(args.model))
    save_profile(profile, out)
    for layer, heads in sorted(layers.items()):
        for h, c in enumerate(heads):
            print(f"layer {layer:3d} head {h:3d}  {c.pattern.label:28s} error {c.error:.4f}  density {c.density:.3f}")
    n_sparse = sum(c.pattern.kind != "dense" for heads in layers.values() for c in heads)
    n_all = sum(len(heads) for heads in layers.values())
    print(f"{n_sparse}/{n_all} heads sparse at tolerance {args.tolerance}; profile written to {out}")
    return 0
