"""Options the Hub commands share (`rigllm models ...`, `rigllm pull`): the models folder, and the cards,
context and KV format a fit verdict is priced at."""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.model.kv_formats import DEFAULT_LONG_CONTEXT_FORMAT

DEFAULT_CONTEXT = 32768


def add_models_dir(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--models-dir", type=Path, default=None, metavar="DIR",
                        help="the models folder (default: $RIGLLM_MODELS_DIR, else <user data dir>/models)")


def add_fit(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--context", type=int, default=DEFAULT_CONTEXT, help=f"tokens to price (default {DEFAULT_CONTEXT})")
    parser.add_argument("--kv", default=DEFAULT_LONG_CONTEXT_FORMAT,
                        help=f"KV format to price (f16, k8v8, k8v3, ...; default {DEFAULT_LONG_CONTEXT_FORMAT})")
    parser.add_argument("--cards", type=int, default=None, metavar="N",
                        help="price on N cards of --card-gb instead of this machine's cards")
    parser.add_argument("--card-gb", type=int, default=16, metavar="GB", help="memory of each --cards card (default 16)")


def cards_of(args: argparse.Namespace):
    """(card profiles, a line saying which) from --cards/--card-gb, else this machine's, else one 16 GB card."""
    from engine.errors import RigllmError
    from engine.hub.fit import detected_cards
    from engine.model.memory_plan import GIB, CardProfile

    if args.context < 1:
        raise RigllmError(f"--context must be at least 1, not {args.context}")
    if args.cards is not None:
        if args.cards < 1 or args.card_gb < 1:
            raise RigllmError("--cards and --card-gb must be at least 1")
        return [CardProfile(f"card {i}", args.card_gb * GIB) for i in range(args.cards)], f"{args.cards} × {args.card_gb} GB (--cards)"
    cards, note = detected_cards()
    if cards:
        return cards, f"this machine's {note}"
    return [CardProfile("card 0", 16 * GIB)], f"{note}: priced for one 16 GB card (use --cards N)"
