"""`rigllm convert HF_DIR OUT.gguf`: turn an HF Qwen3.5/3.6 checkpoint into a qwen35 GGUF, as llama.cpp would."""

from __future__ import annotations

import argparse

TYPES = ("f32", "f16", "bf16", "q8_0")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert an HF Qwen3.5/3.6 checkpoint folder to GGUF",
        description="Convert the text model of an HF Qwen3.5/3.6 checkpoint (Qwen3_5ForCausalLM or "
        "Qwen3_5ForConditionalGeneration safetensors) to a qwen35 GGUF with the same tensors, types and keys "
        "llama.cpp's converter writes. Streams tensor by tensor; needs no torch.",
    )
    parser.add_argument("hf_dir", help="the HF model folder (config.json, *.safetensors, tokenizer.json)")
    parser.add_argument("out", help="the .gguf file to write")
    parser.add_argument(
        "--type",
        choices=TYPES,
        default="bf16",
        help="weight type of the 2-D matrices (norms, 1-D tensors and ssm_conv1d stay F32); "
        "default bf16, which is lossless for the released BF16 checkpoints",
    )
    parser.add_argument("--no-mtp", action="store_true", help="leave out the MTP (speculative drafter) block")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import sys
    from pathlib import Path

    from engine.errors import RigllmError
    from engine.gguf.convert import convert

    out = Path(args.out)
    if out.is_dir():
        raise RigllmError(f"{out} is a folder; give the .gguf file to write")

    def progress(name: str, done: int, total: int) -> None:
        print(f"\r[{done}/{total}] {name:<48}", end="", file=sys.stderr, flush=True)

    convert(args.hf_dir, out, args.type, include_mtp=not args.no_mtp, progress=progress)
    print(f"\nwrote {out} ({out.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)
    return 0
