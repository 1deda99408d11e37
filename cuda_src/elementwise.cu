// Elementwise kernels between GEMVs: the SwiGLU product, fused with the Q8_1 quantisation that the
// down projection's input needs. fp32 in and out; the nonlinearity uses the reference's overflow-free
// form (engine/reference/activations.py) with accurate expf. (Residual adds need no kernel here: the
// GEMV and GEMM epilogues add them.) Also the one row copy whose source row is data: the MTP head's last row.
#include "activations.cuh"
#include "q8_1_warp.cuh"

// h = silu(gate) * up for n_rows rows of width n (a multiple of 32), one warp per 32-value block:
// gate and up rows start every `in_stride` floats (separate [T][n] buffers: n; one stacked
// gate+up GEMV output [T][2n]: 2n, with up = gate + n). Output rows are dense: `y` [T][n] fp32
// and/or Q8_1 `yq` [T][n], `yd` [T][n/32]; either may be null. Grid: enough blocks of any multiple of
// 32 threads to cover n_rows * n / 32 warps. prefetch, prefetch_bytes: the down projection's leading weight bytes
// (common.cuh prefetch_l2; null for none), prefetched by blocks of their own: grid (blocks, 1, 1 + extra),
// common.cuh prefetch_part.
extern "C" __global__ void swiglu_q8_1(const float* __restrict__ gate, const float* __restrict__ up, int in_stride,
                                       int n, int n_rows, float* __restrict__ y, signed char* __restrict__ yq,
                                       float* __restrict__ yd, const char* prefetch, long long prefetch_bytes) {
    if (rigllm::prefetch_part(prefetch, prefetch_bytes)) return;
    const int blocks_per_row = n >> 5;
    const long long warp_id = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    if (warp_id >= (long long)n_rows * blocks_per_row) return;  // whole warps leave together
    const int row = (int)(warp_id / blocks_per_row);
    const int i = (int)(warp_id - (long long)row * blocks_per_row) * 32 + (threadIdx.x & 31);
    const size_t in = (size_t)row * in_stride + i;
    const float h = rigllm::silu(gate[in]) * up[in];
    const size_t out = (size_t)row * n + i;
    if (y != nullptr) y[out] = h;
    if (yq != nullptr) q8_1_quantize_warp(h, yq + out, yd + out / 32);
}

// dst[0, width) = row min(step[RIGLLM_STEP_N_TOKENS], rows) - 1 of `src` [rows][width] fp32: the last real row of a
// launch that runs `rows` rows while its step record counts fewer (the MTP head's draft call for several slots pads
// each slot's owed rows to a fixed count, engine/cuda/mtp.py), picked on the card so that one captured graph serves
// every owed-row count. The count is clamped to [1, rows]: a bad record copies a row of `src`, never past it.
// Grid: enough blocks of any size to cover `width`.
extern "C" __global__ void copy_last_step_row(const float* __restrict__ src, int width, int rows,
                                              const int* __restrict__ step, float* __restrict__ dst) {
    const int last = min(max(step[RIGLLM_STEP_N_TOKENS], 1), rows) - 1;
    const float* row = src + (size_t)last * width;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < width; i += gridDim.x * blockDim.x) dst[i] = row[i];
}
