"""Who may call the server: the API key (given, read from a file, or from the OS keyring) and CORS origins.

The keyring keeps the key out of shell history and process listings; the origin check catches the
one mistake that silently breaks CORS (a trailing slash or path never matches a browser's Origin).
"""

from __future__ import annotations

import re

from engine.errors import RigllmError

KEYRING_SERVICE = "rigllm"
KEYRING_USER = "api-key"
_ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+", re.IGNORECASE)


def key_from_keyring() -> str:
    """The stored API key; a one-line RigllmError when none is stored or the keyring cannot be read."""
    import keyring
    from keyring.errors import KeyringError

    try:
        key = keyring.get_password(KEYRING_SERVICE, KEYRING_USER)
    except KeyringError as err:
        raise RigllmError(f"could not read the API key from the keyring: {err}") from None
    if not key:
        raise RigllmError(f"no API key in the keyring (service '{KEYRING_SERVICE}', user '{KEYRING_USER}'); "
                          f"store one with: keyring set {KEYRING_SERVICE} {KEYRING_USER}")
    return key


def key_from_file(path: str) -> str:
    """The first line of `path` (e.g. a systemd credential); a one-line RigllmError when unreadable or empty."""
    try:
        with open(path, encoding="utf-8") as fh:
            key = fh.readline().strip()
    except OSError as err:
        raise RigllmError(f"cannot read the API key file {path}: {err.strerror or err}") from None
    if not key:
        raise RigllmError(f"the API key file {path} is empty")
    return key


def check_cors_origins(origins: list[str]) -> list[str]:
    """Origins as browsers send them (`scheme://host[:port]`, or `*` for any)."""
    for origin in origins:
        if origin != "*" and not _ORIGIN.fullmatch(origin):
            raise RigllmError(f"--cors-origin {origin!r} is not an origin: use scheme://host[:port] "
                              "with no path or trailing slash (e.g. http://localhost:3000), or '*'")
    return origins
