"""The admin API beside the OpenAI one: plan, load/unload with progress, card telemetry, recent logs.

It is what a headless rig is driven by from the desktop app ("Connect to rig"). Included in the app
that `create_app` makes when `rigllm serve` is given `--admin-key` (or `--admin` on a keyless
loopback server); `/admin/*` then takes only the admin key (engine.server.http_policy), and model
paths reach only the GGUF files of the configured model folders (engine.server.model_folders). Plans are
exactly `rigllm info --json`'s (`engine.model.model_info.describe`), so the app, the CLI and the remote rig
show one verdict.

    GET  /admin/plan?model=PATH&context=N&kv=FORMAT   planner verdict for 1-4 cards (default: the loaded model;
                                                      PATH: absolute, or relative to a model folder)
    GET  /admin/inspect?model=PATH                    the file's name and footprint (default: the demo model),
                                                      which the app prices on the rig's cards like a local file
    GET  /admin/load                                  load state and per-card progress
    POST /admin/load   {"model": PATH, "context": N, "backend": "auto|reference|cuda"}  202, then poll
                       (no "model": the generated demo model, as `rigllm serve` without one)
    POST /admin/load/cancel                           stop a load in flight (the backend frees what it took)
    POST /admin/unload                                finish running requests, free the cards
    GET  /admin/cards                                 NVML telemetry, cards in PCI bus order
    GET  /admin/logs?n=200&level=INFO                 newest log records, oldest first
"""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from engine.errors import RigllmError
from engine.backends import BACKEND_CHOICES
from engine.model.kv_formats import DEFAULT_LONG_CONTEXT_FORMAT
from engine.server.admin_footprint import footprint_to_json
from engine.server.admin_host import DEMO_LABEL, ModelHost
from engine.server.admin_logs import LogRing
from engine.generation.serving.request_error import APIError
from engine.server.bounded_body import BoundedBodyRoute
from engine.server.model_folders import ModelFolders
from engine.telemetry import TelemetrySource

MAX_LOG_RECORDS = 2000


class LoadRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    model: str | None = Field(default=None, description="path of a qwen35 GGUF on the server (default: the demo model)")
    context: int | None = Field(default=None, ge=2, description="tokens one conversation may hold")
    backend: str | None = Field(default=None, description=f"one of {', '.join(BACKEND_CHOICES)}")


def admin_router(host: ModelHost, telemetry: TelemetrySource, logs: LogRing, folders: ModelFolders) -> APIRouter:
    """The `/admin` routes over one model host, one telemetry source, one log ring and the model folders."""
    router = APIRouter(prefix="/admin", tags=["admin"], route_class=BoundedBodyRoute)
    telemetry_lock = threading.Lock()  # NVML sources are polled from one thread at a time

    def plan(model: str | None = None, context: int | None = Query(default=None, ge=1),
             kv: str = DEFAULT_LONG_CONTEXT_FORMAT) -> dict[str, Any]:
        from engine.model.model_info import describe
        from engine.gguf.loader import load_model

        path = folders.resolve(model) if model else host.status()["path"]
        if path is None:
            raise APIError(400, "no model given and none is loaded: pass ?model=PATH", param="model")
        try:
            return describe(load_model(path), context, kv)
        except RigllmError as err:
            raise APIError(400, str(err), param="model") from None

    def inspect(model: str | None = None) -> dict[str, Any]:
        from engine.fixtures.demo_model import ensure_demo_model
        from engine.gguf.loader import load_model
        from engine.model.model_footprint import footprint_of
        from engine.vision.mmproj_pairing import paired_vision_config
        from engine.vision.device_footprint import with_tower

        try:
            loaded = load_model(folders.resolve(model) if model else ensure_demo_model())
        except RigllmError as err:
            raise APIError(400, str(err), param="model") from None
        return {"path": str(loaded.path), "demo": model is None,
                "name": loaded.file.fields.get("general.name", loaded.path.stem),
                "footprint": footprint_to_json(with_tower(footprint_of(loaded),
                                                          paired_vision_config(loaded.path, loaded.config.d_model)))}

    def load_status() -> dict[str, Any]:
        return host.status()

    def load(req: LoadRequest) -> JSONResponse:
        if req.backend is not None and req.backend not in BACKEND_CHOICES:
            raise APIError(400, f"backend must be one of {', '.join(BACKEND_CHOICES)}", param="backend")
        if req.model is None:
            from engine.fixtures.demo_model import ensure_demo_model

            host.start_load(ensure_demo_model(), req.context, req.backend, label=DEMO_LABEL)
        else:
            host.start_load(folders.resolve(req.model), req.context, req.backend)
        return JSONResponse(host.status(), status_code=202)

    def cancel_load() -> dict[str, Any]:
        return {"cancelled": host.cancel_load(), **host.status()}

    def unload() -> dict[str, Any]:
        return {"unloaded": host.unload(), **host.status()}

    def cards() -> dict[str, Any]:
        with telemetry_lock:
            snap = telemetry.read()
        return {
            "time": snap.time,
            "error": snap.error,
            "warnings": list(snap.warnings),
            "cards": [dataclasses.asdict(c) | {"memory_free": c.memory_free} for c in snap.cards],
        }

    def recent_logs(n: int = Query(default=200, ge=1, le=MAX_LOG_RECORDS), level: str = "INFO") -> dict[str, Any]:
        min_level = logging.getLevelName(level.upper())
        if not isinstance(min_level, int):
            raise APIError(400, f"unknown log level {level!r} (DEBUG, INFO, WARNING, ERROR)", param="level")
        return {"records": logs.recent(n, min_level)}

    # Plain `def` routes run in FastAPI's thread pool: loading a header, unloading (which waits for running
    # requests) and NVML reads block, and must not stall the event loop that streams tokens.
    router.add_api_route("/plan", plan, methods=["GET"])
    router.add_api_route("/inspect", inspect, methods=["GET"])
    router.add_api_route("/load", load_status, methods=["GET"])
    router.add_api_route("/load", load, methods=["POST"], status_code=202)
    router.add_api_route("/load/cancel", cancel_load, methods=["POST"])
    router.add_api_route("/unload", unload, methods=["POST"])
    router.add_api_route("/cards", cards, methods=["GET"])
    router.add_api_route("/logs", recent_logs, methods=["GET"])
    return router
