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

// A GEMV warp's R rows x T tokens: sum each accumulator over the warp, then lane r * T + t stores
// (row0 + r, token t), so R * T <= 32 outputs leave the warp in one instruction. All 32 lanes must call it.
template <int R, int T>
__device__ __forceinline__ void gemv_warp_store(float (&acc)[R][T], int row0, int rows, int end0, int end1, int end2,
                                                float* y, const float* residual) {
    static_assert(R * T <= 32, "one output per lane");
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < T; ++t) acc[r][t] = warp_sum(acc[r][t]);
#pragma unroll
    for (int r = 0; r < R; ++r) {
        const int row = row0 + r;
#pragma unroll
        for (int t = 0; t < T; ++t)
            if (lane == r * T + t && row < rows)
                store_output(y, residual, segment_offset(row, t, T, rows, end0, end1, end2), acc[r][t]);
    }
}

// A GEMM thread's 4 x 4 outputs: rows r0 + tr + 16 i, tokens t0 + tt + 16 j (gemm_q8.cu's tile).
__device__ __forceinline__ void gemm_tile_store(const float (&acc)[4][4], int r0, int tr, int t0, int tt, int rows,
                                                int T, int end0, int end1, int end2, float* y, const float* residual) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + tr + 16 * i;
        if (r >= rows) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int t = t0 + tt + 16 * j;
            if (t < T) store_output(y, residual, segment_offset(r, t, T, rows, end0, end1, end2), acc[i][j]);
        }
    }
}

}  // namespace rigllm
