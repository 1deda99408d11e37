"""`rigllm serve [MODEL]`: the OpenAI-compatible API on one model (default: the random-weight demo model).

Binding beyond loopback without an API key is refused: the server would hand anyone on the network
a GPU and whatever the model can be made to say.
"""

from __future__ import annotations

import argparse
import ipaddress
import sys

from engine.generation.backend import BACKEND_CHOICES


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("serve", help="serve an OpenAI-compatible API (default: the random-weight demo model)")
    p.add_argument("model", nargs="?", help="a qwen35 GGUF file (omit for the demo model)")
    p.add_argument("--backend", choices=BACKEND_CHOICES, default="auto")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", help="require this key (Authorization: Bearer KEY); needed off loopback")
    p.add_argument("--max-queue", type=int, default=16, help="requests allowed to wait before 503 (default 16)")
    p.set_defaults(func=run)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def run(args: argparse.Namespace) -> int:
    from engine.errors import RigllmError

    if not is_loopback(args.host) and not args.api_key:
        raise RigllmError(f"refusing to serve on {args.host} without --api-key (only loopback may run keyless)")
    if args.max_queue < 1:
        raise RigllmError("--max-queue must be at least 1")

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
    service = ModelService.from_loaded(loaded)
    worker = GenerationWorker(lambda: open_backend(args.backend, loaded), service.tokenizer, args.max_queue)
    worker.start()
    try:
        print(f"[rigllm] serving '{service.model_id}' on the {worker.backend_name} backend at "
              f"http://{args.host}:{args.port}/v1", file=sys.stderr)
        uvicorn.run(create_app(service, worker, args.api_key, label), host=args.host, port=args.port,
                    log_level="warning")
    finally:
        worker.stop()
    return 0
