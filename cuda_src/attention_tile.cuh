// The flash prefill tile loop, written once for the four prefill kernels: attention.cu's attn_prefill
// (fp16 cache), kv_cache.cu's kv_prefill (stored codes), sparse_attention.cu's sparse_prefill and
// sparse_kv.cu's kv_sparse_prefill (the same two caches, skipping key blocks the sparse index does not
// name). Keeping one copy is what keeps them bit-identical: a sparse prefill with a full index must equal
// the dense one, so every variant has to run the same fp32 operations in the same order.
//
// Block = FLASH_THREADS threads, up to FLASH_BQ query rows of one KV head, the keys of one split
// FLASH_BK at a time:
//   S = Q·K^T   thread (ty, tx) = (tid / 16, tid % 16) owns tile rows ty*4..+3 and keys tx*4..+3 (a 4x4
//               register tile); Q and K are staged through shared memory FLASH_DC dims at a time (fp32,
//               transposed, rows padded to FLASH_LD floats)
//   softmax     scale, causal mask, online max/sum per row; the 16 threads sharing a row are one aligned
//               half-warp, so row reductions are 4 shuffles; P goes to shared memory
//   O += P·V    V staged FLASH_VC keys at a time; the thread owns the same 4 rows and DWV/16 dims, in
//               float4 chunks strided by 64 floats so shared-memory reads are conflict-free
// Everything is fp32 FMA (no tensor cores, no fp16 arithmetic). Keys past the split or the causal limit
// are loaded as zeros, so a garbage cache row can never turn a 0 weight into NaN.
//
// What differs between the kernels is two policies (duck-typed template parameters):
//   Rows   which query rows the block holds and which key tiles it visits (DenseRows, SparseRows below):
//            k0, k1, split   the block's keys [k0, k1) (clipped to what its last row can see) and split
//            has_row(lr)     whether tile row lr is one of the block's query rows
//            head_row(lr)    its (token * n_head + query head): the q row and, times n_splits plus
//                            split, the partial row
//            limit(lr, k1)   keys [0, limit) are visible to tile row lr: causal, clipped to k1 (0 for a
//                            dense row past the block's rows; a sparse one has q = 0 and is never written)
//            visit(kt)       whether the key tile [kt, kt + FLASH_BK) is read at all
//   Cache  how 8 consecutive values of a key or value row reach the staging tiles, in the attention
//          domain (HalfCache below: fp16 rows; kv_tile.cuh's CodeCache: quantised codes expanded in the
//          codec's domain): key(in_tile, key, dim) once per tile gives the thread's K staging source
//          (whose load(dc, out) fills dims dc + dim.. and leaves zeros outside the tile: formed per
//          tile, not per chunk, which keeps the d256 kernels within 128 registers), load_v(key, dim,
//          out) fills a V chunk; ROTATED_V says the V domain is rotated, and then the output rows are
//          un-rotated in shared memory by cache.unrotate(buf, n_floats) before they are written
// Partial layout (attention.cu's, merged by attn_merge_gate): row = head_row * n_splits + split;
// part_m/part_l [row], part_o [row][DH]; a row with no visible key has m = -inf, l = 0, o not written.
#pragma once

#include <cuda_fp16.h>
#include "common.cuh"

#define FLASH_NEG_INF __int_as_float(0xff800000)  // -inf

constexpr int FLASH_THREADS = 256;
constexpr int FLASH_BQ = 64;                 // query rows per block
constexpr int FLASH_BK = 64;                 // keys per tile: splits and sparse key blocks start on tiles
constexpr int FLASH_DC = 32;                 // dims per Q/K staging chunk
constexpr int FLASH_VC = 16;                 // keys per V staging chunk (also output rows per un-rotate pass)
constexpr int FLASH_LD = FLASH_BQ + 4;       // padded row of the transposed Q/K/P tiles (float4-aligned)
constexpr int FLASH_SPLIT_ALIGN = FLASH_BK;  // split boundaries are multiples of this many keys

namespace flash {

// Keys [*start, *end) of split `split` when kv_len keys are cut into n_splits chunks of whole tiles.
__device__ __forceinline__ void split_range(int kv_len, int n_splits, int split, int* start, int* end) {
    int chunk = (kv_len + n_splits - 1) / n_splits;
    chunk = (chunk + FLASH_SPLIT_ALIGN - 1) / FLASH_SPLIT_ALIGN * FLASH_SPLIT_ALIGN;
    *start = split * chunk;
    *end = min(*start + chunk, kv_len);
}

// The integer type of one aligned load of BYTES (4, 8 or 16) bytes.
template <int BYTES> struct LoadWord;
template <> struct LoadWord<4> { using type = unsigned int; };
template <> struct LoadWord<8> { using type = uint2; };
template <> struct LoadWord<16> { using type = uint4; };

// N consecutive fp16 values (N = 1, 2, 4 or 8; 2N-byte aligned) as floats, in one load.
template <int N>
__device__ __forceinline__ void load_halves(const __half* __restrict__ p, float* out) {
    if constexpr (N == 1) {
        out[0] = __half2float(*p);
    } else {
        const typename LoadWord<2 * N>::type raw = *reinterpret_cast<const typename LoadWord<2 * N>::type*>(p);
        const __half2* h = reinterpret_cast<const __half2*>(&raw);
#pragma unroll
        for (int i = 0; i < N / 2; ++i) {
            const float2 f = __half22float2(h[i]);
            out[2 * i] = f.x;
            out[2 * i + 1] = f.y;
        }
    }
}

// The Q and K staging tiles of one FLASH_DC-dim chunk, transposed: [dim][row or key].
struct QK {
    float q[FLASH_DC][FLASH_LD];
    float k[FLASH_DC][FLASH_LD];
};

// S = Q·K^T over DW dims for a 64x64 tile into this thread's 4x4 block s. Staging role: thread tid loads
// row / key tid % 64, dims [(tid / 64) * 8, +8) of each chunk. `q_src` points at its q row plus those
// dims (null: zeros); `load_k(dc, out)` fills those 8 dims of chunk dc of its key row (out arrives
// zeroed and stays so for a key outside the tile). Starts writing the tiles without a barrier (the
// caller's last reads of `t` must be fenced) and ends with one.
template <int DW, class LoadK>
__device__ __forceinline__ void score_tile(const float* q_src, LoadK load_k, QK& t, float s[4][4]) {
    const int tid = threadIdx.x;
    const int ld_row = tid & 63;
    const int ld_dim = (tid >> 6) * 8;
    const int tx = tid & 15, ty = tid >> 4;
#pragma unroll
    for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) s[i][j] = 0.f;
    for (int dc = 0; dc < DW; dc += FLASH_DC) {
        {
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f), b = a;
            if (q_src != nullptr) {
                a = *reinterpret_cast<const float4*>(q_src + dc);
                b = *reinterpret_cast<const float4*>(q_src + dc + 4);
            }
            const float qv[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};
#pragma unroll
            for (int e = 0; e < 8; ++e) t.q[ld_dim + e][ld_row] = qv[e];
        }
        {
            float kv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
            load_k(dc, kv);
#pragma unroll
            for (int e = 0; e < 8; ++e) t.k[ld_dim + e][ld_row] = kv[e];
        }
        __syncthreads();
#pragma unroll 4
        for (int dd = 0; dd < FLASH_DC; ++dd) {
            const float4 a = *reinterpret_cast<const float4*>(&t.q[dd][ty * 4]);
            const float4 b = *reinterpret_cast<const float4*>(&t.k[dd][tx * 4]);
            const float av[4] = {a.x, a.y, a.z, a.w};
            const float bv[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
            for (int i = 0; i < 4; ++i)
#pragma unroll
                for (int j = 0; j < 4; ++j) s[i][j] = fmaf(av[i], bv[j], s[i][j]);
        }
        __syncthreads();
    }
}

// ---------------------------------------------------------------------------------------------
// Rows policies.

// Dense prefill (attn_prefill, kv_prefill): block = (query tile, KV head, split), grid =
// ceil(T*G / FLASH_BQ) * n_head_kv * n_splits. A query tile is FLASH_BQ consecutive rows r = t*G + g of
// one KV head (all G query heads of a token side by side); token t sees cache rows [0, pos + t].
struct DenseRows {
    int n_head, group, n_rows, r0, kv_head, split, pos, k0, k1;

    __device__ __forceinline__ DenseRows(const int* __restrict__ step, int n_tokens, int n_head_, int n_head_kv,
                                         int capacity, int n_splits) {
        n_head = n_head_;
        group = n_head / n_head_kv;
        n_rows = n_tokens * group;
        const int n_qtiles = (n_rows + FLASH_BQ - 1) / FLASH_BQ;
        const int qtile = blockIdx.x % n_qtiles;
        kv_head = (blockIdx.x / n_qtiles) % n_head_kv;
        split = blockIdx.x / (n_qtiles * n_head_kv);
        pos = step[RIGLLM_STEP_POS];
        split_range(min(pos + n_tokens, capacity), n_splits, split, &k0, &k1);
        r0 = qtile * FLASH_BQ;
        k1 = min(k1, pos + (min(r0 + FLASH_BQ, n_rows) - 1) / group + 1);  // no row of the tile sees further
    }
    __device__ __forceinline__ bool has_row(int lr) const { return r0 + lr < n_rows; }
    __device__ __forceinline__ size_t head_row(int lr) const {
        const int r = r0 + lr;
        return (size_t)(r / group) * n_head + kv_head * group + r % group;
    }
    __device__ __forceinline__ int limit(int lr, int k_end) const {
        const int r = r0 + lr;
        return r < n_rows ? min(pos + r / group + 1, k_end) : 0;
    }
    __device__ __forceinline__ bool visit(int) const { return true; }
};

// Block-sparse prefill (sparse_prefill, kv_sparse_prefill): block = (query block, query head, split),
// grid = n_qb_grid * n_head * n_splits. The block's rows are the chunk's tokens of ONE absolute
// FLASH_BK-row query block of ONE head, so every row reads the same key blocks: bit j of the block's
// index row (`bits`, staged in shared memory by load_index) says whether key block j is read. Splits
// start on key blocks, so a key tile is one key block. Rows past the query block have q = 0 and are
// never written, so they need no mask of their own.
struct SparseRows {
    const unsigned* bits;
    int n_head, h, kv_head, split, pos, qt, n_qb, t0, t_end, k0, k1;

    __device__ __forceinline__ SparseRows(const int* __restrict__ step, const unsigned* shared_bits, int n_tokens,
                                          int n_head_, int n_head_kv, int capacity, int n_splits, int n_qb_grid) {
        bits = shared_bits;
        n_head = n_head_;
        pos = step[RIGLLM_STEP_POS];
        const int qb0 = pos / FLASH_BK;
        n_qb = (pos + n_tokens - 1) / FLASH_BK - qb0 + 1;
        qt = blockIdx.x % n_qb_grid;  // index row: query block qb0 + qt
        h = (blockIdx.x / n_qb_grid) % n_head;
        split = blockIdx.x / (n_qb_grid * n_head);
        kv_head = h / (n_head / n_head_kv);
        t0 = max(0, (qb0 + qt) * FLASH_BK - pos);               // the query block's first token
        t_end = min(n_tokens, (qb0 + qt + 1) * FLASH_BK - pos);  // and one past its last
        split_range(min(pos + n_tokens, capacity), n_splits, split, &k0, &k1);
        k1 = min(k1, pos + t_end);  // no row of the tile sees further
    }
    // False for the grid's spare query blocks: the caller returns at once (uniform over the block).
    __device__ __forceinline__ bool active() const { return qt < n_qb; }
    // The block's index row (index uint32 [n_head][n_qb][words]) into `dst` (= bits); the caller syncs.
    __device__ __forceinline__ void load_index(const unsigned* __restrict__ index, int words, unsigned* dst) const {
        for (int w = threadIdx.x; w < words; w += FLASH_THREADS) dst[w] = index[((size_t)h * n_qb + qt) * words + w];
    }
    __device__ __forceinline__ bool has_row(int lr) const { return t0 + lr < t_end; }
    __device__ __forceinline__ size_t head_row(int lr) const { return (size_t)(t0 + lr) * n_head + h; }
    __device__ __forceinline__ int limit(int lr, int k_end) const { return min(pos + t0 + lr + 1, k_end); }
    __device__ __forceinline__ bool visit(int kt) const {
        const int j = kt / FLASH_BK;
        return (bits[j >> 5] >> (j & 31)) & 1u;
    }
};

// ---------------------------------------------------------------------------------------------
// Cache policy of the fp16 cache: K and V rows of one KV head, [capacity][DH] each.
template <int DH>
struct HalfCache {
    static constexpr bool ROTATED_V = false;
    const __half* __restrict__ k;
    const __half* __restrict__ v;

    struct Key {
        const __half* p;  // the thread's dims of its key row; null outside the tile
        __device__ __forceinline__ void load(int dc, float* out) const {
            if (p != nullptr) load_halves<8>(p + dc, out);
        }
    };
    __device__ __forceinline__ Key key(bool in_tile, int key, int dim) const {
        return {in_tile ? k + (size_t)key * DH + dim : nullptr};
    }
    __device__ __forceinline__ void load_v(int key, int dim, float* out) const {
        load_halves<8>(v + (size_t)key * DH + dim, out);
    }
};

struct Partials {
    float* __restrict__ m;
    float* __restrict__ l;
    float* __restrict__ o;
    int n_splits;
};

// ---------------------------------------------------------------------------------------------
// The tile loop and the epilogue. DH: head width written to part_o; DWK / DWV: the K / V attention
// domains (q rows are DWK floats; DWV = DH unless V is rotated, then DH rounded up to 128-blocks).
template <int DH, int DWK, int DWV, class Rows, class Cache>
__device__ __forceinline__ void prefill(const float* __restrict__ q, const Rows& rows, const Cache& cache,
                                        Partials out, float scale) {
    constexpr int DPT = DWV / 16;           // output dims per thread
    constexpr int CW = DPT < 4 ? DPT : 4;   // dims per chunk (float4 or float2)
    constexpr int NCH = DPT / CW;           // chunks per thread, CW*16 floats apart
    static_assert(DH % 32 == 0 && DH <= 256, "head_dim must be a multiple of 32, at most 256");
    __shared__ __align__(16) float p_tile[FLASH_BK][FLASH_LD];
    __shared__ __align__(16) union {
        QK qk;
        float v[FLASH_VC][DWV];
    } tile;

    const int tid = threadIdx.x;
    const int tx = tid & 15;
    const int ty = tid >> 4;
    const int k0 = rows.k0, k1 = rows.k1;
    float m[4], l[4], o[4][DPT];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        m[i] = FLASH_NEG_INF;
        l[i] = 0.f;
#pragma unroll
        for (int e = 0; e < DPT; ++e) o[i][e] = 0.f;
    }

    const int ld_row = tid & 63;  // score_tile's staging row / key
    const float* q_src = rows.has_row(ld_row) ? q + rows.head_row(ld_row) * DWK + (tid >> 6) * 8 : nullptr;

    for (int kt = k0; kt < k1; kt += FLASH_BK) {
        if (!rows.visit(kt)) continue;  // uniform over the block
        float s[4][4];
        const int ld_key = kt + ld_row;
        const auto k_src = cache.key(ld_key < k1, ld_key, (tid >> 6) * 8);
        score_tile<DWK>(q_src, [&](int dc, float* kv) { k_src.load(dc, kv); }, tile.qk, s);

#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int limit = rows.limit(ty * 4 + i, k1);  // keys [0, limit) are visible to the row
            float tile_max = FLASH_NEG_INF;
#pragma unroll
            for (int j = 0; j < 4; ++j) {
                s[i][j] = kt + tx * 4 + j < limit ? s[i][j] * scale : FLASH_NEG_INF;
                tile_max = fmaxf(tile_max, s[i][j]);
            }
            tile_max = rigllm::group_max<16>(tile_max);  // the row's 16 threads are one aligned half-warp
            const float m_new = fmaxf(m[i], tile_max);
            const float m_ref = m_new == FLASH_NEG_INF ? 0.f : m_new;  // nothing visible yet: weights stay 0
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

        for (int vc = 0; vc < FLASH_BK; vc += FLASH_VC) {
            __syncthreads();  // p_tile written / previous V chunk consumed
            for (int idx = tid; idx < FLASH_VC * DWV / 8; idx += FLASH_THREADS) {
                const int c = idx / (DWV / 8);
                const int dim = (idx - c * (DWV / 8)) * 8;
                const int key = kt + vc + c;
                float vv[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
                if (key < k1) cache.load_v(key, dim, vv);
                *reinterpret_cast<float4*>(&tile.v[c][dim]) = make_float4(vv[0], vv[1], vv[2], vv[3]);
                *reinterpret_cast<float4*>(&tile.v[c][dim + 4]) = make_float4(vv[4], vv[5], vv[6], vv[7]);
            }
            __syncthreads();
#pragma unroll 2
            for (int c = 0; c < FLASH_VC; ++c) {
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
        if (!rows.has_row(ty * 4 + i)) continue;
        const size_t row = rows.head_row(ty * 4 + i) * out.n_splits + rows.split;
        if (tx == 0) {
            out.m[row] = m[i];
            out.l[row] = l[i];
        }
        if constexpr (!Cache::ROTATED_V) {
            if (m[i] == FLASH_NEG_INF) continue;
#pragma unroll
            for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                for (int e = 0; e < CW; ++e) out.o[row * DH + ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
        }
    }
    if constexpr (Cache::ROTATED_V) {
        // Un-rotate once per (row, split) rather than per key (the merge is linear): output rows in passes
        // of FLASH_VC (= 16) through tile.v; rows 16p..16p+15 belong to ty in [4p, 4p+4).
#pragma unroll 1
        for (int pass = 0; pass < FLASH_BQ / FLASH_VC; ++pass) {
            if ((ty >> 2) == pass) {
#pragma unroll
                for (int i = 0; i < 4; ++i)
#pragma unroll
                    for (int ch = 0; ch < NCH; ++ch)
#pragma unroll
                        for (int e = 0; e < CW; ++e)
                            tile.v[(ty & 3) * 4 + i][ch * CW * 16 + tx * CW + e] = o[i][ch * CW + e];
            }
            cache.unrotate(&tile.v[0][0], FLASH_VC * DWV);
            for (int idx = tid; idx < FLASH_VC * DH; idx += FLASH_THREADS) {
                const int lr = idx / DH;
                const int dim = idx - lr * DH;
                if (!rows.has_row(pass * FLASH_VC + lr)) continue;
                out.o[(rows.head_row(pass * FLASH_VC + lr) * out.n_splits + rows.split) * DH + dim] = tile.v[lr][dim];
            }
            __syncthreads();  // the next pass overwrites tile.v
        }
    }
}

}  // namespace flash
