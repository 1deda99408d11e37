"""`rigllm serve [MODEL]`: the OpenAI-compatible API on one model (default: the random-weight demo model).

Binding beyond loopback without an API key is refused: the server would hand anyone on the network
a GPU and whatever the model can be made to say.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import sys

from engine.generation.backend import BACKEND_CHOICES
from engine.server.worker import DEFAULT_PREFIX_CACHE_BYTES, DEFAULT_SLOTS


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (default: the random-weight demo model)")
    p.add_argument("model", nargs="?", help="a qwen35 GGUF file (omit for the demo model)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    key = p.add_mutually_exclusive_group()
    key.add_argument("--api-key", help="require this key (Authorization: Bearer KEY); needed off loopback")
    key.add_argument("--use-keyring", action="store_true",
                     help="require the key stored in the OS keyring (service 'rigllm', user 'api-key')")
    p.add_argument("--cors-origin", action="append", default=[], metavar="ORIGIN",
                   help="let browser pages from ORIGIN call the API (repeatable; default: no CORS headers)")
    p.add_argument("--max-queue", type=int, default=16, help="requests allowed to wait before 503 (default 16)")
    p.add_argument("--context", type=int, help="tokens one conversation may hold (default: the model's; sizes the GPU KV cache)")
    p.add_argument("--slots", type=int, default=DEFAULT_SLOTS,
                   help=f"requests decoded together (default {DEFAULT_SLOTS}; on a GPU each holds a KV cache of --context tokens)")
    p.add_argument("--prefix-cache-mb", type=int, default=DEFAULT_PREFIX_CACHE_BYTES >> 20,
                   help="host memory for kept chat-turn states, so follow-up turns skip their prefix (0: off)")
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def api_key(args: argparse.Namespace) -> str | None:
    """The key from --api-key or the keyring; checked against the bind address before anything loads."""
    from engine.errors import RigllmError
    from engine.server.access import key_from_keyring

    key = key_from_keyring() if args.use_keyring else args.api_key
    if not is_loopback(args.host) and not key:
        raise RigllmError(f"refusing to serve on {args.host} without --api-key or --use-keyring "
                          "(only loopback may run keyless)")
    return key


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

    import uvicorn

    from engine.generation.backend import open_backend
    from engine.gguf.demo_model import ensure_demo_model
    from engine.gguf.loader import load_model
    from engine.server.app import create_app
    from engine.server.model_service import ModelService
    from engine.server.worker import GenerationWorker

    label = ""
    if args.model is None:
        path = ensure_demo_model()
        label = "demo model (random weights, its output is gibberish)"
        print(f"[rigllm] no model given: serving the {label}", file=sys.stderr)
    else:
        path = args.model
    loaded = load_model(path)
    context = min(args.context or loaded.config.context_length, loaded.config.context_length)
    if context < 2:
        raise RigllmError("--context must be at least 2")
    service = dataclasses.replace(ModelService.from_loaded(loaded), context_length=context)
    worker = GenerationWorker(lambda: open_backend(args.backend, loaded, context=context, slots=args.slots),
                              service.tokenizer, args.max_queue, slots=args.slots,
                              prefix_cache_bytes=args.prefix_cache_mb << 20)
    worker.start()
    try:
        print(f"[rigllm] serving '{service.model_id}' on the {worker.backend_name} backend at "
              f"http://{args.host}:{args.port}/v1", file=sys.stderr)
        uvicorn.run(create_app(service, worker, key, label, cors_origins), host=args.host, port=args.port,
                    log_level="warning")
    finally:
        worker.stop()
    return 0
