"""Command-line options that place a model on cards and pick its KV cache format and sparse prefill, shared by
the commands that open a backend (generate, serve, eval-fixture) so they read the same way everywhere."""

from __future__ import annotations

import argparse
from typing import Any

from engine.errors import RigllmError

GIB = 1 << 30


def add_placement_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kv", default="f16", metavar="FORMAT",
                   help="KV cache format: f16 (default) or k<bits>v<bits> with bits 8, 4 or 3, e.g. k8v3 "
                        "(keys at 8 bits, values at 3: 3-bit keys cost quality)")
    p.add_argument("--cards", metavar="GPUS",
                   help="spread the layers over these GPUs, e.g. 0,1,2 (a GPU may repeat: several logical cards "
                        "on one GPU); default: GPU 0 alone")
    p.add_argument("--card-gib", type=float, metavar="GIB",
                   help="cap each card's memory, e.g. 16 to plan and run like a CMP 100-210 on a bigger GPU")
    p.add_argument("--sparse", action="store_true",
                   help="prefill long prompts with the block-sparse attention profile beside the model (made by "
                        "`rigllm calibrate-sparse MODEL --block 64`; with a quantised KV cache the GPU takes A-shape and dense heads only: calibrate with --kinds a_shape); default: dense")
    p.add_argument("--split", metavar="LAYERS",
                   help="layers per card, e.g. 22,22,20 (default: the memory plan's split by free memory and "
                        "per-layer cost)")


def placement_options(args: argparse.Namespace) -> dict[str, Any]:
    """`open_backend` keyword arguments (kv, cards, split, sparse) from the parsed options."""
    from engine.generation.backend import CardSpec
    from engine.model.kv_formats import kv_format

    kv_format(args.kv)  # refuses an unknown format with the list of valid ones
    capacity = int(args.card_gib * GIB) if args.card_gib else None
    if capacity is not None and capacity <= 0:
        raise RigllmError("--card-gib must be positive")
    cards = None
    if args.cards or capacity:
        try:
            devices = [int(d) for d in (args.cards or "0").split(",")]
        except ValueError:
            raise RigllmError(f"--cards takes GPU numbers separated by commas, not '{args.cards}'") from None
        cards = [CardSpec(d, capacity) for d in devices]
    split = None
    if args.split:
        split = list(parse_split(args.split))
        if cards is None or len(split) != len(cards):
            raise RigllmError("--split needs --cards with one GPU per count")
    return {"kv": args.kv, "cards": cards, "split": split, "sparse": args.sparse}


def parse_split(text: str) -> tuple[int, ...]:
    """`--split 22,22,20` as layer counts (the planner checks that they cover the model)."""
    try:
        return tuple(int(n) for n in text.split(","))
    except ValueError:
        raise RigllmError(f"--split takes layer counts separated by commas, not '{text}'") from None
