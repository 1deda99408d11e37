"""`rigllm convert HF_DIR OUT.gguf`: turn an HF Qwen3.5/3.6 checkpoint into a qwen35 GGUF, as llama.cpp would.

A checkpoint with a vision tower (Qwen3_5ForConditionalGeneration) also gets its mmproj GGUF, written
beside the model as `mmproj-<model stem>.gguf` (where the app and the server look for it) unless
`--mmproj PATH` names another place or `--no-mmproj` skips it.
"""

from __future__ import annotations

import argparse

TYPES = ("f32", "f16", "bf16", "q8_0")


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "convert",
        help="convert an HF Qwen3.5/3.6 checkpoint folder to GGUF (and its vision tower to an mmproj GGUF)",
        description="Convert the text model of an HF Qwen3.5/3.6 checkpoint (Qwen3_5ForCausalLM or "
        "Qwen3_5ForConditionalGeneration safetensors) to a qwen35 GGUF with the same tensors, types and keys "
        "llama.cpp's converter writes, and the vision tower (if any) to an mmproj GGUF the same way. "
        "Streams tensor by tensor; needs no torch.",
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
    vision = parser.add_mutually_exclusive_group()
    vision.add_argument("--mmproj", metavar="PATH", help="where to write the vision mmproj (default: beside OUT)")
    vision.add_argument("--no-mmproj", action="store_true", help="do not write the vision mmproj")
    parser.add_argument(
        "--mmproj-type",
        choices=TYPES,
        default="f16",
        help="weight type of the mmproj's matrices; default f16 (what the GPU vision tower computes in)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    import sys
    from pathlib import Path

    from engine.errors import RigllmError
    from engine.gguf.convert import convert
    from engine.vision.convert_mmproj import MMPROJ_ARCHITECTURE, convert_mmproj
    from engine.vision.mmproj_pairing import mmproj_path_for

    out = Path(args.out)
    if out.is_dir():
        raise RigllmError(f"{out} is a folder; give the .gguf file to write")
    mmproj_out = Path(args.mmproj) if args.mmproj else mmproj_path_for(out)
    if args.mmproj and mmproj_out.is_dir():
        raise RigllmError(f"{mmproj_out} is a folder; give the mmproj .gguf file to write")
    out.parent.mkdir(parents=True, exist_ok=True)

    def progress(name: str, done: int, total: int) -> None:
        print(f"\r[{done}/{total}] {name:<48}", end="", file=sys.stderr, flush=True)

    convert(args.hf_dir, out, args.type, include_mtp=not args.no_mtp, progress=progress)
    print(f"\nwrote {out} ({out.stat().st_size / 1e9:.2f} GB)", file=sys.stderr)

    config = json.loads((Path(args.hf_dir) / "config.json").read_text(encoding="utf-8"))
    has_vision = MMPROJ_ARCHITECTURE in (config.get("architectures") or []) and "vision_config" in config
    if args.no_mmproj:
        return 0
    if not has_vision:
        if args.mmproj:
            raise RigllmError(f"{args.hf_dir} has no vision tower, so there is no mmproj to write")
        return 0
    mmproj_out.parent.mkdir(parents=True, exist_ok=True)
    convert_mmproj(args.hf_dir, mmproj_out, args.mmproj_type)
    print(f"wrote {mmproj_out} ({mmproj_out.stat().st_size / 1e6:.1f} MB, vision tower)", file=sys.stderr)
    return 0
