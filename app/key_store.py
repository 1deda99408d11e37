"""Where the app keeps a secret key: the OS keyring when one is usable, else a file only the user can read
(after they tick a box that says so), else nowhere (the key lives for this session only).

A plain `[app]` install on a desktop without a Secret Service has only keyring's fail backend, and
keyrings.alt's file backends are no keyring either (one writes the key in plain text without asking,
the other prompts on the terminal the app has not got); so neither counts as usable, and a key is never
written in plain text unless the user chose the file. Files go under `<data dir>/keys/` (mode 0700),
one key per file (mode 0600), so `rigllm serve --api-key-file` can read the API key's file directly.
"""

from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path

import keyring
from keyring.backend import KeyringBackend
from keyring.backends import chainer, fail, null

from engine.errors import RigllmError
from engine.paths import user_data_dir
from engine.api_keys import KEYRING_SERVICE, key_from_file

KEYRING = "keyring"
FILE = "file"
SESSION = "session"
_NOT_A_KEYRING = ("keyrings.alt.file",)  # plain text written silently, or a terminal password prompt


def keys_dir() -> Path:
    return user_data_dir() / "keys"


def secure_keyring() -> tuple[KeyringBackend | None, str]:
    """The OS keyring backend to use and "", or None and why there is none (one line)."""
    backend = keyring.get_keyring()
    candidates = list(backend.backends) if isinstance(backend, chainer.ChainerBackend) else [backend]
    usable = [b for b in candidates if not isinstance(b, (fail.Keyring, null.Keyring))
              and not type(b).__module__.startswith(_NOT_A_KEYRING)]
    if not usable:
        names = ", ".join(f"{type(b).__module__}.{type(b).__name__}" for b in candidates)
        return None, f"no system keyring is usable here (keyring found only {names})"
    try:
        usable[0].get_password(KEYRING_SERVICE, "probe")
    except Exception as err:  # a Secret Service backend that cannot reach its daemon raises its own errors
        return None, f"the system keyring is not usable ({type(err).__name__}: {err})"
    return usable[0], ""


@dataclass(frozen=True)
class KeyStore:
    """One named key (the keyring's user name under service "rigllm", and its file's name)."""

    name: str

    @property
    def file(self) -> Path:
        return keys_dir() / re.sub(r"[^A-Za-z0-9._-]", "_", self.name)

    def in_file(self) -> bool:
        """Whether the user chose the file for this key (it exists only after they opted in)."""
        return self.file.is_file()

    def read(self) -> tuple[str, str]:
        """(key or "", where it came from: FILE, KEYRING or SESSION when neither has one)."""
        if self.in_file():
            check_private(self.file)
            return key_from_file(str(self.file)), FILE
        backend, _why = secure_keyring()
        if backend is not None:
            try:
                key = backend.get_password(KEYRING_SERVICE, self.name)
            except Exception as err:  # noqa: BLE001 - see secure_keyring
                raise RigllmError(f"could not read the key from the system keyring ({err})") from None
            if key:
                return key, KEYRING
        return "", SESSION

    def write_keyring(self, key: str) -> None:
        backend, why = secure_keyring()
        if backend is None:
            raise RigllmError(why)
        try:
            backend.set_password(KEYRING_SERVICE, self.name, key)
        except Exception as err:  # noqa: BLE001 - see secure_keyring
            raise RigllmError(f"could not store the key in the system keyring ({err})") from None

    def write_file(self, key: str) -> Path:
        """Write the key to its file, readable only by this user (mode 0600 in a 0700 folder)."""
        folder = self.file.parent
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)
        tmp = self.file.with_name(self.file.name + ".tmp")
        tmp.unlink(missing_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(key + "\n")
        os.replace(tmp, self.file)
        return self.file

    def forget_file(self) -> None:
        self.file.unlink(missing_ok=True)


def check_private(path: Path) -> None:
    """Refuse a key file others can read (someone copied it in with the wrong mode)."""
    mode = stat.S_IMODE(path.stat().st_mode)
    if mode & 0o077:
        raise RigllmError(f"{path} can be read by other users (mode {mode:o}): chmod 600 {path}")
