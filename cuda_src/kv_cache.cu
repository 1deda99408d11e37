// Attention over the quantised KV cache (formats k8v8, k8v4, k8v3, k4v4, k3v3; the f16 cache stays with
// attention.cu): append (encode new rows), q rotation, flash decode and flash prefill that read the
// stored codes directly (the history is never expanded to fp16), writing the same fp32 split partials
// as attention.cu so its attn_merge_gate combines them and applies the output gate.
//
// Storage and the attention domain: kv_cache.cuh. The rotated-domain trick: for a wht K side the
// kernels score kv_rotate_q's rotated q against centroid * norm; for a wht V side they sum
// p * centroid * norm in the rotated domain and un-rotate each split's output once, in shared memory,
// before writing it (the merge is linear, so un-rotating per split equals un-rotating the merged
// output; it costs one 128-point transform per (query head, split) instead of one per key).
//
// Step buffer, split ranges and partial layouts are attention.cu's (see there): token t of a batch at
// pos = step[RIGLLM_STEP_POS] sees cache rows [0, pos + t]; grids depend only on batch size and split
// count, so decode launches can be captured in a CUDA graph.
#include <cuda_fp16.h>
#include "common.cuh"
#include "kv_cache.cuh"

#define KV_NEG_INF __int_as_float(0xff800000)

constexpr int KV_SPLIT_ALIGN = 64;  // attention.cu's SPLIT_ALIGN (any value works with attn_merge_gate)

__device__ __forceinline__ void kv_split_range(int kv_len, int n_splits, int split, int* start, int* end) {
    int chunk = (kv_len + n_splits - 1) / n_splits;
    chunk = (chunk + KV_SPLIT_ALIGN - 1) / KV_SPLIT_ALIGN * KV_SPLIT_ALIGN;
    *start = split * chunk;
    *end = min(*start + chunk, kv_len);
}

// ---------------------------------------------------------------------------------------------
// Append: encode T new rows of one cache side. Source: fp16 staging rows [n_head_kv][src_rows][Dh] (what
// attn_prep writes when its cache is a staging buffer: row t = token t of the batch). Destination rows
// pos + t of codes/side (rows past the capacity are dropped, as attn_prep does). Grid T * n_head_kv,
// block KV_ENCODE_THREADS (= one 128-block, or four int8 32-blocks, per pass).
constexpr int KV_ENCODE_THREADS = 128;

template <int C>
__device__ __forceinline__ void kv_encode(const __half* __restrict__ src, int src_rows, const int* __restrict__ step,
                                          unsigned char* __restrict__ codes, __half* __restrict__ side,
                                          int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    __shared__ float buf[kv::BLOCK];
    __shared__ float warp_part[KV_ENCODE_THREADS / 32];
    const int t = blockIdx.x / n_head_kv;
    const int head = blockIdx.x - t * n_head_kv;
    const int row = step[RIGLLM_STEP_POS] + t;
    if (row >= capacity) return;
    const __half* x = src + ((size_t)head * src_rows + t) * head_dim;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t out_row = (size_t)head * capacity + row;

    if constexpr (C == kv::INT8) {
        unsigned char* q = codes + out_row * head_dim;
        for (int d = tid; d < head_dim; d += KV_ENCODE_THREADS) {  // head_dim % 32 == 0: whole warps
            const float v = __half2float(x[d]);
            const float amax = rigllm::warp_max(fabsf(v));
            const __half d16 = __float2half_rn(amax / 127.0f);
            const float scale = __half2float(d16);
            int c = scale > 0.f ? __float2int_rn(v / scale) : 0;
            c = max(-127, min(127, c));
            q[d] = (unsigned char)(signed char)c;
            if (lane == 0) side[out_row * (head_dim / 32) + (d >> 5)] = d16;
        }
    } else {
        const int n_blocks = (head_dim + kv::BLOCK - 1) / kv::BLOCK;
        const float* bounds = tables + kv::table_boundaries(C);
        unsigned char* out = codes + out_row * (size_t)(n_blocks * 16 * (C == kv::WHT4 ? 4 : 3));
        for (int blk = 0; blk < n_blocks; ++blk) {
            const int d = blk * kv::BLOCK + tid;
            const float v = d < head_dim ? __half2float(x[d]) : 0.f;
            __syncthreads();  // the previous block's buf reads are done
            buf[tid] = v * tables[kv::TABLE_SIGNS + tid];
            kv::fwht_shared(buf, 1, tid, KV_ENCODE_THREADS);
            const float y = buf[tid] * kv::INV_SQRT_BLOCK;
            const float sq = rigllm::warp_sum(y * y);
            if (lane == 0) warp_part[warp] = sq;
            __syncthreads();
            const float norm = sqrtf((warp_part[0] + warp_part[1]) + (warp_part[2] + warp_part[3]));
            const float u = norm > 0.f ? y / norm : 0.f;
            int code = 0;
#pragma unroll
            for (int i = 0; i < kv::levels(C) - 1; ++i) code += u > bounds[i];
            if constexpr (C == kv::WHT4) {
                const int next = __shfl_down_sync(RIGLLM_FULL_MASK, code, 1);
                if ((tid & 1) == 0) out[blk * 64 + (tid >> 1)] = (unsigned char)(code | (next << 4));
            } else {
#pragma unroll
                for (int b = 0; b < 3; ++b) {
                    const unsigned int plane = __ballot_sync(RIGLLM_FULL_MASK, (code >> b) & 1);
                    if (lane == 0) *reinterpret_cast<unsigned int*>(out + blk * 48 + b * 16 + warp * 4) = plane;
                }
            }
            if (tid == 0) side[out_row * n_blocks + blk] = __float2half_rn(norm);
        }
    }
}

extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_int8(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, unsigned char* __restrict__ codes,
    __half* __restrict__ side, int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::INT8>(src, src_rows, step, codes, side, n_head_kv, head_dim, capacity, tables);
}
extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_wht4(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, unsigned char* __restrict__ codes,
    __half* __restrict__ side, int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::WHT4>(src, src_rows, step, codes, side, n_head_kv, head_dim, capacity, tables);
}
extern "C" __global__ void __launch_bounds__(KV_ENCODE_THREADS) kv_encode_wht3(
    const __half* __restrict__ src, int src_rows, const int* __restrict__ step, unsigned char* __restrict__ codes,
    __half* __restrict__ side, int n_head_kv, int head_dim, int capacity, const float* __restrict__ tables) {
    kv_encode<kv::WHT3>(src, src_rows, step, codes, side, n_head_kv, head_dim, capacity, tables);
}

// ---------------------------------------------------------------------------------------------
// q into the rotated domain, once per (token, query head): q [n_rows][Dh] fp32 (attn_prep's q_out, rows =
// T * n_head) → q_rot [n_rows][ceil(Dh/128)*128] = R q (zero-padded). Grid n_rows, block 128.
extern "C" __global__ void __launch_bounds__(kv::BLOCK) kv_rotate_q(const float* __restrict__ q,
                                                                     float* __restrict__ q_rot, int head_dim,
                                                                     const float* __restrict__ tables) {
    __shared__ float buf[kv::BLOCK];
    const int tid = threadIdx.x;
    const int n_blocks = (head_dim + kv::BLOCK - 1) / kv::BLOCK;
    const float* x = q + (size_t)blockIdx.x * head_dim;
    float* y = q_rot + (size_t)blockIdx.x * n_blocks * kv::BLOCK;
    for (int blk = 0; blk < n_blocks; ++blk) {
        const int d = blk * kv::BLOCK + tid;
        __syncthreads();
        buf[tid] = (d < head_dim ? x[d] : 0.f) * tables[kv::TABLE_SIGNS + tid];
        kv::fwht_shared(buf, 1, tid, kv::BLOCK);
        y[d] = buf[tid] * kv::INV_SQRT_BLOCK;
    }
}

// ---------------------------------------------------------------------------------------------
// Flash decode (T = 1), attention.cu's attn_decode over stored codes. Block = (KV head, split), 4 warps;
// each warp takes KEYS key rows per step (all loaded, packed, before any is expanded), lane l holding
// domain dims [l*KPL, (l+1)*KPL) of K and [l*VPL, (l+1)*VPL) of V. q: the K domain's q rows [n_head][DWK]
// (kv_rotate_q's output for wht K, attn_prep's q_out for int8 K), unscaled.
constexpr int KV_DECODE_WARPS = 4;
// Rows a warp loads before using any (packed, a few registers each): quantised rows are small, so a
// warp needs many in flight to cover memory latency at ~3 blocks per SM; fewer for wide groups,
// whose per-key scores take registers (G 6 and 8 stay at 2 so the kernel keeps <= 170 registers for
// 3 blocks per SM; G 4 with 4 keys uses <= 167).
__host__ __device__ constexpr int kv_decode_keys(int group) { return group <= 4 ? 4 : 2; }

template <int KC, int VC, int DH, int G>
__device__ __forceinline__ void kv_decode(const float* __restrict__ q, kv::Side<KC, DH> k_side, kv::Side<VC, DH> v_side,
                                          const int* __restrict__ step, float* __restrict__ part_m,
                                          float* __restrict__ part_l, float* __restrict__ part_o, int n_splits,
                                          float scale, const float* __restrict__ tables) {
    constexpr int DWK = kv::domain(KC, DH), DWV = kv::domain(VC, DH);
    constexpr int KPL = DWK / 32, VPL = DWV / 32;
    constexpr int KEYS = kv_decode_keys(G);
    __shared__ float sh_m[KV_DECODE_WARPS][G];
    __shared__ float sh_l[KV_DECODE_WARPS][G];
    __shared__ __align__(16) float sh_o[KV_DECODE_WARPS][G][DWV];
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];

    const int capacity = k_side.capacity;
    const rigllm::DecodeBlock blk = rigllm::decode_block(step, n_splits, G, capacity);
    const int kv_head = blk.kv_head;
    int start, end;
    kv_split_range(blk.kv_len, n_splits, blk.split, &start, &end);
    const size_t first_row = blk.first_row;
    if (start >= end) {
        if (threadIdx.x < G) {
            part_m[first_row + threadIdx.x * n_splits] = KV_NEG_INF;
            part_l[first_row + threadIdx.x * n_splits] = 0.f;
        }
        return;
    }
    load_centroids(k_centroids, KC, tables);
    load_centroids(v_centroids, VC, tables);
    if (kv::rotated(VC)) signs[threadIdx.x] = tables[kv::TABLE_SIGNS + threadIdx.x];  // blockDim == 128
    __syncthreads();

    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const kv::HeadRows<KC, DH> k_rows = k_side.head(kv_head);
    const kv::HeadRows<VC, DH> v_rows = v_side.head(kv_head);
    float qr[G][KPL];
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
        for (int i = 0; i < KPL; ++i) qr[g][i] = q[(blk.q_row + g) * DWK + lane * KPL + i] * scale;

    float m[G], l[G], o[G][VPL];
#pragma unroll
    for (int g = 0; g < G; ++g) {
        m[g] = KV_NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int i = 0; i < VPL; ++i) o[g][i] = 0.f;
    }

    for (int base = start + warp * KEYS; base < end; base += KV_DECODE_WARPS * KEYS) {
        kv::Packed<KC, KPL> kp[KEYS];
        kv::Packed<VC, VPL> vp[KEYS];
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {  // all KEYS rows in flight before any is used
            const int key = min(base + kk, end - 1);  // a clamped duplicate is masked below
            kv::load_packed<KC, KPL>(k_rows.code_row(key), k_rows.side_row(key), lane * KPL, kp[kk]);
            kv::load_packed<VC, VPL>(v_rows.code_row(key), v_rows.side_row(key), lane * VPL, vp[kk]);
        }
        float s[G][KEYS];  // scores, then softmax weights
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {
            float kf[KPL];
            kv::expand<KC, KPL>(kp[kk], k_centroids, kf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                float acc = 0.f;
#pragma unroll
                for (int i = 0; i < KPL; ++i) acc = fmaf(qr[g][i], kf[i], acc);
                acc = rigllm::warp_sum(acc * kp[kk].scale);  // each lane's dims share one block scale
                s[g][kk] = base + kk < end ? acc : KV_NEG_INF;
            }
        }
#pragma unroll
        for (int g = 0; g < G; ++g) {
            float tile_max = KV_NEG_INF;
#pragma unroll
            for (int kk = 0; kk < KEYS; ++kk) tile_max = fmaxf(tile_max, s[g][kk]);
            const float m_new = fmaxf(m[g], tile_max);  // finite: key `base` is always valid
            const float corr = __expf(m[g] - m_new);
            l[g] *= corr;
#pragma unroll
            for (int i = 0; i < VPL; ++i) o[g][i] *= corr;
#pragma unroll
            for (int kk = 0; kk < KEYS; ++kk) {
                s[g][kk] = __expf(s[g][kk] - m_new);
                l[g] += s[g][kk];
            }
            m[g] = m_new;
        }
#pragma unroll
        for (int kk = 0; kk < KEYS; ++kk) {
            float vf[VPL];
            kv::expand<VC, VPL>(vp[kk], v_centroids, vf);
#pragma unroll
            for (int g = 0; g < G; ++g) {
                const float pv = s[g][kk] * vp[kk].scale;
#pragma unroll
                for (int i = 0; i < VPL; ++i) o[g][i] = fmaf(pv, vf[i], o[g][i]);
            }
        }
    }

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
        for (int i = 0; i < VPL; ++i) sh_o[warp][g][lane * VPL + i] = o[g][i];
    __syncthreads();
    // Merge the warps into sh_o[0] (each element read and written by one thread), un-rotate, write.
    for (int idx = threadIdx.x; idx < G * DWV; idx += blockDim.x) {
        const int g = idx / DWV;
        const int dim = idx - g * DWV;
        float m_max = KV_NEG_INF;
#pragma unroll
        for (int w = 0; w < KV_DECODE_WARPS; ++w) m_max = fmaxf(m_max, sh_m[w][g]);
        float acc = 0.f, l_sum = 0.f;
#pragma unroll
        for (int w = 0; w < KV_DECODE_WARPS; ++w) {
            if (sh_m[w][g] == KV_NEG_INF) continue;
            const float f = __expf(sh_m[w][g] - m_max);
            acc = fmaf(f, sh_o[w][g][dim], acc);
            l_sum = fmaf(f, sh_l[w][g], l_sum);
        }
        sh_o[0][g][dim] = acc;
        if (dim == 0) {
            const size_t row = first_row + (size_t)g * n_splits;
            part_m[row] = m_max;
            part_l[row] = l_sum;
        }
    }
    if constexpr (kv::rotated(VC)) {
        unrotate_shared(&sh_o[0][0][0], G * DWV / kv::BLOCK, signs, threadIdx.x, blockDim.x);
    } else {
        __syncthreads();
    }
    for (int idx = threadIdx.x; idx < G * DH; idx += blockDim.x) {
        const int g = idx / DH;
        const int dim = idx - g * DH;
        part_o[(first_row + (size_t)g * n_splits) * DH + dim] = sh_o[0][g][dim];
    }
}

// ---------------------------------------------------------------------------------------------
// Flash prefill, attention.cu's attn_prefill over stored codes: block = (query tile, KV head, split),
// 256 threads, 64x64 score tiles, fp32 FMA. K chunks of 32 domain dims and V chunks of 16 keys are
// expanded from codes into shared memory per tile (fp32, never written back); for a wht V side the
// block's output rows are un-rotated 16 at a time through the V tile's shared memory before writing.
constexpr int KV_PF_THREADS = 256;
constexpr int KV_PF_BQ = 64;
constexpr int KV_PF_BK = 64;
constexpr int KV_PF_DC = 32;
constexpr int KV_PF_VC = 16;
constexpr int KV_PF_LD = KV_PF_BQ + 4;

template <int KC, int VC, int DH>
__device__ __forceinline__ void kv_prefill(const float* __restrict__ q, kv::Side<KC, DH> k_side,
                                           kv::Side<VC, DH> v_side,
                                           const int* __restrict__ step, float* __restrict__ part_m,
                                           float* __restrict__ part_l, float* __restrict__ part_o, int n_tokens,
                                           int n_head, int n_head_kv, int n_splits, float scale,
                                           const float* __restrict__ tables) {
    constexpr int DWK = kv::domain(KC, DH), DWV = kv::domain(VC, DH);
    constexpr int DPT = DWV / 16;
    constexpr int CW = DPT < 4 ? DPT : 4;
    constexpr int NCH = DPT / CW;
    static_assert(DH % 32 == 0 && DH <= 256, "head_dim must be a multiple of 32, at most 256");
    __shared__ __align__(16) float p_tile[KV_PF_BK][KV_PF_LD];
    __shared__ __align__(16) union {
        struct {
            float q[KV_PF_DC][KV_PF_LD];
            float k[KV_PF_DC][KV_PF_LD];
        } qk;
        float v[KV_PF_VC][DWV];
    } tile;
    __shared__ float k_centroids[16], v_centroids[16], signs[kv::BLOCK];

    const int capacity = k_side.capacity;
    const int group = n_head / n_head_kv;
    const int n_rows = n_tokens * group;
    const int n_qtiles = (n_rows + KV_PF_BQ - 1) / KV_PF_BQ;
    const int qtile = blockIdx.x % n_qtiles;
    const int kv_head = (blockIdx.x / n_qtiles) % n_head_kv;
    const int split = blockIdx.x / (n_qtiles * n_head_kv);
    const int pos = step[RIGLLM_STEP_POS];
    int k0, k1;
    kv_split_range(min(pos + n_tokens, capacity), n_splits, split, &k0, &k1);
    const int r0 = qtile * KV_PF_BQ;
    k1 = min(k1, pos + (min(r0 + KV_PF_BQ, n_rows) - 1) / group + 1);

    const int tid = threadIdx.x;
    const int tx = tid & 15;
    const int ty = tid >> 4;
    load_centroids(k_centroids, KC, tables);
    load_centroids(v_centroids, VC, tables);
    if (kv::rotated(VC) && tid < kv::BLOCK) signs[tid] = tables[kv::TABLE_SIGNS + tid];
    __syncthreads();

    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = KV_NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < DPT; ++e) o[i][e] = 0.f;
    }

    const int ld_row = tid & 63;
    const int ld_dim = (tid >> 6) * 8;
    const kv::HeadRows<KC, DH> k_rows = k_side.head(kv_head);
    const kv::HeadRows<VC, DH> v_rows = v_side.head(kv_head);
    const float* q_src = nullptr;
    if (r0 + ld_row < n_rows) {
        const int r = r0 + ld_row;
        q_src = q + ((size_t)(r / group) * n_head + kv_head * group + r % group) * DWK + ld_dim;
    }

    for (int kt = k0; kt < k1; kt += KV_PF_BK) {
        float s[4][4];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
            for (int j = 0; j < 4; ++j) s[i][j] = 0.f;

        const int ld_key = kt + ld_row;
        for (int dc = 0; dc < DWK; dc += KV_PF_DC) {
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
                float kv_vals[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (ld_key < k1)
                    kv::dequant<KC, 8>(k_rows.code_row(ld_key), k_rows.side_row(ld_key), dc + ld_dim, k_centroids,
                                       kv_vals);
#pragma unroll
                for (int e = 0; e < 8; ++e) tile.qk.k[ld_dim + e][ld_row] = kv_vals[e];
            }
            __syncthreads();
#pragma unroll 4
            for (int dd = 0; dd < KV_PF_DC; ++dd) {
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
            const int r = r0 + ty * 4 + i;
            const int limit = r < n_rows ? min(pos + r / group + 1, k1) : 0;
            float tile_max = KV_NEG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = kt + tx * 4 + j < limit ? s[i][j] * scale : KV_NEG_INF;
                tile_max = fmaxf(tile_max, s[i][j]);
            }
            tile_max = rigllm::group_max<16>(tile_max);
            const float m_new = fmaxf(m[i], tile_max);
            const float m_ref = m_new == KV_NEG_INF ? 0.f : m_new;
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

        for (int vc = 0; vc < KV_PF_BK; vc += KV_PF_VC) {
            __syncthreads();
            for (int idx = tid; idx < KV_PF_VC * DWV / 8; idx += KV_PF_THREADS) {
                const int c = idx / (DWV / 8);
                const int dim = (idx - c * (DWV / 8)) * 8;
                const int key = kt + vc + c;
                float vv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (key < k1)
                    kv::dequant<VC, 8>(v_rows.code_row(key), v_rows.side_row(key), dim, v_centroids, vv);
                *reinterpret_cast<float4*>(&tile.v[c][dim]) = make_float4(vv[0], vv[1], vv[2], vv[3]);
                *reinterpret_cast<float4*>(&tile.v[c][dim + 4]) = make_float4(vv[4], vv[5], vv[6], vv[7]);
            }
            __syncthreads();
#pragma unroll 2
            for (int c = 0; c < KV_PF_VC; ++c) {
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
        __syncthreads();
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
        if constexpr (!kv::rotated(VC)) {
            if (m[i] == KV_NEG_INF) continue;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int e = 0; e < CW; ++e) part_o[row * DH + ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
        }
    }
    if constexpr (kv::rotated(VC)) {
        // Output rows in passes of KV_PF_VC (= 16) through tile.v: rows 16p..16p+15 belong to ty in [4p, 4p+4).
#pragma unroll 1
        for (int pass = 0; pass < KV_PF_BQ / KV_PF_VC; ++pass) {
            if ((ty >> 2) == pass) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                        for (int e = 0; e < CW; ++e)
                            tile.v[(ty & 3) * 4 + i][ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
            }
            unrotate_shared(&tile.v[0][0], KV_PF_VC * DWV / kv::BLOCK, signs, tid, KV_PF_THREADS);
            for (int idx = tid; idx < KV_PF_VC * DH; idx += KV_PF_THREADS) {
                const int lr = idx / DH;
                const int dim = idx - lr * DH;
                const int r = r0 + pass * KV_PF_VC + lr;
                if (r >= n_rows) continue;
                const size_t row = ((size_t)(r / group) * n_head + kv_head * group + r % group) * n_splits + split;
                part_o[row * DH + dim] = tile.v[lr][dim];
            }
            __syncthreads();  // the next pass overwrites tile.v
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Entry points, one per (format, Dh[, G]): kv_decode_<fmt>_d<Dh>_g<G> (grid (T, n_head_kv * n_splits), block
// 128) and kv_prefill_<fmt>_d<Dh> (grid ceil(T*G/64) * n_head_kv * n_splits, block 256). Arguments: q in
// the K domain; K codes/side, V codes/side; step; partials; then the sizes; `tables` last.
#define KV_DECODE_ENTRY(FMT, KC, VC, DH, G)                                                                    \
    extern "C" __global__ void __launch_bounds__(32 * KV_DECODE_WARPS, 2) kv_decode_##FMT##_d##DH##_g##G(      \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,                  \
        float* __restrict__ part_o, int capacity, int n_splits, float scale, const float* __restrict__ tables) { \
        kv_decode<KC, VC, DH, G>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                               \
                                 kv::Side<VC, DH>{v_codes, v_side, capacity}, step, part_m, part_l, part_o,    \
                                 n_splits, scale, tables);                                                     \
    }

#define KV_PREFILL_ENTRY(FMT, KC, VC, DH)                                                                      \
    extern "C" __global__ void __launch_bounds__(KV_PF_THREADS, 2) kv_prefill_##FMT##_d##DH(                   \
        const float* __restrict__ q, const unsigned char* __restrict__ k_codes, const __half* __restrict__ k_side, \
        const unsigned char* __restrict__ v_codes, const __half* __restrict__ v_side,                          \
        const int* __restrict__ step, float* __restrict__ part_m, float* __restrict__ part_l,                  \
        float* __restrict__ part_o, int n_tokens, int n_head, int n_head_kv, int capacity, int n_splits,       \
        float scale, const float* __restrict__ tables) {                                                       \
        kv_prefill<KC, VC, DH>(q, kv::Side<KC, DH>{k_codes, k_side, capacity},                                 \
                               kv::Side<VC, DH>{v_codes, v_side, capacity}, step, part_m, part_l, part_o,      \
                               n_tokens, n_head, n_head_kv, n_splits, scale, tables);                          \
    }

// Dh 256 (every Qwen3.5/3.6 size: G 4 and 6; 1, 2 and 8 as headroom) gets every group; the test-model
// widths 32 and 64 get the groups the tiny and demo models use (1, 2, 4). Each entry is ~75 KB of SASS
// per architecture, so add one only for a model that needs it.
#define KV_FORMAT_ENTRIES(FMT, KC, VC)          \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 1)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 2)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 4)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 6)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 256, 8)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 1)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 2)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 128, 4)        \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 1)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 2)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 64, 4)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 1)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 2)         \
    KV_DECODE_ENTRY(FMT, KC, VC, 32, 4)         \
    KV_PREFILL_ENTRY(FMT, KC, VC, 256)          \
    KV_PREFILL_ENTRY(FMT, KC, VC, 128)          \
    KV_PREFILL_ENTRY(FMT, KC, VC, 64)           \
    KV_PREFILL_ENTRY(FMT, KC, VC, 32)

KV_FORMAT_ENTRIES(k8v8, kv::INT8, kv::INT8)
KV_FORMAT_ENTRIES(k8v4, kv::INT8, kv::WHT4)
KV_FORMAT_ENTRIES(k8v3, kv::INT8, kv::WHT3)
KV_FORMAT_ENTRIES(k4v4, kv::WHT4, kv::WHT4)
KV_FORMAT_ENTRIES(k3v3, kv::WHT3, kv::WHT3)
