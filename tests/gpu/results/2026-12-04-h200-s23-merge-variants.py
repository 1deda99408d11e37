"""Session 23's attention merge folded into the flash decode (for …-s23k-merge-fold-probe.py): cuda_src/attention.cu
(at 64feb47) plus one kernel, attn_decode_d256_g4_merged (the 9B's and 27B's fp16-cache decode shape): attn_decode as
committed, then every block fences its partials and counts itself into its (token, KV head) ticket; the block that
completes the n_splits splits merges its G query heads with attn_merge_gate's arithmetic (the largest split maximum,
then each output's sum over the splits in order, the sigmoid gate, Q8_1), two dims a thread. Built into OUT as an sm_90
fatbin. Not in the tree. Needs the kernels extra (NVRTC).
usage: python3 THIS OUT
"""
import shutil
import sys
from pathlib import Path

from engine.cuda.kernel_build import CUDA_SRC_DIR, build_fatbins

MERGED = """
// ---- s23 probe: the merge folded into the decode's last block of each (token, KV head) ----
template <int DH, int G>
__device__ __forceinline__ void attn_merge_last(const int* __restrict__ step, const int* __restrict__ row_slot,
                                                const float* part_m, const float* part_l, const float* part_o,
                                                int capacity, int n_splits, unsigned int* counters,
                                                const float* __restrict__ gate, int gate_row_stride,
                                                int gate_head_stride, int n_head, float* __restrict__ y,
                                                signed char* __restrict__ yq, float* __restrict__ yd) {
    constexpr int THREADS = 32 * DECODE_WARPS;
    constexpr int PER = DH / THREADS;
    __shared__ unsigned int ticket;
    __shared__ float block_max[DECODE_WARPS];
    __shared__ int block_last[DECODE_WARPS];
    const rigllm::DecodeBlock blk = rigllm::decode_block(step, n_splits, G, capacity, 1, row_slot);
    unsigned int* counter = counters + (size_t)blk.token * (gridDim.y / n_splits) + blk.kv_head;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) ticket = atomicAdd(counter, 1u);
    __syncthreads();
    if (ticket != (unsigned)n_splits - 1) return;
    if (threadIdx.x == 0) *counter = 0u;
    __threadfence();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    for (int g = 0; g < G; ++g) {
        const size_t row = blk.q_row + g;
        const int t = (int)(row / n_head);
        const int h = (int)(row - (size_t)t * n_head);
        const float* pm = part_m + row * n_splits;
        const float* pl = part_l + row * n_splits;
        float gate_x[PER];
#pragma unroll
        for (int i = 0; i < PER; ++i)
            gate_x[i] = gate[(size_t)t * gate_row_stride + (size_t)h * gate_head_stride + tid + i * THREADS];
        float m_max = ATTN_NEG_INF;
        int last = -1;
        for (int s = tid; s < n_splits; s += THREADS) {
            const float v = __ldcg(pm + s);
            m_max = fmaxf(m_max, v);
            if (v != ATTN_NEG_INF) last = s;
        }
        m_max = rigllm::warp_max(m_max);
#pragma unroll
        for (int offset = 16; offset > 0; offset >>= 1) last = max(last, __shfl_xor_sync(RIGLLM_FULL_MASK, last, offset));
        if (lane == 0) {
            block_max[warp] = m_max;
            block_last[warp] = last;
        }
        __syncthreads();
        for (int w = 0; w < DECODE_WARPS; ++w) {
            m_max = fmaxf(m_max, block_max[w]);
            last = max(last, block_last[w]);
        }
        __syncthreads();  // every thread has read them before the next head writes them
        float acc[PER], l_sum = 0.f;
#pragma unroll
        for (int i = 0; i < PER; ++i) acc[i] = 0.f;
        for (int s = 0; s <= last; ++s) {
            const float ms = __ldcg(pm + s);
            if (ms == ATTN_NEG_INF) continue;
            const float f = expf(ms - m_max);
            l_sum = fmaf(f, __ldcg(pl + s), l_sum);
#pragma unroll
            for (int i = 0; i < PER; ++i)
                acc[i] = fmaf(f, __ldcg(part_o + (row * n_splits + s) * DH + tid + i * THREADS), acc[i]);
        }
#pragma unroll
        for (int i = 0; i < PER; ++i) {
            const float o = l_sum > 0.f ? acc[i] / l_sum : 0.f;
            const float out = o * rigllm::sigmoid(gate_x[i]);
            const size_t idx = row * DH + tid + i * THREADS;
            if (y != nullptr) y[idx] = out;
            if (yq != nullptr) q8_1_quantize_warp(out, yq + idx, yd + idx / 32);
        }
    }
}

extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS, 2) attn_decode_d256_g4_merged(
    const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache,
    const int* __restrict__ step, const int* __restrict__ row_slot, const unsigned long long* __restrict__ slot_ptrs,
    float* __restrict__ part_m, float* __restrict__ part_l, float* __restrict__ part_o, int capacity, int n_splits,
    float scale, unsigned int* counters, const float* __restrict__ gate, int gate_row_stride, int gate_head_stride,
    int n_head, float* __restrict__ y, signed char* __restrict__ yq, float* __restrict__ yd) {
    attn_decode<256, 4>(q, k_cache, v_cache, step, row_slot, slot_ptrs, part_m, part_l, part_o, capacity, n_splits,
                        scale, 1);
    attn_merge_last<256, 4>(step, row_slot, part_m, part_l, part_o, capacity, n_splits, counters, gate,
                            gate_row_stride, gate_head_stride, n_head, y, yq, yd);
}
"""


def source() -> str:
    return (CUDA_SRC_DIR / "attention.cu").read_text() + MERGED


if __name__ == "__main__":
    out = Path(sys.argv[1])
    src = out / "src"
    shutil.rmtree(src, ignore_errors=True)
    src.mkdir(parents=True)
    for header in CUDA_SRC_DIR.glob("*.cuh"):
        shutil.copy(header, src)
    (src / "attention.cu").write_text(source())
    built = build_fatbins(out / "merged", src, sass_archs=(90,))
    print(built[0].entry.resources["attn_decode_d256_g4_merged"], built[0].entry.resources["attn_decode_d256_g4"])
