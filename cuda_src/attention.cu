// Gated full attention over the fp16 KV cache (spec §6.5): flash decode (one new token), flash prefill
// (any number of new tokens, causal: prompt chunks and speculative-verify batches alike), both split
// over the context with fp32 partials, and one merge kernel that combines the partials and applies the
// sigmoid output gate (optionally quantising the result to Q8_1 for the out-projection GEMV).
//
// Layouts (shared with norm_rope.cu's attn_prep, which writes q and the cache):
//   q        [T][n_head][Dh] fp32, normed and rotated, not scaled
//   caches   [n_head_kv][capacity][Dh] fp16 per layer; the T new tokens are already at rows pos..pos+T-1
//   partials part_m/part_l [T*n_head][n_splits], part_o [T*n_head][n_splits][Dh], fp32; a split holds
//            m = max score, l = sum exp(score - m), o = sum exp(score - m) * v over its keys, or
//            m = -inf, l = 0 (o not written) when it has no visible key
// Query head h reads KV head h / G, G = n_head / n_head_kv (HF repeat_kv). Token t of the batch sees
// cache rows [0, pos + t] (pos = step[RIGLLM_STEP_POS]). The context is cut into n_splits equal chunks
// (multiples of SPLIT_ALIGN keys) computed from the current length read on the device, so a launch
// with a fixed grid serves every length and can be captured in a CUDA graph; splits with nothing to
// do exit at once.
#include <cuda_fp16.h>
#include "activations.cuh"
#include "q8_1_warp.cuh"

#define ATTN_NEG_INF __int_as_float(0xff800000)  // -inf

constexpr int SPLIT_ALIGN = 64;

// Keys [*start, *end) of split `split` when kv_len keys are cut into n_splits aligned chunks.
__device__ __forceinline__ void split_range(int kv_len, int n_splits, int split, int* start, int* end) {
    int chunk = (kv_len + n_splits - 1) / n_splits;
    chunk = (chunk + SPLIT_ALIGN - 1) / SPLIT_ALIGN * SPLIT_ALIGN;
    *start = split * chunk;
    *end = min(*start + chunk, kv_len);
}

// N consecutive fp16 values (N = 1, 2, 4 or 8; 2N-byte aligned) as floats, in one load.
template <int N>
__device__ __forceinline__ void load_halves(const __half* __restrict__ p, float* out) {
    if constexpr (N == 8) {
        const uint4 raw = *reinterpret_cast<const uint4*>(p);
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const float2 f = __half22float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    } else if constexpr (N == 4) {
        const uint2 raw = *reinterpret_cast<const uint2*>(p);
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const float2 f = __half22float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    } else if constexpr (N == 2) {
        const float2 f = __half22float2(*reinterpret_cast<const __half2*>(p));
        out[0] = f.x;
        out[1] = f.y;
    } else {
        out[0] = __half2float(*p);
    }
}

// ---------------------------------------------------------------------------------------------
// Flash decode: one new token per query (a decode step, or each token of a few-token verify, see
// rigllm::decode_block). Block = (token, KV head, split), DECODE_WARPS warps; each warp walks
// its keys DECODE_KEYS at a time, one key row per warp (lane l holds dims [l*Dh/32, (l+1)*Dh/32), so
// a key row is one coalesced load), and keeps its own online softmax for all G query heads of the KV
// head: K and V are read once for the whole group. The warps' states are merged in shared memory and
// written as one partial per (query head, split). Templated on Dh and G so the per-lane q and
// output accumulators stay in registers.
constexpr int DECODE_WARPS = 4;
constexpr int DECODE_KEYS = 2;

template <int DH, int G>
__device__ __forceinline__ void attn_decode(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                            const __half* __restrict__ v_cache, const int* __restrict__ step,
                                            float* __restrict__ part_m, float* __restrict__ part_l,
                                            float* __restrict__ part_o, int capacity, int n_splits, float scale) {
    constexpr int DPL = DH / 32;  // dims per lane
    __shared__ float sh_m[DECODE_WARPS][G];
    __shared__ float sh_l[DECODE_WARPS][G];
    __shared__ float sh_o[DECODE_WARPS][G][DH];

    const rigllm::DecodeBlock blk = rigllm::decode_block(step, n_splits, G, capacity);
    const int kv_head = blk.kv_head;
    int start, end;
    split_range(blk.kv_len, n_splits, blk.split, &start, &end);
    const size_t first_row = blk.first_row;  // partial row of the block's first query head
    if (start >= end) {
        if (threadIdx.x < G) {
            part_m[first_row + threadIdx.x * n_splits] = ATTN_NEG_INF;
            part_l[first_row + threadIdx.x * n_splits] = 0.f;
        }
        return;
    }

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    float qr[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < DPL; ++i) qr[g][i] = q[(blk.q_row + g) * DH + lane * DPL + i] * scale;

    float m[G], l[G], o[G][DPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = ATTN_NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; ++i) o[g][i] = 0.f;
    }

    const size_t head_base = (size_t)kv_head * capacity * DH + lane * DPL;
    for (int base = start + warp * DECODE_KEYS; base < end; base += DECODE_WARPS * DECODE_KEYS) {
        float kf[DECODE_KEYS][DPL], vf[DECODE_KEYS][DPL];
#pragma unroll
        for (int kk = 0; kk < DECODE_KEYS; ++kk) {
            const int key = min(base + kk, end - 1);  // a clamped duplicate is masked below
            load_halves<DPL>(k_cache + head_base + (size_t)key * DH, kf[kk]);
            load_halves<DPL>(v_cache + head_base + (size_t)key * DH, vf[kk]);
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float s[DECODE_KEYS];
            float tile_max = ATTN_NEG_INF;
#pragma unroll
            for (int kk = 0; kk < DECODE_KEYS; ++kk) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < DPL; ++i) acc = fmaf(qr[g][i], kf[kk][i], acc);
                acc = rigllm::warp_sum(acc);
                s[kk] = base + kk < end ? acc : ATTN_NEG_INF;
                tile_max = fmaxf(tile_max, s[kk]);
            }
            const float m_new = fmaxf(m[g], tile_max);  // finite: key `base` is always valid
            const float corr = __expf(m[g] - m_new);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < DPL; ++i) o[g][i] *= corr;
#pragma unroll
            for (int kk = 0; kk < DECODE_KEYS; ++kk) {
                const float p = __expf(s[kk] - m_new);
                l[g] += p;
#pragma unroll
                for (int i = 0; i < DPL; ++i) o[g][i] = fmaf(p, vf[kk][i], o[g][i]);
            }
            m[g] = m_new;
        }
    }

    // Merge the warps: scale each warp's state to the block maximum and sum.
    if (lane == 0) {
#pragma unroll
        for (int g = 0; g < G; ++g) {
            sh_m[warp][g] = m[g];
            sh_l[warp][g] = l[g];
        }
    }
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < DPL; ++i) sh_o[warp][g][lane * DPL + i] = o[g][i];
    __syncthreads();
    for (int idx = threadIdx.x; idx < G * DH; idx += blockDim.x) {
        const int g = idx / DH;
        const int dim = idx - g * DH;
        float m_max = ATTN_NEG_INF;
#pragma unroll
        for (int w = 0; w < DECODE_WARPS; ++w) m_max = fmaxf(m_max, sh_m[w][g]);
        float acc = 0.f, l_sum = 0.f;
#pragma unroll
        for (int w = 0; w < DECODE_WARPS; ++w) {
            if (sh_m[w][g] == ATTN_NEG_INF) continue;  // a warp that had no key of this split
            const float f = __expf(sh_m[w][g] - m_max);
            acc = fmaf(f, sh_o[w][g][dim], acc);
            l_sum = fmaf(f, sh_l[w][g], l_sum);
        }
        const size_t row = first_row + (size_t)g * n_splits;
        part_o[row * DH + dim] = acc;
        if (dim == 0) {
            part_m[row] = m_max;
            part_l[row] = l_sum;
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Flash prefill: T new tokens, causal. Block = (query tile, KV head, split), PF_THREADS threads.
// A query tile is PF_BQ consecutive rows r = t*G + g of one KV head (all G heads of a token side by
// side); the block walks its split's keys PF_BK at a time:
//   S = Q·K^T   thread (ty, tx) owns rows ty*4..+3 and keys tx*4..+3 (a 4x4 register tile); Q and K
//               are staged through shared memory PF_DC dims at a time (fp32; K converted from fp16)
//   softmax     scale, causal mask (key > pos + t → -inf), online max/sum per row; the 16 threads
//               sharing a row are one half-warp, so row reductions are 4 shuffles; P goes to shared
//   O += P·V    V staged PF_VC keys at a time; the thread owns the same 4 rows and Dh/16 dims, in
//               float4 chunks strided by 64 floats so shared-memory reads are conflict-free
// Everything is fp32 FMA (no tensor cores, no fp16 arithmetic). Keys past the split, the causal
// limit or the batch are loaded as zeros so a garbage cache row can never turn a 0 weight into NaN.
constexpr int PF_THREADS = 256;
constexpr int PF_BQ = 64;
constexpr int PF_BK = 64;
constexpr int PF_DC = 32;
constexpr int PF_VC = 16;
constexpr int PF_LD = PF_BQ + 4;  // padded row of the transposed Q/K/P tiles (float4-aligned)

template <int DH>
__device__ __forceinline__ void attn_prefill(const float* __restrict__ q, const __half* __restrict__ k_cache,
                                             const __half* __restrict__ v_cache, const int* __restrict__ step,
                                             float* __restrict__ part_m, float* __restrict__ part_l,
                                             float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv,
                                             int capacity, int n_splits, float scale) {
    constexpr int DPT = DH / 16;            // output dims per thread
    constexpr int CW = DPT < 4 ? DPT : 4;   // dims per chunk (float4 or float2)
    constexpr int NCH = DPT / CW;           // chunks per thread, CW*16 floats apart
    static_assert(DH % 32 == 0 && DH <= 256, "head_dim must be a multiple of 32, at most 256");
    __shared__ __align__(16) float p_tile[PF_BK][PF_LD];
    __shared__ __align__(16) union {
        struct {
            float q[PF_DC][PF_LD];
            float k[PF_DC][PF_LD];
        } qk;
        float v[PF_VC][DH];
    } tile;

    const int group = n_head / n_head_kv;
    const int n_rows = n_tokens * group;
    const int n_qtiles = (n_rows + PF_BQ - 1) / PF_BQ;
    const int qtile = blockIdx.x % n_qtiles;
    const int kv_head = (blockIdx.x / n_qtiles) % n_head_kv;
    const int split = blockIdx.x / (n_qtiles * n_head_kv);
    const int pos = step[RIGLLM_STEP_POS];
    int k0, k1;
    split_range(min(pos + n_tokens, capacity), n_splits, split, &k0, &k1);
    const int r0 = qtile * PF_BQ;
    k1 = min(k1, pos + (min(r0 + PF_BQ, n_rows) - 1) / group + 1);  // no row of the tile sees further

    const int tid = threadIdx.x;
    const int tx = tid & 15;
    const int ty = tid >> 4;
    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = ATTN_NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < DPT; ++e) o[i][e] = 0.f;
    }

    // Staging role: row/key `ld_row` of the tile, dims [ld_dim, ld_dim + 8) of the current chunk.
    const int ld_row = tid & 63;
    const int ld_dim = (tid >> 6) * 8;
    const float* q_src = nullptr;
    if (r0 + ld_row < n_rows) {
        const int r = r0 + ld_row;
        q_src = q + ((size_t)(r / group) * n_head + kv_head * group + r % group) * DH + ld_dim;
    }
    const size_t head_base = (size_t)kv_head * capacity * DH;

    for (int kt = k0; kt < k1; kt += PF_BK) {
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) s[i][j] = 0.f;

        const int ld_key = kt + ld_row;
        for (int dc = 0; dc < DH; dc += PF_DC) {
            {
                float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
                if (q_src != nullptr) {
                    a = *reinterpret_cast<const float4*>(q_src + dc);
                    b = *reinterpret_cast<const float4*>(q_src + dc + 4);
                }
                const float qv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
                for (int e = 0; e < 8; ++e) tile.qk.q[ld_dim + e][ld_row] = qv[e];
            }
            {
                float kv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (ld_key < k1) load_halves<8>(k_cache + head_base + (size_t)ld_key * DH + dc + ld_dim, kv);
#pragma unroll
                for (int e = 0; e < 8; ++e) tile.qk.k[ld_dim + e][ld_row] = kv[e];
            }
            __syncthreads();
#pragma unroll 4
            for (int dd = 0; dd < PF_DC; ++dd) {
                const float4 a = *reinterpret_cast<const float4*>(&tile.qk.q[dd][ty * 4]);
                const float4 b = *reinterpret_cast<const float4*>(&tile.qk.k[dd][tx * 4]);
                const float av[4] = {a.x, a.y, a.z, a.w};
                const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int j = 0; j < 4; ++j) s[i][j] = fmaf(av[i], bv[j], s[i][j]);
            }
            __syncthreads();
        }

#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int r = r0 + ty * 4 + i;  // keys [0, limit) are visible to row r (none past the batch)
            const int limit = r < n_rows ? min(pos + r / group + 1, k1) : 0;
            float tile_max = ATTN_NEG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = kt + tx * 4 + j < limit ? s[i][j] * scale : ATTN_NEG_INF;
                tile_max = fmaxf(tile_max, s[i][j]);
            }
            tile_max = rigllm::group_max<16>(tile_max);  // the row's 16 threads are one aligned half-warp
            const float m_new = fmaxf(m[i], tile_max);
            const float m_ref = m_new == ATTN_NEG_INF ? 0.f : m_new;  // nothing visible yet: weights stay 0
            const float corr = __expf(m[i] - m_ref);
            float row_sum = 0.f;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                const float p = __expf(s[i][j] - m_ref);
                p_tile[tx * 4 + j][ty * 4 + i] = p;
                row_sum += p;
            }
#pragma unroll
            for (int off = 8; off > 0; off >>= 1) row_sum += __shfl_xor_sync(RIGLLM_FULL_MASK, row_sum, off);
            l[i] = fmaf(l[i], corr, row_sum);
#pragma unroll
            for (int e = 0; e < DPT; ++e) o[i][e] *= corr;
            m[i] = m_new;
        }

        for (int vc = 0; vc < PF_BK; vc += PF_VC) {
            __syncthreads();  // p_tile written / previous V chunk consumed
            for (int idx = tid; idx < PF_VC * DH / 8; idx += PF_THREADS) {
                const int c = idx / (DH / 8);
                const int dim = (idx - c * (DH / 8)) * 8;
                const int key = kt + vc + c;
                float vv[8];
#pragma unroll
                for (int e = 0; e < 8; ++e) vv[e] = 0.f;
                if (key < k1) load_halves<8>(v_cache + head_base + (size_t)key * DH + dim, vv);
                *reinterpret_cast<float4*>(&tile.v[c][dim]) = make_float4(vv[0], vv[1], vv[2], vv[3]);
                *reinterpret_cast<float4*>(&tile.v[c][dim + 4]) = make_float4(vv[4], vv[5], vv[6], vv[7]);
            }
            __syncthreads();
#pragma unroll 2
            for (int c = 0; c < PF_VC; ++c) {
                const float4 p4 = *reinterpret_cast<const float4*>(&p_tile[vc + c][ty * 4]);
                const float pv[4] = {p4.x, p4.y, p4.z, p4.w};
#pragma unroll
                for (int ch = 0; ch < NCH; ++ch) {
                    float vv[CW];
                    if constexpr (CW == 4) {
                        const float4 v4 = *reinterpret_cast<const float4*>(&tile.v[c][ch * 64 + tx * 4]);
                        vv[0] = v4.x; vv[1] = v4.y; vv[2] = v4.z; vv[3] = v4.w;
                    } else {
                        const float2 v2 = *reinterpret_cast<const float2*>(&tile.v[c][tx * 2]);
                        vv[0] = v2.x; vv[1] = v2.y;
                    }
#pragma unroll
                    for (int i = 0; i < 4; ++i)
#pragma unroll
                        for (int e = 0; e < CW; ++e) o[i][ch * CW + e] = fmaf(pv[i], vv[e], o[i][ch * CW + e]);
                }
            }
        }
        __syncthreads();  // the next tile's staging overwrites tile.v
    }

#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int r = r0 + ty * 4 + i;
        if (r >= n_rows) continue;
        const size_t row = ((size_t)(r / group) * n_head + kv_head * group + r % group) * n_splits + split;
        if (tx == 0) {
            part_m[row] = m[i];
            part_l[row] = l[i];
        }
        if (m[i] == ATTN_NEG_INF) continue;
#pragma unroll
        for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
            for (int e = 0; e < CW; ++e) part_o[row * DH + ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
    }
}

// ---------------------------------------------------------------------------------------------
// Merge + output gate: one block of Dh threads per (token, query head), grid = T * n_head.
//   o = sum_s exp(m_s - M) o_s / sum_s exp(m_s - M) l_s   over splits with a visible key (M = max m_s)
//   y = o * sigmoid(gate)   gate element (t, h, d) at gate[t*gate_row_stride + h*gate_head_stride + d]
//                           (read straight from the q GEMV output: gate = qg + Dh, strides 2*H*Dh and
//                           2*Dh; or from a separate [T][H*Dh] buffer: strides H*Dh and Dh)
// y goes to `y` [T][H*Dh] fp32 and/or (yq, yd) Q8_1 for the out-projection GEMV; either may be null.
extern "C" __global__ void attn_merge_gate(const float* __restrict__ part_m, const float* __restrict__ part_l,
                                           const float* __restrict__ part_o, int n_splits,
                                           const float* __restrict__ gate, int gate_row_stride,
                                           int gate_head_stride, int n_head, float* __restrict__ y,
                                           signed char* __restrict__ yq, float* __restrict__ yd) {
    const int head_dim = blockDim.x;
    const int d = threadIdx.x;
    const size_t row = blockIdx.x;  // t * n_head + h
    const float* pm = part_m + row * n_splits;
    const float* pl = part_l + row * n_splits;
    float m_max = ATTN_NEG_INF;
    for (int s = 0; s < n_splits; ++s) m_max = fmaxf(m_max, pm[s]);
    float acc = 0.f, l_sum = 0.f;
    for (int s = 0; s < n_splits; ++s) {
        if (pm[s] == ATTN_NEG_INF) continue;
        const float f = expf(pm[s] - m_max);
        l_sum = fmaf(f, pl[s], l_sum);
        acc = fmaf(f, part_o[(row * n_splits + s) * head_dim + d], acc);
    }
    const int t = (int)(row / n_head);
    const int h = (int)(row - (size_t)t * n_head);
    const float o = l_sum > 0.f ? acc / l_sum : 0.f;
    const float out = o * rigllm::sigmoid(gate[(size_t)t * gate_row_stride + (size_t)h * gate_head_stride + d]);
    const size_t idx = row * head_dim + d;
    if (y != nullptr) y[idx] = out;
    if (yq != nullptr) q8_1_quantize_warp(out, yq + idx, yd + idx / 32);
}

// ---------------------------------------------------------------------------------------------
// Entry points. Decode: attn_decode_d<Dh>_g<G>, grid = (T, n_head_kv * n_splits), block = 32*DECODE_WARPS.
// Prefill: attn_prefill_d<Dh>, grid = ceil(T*G / PF_BQ) * n_head_kv * n_splits, block = PF_THREADS.
// `scale` is 1/sqrt(Dh) (passed so the host states it once). Instantiated for Dh 32, 64, 128, 256 and G 1,
// 2, 4, 6, 8: Dh 256 with G 4 or 6 is every Qwen3.5/3.6 size, Dh 32/64 with G 1, 2, 4 are the tiny test
// models and the demo model, Dh 128 with G 2 the trained fixtures (tests/fixtures/trained), G 8 is
// headroom. Each pair costs compile time on six architectures, so add one only for a model that needs it. Choosing n_splits: enough blocks to fill
// the card (decode: n_head_kv * n_splits around 3x the SM count; prefill: multiply the q tiles up to
// about 2x); split boundaries are multiples of SPLIT_ALIGN keys, so short contexts use fewer splits.
#define ATTN_DECODE_ENTRY(DH, G)                                                                           \
    extern "C" __global__ void __launch_bounds__(32 * DECODE_WARPS, 2) attn_decode_d##DH##_g##G(          \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache, \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,             \
        float* __restrict__ part_o, int capacity, int n_splits, float scale) {                            \
        attn_decode<DH, G>(q, k_cache, v_cache, step, part_m, part_l, part_o, capacity, n_splits, scale);  \
    }

#define ATTN_DECODE_ENTRIES(DH) \
    ATTN_DECODE_ENTRY(DH, 1)    \
    ATTN_DECODE_ENTRY(DH, 2)    \
    ATTN_DECODE_ENTRY(DH, 4)    \
    ATTN_DECODE_ENTRY(DH, 6)    \
    ATTN_DECODE_ENTRY(DH, 8)

ATTN_DECODE_ENTRIES(32)
ATTN_DECODE_ENTRIES(64)
ATTN_DECODE_ENTRIES(128)
ATTN_DECODE_ENTRIES(256)

#define ATTN_PREFILL_ENTRY(DH)                                                                             \
    extern "C" __global__ void __launch_bounds__(PF_THREADS, 2) attn_prefill_d##DH(                        \
        const float* __restrict__ q, const __half* __restrict__ k_cache, const __half* __restrict__ v_cache, \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,             \
        float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv, int capacity, int n_splits,  \
        float scale) {                                                                                     \
        attn_prefill<DH>(q, k_cache, v_cache, step, part_m, part_l, part_o, n_tokens, n_head, n_head_kv,  \
                         capacity, n_splits, scale);                                                       \
    }

ATTN_PREFILL_ENTRY(32)
ATTN_PREFILL_ENTRY(64)
ATTN_PREFILL_ENTRY(128)
ATTN_PREFILL_ENTRY(256)
