// The DP4A prefill GEMM tile that gemm_q8.cu (Q8_0 weights) and gemm_kq.cu (K-quant weights, decoded into the
// same int8 tile when staged) share: one CTA of GEMM_THREADS threads computes GEMM_BR weight rows x GEMM_BT tokens,
// thread (tr, tt) = (tid % 16, tid / 16) owning rows tr + 16 i and tokens tt + 16 j (i, j < 4); K is staged
// GEMM_BK values at a time into int8 tiles of GEMM_PITCH bytes a row (see gemm_q8.cu for why these numbers).
#pragma once
#include "common.cuh"

#define GEMM_BR 64       // weight rows per CTA
#define GEMM_BT 64       // tokens per CTA
#define GEMM_BK 128      // K values per shared-memory stage (4 blocks of 32)
#define GEMM_LANES 16    // row lanes = token lanes
#define GEMM_PITCH 144   // bytes per staged row: 128 + 16 so 16-byte reads of 8 lanes hit distinct banks
#define GEMM_THREADS 256

namespace rigllm {

// The 4 x 4 integer dot products of 16 staged values (columns col .. col + 15 of the weight tile `wq` and the
// activation tile `xq`) added into the thread's running sums: 4 + 4 16-byte shared loads feed 64 DP4As.
__device__ __forceinline__ void gemm_half_products(const signed char* wq, const signed char* xq, int tr, int tt,
                                                   int col, int (&isum)[4][4]) {
    int4 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const int4*>(wq + (tr + GEMM_LANES * i) * GEMM_PITCH + col);
#pragma unroll
    for (int j = 0; j < 4; ++j) {
        const int4 x = *reinterpret_cast<const int4*>(xq + (tt + GEMM_LANES * j) * GEMM_PITCH + col);
#pragma unroll
        for (int i = 0; i < 4; ++i) isum[i][j] = dot_int8x16(w[i], x, isum[i][j]);
    }
}

}  // namespace rigllm
