"""The admin API's model library: what a rig has in its models folder, and pulling a GGUF from the Hub onto
the rig (the app's "Connect to rig" drives it; the same engine.hub code as `rigllm pull`).

    GET  /admin/models                                      the rig's models folder (name, quant, size, vision)
    POST /admin/models/pull   {"repo": ID, "file"?: NAME, "quant"?: Q, "mmproj"?: bool}   202, then poll
    GET  /admin/models/pull                                 state, file, bytes, MB/s, ETA, error, model path
    POST /admin/models/pull/cancel                          stop it (the part stays: a new pull resumes)

One pull at a time; a second is refused with 409 while one runs.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from engine.errors import RigllmError
from engine.generation.serving.request_error import APIError
from engine.hub.download import DownloadCancelled, Progress
from engine.hub.library import Library
from engine.hub.pull import pull


class PullRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    repo: str = Field(description="owner/name on the Hugging Face Hub")
    file: str | None = Field(default=None, description="the file to pull (default: the repository's Q8_0 file)")
    quant: str | None = Field(default=None, description="pick the file by quant type instead, e.g. Q8_0, BF16")
    mmproj: bool = Field(default=True, description="also pull the paired vision projector")


@dataclass
class PullState:
    state: str = "idle"  # idle, pulling, done, failed, cancelled
    repo: str | None = None
    progress: Progress | None = None
    model: str | None = None
    error: str | None = None

    def as_json(self) -> dict[str, Any]:
        p = self.progress
        return {"state": self.state, "repo": self.repo, "model": self.model, "error": self.error,
                "file": p.file if p else None, "done_bytes": p.done_bytes if p else 0,
                "total_bytes": p.total_bytes if p else 0, "bytes_per_s": p.bytes_per_s if p else 0.0,
                "eta_s": p.eta_s if p else None}


def models_router(library: Library) -> APIRouter:
    router = APIRouter(prefix="/admin/models", tags=["admin"])
    lock = threading.Lock()
    now = PullState()
    cancel = threading.Event()

    def entries() -> dict[str, Any]:
        return {"folder": str(library.root), "models": [
            {"path": str(e.path), "name": e.name, "quant": e.quant, "size": e.size, "vision": e.vision,
             "repo": e.repo, "last_used": e.last_used} for e in library.entries()]}

    def work(req: PullRequest) -> None:
        def progress(p: Progress) -> None:
            with lock:
                now.progress = p

        try:
            done = pull(req.repo, library, file=req.file, quant=req.quant, with_mmproj=req.mmproj, progress=progress,
                        cancel=cancel)
        except DownloadCancelled as err:
            state, model, error = "cancelled", None, str(err)
        except RigllmError as err:
            state, model, error = "failed", None, str(err)
        else:
            state, model, error = "done", str(done.model), None
        with lock:
            now.state, now.model, now.error = state, model, error

    def start(req: PullRequest) -> JSONResponse:
        with lock:
            if now.state == "pulling":
                raise APIError(409, f"a pull of {now.repo} is running; cancel it first", code="pull_running")
            now.state, now.repo, now.progress, now.model, now.error = "pulling", req.repo, None, None, None
            cancel.clear()
            body = now.as_json()
        threading.Thread(target=work, args=(req,), name="rigllm-pull", daemon=True).start()
        return JSONResponse(body, status_code=202)

    def status() -> dict[str, Any]:
        with lock:
            return now.as_json()

    def stop() -> dict[str, Any]:
        cancel.set()
        return status()

    router.add_api_route("", entries, methods=["GET"])
    router.add_api_route("/pull", start, methods=["POST"], status_code=202)
    router.add_api_route("/pull", status, methods=["GET"])
    router.add_api_route("/pull/cancel", stop, methods=["POST"])
    return router
