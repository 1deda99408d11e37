"""Session 23's flash-decode split sizes (for …-s23l-decode-splits-probe.py): cuda_src/attention.cu (at 64feb47) with
attn_decode cutting the context into splits aligned to ALIGN keys instead of FLASH_SPLIT_ALIGN (64), so that a short
context spreads over more blocks, each walking fewer keys; the merge is unchanged (it takes any split layout). Built
into OUT/aALIGN as sm_90 fatbins. Not in the tree. Needs the kernels extra (NVRTC).
usage: python3 THIS OUT ALIGN [ALIGN ...]
"""
import shutil
import sys
from pathlib import Path

from engine.cuda.kernel_build import CUDA_SRC_DIR, build_fatbins

CALL = "    flash::split_range(blk.kv_len, n_splits, blk.split, &start, &end);\n"


def source(align: int) -> str:
    text = (CUDA_SRC_DIR / "attention.cu").read_text()
    assert text.count(CALL) == 1
    return text.replace(CALL, f"""    {{  // s23 probe: splits aligned to {align} keys
        int chunk = (blk.kv_len + n_splits - 1) / n_splits;
        chunk = (chunk + {align} - 1) / {align} * {align};
        start = blk.split * chunk;
        end = min(start + chunk, blk.kv_len);
    }}
""")


if __name__ == "__main__":
    out = Path(sys.argv[1])
    for align in map(int, sys.argv[2:]):
        src = out / "src" / f"a{align}"
        shutil.rmtree(src, ignore_errors=True)
        src.mkdir(parents=True)
        for header in CUDA_SRC_DIR.glob("*.cuh"):
            shutil.copy(header, src)
        (src / "attention.cu").write_text(source(align))
        build_fatbins(out / f"a{align}", src, sass_archs=(90,))
        print(align, flush=True)
