"""Builds cuda_src/ for the emulated card (tests/emu/README.md): one shared library per `.cu` file, compiled by
the host's g++ against cuda_cpu.h, each holding its kernels' table and its own copy of the fiber launcher.

Sources are copied with the two constructs plain C++ cannot take rewritten: inline PTX (only L2 prefetches,
which do nothing here) and `extern __shared__` arrays (pointed at the launch's dynamic shared memory). Builds are
cached by the hash of everything they read, so a session pays for them once (about a minute on 2 cores).
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from engine.cuda.kernel_build import kernel_sources
from engine.paths import CUDA_SRC_DIR as CUDA_SRC

HERE = Path(__file__).resolve().parent
# -fno-strict-aliasing: kernels read one type through pointers to another (a uint4 load read as __half2s), which
# CUDA compilers allow and g++ -O2 otherwise optimises away.
FLAGS = ["-std=c++20", "-O2", "-fno-strict-aliasing", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-w"]

_INLINE_PTX = re.compile(r"asm volatile\(.*\);")  # one statement a line in cuda_src
_DYNAMIC_SHARED = re.compile(r"extern __shared__ (\w+) (\w+)\[\];")
_KERNEL = re.compile(r"emu_kernel_marker\s+void\s+(\w+)\s*\(")


class EmuBuildError(RuntimeError):
    pass


def _inputs() -> list[Path]:
    return sorted(CUDA_SRC.glob("*.cu*")) + [HERE / "cuda_cpu.h", HERE / "fibers.cpp", Path(__file__).resolve()]


def build_dir() -> Path:
    digest = hashlib.sha256()
    for path in _inputs():
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    root = Path(os.environ.get("RIGLLM_EMU_DIR", Path.home() / ".cache" / "rigllm" / "emu"))
    return root / digest.hexdigest()[:16]


def _rewrite(text: str) -> str:
    text = _INLINE_PTX.sub(";", text)
    text = _DYNAMIC_SHARED.sub(r"\1* \2 = static_cast<\1*>(emu::dynamic_shared());", text)
    return text.replace("#include <cuda_fp16.h>", "")


def _run(cmd: list[str]) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise EmuBuildError(f"{' '.join(cmd[:3])} ... failed:\n{done.stderr[-6000:]}")
    return done.stdout


def _compile_file(cu: Path, work: Path, fibers_obj: Path) -> Path:
    header = ["-include", str(HERE / "cuda_cpu.h"), "-I", str(work / "src")]
    listed = _run(["g++", "-std=c++20", "-x", "c++", "-E", "-DEMU_LIST_KERNELS", *header, str(work / "src" / cu.name)])
    names = sorted(set(_KERNEL.findall(listed)))
    if not names:
        raise EmuBuildError(f"no kernel found in {cu.name}")
    table = work / f"{cu.stem}_table.cpp"
    entries = ",\n".join(f'    {{"{n}", &emu::entry<&{n}>}}' for n in names)
    table.write_text(
        f'#include "{cu.name}"\n'
        f"static const emu::KernelEntry emu_table[] = {{\n{entries}\n}};\n"
        'extern "C" __attribute__((visibility("default"))) const emu::KernelEntry* emu_kernels(int* n) {\n'
        f"    *n = {len(names)};\n    return emu_table;\n}}\n"
    )
    obj, library = work / f"{cu.stem}.o", work / f"{cu.stem}.so"
    _run(["g++", *FLAGS, "-c", *header, str(table), "-o", str(obj)])
    _gather_shared(obj)
    _run(["g++", *FLAGS, "-shared", str(obj), str(fibers_obj), "-o", str(library)])
    return library


def _gather_shared(obj: Path) -> None:
    """Move every zero-initialised static of a kernel object into section emu_shared, whose bounds fibers.cpp
    poisons before each block. They are all __shared__ variables (cuda_src/ has no other statics). A section
    attribute in cuda_cpu.h cannot do it: g++ ignores it for the statics of inline and template functions, which
    get sections of their own (.bss.<name>, in COMDAT groups)."""
    listing = _run(["readelf", "-SW", str(obj)])
    names = sorted(set(re.findall(r"\]\s+(\.bss[^\s]*)\s", listing)))
    if names:
        _run(["objcopy", *[f"--rename-section={n}=emu_shared" for n in names], str(obj)])


def build() -> list[Path]:
    """The libraries of every `.cu` file, built now if this tree's are not cached."""
    out = build_dir()
    sources = kernel_sources()
    libraries = [out / f"{cu.stem}.so" for cu in sources]
    if all(p.exists() for p in libraries):
        return libraries
    work = out.with_name(out.name + f".tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    try:
        (work / "src").mkdir(parents=True)
        for path in CUDA_SRC.glob("*.cu*"):
            (work / "src" / path.name).write_text(_rewrite(path.read_text()))
        fibers_obj = work / "fibers.o"
        _run(["g++", *FLAGS, "-c", "-I", str(HERE), str(HERE / "fibers.cpp"), "-o", str(fibers_obj)])
        with ThreadPoolExecutor(max(1, os.cpu_count() or 1)) as pool:
            jobs = [pool.submit(_compile_file, cu, work, fibers_obj) for cu in sources]
        failures = [str(job.exception()) for job in jobs if job.exception() is not None]
        if failures:
            raise EmuBuildError("\n".join(failures))
        if not out.exists():
            work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return libraries


if __name__ == "__main__":
    for library in build():
        print(library)
