"""The host tools pycuda's build needs, checked up front so a missing one is named with its Debian package.

setuptools compiles pycuda's C++ with the compilers Python was built with (sysconfig CC/CXX, or $CC/$CXX)
and needs Python.h; without this check the user gets a page of compiler output ending in a cryptic line.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sysconfig
from pathlib import Path


class BuildError(RuntimeError):
    """A build precondition that is not met, with what to install."""


def compiler(language: str = "CC") -> list[str]:
    """The C ("CC") or C++ ("CXX") compiler command setuptools uses (the environment variable wins, as in distutils)."""
    default = {"CC": "cc", "CXX": "c++"}[language]
    return shlex.split(os.environ.get(language) or sysconfig.get_config_var(language) or default)


def python_include_dir() -> Path:
    return Path(sysconfig.get_paths()["include"])


def check_toolchain(include_dirs: list[Path], work: Path) -> None:
    """Compile a probe that includes Python.h and the CUDA headers as C++; raise `BuildError` saying what is missing."""
    for language in ("CC", "CXX"):
        command = compiler(language)
        if shutil.which(command[0]) is None:
            raise BuildError(f"no {'C' if language == 'CC' else 'C++'} compiler: `{command[0]}` is not on PATH "
                             f"(set ${language} to use another). On Debian/Ubuntu: sudo apt-get install build-essential")
    python_h = python_include_dir() / "Python.h"
    if not python_h.is_file():
        raise BuildError(f"the Python headers are missing: no {python_h}. "
                         "On Debian/Ubuntu: sudo apt-get install python3-dev (python3.X-dev for python3.X)")
    probe = work / "toolchain_probe.cpp"
    probe.write_text("#include <Python.h>\n#include <cuda.h>\n#include <cudaProfiler.h>\n"
                     "static_assert(CUDA_VERSION >= 12000, \"CUDA 12 headers expected\");\nint main() { return 0; }\n")
    includes = [f"-I{d}" for d in [python_include_dir(), *include_dirs]]
    cxx = compiler("CXX")
    result = subprocess.run([*cxx, "-x", "c++", "-fsyntax-only", *includes, str(probe)],
                            capture_output=True, text=True, check=False)
    if result.returncode == 0:
        return
    if "cc1plus" in result.stderr:
        raise BuildError(f"`{cxx[0]}` cannot compile C++ (no cc1plus). On Debian/Ubuntu: sudo apt-get install g++")
    raise BuildError(f"`{shlex.join(cxx)}` cannot compile a C++ file that includes Python.h and cuda.h:\n"
                     f"{result.stderr.strip()}")
