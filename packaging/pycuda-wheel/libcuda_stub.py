"""A link-time stand-in for the NVIDIA driver's libcuda, generated from cuda.h.

pycuda's extension links `-lcuda`. A machine without a CUDA toolkit has no libcuda.so to link against
(the driver installs only libcuda.so.1, and a build machine may have no driver at all). The stub defines
every driver API function cuda.h declares, under the names the header's macros map them to (cuMemAlloc ->
cuMemAlloc_v2, ...), and carries the SONAME libcuda.so.1, so the built extension records
`NEEDED libcuda.so.1` and the dynamic loader opens the driver's real library at run time. The stub itself
is never installed or loaded; each function returns CUDA_ERROR_STUB_LIBRARY (34) just in case.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

SONAME = "libcuda.so.1"
STUB_LIBRARY_ERROR = 34  # CUDA_ERROR_STUB_LIBRARY
_DECLARED_FUNCTION = re.compile(r"\b(cu[A-Z][A-Za-z0-9_]*)\s*\(")
HEADERS = ("cuda.h", "cudaProfiler.h")


def driver_api_names(cc: list[str], include_dirs: list[Path], work: Path) -> list[str]:
    """The driver API function names of cuda.h and cudaProfiler.h after preprocessing (what objects reference)."""
    source = work / "driver_api.c"
    source.write_text("".join(f"#include <{h}>\n" for h in HEADERS))
    result = subprocess.run([*cc, "-E", "-P", *[f"-I{d}" for d in include_dirs], str(source)],
                            capture_output=True, text=True, check=True)
    names = sorted(set(_DECLARED_FUNCTION.findall(result.stdout)))
    if "cuInit" not in names or "cuProfilerStart" not in names:
        raise RuntimeError(f"no driver API declarations found in {HEADERS} under {include_dirs}")
    return names


def stub_source(names: list[str]) -> str:
    lines = [f"/* Link-time stub of {SONAME}, generated from cuda.h by packaging/pycuda-wheel/libcuda_stub.py. */"]
    lines += [f"int {name}(void) {{ return {STUB_LIBRARY_ERROR}; }}" for name in names]
    return "\n".join(lines) + "\n"


def build_stub(cc: list[str], include_dirs: list[Path], out_dir: Path) -> tuple[Path, int]:
    """Write and compile `out_dir/libcuda.so` (SONAME libcuda.so.1); return the folder and the symbol count."""
    out_dir.mkdir(parents=True, exist_ok=True)
    names = driver_api_names(cc, include_dirs, out_dir)
    source = out_dir / "libcuda_stub.c"
    source.write_text(stub_source(names))
    subprocess.run([*cc, "-shared", "-fPIC", f"-Wl,-soname,{SONAME}", "-o", str(out_dir / "libcuda.so"), str(source)],
                   check=True)
    return out_dir, len(names)
