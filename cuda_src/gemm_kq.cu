// Prefill GEMM: K-quant weights (Q4_K, Q5_K, Q6_K; layouts in kquant.cuh) x Q8_1 activations -> fp32, DP4A only.
//
// Same tile, grid, output contract and launch interface as gemm_q8.cu (64 rows x 64 tokens per CTA, 256
// threads as 16 row lanes x 16 token lanes, thread (tr, tt) owns rows r0 + tr + 16 i and tokens
// t0 + tt + 16 j; segments end0..end2; residual nullable and may alias y), so the host picks the kernel by
// weight type. What differs is the weight side of a stage (K values k0 .. k0 + 127, i.e. four Q8_1 blocks):
//
// * each of the 256 threads loads one slice (kquant.cuh: 16 payload bytes = 32 values, of row r0 + tid / 4,
//   slice k0 / 32 + tid % 4) and, when storing the stage, decodes it into int8 lanes written to the same
//   [64][128] shared tile the Q8_0 kernel uses (lo lanes at the slice's 16 positions of block lo, hi lanes
//   at those of block hi), plus the per-(row, block, half) scales d * s as floats and, for Q4_K/Q5_K, the
//   per-(row, block) min term m. One slice has one scale per block, and the two slices that share a block
//   (its two 16-value halves) have the same scale in Q4_K/Q5_K, different ones in Q6_K;
// * for Q4_K/Q5_K each block adds  - m * xd * sum(xq)  per (row, token): the activation sums per (token,
//   block) are made while staging x (each thread sums its 16 values; the partner thread holding the other
//   half of the block adds its sum with one shuffle).
//
// Per block b, output (i, j):  acc += xd_j * (sum_half ws[half]_i * isum[half]_ij - m_i * xsum_j), with the
// integer sums per 16-value half kept apart only for Q6_K (Q4_K/Q5_K use one sum per block, as Q8_0).
// Tails: rows past `rows` and tokens past `T` are staged as zeros with zero scales and are not stored; K is a
// multiple of 256 (the formats require it), so there is no K tail.
//
// TJ: tokens a thread owns, as in gemm_q8.cu (16 TJ a tile): TJ = 4 is the tile above, TJ = 1 and 2 the _t16 / _t32
// kernels for short chunks; every TJ gives the same bits.

#include "gemm_tile.cuh"
#include "kquant.cuh"
#include "matmul_store.cuh"

template <int TJ>
struct KqGemmSmem {
    signed char wq[GEMM_BR * GEMM_PITCH];
    signed char xq[GEMM_LANES * TJ * GEMM_PITCH];
    float ws[GEMM_BK / 32][2][GEMM_LANES][4];  // [block][half][tr][i]: d * s of row tr + 16 i
    float wm[GEMM_BK / 32][GEMM_LANES][4];     // [block][tr][i]: min term (Q4_K/Q5_K)
    float xs[GEMM_BK / 32][GEMM_LANES][TJ];    // [block][tt][j]: activation scale of token tt + 16 j
    float xsum[GEMM_BK / 32][GEMM_LANES][TJ];  // [block][tt][j]: sum of its int8 activations (Q4_K/Q5_K)
};

template <int TJ>
struct KqStageRegs {
    rigllm::KqRaw w;
    bool w_ok;
    int4 x[rigllm::gemm_x_chunks_per_thread<TJ>()];  // zeros for a thread past the tile's chunks
    float xs;
};

template <int TYPE, int TJ>
__device__ __forceinline__ void kq_load_stage(KqStageRegs<TJ>& st, const unsigned char* __restrict__ w,
                                              const signed char* __restrict__ xq, const float* __restrict__ xd,
                                              int r0, int rows, int t0, int T, int K, int k0) {
    const int r = r0 + (threadIdx.x >> 2);
    const int g = (k0 >> 5) + (threadIdx.x & 3);
    st.w_ok = r < rows;
    if (st.w_ok) rigllm::KQuant<TYPE>::load(w, rows, K, r, g, st.w);
#pragma unroll
    for (int h = 0; h < rigllm::gemm_x_chunks_per_thread<TJ>(); ++h) {
        const int c = threadIdx.x + GEMM_THREADS * h;
        const int t = t0 + (c >> 3);
        const int k = k0 + (c & 7) * 16;
        st.x[h] = rigllm::gemm_x_chunk_in_tile<TJ>(c) && t < T ? *reinterpret_cast<const int4*>(xq + (size_t)t * K + k)
                                                               : make_int4(0, 0, 0, 0);
    }
    const int t = t0 + (threadIdx.x >> 2);
    const int b = (k0 >> 5) + (threadIdx.x & 3);
    st.xs = rigllm::gemm_x_line_in_tile<TJ>(threadIdx.x >> 2) && t < T ? xd[(size_t)t * (K >> 5) + b] : 0.0f;
}

template <int TYPE, int TJ>
__device__ __forceinline__ void kq_store_stage(KqGemmSmem<TJ>& sm, const KqStageRegs<TJ>& st, int k0) {
    using Q = rigllm::KQuant<TYPE>;
    const int line = threadIdx.x >> 2;
    const int slot = threadIdx.x & 3;  // slice within the stage: block lo = 2 * (slot / 2), half = slot % 2
    rigllm::KqSlice s;
    if (st.w_ok) {
        Q::decode(st.w, (k0 >> 5) + slot, s);
    } else {
#pragma unroll
        for (int i = 0; i < 4; ++i) s.lo[i] = s.hi[i] = 0;
        s.s_lo = s.s_hi = 0;
        s.d = s.m_lo = s.m_hi = 0.0f;
    }
    const int blk_lo = (slot >> 1) << 1;
    const int half = slot & 1;
    signed char* row = sm.wq + line * GEMM_PITCH;
    *reinterpret_cast<int4*>(row + 32 * blk_lo + 16 * half) = make_int4(s.lo[0], s.lo[1], s.lo[2], s.lo[3]);
    *reinterpret_cast<int4*>(row + 32 * (blk_lo + 1) + 16 * half) = make_int4(s.hi[0], s.hi[1], s.hi[2], s.hi[3]);
    const int lane = line % GEMM_LANES, i = line / GEMM_LANES;
    sm.ws[blk_lo][half][lane][i] = s.d * (float)s.s_lo;
    sm.ws[blk_lo + 1][half][lane][i] = s.d * (float)s.s_hi;
    if (Q::HAS_MIN && half == 0) {
        sm.wm[blk_lo][lane][i] = s.m_lo;
        sm.wm[blk_lo + 1][lane][i] = s.m_hi;
    }

#pragma unroll
    for (int h = 0; h < rigllm::gemm_x_chunks_per_thread<TJ>(); ++h) {
        const int c = threadIdx.x + GEMM_THREADS * h;
        const bool in_tile = rigllm::gemm_x_chunk_in_tile<TJ>(c);  // uniform over a warp (32 chunks a warp)
        if (in_tile) *reinterpret_cast<int4*>(sm.xq + (c >> 3) * GEMM_PITCH + (c & 7) * 16) = st.x[h];
        if (Q::HAS_MIN) {
            // threads c and c ^ 1 hold the two halves of one block of one token (same warp)
            const int part = rigllm::sum16(st.x[h]);
            const int total = part + __shfl_xor_sync(RIGLLM_FULL_MASK, part, 1);
            const int tl = c >> 3;
            if (in_tile && (c & 1) == 0) sm.xsum[(c & 7) >> 1][tl % GEMM_LANES][tl / GEMM_LANES] = (float)total;
        }
    }
    if (rigllm::gemm_x_line_in_tile<TJ>(line)) sm.xs[slot][line % GEMM_LANES][line / GEMM_LANES] = st.xs;
}

// The staged tile's GEMM_BK / 32 blocks into the thread's 4 x TJ accumulators.
template <int TYPE, int TJ>
__device__ __forceinline__ void kq_gemm_tile(const KqGemmSmem<TJ>& sm, int tr, int tt, float (&acc)[4][TJ]) {
    using Q = rigllm::KQuant<TYPE>;
    constexpr int HALVES = Q::HAS_MIN ? 1 : 2;  // integer sums kept per 16-value half (Q6_K) or per block
#pragma unroll 1
    for (int blk = 0; blk < GEMM_BK / 32; ++blk) {
        int isum[HALVES][4][TJ];
#pragma unroll
        for (int h = 0; h < HALVES; ++h)
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < TJ; ++j) isum[h][i][j] = rigllm::DOT_FLOAT_BIAS;
#pragma unroll
        for (int half = 0; half < 2; ++half)
            rigllm::gemm_half_products(sm.wq, sm.xq, tr, tt, blk * 32 + half * 16, isum[HALVES == 2 ? half : 0]);
        float xv[TJ];
        rigllm::load_token_values<TJ>(sm.xs[blk][tt], xv);
        float ws[HALVES][4];
#pragma unroll
        for (int h = 0; h < HALVES; ++h) {
            const float4 w4 = *reinterpret_cast<const float4*>(sm.ws[blk][h][tr]);
            ws[h][0] = w4.x, ws[h][1] = w4.y, ws[h][2] = w4.z, ws[h][3] = w4.w;
        }
        float wm[4] = {0.0f, 0.0f, 0.0f, 0.0f}, xsum[TJ];
#pragma unroll
        for (int j = 0; j < TJ; ++j) xsum[j] = 0.0f;
        if (Q::HAS_MIN) {
            const float4 m4 = *reinterpret_cast<const float4*>(sm.wm[blk][tr]);
            wm[0] = m4.x, wm[1] = m4.y, wm[2] = m4.z, wm[3] = m4.w;
            rigllm::load_token_values<TJ>(sm.xsum[blk][tt], xsum);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < TJ; ++j) {
                float v = ws[0][i] * rigllm::biased_dot_to_float(isum[0][i][j]);
                if (HALVES == 2) v = fmaf(ws[HALVES - 1][i], rigllm::biased_dot_to_float(isum[HALVES - 1][i][j]), v);
                if (Q::HAS_MIN) v = fmaf(-wm[i], xsum[j], v);
                acc[i][j] = fmaf(xv[j], v, acc[i][j]);
            }
    }
}

// STAGES: one staged tile or two in turn (the _db kernels), as gemm_q8.cu's gemm_body; gemm_tile.cuh's gemm_staged_k
// runs the stages.
template <int TYPE, int STAGES, int TJ>
__device__ __forceinline__ void gemm_kq_body(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
                                             const float* __restrict__ xd, float* y, const float* residual, int rows,
                                             int K, int end0, int end1, int end2, int T) {
    __shared__ __align__(16) KqGemmSmem<TJ> tiles[STAGES];

    const int tid = threadIdx.x;
    const int tr = tid % GEMM_LANES;
    const int tt = tid / GEMM_LANES;
    const int t0 = blockIdx.x * GEMM_LANES * TJ;
    const int r0 = blockIdx.y * GEMM_BR;

    float acc[4][TJ];
    KqStageRegs<TJ> st;
    rigllm::gemm_staged_k<STAGES>(
        tiles, K, acc, [&](int k) { kq_load_stage<TYPE, TJ>(st, w, xq, xd, r0, rows, t0, T, K, k); },
        [&](KqGemmSmem<TJ>& tile, int k) { kq_store_stage<TYPE, TJ>(tile, st, k); },
        [&](const KqGemmSmem<TJ>& tile, float (&sums)[4][TJ]) { kq_gemm_tile<TYPE, TJ>(tile, tr, tt, sums); });

    rigllm::gemm_tile_store(acc, r0, tr, t0, tt, rows, T, end0, end1, end2, y, residual);
}

// MIN_BLOCKS: the CTAs an SM is asked to hold (the registers ptxas may use follow from it)
#define RIGLLM_GEMM_KQ(NAME, TYPE, STAGES, TJ, MIN_BLOCKS)                                                        \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, MIN_BLOCKS)                                        \
        NAME(const unsigned char* __restrict__ w, const signed char* __restrict__ xq, const float* __restrict__ xd,  \
             float* y, const float* residual, int rows, int K, int end0, int end1, int end2, int T) {             \
        gemm_kq_body<TYPE, STAGES, TJ>(w, xq, xd, y, residual, rows, K, end0, end1, end2, T);                     \
    }

RIGLLM_GEMM_KQ(gemm_q4_k_q8_1, RIGLLM_Q4_K, 1, 4, 2)
RIGLLM_GEMM_KQ(gemm_q5_k_q8_1, RIGLLM_Q5_K, 1, 4, 2)
RIGLLM_GEMM_KQ(gemm_q6_k_q8_1, RIGLLM_Q6_K, 1, 4, 2)
RIGLLM_GEMM_KQ(gemm_q4_k_q8_1_db, RIGLLM_Q4_K, 2, 4, 2)
RIGLLM_GEMM_KQ(gemm_q5_k_q8_1_db, RIGLLM_Q5_K, 2, 4, 2)
RIGLLM_GEMM_KQ(gemm_q6_k_q8_1_db, RIGLLM_Q6_K, 2, 4, 2)
RIGLLM_GEMM_KQ(gemm_q4_k_q8_1_db_t32, RIGLLM_Q4_K, 2, 2, 3)
RIGLLM_GEMM_KQ(gemm_q5_k_q8_1_db_t32, RIGLLM_Q5_K, 2, 2, 3)
RIGLLM_GEMM_KQ(gemm_q6_k_q8_1_db_t32, RIGLLM_Q6_K, 2, 2, 2)  // at 3 it spills 4 bytes (sm_70)
RIGLLM_GEMM_KQ(gemm_q4_k_q8_1_db_t16, RIGLLM_Q4_K, 2, 1, 3)
RIGLLM_GEMM_KQ(gemm_q5_k_q8_1_db_t16, RIGLLM_Q5_K, 2, 1, 3)
RIGLLM_GEMM_KQ(gemm_q6_k_q8_1_db_t16, RIGLLM_Q6_K, 2, 1, 3)
