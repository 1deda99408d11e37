"""The API key's stored places that both `rigllm serve` and the desktop app read: the OS keyring (service
`rigllm`, user `api-key`: out of shell history and process listings) and a key file (e.g. a systemd
credential). Below the HTTP server, so the app's key handling needs no web framework.
"""

from __future__ import annotations

from engine.errors import RigllmError

KEYRING_SERVICE = "rigllm"
KEYRING_USER = "api-key"


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
