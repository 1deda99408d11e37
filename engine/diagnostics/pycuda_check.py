"""The doctor's "pycuda" check: installed or not, and whether it can reach a GPU (and why not).

pycuda is only imported through the driver facade (engine.cuda.driver), as everywhere else.
"""

from __future__ import annotations

import importlib.util
from importlib.metadata import PackageNotFoundError, version

from engine.diagnostics.findings import ERROR, Check

INSTALL_FIX = ("pip install 'rigllm[gpu]' (pycuda is built from source: it needs the CUDA toolkit headers and "
               "libcuda; see docs for the prebuilt wheel route)")


def pycuda_check(have_gpu: bool) -> Check:
    if importlib.util.find_spec("pycuda") is None:
        check = Check("pycuda", "not installed: the CUDA backend cannot run", data={"installed": False})
        if have_gpu:
            check.problem(ERROR, "pycuda is not installed, so the cards cannot be used", INSTALL_FIX)
        return check
    try:
        label = f"pycuda {version('pycuda')}"
    except PackageNotFoundError:
        label = "pycuda (version unknown)"
    from engine.cuda.driver import gpu_unavailable_reason

    reason = gpu_unavailable_reason()
    check = Check("pycuda", f"{label}: " + (f"cannot use a GPU: {reason}" if reason else "imports and sees the GPU(s)"))
    check.data = {"installed": True, "usable": reason is None, "reason": reason}
    if reason and have_gpu:
        check.problem(ERROR, f"{label} is installed but unusable: {reason}",
                      "rebuild pycuda against this driver's CUDA (pip install --force-reinstall --no-binary pycuda pycuda)")
    return check
