"""`rigllm serve [MODEL]`: the OpenAI-compatible API and the admin API on one model host (default model:
the random-weight demo model; `--no-model` starts empty and waits for `POST /admin/load`).

Binding beyond loopback without an API key is refused: the server would hand anyone on the network
a GPU and whatever the model can be made to say.
"""

from __future__ import annotations

import argparse
import functools
import ipaddress
import logging
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from engine.commands.placement_args import add_placement_args, placement_options
from engine.backends import BACKEND_CHOICES
from engine.generation.serving.worker import DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_SLOTS

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (default: the random-weight demo model)")
    p.add_argument("model", nargs="?", help="a qwen35 GGUF file (omit for the demo model)")
    p.add_argument("--no-model", action="store_true",
                   help="start with no model loaded; load one later with POST /admin/load")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require this key (Authorization: Bearer KEY); needed off loopback")
    key.add_argument("--api-key-file", metavar="FILE",
                     help="require the key stored in FILE (first line; for services: keeps it out of `ps`)")
    key.add_argument("--use-keyring", action="store_true",
                     help="require the key stored in the OS keyring (service 'rigllm', user 'api-key')")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN call the API (repeatable; default: no CORS headers)")
    p.add_argument("--max-queue", type=int, default=16, help="requests allowed to wait before 503 (default 16)")
    p.add_argument("--reasoning-format", choices=("deepseek", "none"), default="deepseek",
                   help="where replies' reasoning goes: deepseek = reasoning_content (default), "
                        "none = inline <think>...</think> in content (for clients that drop reasoning_content)")
    p.add_argument("--public-metrics", action="store_true",
                   help="serve /metrics (Prometheus) without the API key (default: it needs the key when one is set)")
    p.add_argument("--context", type=int, help="tokens one conversation may hold (default: the model's; sizes the GPU KV cache)")
    add_placement_args(p)
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                   help=f"requests decoded together (default {DEFAULT_SLOTS}; on a GPU each holds a KV cache of --context tokens)")
    p.add_argument("--snapshot-dir", type=Path, metavar="DIR",
                   help="keep chat-turn states on disk here too, so a restart resumes chats without re-prefilling "
                        "(default: <data dir>/snapshots)")
    p.add_argument("--mtp", choices=("on", "off"), default="on",
                   help="speculative decoding with the model's MTP head when it has one (default on; requests "
                        "can opt out with \"speculative\": false)")
    p.add_argument("--no-snapshots", action="store_true", help="keep chat-turn states in memory only")
    p.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_BYTES >> 20,
                   help="host memory for kept chat-turn states, so follow-up turns skip their prefix (0: off)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/Ctrl-C, let running requests finish this long, then cancel them (default 30)")
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key, --api-key-file or the keyring; checked against the bind address before anything loads."""
    from engine.errors import RigllmError
    from engine.server.access import key_from_file, key_from_keyring

    if args.use_keyring:
        key = key_from_keyring()
    elif args.api_key_file:
        key = key_from_file(args.api_key_file)
    else:
        key = args.api_key
    if not is_loopback(args.host) and not key:
        raise RigllmError(f"refusing to serve on {args.host} without --api-key, --api-key-file or --use-keyring "
                          "(only loopback may run keyless)")
    return key


@contextmanager
def stop_requests(on_stop: threading.Event, cancel_load) -> Iterator[None]:
    """SIGTERM/SIGINT set `on_stop` and cancel a load in flight, instead of killing the process.

    During the startup preload this makes `systemctl stop` cancel the load (the backend frees what it
    took) and exit 0. While serving, uvicorn installs its own handlers (graceful shutdown) and, once
    done, re-raises the signal with the handler it found: this one, so the process is not killed
    before the model is unloaded and the cards are freed.
    """

    def handler(_signum: int, _frame: object) -> None:
        on_stop.set()
        cancel_load()

    previous = {sig: signal.signal(sig, handler) for sig in STOP_SIGNALS}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def run(args: argparse.Namespace) -> int:
    from engine.errors import RigllmError
    from engine.server.access import check_cors_origins

    key = api_key(args)
    cors_origins = check_cors_origins(args.cors_origin)
    if args.max_queue < 1:
        raise RigllmError("--max-queue must be at least 1")
    if args.slots < 1:
        raise RigllmError("--slots must be at least 1")
    if args.prefix_cache_mb < 0:
        raise RigllmError("--prefix-cache-mb cannot be negative")
    if args.context is not None and args.context < 2:
        raise RigllmError("--context must be at least 2")
    if args.no_model and args.model is not None:
        raise RigllmError("give a model or --no-model, not both")

    import uvicorn

    from engine.fixtures.demo_model import ensure_demo_model
    from engine.server.admin import admin_router
    from engine.server.admin_host import DEMO_LABEL, ModelHost, open_with_progress
    from engine.server.admin_logs import install_log_ring
    from engine.server.app import create_app
    from engine.telemetry import SerializedSource, open_source

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    ring = install_log_ring()  # also raises rigllm's loggers to INFO: loads and unloads reach the journal
    placement = placement_options(args)
    from engine.generation.snapshot_store import default_root

    snapshot_root = None if args.no_snapshots else (args.snapshot_dir or default_root())
    host = ModelHost(args.backend, args.max_queue, slots=args.slots, prefix_cache_bytes=args.prefix_cache_mb << 20,
                     opener=functools.partial(open_with_progress, speculative=args.mtp == "on", **placement),
                     snapshot_root=snapshot_root,
                     speculative=args.mtp == "on")
    telemetry = SerializedSource(open_source())  # /admin/cards and /metrics scrapes read it from several threads
    stopping = threading.Event()
    url = f"http://{args.host}:{args.port}/v1"
    try:
        with stop_requests(stopping, host.cancel_load):
            if not args.no_model:
                label = DEMO_LABEL if args.model is None else ""
                if label:
                    print(f"[rigllm] no model given: serving the {label}", file=sys.stderr)
                try:
                    host.load(args.model or ensure_demo_model(), context=args.context, label=label)
                except RigllmError:
                    if not stopping.is_set():
                        raise
                if stopping.is_set():
                    print("[rigllm] stopped during the startup load; the cards were freed", file=sys.stderr)
                    return 0
                service, worker = host.require()
                print(f"[rigllm] serving '{service.model_id}' on the {worker.backend_name} backend at {url}",
                      file=sys.stderr)
            else:
                print(f"[rigllm] no model loaded; load one with POST {url.removesuffix('/v1')}/admin/load",
                      file=sys.stderr)
            app = create_app(host, key, cors_origins, telemetry=telemetry, public_metrics=args.public_metrics,
                             reasoning_format=args.reasoning_format)
            app.include_router(admin_router(host, telemetry, ring))
            # Stop: uvicorn stops accepting, lets running requests finish for up to the timeout, then cancels
            # them (their jobs are cancelled); host.close() below stops the worker, freeing the cards.
            uvicorn.run(app, host=args.host, port=args.port, log_level="warning",
                        timeout_graceful_shutdown=args.shutdown_timeout)
    finally:
        host.close()
        telemetry.close()
    print("[rigllm] stopped", file=sys.stderr)
    return 0
