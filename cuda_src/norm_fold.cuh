// RMSNorm folded into the GEMV that reads it (issue 30): a decode step's norm launch and its launch boundary go, and
// the GEMV's weight loads start while its first blocks normalise.
//
// The GEMV's blocks take tickets in the order they start. The first T * S tickets (T rows, S slices a row: a warp per
// 32-value block) each normalise one slice of one row, as rmsnorm_q8_1 does (norm_rope.cu), and count it done; every
// block waits for the count before it reads the activations. A ticket is taken by a block that is running, so the
// slices' blocks always run: the wait cannot deadlock whatever order the hardware starts blocks in. Meanwhile every
// warp has asked L2 for the head of its first rows (prefetch_row_heads), so the wait overlaps the weight reads.
//
// Same bits as rmsnorm_q8_1 at the decode shape (engine/cuda/norm.py NORM_THREADS_DECODE = 1024 threads a row): the
// sum of squares emulates its 1,024 threads (each a strided partial over the row, then its block_sum: warp sums in
// warp order, then one warp over the 32 warp sums), the scale and the quantisation are the same expressions. So a
// row normalised here equals one normalised by the norm kernel, and the GEMV's sums are unchanged bit for bit.
//
// Counters: 3 uint32 [tickets, slices done, blocks past the wait], zeroed when allocated; the last block past the wait
// zeroes them again for the next launch (every block has then taken its ticket and seen the slices done). Launches
// sharing them must not run concurrently.
//
// Registers: the GEMVs sit at their register caps (__launch_bounds__), so nothing of the fold stays live into the
// GEMV's loop (the reset is done here, its atomic waited for by one thread), and the sum keeps one stride of loads in
// flight per virtual thread: four strides at once, or the reset left for the block's end, made ptxas spill in up to
// 18 of the 48 Q8_0 variants on sm_70.
#pragma once

#include "common.cuh"
#include "q8_1_warp.cuh"

#define RIGLLM_NORM_DECODE_THREADS 1024  // engine/cuda/norm.py NORM_THREADS_DECODE (a unit test checks both agree)

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
    constexpr int J = 1;  // strides loaded at once (see the register note above)
    float s[K];
#pragma unroll
    for (int k = 0; k < K; ++k) s[k] = 0.f;
    for (int base = 0; base < n; base += J * V) {
        float v[J][K];
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int k = 0; k < K; ++k) {
                const int i = base + j * V + (int)threadIdx.x + BLOCK * k;
                v[j][k] = i < n ? __ldcg(xr + i) : 0.f;
            }
#pragma unroll
        for (int j = 0; j < J; ++j)
#pragma unroll
            for (int k = 0; k < K; ++k)
                if (base + j * V + (int)threadIdx.x + BLOCK * k < n) s[k] += v[j][k] * v[j][k];
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
// n), norm weight w, written as Q8_1 to xq [T][n] / xd [T][n / 32].
template <int T, int BLOCK>
__device__ __forceinline__ void folded_norm(const float* x, const float* __restrict__ w, float eps,
                                                          unsigned int* counters, int n, signed char* xq, float* xd) {
    __shared__ float scratch[32];
    __shared__ unsigned int ticket;
    constexpr int WARPS = BLOCK / 32;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int n_blocks = n >> 5;
    const int slices = (n_blocks + WARPS - 1) / WARPS;
    const unsigned int tasks = (unsigned int)(T * slices);
    if (threadIdx.x == 0) ticket = atomicAdd(counters, 1u);
    __syncthreads();
    for (unsigned int task = ticket; task < tasks; task += gridDim.x) {
        const int row = (int)(task / slices);
        const int b = (int)(task % slices) * WARPS + warp;
        const float* xr = x + (size_t)row * n;
        const int i = b * 32 + lane;
        // this warp's x and w before the sum, so their latency overlaps it (as in rmsnorm_q8_1)
        const float x0 = b < n_blocks ? __ldcg(xr + i) : 0.f;
        const float w0 = b < n_blocks ? w[i] : 0.f;
        const float inv = rms_inverse(decode_sum_sq<BLOCK>(xr, n, scratch), n, eps);
        if (b < n_blocks) q8_1_quantize_warp((x0 * inv) * w0, xq + (size_t)row * n + i, xd + (size_t)row * n_blocks + b);
        __threadfence();  // this slice's stores before it is counted
        __syncthreads();
        if (threadIdx.x == 0) atomicAdd(counters + 1, 1u);
    }
    if (threadIdx.x == 0) {
        while (load_acquire(counters + 1) < tasks) __nanosleep(64);
        if (atomicAdd(counters + 2, 1u) == gridDim.x - 1) {  // the last block past the wait
            counters[0] = 0u;
            counters[1] = 0u;
            counters[2] = 0u;
        }
    }
    __syncthreads();
}

}  // namespace rigllm
