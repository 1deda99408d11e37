"""Which browser origins may call the server (the API key's stored places are engine.api_keys).

The origin check catches the one mistake that silently breaks CORS (a trailing slash or path never matches a browser's Origin).
"""

from __future__ import annotations

import re

from engine.errors import RigllmError

_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+", re.IGNORECASE)


def check_cors_origins(origins: list[str]) -> list[str]:
    """Origins as browsers send them (`scheme://host[:port]`, or `*` for any)."""
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise RigllmError(f"--cors-origin {origin!r} is not an origin: use scheme://host[:port] "
                              "with no path or trailing slash (e.g. http://localhost:3000), or '*'")
    return origins
