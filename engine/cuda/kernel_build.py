"""Kernel builds: every `cuda_src/*.cu` becomes one module image, built once and cached on disk.

Build (`rigllm build-kernels`, CI, packaging): NVRTC 12.x compiles a source to compute_70 PTX, ptxas
12.9 lowers that PTX to SASS for sm_70/75/80/86/89/90 (and reports sm_70 resources), and nvFatbin packs
the six cubins plus the PTX into `<module>-<key>.fatbin`. Beside it `<module>-<key>.json` records the
source hash (the .cu and every local header it includes), the NVRTC version, the targets, the options
and the sm_70 `ptxas -v` report; `ptxas_sm70.json` sums the reports of a build folder. The key hashes
source, NVRTC version, targets and options, so a changed header or compiler gives a new entry.

Run time (`module_images(arch)`), per module, first match wins (contracts.md "Kernel builds"):

1. an image with SASS for the device's architecture and the current source hash, looked up in
   `$RIGLLM_KERNEL_DIR` (prebuilt fatbins carried to a machine, e.g. the H200 whose image has only
   NVRTC 13: run `rigllm build-kernels --out .kbuild` here and set `RIGLLM_KERNEL_DIR=.kbuild` there),
   then the packaged `resources/kernels/`, then the user cache `<user data>/kernels/`;
2. a cubin compiled now by whichever NVRTC on the machine targets `sm_<arch>` (12.x: any; 13.x:
   sm_75 and newer), saved to the user cache;
3. a prebuilt fatbin's compute_70 PTX, JIT-compiled by the driver (needs a CUDA 12.9+ driver).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import threading
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import RigllmError
from engine.cuda.fatbin import Nvfatbin
from engine.cuda.nvrtc import Nvrtc, significant_warnings
from engine.cuda.ptxas import KernelResources, assemble
from engine.cuda.toolkit import Toolchain, find_toolchains
from engine.paths import CUDA_SRC_DIR, RESOURCES_DIR, user_data_dir

PACKAGED_KERNEL_DIR = RESOURCES_DIR / "kernels"
KERNEL_DIR_ENV = "RIGLLM_KERNEL_DIR"
SASS_ARCHS = (70, 75, 80, 86, 89, 90)
PTX_ARCH = 70
# -lineinfo only adds a line table (no codegen change): compute-sanitizer and fault reports name lines.
NVRTC_OPTIONS = ("--std=c++17", "-lineinfo")
METADATA_FORMAT = 1
REPORT_NAME = "ptxas_sm70.json"

_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.MULTILINE)


def kernel_sources(src_dir: Path = CUDA_SRC_DIR) -> list[Path]:
    """The kernel families: one module per `.cu` file, sorted by name."""
    return sorted(src_dir.glob("*.cu"))


def source_hash(path: Path) -> str:
    """sha256 over the source and every local header it includes (recursively), with their names."""
    digest = hashlib.sha256()
    seen: set[Path] = set()
    pending = [path.resolve()]
    while pending:
        current = pending.pop()
        if current in seen:
            continue
        seen.add(current)
        if not current.is_file():
            raise RigllmError(f"kernel source {path.name} includes {current.name}, which does not exist")
        text = current.read_bytes()
        digest.update(current.name.encode() + b"\0" + text + b"\0")
        pending.extend(current.parent / inc for inc in _INCLUDE.findall(text.decode(errors="replace")))
    return digest.hexdigest()


def _entry_key(module: str, src_hash: str, nvrtc_version: str, sass: Sequence[int], ptx: int | None) -> str:
    text = json.dumps([module, src_hash, nvrtc_version, list(sass), ptx, list(NVRTC_OPTIONS)])
    return hashlib.sha256(text.encode()).hexdigest()[:20]


@dataclass(frozen=True)
class ModuleBuild:
    """One source compiled: PTX, SASS per architecture, the sm_70 report and any real warnings."""

    name: str
    source_hash: str
    nvrtc_version: str
    ptx: bytes
    cubins: dict[int, bytes]
    resources: dict[str, KernelResources]  # sm_70, empty when sm_70 was not built
    warnings: tuple[str, ...]


def build_toolchain() -> tuple[Toolchain, Nvrtc]:
    """The toolchain that can build fatbins: NVRTC targeting compute_70, ptxas and nvFatbin."""
    reasons = []
    for chain in find_toolchains():
        missing = [n for n, v in (("ptxas", chain.ptxas), ("nvFatbin", chain.nvfatbin_library)) if v is None]
        if missing:
            reasons.append(f"{chain.label}: no {' or '.join(missing)}")
            continue
        nvrtc = Nvrtc(chain.nvrtc_library)
        if not nvrtc.supports(PTX_ARCH):
            reasons.append(f"{chain.label}: NVRTC {nvrtc.version_text} cannot target compute_{PTX_ARCH}")
            continue
        return chain, nvrtc
    detail = "; ".join(reasons) or "no NVRTC found"
    raise RigllmError(
        f"cannot build kernels ({detail}): install the build tools with `pip install 'rigllm[kernels]'`"
    )


def compile_module(path: Path, chain: Toolchain, nvrtc: Nvrtc, sass_archs: Sequence[int] = SASS_ARCHS) -> ModuleBuild:
    """compute_70 PTX with NVRTC, then SASS per architecture with ptxas (sm_70 with its `-v` report)."""
    if chain.ptxas is None:
        raise RigllmError(f"{chain.label} has no ptxas")
    src_hash = source_hash(path)
    result = nvrtc.compile(
        path.read_text(), path.name, f"compute_{PTX_ARCH}", (path.parent, *chain.include_dirs), NVRTC_OPTIONS
    )
    warnings = list(result.warnings)
    ptxas = chain.ptxas
    with ThreadPoolExecutor(max_workers=max(1, min(len(sass_archs), os.cpu_count() or 1))) as pool:
        jobs = {arch: pool.submit(assemble, ptxas, result.image, arch, arch == 70, path.stem) for arch in sass_archs}
        assembled = {arch: job.result() for arch, job in jobs.items()}
    for arch, out in assembled.items():
        warnings.extend(f"ptxas sm_{arch}: {w}" for w in out.warnings)
    resources = assembled[70].resources() if 70 in assembled else {}
    return ModuleBuild(
        name=path.stem,
        source_hash=src_hash,
        nvrtc_version=nvrtc.version_text,
        ptx=result.image,
        cubins={arch: out.cubin for arch, out in assembled.items()},
        resources=resources,
        warnings=tuple(warnings),
    )


@dataclass(frozen=True)
class CacheEntry:
    """The JSON beside one cached image."""

    module: str
    source_hash: str
    nvrtc_version: str
    sass_archs: tuple[int, ...]
    ptx_arch: int | None
    image: str  # file name in the same folder
    resources: dict[str, dict[str, int]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def to_json(self) -> str:
        data = {
            "format": METADATA_FORMAT,
            "module": self.module,
            "source_hash": self.source_hash,
            "nvrtc_version": self.nvrtc_version,
            "sass_archs": list(self.sass_archs),
            "ptx_arch": self.ptx_arch,
            "options": list(NVRTC_OPTIONS),
            "image": self.image,
            "ptxas_sm70": self.resources,
            "warnings": list(self.warnings),
        }
        return json.dumps(data, indent=1, sort_keys=True)

    @classmethod
    def read(cls, path: Path) -> CacheEntry | None:
        """The entry described by `path`, or None when it is unreadable, of another format or lacks its image."""
        try:
            data = json.loads(path.read_text())
            if data.get("format") != METADATA_FORMAT or not (path.parent / data["image"]).is_file():
                return None
            return cls(
                module=data["module"],
                source_hash=data["source_hash"],
                nvrtc_version=data["nvrtc_version"],
                sass_archs=tuple(int(a) for a in data["sass_archs"]),
                ptx_arch=None if data["ptx_arch"] is None else int(data["ptx_arch"]),
                image=data["image"],
                resources=data.get("ptxas_sm70", {}),
                warnings=tuple(data.get("warnings", ())),
            )
        except (OSError, ValueError, KeyError, TypeError):
            return None


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")  # card threads may race
    tmp.write_bytes(data)
    tmp.replace(path)


def _store(out_dir: Path, entry: CacheEntry, image: bytes) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_atomic(out_dir / entry.image, image)
    _write_atomic(out_dir / f"{Path(entry.image).stem}.json", entry.to_json().encode())


def _entries(folder: Path, module: str) -> Iterable[tuple[Path, CacheEntry]]:
    if not folder.is_dir():
        return []
    found = []
    for meta in sorted(folder.glob(f"{module}-*.json")):
        entry = CacheEntry.read(meta)
        if entry is not None and entry.module == module:
            found.append((meta, entry))
    return found


@dataclass(frozen=True)
class BuiltModule:
    entry: CacheEntry
    path: Path  # the fatbin
    reused: bool  # True when an up-to-date fatbin was already there


def build_fatbins(out_dir: Path, src_dir: Path = CUDA_SRC_DIR, prune: bool = True,
                  sass_archs: Sequence[int] = SASS_ARCHS) -> list[BuiltModule]:
    """Fatbins for every source into `out_dir` (reusing up-to-date ones) plus `ptxas_sm70.json`.

    With `prune`, older entries of the same modules are removed so a carried folder does not grow.
    `sass_archs` always gains sm_70 (the target cards, and the resource report comes from it).
    """
    sass_archs = tuple(sorted({70, *sass_archs}))
    chain, nvrtc = build_toolchain()
    fatbin = Nvfatbin(chain.nvfatbin_library)  # type: ignore[arg-type]  # build_toolchain checked it
    built = []
    for path in kernel_sources(src_dir):
        key = _entry_key(path.stem, source_hash(path), nvrtc.version_text, sass_archs, PTX_ARCH)
        image_name = f"{path.stem}-{key}.fatbin"
        existing = CacheEntry.read(out_dir / f"{path.stem}-{key}.json")
        if existing is not None:
            built.append(BuiltModule(existing, out_dir / image_name, reused=True))
        else:
            module = compile_module(path, chain, nvrtc, sass_archs)
            image = fatbin.pack(module.name, sorted(module.cubins.items()), (PTX_ARCH, module.ptx))
            entry = CacheEntry(
                module=module.name,
                source_hash=module.source_hash,
                nvrtc_version=module.nvrtc_version,
                sass_archs=sass_archs,
                ptx_arch=PTX_ARCH,
                image=image_name,
                resources={k: r.as_dict() for k, r in sorted(module.resources.items())},
                warnings=module.warnings,
            )
            _store(out_dir, entry, image)
            built.append(BuiltModule(entry, out_dir / image_name, reused=False))
        if prune:
            for meta, old in _entries(out_dir, path.stem):
                if old.image != image_name:
                    (out_dir / old.image).unlink(missing_ok=True)
                    meta.unlink(missing_ok=True)
    report = {b.entry.module: b.entry.resources for b in built}
    _write_atomic(out_dir / REPORT_NAME, json.dumps(report, indent=1, sort_keys=True).encode())
    return built


@dataclass(frozen=True)
class ModuleImage:
    """What the driver loads for one module, and where it came from (for logs and errors)."""

    module: str
    image: bytes
    origin: str


def kernel_cache_dir() -> Path:
    return user_data_dir() / "kernels"


def kernel_search_dirs() -> list[Path]:
    """Prebuilt-image folders in lookup order: `$RIGLLM_KERNEL_DIR`, packaged, user cache."""
    dirs = [Path(os.environ[KERNEL_DIR_ENV])] if os.environ.get(KERNEL_DIR_ENV) else []
    return [*dirs, PACKAGED_KERNEL_DIR, kernel_cache_dir()]


def _find_prebuilt(module: str, src_hash: str, arch: int, dirs: Sequence[Path], want_sass: bool) -> ModuleImage | None:
    for folder in dirs:
        for _, entry in _entries(folder, module):
            if entry.source_hash != src_hash:
                continue
            usable = arch in entry.sass_archs if want_sass else (entry.ptx_arch is not None and entry.ptx_arch <= arch)
            if usable:
                how = f"sm_{arch} SASS" if want_sass else f"compute_{entry.ptx_arch} PTX (driver JIT)"
                return ModuleImage(module, (folder / entry.image).read_bytes(), f"{folder / entry.image} ({how})")
    return None


@functools.lru_cache(maxsize=None)
def _runtime_compiler(arch: int) -> tuple[Toolchain, Nvrtc] | None:
    """The first toolchain whose NVRTC targets sm_<arch> (looked up once per process)."""
    for chain in find_toolchains():
        try:
            nvrtc = Nvrtc(chain.nvrtc_library)
        except RigllmError:
            continue
        if nvrtc.supports(arch):
            return chain, nvrtc
    return None


def _compile_for_device(path: Path, src_hash: str, arch: int, chain: Toolchain, nvrtc: Nvrtc) -> ModuleImage:
    result = nvrtc.compile(
        path.read_text(), path.name, f"sm_{arch}", (path.parent, *chain.include_dirs), NVRTC_OPTIONS
    )
    key = _entry_key(path.stem, src_hash, nvrtc.version_text, (arch,), None)
    entry = CacheEntry(
        module=path.stem,
        source_hash=src_hash,
        nvrtc_version=nvrtc.version_text,
        sass_archs=(arch,),
        ptx_arch=None,
        image=f"{path.stem}-{key}.cubin",
        warnings=significant_warnings(result.log),
    )
    _store(kernel_cache_dir(), entry, result.image)
    return ModuleImage(path.stem, result.image, f"NVRTC {nvrtc.version_text} from {chain.label}, sm_{arch}")


def module_images(arch: int, src_dir: Path = CUDA_SRC_DIR) -> list[ModuleImage]:
    """One loadable image per kernel module for a device of compute capability `arch` (e.g. 70, 90)."""
    sources = kernel_sources(src_dir)
    if not sources:
        raise RigllmError(f"no kernel sources (*.cu) in {src_dir}")
    dirs = kernel_search_dirs()
    images = []
    for path in sources:
        src_hash = source_hash(path)
        image = _find_prebuilt(path.stem, src_hash, arch, dirs, want_sass=True)
        if image is None:
            compiler = _runtime_compiler(arch)
            if compiler is not None:
                image = _compile_for_device(path, src_hash, arch, *compiler)
            else:
                image = _find_prebuilt(path.stem, src_hash, arch, dirs, want_sass=False)
        if image is None:
            searched = ", ".join(str(d) for d in dirs)
            raise RigllmError(
                f"no kernels for sm_{arch}: {path.name} has no prebuilt image matching its source in {searched}, "
                f"and no NVRTC on this machine targets sm_{arch}. Run `rigllm build-kernels --out DIR` on a "
                f"machine with `rigllm[kernels]` and set {KERNEL_DIR_ENV}=DIR here"
            )
        images.append(image)
    return images
