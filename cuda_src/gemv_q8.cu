// DP4A GEMV: Q8_0 weights x Q8_1 activations for T = 1..8 tokens (decode, speculative verify, prefill tails).
//
//     y[t][row] = sum_k W[row][k] * x[t][k]      (optionally y = residual + W x)
//
// Weights (structure of arrays, repacked at load): wq int8 [rows][K] in the blocked payload of q8_blocked.cuh (each
// row's 32-value blocks cut into chunks of 32 blocks, the two 16-byte halves of block j of a chunk at units j and
// j + m) and wd fp16 [rows][K/32], one scale per block. K % 32 == 0. q8_block_payload below permutes a natural
// row-major upload into that layout in place.
// Activations (from quantize_q8_1): xq int8 [T][K] natural, xd fp32 [T][K/32]. Accumulation and output are fp32.
//
// Work split: a warp owns R consecutive rows; lane j reads block j of each chunk of those rows (both halves: two
// warp-wide loads of 512 contiguous bytes per row), U chunks a round, so U * R * 2 independent 16-byte weight loads
// are in flight per lane. It folds each block's 32 products into fp32 at once: the 8 DP4As of the block run into
// one int32 read as a float (common.cuh DOT_FLOAT_BIAS), then one subtraction, one scale product and one FMA.
// Folding per 16-byte half, as the row-major layout made the lanes do, cost those 3 instructions per 4 DP4As, which
// a launch multiplying each weight with several tokens pays in issue slots. Each weight word is loaded once and
// multiplied with all T activation rows (from L1), so a T-token launch reads the weights once. A warp-shuffle
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
#include "q8_blocked.cuh"

// In place: each row of qs int8 [rows][K], uploaded row-major, into the blocked payload. One warp per (row, chunk):
// lane j reads block j's 32 bytes, and after the warp barrier (which orders every lane's reads before any lane's
// writes) writes its halves to units j and j + m. Chunks never overlap, so warps need no ordering between them.
extern "C" __global__ void __launch_bounds__(256) q8_block_payload(signed char* qs, int rows, int K) {
    const int lane = threadIdx.x & 31;
    const int n_blocks = K >> 5;
    const int n_chunks = rigllm::q8_chunks(n_blocks);
    const long long warps = (long long)rows * n_chunks;
    for (long long w = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); w < warps;
         w += (long long)gridDim.x * (blockDim.x >> 5)) {
        const int row = (int)(w / n_chunks);
        const int chunk = (int)(w - (long long)row * n_chunks);
        const int m = rigllm::q8_chunk_blocks(chunk, n_blocks);
        int4* base = reinterpret_cast<int4*>(qs + (size_t)row * K) + chunk * 2 * rigllm::Q8_CHUNK_BLOCKS;
        int4 half0 = make_int4(0, 0, 0, 0), half1 = half0;
        if (lane < m) {
            half0 = base[2 * lane];
            half1 = base[2 * lane + 1];
        }
        __syncwarp();
        if (lane < m) {
            base[lane] = half0;
            base[lane + m] = half1;
        }
    }
}

// U chunks of each of R rows for the lane: block `lane` of chunk c0 + u (both halves and its scale) at cursor
// offsets 64 * u units and 32 * u scales; zeros past the row's end (lanes past a short last chunk's m blocks too).
template <int R, int U>
__device__ __forceinline__ void gemv_q8_load(const int4* const (&wp)[R], const unsigned short* const (&dp)[R], int c0,
                                             int n_blocks, int4 (&w)[U][R][2], unsigned short (&dh)[U][R]) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < U; ++u) {
        const int m = rigllm::q8_chunk_blocks(c0 + u, n_blocks);
#pragma unroll
        for (int r = 0; r < R; ++r) {
            if (lane < m) {
                w[u][r][0] = __ldcs(wp[r] + 64 * u);
                w[u][r][1] = __ldcs(wp[r] + 64 * u + m);
                dh[u][r] = __ldcs(dp[r] + 32 * u);
            } else {
                w[u][r][0] = w[u][r][1] = make_int4(0, 0, 0, 0);
                dh[u][r] = 0;
            }
        }
    }
}

// P (pipelined): the lane issues the next U chunks' loads before it multiplies the current ones, so twice the
// weight loads are in flight while it computes (Little's law: the H200 needs about 34 KB per SM at its ~1 us
// latency) at the price of as many more registers.
template <int T, int R, int U, bool P>
__device__ __forceinline__ void gemv_q8_body(const signed char* __restrict__ wq, const __half* __restrict__ wd,
                                             const signed char* __restrict__ xq, const float* __restrict__ xd,
                                             float* y, const float* residual, int rows, int K, int end0, int end1,
                                             int end2) {
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    const int n_units = K >> 4;  // 16-byte units per row
    const int n_blocks = K >> 5;
    const int n_chunks = rigllm::q8_chunks(n_blocks);
    const long long group_stride = (long long)gridDim.x * warps_per_block;

    for (long long group = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); group * R < rows;
         group += group_stride) {
        const int row0 = (int)(group * R);
        // Per-lane cursors at block `lane` of the first chunk: loads use compile-time offsets from them.
        const int4* wp[R];
        const unsigned short* dp[R];
#pragma unroll
        for (int r = 0; r < R; ++r) {
            const int row = min(row0 + r, rows - 1);  // rows past the end repeat the last one and are not stored
            wp[r] = reinterpret_cast<const int4*>(wq + (size_t)row * K) + lane;
            dp[r] = reinterpret_cast<const unsigned short*>(wd + (size_t)row * n_blocks) + lane;
        }
        // activations are natural: block b's halves are units 2b and 2b + 1
        const int4* xp = reinterpret_cast<const int4*>(xq) + 2 * lane;
        const float* xdp = xd + lane;

        float acc[R][T];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

        int4 next[U][R][2];  // P: the blocks of the coming round, loaded a round ahead
        unsigned short next_d[U][R];
        if (P) gemv_q8_load<R, U>(wp, dp, 0, n_blocks, next, next_d);
        for (int c0 = 0; c0 < n_chunks; c0 += U) {
            int4 w[U][R][2];
            unsigned short dh[U][R];
            if (P) {
#pragma unroll
                for (int u = 0; u < U; ++u)
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        w[u][r][0] = next[u][r][0];
                        w[u][r][1] = next[u][r][1];
                        dh[u][r] = next_d[u][r];
                    }
            } else {
                gemv_q8_load<R, U>(wp, dp, c0, n_blocks, w, dh);
            }
#pragma unroll
            for (int r = 0; r < R; ++r) {
                wp[r] += 64 * U;
                dp[r] += 32 * U;
            }
            if (P) gemv_q8_load<R, U>(wp, dp, c0 + U, n_blocks, next, next_d);
#pragma unroll
            for (int u = 0; u < U; ++u) {
                if (lane < rigllm::q8_chunk_blocks(c0 + u, n_blocks)) {
#pragma unroll
                    for (int t = 0; t < T; ++t) {
                        const int4 x0 = __ldg(xp + t * n_units + 64 * u);
                        const int4 x1 = __ldg(xp + t * n_units + 64 * u + 1);
                        const float dx = __ldg(xdp + t * n_blocks + 32 * u);
#pragma unroll
                        for (int r = 0; r < R; ++r) {
                            const int sum = rigllm::dot_int8x16(
                                w[u][r][1], x1, rigllm::dot_int8x16(w[u][r][0], x0, rigllm::DOT_FLOAT_BIAS));
                            const float dw = __half2float(__ushort_as_half(dh[u][r]));
                            acc[r][t] = fmaf(rigllm::biased_dot_to_float(sum), dw * dx, acc[r][t]);
                        }
                    }
                }
            }
            xp += 64 * U;
            xdp += 32 * U;
        }

        rigllm::gemv_warp_store<R, T>(acc, row0, rows, end0, end1, end2, y, residual);
    }
}

// One entry point per token count T. R rows per warp and U chunks in flight per lane are tuned per T: more tokens
// need more accumulators (R * T) and more activation loads per weight load, so at T >= 5 R grows to reuse each
// activation word across 4 rows. MIN_BLOCKS caps registers (65536 / (THREADS * MIN_BLOCKS)) so enough warps stay
// resident to keep HBM busy; each is the largest (at most 8: 1,024 threads, sm_75's limit, since the same PTX is
// assembled for every target) that ptxas 12.9 fits without spilling on sm_70 (tests/unit/test_gemv_variants.py).
// engine/cuda/gemv.py mirrors (T, R) to size grids; a unit test checks the two agree. 128 threads (4 warps).
#define RIGLLM_GEMV_Q8_KERNEL(NAME, T, R, U, PIPELINED, THREADS, MIN_BLOCKS)                                      \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS) NAME(                                       \
        const signed char* __restrict__ wq, const __half* __restrict__ wd, const signed char* __restrict__ xq,    \
        const float* __restrict__ xd, float* y, const float* residual, int rows, int K, int end0, int end1,        \
        int end2) {                                                                                               \
        gemv_q8_body<T, R, U, PIPELINED>(wq, wd, xq, xd, y, residual, rows, K, end0, end1, end2);                 \
    }
#define RIGLLM_GEMV_Q8(T, R, U, MIN_BLOCKS) RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T, T, R, U, false, 128, MIN_BLOCKS)

RIGLLM_GEMV_Q8(1, 2, 1, 8)
RIGLLM_GEMV_Q8(2, 2, 1, 8)
RIGLLM_GEMV_Q8(3, 2, 1, 8)
RIGLLM_GEMV_Q8(4, 2, 1, 7)
RIGLLM_GEMV_Q8(5, 4, 1, 4)
RIGLLM_GEMV_Q8(6, 4, 1, 4)
RIGLLM_GEMV_Q8(7, 4, 1, 4)
RIGLLM_GEMV_Q8(8, 4, 1, 4)

// Alternatives per T, timed against gemv_q8_t<T> by engine.cuda.bench.microbench.gemv_sweep; gemv.py's GEMV_VARIANTS
// mirrors (name, R, THREADS) and DEFAULT_GEMV / SHAPE_GEMV name the one each width and matrix shape launches. Small
// matrices (4096 rows) fill the card only when warps are many and each finishes in few load rounds, so the variants
// trade rows per warp (fewer rows: more warps; more rows: activation loads shared by more rows) against chunks in
// flight per lane (more: fewer rounds, more registers, fewer resident warps). Splitting K across warps is left out:
// at one row per warp every 9B/27B matrix (>= 4096 rows) already gives about as many warps as an H200 keeps resident.
#define RIGLLM_GEMV_Q8_VARIANT(T, SUFFIX, R, U, THREADS, MIN_BLOCKS) \
    RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T##_##SUFFIX, T, R, U, false, THREADS, MIN_BLOCKS)
// The pipelined form of a variant (gemv_q8_body's P), named with a _p suffix.
#define RIGLLM_GEMV_Q8_PIPELINED(T, SUFFIX, R, U, THREADS, MIN_BLOCKS) \
    RIGLLM_GEMV_Q8_KERNEL(gemv_q8_t##T##_##SUFFIX##_p, T, R, U, true, THREADS, MIN_BLOCKS)

RIGLLM_GEMV_Q8_VARIANT(1, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r1_u4, 1, 4, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r2_u2, 2, 2, 128, 7)
RIGLLM_GEMV_Q8_VARIANT(1, r4_u1, 4, 1, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(1, r4_u2, 4, 2, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(2, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(2, r2_u2, 2, 2, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(2, r4_u1, 4, 1, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(3, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(3, r2_u2, 2, 2, 128, 5)
RIGLLM_GEMV_Q8_VARIANT(3, r4_u1, 4, 1, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(4, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(4, r4_u1, 4, 1, 128, 4)
RIGLLM_GEMV_Q8_VARIANT(5, r2_u1, 2, 1, 128, 7)
RIGLLM_GEMV_Q8_VARIANT(6, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(7, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(8, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_VARIANT(8, r1_u2, 1, 2, 128, 8)
// One row and one chunk a lane (two loads in flight per lane, the most warps) for the middle widths.
RIGLLM_GEMV_Q8_VARIANT(2, r1_u1, 1, 1, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(5, r1_u1, 1, 1, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(6, r1_u1, 1, 1, 128, 8)
RIGLLM_GEMV_Q8_VARIANT(7, r1_u1, 1, 1, 128, 8)
// gemv_q8_t<T>'s shape (T = 5..8) with room for 168 registers (MIN_BLOCKS 3 instead of the 4 it fits in without
// spills): at T = 8 the cap of 128 registers made a step's GEMVs 18% slower (3,343 against 2,830 us, s16b's sweep).
RIGLLM_GEMV_Q8_VARIANT(5, r4_u1_m3, 4, 1, 128, 3)
RIGLLM_GEMV_Q8_VARIANT(6, r4_u1_m3, 4, 1, 128, 3)
RIGLLM_GEMV_Q8_VARIANT(7, r4_u1_m3, 4, 1, 128, 3)
RIGLLM_GEMV_Q8_VARIANT(8, r4_u1_m3, 4, 1, 128, 3)
RIGLLM_GEMV_Q8_PIPELINED(1, r1_u2, 1, 2, 128, 8)
RIGLLM_GEMV_Q8_PIPELINED(1, r2_u1, 2, 1, 128, 7)
RIGLLM_GEMV_Q8_PIPELINED(1, r4_u1, 4, 1, 128, 4)
RIGLLM_GEMV_Q8_PIPELINED(2, r2_u1, 2, 1, 128, 6)
RIGLLM_GEMV_Q8_PIPELINED(2, r4_u1, 4, 1, 128, 4)
RIGLLM_GEMV_Q8_PIPELINED(3, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(4, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(4, r4_u1, 4, 1, 128, 3)
RIGLLM_GEMV_Q8_PIPELINED(5, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(6, r2_u1, 2, 1, 128, 5)
RIGLLM_GEMV_Q8_PIPELINED(7, r2_u1, 2, 1, 128, 4)
RIGLLM_GEMV_Q8_PIPELINED(8, r2_u1, 2, 1, 128, 4)
RIGLLM_GEMV_Q8_PIPELINED(8, r4_u1, 4, 1, 128, 3)
