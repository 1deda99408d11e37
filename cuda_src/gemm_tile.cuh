// The DP4A prefill GEMM tile that gemm_q8.cu (Q8_0 weights) and gemm_kq.cu (K-quant weights, decoded into the
// same int8 tile when staged) share: one CTA of GEMM_THREADS threads computes GEMM_BR weight rows x 16 TJ tokens
// (GEMM_BT = 64 at TJ = 4; both GEMMs also build TJ = 1 and 2 for short chunks), thread (tr, tt) = (tid % 16,
// tid / 16) owning rows tr + 16 i and tokens tt + 16 j (i < 4, j < TJ); K is staged GEMM_BK values at a time into
// int8 tiles of GEMM_PITCH bytes a row (see gemm_q8.cu for why these numbers).
#pragma once
#include "common.cuh"

#define GEMM_BR 64       // weight rows per CTA
#define GEMM_BT 64       // tokens per CTA (at TJ = 4, the 16 token lanes' 4 tokens each)
#define GEMM_BK 128      // K values per shared-memory stage (4 blocks of 32)
#define GEMM_LANES 16    // row lanes = token lanes
#define GEMM_PITCH 144   // bytes per staged row: 128 + 16 so 16-byte reads of 8 lanes hit distinct banks
#define GEMM_THREADS 256

namespace rigllm {

// The int8 activation tile's 16-byte chunks at TJ (8 a line), and how many each of the GEMM_THREADS moves a stage.
template <int TJ>
__host__ __device__ constexpr int gemm_x_chunks() { return GEMM_LANES * TJ * (GEMM_BK / 16); }
template <int TJ>
__host__ __device__ constexpr int gemm_x_chunks_per_thread() {
    return (gemm_x_chunks<TJ>() + GEMM_THREADS - 1) / GEMM_THREADS;
}
// Whether chunk c (thread + GEMM_THREADS h) and activation line `line` (thread / 4: one scale each) are in the TJ
// tile. At TJ = 4 every thread's are and the tests fold away, so the 64-token kernels keep their code; at TJ = 2 the
// chunk test is kept although it always holds (folded, the Q8_0 kernel's schedule spilled 4 bytes on sm_70).
template <int TJ>
__device__ __forceinline__ bool gemm_x_chunk_in_tile(int c) {
    return TJ == 4 || c < gemm_x_chunks<TJ>();
}
template <int TJ>
__device__ __forceinline__ bool gemm_x_line_in_tile(int line) {
    return TJ == 4 || line < GEMM_LANES * TJ;
}

// The TJ per-token values of token lane tt for one block (scales, sums), in one shared load where TJ allows.
template <int TJ>
__device__ __forceinline__ void load_token_values(const float (&src)[TJ], float (&v)[TJ]) {
    if constexpr (TJ == 4) {
        const float4 q = *reinterpret_cast<const float4*>(src);
        v[0] = q.x, v[1] = q.y, v[2] = q.z, v[3] = q.w;
    } else if constexpr (TJ == 2) {
        const float2 q = *reinterpret_cast<const float2*>(src);
        v[0] = q.x, v[1] = q.y;
    } else {
#pragma unroll
        for (int j = 0; j < TJ; ++j) v[j] = src[j];
    }
}

// The 4 x TJ integer dot products of 16 staged values (columns col .. col + 15 of the weight tile `wq` and the
// activation tile `xq`) added into the thread's running sums: 4 + TJ 16-byte shared loads feed 16 TJ DP4As.
template <int TJ>
__device__ __forceinline__ void gemm_half_products(const signed char* wq, const signed char* xq, int tr, int tt,
                                                   int col, int (&isum)[4][TJ]) {
    int4 w[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = *reinterpret_cast<const int4*>(wq + (tr + GEMM_LANES * i) * GEMM_PITCH + col);
#pragma unroll
    for (int j = 0; j < TJ; ++j) {
        const int4 x = *reinterpret_cast<const int4*>(xq + (tt + GEMM_LANES * j) * GEMM_PITCH + col);
#pragma unroll
        for (int i = 0; i < 4; ++i) isum[i][j] = dot_int8x16(w[i], x, isum[i][j]);
    }
}

// The K loop both GEMMs run, with the thread's 4 x TJ sums it fills (zeroed here): `load(k)` reads stage k (the K
// values k .. k + GEMM_BK - 1 of its rows and tokens) from global memory into the thread's registers, `store(tile, k)`
// writes those registers into a shared tile, `compute(tile, acc)` adds a staged tile's products into the sums.
// STAGES = 1: one tile; each stage stores, waits, issues the next stage's loads, computes, and waits again before the
// next store. STAGES = 2 (the _db kernels): two tiles in turn, so a stage's registers are stored into the other tile
// after it is computed, and one barrier per stage replaces two (2 x 20 KB: two CTAs an SM still fit a Volta card's
// 96 KB). Every output sums its blocks in the same order either way: the same bits.
template <int STAGES, int TJ, typename Tile, typename Load, typename Store, typename Compute>
__device__ __forceinline__ void gemm_staged_k(Tile (&tiles)[STAGES], int K, float (&acc)[4][TJ], Load&& load,
                                              Store&& store, Compute&& compute) {
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < TJ; ++j) acc[i][j] = 0.0f;

    load(0);
    if (STAGES == 2) {
        store(tiles[0], 0);
        __syncthreads();
    }
    int cur = 0;
    for (int k0 = 0; k0 < K; k0 += GEMM_BK) {
        const bool more = k0 + GEMM_BK < K;
        if (STAGES == 1) {
            store(tiles[0], k0);
            __syncthreads();
        }
        if (more) load(k0 + GEMM_BK);
        compute(tiles[cur], acc);
        if (STAGES == 2) {
            if (more) store(tiles[cur ^ 1], k0 + GEMM_BK);
            cur ^= 1;
        }
        __syncthreads();
    }
}

}  // namespace rigllm
