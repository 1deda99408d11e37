// RMSNorm folded into the GEMV that reads it (issue 30): a decode step's norm launch and its launch boundary go, and
// the GEMV's weight loads start while its first blocks normalise.
//
// Blocks [0, T * S) of the GEMV (T rows, S = min(32, 64 / T) slices a row: at one row a warp per 32-value block of a
// 4096-wide row) each normalise one slice of one row, as rmsnorm_q8_1 does (norm_rope.cu), and count it done in the
// launch's counter; every block waits for the count before it reads the activations, having first asked L2 for the
// head of its rows (prefetch_row_heads), so the wait overlaps the weight reads. A grid smaller than T * S takes the
// slices in turn. The wait relies on blocks starting in index order, as CUTLASS's serial split-K does: a block waits
// only for the T * S <= RIGLLM_NORM_FOLD_BLOCKS = 64 slice blocks, which start before every other block and, 64 blocks
// fitting at once on any card of 64 SMs or more, all run before any of them waits.
//
// Same bits as rmsnorm_q8_1 at the decode shape (engine/cuda/norm.py NORM_THREADS_DECODE = 1024 threads a row): the
// sum of squares emulates its 1,024 threads (each a strided partial over the row, then its block_sum: warp sums in
// warp order, then one warp over the 32 warp sums), the scale and the quantisation are the same expressions. So a
// row normalised here equals one normalised by the norm kernel, and the GEMV's sums are unchanged bit for bit.
//
// Counter: one uint32 a launch, zero when it starts (engine/cuda/norm_fold.py zeroes a pass's counters with one memset
// before the pass). A first form counted every block in and out of the wait to reset its counters itself: two atomics
// a block on one address, 360,000 a 9B step, made the step 22% slower (H200, s20a).
//
// Registers: the GEMVs sit at their register caps (__launch_bounds__), so nothing of the fold stays live into the
// GEMV's loop, the sum keeps one stride of loads in flight per virtual thread (one load per virtual thread, 8 a thread)
// and a slice's own x and w are loaded after it: four strides at once made ptxas spill in up to 18 of the 48 Q8_0 variants on sm_70, two in 16, loading
// the first 32-block's x and w before the sum (as rmsnorm_q8_1 does) in 7 of the 93 Q8_0 and K-quant ones.
#pragma once

#include "common.cuh"
#include "q8_1_warp.cuh"

#define RIGLLM_NORM_DECODE_THREADS 1024  // engine/cuda/norm.py NORM_THREADS_DECODE (a unit test checks both agree)
#define RIGLLM_NORM_FOLD_BLOCKS 64        // at most this many slice blocks (see the wait above)

// 1/sqrt(mean + eps) exactly as the reference: fp32 mean, fp32 sqrt, fp32 division (NVRTC's default
// -prec-sqrt/-prec-div give the correctly rounded results numpy gives).
__device__ __forceinline__ float rms_inverse(float sum_sq, int n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

namespace rigllm {

__device__ __forceinline__ unsigned int load_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

// Asks L2 for the first 4 KB of each of a warp's `count` rows from row0 (a line a lane; rows past `rows` skipped).
__device__ __forceinline__ void prefetch_row_heads(const void* base, size_t row_bytes, int row0, int count, int rows) {
    const size_t off = (size_t)(threadIdx.x & 31) * 128;
    if (off >= row_bytes) return;
    for (int r = row0; r < row0 + count && r < rows; ++r)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(static_cast<const char*>(base) + (size_t)r * row_bytes + off));
}

// The sum of squares of xr[0, n) in rmsnorm_q8_1's order at RIGLLM_NORM_DECODE_THREADS threads, by a block of BLOCK
// threads: thread j plays virtual threads j + BLOCK * k, whose warps are this warp's + (BLOCK / 32) * k. Every
// thread gets the total. A stride's loads (one per virtual thread) are issued before any is summed.
template <int BLOCK>
__device__ __forceinline__ float decode_sum_sq(const float* xr, int n, float* scratch) {
    constexpr int V = RIGLLM_NORM_DECODE_THREADS;
    constexpr int K = V / BLOCK;
    static_assert(V % BLOCK == 0 && BLOCK % 32 == 0, "a whole number of virtual warps per warp");
    float s[K];
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = 0.f;
    for (int base = (int)threadIdx.x; base < n; base += V) {
        float v[K];
#pragma unroll
        for (int k = 0; k < K; ++k) v[k] = base + BLOCK * k < n ? __ldcg(xr + base + BLOCK * k) : 0.f;
#pragma unroll
        for (int k = 0; k < K; ++k)
            if (base + BLOCK * k < n) s[k] += v[k] * v[k];
    }
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    __syncthreads();  // a previous call's readers are done with scratch
#pragma unroll
    for (int k = 0; k < K; ++k) {
        const float w = warp_sum(s[k]);
        if (lane == 0) scratch[warp + (BLOCK / 32) * k] = w;
    }
    __syncthreads();
    return warp_sum(scratch[lane]);  // V / 32 = 32 virtual warps: every lane holds one
}

// The fold, called by every thread of every block before the GEMV reads xq / xd: T rows of width n at x (row stride
// n), norm weight w, written as Q8_1 to xq [T][n] / xd [T][n / 32]; `done` is the launch's counter.
template <int T, int BLOCK>
__device__ __forceinline__ void folded_norm(const float* x, const float* __restrict__ w, float eps, unsigned int* done,
                                            int n, signed char* xq, float* xd) {
    __shared__ float scratch[32];
    constexpr int WARPS = BLOCK / 32;
    constexpr int SLICES = RIGLLM_NORM_FOLD_BLOCKS / T < 32 ? RIGLLM_NORM_FOLD_BLOCKS / T : 32;
    constexpr unsigned int TASKS = T * SLICES;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_blocks = n >> 5;
    for (unsigned int task = blockIdx.x; task < TASKS; task += gridDim.x) {
        const int row = (int)(task / SLICES);
        const int first = (int)(task % SLICES) * WARPS + warp;  // this warp's first 32-block
        const float* xr = x + (size_t)row * n;
        const float inv = rms_inverse(decode_sum_sq<BLOCK>(xr, n, scratch), n, eps);
        for (int b = first; b < n_blocks; b += WARPS * SLICES) {
            const int i = b * 32 + lane;
            const float v = (__ldcg(xr + i) * inv) * w[i];
            q8_1_quantize_warp(v, xq + (size_t)row * n + i, xd + (size_t)row * n_blocks + b);
        }
        __threadfence();  // this slice's stores before it is counted
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(done, 1u);
    }
    if (threadIdx.x == 0)
        while (load_acquire(done) < TASKS) __nanosleep(100);
    __syncthreads();
}

}  // namespace rigllm
