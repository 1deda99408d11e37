"""NVRTC through ctypes: CUDA C++ source → PTX (for a `compute_XX`) or cubin (for an `sm_XX`).

ctypes rather than cuda-bindings keeps the `kernels` extra to the plain NVIDIA wheels and lets the same
code drive whichever libnvrtc a machine has (12.9 from pip for builds, 13.0 in the H200 image at run
time; toolchain.md §2). NVRTC 12.9 logs "Architectures prior to '<compute_75>' are deprecated" for
every Volta target; that notice is expected and kept apart from real warnings.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from engine.errors import RigllmError

_DEPRECATION = re.compile(r"Architectures prior to .* are deprecated", re.IGNORECASE)
_WARNING = re.compile(r"\bwarning\b", re.IGNORECASE)


class CompileError(RigllmError):
    """NVRTC rejected a kernel source; the message carries the whole compiler log."""


def significant_warnings(log: str) -> tuple[str, ...]:
    """Warning lines of a compiler log other than the Volta deprecation notice."""
    return tuple(
        line.strip() for line in log.splitlines() if _WARNING.search(line) and not _DEPRECATION.search(line)
    )


@dataclass(frozen=True)
class CompileResult:
    """One compiled program: `image` is PTX text (no trailing NUL) or an ELF cubin, per `kind`."""

    image: bytes
    kind: str  # "ptx" or "cubin"
    log: str

    @property
    def warnings(self) -> tuple[str, ...]:
        return significant_warnings(self.log)


class Nvrtc:
    """A loaded libnvrtc. Thread-safe: each `compile` owns its program handle."""

    def __init__(self, library: Path):
        self.library = library
        try:
            self._lib = ctypes.CDLL(str(library))
        except OSError as err:
            raise RigllmError(f"cannot load NVRTC from {library}: {err}") from err
        self._lib.nvrtcGetErrorString.restype = ctypes.c_char_p
        major, minor = ctypes.c_int(), ctypes.c_int()
        self._check(self._lib.nvrtcVersion(ctypes.byref(major), ctypes.byref(minor)), "nvrtcVersion")
        self.version = (major.value, minor.value)
        count = ctypes.c_int()
        self._check(self._lib.nvrtcGetNumSupportedArchs(ctypes.byref(count)), "nvrtcGetNumSupportedArchs")
        archs = (ctypes.c_int * count.value)()
        self._check(self._lib.nvrtcGetSupportedArchs(archs), "nvrtcGetSupportedArchs")
        self.supported_archs = tuple(int(a) for a in archs)

    @property
    def version_text(self) -> str:
        return f"{self.version[0]}.{self.version[1]}"

    def supports(self, arch: int) -> bool:
        return arch in self.supported_archs

    def _check(self, code: int, what: str) -> None:
        if code != 0:
            message = self._lib.nvrtcGetErrorString(code).decode(errors="replace")
            raise RigllmError(f"NVRTC {what} failed: {message} (code {code})")

    def compile(
        self,
        source: str,
        name: str,
        target: str,
        include_dirs: Sequence[Path],
        options: Sequence[str] = (),
    ) -> CompileResult:
        """Compile `source` for `target` ("compute_70" → PTX, "sm_90" → cubin); raise with the log on error."""
        if target.startswith("compute_"):
            kind = "ptx"
        elif target.startswith("sm_"):
            kind = "cubin"
        else:
            raise ValueError(f"target must be compute_XX or sm_XX, not {target!r}")
        lib = self._lib
        prog = ctypes.c_void_p()
        self._check(
            lib.nvrtcCreateProgram(ctypes.byref(prog), source.encode(), name.encode(), 0, None, None),
            "nvrtcCreateProgram",
        )
        try:
            args = [f"--gpu-architecture={target}", *(f"--include-path={d}" for d in include_dirs), *options]
            argv = (ctypes.c_char_p * len(args))(*(a.encode() for a in args))
            status = lib.nvrtcCompileProgram(prog, len(args), argv)
            log = self._log(prog)
            if status != 0:
                message = lib.nvrtcGetErrorString(status).decode(errors="replace")
                raise CompileError(f"{name} does not compile for {target} ({message}):\n{log}")
            size = ctypes.c_size_t()
            if kind == "ptx":
                self._check(lib.nvrtcGetPTXSize(prog, ctypes.byref(size)), "nvrtcGetPTXSize")
                buf = ctypes.create_string_buffer(size.value)
                self._check(lib.nvrtcGetPTX(prog, buf), "nvrtcGetPTX")
                image = buf.raw.rstrip(b"\0")
            else:
                self._check(lib.nvrtcGetCUBINSize(prog, ctypes.byref(size)), "nvrtcGetCUBINSize")
                buf = ctypes.create_string_buffer(size.value)
                self._check(lib.nvrtcGetCUBIN(prog, buf), "nvrtcGetCUBIN")
                image = buf.raw
            return CompileResult(image=image, kind=kind, log=log)
        finally:
            lib.nvrtcDestroyProgram(ctypes.byref(prog))

    def _log(self, prog: ctypes.c_void_p) -> str:
        size = ctypes.c_size_t()
        self._check(self._lib.nvrtcGetProgramLogSize(prog, ctypes.byref(size)), "nvrtcGetProgramLogSize")
        buf = ctypes.create_string_buffer(max(size.value, 1))
        self._check(self._lib.nvrtcGetProgramLog(prog, buf), "nvrtcGetProgramLog")
        return buf.value.decode(errors="replace").strip()
