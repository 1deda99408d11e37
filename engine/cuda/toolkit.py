"""Where the CUDA compiler pieces are: NVRTC, its headers, ptxas and nvFatbin, grouped per toolkit.

Three layouts are searched, in this order, because their pieces only work together within one
release (NVRTC 13 with 12.9 headers, or the reverse, is asking for trouble):

1. the pip CUDA 12 wheels of the `kernels` extra (`nvidia/cuda_nvrtc`, `cuda_runtime`, `cuda_cccl`,
   `cuda_nvcc`, `nvfatbin`): the build toolchain, the only one whose NVRTC still targets compute_70;
2. the pip CUDA 13 layout (`nvidia/cu13/{lib,include,bin}`), as in the H200 image's Python;
3. a CUDA toolkit folder: `$CUDA_HOME`, `$CUDA_PATH`, then `/usr/local/cuda`.

Nothing here loads a library; `engine.cuda.nvrtc` and `engine.cuda.fatbin` do that.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Toolchain:
    """One CUDA release's compiler pieces; `ptxas` and `nvfatbin_library` may be missing at run time."""

    label: str
    nvrtc_library: Path
    include_dirs: tuple[Path, ...]
    ptxas: Path | None
    nvfatbin_library: Path | None


def _first_library(folder: Path, stem: str) -> Path | None:
    """`folder/<stem>.so.N` (highest N) or `folder/<stem>.so`, skipping NVRTC's `alt`/`builtins` variants."""
    if not folder.is_dir():
        return None
    candidates = sorted(
        (p for p in folder.glob(f"{stem}.so*") if ".alt." not in p.name and "builtins" not in p.name),
        key=lambda p: (len(p.name), p.name),
    )
    versioned = [p for p in candidates if p.name != f"{stem}.so"]
    chosen = versioned[-1:] or candidates[:1]
    return chosen[0] if chosen else None


def _existing(*paths: Path) -> tuple[Path, ...]:
    return tuple(p for p in paths if p.is_dir())


def _file(path: Path) -> Path | None:
    return path if path.is_file() else None


def _nvidia_roots() -> list[Path]:
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    return [Path(p) for p in spec.submodule_search_locations]


def _pip_cuda12(root: Path) -> Toolchain | None:
    nvrtc = _first_library(root / "cuda_nvrtc" / "lib", "libnvrtc")
    if nvrtc is None:
        return None
    return Toolchain(
        label=f"pip CUDA 12 wheels ({root})",
        nvrtc_library=nvrtc,
        include_dirs=_existing(root / "cuda_runtime" / "include", root / "cuda_cccl" / "include"),
        ptxas=_file(root / "cuda_nvcc" / "bin" / "ptxas"),
        nvfatbin_library=_first_library(root / "nvfatbin" / "lib", "libnvfatbin"),
    )


def _toolkit_dir(root: Path, label: str) -> Toolchain | None:
    """A toolkit-shaped folder: lib64/ or lib/, include/ (+ include/cccl in CUDA 13), bin/ptxas."""
    nvrtc = _first_library(root / "lib64", "libnvrtc") or _first_library(root / "lib", "libnvrtc")
    if nvrtc is None:
        return None
    return Toolchain(
        label=label,
        nvrtc_library=nvrtc,
        include_dirs=_existing(root / "include", root / "include" / "cccl"),
        ptxas=_file(root / "bin" / "ptxas"),
        nvfatbin_library=_first_library(root / "lib64", "libnvfatbin") or _first_library(root / "lib", "libnvfatbin"),
    )


def find_toolchains() -> list[Toolchain]:
    """Every usable toolchain on this machine, in preference order (see the module docstring)."""
    found: list[Toolchain] = []
    for root in _nvidia_roots():
        chain = _pip_cuda12(root)
        if chain is not None:
            found.append(chain)
    for root in _nvidia_roots():
        chain = _toolkit_dir(root / "cu13", f"pip CUDA 13 wheels ({root / 'cu13'})")
        if chain is not None:
            found.append(chain)
    roots: list[Path] = []
    for value in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if value and Path(value).resolve() not in roots:
            roots.append(Path(value).resolve())
    for root in roots:
        chain = _toolkit_dir(root, f"CUDA toolkit ({root})")
        if chain is not None:
            found.append(chain)
    return found
