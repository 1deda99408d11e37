"""Session 23's SwiGLU fold for the s23c/s23d probe (…-s23c-swiglu-fold-probe.py): cuda_src/gemv_q8.cu (at 64feb47)
with SiLU(gate) * up and its Q8_1 quantize done in the gate+up GEMV's epilogue, as two extra kernels,
gemv_q8_t1_swiglu and gemv_q8_t8_r4_u1_m3_swiglu (the gate+up GEMV's kernels at 1 and 8 rows), built into OUT/FORM as
an sm_90 fatbin. Forms: "warp" (s23c), a ticket per warp; "block" (s23d), a ticket per block of threads. Not in the
tree: both made the step slower. Needs the kernels extra (NVRTC).
usage: python3 THIS OUT warp|block
"""
import shutil
import sys
from pathlib import Path

from engine.cuda.kernel_build import CUDA_SRC_DIR, build_fatbins

STORE = "        rigllm::gemv_warp_store<R, T>(acc, row0, rows, end0, end1, end2, y, residual);\n"
TICKETS = {
    "warp": """        if (counters != nullptr) {
            __threadfence();
            __syncwarp();
            const int blk = (row0 % d_ff) >> 5;
            unsigned int old = 0;
            if (lane == 0) old = atomicAdd(counters + blk, 1u);
            old = __shfl_sync(RIGLLM_FULL_MASK, old, 0);
            if (old == (unsigned)(64 / R) - 1) {
                if (lane == 0) counters[blk] = 0u;
                __threadfence();
#pragma unroll 1
                for (int t = 0; t < T; ++t) {
                    const int i = t * d_ff + blk * 32 + lane;
                    const float h = rigllm::silu(__ldcg(y + i)) * __ldcg(y + T * d_ff + i);
                    q8_1_quantize_warp(h, hq + i, hd + i / 32);
                }
            }
        }
""",
    "block": """        if (counters != nullptr) {  // a ticket per block of threads (the probe's second form)
            __shared__ unsigned int ticket;
            const int warps = blockDim.x >> 5;
            const int blk = ((int)((group - (threadIdx.x >> 5)) * R) % d_ff) >> 5;
            __threadfence();
            __syncthreads();
            if (threadIdx.x == 0) ticket = atomicAdd(counters + blk, 1u);
            __syncthreads();
            if (ticket == (unsigned)(64 / (R * warps)) - 1) {
                if (threadIdx.x == 0) counters[blk] = 0u;
                __threadfence();
#pragma unroll 1
                for (int t = threadIdx.x >> 5; t < T; t += warps) {
                    const int i = t * d_ff + blk * 32 + lane;
                    const float h = rigllm::silu(__ldcg(y + i)) * __ldcg(y + T * d_ff + i);
                    q8_1_quantize_warp(h, hq + i, hd + i / 32);
                }
            }
        }
""",
}
KERNELS = """
#define RIGLLM_GEMV_Q8_SWIGLU(NAME, T, R, U, THREADS, MIN_BLOCKS)                                                  \\
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                                       \\
        const signed char* __restrict__ wq, const __half* __restrict__ wd, const signed char* __restrict__ xq,    \\
        const float* __restrict__ xd, float* y, const float* residual, int rows, int K, int end0, int end1,        \\
        int end2, int d_ff, unsigned int* counters, signed char* hq, float* hd, const char* prefetch,             \\
        long long prefetch_bytes) {                                                                               \\
        if (rigllm::prefetch_part(prefetch, prefetch_bytes)) return;                                              \\
        gemv_q8_body<T, R, U, false>(wq, wd, xq, xd, y, residual, rows, K, end0, end1, end2, d_ff, counters, hq, hd); \\
    }
RIGLLM_GEMV_Q8_SWIGLU(gemv_q8_t1_swiglu, 1, 2, 1, 128, 8)
RIGLLM_GEMV_Q8_SWIGLU(gemv_q8_t8_r4_u1_m3_swiglu, 8, 4, 1, 128, 3)
"""


def rep(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def source(form: str) -> str:
    t = (CUDA_SRC_DIR / "gemv_q8.cu").read_text()
    t = rep(t, '#include "q8_blocked.cuh"\n', '#include "q8_blocked.cuh"\n#include "activations.cuh"\n#include "q8_1_warp.cuh"\n')
    t = rep(t, """                                             float* y, const float* residual, int rows, int K, int end0, int end1,
                                             int end2) {
    const int lane""", """                                             float* y, const float* residual, int rows, int K, int end0, int end1,
                                             int end2, int d_ff = 0, unsigned int* counters = nullptr,
                                             signed char* hq = nullptr, float* hd = nullptr) {
    const int lane""")
    return rep(t, STORE, STORE + TICKETS[form]) + KERNELS


if __name__ == "__main__":
    out, form = Path(sys.argv[1]), sys.argv[2]
    src = out / "src" / form
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for header in CUDA_SRC_DIR.glob("*.cuh"):
        shutil.copy(header, src)
    (src / "gemv_q8.cu").write_text(source(form))
    build_fatbins(out / form, src, sass_archs=(90,))
