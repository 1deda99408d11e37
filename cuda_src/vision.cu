// The Qwen3.5 vision tower (spec §9.4) on fp16 HFMA2: patchify, position embeddings, LayerNorm, the 2D
// rotary, bidirectional attention, GEMMs with fused epilogues. No tensor cores (contracts.md): matmul
// products run as __hfma2 on half2 pairs along K, flushed into fp32 accumulators every 16 products so
// the fp16 partial sums stay short; the residual stream, softmax statistics and attention outputs are
// fp32 until they feed the next GEMM as fp16. Host side: engine/cuda/vision.py; the numpy reference is
// engine/vision/tower.py, and every kernel mirrors one of its steps.
//
// Layouts: activations are row-major [patches][width] in merge order (2×2 blocks row-major, each block
// TL, TR, BL, BR), so the merger's 4-row groups are contiguous; weights are [out][in] fp16 (torch order).
#include <cuda_fp16.h>

#include "common.cuh"

#define VIT_TILE 64        // GEMM tile: 64 rows × 64 columns per block
#define VIT_TK 32          // K per shared-memory stage (16 half2)
#define VIT_THREADS 256    // 16 × 16 threads, each 4 × 4 outputs
#define VIT_FLUSH 8        // half2 steps (16 products) accumulated in fp16 before adding to fp32
#define VIT_ATT_Q 64       // queries per attention block (one per thread)
#define VIT_ATT_KEYS 64    // keys per shared-memory stage

#define VIT_EPI_STORE 0      // float out = acc + bias
#define VIT_EPI_RESIDUAL 1   // float out += acc + bias
#define VIT_EPI_GELU_TANH 2  // half out = gelu_tanh(acc + bias)   (tower MLP)
#define VIT_EPI_GELU_ERF 3   // half out = gelu_erf(acc + bias)    (merger MLP)

namespace {

// Row and column in the gh × gw patch grid of the patch at merge-order index `idx`.
__device__ __forceinline__ void merge_coords(int idx, int gw, int merge, int& row, int& col) {
    const int per_block = merge * merge;
    const int block = idx / per_block;
    const int within = idx - block * per_block;
    const int blocks_w = gw / merge;
    const int block_row = block / blocks_w;
    row = block_row * merge + within / merge;
    col = (block - block_row * blocks_w) * merge + within % merge;
}

__device__ __forceinline__ float gelu_tanh(float x) {
    const float c = 0.7978845608028654f;  // sqrt(2/pi)
    return 0.5f * x * (1.0f + tanhf(c * (x + 0.044715f * x * x * x)));
}

__device__ __forceinline__ float gelu_erf(float x) { return 0.5f * x * (1.0f + erff(x * 0.7071067811865476f)); }

}  // namespace

// Normalised pixels fp16 [3][height][width] → patch rows fp16 [gh·gw][3·p·p] in merge order, each row in
// (channel, y, x) order like the Conv3d kernel's input. Grid-stride over all output values.
extern "C" __global__ void vit_patchify(const __half* __restrict__ pixels, int height, int width, int patch, int merge,
                                        __half* __restrict__ out) {
    const int gw = width / patch;
    const int per_patch = 3 * patch * patch;
    const long long total = (long long)(height / patch) * gw * per_patch;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int idx = (int)(i / per_patch);
        int r = (int)(i - (long long)idx * per_patch);
        const int c = r / (patch * patch);
        r -= c * patch * patch;
        const int py = r / patch;
        const int px = r - py * patch;
        int row, col;
        merge_coords(idx, gw, merge, row, col);
        out[i] = pixels[((size_t)c * height + (size_t)row * patch + py) * width + (size_t)col * patch + px];
    }
}

// x[p][e] += the side × side learned grid sampled bilinearly (align_corners) at patch p's (row, col), the
// float32 arithmetic of transformers' interpolation. Grid-stride over gh·gw·width values.
extern "C" __global__ void vit_pos_embed_add(float* __restrict__ x, const float* __restrict__ table, int side, int gh,
                                             int gw, int merge, int width) {
    const long long total = (long long)gh * gw * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int idx = (int)(i / width);
        const int e = (int)(i - (long long)idx * width);
        int row, col;
        merge_coords(idx, gw, merge, row, col);
        const float sy = (float)row * (float)(side - 1) / (float)max(gh - 1, 1);
        const float sx = (float)col * (float)(side - 1) / (float)max(gw - 1, 1);
        const float fy0 = floorf(sy), fx0 = floorf(sx);
        const float fy = sy - fy0, fx = sx - fx0;
        const int y0 = min(max((int)fy0, 0), side - 1), y1 = min(max((int)fy0 + 1, 0), side - 1);
        const int x0 = min(max((int)fx0, 0), side - 1), x1 = min(max((int)fx0 + 1, 0), side - 1);
        const float v = table[((size_t)y0 * side + x0) * width + e] * ((1.0f - fy) * (1.0f - fx)) +
                        table[((size_t)y0 * side + x1) * width + e] * ((1.0f - fy) * fx) +
                        table[((size_t)y1 * side + x0) * width + e] * (fy * (1.0f - fx)) +
                        table[((size_t)y1 * side + x1) * width + e] * (fy * fx);
        x[i] += v;
    }
}

// y = LayerNorm(x)·w + b per row, fp32 in, fp16 out (the next GEMM's input). One warp per row; any
// width; grid: enough blocks of a multiple of 32 threads to cover n_rows warps.
extern "C" __global__ void vit_layernorm_f16(const float* __restrict__ x, const float* __restrict__ w,
                                             const float* __restrict__ b, __half* __restrict__ y, int n_rows,
                                             int width, float eps) {
    const long long warp = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (warp >= n_rows) return;  // whole warps leave together
    const float* row = x + (size_t)warp * width;
    float s = 0.0f;
    for (int i = lane; i < width; i += 32) s += row[i];
    const float mean = rigllm::warp_sum(s) / (float)width;
    float v = 0.0f;
    for (int i = lane; i < width; i += 32) {
        const float d = row[i] - mean;
        v += d * d;
    }
    const float inv = 1.0f / sqrtf(rigllm::warp_sum(v) / (float)width + eps);
    __half* out = y + (size_t)warp * width;
    for (int i = lane; i < width; i += 32) out[i] = __float2half((row[i] - mean) * inv * w[i] + b[i]);
}

// out[M][N] (epilogue `mode`, see VIT_EPI_*) from A fp16 [M][K] and W fp16 [N][K] (K even), fp32 bias [N].
// Grid: (ceil(N/64), ceil(M/64)), VIT_THREADS threads. Edges are zero-filled, so any M, N and even K work.
extern "C" __global__ void __launch_bounds__(VIT_THREADS)
    vit_gemm_f16(const __half* __restrict__ A, const __half* __restrict__ W, const float* __restrict__ bias,
                 void* __restrict__ out, int M, int N, int K, int mode) {
    __shared__ __half2 As[VIT_TK / 2][VIT_TILE + 1];  // +1: the tile loads write along k without bank conflicts
    __shared__ __half2 Ws[VIT_TK / 2][VIT_TILE + 1];
    const int tx = threadIdx.x & 15, ty = threadIdx.x >> 4;
    const int row0 = blockIdx.y * VIT_TILE, col0 = blockIdx.x * VIT_TILE;
    const __half2 zero = __float2half2_rn(0.0f);
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;

    for (int k0 = 0; k0 < K; k0 += VIT_TK) {
#pragma unroll
        for (int s = 0; s < (VIT_TILE * VIT_TK / 2) / VIT_THREADS; ++s) {
            const int e = threadIdx.x + s * VIT_THREADS;
            const int r = e / (VIT_TK / 2), kp = e % (VIT_TK / 2);
            const int k = k0 + 2 * kp;
            const bool k_in = k < K;
            As[kp][r] = (k_in && row0 + r < M) ? *reinterpret_cast<const __half2*>(A + (size_t)(row0 + r) * K + k) : zero;
            Ws[kp][r] = (k_in && col0 + r < N) ? *reinterpret_cast<const __half2*>(W + (size_t)(col0 + r) * K + k) : zero;
        }
        __syncthreads();
#pragma unroll
        for (int part = 0; part < VIT_TK / 2; part += VIT_FLUSH) {
            __half2 h[4][4];
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) h[i][j] = zero;
#pragma unroll
            for (int kk = part; kk < part + VIT_FLUSH; ++kk) {
                __half2 a[4], w[4];
#pragma unroll
                for (int i = 0; i < 4; ++i) a[i] = As[kk][ty + 16 * i];
#pragma unroll
                for (int j = 0; j < 4; ++j) w[j] = Ws[kk][tx + 16 * j];
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) h[i][j] = __hfma2(a[i], w[j], h[i][j]);
            }
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) acc[i][j] += __low2float(h[i][j]) + __high2float(h[i][j]);
        }
        __syncthreads();
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = row0 + ty + 16 * i;
        if (r >= M) continue;
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            const int c = col0 + tx + 16 * j;
            if (c >= N) continue;
            const float v = acc[i][j] + bias[c];
            const size_t o = (size_t)r * N + c;
            if (mode == VIT_EPI_STORE) {
                static_cast<float*>(out)[o] = v;
            } else if (mode == VIT_EPI_RESIDUAL) {
                static_cast<float*>(out)[o] += v;
            } else if (mode == VIT_EPI_GELU_TANH) {
                static_cast<__half*>(out)[o] = __float2half(gelu_tanh(v));
            } else {
                static_cast<__half*>(out)[o] = __float2half(gelu_erf(v));
            }
        }
    }
}

// Split the fused QKV projection (fp32 [n][3·heads·hd], q | k | v, each head-major) into fp16 q, k, v
// [heads][n][hd], rotating q and k with the 2D rotary: pair (d, d + hd/2); the first hd/4 pairs turn with
// the patch row, the rest with the column, at 10000^(−2f/(hd/2)) for f = pair mod hd/4 (fp32 angles, as
// transformers). Grid-stride over n·heads·hd values.
extern "C" __global__ void vit_qkv_rope(const float* __restrict__ qkv, int n, int heads, int hd, int gw, int merge,
                                        __half* __restrict__ q, __half* __restrict__ k, __half* __restrict__ v) {
    const int width = heads * hd;
    const int half = hd / 2, quarter = hd / 4;
    const long long total = (long long)n * width;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < total; i += (long long)gridDim.x * blockDim.x) {
        const int p = (int)(i / width);
        const int r = (int)(i - (long long)p * width);
        const int h = r / hd, d = r - h * hd;
        int row, col;
        merge_coords(p, gw, merge, row, col);
        const int pair = d % half;
        const int f = pair % quarter;
        const float inv_freq = 1.0f / powf(10000.0f, (float)(2 * f) / (float)half);
        const float angle = (float)(pair < quarter ? row : col) * inv_freq;
        const float c = cosf(angle), s = sinf(angle);
        const float* base = qkv + (size_t)p * 3 * width + h * hd;
        const int partner = d < half ? d + half : d - half;
        const float sign = d < half ? -1.0f : 1.0f;
        const size_t o = ((size_t)h * n + p) * hd + d;
        q[o] = __float2half(base[d] * c + sign * base[partner] * s);
        k[o] = __float2half(base[width + d] * c + sign * base[width + partner] * s);
        v[o] = __float2half(base[2 * width + d]);
    }
}

// Bidirectional attention within one image, flash style: one thread per query, keys streamed through
// shared memory, online softmax in fp32. q, k, v fp16 [heads][n][HD]; out fp16 [n][heads·HD].
// Scores: HFMA2 dot over half2 pairs, flushed to fp32 every 16 products, then × scale.
// Grid: (ceil(n / VIT_ATT_Q), heads), VIT_ATT_Q threads.
template <int HD>
__device__ __forceinline__ void vit_attention(const __half* __restrict__ q, const __half* __restrict__ k,
                                              const __half* __restrict__ v, __half* __restrict__ out, int n, int heads,
                                              float scale) {
    static_assert(HD % 2 == 0, "head size must be even");
    constexpr int HD2 = HD / 2;
    __shared__ __half2 Ks[VIT_ATT_KEYS][HD2];
    __shared__ __half2 Vs[VIT_ATT_KEYS][HD2];
    const int h = blockIdx.y;
    const int query = blockIdx.x * VIT_ATT_Q + threadIdx.x;
    const bool active = query < n;
    const __half2* q2 = reinterpret_cast<const __half2*>(q + ((size_t)h * n + (active ? query : 0)) * HD);
    const __half2* k2 = reinterpret_cast<const __half2*>(k + (size_t)h * n * HD);
    const __half2* v2 = reinterpret_cast<const __half2*>(v + (size_t)h * n * HD);
    __half2 qh[HD2];
#pragma unroll
    for (int d = 0; d < HD2; ++d) qh[d] = q2[d];
    float o[HD];
#pragma unroll
    for (int d = 0; d < HD; ++d) o[d] = 0.0f;
    float m = __int_as_float(0xff800000), l = 0.0f;  // -inf
    const __half2 zero = __float2half2_rn(0.0f);

    for (int key0 = 0; key0 < n; key0 += VIT_ATT_KEYS) {
        const int keys = min(VIT_ATT_KEYS, n - key0);
        for (int e = threadIdx.x; e < keys * HD2; e += VIT_ATT_Q) {
            const int j = e / HD2, d = e - (e / HD2) * HD2;
            Ks[j][d] = k2[(size_t)(key0 + j) * HD2 + d];
            Vs[j][d] = v2[(size_t)(key0 + j) * HD2 + d];
        }
        __syncthreads();
        if (active) {
            for (int j = 0; j < keys; ++j) {
                float s = 0.0f;
#pragma unroll
                for (int d0 = 0; d0 < HD2; d0 += VIT_FLUSH) {
                    __half2 acc = zero;
#pragma unroll
                    for (int d = d0; d < d0 + VIT_FLUSH && d < HD2; ++d) acc = __hfma2(qh[d], Ks[j][d], acc);
                    s += __low2float(acc) + __high2float(acc);
                }
                s *= scale;
                if (s > m) {
                    const float correction = expf(m - s);  // 0 on the first key (m = -inf)
                    l *= correction;
#pragma unroll
                    for (int d = 0; d < HD; ++d) o[d] *= correction;
                    m = s;
                }
                const float p = expf(s - m);
                l += p;
#pragma unroll
                for (int d = 0; d < HD2; ++d) {
                    const float2 vf = __half22float2(Vs[j][d]);
                    o[2 * d] += p * vf.x;
                    o[2 * d + 1] += p * vf.y;
                }
            }
        }
        __syncthreads();
    }
    if (!active) return;
    const float inv = 1.0f / l;
    __half* dst = out + (size_t)query * heads * HD + (size_t)h * HD;
#pragma unroll
    for (int d = 0; d < HD; ++d) dst[d] = __float2half(o[d] * inv);
}

// One entry point per supported head size: 16 (the tiny test tower), 64 (4B), 72 (9B and 27B).
#define VIT_ATTENTION_ENTRY(HD)                                                                                       \
    extern "C" __global__ void __launch_bounds__(VIT_ATT_Q)                                                           \
        vit_attention_d##HD(const __half* __restrict__ q, const __half* __restrict__ k, const __half* __restrict__ v, \
                            __half* __restrict__ out, int n, int heads, float scale) {                                \
        vit_attention<HD>(q, k, v, out, n, heads, scale);                                                             \
    }
VIT_ATTENTION_ENTRY(16)
VIT_ATTENTION_ENTRY(64)
VIT_ATTENTION_ENTRY(72)
