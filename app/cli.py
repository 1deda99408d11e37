"""`rigllm gui`: registered through the `rigllm.commands` entry point, so `engine/` never imports Qt."""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    from app.main import add_arguments, run

    p = subparsers.add_parser("gui", help="open the desktop app (chat, model loading, rig monitor, API toggle)")
    add_arguments(p)
    p.set_defaults(func=run)
