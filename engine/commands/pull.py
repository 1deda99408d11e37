"""`rigllm pull REPO [--file NAME | --quant Q8_0]`: download a GGUF (and its paired mmproj) from the Hugging
Face Hub into the models folder, resuming a part an earlier try left and checking the Hub's sha256."""

from __future__ import annotations

import argparse
import sys

from engine.commands.hub_args import add_models_dir


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("pull", help="download a Qwen3.5/3.6 GGUF from the Hugging Face Hub",
                                   description="Download one model file of REPO (default: its Q8_0 file) and the "
                                   "vision projector paired with it. Interrupted downloads resume; HF_TOKEN is "
                                   "used for gated repositories, HTTPS_PROXY for a proxy.")
    parser.add_argument("repo", help="owner/name on the Hub")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--file", help="the file name in the repository")
    which.add_argument("--quant", help="the quant type, e.g. Q8_0, BF16 (default Q8_0)")
    parser.add_argument("--no-mmproj", action="store_true", help="do not download the vision projector")
    add_models_dir(parser)
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.hub.download import Progress
    from engine.hub.library import Library
    from engine.hub.pull import pull

    tty = sys.stderr.isatty()
    last = {"file": ""}

    def show(p: Progress) -> None:
        if p.stage == "verified":
            print(f"\r{p.file}: {p.line()} · sha256 verified" + " " * 8, file=sys.stderr)
        elif tty or p.file != last["file"]:  # a log file gets one line per file, a terminal a live one
            print(f"\r{p.file}: {p.line()}" + " " * 8, end="" if tty else "\n", file=sys.stderr, flush=True)
        last["file"] = p.file

    library = Library(args.models_dir)
    done = pull(args.repo, library, file=args.file, quant=args.quant, with_mmproj=not args.no_mmproj, progress=show)
    print(done.model)
    if done.mmproj is not None:
        print(done.mmproj)
    return 0
