// The output epilogue every DP4A matmul shares (gemv_q8.cu, gemv_kq.cu, gemm_q8.cu, gemm_kq.cu).
//
// Matrices stacked row-wise on one input have row ranges [0, end0), [end0, end1), [end1, end2), [end2, rows);
// segment [start, end) is its own [T][end - start] fp32 matrix at y + T * start (a single matrix passes
// end0 = end1 = end2 = rows). residual (nullable) has the output's layout and may alias y: each element is
// read and then written by the same thread.
#pragma once

#include "common.cuh"

namespace rigllm {

__device__ __forceinline__ size_t segment_offset(int row, int t, int T, int rows, int end0, int end1, int end2) {
    const int seg = (row >= end0) + (row >= end1) + (row >= end2);
    const int start = seg == 0 ? 0 : seg == 1 ? end0 : seg == 2 ? end1 : end2;
    const int end = seg == 0 ? end0 : seg == 1 ? end1 : seg == 2 ? end2 : rows;
    return (size_t)start * T + (size_t)t * (end - start) + (row - start);
}

__device__ __forceinline__ void store_output(float* y, const float* residual, size_t o, float v) {
    y[o] = residual != nullptr ? residual[o] + v : v;
}

// upper_mask ? b : a (the mask all ones or all zeros), as one bitwise op on the values: written as plain selects of
// array elements, ptxas turned gemv_warp_store's selects into indexing and moved a 32-value array to the stack.
__device__ __forceinline__ float pick(unsigned upper_mask, float a, float b) {
    return __uint_as_float((__float_as_uint(b) & upper_mask) | (__float_as_uint(a) & ~upper_mask));
}

// A GEMV warp's R rows x T tokens: sum each of the N = R * T accumulators over the warp and store it. The sums
// are warp_sum's, bit for bit: the same xor tree (offsets 16, 8, .., 1; at each level both partners add the same
// two values, and fp32 addition is commutative), so every variant and every T still gives the same bits. But the
// tree runs as a reduce-scatter: at offset o a lane keeps half of its values (the upper half when its lane bit o is
// set) and sends the other half, so the levels cost N/2 + N/4 + .. shuffles instead of 5 per accumulator (31
// instead of 160 at R * T = 32, where 320 shuffles and adds were a sixth of an 8-token GEMV's instructions). N is
// padded with zeros to P, a power of two; after log2(P) halvings lane l holds value l >> (5 - log2 P), and the
// remaining levels are warp_sum's on that one value. All 32 lanes must call it.
template <int R, int T>
__device__ __forceinline__ void gemv_warp_store(float (&acc)[R][T], int row0, int rows, int end0, int end1, int end2,
                                                float* y, const float* residual) {
    constexpr int N = R * T;
    static_assert(N <= 32, "one output per lane");
    constexpr int LOG_P = N <= 1 ? 0 : N <= 2 ? 1 : N <= 4 ? 2 : N <= 8 ? 3 : N <= 16 ? 4 : 5;
    constexpr int P = 1 << LOG_P;
    const int lane = threadIdx.x & 31;
    // the first halving reads the accumulators themselves, so v holds only P/2 values
    float v[P > 1 ? P / 2 : 1];
    if (P == 1) v[0] = acc[0][0];
#pragma unroll
    for (int i = 0; i < P / 2; ++i) {
        const float lo = i < N ? acc[i / T][i % T] : 0.0f;
        const float hi = i + P / 2 < N ? acc[(i + P / 2) / T][(i + P / 2) % T] : 0.0f;
        const unsigned upper = (lane & 16) != 0 ? ~0u : 0u;
        v[i] = pick(upper, lo, hi) + __shfl_xor_sync(RIGLLM_FULL_MASK, pick(upper, hi, lo), 16);
    }
#pragma unroll
    for (int level = 1; level < LOG_P; ++level) {
        const int offset = 16 >> level;
        const int half = P >> (level + 1);
        const unsigned upper = (lane & offset) != 0 ? ~0u : 0u;
#pragma unroll
        for (int i = 0; i < half; ++i) {
            const float keep = pick(upper, v[i], v[i + half]);
            const float send = pick(upper, v[i + half], v[i]);
            v[i] = keep + __shfl_xor_sync(RIGLLM_FULL_MASK, send, offset);
        }
    }
#pragma unroll
    for (int offset = 16 >> LOG_P; offset > 0; offset >>= 1) v[0] += __shfl_xor_sync(RIGLLM_FULL_MASK, v[0], offset);
    const int index = lane >> (5 - LOG_P);
    const int row = row0 + index / T;
    if ((lane & ((32 >> LOG_P) - 1)) == 0 && index < N && row < rows)
        store_output(y, residual, segment_offset(row, index % T, T, rows, end0, end1, end2), v[0]);
}

// A GEMM thread's 4 x TJ outputs: rows r0 + tr + 16 i, tokens t0 + tt + 16 j (gemm_q8.cu's tile).
template <int TJ>
__device__ __forceinline__ void gemm_tile_store(const float (&acc)[4][TJ], int r0, int tr, int t0, int tt, int rows,
                                                int T, int end0, int end1, int end2, float* y, const float* residual) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + tr + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < TJ; ++j) {
            const int t = t0 + tt + 16 * j;
            if (t < T) store_output(y, residual, segment_offset(r, t, T, rows, end0, end1, end2), acc[i][j]);
        }
    }
}

}  // namespace rigllm
