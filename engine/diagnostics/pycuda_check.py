"""The doctor's "pycuda" check: installed or not, how it was built, and whether it can reach a GPU (and why not).

pycuda is only imported through the driver facade (engine.cuda.driver), as everywhere else. A pycuda built
by rigllm's recipe (packaging/pycuda-wheel) installs without a driver but loads only with one, so "installed
but no driver" is its own finding, not "pycuda missing".
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from engine.diagnostics.findings import ERROR, Check
from engine.diagnostics.gpu_checks import DRIVER_FIX

INSTALL_FIX = ("pip install -e '.[gpu]' in a rigllm checkout: builds pycuda with no CUDA toolkit "
               "(needs a C++ compiler and the Python headers; packaging/README.md)")
REBUILD_FIX = "rebuild pycuda: pip install --force-reinstall --no-deps ./packaging/pycuda-wheel (in a rigllm checkout)"
BUILD_NOTE = "RIGLLM_BUILD.txt"  # written into the wheel by packaging/pycuda-wheel/pycuda_from_wheels.py


def build_note(spec: importlib.machinery.ModuleSpec) -> str | None:
    """How this pycuda was built, when rigllm's recipe built it (a file in the package; pycuda is not imported)."""
    for folder in spec.submodule_search_locations or []:
        note = Path(folder) / BUILD_NOTE
        if note.is_file():
            return note.read_text(encoding="utf-8").strip()
    return None


def pycuda_check(have_gpu: bool) -> Check:
    spec = importlib.util.find_spec("pycuda")
    if spec is None:
        check = Check("pycuda", "not installed: the CUDA backend cannot run", data={"installed": False})
        if have_gpu:
            check.problem(ERROR, "pycuda is not installed, so the cards cannot be used", INSTALL_FIX)
        return check
    try:
        label = f"pycuda {version('pycuda')}"
    except PackageNotFoundError:
        label = "pycuda (version unknown)"
    from engine.cuda.driver import NO_DRIVER, gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    note = build_note(spec)
    check = Check("pycuda", f"{label}: " + (f"cannot use a GPU: {reason}" if reason else "imports and sees the GPU(s)"))
    if note:
        check.details.append(note)
    driver_missing = bool(reason) and reason.startswith(NO_DRIVER)
    check.data = {"installed": True, "usable": reason is None, "reason": reason, "driver_missing": driver_missing,
                  "built_by_rigllm": note is not None}
    if reason and have_gpu:
        if driver_missing:
            check.problem(ERROR, f"{label} is installed but the NVIDIA driver is missing", DRIVER_FIX)
        else:
            check.problem(ERROR, f"{label} is installed but unusable: {reason}", REBUILD_FIX)
    return check
