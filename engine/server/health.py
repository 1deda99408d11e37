"""`/health` as a load balancer reads it: 200 with the load while the server can take a request, 503
with a reason while it cannot, so a router (HAProxy's httpchk, Kubernetes probes, LiteLLM's
health checks) sends requests elsewhere instead of into a dead or full server.

    200 {"status": "ok", "model", "label", "backend", "context_length", "slots", "active" (busy slots),
         "busy", "queued", "queue_limit"}
    503 {"status": "no_model" | "loading" | "unloading" | "load_failed", "reason", "model": null}
    503 {"status": "worker_failed" | "queue_full", "reason", ...the load, as for 200}
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.server.admin_host import EMPTY, FAILED, LOADING, UNLOADING
from engine.generation.serving.worker import GenerationWorker

if TYPE_CHECKING:
    from engine.server.app import ModelSource

_NOT_LOADED = {
    EMPTY: ("no_model", "no model is loaded; load one with POST /admin/load"),
    LOADING: ("loading", "a model is loading"),
    UNLOADING: ("unloading", "the model is being unloaded"),
    FAILED: ("load_failed", "loading the model failed"),
}


def health_answer(models: ModelSource) -> tuple[int, dict[str, Any]]:
    """The status code and body of `/health` for the model `models` holds now."""
    now = models.current
    if now is None:
        status_of = getattr(models, "status", None)  # a ModelHost says why; a FixedModel is never empty
        state = status_of() if status_of is not None else {"state": EMPTY}
        status, reason = _NOT_LOADED.get(state["state"], _NOT_LOADED[EMPTY])
        if state.get("error"):
            reason = f"{reason}: {state['error']}"
        elif state.get("stage"):
            reason = f"{reason} ({state['stage']})"
        return 503, {"status": status, "reason": reason, "model": None}
    service, worker = now
    load = {"model": service.model_id, "label": models.label, "backend": worker.backend_name,
            "context_length": service.context_length, "slots": worker.slot_count, "active": worker.active,
            "busy": worker.busy, "queued": worker.waiting, "queue_limit": worker.queue_limit}
    failure = worker.failure
    if failure is not None:
        return 503, {"status": "worker_failed", "reason": failure, **load}
    if worker.full:
        return 503, {"status": "queue_full", "reason": f"{worker.waiting} requests are waiting, as many as this "
                     "server queues; new ones are refused", **load}
    return 200, {"status": "ok", **load}
