// Prefill GEMM: Q8_0 weights x Q8_1 activations -> fp32, DP4A only (no tensor cores).
//
//   y[t][r] (+)= sum over 32-blocks b of  d_w[r][b] * d_x[t][b] * sum_{k in b} qs[r][k] * xq[t][k]
//
// Inputs (contracts: the shared device formats):
//   qs  int8   [rows][K]     Q8_0 weight payload, each row blocked (q8_blocked.cuh; K % 32 == 0, so rows are
//                            16-byte aligned); the stage loads gather a tile's natural columns from it
//   dw  __half [rows][K/32]  one weight scale per 32-value block
//   xq  int8   [T][K]        Q8_1 activations, token-major
//   xd  float  [T][K/32]     one activation scale per 32-value block
//   y   float  [T][rows]     token-major, split into segments exactly like the GEMV output
//                            (gemv_q8.cu): matrices stacked row-wise at load (gate+up; GDN qkv, z,
//                            b, a) have row ranges [0, end0), [end0, end1), [end1, end2), [end2, rows),
//                            and segment [start, end) is its own [T][end - start] matrix at
//                            y + T * start. A single matrix passes end0 = end1 = end2 = rows.
//   residual float or null:  when given, y = residual + W.x with the output's layout (it may alias
//                            y: each element is read and then written by the same thread)
//
// The tile. One CTA computes a 64-row x 64-token tile of y with 256 threads arranged as 16 row lanes
// (tr = tid % 16) x 16 token lanes (tt = tid / 16). Thread (tr, tt) owns the 4 x 4 outputs
// rows r0 + tr + 16*i and tokens t0 + tt + 16*j (i, j < 4). Strided ownership keeps the shared-memory
// reads conflict-free: the 16 row lanes of a warp read 16 different weight rows whose 144-byte pitch
// (128 payload bytes + 16 pad) walks the banks, while each warp reads only two activation rows
// (broadcast). It also makes the output stores of a warp two runs of 16 consecutive floats.
//
// K is consumed in stages of BK = 128 values (4 Q8 blocks). Per stage the CTA copies the int8 weight
// tile [64][128] and activation tile [64][128] into shared memory with 16-byte loads, and the block
// scales as floats laid out [block][lane][i] so a thread fetches its 4 scales with one 16-byte load.
// Inside a block each thread runs a 4 x 4 x 8 DP4A outer product into int32 (operands fetched as
// 16-byte vectors: 8 LDS.128 feed 64 DP4A), then folds the block into fp32:
// acc += float(int_sum) * (d_w * d_x), the float read off the DP4A chain's bits (common.cuh DOT_FLOAT_BIAS). Volta has
// no cp.async: a stage's global loads wait in registers while the staged tile is computed, and two resident CTAs per SM
// overlap one CTA's barriers with the other's DP4A work (gemm_q8_0_q8_1_db also stages into two tiles in turn).
//
// Tails are predicated in the same kernel: rows past `rows`, tokens past `T` and blocks past K/32 are
// staged as zeros with zero scales (they add exactly 0) and their outputs are not stored. So any
// T >= 1 and any rows >= 1 run at full speed per tile, and K only needs to be a multiple of 32.
//
// Grid: x = token tiles (ceil(T / 64), at most 8 for a 512-token chunk; ceil(T / (16 TJ)) for the narrow tiles below),
// y = row tiles (ceil(rows / 64), 3880 for a 248320-row LM head, below the 65535 limit and independent of the
// context length). Token tiles vary fastest so the CTAs that share a weight tile run together and
// the weight tile is read from HBM about once.

#include "gemm_tile.cuh"
#include "matmul_store.cuh"
#include "q8_blocked.cuh"

// TJ: tokens a thread owns (16 TJ a tile). TJ = 4 is the 64-token tile above; TJ = 1 and 2 (16- and 32-token tiles,
// the _t16 / _t32 kernels) are for short chunks, where a 64-token tile computes mostly padding (a 16-token 9B chunk
// took as long as a 54-token one, 14.6 against 15.1 ms of GEMMs, H200 s22b) and a 4096-row matrix gets 64 CTAs for
// 132 SMs. Each output still sums its blocks in the same order with the same fold: every TJ gives the same bits.
template <int TJ>
struct GemmSmem {
    signed char wq[GEMM_BR * GEMM_PITCH];
    signed char xq[GEMM_LANES * TJ * GEMM_PITCH];
    float ws[GEMM_BK / 32][GEMM_LANES][4];   // [block][tr][i]: scale of row tr + 16*i
    float xs[GEMM_BK / 32][GEMM_LANES][TJ];  // [block][tt][j]: scale of token tt + 16*j
};

// One stage (K values k0 .. k0+127) of a CTA's inputs, held in registers between the global loads
// and the shared-memory stores so the next stage's loads are in flight while this one is computed.
// Each of the 256 threads moves two 16-byte chunks of the 64-line int8 weight tile (8 chunks per line), up to two
// of the activation tile (threads past its 128 TJ chunks none), one weight scale (line tid / 4, block tid % 4)
// and, among the first 64 TJ threads, one activation scale.
template <int TJ>
struct StageRegs {
    int4 w[2];
    int4 x[rigllm::gemm_x_chunks_per_thread<TJ>()];
    float ws;
    float xs;
};

// The 16 values k .. k + 15 (k % 16 == 0) of line `line` of a [n_lines][K] int8 matrix, zeros past its end; the
// weights' lines are in the blocked payload (q8_blocked.cuh), the activations' natural.
template <bool BLOCKED>
__device__ __forceinline__ int4 load_chunk(const signed char* __restrict__ src, int line, int n_lines, int K,
                                           int k) {
    if (line >= n_lines || k >= K) return make_int4(0, 0, 0, 0);
    const int unit = BLOCKED ? rigllm::q8_blocked_unit(k >> 4, K >> 5) : k >> 4;
    return reinterpret_cast<const int4*>(src + (size_t)line * K)[unit];
}

template <int TJ>
__device__ __forceinline__ void load_stage(StageRegs<TJ>& st, const signed char* __restrict__ qs,
                                           const __half* __restrict__ dw, const signed char* __restrict__ xq,
                                           const float* __restrict__ xd, int r0, int rows, int t0, int T,
                                           int K, int k0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int c = threadIdx.x + GEMM_THREADS * h;
        const int line = c >> 3;
        const int k = k0 + (c & 7) * 16;
        st.w[h] = load_chunk<true>(qs, r0 + line, rows, K, k);
        if (h < rigllm::gemm_x_chunks_per_thread<TJ>() && rigllm::gemm_x_chunk_in_tile<TJ>(c))
            st.x[h] = load_chunk<false>(xq, t0 + line, T, K, k);
    }
    const int nblk = K / 32;
    const int line = threadIdx.x >> 2;
    const int b = k0 / 32 + (threadIdx.x & 3);
    const int r = r0 + line;
    const int t = t0 + line;
    st.ws = (r < rows && b < nblk) ? __half2float(dw[(size_t)r * nblk + b]) : 0.0f;
    st.xs = (rigllm::gemm_x_line_in_tile<TJ>(line) && t < T && b < nblk) ? xd[(size_t)t * nblk + b] : 0.0f;
}

template <int TJ>
__device__ __forceinline__ void store_stage(GemmSmem<TJ>& sm, const StageRegs<TJ>& st) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int c = threadIdx.x + GEMM_THREADS * h;
        const int off = (c >> 3) * GEMM_PITCH + (c & 7) * 16;
        *reinterpret_cast<int4*>(sm.wq + off) = st.w[h];
        if (h < rigllm::gemm_x_chunks_per_thread<TJ>() && rigllm::gemm_x_chunk_in_tile<TJ>(c))
            *reinterpret_cast<int4*>(sm.xq + off) = st.x[h];
    }
    const int line = threadIdx.x >> 2;
    const int blk = threadIdx.x & 3;
    sm.ws[blk][line % GEMM_LANES][line / GEMM_LANES] = st.ws;
    if (rigllm::gemm_x_line_in_tile<TJ>(line)) sm.xs[blk][line % GEMM_LANES][line / GEMM_LANES] = st.xs;
}

// One 32-value block of the staged tile (blk < GEMM_BK / 32) into the thread's 4 x TJ accumulators.
template <int TJ>
__device__ __forceinline__ void gemm_block(const GemmSmem<TJ>& sm, int blk, int tr, int tt, float (&acc)[4][TJ]) {
    int isum[4][TJ];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < TJ; ++j) isum[i][j] = rigllm::DOT_FLOAT_BIAS;
#pragma unroll
    for (int half = 0; half < 2; ++half) rigllm::gemm_half_products(sm.wq, sm.xq, tr, tt, blk * 32 + half * 16, isum);
    const float4 ws = *reinterpret_cast<const float4*>(sm.ws[blk][tr]);
    const float wv[4] = {ws.x, ws.y, ws.z, ws.w};
    float xv[TJ];
    rigllm::load_token_values<TJ>(sm.xs[blk][tt], xv);
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < TJ; ++j) acc[i][j] += rigllm::biased_dot_to_float(isum[i][j]) * (wv[i] * xv[j]);
}

// STAGES: one staged tile or two in turn (the _db kernel); gemm_tile.cuh's gemm_staged_k runs the stages.
template <int STAGES, int TJ>
__device__ __forceinline__ void gemm_body(const signed char* __restrict__ qs, const __half* __restrict__ dw,
                                          const signed char* __restrict__ xq, const float* __restrict__ xd, float* y,
                                          const float* residual, int rows, int K, int end0, int end1, int end2,
                                          int T) {
    __shared__ __align__(16) GemmSmem<TJ> sm[STAGES];

    const int tid = threadIdx.x;
    const int tr = tid % GEMM_LANES;
    const int tt = tid / GEMM_LANES;
    const int t0 = blockIdx.x * GEMM_LANES * TJ;
    const int r0 = blockIdx.y * GEMM_BR;

    float acc[4][TJ];
    StageRegs<TJ> st;
    rigllm::gemm_staged_k<STAGES>(
        sm, K, acc, [&](int k) { load_stage<TJ>(st, qs, dw, xq, xd, r0, rows, t0, T, K, k); },
        [&](GemmSmem<TJ>& tile, int) { store_stage<TJ>(tile, st); },
        [&](const GemmSmem<TJ>& tile, float (&sums)[4][TJ]) {
#pragma unroll
            for (int blk = 0; blk < GEMM_BK / 32; ++blk) gemm_block<TJ>(tile, blk, tr, tt, sums);
        });

    rigllm::gemm_tile_store(acc, r0, tr, t0, tt, rows, T, end0, end1, end2, y, residual);
}

// MIN_BLOCKS: the CTAs an SM is asked to hold (the registers ptxas may use follow from it)
#define RIGLLM_GEMM_Q8(NAME, STAGES, TJ, MIN_BLOCKS)                                                               \
    extern "C" __global__ void __launch_bounds__(GEMM_THREADS, MIN_BLOCKS)                                        \
        NAME(const signed char* __restrict__ qs, const __half* __restrict__ dw, const signed char* __restrict__ xq, \
             const float* __restrict__ xd, float* y, const float* residual, int rows, int K, int end0, int end1,   \
             int end2, int T) {                                                                                   \
        gemm_body<STAGES, TJ>(qs, dw, xq, xd, y, residual, rows, K, end0, end1, end2, T);                         \
    }

RIGLLM_GEMM_Q8(gemm_q8_0_q8_1, 1, 4, 2)
RIGLLM_GEMM_Q8(gemm_q8_0_q8_1_db, 2, 4, 2)
RIGLLM_GEMM_Q8(gemm_q8_0_q8_1_db_t32, 2, 2, 3)
RIGLLM_GEMM_Q8(gemm_q8_0_q8_1_db_t16, 2, 1, 3)
