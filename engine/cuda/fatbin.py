"""Packing per-architecture cubins and one PTX into a fatbin with nvFatbin 12.9 (ctypes).

A fatbin lets one file serve every card: the driver picks the SASS for the device's architecture and
falls back to JIT-compiling the PTX. nvFatbin 12.9 is used rather than CUDA 13's `fatbinary`, whose
default PTX compression flag older drivers may not read (toolchain.md §1d).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from pathlib import Path

from engine.errors import RigllmError


class Nvfatbin:
    """A loaded libnvfatbin."""

    def __init__(self, library: Path):
        try:
            self._lib = ctypes.CDLL(str(library))
        except OSError as err:
            raise RigllmError(f"cannot load nvFatbin from {library}: {err}") from err
        self._lib.nvFatbinGetErrorString.restype = ctypes.c_char_p

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            message = self._lib.nvFatbinGetErrorString(code).decode(errors="replace")
            raise RigllmError(f"nvFatbin {what} failed: {message} (code {code})")

    def pack(self, name: str, cubins: Sequence[tuple[int, bytes]], ptx: tuple[int, bytes] | None) -> bytes:
        """A 64-bit fatbin holding `cubins` [(arch, ELF)] and optionally `ptx` (arch, PTX text)."""
        lib = self._lib
        handle = ctypes.c_void_p()
        options = (ctypes.c_char_p * 1)(b"-64")
        self._check(lib.nvFatbinCreate(ctypes.byref(handle), options, ctypes.c_size_t(1)), "nvFatbinCreate")
        try:
            for arch, cubin in cubins:
                self._check(
                    lib.nvFatbinAddCubin(
                        handle, cubin, ctypes.c_size_t(len(cubin)), str(arch).encode(), f"{name}_sm{arch}".encode()
                    ),
                    f"nvFatbinAddCubin(sm_{arch})",
                )
            if ptx is not None:
                arch, text = ptx
                code = text + b"\0"
                self._check(
                    lib.nvFatbinAddPTX(
                        handle, code, ctypes.c_size_t(len(code)), str(arch).encode(), f"{name}_compute{arch}".encode(), b""
                    ),
                    f"nvFatbinAddPTX(compute_{arch})",
                )
            size = ctypes.c_size_t()
            self._check(lib.nvFatbinSize(handle, ctypes.byref(size)), "nvFatbinSize")
            buf = ctypes.create_string_buffer(size.value)
            self._check(lib.nvFatbinGet(handle, buf), "nvFatbinGet")
            return buf.raw
        finally:
            lib.nvFatbinDestroy(ctypes.byref(handle))
