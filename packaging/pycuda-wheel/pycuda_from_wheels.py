"""PEP 517 backend: pycuda 2026.1 from its PyPI sdist, built with no CUDA toolkit.

pycuda's own build (aksetup) expects a toolkit: it derives CUDA_ROOT from nvcc on PATH, includes cuda.h
from there and links libcuda.so, none of which a rig with only the NVIDIA driver has. This backend
1. names NVIDIA's header wheels as build requirements (pip installs them into the isolated build env):
   nvidia-cuda-runtime-cu12 has cuda.h, nvidia-cuda-profiler-api-cu12 has cudaProfiler.h;
2. checks the compiler and the Python headers (build_toolchain.py: a clear error naming the package);
3. generates a link-time libcuda stub from that cuda.h (libcuda_stub.py; SONAME libcuda.so.1, so the
   driver's library is what loads at run time);
4. fetches the sdist with pip (hash-pinned) and writes its siteconf.py with EVERY aksetup option, so
   nothing comes from nvcc on PATH, a CUDA root, ~/.aksetup-defaults.py or /etc/aksetup-defaults.py
   (siteconf.py is read last by aksetup and overrides them);
5. builds the wheel with setuptools in the unpacked sdist and adds pycuda/RIGLLM_BUILD.txt saying how.
cuRAND is left out (CUDA_ENABLE_CURAND=False): rigllm never uses pycuda.curandom, and it would need
curand.h to build and libcurand.so.10 at run time.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from importlib.metadata import version
from pathlib import Path

from build_toolchain import BuildError, check_toolchain, compiler
from libcuda_stub import SONAME, build_stub

PYCUDA_VERSION = "2026.1"
PYCUDA_SDIST_SHA256 = "759516160628ba06f32ce7e563e3f5b9214691dc9528a03ea99ea1073f4e14ba"
# (distribution, folder under site-packages/nvidia/ holding include/, a header it must have)
HEADER_WHEELS = (
    ("nvidia-cuda-runtime-cu12==12.9.*", "cuda_runtime", "cuda.h"),
    ("nvidia-cuda-profiler-api-cu12==12.9.*", "cuda_profiler_api", "cudaProfiler.h"),
)
BUILD_REQUIRES = ["setuptools>=69", "wheel", "numpy>=1.24", "pip", *(w[0] for w in HEADER_WHEELS)]
BUILD_NOTE = "pycuda/RIGLLM_BUILD.txt"


def get_requires_for_build_wheel(config_settings: dict | None = None) -> list[str]:
    return list(BUILD_REQUIRES)


def build_wheel(wheel_directory: str, config_settings: dict | None = None, metadata_directory: str | None = None) -> str:
    try:
        with tempfile.TemporaryDirectory(prefix="pycuda-wheel-") as tmp:
            wheel = _build(Path(tmp))
            shutil.copy2(wheel, Path(wheel_directory) / wheel.name)
            return wheel.name
    except BuildError as err:
        raise SystemExit(f"error: pycuda cannot be built here: {err}") from None


def _log(message: str) -> None:
    print(f"[pycuda-wheel] {message}", file=sys.stderr, flush=True)


def _build(work: Path) -> Path:
    cc = compiler()
    include_dirs = header_dirs()
    _log(f"CUDA headers from NVIDIA's wheels: {', '.join(map(str, include_dirs))} (no CUDA toolkit is used)")
    check_toolchain(include_dirs, work)
    stub_dir, count = build_stub(cc, include_dirs, work / "libcuda-stub")
    _log(f"link-time {SONAME} stub: {count} driver API functions from cuda.h, in {stub_dir}")
    source = unpack(fetch_sdist(work / "sdist"), work / "src")
    write_siteconf(source, include_dirs, stub_dir)
    write_build_note(source, count)
    dist = work / "dist"
    subprocess.run([sys.executable, "-c", "import sys; from setuptools import build_meta; "
                    "build_meta.build_wheel(sys.argv[1])", str(dist)], cwd=source, check=True)
    wheels = sorted(dist.glob("pycuda-*.whl"))
    if len(wheels) != 1:
        raise BuildError(f"setuptools left {len(wheels)} pycuda wheels in {dist}")
    _log(f"built {wheels[0].name}")
    return wheels[0]


def header_dirs() -> list[Path]:
    """The include/ folders of the header wheels, found on this (build) environment's path."""
    found = []
    for requirement, folder, header in HEADER_WHEELS:
        candidates = [Path(p, "nvidia", folder, "include") for p in sys.path if p]
        match = next((d for d in candidates if (d / header).is_file()), None)
        if match is None:
            raise BuildError(f"{header} not found: the build requirement {requirement} is not installed "
                             "(with --no-build-isolation, install it first)")
        found.append(match)
    return found


# What the pip running this backend tells its hook process (pyproject_hooks: `_PYPROJECT_HOOKS_*` since pip
# 24, `PEP517_*` before): inherited by the pip below, they would point its own metadata hook for pycuda's
# sdist at this folder ("Cannot find module 'setuptools.build_meta' in ['.../pycuda-wheel']", seen with
# pip 26 on Python 3.12), so they are dropped from its environment.
HOOK_ENVIRONMENT_PREFIXES = ("_PYPROJECT_HOOKS_", "PYPROJECT_HOOKS_", "PEP517_")


def pip_environment() -> dict[str, str]:
    """This process's environment without the build-hook variables of the pip that started it."""
    return {k: v for k, v in os.environ.items() if not k.startswith(HOOK_ENVIRONMENT_PREFIXES)}


def fetch_sdist(dest: Path) -> Path:
    """pycuda's sdist through pip (the user's index and proxy settings apply), checked against its pinned hash."""
    dest.mkdir(parents=True)
    requirements = dest / "pycuda-requirement.txt"
    requirements.write_text(f"pycuda=={PYCUDA_VERSION} --hash=sha256:{PYCUDA_SDIST_SHA256}\n")
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "pycuda",
                    "--no-build-isolation", "--require-hashes", "-r", str(requirements), "-d", str(dest)],
                   check=True, env=pip_environment())
    return dest / f"pycuda-{PYCUDA_VERSION}.tar.gz"


def unpack(sdist: Path, dest: Path) -> Path:
    with tarfile.open(sdist) as tar:
        tar.extractall(dest, filter="data")
    return dest / f"pycuda-{PYCUDA_VERSION}"


def siteconf(include_dirs: list[Path], stub_dir: Path) -> dict[str, object]:
    """Every aksetup option of pycuda 2026.1's setup.py, so no default or user config file decides anything."""
    return {
        "USE_SHIPPED_BOOST": True, "BOOST_INC_DIR": [], "BOOST_LIB_DIR": [], "BOOST_COMPILER": "gcc43",
        "BOOST_PYTHON_LIBNAME": [], "BOOST_THREAD_LIBNAME": [],
        "CUDA_ROOT": None, "CUDA_PRETEND_VERSION": None, "CUDA_TRACE": False, "CUDA_ENABLE_GL": False,
        "CUDA_INC_DIR": [str(d) for d in include_dirs],
        "CUDADRV_LIB_DIR": [str(stub_dir)], "CUDADRV_LIBNAME": ["cuda"],
        "CUDART_LIB_DIR": [], "CUDART_LIBNAME": [],
        "CUDA_ENABLE_CURAND": False, "CURAND_LIB_DIR": [], "CURAND_LIBNAME": [],
        # -g0: Python's own CFLAGS may carry -g, which makes _driver.so 19 MB instead of about 2
        "CXXFLAGS": ["-g0"], "LDFLAGS": [],
    }


def write_siteconf(source: Path, include_dirs: list[Path], stub_dir: Path) -> None:
    lines = [f"{key} = {value!r}" for key, value in siteconf(include_dirs, stub_dir).items()]
    (source / "siteconf.py").write_text("\n".join(lines) + "\n")


def write_build_note(source: Path, stub_functions: int) -> None:
    """pycuda/RIGLLM_BUILD.txt in the wheel: how it was built (rigllm doctor and packaging/gpu_check.sh print it)."""
    headers = ", ".join(f"{w[0].split('==')[0]} {version(w[0].split('==')[0])}" for w in HEADER_WHEELS)
    (source / BUILD_NOTE).write_text(
        f"built by rigllm packaging/pycuda-wheel without a CUDA toolkit: CUDA headers from {headers}; "
        f"linked against a {SONAME} stub of {stub_functions} functions (the NVIDIA driver's library loads at "
        f"run time); cuRAND left out; Python {sys.version.split()[0]}\n")
    with open(source / "MANIFEST.in", "a") as manifest:
        manifest.write(f"\ninclude {BUILD_NOTE}\n")
