"""Every cuda_src kernel builds for Volta under the house rules, and built images are cached and found.

The compile checks need the `kernels` extra (pip NVRTC/ptxas/nvFatbin 12.9) and skip without it; the
parser and rule checks below them run everywhere. No GPU is needed: nothing here launches a kernel.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import struct
from pathlib import Path

import pytest

from engine.errors import RigllmError
from engine.cuda import kernel_build
from engine.cuda.gemv import GEMV_ROWS_PER_WARP
from engine.cuda.kernel_build import (
    CUDA_SRC_DIR,
    KERNEL_DIR_ENV,
    PTX_ARCH,
    SASS_ARCHS,
    build_fatbins,
    build_toolchain,
    compile_module,
    kernel_sources,
    module_images,
    source_hash,
)
from engine.cuda.kernel_limits import HOT_KERNELS, MAX_SHARED_BYTES, resource_violations, tensor_core_instructions
from engine.cuda.nvrtc import significant_warnings
from engine.cuda.ptxas import KernelResources, parse_verbose

KERNELS_EXTRA = ("nvidia.cuda_nvrtc", "nvidia.cuda_runtime", "nvidia.cuda_cccl", "nvidia.cuda_nvcc", "nvidia.nvfatbin")


def _missing_extra() -> list[str]:
    missing = []
    for name in KERNELS_EXTRA:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:
            found = False
        if not found:
            missing.append(name)
    return missing


needs_kernels_extra = pytest.mark.skipif(
    bool(_missing_extra()),
    reason=f"the `kernels` extra is not installed (missing {', '.join(_missing_extra())}): "
    "pip install 'rigllm[kernels]'",
)


@pytest.fixture(scope="module")
def toolchain():
    return build_toolchain()


@pytest.fixture(scope="module")
def builds(toolchain):
    """Every module compiled to compute_70 PTX and sm_70 SASS (with the ptxas -v report)."""
    chain, nvrtc = toolchain
    return {path.name: compile_module(path, chain, nvrtc, sass_archs=(70,)) for path in kernel_sources()}


def parse_fatbin(data: bytes) -> list[tuple[str, int]]:
    """(kind, arch) of each entry of a fatbin: kind 'elf' (SASS) or 'ptx'."""
    magic, _, header, size = struct.unpack_from("<IHHQ", data, 0)
    assert magic == 0xBA55ED50, f"not a fatbin (magic {magic:#x})"
    entries, offset = [], header
    while offset < header + size:
        kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, offset)
        arch = struct.unpack_from("<I", data, offset + 28)[0]
        entries.append(({1: "ptx", 2: "elf"}[kind], arch))
        offset += entry_header + payload
    return entries


# ---- the Volta build rules, on the real sources ------------------------------------------------


@needs_kernels_extra
def test_every_kernel_compiles_for_compute70_and_sm70_without_warnings(builds):
    assert builds, "no kernel sources found"
    noisy = {name: b.warnings for name, b in builds.items() if b.warnings}
    assert not noisy, f"compiler warnings (other than the Volta deprecation notice): {noisy}"


@needs_kernels_extra
def test_no_tensor_core_instruction_in_any_ptx(builds):
    hits = {name: tensor_core_instructions(b.ptx.decode()) for name, b in builds.items()}
    hits = {name: lines[:3] for name, lines in hits.items() if lines}
    assert not hits, f"tensor-core instructions in PTX: {hits}"


@needs_kernels_extra
def test_shared_memory_and_hot_kernel_spills_within_volta_limits(builds):
    resources = {k: r for b in builds.values() for k, r in b.resources.items()}
    assert resources, "ptxas reported no kernels"
    assert resource_violations(resources) == []


@needs_kernels_extra
def test_hot_kernel_list_names_existing_kernels_and_names_are_unique(builds):
    owners: dict[str, list[str]] = {}
    for module, build in builds.items():
        for kernel in build.resources:
            owners.setdefault(kernel, []).append(module)
    duplicated = {k: m for k, m in owners.items() if len(m) > 1}
    assert not duplicated, f"kernel names must be unique across modules (extern \"C\"): {duplicated}"
    assert HOT_KERNELS <= owners.keys(), f"HOT_KERNELS lists kernels that do not exist: {sorted(HOT_KERNELS - owners.keys())}"


def test_gemv_launcher_rows_per_warp_match_the_kernel_source():
    source = (CUDA_SRC_DIR / "gemv_q8.cu").read_text()
    declared = {int(t): int(r) for t, r in re.findall(r"^RIGLLM_GEMV_Q8\((\d+), (\d+), \d+, \d+\)", source, re.M)}
    assert declared == GEMV_ROWS_PER_WARP
    assert all(r * t <= 32 for t, r in declared.items()), "lane r*T+t stores output (row r, token t)"


# ---- fatbins, cache and run-time lookup, on a tiny copy of the sources -------------------------


@pytest.fixture
def tiny_src(tmp_path, monkeypatch) -> Path:
    """quantize.cu and its header in a folder of their own, with a user cache of this test's own."""
    monkeypatch.setenv("RIGLLM_DATA_DIR", str(tmp_path / "data"))
    src = tmp_path / "src"
    src.mkdir()
    for name in ("quantize.cu", "common.cuh"):
        shutil.copy(CUDA_SRC_DIR / name, src / name)
    return src


@needs_kernels_extra
def test_fatbin_holds_sass_for_every_target_plus_compute70_ptx_and_is_reused(tiny_src, tmp_path):
    out = tmp_path / "out"
    [first] = build_fatbins(out, tiny_src)
    assert not first.reused
    assert sorted(parse_fatbin(first.path.read_bytes())) == sorted(
        [("elf", a) for a in SASS_ARCHS] + [("ptx", PTX_ARCH)]
    )
    assert "quantize_q8_1" in first.entry.resources
    assert (out / kernel_build.REPORT_NAME).is_file()
    [again] = build_fatbins(out, tiny_src)
    assert again.reused and again.path == first.path


@needs_kernels_extra
def test_header_change_rebuilds_and_prunes_the_stale_fatbin(tiny_src, tmp_path):
    out = tmp_path / "out"
    [first] = build_fatbins(out, tiny_src)
    with open(tiny_src / "common.cuh", "a") as f:
        f.write("\n// touched\n")
    [second] = build_fatbins(out, tiny_src)
    assert not second.reused and second.path != first.path
    assert sorted(p.name for p in out.glob("quantize-*")) == sorted(
        [second.path.name, second.path.with_suffix(".json").name]
    )


def test_source_hash_follows_local_includes(tiny_src):
    before = source_hash(tiny_src / "quantize.cu")
    with open(tiny_src / "common.cuh", "a") as f:
        f.write("\n")
    assert source_hash(tiny_src / "quantize.cu") != before
    (tiny_src / "common.cuh").unlink()
    with pytest.raises(RigllmError, match="common.cuh"):
        source_hash(tiny_src / "quantize.cu")


@needs_kernels_extra
def test_runtime_lookup_prefers_the_kernel_dir_then_compiles_then_falls_back_to_ptx(tiny_src, tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    build_fatbins(prebuilt, tiny_src)
    monkeypatch.setenv(KERNEL_DIR_ENV, str(prebuilt))

    [sm90] = module_images(90, tiny_src)
    assert str(prebuilt) in sm90.origin and "sm_90 SASS" in sm90.origin
    assert sm90.image == next(prebuilt.glob("quantize-*.fatbin")).read_bytes()

    [sm100] = module_images(100, tiny_src)  # not in the fatbin: NVRTC 12.9 compiles it
    assert sm100.origin.startswith("NVRTC") and sm100.image[:4] == b"\x7fELF"
    [cached] = module_images(100, tiny_src)  # now found in the user cache
    assert "sm_100 SASS" in cached.origin and cached.image == sm100.image

    monkeypatch.setattr(kernel_build, "_runtime_compiler", lambda arch: None)
    [jit] = module_images(120, tiny_src)
    assert "PTX (driver JIT)" in jit.origin
    with pytest.raises(RigllmError, match="no kernels for sm_60"):
        module_images(60, tiny_src)


@needs_kernels_extra
def test_changed_source_ignores_the_stale_prebuilt_image(tiny_src, tmp_path, monkeypatch):
    prebuilt = tmp_path / "prebuilt"
    build_fatbins(prebuilt, tiny_src)
    monkeypatch.setenv(KERNEL_DIR_ENV, str(prebuilt))
    with open(tiny_src / "quantize.cu", "a") as f:
        f.write("\n// edited after the build\n")
    [image] = module_images(90, tiny_src)
    assert image.origin.startswith("NVRTC")


# ---- parsers and rule checks (no toolchain needed) ---------------------------------------------

PTXAS_V = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'spilly' for 'sm_70'
ptxas info    : Function properties for spilly
    24 bytes stack frame, 8 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 64 registers, used 1 barriers, 2048 bytes smem, 380 bytes cmem[0]
ptxas info    : Compiling entry function 'big_smem' for 'sm_70'
ptxas info    : Function properties for big_smem
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 12 registers, 99000 bytes smem, 368 bytes cmem[0]
"""


def test_ptxas_verbose_report_is_parsed_per_kernel():
    report = parse_verbose(PTXAS_V)
    assert report["spilly"] == KernelResources(64, 2048, 24, 8, 12, 380)
    assert report["big_smem"] == KernelResources(12, 99000, 0, 0, 0, 368)


def test_rule_check_flags_big_shared_memory_and_hot_spills_only():
    report = parse_verbose(PTXAS_V)
    problems = resource_violations({"gemv_q8_t1": report["spilly"], "cold": report["spilly"], "big": report["big_smem"]})
    assert len(problems) == 2
    assert any(p.startswith("big:") and str(MAX_SHARED_BYTES) in p for p in problems)
    assert any(p.startswith("gemv_q8_t1:") and "spills" in p for p in problems)


def test_tensor_core_scan_finds_opcodes_not_names_or_comments():
    ptx = """
    .visible .entry summary_mma_count(
    // a comment about mma.sync
    mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%f1}, {%r1}, {%r2}, {%f2};
    @%p1 wmma.load.a.sync.aligned.row.m16n16k16.f16 {%r3}, [%rd1];
    ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%r4}, [%r5];
    dp4a.s32.s32 %r6, %r7, %r8, %r9;
    """
    hits = tensor_core_instructions(ptx)
    assert len(hits) == 3 and all(("mma" in h or "ldmatrix" in h) for h in hits)


def test_only_the_volta_deprecation_notice_is_tolerated():
    log = (
        "nvrtc: warning: Architectures prior to '<compute/sm>_75' are deprecated and may be removed\n"
        'k.cu(3): warning #177-D: variable "x" was declared but never referenced\n'
    )
    assert significant_warnings(log) == ('k.cu(3): warning #177-D: variable "x" was declared but never referenced',)
