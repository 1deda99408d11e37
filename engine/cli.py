"""`rigllm` console script: one subcommand per module in `engine.commands`, errors as one clear line.

Each command module exposes `register(subparsers)` (adds its parser and sets `func`) and keeps its
heavy imports inside the function it runs, so `rigllm --help` stays fast. Other packages (the Qt app)
add subcommands through the `rigllm.commands` entry-point group, which keeps Qt out of `engine/`.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from importlib.metadata import entry_points

from engine.errors import RigllmError

COMMAND_MODULES = ("info", "convert", "make_test_model", "generate", "build_kernels", "bench", "serve", "doctor", "eval_fixture",
                   "calibrate_sparse", "debug", "models", "pull")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rigllm", description="Qwen3.5/3.6 on CMP 100-210 cards")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in COMMAND_MODULES:
        importlib.import_module(f"engine.commands.{name}").register(subparsers)
    for ep in entry_points(group="rigllm.commands"):
        ep.load()(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except RigllmError as err:
        print(f"rigllm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("rigllm: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `rigllm info X | head`: the reader left; not an error of ours
        sys.stderr.close()
        return 0


if __name__ == "__main__":
    sys.exit(main())
