"""Kernels for the H200 check call: `.whl-gpu/kbuild.tar.xz` where it was carried, else the bundle's own.

Usage: python3 tests/gpu/unpack_check_kernels.py WHEEL_DIR DEST. The bundle's kernels are sm_70 SASS with
compute_70 PTX, which the driver JIT-compiles on newer cards: the same images a user's double-click app loads.
"""

from __future__ import annotations

import sys
import tarfile
from pathlib import Path

BUNDLE_KERNELS = "rigllm/_internal/resources/kernels/"


def unpack(wheels: Path, dest: Path) -> str:
    """Fill `dest` with kernel images and say where they came from."""
    dest.mkdir(parents=True, exist_ok=True)
    packed = wheels / "kbuild.tar.xz"
    if packed.exists():
        with tarfile.open(packed) as tar:
            for member in tar:
                if member.isfile():
                    (dest / Path(member.name).name).write_bytes(tar.extractfile(member).read())
        return str(packed)
    with tarfile.open(wheels / "bundle.tar.xz") as tar:
        for member in tar:
            if member.isfile() and member.name.startswith(BUNDLE_KERNELS):
                (dest / member.name[len(BUNDLE_KERNELS):]).write_bytes(tar.extractfile(member).read())
    return f"{wheels / 'bundle.tar.xz'} ({BUNDLE_KERNELS})"


if __name__ == "__main__":
    source = unpack(Path(sys.argv[1]), Path(sys.argv[2]))
    print(f"kernels in {sys.argv[2]} from {source}: {len(list(Path(sys.argv[2]).glob('*.fatbin')))} fatbins")
