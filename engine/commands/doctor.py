"""`rigllm doctor [--model FILE] [--json]`: check the rig's setup and print each problem with its fix.

Exit status 1 when an error-level problem was found (the GPU path or the named file cannot work),
so scripts and the systemd unit's ExecStartPre can gate on it; warnings keep status 0.
"""

from __future__ import annotations

import argparse


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "doctor", help="check driver, cards, PCIe links, NVRTC, pycuda, RAM and disk speed; print fixes",
        description="Diagnose the setup: NVIDIA driver and CUDA level, each card (PCI bus id, compute capability, "
        "memory, PCIe link), the NVRTC found and a kernel test build, pycuda, host RAM and the locked-memory "
        "limit, and (with --model) the model file's read speed.")
    p.add_argument("--model", help="a model file whose disk read speed to measure")
    p.add_argument("--read-mib", type=int, default=1024, help="MiB of the model to read for the speed test (default 1024)")
    p.add_argument("--json", action="store_true", help="print machine-readable JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from engine.diagnostics import render_text, run_doctor, to_json
    from engine.errors import RigllmError

    if args.read_mib < 1:
        raise RigllmError("--read-mib must be at least 1")
    checks = run_doctor(Path(args.model) if args.model else None, args.read_mib << 20)
    report = to_json(checks)
    print(json.dumps(report, indent=2) if args.json else render_text(checks))
    return 0 if report["ok"] else 1
