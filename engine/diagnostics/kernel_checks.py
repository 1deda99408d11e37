"""The doctor's "NVRTC" check: which compilers this machine has, and one real kernel built for the cards.

The engine picks kernels at load time from prebuilt fatbins or by compiling with the first NVRTC
that targets the card (engine.cuda.kernel_build); this check runs the compiling half for real, on
the smallest source in `cuda_src/` (it pulls in a local header and cuda_fp16.h, so include paths
are exercised too), and counts the prebuilt images that would make compiling unnecessary.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from engine.cuda.kernel_build import (
    NVRTC_OPTIONS,
    CacheEntry,
    kernel_search_dirs,
    kernel_sources,
    source_hash,
)
from engine.cuda.nvrtc import Nvrtc
from engine.cuda.toolkit import Toolchain, find_toolchains
from engine.diagnostics.findings import ERROR, WARNING, Check
from engine.errors import RigllmError

NO_CARD_TARGET = 70  # what the build must handle when there is no card to ask: the CMP's Volta
KERNELS_FIX = "pip install 'rigllm[kernels]' (NVRTC 12.9 targets sm_70 and newer)"


def _prebuilt_modules(arch: int) -> int:
    """How many kernel modules have an up-to-date prebuilt image with SASS for `arch`."""
    found = 0
    for path in kernel_sources():
        digest = source_hash(path)
        for folder in kernel_search_dirs():
            entries = (CacheEntry.read(m) for m in folder.glob(f"{path.stem}-*.json")) if folder.is_dir() else ()
            if any(e and e.module == path.stem and e.source_hash == digest and arch in e.sass_archs for e in entries):
                found += 1
                break
    return found


def kernel_check(card_archs: list[int]) -> Check:
    """Compilers found, and a test build for each card architecture (compute_70 PTX when there is no card)."""
    chains: list[tuple[Toolchain, Nvrtc]] = []
    check = Check("NVRTC", "")
    for chain in find_toolchains():
        try:
            nvrtc = Nvrtc(chain.nvrtc_library)
        except RigllmError as err:
            check.details.append(f"{chain.label}: {err}")
            continue
        archs = nvrtc.supported_archs
        check.details.append(f"NVRTC {nvrtc.version_text} ({chain.nvrtc_library}), targets sm_{min(archs)}-sm_{max(archs)}")
        chains.append((chain, nvrtc))
    check.data["toolchains"] = [{"label": c.label, "nvrtc": n.version_text, "library": str(c.nvrtc_library),
                                 "archs": list(n.supported_archs)} for c, n in chains]
    sources = kernel_sources()
    if not sources:
        check.summary = "no kernel sources (cuda_src/*.cu) in this install"
        check.problem(ERROR, "the kernel sources are missing", "reinstall rigllm")
        return check
    probe = min(sources, key=lambda p: p.stat().st_size)
    targets = sorted(set(card_archs)) or [NO_CARD_TARGET]
    results = [_test_build(check, chains, probe, arch, ptx=not card_archs) for arch in targets]
    check.data["builds"] = results
    built = [r for r in results if r["ok"]]
    if not chains:
        check.summary = "no NVRTC found"
    else:
        versions = ", ".join(f"NVRTC {n.version_text}" for _, n in chains)
        check.summary = f"{versions}; test build of {probe.name}: " + ", ".join(
            f"{r['target']} {'ok' if r['ok'] else 'FAILED'}" for r in results)
    if not built and not card_archs:
        check.problem(WARNING, "no compiler here can build the kernels for Volta (compute_70)", KERNELS_FIX)
    return check


def _test_build(check: Check, chains: list[tuple[Toolchain, Nvrtc]], probe: Path, arch: int, ptx: bool
                ) -> dict[str, Any]:
    target = f"compute_{arch}" if ptx else f"sm_{arch}"
    prebuilt = _prebuilt_modules(arch)
    total = len(kernel_sources())
    check.details.append(f"prebuilt kernels with sm_{arch} SASS: {prebuilt} of {total} modules "
                         f"(searched {', '.join(str(d) for d in kernel_search_dirs())})")
    usable = [(c, n) for c, n in chains if n.supports(arch)]
    if not usable:
        result = {"target": target, "ok": False, "nvrtc": None, "seconds": None, "prebuilt": prebuilt}
        if not ptx and prebuilt < total:
            check.problem(ERROR, f"no NVRTC here targets {target} and {total - prebuilt} kernel module(s) have no "
                          f"prebuilt sm_{arch} image",
                          f"{KERNELS_FIX}, or run `rigllm build-kernels --out DIR` elsewhere and set RIGLLM_KERNEL_DIR=DIR")
        return result
    chain, nvrtc = usable[0]
    start = time.perf_counter()
    try:
        compiled = nvrtc.compile(probe.read_text(), probe.name, target, (probe.parent, *chain.include_dirs), NVRTC_OPTIONS)
    except RigllmError as err:
        first = str(err).splitlines()[0]
        check.problem(ERROR, f"NVRTC {nvrtc.version_text} cannot build {probe.name} for {target}: {first}",
                      f"{KERNELS_FIX}; the headers it needs come from nvidia-cuda-runtime-cu12 and nvidia-cuda-cccl-cu12")
        return {"target": target, "ok": False, "nvrtc": nvrtc.version_text, "seconds": None, "prebuilt": prebuilt}
    seconds = time.perf_counter() - start
    check.details.append(f"built {probe.name} for {target} with NVRTC {nvrtc.version_text}: "
                         f"{len(compiled.image)} bytes of {compiled.kind} in {seconds:.2f} s")
    return {"target": target, "ok": True, "nvrtc": nvrtc.version_text, "seconds": round(seconds, 3), "prebuilt": prebuilt}
