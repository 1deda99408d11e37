// DP4A GEMV: Q8_0 weights x Q8_1 activations for T = 1..8 tokens (decode, speculative verify, prefill tails).
//
//     y[t][row] = sum_k W[row][k] * x[t][k]      (optionally y = residual + W x)
//
// Weights (structure of arrays, repacked at load): wq int8 [rows][K] row-major (16-byte aligned rows, K % 32 == 0)
// and wd fp16 [rows][K/32], one scale per 32-value block, so W[row][k] = wq[row][k] * wd[row][k/32].
// Activations (from quantize_q8_1): xq int8 [T][K], xd fp32 [T][K/32]. Accumulation and output are fp32.
//
// Work split: a warp owns R consecutive rows; each lane reads 16-byte slices (half a 32-block) of those rows at
// stride 32 slices, so one warp-wide load is 512 contiguous bytes per row. U slices per lane are loaded before
// any is used, keeping U * R independent 16-byte weight loads in flight per lane. Each weight word is loaded once
// and multiplied with all T activation rows (from L1), so a T-token launch reads the weights once. A warp-shuffle
// reduction ends each row; no shared memory, no __syncthreads. Warps stride over row groups (grid-stride), so any
// grid size is correct; the launcher sizes the grid to one row group per warp.
//
// Several matrices sharing one input (ffn gate+up; the GDN in-projections qkv, z, b, a; attention q, k, v) are
// stacked row-wise at load time and run as one launch. The output is then split by row ranges: rows
// [0, end0), [end0, end1), [end1, end2), [end2, rows) form up to four segments, and segment s (rows
// [start_s, end_s)) is written as its own [T][end_s - start_s] matrix at y + T * start_s. A single matrix passes
// end0 = end1 = end2 = rows. For T = 1 this is just y[row].
//
// residual (nullable) is read with the output's own layout; it may alias y (in-place y += W x).
#include "matmul_store.cuh"

// U slices of each of R rows for the lane (zeros past the row's end), slice s0 + 32 * u at cursor offset 32 * u.
template <int R, int U>
__device__ __forceinline__ void gemv_q8_load(const int4* const (&wp)[R], const unsigned short* const (&dp)[R], int s0,
                                             int n_slices, int4 (&w)[U][R], unsigned short (&dh)[U][R]) {
#pragma unroll
    for (int u = 0; u < U; ++u) {
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (s0 + 32 * u < n_slices) {
                w[u][r] = __ldcs(wp[r] + 32 * u);
                dh[u][r] = __ldcs(dp[r] + 16 * u);
            } else {
                w[u][r] = make_int4(0, 0, 0, 0);
                dh[u][r] = 0;
            }
        }
    }
}

// P (pipelined): the lane issues the next U slices' loads before it multiplies the current ones, so 2 * U * R
// weight loads are in flight while it computes instead of U * R between computing rounds: more bytes in flight
// per resident warp (Little's law: the H200 needs about 34 KB per SM at its ~1 us latency, which 24 warps of
// U * R = 2 loads do not reach) at the price of U * R more registers.
template <int T, int R, int U, bool P>
__device__ __forceinline__ void gemv_q8_body(const signed char* __restrict__ wq, const __half* __restrict__ wd,
                                             const signed char* __restrict__ xq, const float* __restrict__ xd,
                                             float* y, const float* residual, int rows, int K, int end0, int end1,
                                             int end2) {
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    const int n_slices = K >> 4;  // 16-byte slices per row
    const int n_blocks = K >> 5;  // 32-value quantization blocks per row
    const long long group_stride = (long long)gridDim.x * warps_per_block;

    for (long long group = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); group * R < rows;
         group += group_stride) {
        const int row0 = (int)(group * R);
        // Per-lane cursors: slice s of a row is int4 number s, its scale is fp16 number s / 2. Loads use
        // compile-time offsets from these (32 * u slices, 16 * u scales), which costs no extra registers.
        const int4* wp[R];
        const unsigned short* dp[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = min(row0 + r, rows - 1);  // rows past the end repeat the last one and are not stored
            wp[r] = reinterpret_cast<const int4*>(wq + (size_t)row * K) + lane;
            dp[r] = reinterpret_cast<const unsigned short*>(wd + (size_t)row * n_blocks) + (lane >> 1);
        }
        const int4* xp = reinterpret_cast<const int4*>(xq) + lane;
        const float* xdp = xd + (lane >> 1);

        float acc[R][T];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

        int4 next[U][R];  // P: the slices of the coming round, loaded a round ahead
        unsigned short next_d[U][R];
        if (P) gemv_q8_load<R, U>(wp, dp, lane, n_slices, next, next_d);
        for (int s0 = lane; s0 < n_slices; s0 += 32 * U) {
            int4 w[U][R];
            unsigned short dh[U][R];
            if (P) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) w[u][r] = next[u][r], dh[u][r] = next_d[u][r];
            } else {
                gemv_q8_load<R, U>(wp, dp, s0, n_slices, w, dh);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                wp[r] += 32 * U;
                dp[r] += 16 * U;
            }
            if (P) gemv_q8_load<R, U>(wp, dp, s0 + 32 * U, n_slices, next, next_d);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (s0 + 32 * u < n_slices) {
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        const int4 xv = __ldg(xp + t * n_slices + 32 * u);
                        const float dx = __ldg(xdp + t * n_blocks + 16 * u);
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            const float dot = rigllm::biased_dot_to_float(
                                rigllm::dot_int8x16(w[u][r], xv, rigllm::DOT_FLOAT_BIAS));
                            const float dw = __half2float(__ushort_as_half(dh[u][r]));
                            acc[r][t] = fmaf(dot, dw * dx, acc[r][t]);
                        }
                    }
                }
            }
            xp += 32 * U;
            xdp += 16 * U;
        }

        rigllm::gemv_warp_store<R, T>(acc, row0, rows, end0, end1, end2, y, residual);
    }
}

// One entry point per token count T. R rows per warp and U slices in flight per lane are tuned per T: more
// tokens need more accumulators (R * T) and more activation loads per weight load, so U shrinks and, at T >= 5,
// R grows to reuse each activation word across 4 rows. MIN_BLOCKS caps registers (65536 / (THREADS * MIN_BLOCKS))
// so enough warps stay resident to keep HBM busy; each choice is the largest that ptxas 12.9 fits without
// spilling on sm_70 (T = 1 at 8 blocks spilled 8 bytes, so it runs 7: 72 registers, 28 warps per SM, U * R = 8
// loads of 16 bytes in flight per lane). engine/cuda/gemv.py mirrors (T, R) to size grids; a unit test
// checks the two agree. Block size is 128 threads (4 warps).
#define RIGLLM_GEMV_Q8_KERNEL(NAME, T, R, U, PIPELINED, THREADS, MIN_BLOCKS)                                      \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                                       \
        const signed char* __restrict__ wq, const __half* __restrict__ wd, const signed char* __restrict__ xq,    \
        const float* __restrict__ xd, float* y, const float* residual, int rows, int K, int end0, int end1,        \
        int end2) {                                                                                               \
        gemv_q8_body<T, R, U, PIPELINED>(wq, wd, xq, xd, y, residual, rows, K, end0, end1, end2);                 \
    }
#define RIGLLM_GEMV_Q8(T, R, U, MIN_BLOCKS) RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T, T, R, U, false, 128, MIN_BLOCKS)

RIGLLM_GEMV_Q8(1, 2, 4, 7)
RIGLLM_GEMV_Q8(2, 2, 2, 8)
RIGLLM_GEMV_Q8(3, 2, 2, 8)
RIGLLM_GEMV_Q8(4, 2, 2, 8)
RIGLLM_GEMV_Q8(5, 4, 1, 4)
RIGLLM_GEMV_Q8(6, 4, 1, 4)
RIGLLM_GEMV_Q8(7, 4, 1, 4)
RIGLLM_GEMV_Q8(8, 4, 1, 4)

// Alternatives for T = 1 (decode), T = 2 (a one-draft speculative verify, two-slot steps) and T = 3, timed against
// gemv_q8_t<T> by engine.cuda.bench.microbench.gemv_sweep; gemv.py's GEMV_VARIANTS mirrors (name, R, THREADS) and
// DEFAULT_GEMV names the one each T launches. Small decode matrices (4096 rows) fill the card only when warps
// are many and each finishes in few load rounds, so the grid trades rows per warp (fewer rows: more warps) against loads in flight per lane (more: fewer rounds, more
// registers, fewer resident warps). The _w2 variants use 64-thread blocks: finer blocks spread a small grid
// more evenly over the SMs. MIN_BLOCKS is again the largest without spills on sm_70, but THREADS * MIN_BLOCKS
// stays <= 1024, sm_75's threads per SM (the same PTX is assembled for every target and ptxas warns past it).
// Splitting K across warps is left out: at one row per warp every 9B/27B matrix (>= 4096 rows) already gives
// about as many warps as an H200 keeps resident (132 SMs x 32-48), so a split would mostly add a reduction.
#define RIGLLM_GEMV_Q8_VARIANT(T, SUFFIX, R, U, THREADS, MIN_BLOCKS) \
    RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T##_##SUFFIX, T, R, U, false, THREADS, MIN_BLOCKS)
// The pipelined form of a variant (gemv_q8_body's P), named with a _p suffix.
#define RIGLLM_GEMV_Q8_PIPELINED(T, SUFFIX, R, U, THREADS, MIN_BLOCKS) \
    RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T##_##SUFFIX##_p, T, R, U, true, THREADS, MIN_BLOCKS)

RIGLLM_GEMV_Q8_VARIANT(1, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r1_u4, 1, 4, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r1_u8, 1, 8, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r2_u2, 2, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r2_u8, 2, 8, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(1, r4_u2, 4, 2, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(1, r4_u4, 4, 4, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(1, r1_u8_w2, 1, 8, 64, 16)
RIGLLM_GEMV_Q8_VARIANT(1, r2_u4_w2, 2, 4, 64, 14)
RIGLLM_GEMV_Q8_VARIANT(2, r4_u2, 4, 2, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(2, r2_u4, 2, 4, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(2, r1_u8, 1, 8, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(2, r4_u1, 4, 1, 128, 7)
// T = 3 (a two-draft verify): each weight word meets three activation words, so more rows per warp share
// those L1 loads (R = 4 halves them per weight load against R = 2).
RIGLLM_GEMV_Q8_VARIANT(3, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(3, r4_u2, 4, 2, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(3, r1_u4, 1, 4, 128, 7)
RIGLLM_GEMV_Q8_VARIANT(3, r1_u8, 1, 8, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(3, r2_u4, 2, 4, 128, 5)
// T = 4 and T = 8 (batched decode steps of 4 and 8 slots, issue 28): each weight word meets T activation words, so
// the step is as much instruction issue as weight reads on the H200; the variants trade rows per warp (activation
// loads shared by more rows) against accumulators (R * T) and loads in flight.
RIGLLM_GEMV_Q8_VARIANT(4, r4_u1, 4, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(4, r1_u4, 1, 4, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(4, r2_u4, 2, 4, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(4, r8_u1, 8, 1, 128, 3)
RIGLLM_GEMV_Q8_VARIANT(8, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(8, r2_u2, 2, 2, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(8, r4_u2, 4, 2, 128, 3)
RIGLLM_GEMV_Q8_VARIANT(8, r1_u4, 1, 4, 128, 6)
// T = 5..7 (batched steps of 5 to 7 slots): the shapes that won at T = 4 and T = 8 (two rows per warp).
RIGLLM_GEMV_Q8_VARIANT(5, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(5, r2_u2, 2, 2, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(6, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(6, r2_u2, 2, 2, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(7, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(7, r2_u2, 2, 2, 128, 5)
// Pipelined (the next round's weights in flight while the current round multiplies): the shapes that won at
// each width, with MIN_BLOCKS lowered where the second set of weight registers needs it.
RIGLLM_GEMV_Q8_PIPELINED(1, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(1, r2_u2, 2, 2, 128, 6)
RIGLLM_GEMV_Q8_PIPELINED(1, r1_u4, 1, 4, 128, 7)
RIGLLM_GEMV_Q8_PIPELINED(2, r2_u1, 2, 1, 128, 8)
RIGLLM_GEMV_Q8_PIPELINED(2, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(3, r2_u2, 2, 2, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(3, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(4, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_PIPELINED(4, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(5, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_PIPELINED(6, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(7, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(8, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(8, r4_u1, 4, 1, 128, 4)
