// DP4A GEMV: K-quant weights (Q4_K, Q5_K, Q6_K; layouts in kquant.cuh) x Q8_1 activations, T = 1..8 tokens.
//
//     y[t][row] = sum_k W[row][k] * x[t][k]      (optionally y = residual + W x)
//
// The same launch interface and output contract as gemv_q8.cu, so the host picks the kernel by weight type:
// weights w (one buffer in the type's device layout), activations xq int8 [T][K] and xd fp32 [T][K/32] from
// quantize_q8_1 or a fused epilogue, fp32 output split into up to four stacked segments (end0..end2) each
// written as its own [T][end_s - start_s] matrix at y + T * start_s, residual (nullable, may alias y).
//
// Work split: a warp owns R consecutive rows; lane l takes units l, l + 32, ... of each row, a unit being one
// slice (16 bytes of 4-bit payload = 32 values, kquant.cuh) or, in the _p2 variants, two neighbouring slices,
// which share their block header, activation blocks, d and mins: the pair decodes the header once and folds
// both slices' integer dot products before any float work (on the H200 the single-slice loop issues about 77
// instructions per slice and row, which makes the GEMV instruction-bound there). U units per lane per row are
// loaded before any is decoded (U * R * P independent payload loads in flight). Each decoded slice meets all T
// activation rows (read from L1/L2), so a T-token launch reads the weights once; the per-block activation sums
// that the Q4_K/Q5_K minimums need are computed once per unit and token and shared by the R rows. A warp-shuffle reduction ends each row; no shared memory. Warps stride
// over row groups (grid-stride): any grid size is correct.
#include "kquant.cuh"
#include "matmul_store.cuh"

template <int TYPE, int T, int R, int U, int P>
__device__ __forceinline__ void gemv_kq_body(const unsigned char* __restrict__ w, const signed char* __restrict__ xq,
                                             const float* __restrict__ xd, float* y, const float* residual, int rows,
                                             int K, int end0, int end1, int end2) {
    static_assert(P == 1 || P == 2, "a lane takes one slice or a pair of neighbouring slices at a time");
    using Q = rigllm::KQuant<TYPE>;
    const int lane = threadIdx.x & 31;
    const int warps_per_block = blockDim.x >> 5;
    const int n_units = (K >> 5) / P;  // slices (P = 1) or slice pairs (P = 2) per row; K % 256 == 0
    const int n_xblocks = K >> 5;      // Q8_1 blocks per activation row
    const long long group_stride = (long long)gridDim.x * warps_per_block;
    const int4* x16 = reinterpret_cast<const int4*>(xq);
    const int x16_row = K >> 4;  // 16-byte words per activation row

    for (long long group = (long long)blockIdx.x * warps_per_block + (threadIdx.x >> 5); group * R < rows;
         group += group_stride) {
        const int row0 = (int)(group * R);
        float acc[R][T];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int t = 0; t < T; ++t) acc[r][t] = 0.0f;

        for (int n0 = lane; n0 < n_units; n0 += 32 * U) {
            rigllm::KqRaw raw[U][R][P];
#pragma unroll
            for (int u = 0; u < U; ++u)
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        // rows past the end repeat the last one and are not stored; units past the end are skipped
                        if (n0 + 32 * u < n_units)
                            Q::load(w, rows, K, min(row0 + r, rows - 1), (n0 + 32 * u) * P + p, raw[u][r][p]);
                    }
#pragma unroll
            for (int u = 0; u < U; ++u) {
                const int g = (n0 + 32 * u) * P;  // the unit's first slice
                if (g >= n_units * P) continue;
                rigllm::KqSlice s[R][P];
#pragma unroll
                for (int r = 0; r < R; ++r)
#pragma unroll
                    for (int p = 0; p < P; ++p) Q::decode(raw[u][r][p], g + p, s[r][p]);
                const int b_lo = (g >> 1) << 1;       // activation block of the unit's lo lanes
                const int w_lo = 2 * b_lo + (g & 1);  // its first 16-byte word in an activation row
#pragma unroll
                for (int t = 0; t < T; ++t) {
                    // slice g + p meets words w_lo + p (block lo) and w_lo + 2 + p (block hi): a pair covers both
                    // blocks whole, with the same d, mins and (Q4_K, Q5_K) scales
                    int4 x_lo[P], x_hi[P];
                    float sum_lo = 0.0f, sum_hi = 0.0f;
#pragma unroll
                    for (int p = 0; p < P; ++p) {
                        x_lo[p] = __ldg(x16 + (size_t)t * x16_row + w_lo + p);
                        x_hi[p] = __ldg(x16 + (size_t)t * x16_row + w_lo + 2 + p);
                        if (Q::HAS_MIN) {
                            sum_lo += (float)rigllm::sum16(x_lo[p]);
                            sum_hi += (float)rigllm::sum16(x_hi[p]);
                        }
                    }
                    const float d_lo = __ldg(xd + (size_t)t * n_xblocks + b_lo);
                    const float d_hi = __ldg(xd + (size_t)t * n_xblocks + b_lo + 1);
#pragma unroll
                    for (int r = 0; r < R; ++r) {
                        int i_lo = 0, i_hi = 0;  // exact: below 2^24 in magnitude for every type (kquant.cuh)
#pragma unroll
                        for (int p = 0; p < P; ++p) {
                            i_lo += s[r][p].s_lo * rigllm::dot4(s[r][p].lo, x_lo[p]);
                            i_hi += s[r][p].s_hi * rigllm::dot4(s[r][p].hi, x_hi[p]);
                        }
                        float v_lo = s[r][0].d * (float)i_lo;
                        float v_hi = s[r][0].d * (float)i_hi;
                        if (Q::HAS_MIN) {
                            v_lo = fmaf(-s[r][0].m_lo, sum_lo, v_lo);
                            v_hi = fmaf(-s[r][0].m_hi, sum_hi, v_hi);
                        }
                        acc[r][t] = fmaf(d_lo, v_lo, fmaf(d_hi, v_hi, acc[r][t]));
                    }
                }
            }
        }

        rigllm::gemv_warp_store<R, T>(acc, row0, rows, end0, end1, end2, y, residual);
    }
}

// gemv_<type>_t<T>[_r<R>][_u<U>][_p2]: R rows per warp, U units in flight per lane, a unit one slice or (_p2) a pair
// of neighbouring slices, 128 threads, MIN_BLOCKS chosen as the largest that ptxas 12.9 fits without spills on
// sm_70. engine/cuda/kq_weight.py mirrors every (name, R, THREADS) line (a unit test checks it) and names the
// variant per (type, T, matrix rows); the K-quant sweep of `rigllm bench` times the variants.
#define RIGLLM_GEMV_KQ_KERNEL(NAME, TYPE, T, R, U, P, THREADS, MIN_BLOCKS)                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                                             \
        NAME(const unsigned char* __restrict__ w, const signed char* __restrict__ xq, const float* __restrict__ xd, \
             float* y, const float* residual, int rows, int K, int end0, int end1, int end2) {                      \
        gemv_kq_body<TYPE, T, R, U, P>(w, xq, xd, y, residual, rows, K, end0, end1, end2);                         \
    }
// Per type: MIN_BLOCKS of (t1, t1_r1_u2, t1_r1_u4, t1_r4_u1, t1_r4_u2, t1_r1_p2, t1_p2, t1_r4_p2, t2-t3, t4-t6,
// t7-t8). Q6_K reads four arrays (more address registers) and Q5_K two extra words per slice, so they fit fewer
// blocks than Q4_K at the same shape.
#define RIGLLM_GEMV_KQ_TYPE(TNAME, TYPE, M1, M1A, M1B, M1C, M1D, M1E, M1F, M1G, M23, M46, M78)    \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1, TYPE, 1, 2, 2, 1, 128, M1)                              \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r1_u2, TYPE, 1, 1, 2, 1, 128, M1A)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r1_u4, TYPE, 1, 1, 4, 1, 128, M1B)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r4_u1, TYPE, 1, 4, 1, 1, 128, M1C)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r4_u2, TYPE, 1, 4, 2, 1, 128, M1D)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r1_p2, TYPE, 1, 1, 1, 2, 128, M1E)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_p2, TYPE, 1, 2, 1, 2, 128, M1F)                          \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t1_r4_p2, TYPE, 1, 4, 1, 2, 128, M1G)                       \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t2, TYPE, 2, 2, 1, 1, 128, M23)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t3, TYPE, 3, 2, 1, 1, 128, M23)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t4, TYPE, 4, 2, 1, 1, 128, M46)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t5, TYPE, 5, 2, 1, 1, 128, M46)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t6, TYPE, 6, 2, 1, 1, 128, M46)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t7, TYPE, 7, 2, 1, 1, 128, M78)                             \
    RIGLLM_GEMV_KQ_KERNEL(gemv_##TNAME##_t8, TYPE, 8, 2, 1, 1, 128, M78)

RIGLLM_GEMV_KQ_TYPE(q4_k, RIGLLM_Q4_K, 6, 8, 6, 6, 4, 8, 6, 4, 8, 6, 4)
RIGLLM_GEMV_KQ_TYPE(q5_k, RIGLLM_Q5_K, 5, 8, 6, 6, 3, 8, 5, 3, 8, 6, 4)
RIGLLM_GEMV_KQ_TYPE(q6_k, RIGLLM_Q6_K, 6, 8, 6, 5, 4, 8, 5, 3, 5, 5, 4)
