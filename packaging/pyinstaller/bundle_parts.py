"""What both PyInstaller specs (Linux and Windows) put into the rigllm folder bundle.

The bundle keeps the repository's layout under its `_internal/` folder (`engine/`, `app/`,
`resources/`, `cuda_src/`), so `engine.paths.REPO_ROOT` (the folder above `engine/`) points at
`_internal/` when frozen and no path code changes for the bundle. The kernel sources travel too:
the engine matches prebuilt fatbins against their source hash at run time.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

from PyInstaller.utils.hooks import collect_data_files, collect_submodules, copy_metadata

ROOT = Path(__file__).resolve().parents[2]
RESOURCES = ROOT / "resources"
KERNELS = RESOURCES / "kernels"
CUDA_SRC = ROOT / "cuda_src"
REQUIRE_KERNELS_ENV = "RIGLLM_BUNDLE_REQUIRE_KERNELS"
# RIGLLM_BUNDLE_HEADLESS=1: the CLI without the desktop app and Qt (about 110 MB less), for a headless rig
# and for carrying to a GPU test machine; its `rigllm` has every command but `gui`.
HEADLESS_ENV = "RIGLLM_BUNDLE_HEADLESS"
APP_PARTS = ["app", "PySide6", "shiboken6", "pyqtgraph"]
PYCUDA_BUILD_NOTE = "RIGLLM_BUILD.txt"  # packaging/pycuda-wheel writes it into the pycuda it builds

DEV_FIXTURES = ["engine.fixtures.evaluate", "engine.fixtures.export", "engine.fixtures.tasks",
                "engine.fixtures.torch_model", "engine.fixtures.train", "engine.fixtures.vocab"]
# Dev-only (torch/transformers training of the fixture models and HF conversion tests; the model writers of
# engine.fixtures that the demo and benchmarks use stay in), test tooling, and optional imports of
# pyqtgraph (scipy filters, flowchart, OpenGL views) and tqdm (pandas) that rigllm never uses: 70+ MB.
EXCLUDES = [
    "torch", "torchvision", "transformers", "safetensors.torch", "tensorflow", "jax",
    "pytest", "_pytest", "pytestqt", "hypothesis", "schemathesis", "IPython", "matplotlib", "tkinter",
    "scipy", "pandas", "pyqtgraph.opengl", "pyqtgraph.flowchart", "pyqtgraph.examples", "pyqtgraph.jupyter",
    *DEV_FIXTURES,
]
# Driver libraries belong to the user's NVIDIA driver, never to the bundle (pycuda links libcuda).
DRIVER_LIBRARY_PREFIXES = ("libcuda.so", "libnvidia-", "nvcuda.dll", "nvml.dll")


def headless() -> bool:
    return os.environ.get(HEADLESS_ENV) == "1"


def excludes() -> list[str]:
    return EXCLUDES + (APP_PARTS if headless() else [])


def hidden_imports() -> list[str]:
    """Modules PyInstaller cannot see: `engine.cli` imports commands by name, `gui` comes by entry point."""
    engine = collect_submodules("engine", filter=lambda name: name not in DEV_FIXTURES)
    return engine if headless() else [*engine, *collect_submodules("app")]


def _kernel_entries() -> tuple[list[Path], list[str]]:
    """The packaged fatbins (with their JSON) whose source hash matches cuda_src now, and the modules without one."""
    from engine.cuda.kernel_build import CacheEntry, kernel_sources, source_hash

    fresh: list[Path] = []
    missing: list[str] = []
    for src in kernel_sources(CUDA_SRC):
        digest = source_hash(src)
        metas = sorted(KERNELS.glob(f"{src.stem}-*.json")) if KERNELS.is_dir() else []
        entries = [(meta, CacheEntry.read(meta)) for meta in metas]
        match = next(((meta, e) for meta, e in entries if e and e.module == src.stem and e.source_hash == digest),
                     None)
        if match is None:
            missing.append(src.stem)
        else:
            meta, entry = match
            fresh += [meta, KERNELS / entry.image]
    return fresh, missing


def kernel_datas() -> list[tuple[str, str]]:
    """Up-to-date prebuilt kernels from resources/kernels; stale ones are left out (the engine would skip them)."""
    fresh, missing = _kernel_entries()
    if missing:
        message = (f"no up-to-date prebuilt kernels in {KERNELS} for: {', '.join(missing)}; run "
                   f"`rigllm build-kernels --out resources/kernels --arch 70` first (needs rigllm[kernels])")
        if os.environ.get(REQUIRE_KERNELS_ENV) == "1":
            raise SystemExit(f"error: {message}")
        print(f"WARNING: {message}. The bundle will need NVRTC on the user's machine for those.")
    report = KERNELS / "ptxas_sm70.json"
    extras = [report] if fresh and report.is_file() else []
    return [(str(p), "resources/kernels") for p in [*fresh, *extras]]


def pycuda_datas() -> list[tuple[str, str]]:
    """pycuda's metadata (its version, for the doctor) and its build note, when pycuda is installed here.

    pycuda itself comes through the import graph (engine.cuda.driver imports it); without it the bundle
    runs the CPU reference backend only.
    """
    if importlib.util.find_spec("pycuda") is None:
        print("WARNING: pycuda is not installed here: the bundle will run the CPU reference backend only "
              "(pip install -e '.[gpu]' first: packaging/README.md)")
        return []
    return [*copy_metadata("pycuda"), *collect_data_files("pycuda", includes=[PYCUDA_BUILD_NOTE])]


# Dependencies that read their own distribution metadata at run time, which PyInstaller does not bundle by
# itself: llguidance asks importlib.metadata for its version on import (without it every command of the
# bundle died at start: PackageNotFoundError, seen 2026-12-02), keyring finds its backends through entry
# points, jsonschema and huggingface_hub report their versions from it.
RUNTIME_METADATA = ("llguidance", "keyring", "jsonschema", "huggingface_hub")


def runtime_metadata() -> list[tuple[str, str]]:
    """RUNTIME_METADATA's dist-info folders (each a base dependency, so installed wherever the bundle is built)."""
    return [entry for name in RUNTIME_METADATA for entry in copy_metadata(name)]


def datas() -> list[tuple[str, str]]:
    """resources/ (chat template, icons; kernels filtered), the kernel sources, rigllm's, pycuda's and the
    run-time-metadata dependencies' metadata."""
    files = [p for p in RESOURCES.rglob("*") if p.is_file() and KERNELS not in p.parents]
    resources = [(str(p), str(p.parent.relative_to(ROOT))) for p in files]
    sources = [(str(p), "cuda_src") for p in sorted(CUDA_SRC.iterdir()) if p.suffix in (".cu", ".cuh")]
    # engine.cli finds the `gui` command through the rigllm.commands entry point in this metadata; a headless
    # bundle leaves it out, since registering `gui` imports Qt.
    metadata = [] if headless() else copy_metadata("rigllm")
    return [*resources, *kernel_datas(), *sources, *metadata, *pycuda_datas(), *runtime_metadata()]


def without_driver_libraries(binaries: list) -> list:
    """Analysis binaries minus the NVIDIA driver's own libraries."""
    return [b for b in binaries if not Path(b[0]).name.lower().startswith(DRIVER_LIBRARY_PREFIXES)]
