// RMSNorm of fp32 rows, fused with the Q8_1 quantisation that every GEMV input needs, and the attention
// prep: per-head q/k RMSNorm, partial NEOX IMROPE, KV append.
//
// Numerics follow engine/reference/{norms,rope}.py operation by operation, in fp32: the sum of
// squares is the only value computed in a different order (a tree instead of numpy's pairwise sum),
// so results agree to a few ulp. RoPE products use __fmul_rn so the compiler cannot contract
// `x1*cos - x2*sin` into an FMA that numpy does not do.
#include <cuda_fp16.h>
#include "q8_1_warp.cuh"

// Sum of `v` over the whole block (blockDim.x a multiple of 32, at most 1024); every thread gets the
// same total because every warp reduces the same 32 partials in the same order. `scratch` holds 32
// floats of shared memory; the leading barrier lets one scratch serve consecutive calls.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
    v = rigllm::warp_sum(v);
    const int lane = threadIdx.x & 31;
    __syncthreads();
    if (lane == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    v = lane < (int)(blockDim.x >> 5) ? scratch[lane] : 0.f;
    return rigllm::warp_sum(v);
}

// 1/sqrt(mean + eps) exactly as the reference: fp32 mean, fp32 sqrt, fp32 division (NVRTC's default
// -prec-sqrt/-prec-div give the correctly rounded results numpy gives).
__device__ __forceinline__ float rms_inverse(float sum_sq, int n, float eps) {
    return 1.0f / sqrtf(sum_sq / (float)n + eps);
}

// One row per block: v = x / rms(x) * w, written as fp32 to `y` and/or as Q8_1 to `xq`/`xd` (either
// may be null). Every norm of the model feeds a GEMV, hence the fused quantisation; `y` serves the
// fp32 kernels (F32 ssm_alpha/ssm_beta) and debugging. The residual add that precedes each norm lives
// in the epilogue of the GEMV/GEMM that produces the mixer or FFN output. Row strides: `in_stride`
// for x, `out_stride` for y and xq (xd uses out_stride/32), so two norms can fill the halves of one
// row (the MTP block's concatenated input). Quantising requires n and out_stride to be multiples of
// 32. Any block size that is a multiple of 32 works; use 1024 for a single row (decode), 256 for many.
// grid (T, S): S > 1 splits each row's output between S blocks (see the loop), the same bits either way.
// prefetch, prefetch_bytes: the leading weight bytes of the GEMV that reads the output (common.cuh prefetch_l2;
// null for none), prefetched by blocks of their own: grid (T, S, 1 + extra), common.cuh prefetch_part.
extern "C" __global__ void rmsnorm_q8_1(const float* __restrict__ x, int in_stride, const float* __restrict__ w,
                                        int n, float eps, float* __restrict__ y, signed char* __restrict__ xq,
                                        float* __restrict__ xd, int out_stride, const char* prefetch,
                                        long long prefetch_bytes) {
    if (rigllm::prefetch_part(prefetch, prefetch_bytes)) return;
    __shared__ float scratch[32];
    const float* xr = x + (size_t)blockIdx.x * in_stride;
    const size_t out_row = (size_t)blockIdx.x * out_stride;
    const int lane = threadIdx.x & 31;
    const int n_blocks = (n + 31) >> 5;
    // gridDim.y blocks may share a row (decode: one row is too little work for one block): each computes
    // the same sum of squares in the same order, then writes every gridDim.y-th warp's share of the row.
    const int warps = blockDim.x >> 5;
    const int first = (threadIdx.x >> 5) + blockIdx.y * warps;  // this warp's first 32-block
    // Its x and w are loaded before the reduction, so their latency overlaps it instead of following it: in a decode
    // norm each warp writes one 32-block, which then waits for one memory round trip instead of two in a row.
    const int i0 = first * 32 + lane;
    const float x0 = first < n_blocks && i0 < n ? xr[i0] : 0.f;
    const float w0 = first < n_blocks && i0 < n ? w[i0] : 0.f;
    float sum_sq = 0.f;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum_sq += xr[i] * xr[i];
    const float inv = rms_inverse(block_sum(sum_sq, scratch), n, eps);

    for (int b = first; b < n_blocks; b += warps * gridDim.y) {  // a warp per 32-block
        const int i = b * 32 + lane;
        const float v = i >= n ? 0.f : b == first ? (x0 * inv) * w0 : (xr[i] * inv) * w[i];
        if (y != nullptr && i < n) y[out_row + i] = v;
        if (xq != nullptr) q8_1_quantize_warp(v, xq + out_row + i, xd + out_row / 32 + b);
    }
}

// Rotation of element d (< rope_dims) of a head whose normalised values are in `xs` (shared): NEOX
// pairs (j, j + R/2); pair j takes its position from component sel(j) of IMROPE (spec §6.6):
// h if j%3==1 and j < 3*sec_h, w if j%3==2 and j < 3*sec_w, t otherwise (so the t section's size is
// not needed, as in engine/reference/rope.py). `pos3` points at the token's (t, h, w) positions, or is
// null for text, where all three equal `text_pos`.
__device__ __forceinline__ float rope_rotate(const float* xs, int d, int rope_dims, int sec_h, int sec_w,
                                             const float* __restrict__ inv_freq, const int* pos3, int text_pos) {
    const int half = rope_dims >> 1;
    const int j = d < half ? d : d - half;
    const int comp = (j % 3 == 1 && j < 3 * sec_h) ? 1 : (j % 3 == 2 && j < 3 * sec_w) ? 2 : 0;
    const int p = pos3 != nullptr ? pos3[comp] : text_pos;
    const float theta = __fmul_rn((float)p, inv_freq[j]);
    float s, c;
    sincosf(theta, &s, &c);
    return d < half ? __fmul_rn(xs[d], c) - __fmul_rn(xs[d + half], s)
                    : __fmul_rn(xs[d], c) + __fmul_rn(xs[d - half], s);
}

// Attention prep for T tokens in one launch, one block of head_dim threads (a multiple of 32, at most
// 1024) per (token, head): grid = T * (n_head + n_head_kv), blocks [0, n_head) of a token are its
// query heads, the rest its KV heads.
//   qg [T][qg_stride]   GEMV output; query head h reads qg[h*2*Dh, h*2*Dh + Dh) (spec pitfall 4: the
//                       gate half that follows it is read later by attn_merge_gate, not copied here)
//   k, v [T][*_stride]  GEMV outputs, KV head j at [j*Dh, (j+1)*Dh)
//   q_norm, k_norm [Dh] (GGUF weights, +1 included); inv_freq [rope_dims/2] fp32, computed on the host
//                       exactly as the reference's Rope.inv_freq so angles match it bit for bit
//   positions [T][3]    (t, h, w) rope positions, or null for text: pos + t for all three
//   step                per-step values; step[RIGLLM_STEP_POS] = cache index of the first new token
// Output: q_out [T][n_head][Dh] fp32 (normed and rotated, unscaled); K (normed, rotated) and V as
// fp16 into k_cache/v_cache [n_head_kv][capacity][Dh] at cache rows pos..pos+T-1 (rows beyond the
// capacity are dropped; the planner sizes the cache so that never happens). With stage_rows > 0 the
// rows go instead to a staging buffer [n_head_kv][stage_rows][Dh] at rows 0..T-1, which kv_encode
// then writes into a quantised cache (kv_cache.cu).
// Slot-indexed (row_slot not null, common.cuh; issue 28): token t is the one new token of slot row_slot[t],
// at that slot's step record, rope positions `positions + 3 * slot` ([slot][3]) and fp16 cache (slot_ptrs
// entries 0 and 2; unused when staging).
// prefetch, prefetch_bytes: the output projection's leading weight bytes (common.cuh prefetch_l2; null for none),
// prefetched by blocks of their own: grid (T * (n_head + n_head_kv), 1, 1 + extra), common.cuh prefetch_part.
extern "C" __global__ void attn_prep(const float* __restrict__ qg, int qg_stride,
                                     const float* __restrict__ k, int k_stride,
                                     const float* __restrict__ v, int v_stride,
                                     const float* __restrict__ q_norm, const float* __restrict__ k_norm,
                                     const float* __restrict__ inv_freq, const int* __restrict__ positions,
                                     const int* __restrict__ step, const int* __restrict__ row_slot,
                                     const unsigned long long* __restrict__ slot_ptrs, float* __restrict__ q_out,
                                     __half* __restrict__ k_cache, __half* __restrict__ v_cache,
                                     int n_head, int n_head_kv, int rope_dims, int sec_h, int sec_w,
                                     int capacity, float eps, int stage_rows, const char* prefetch,
                                     long long prefetch_bytes) {
    if (rigllm::prefetch_part(prefetch, prefetch_bytes)) return;
    __shared__ float scratch[32];
    __shared__ float xs[1024];
    const int head_dim = blockDim.x;
    const int d = threadIdx.x;
    const int heads = n_head + n_head_kv;
    const int t = blockIdx.x / heads;
    const int j = blockIdx.x - t * heads;
    const bool is_q = j < n_head;
    const int kv_head = j - n_head;

    float x = is_q ? qg[(size_t)t * qg_stride + (size_t)j * 2 * head_dim + d]
                   : k[(size_t)t * k_stride + (size_t)kv_head * head_dim + d];
    const float inv = rms_inverse(block_sum(x * x, scratch), head_dim, eps);
    x = (x * inv) * (is_q ? q_norm : k_norm)[d];
    xs[d] = x;
    __syncthreads();
    // the token's cache row and rope positions: the sequence's t-th new token, or its slot's only one
    const int ahead = row_slot != nullptr ? 0 : t;
    const int pos = rigllm::slot_step(step, row_slot, t)[RIGLLM_STEP_POS] + ahead;
    const int* tpos = positions == nullptr ? nullptr : positions + 3 * (row_slot != nullptr ? row_slot[t] : t);
    if (d < rope_dims) x = rope_rotate(xs, d, rope_dims, sec_h, sec_w, inv_freq, tpos, pos);
    if (is_q) {
        q_out[((size_t)t * n_head + j) * head_dim + d] = x;
        return;
    }
    const int row = stage_rows > 0 ? t : pos;
    const int rows = stage_rows > 0 ? stage_rows : capacity;
    if (row_slot != nullptr && stage_rows == 0) {
        k_cache = rigllm::slot_ptr<__half>(slot_ptrs, row_slot, t, RIGLLM_KV_SLOT_PTRS, 0);
        v_cache = rigllm::slot_ptr<__half>(slot_ptrs, row_slot, t, RIGLLM_KV_SLOT_PTRS, 2);
    }
    if (row < rows) {
        const size_t off = ((size_t)kv_head * rows + row) * head_dim + d;
        k_cache[off] = __float2half_rn(x);
        v_cache[off] = __float2half_rn(v[(size_t)t * v_stride + (size_t)kv_head * head_dim + d]);
    }
}
