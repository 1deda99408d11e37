"""`rigllm serve [MODEL]`: the OpenAI-compatible API, and with `--admin-key` (or `--admin`) the admin API,
on one model host (default model: the random-weight demo model; `--no-model` starts empty and waits
for `POST /admin/load`).

Binding beyond loopback without an API key is refused: the server would hand anyone on the network
a GPU and whatever the model can be made to say. The admin API (load any model of the model folders,
unload, read logs) never shares the API key: it has its own, or on a keyless loopback server it is
off unless `--admin` turns it on.
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
from engine.generation.serving.request_limits import (
    DEFAULT_MAX_BODY_BYTES, DEFAULT_MAX_IMAGE_PIXELS, DEFAULT_MAX_IMAGES, DEFAULT_MAX_TOKENS,
)
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
    admin = p.add_mutually_exclusive_group()
    admin.add_argument("--admin-key", help="turn the admin API (/admin/*) on, guarded by this key (it must differ "
                                           "from the API key, and also works for the OpenAI routes)")
    admin.add_argument("--admin-key-file", metavar="FILE", help="as --admin-key, the key read from FILE's first line")
    admin.add_argument("--admin", action="store_true",
                       help="turn the admin API on without a key of its own (keyless loopback servers only)")
    p.add_argument("--model-dir", action="append", default=[], type=Path, metavar="DIR",
                   help="a folder whose .gguf files the admin API may plan, inspect and load (repeatable; "
                        "always included: the served model's folder and the demo model's)")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN call the API (repeatable; default: no CORS headers)")
    p.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                   help="another Host name a keyless server answers (repeatable; default: localhost, 127.0.0.1, "
                        "[::1] and the bound address)")
    p.add_argument("--max-body-mb", type=float, default=DEFAULT_MAX_BODY_BYTES / 2**20,
                   help=f"largest request body, refused with 413 before it is read (default {DEFAULT_MAX_BODY_BYTES >> 20})")
    p.add_argument("--default-max-tokens", type=int, default=DEFAULT_MAX_TOKENS,
                   help=f"reply length when a request sets no max_tokens (default {DEFAULT_MAX_TOKENS}; never more "
                        "than the context's room)")
    p.add_argument("--max-images", type=int, default=DEFAULT_MAX_IMAGES,
                   help=f"images one request may send (default {DEFAULT_MAX_IMAGES})")
    p.add_argument("--max-image-megapixels", type=float, default=DEFAULT_MAX_IMAGE_PIXELS / 1e6,
                   help=f"largest image, read from its header before decoding (default {DEFAULT_MAX_IMAGE_PIXELS / 1e6:g})")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests allowed to wait for a slot; one more gets 503 with Retry-After (default 16)")
    p.add_argument("--reasoning-format", choices=("deepseek", "none"), default="deepseek",
                   help="where replies' reasoning goes: deepseek = reasoning_content (default), "
                        "none = inline <think>...</think> in content (for clients that drop reasoning_content)")
    p.add_argument("--public-metrics", action="store_true",
                   help="serve /metrics (Prometheus) without a key (default: it needs the key when one is set)")
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
                   help="on SIGTERM/Ctrl-C, let running requests finish this long, then end them (streams get "
                        "an error event and [DONE]; default 30)")
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
    from engine.api_keys import key_from_file, key_from_keyring

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


def admin_access(args: argparse.Namespace, key: str | None) -> tuple[bool, str | None]:
    """Whether the admin API is on, and its key; refuses the combinations that would share or drop a key."""
    from engine.errors import RigllmError
    from engine.api_keys import key_from_file

    admin_key = key_from_file(args.admin_key_file) if args.admin_key_file else args.admin_key
    if admin_key is not None and admin_key == key:
        raise RigllmError("--admin-key must differ from the API key (any API client could otherwise load models)")
    if args.admin and (key or not is_loopback(args.host)):
        raise RigllmError("--admin without a key is for keyless loopback servers; give --admin-key instead")
    enabled = args.admin or admin_key is not None
    if args.no_model and not enabled:
        raise RigllmError("--no-model needs the admin API to load a model: add --admin-key (or --admin on loopback)")
    return enabled, admin_key


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
    admin_on, admin_key = admin_access(args, key)
    for name in ("max_body_mb", "default_max_tokens", "max_images", "max_image_megapixels"):
        if getattr(args, name) <= 0:
            raise RigllmError(f"--{name.replace('_', '-')} must be positive")

    import uvicorn

    from engine.fixtures.demo_model import ensure_demo_model
    from engine.hub.library import Library
    from engine.server.admin import admin_router
    from engine.server.admin_models import models_router
    from engine.server.admin_host import DEMO_LABEL, ModelHost, open_with_progress
    from engine.server.admin_logs import install_log_ring
    from engine.server.app import create_app
    from engine.generation.serving.live_requests import LiveRequests
    from engine.generation.serving.request_limits import RequestLimits
    from engine.server.deadline_server import DeadlineServer
    from engine.server.http_policy import HttpPolicy
    from engine.server.model_folders import ModelFolders
    from engine.telemetry import SerializedSource, open_source

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    ring = install_log_ring()  # also raises rigllm's loggers to INFO: loads and unloads reach the journal
    placement = placement_options(args)
    from engine.generation.snapshot_store import default_root

    snapshot_root = None if args.no_snapshots else (args.snapshot_dir or default_root())
    host = ModelHost(args.backend, args.max_queue, slots=args.slots, prefix_cache_bytes=args.prefix_cache_mb << 20,
                     opener=functools.partial(open_with_progress, speculative=args.mtp == "on", **placement),
                     snapshot_root=snapshot_root,
                     speculative=args.mtp == "on",
                     limits=RequestLimits(args.default_max_tokens, args.max_images,
                                          round(args.max_image_megapixels * 1e6)))
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
            policy = HttpPolicy(api_key=key, admin_key=admin_key, cors_origins=tuple(cors_origins),
                                bind_host=args.host, allowed_hosts=tuple(args.allowed_host),
                                max_body_bytes=round(args.max_body_mb * 2**20))
            live = LiveRequests()
            # Stop: uvicorn stops accepting and lets running requests finish; at --shutdown-timeout the ones
            # still running are ended (streams with an error and [DONE]); then the app's shutdown stops the
            # worker, freeing the cards, while the event loop still runs.
            app = create_app(host, policy=policy, live=live, on_shutdown=host.close, telemetry=telemetry,
                             public_metrics=args.public_metrics, reasoning_format=args.reasoning_format)
            if admin_on:
                served = [Path(args.model).parent] if args.model else []
                # pulls land in the first --model-dir (else RIGLLM_MODELS_DIR or <data dir>/models), which the
                # admin API may then load from
                library = Library(Path(args.model_dir[0]) if args.model_dir else None)
                folders = ModelFolders([*args.model_dir, library.root, *served, ensure_demo_model().parent])
                app.include_router(admin_router(host, telemetry, ring, folders))
                app.include_router(models_router(library))
            DeadlineServer(uvicorn.Config(app, host=args.host, port=args.port, log_level="warning"), live,
                           args.shutdown_timeout).run()
    finally:
        host.close()
        telemetry.close()
    print("[rigllm] stopped", file=sys.stderr)
    return 0
