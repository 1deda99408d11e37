"""The desktop API server's key and where it is kept: the OS keyring (where `rigllm serve --use-keyring`
reads it), a file only the user can read once they choose it (`rigllm serve --api-key-file` reads that),
or, with neither, nowhere: a key made for this session, so the API toggle works on any install.
"""

from __future__ import annotations

import secrets

from engine.api_keys import KEYRING_SERVICE, KEYRING_USER

from app.key_store import FILE, KEYRING, SESSION, KeyStore, secure_keyring


def new_key() -> str:
    return secrets.token_urlsafe(32)


class ApiKey:
    """The key the API server checks, read or made once per session and kept as `place()` says."""

    def __init__(self, store: KeyStore | None = None):
        self.store = store or KeyStore(KEYRING_USER)
        self.key = ""

    def place(self) -> str:
        """Where the key is kept: FILE when the user chose the file, else KEYRING when usable, else SESSION."""
        if self.store.in_file():
            return FILE
        return KEYRING if secure_keyring()[0] is not None else SESSION

    def current(self) -> str:
        """The key: the kept one, or a new one kept where `place()` says (RigllmError if that fails)."""
        if not self.key:
            key, _where = self.store.read()
            if not key:
                key = new_key()
                self._keep(key)
            self.key = key
        return self.key

    def renew(self) -> str:
        """A new key, replacing the kept one (clients using the old key are refused)."""
        key = new_key()
        self._keep(key)
        self.key = key
        return key

    def keep_in_file(self, on: bool) -> None:
        """The user's choice: the key in its private file (on), or back to the keyring or the session (off)."""
        if on:
            self.store.write_file(self.current())
            return
        self.store.forget_file()
        if self.key and self.place() == KEYRING:
            self.store.write_keyring(self.key)

    def _keep(self, key: str) -> None:
        place = self.place()
        if place == FILE:
            self.store.write_file(key)
        elif place == KEYRING:
            self.store.write_keyring(key)

    def describe(self) -> str:
        """One line for the panel: where the key is and what else can use it."""
        place = self.place()
        if place == FILE:
            path = self.store.file
            return f"Kept in {path}, readable only by you; rigllm serve --api-key-file {path} uses the same key."
        if place == KEYRING:
            return (f"Kept in the system keyring (service {KEYRING_SERVICE}, user {self.store.name}); "
                    "rigllm serve --use-keyring uses the same key.")
        return (f"For this session only, stored nowhere: {secure_keyring()[1]}. Tick the box below to keep it "
                "in a file only you can read.")
