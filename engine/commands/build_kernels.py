"""`rigllm build-kernels [--out DIR]`: compile every cuda_src/*.cu into fatbins (sm_70..sm_90 SASS + compute_70 PTX).

The output folder is what packaging ships and what is carried to a GPU machine whose own NVRTC cannot
target Volta (set `RIGLLM_KERNEL_DIR` to it there). Also writes the sm_70 `ptxas -v` report as JSON and
prints it, flagging kernels that break the Volta rules in `engine.cuda.kernel_limits`.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "build-kernels",
        help="compile the CUDA kernels into fatbins (needs `pip install 'rigllm[kernels]'`, no GPU)",
        description="Compile every cuda_src/*.cu with NVRTC 12.x to compute_70 PTX, lower it with ptxas to SASS "
        "for sm_70/75/80/86/89/90, pack each into a fatbin and write them with their metadata and the sm_70 "
        "resource report. Up-to-date fatbins are reused.",
    )
    parser.add_argument("--out", type=Path, default=None, help="output folder (default: the user kernel cache)")
    parser.add_argument("--arch", type=int, action="append", metavar="SM",
                        help="SASS only for these architectures (repeatable, e.g. --arch 90; sm_70 is always "
                             "included); default: 70, 75, 80, 86, 89 and 90")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engine.cuda.kernel_build import REPORT_NAME, SASS_ARCHS, build_fatbins, kernel_cache_dir
    from engine.cuda.kernel_limits import resource_violations
    from engine.cuda.ptxas import KernelResources

    out = args.out or kernel_cache_dir()
    built = build_fatbins(out, sass_archs=args.arch or SASS_ARCHS)
    problems: list[str] = []
    print(f"{'kernel':<28} {'module':<14} {'regs':>5} {'smem':>7} {'spill':>6}")
    for module in built:
        resources = {name: KernelResources(**r) for name, r in module.entry.resources.items()}
        problems += resource_violations(resources)
        problems += [f"{module.entry.module}: {w}" for w in module.entry.warnings]
        for name, res in sorted(resources.items()):
            spill = res.spill_store_bytes + res.spill_load_bytes
            print(f"{name:<28} {module.entry.module:<14} {res.registers:>5} {res.shared_bytes:>7} {spill:>6}")
    fresh = sum(not m.reused for m in built)
    print(f"\n{len(built)} modules in {out} ({fresh} built, {len(built) - fresh} up to date); report: {out / REPORT_NAME}")
    for problem in problems:
        print(f"warning: {problem}")
    return 0
