"""Build llama-cpp-python with CUDA from its sdist into a wheel, or reuse a wheel already built.

Why a wheel: the GPU machine starts bare and cannot download anything, so the build (minutes) is done
once, the wheel comes back through $OUT and is carried to later calls, where installing it takes
seconds. The build is kept as small as llama.cpp allows: one real architecture (sm_90, no PTX),
no mtmd/llava library, no tests/tools/examples, flash-attention kernels only for the default KV
types (GGML_CUDA_FA_ALL_QUANTS stays OFF), no NCCL, no OpenSSL, no -march=native (toolchain.md §5: the native
CPU build crashes in the AMX Q8_0 path on some hosts).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

from engine.errors import RigllmError

CMAKE_ARGS = " ".join([
    "-DGGML_CUDA=on", "-DCMAKE_CUDA_ARCHITECTURES=90-real", "-DGGML_NATIVE=OFF",
    "-DGGML_CUDA_FA_ALL_QUANTS=OFF", "-DGGML_CUDA_NCCL=OFF", "-DLLAVA_BUILD=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_TOOLS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
    "-DLLAMA_OPENSSL=OFF",
])
WHEEL_GLOB = "llama_cpp_python-*.whl"
# Parts of the sdist the CUDA build never reads (models/ alone is 75 MB): dropped so the source fits the
# device's 64 MiB carry limit (contracts.md: llama.cpp travels as a stripped source tree).
_LLAMA = "vendor/llama.cpp/"
STRIPPED = tuple(_LLAMA + d for d in (
    "models/", "docs/", "tests/", "media/", "examples/", "tools/", "benches/", "pocs/", ".github/", ".devops/",
    "gguf-py/", "conversion/", "scripts/", "app/", "skills/", "ci/", "requirements/", "grammars/",
)) + tuple(f"{_LLAMA}ggml/src/ggml-{b}/" for b in (
    "vulkan", "sycl", "metal", "opencl", "cann", "musa", "hip", "hexagon", "webgpu", "zdnn", "zendnn", "openvino",
    "virtgpu", "et",
)) + (".git/", "docs/", "examples/", "tests/", "docker/")


def strip_sdist(tarball: Path, out: Path) -> Path:
    """Write a .tar.gz of the sdist without the STRIPPED folders (same top folder, so pip builds it alike)."""
    with tarfile.open(tarball) as src, tarfile.open(out, "w:gz", compresslevel=9) as dst:
        for member in src:
            rel = member.name.split("/", 1)[1] if "/" in member.name else ""
            if any(rel.startswith(prefix) or rel + "/" == prefix for prefix in STRIPPED):
                continue
            dst.addfile(member, src.extractfile(member) if member.isfile() else None)
    return out


def find_wheel(folder: Path) -> Path | None:
    """The newest llama-cpp-python wheel in `folder`, if any (a wheel split into parts is joined first)."""
    if not folder.is_dir():
        return None
    join_parts(folder)
    wheels = sorted(folder.glob(WHEEL_GLOB), key=lambda p: p.stat().st_mtime)
    return wheels[-1] if wheels else None


def join_parts(folder: Path) -> None:
    """Reassemble `NAME.whl.part00`, `.part01`, ... into NAME.whl (files from $OUT are at most 16 MiB)."""
    for first in folder.glob("*.whl.part00"):
        target = folder / first.name[: -len(".part00")]
        if target.exists():
            continue
        parts = sorted(folder.glob(target.name + ".part*"))
        tmp = target.with_suffix(".tmp")
        with tmp.open("wb") as out:
            for part in parts:
                out.write(part.read_bytes())
        tmp.rename(target)


def split_file(path: Path, out_dir: Path, part_bytes: int = 15 << 20) -> list[Path]:
    """Copy `path` into `out_dir` as `.partNN` pieces of at most `part_bytes` (for $OUT's per-file limit)."""
    data = path.read_bytes()
    out_dir.mkdir(parents=True, exist_ok=True)
    parts = []
    for i, start in enumerate(range(0, max(len(data), 1), part_bytes)):
        part = out_dir / f"{path.name}.part{i:02d}"
        part.write_bytes(data[start:start + part_bytes])
        parts.append(part)
    return parts


def build_command(sdist: Path, wheel_dir: Path) -> list[str]:
    """pip wheel without build isolation (the GPU machine is offline; its image has scikit-build-core,
    cmake and ninja) and without dependencies (they are installed separately or already there)."""
    return [sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation", "--no-index",
            "--no-cache-dir", "-w", str(wheel_dir), str(sdist)]


def build_env(jobs: int) -> dict[str, str]:
    """The build's environment; nvcc is looked for in the toolkit's usual place when it is not on PATH
    (CMake's CUDA language check needs it)."""
    env = {**os.environ, "CMAKE_ARGS": CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(jobs)}
    if "CUDACXX" not in env and shutil.which("nvcc") is None and Path("/usr/local/cuda/bin/nvcc").is_file():
        env["CUDACXX"] = "/usr/local/cuda/bin/nvcc"
    return env


PYTHON_LOADED = ("libllama.so", "libggml.so")  # llama_cpp opens these by name; the rest by soname


def keep_in_slim_wheel(name: str) -> bool:
    """Whether a wheel entry survives `slim_wheel`: the Python package, its metadata, and in llama_cpp/lib
    one copy of each library under its soname (`libX.so.0`, what DT_NEEDED asks for) plus the names
    Python opens. The wheel as built stores every library six times (`lib/` and `llama_cpp/lib/`, each
    as .so, .so.0 and .so.0.x.y copies), which with ggml-cuda would not fit the device's transfer limits."""
    top = name.split("/", 1)[0]
    if top in ("lib", "include", "bin"):
        return False
    if not name.startswith("llama_cpp/lib/"):
        return True
    file = name.rsplit("/", 1)[1]
    stem, _, version = file.partition(".so")
    return file in PYTHON_LOADED or (version.count(".") == 1 and version[1:].isdigit() and stem.startswith("lib"))


def slim_wheel(wheel: Path) -> Path:
    """Rewrite `wheel` in place with only the entries `keep_in_slim_wheel` accepts (RECORD trimmed to match)."""
    tmp = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED, compresslevel=9) as dst:
        kept = {i.filename for i in src.infolist() if keep_in_slim_wheel(i.filename)}
        for info in src.infolist():
            if info.filename not in kept:
                continue
            data = src.read(info)
            if info.filename.endswith(".dist-info/RECORD"):
                lines = data.decode().splitlines()
                data = ("\n".join(line for line in lines if line.split(",", 1)[0] in kept or
                                  line.split(",", 1)[0].endswith("/RECORD")) + "\n").encode()
            dst.writestr(info, data)
    tmp.replace(wheel)
    return wheel


def has_cuda_backend(wheel: Path) -> bool:
    """Whether the wheel carries ggml's CUDA library (a build that silently fell back to CPU does not)."""
    with zipfile.ZipFile(wheel) as zf:
        return any("libggml-cuda" in name for name in zf.namelist())


def build_wheel(sdist: Path, wheel_dir: Path, log_path: Path, timeout_s: float, jobs: int | None = None) -> Path:
    """Build the CUDA wheel into `wheel_dir`, logging everything to `log_path`; raise with the log's tail
    when the build fails or outlives `timeout_s` (the device's per-command limit is 10 minutes)."""
    if not sdist.exists():
        raise RigllmError(f"llama-cpp-python sdist not found: {sdist}")
    wheel_dir.mkdir(parents=True, exist_ok=True)
    jobs = jobs or os.cpu_count() or 4
    start = time.monotonic()
    with log_path.open("w") as log:
        log.write(f"CMAKE_ARGS={CMAKE_ARGS}\nCMAKE_BUILD_PARALLEL_LEVEL={jobs}\n{' '.join(build_command(sdist, wheel_dir))}\n")
        log.flush()
        try:
            result = subprocess.run(build_command(sdist, wheel_dir), stdout=log, stderr=subprocess.STDOUT, check=False,
                                    env=build_env(jobs), timeout=timeout_s)
            rc: int | str = result.returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log.write(f"\nbuild finished: rc={rc} after {time.monotonic() - start:.0f} s\n")
    wheel = find_wheel(wheel_dir)
    if rc != 0 or wheel is None:
        tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-15:])
        raise RigllmError(f"llama-cpp-python build failed (rc={rc}, log {log_path}):\n{tail}")
    if not has_cuda_backend(wheel):
        raise RigllmError(f"{wheel.name} has no libggml-cuda: CUDA was not found at build time (log {log_path})")
    return slim_wheel(wheel)


def install_wheel(wheel: Path, target: Path) -> Path:
    """Install the wheel (no dependencies, no index) into `target`, a folder put first on sys.path/PYTHONPATH."""
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--no-compile", "--upgrade",
           "--target", str(target), str(wheel)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    if result.returncode != 0:
        raise RigllmError(f"installing {wheel.name} failed: {result.stderr.strip()[-2000:]}")
    return target


def main(argv: list[str] | None = None) -> int:
    """`python -m engine.bench_peer.build SDIST.tar.gz STRIPPED.tar.gz`: the stripped sdist to carry."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m engine.bench_peer.build", description=main.__doc__)
    p.add_argument("sdist", type=Path)
    p.add_argument("out", type=Path)
    args = p.parse_args(argv)
    strip_sdist(args.sdist, args.out)
    print(f"{args.out}: {args.out.stat().st_size / 2**20:.1f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
