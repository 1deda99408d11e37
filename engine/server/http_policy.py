"""Who may call which route, and what a request must look like before any of it is read.

Checked in order by `guard` (the app's one HTTP middleware), each refusal an OpenAI-shaped error:
1. Host (keyless servers only): a web page can point its own DNS name at 127.0.0.1 (DNS rebinding)
   and then talk to a keyless server as if it were the page's own origin. Only the loopback names,
   the bound address and `allowed_hosts` are answered; anything else gets 421. A server with a key
   needs no such check: the page cannot present the key.
2. State-changing requests (anything but GET/HEAD/OPTIONS): a foreign `Origin` (or `Referer` when no
   Origin is sent) gets 403, unless it is one of the CORS origins; a body that is not JSON gets 415.
   Together these stop the form POST any page can send without asking (CORS does not cover it).
3. A declared body larger than `max_body_bytes` gets 413 at once (a chunked one is cut off by
   `bounded_body` when it grows past the limit).
4. Keys: inference routes take the API key (or the admin key); `/admin/*` takes only the admin key,
   and is refused outright when the server has an API key but no admin key. With no key at all
   (keyless loopback) both are open, and 1-3 are what protects them.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from fastapi import Request
from fastapi.responses import JSONResponse, Response

from engine.server.api_errors import error_response
from engine.generation.serving.generation_job import DEFAULT_STALL_SECONDS
from engine.generation.serving.request_limits import DEFAULT_MAX_BODY_BYTES

OPEN_PATHS = ("/health", "/v1/health", "/docs", "/openapi.json")
ADMIN_PREFIX = "/admin"
LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
WILDCARD_HOSTS = ("0.0.0.0", "::", "")
SAFE_METHODS = ("GET", "HEAD", "OPTIONS")
DEFAULT_PREPARE_THREADS = 4


@dataclass(frozen=True)
class HttpPolicy:
    """`api_key`: for the OpenAI routes (None: keyless); `admin_key`: for `/admin/*` (and the OpenAI
    routes too, so one client can drive a rig with one key); `bind_host`: the address served on;
    `allowed_hosts`: more Host names a keyless server answers (e.g. a name in /etc/hosts);
    `stall_seconds`: how long a response's oldest event may wait unread before its request is dropped;
    `open_paths`: routes that need no key."""

    api_key: str | None = None
    admin_key: str | None = None
    cors_origins: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    prepare_threads: int = DEFAULT_PREPARE_THREADS
    stall_seconds: float = DEFAULT_STALL_SECONDS
    open_paths: tuple[str, ...] = OPEN_PATHS  # answered without a key (health checks, the API's docs)
    hosts: frozenset[str] = field(init=False)

    def __post_init__(self) -> None:
        names = {*LOOPBACK_NAMES, *(h.lower().strip("[]") for h in self.allowed_hosts)}
        if self.bind_host not in WILDCARD_HOSTS:
            names.add(self.bind_host.lower().strip("[]"))
        object.__setattr__(self, "hosts", frozenset(names))


def presented_key(request: Request) -> str | None:
    auth = request.headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    return request.headers.get("x-api-key")


def _same_key(presented: str | None, key: str | None) -> bool:
    return key is not None and presented is not None and hmac.compare_digest(presented.encode(), key.encode())


def _host_name(host_header: str) -> str:
    """`example.com:8000` → `example.com`; `[::1]:8000` → `::1`."""
    if host_header.startswith("["):
        return host_header[1:].split("]", 1)[0].lower()
    return host_header.rsplit(":", 1)[0].lower() if host_header.count(":") == 1 else host_header.lower()


def _origin_of(request: Request) -> str | None:
    """The page the request came from: its Origin, else its Referer's scheme://host[:port]."""
    origin = request.headers.get("origin")
    if origin is not None:
        return origin
    referer = request.headers.get("referer")
    if referer:
        parts = urlsplit(referer)
        return f"{parts.scheme}://{parts.netloc}" if parts.scheme and parts.netloc else "null"
    return None


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def refusal(policy: HttpPolicy, request: Request) -> JSONResponse | None:
    """The error to answer instead of routing `request`, or None to let it through."""
    path = request.scope["path"]
    host = request.headers.get("host", "")
    if policy.api_key is None and _host_name(host) not in policy.hosts:
        return error_response(421, f"this server does not answer for the host '{host[:100]}' (a keyless server "
                              "answers only its own address; rigllm serve --allowed-host adds names)",
                              code="host_not_allowed")
    if request.method not in SAFE_METHODS:
        origin = _origin_of(request)
        if origin is not None and not _origin_allowed(policy, origin, host):
            return error_response(403, f"requests from the web page at '{origin[:100]}' are refused (a foreign "
                                  "origin; rigllm serve --cors-origin allows one)", code="origin_not_allowed")
        content_type = request.headers.get("content-type")
        if content_type is not None and not _is_json(content_type):
            return error_response(415, f"the body must be JSON (Content-Type: application/json), not "
                                  f"'{content_type[:100]}'", code="unsupported_media_type")
        declared = request.headers.get("content-length", "0")
        if content_type is None and declared not in ("0", ""):
            return error_response(415, "the body must be JSON: send Content-Type: application/json",
                                  code="unsupported_media_type")
        if declared.isdigit() and int(declared) > policy.max_body_bytes:
            return error_response(413, f"the body is {int(declared)} bytes; this server takes at most "
                                  f"{policy.max_body_bytes}", code="body_too_large")
    return _key_refusal(policy, request, path)


def _origin_allowed(policy: HttpPolicy, origin: str, host: str) -> bool:
    if "*" in policy.cors_origins or origin in policy.cors_origins:
        return True
    parts = urlsplit(origin)
    return parts.scheme in ("http", "https") and parts.netloc.lower() == host.lower()


def _key_refusal(policy: HttpPolicy, request: Request, path: str) -> JSONResponse | None:
    if path in policy.open_paths:
        return None
    presented = presented_key(request)
    if path == ADMIN_PREFIX or path.startswith(ADMIN_PREFIX + "/"):
        if policy.admin_key is not None:
            if _same_key(presented, policy.admin_key):
                return None
            return error_response(401, "Incorrect or missing admin key (send 'Authorization: Bearer ADMIN_KEY')",
                                  code="invalid_admin_key")
        if policy.api_key is not None:
            return error_response(403, "the admin API needs its own key on a server with an API key "
                                  "(rigllm serve --admin-key)", code="admin_disabled")
        return None
    if policy.api_key is None or _same_key(presented, policy.api_key) or _same_key(presented, policy.admin_key):
        return None
    return error_response(401, "Incorrect or missing API key (send 'Authorization: Bearer KEY')",
                          code="invalid_api_key")


async def guard(policy: HttpPolicy, request: Request, call_next: Callable[[Request], Awaitable[Response]]) -> Response:
    """The middleware body: normalise `//v1/...` paths, then refuse or route."""
    path = request.scope["path"]
    while "//" in path:  # some clients join base URL and route into `//v1/...`
        path = path.replace("//", "/")
    request.scope["path"] = path
    refused = refusal(policy, request)
    return refused if refused is not None else await call_next(request)
