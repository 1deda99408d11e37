// Quantised KV cache storage (engine/model/kv_formats.py, bytes defined by engine/reference/kv_quant.py):
// the per-side codecs, reading N consecutive stored values of a head vector in the attention domain,
// and the 128-point Walsh-Hadamard butterflies in shared memory.
//
// A cache side of one layer is two planes, [n_head_kv][capacity] rows each:
//   codes  ROW_BYTES bytes per row   int8: Dh int8 codes; wht4: 64 B per 128-block (value i in byte i/2,
//                                    low nibble for even i); wht3: 48 B per block = 3 bit planes of 16 B
//                                    (bit b of code i at plane b, byte i/8, bit i%8)
//   side   N_SIDE fp16 per row       int8: scale d per 32 values; wht: norm n per 128-block
// Domain: int8 values are the head vector (x ≈ code * d); wht values are the rotated block y = R x with
// R = H diag(s) / sqrt(128), stored as centroid[code] * n, and Dh < 128 is zero-padded to one block.
// Attention scores the rotated q against them and sums values in the rotated domain (R is orthogonal).
//
// `tables` (engine.reference.kv_quant.device_tables, uploaded once per card) holds the constants:
// [0,128) signs s, [128,144) 4-bit centroids, [144,159) their boundaries, [159,167) 3-bit centroids,
// [167,174) their boundaries.
#pragma once

#include <cuda_fp16.h>
#include "common.cuh"

namespace kv {

enum Codec { INT8 = 1, WHT4 = 2, WHT3 = 3 };

constexpr int BLOCK = 128;
constexpr float INV_SQRT_BLOCK = 0.08838834764831845f;  // float32(1/sqrt(128)), as the reference
constexpr int TABLE_SIGNS = 0;

__host__ __device__ constexpr bool rotated(int c) { return c == WHT4 || c == WHT3; }
__host__ __device__ constexpr int domain(int c, int dh) { return rotated(c) ? (dh + BLOCK - 1) / BLOCK * BLOCK : dh; }
__host__ __device__ constexpr int row_bytes(int c, int dh) {
    return c == INT8 ? dh : c == WHT4 ? domain(c, dh) / 2 : domain(c, dh) * 3 / 8;
}
__host__ __device__ constexpr int n_side(int c, int dh) { return c == INT8 ? dh / 32 : domain(c, dh) / BLOCK; }
__host__ __device__ constexpr int levels(int c) { return c == WHT4 ? 16 : c == WHT3 ? 8 : 0; }
__host__ __device__ constexpr int table_centroids(int c) { return c == WHT4 ? 128 : 159; }
__host__ __device__ constexpr int table_boundaries(int c) { return c == WHT4 ? 144 : 167; }

// One side of one layer's cache, and the rows of one KV head in it (row offsets in int: a head holds
// at most 2^31 bytes, i.e. capacity * ROW_BYTES < 2^31, which 262144 rows of 256 int8 values satisfy).
template <int C, int DH>
struct HeadRows {
    const unsigned char* __restrict__ codes;
    const __half* __restrict__ side;

    __device__ __forceinline__ const unsigned char* code_row(int pos) const { return codes + pos * row_bytes(C, DH); }
    __device__ __forceinline__ const __half* side_row(int pos) const { return side + pos * n_side(C, DH); }
};

template <int C, int DH>
struct Side {
    const unsigned char* __restrict__ codes;
    const __half* __restrict__ side;
    int capacity;

    __device__ __forceinline__ HeadRows<C, DH> head(int h) const {
        return {codes + (size_t)h * capacity * row_bytes(C, DH), side + (size_t)h * capacity * n_side(C, DH)};
    }
};

// N (1, 2, 4 or 8) consecutive bytes starting at p (N-byte aligned) as 32-bit little-endian words:
// byte i of the run is (w[i / 4] >> 8 * (i % 4)) & 0xff.
template <int N>
__device__ __forceinline__ void load_bytes(const unsigned char* p, unsigned int* w) {
    if constexpr (N == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(p);
        w[0] = v.x;
        w[1] = v.y;
    } else if constexpr (N == 4) {
        w[0] = *reinterpret_cast<const unsigned int*>(p);
    } else if constexpr (N == 2) {
        w[0] = *reinterpret_cast<const unsigned short*>(p);
    } else {
        w[0] = *p;
    }
}

// A lane's share of one stored row, values [dim0, dim0 + N), kept packed in registers (a few words instead
// of N floats) with the scale of its block (int8 d, or wht norm), so a warp can have many rows in flight:
// the decode loads KEYS rows before expanding any of them, and applies the scale once per lane and key
// (to the partial score, and to the softmax weight of the value row) instead of once per value.
template <int C, int N>
struct Packed {
    unsigned int w[C == INT8 ? (N + 3) / 4 : 1];
    float scale;
};

template <int C, int N>
__device__ __forceinline__ void load_packed(const unsigned char* __restrict__ row, const __half* __restrict__ side,
                                            int dim0, Packed<C, N>& out) {
    if constexpr (C == INT8) {
        load_bytes<N>(row + dim0, out.w);
        out.scale = __half2float(side[dim0 >> 5]);
    } else if constexpr (C == WHT4) {
        const int blk = dim0 >> 7;
        load_bytes<N / 2>(row + blk * 64 + ((dim0 & 127) >> 1), out.w);
        out.scale = __half2float(side[blk]);
    } else {
        const int blk = dim0 >> 7;
        const unsigned char* p = row + blk * 48 + ((dim0 & 127) >> 3);
        const int shift = dim0 & 7;
        out.w[0] = ((unsigned int)(p[0] >> shift) & 0xff) | (((unsigned int)(p[16] >> shift) & 0xff) << 8) |
                   (((unsigned int)(p[32] >> shift) & 0xff) << 16);
        out.scale = __half2float(side[blk]);
    }
}

// The N unscaled values of a packed share: int8 codes, or centroids (`centroids`: the codec's codebook
// in shared memory; unused for INT8).
template <int C, int N>
__device__ __forceinline__ void expand(const Packed<C, N>& in, const float* centroids, float* out) {
    if constexpr (C == INT8) {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = (float)(signed char)((in.w[i >> 2] >> (8 * (i & 3))) & 0xff);
    } else if constexpr (C == WHT4) {
#pragma unroll
        for (int i = 0; i < N; ++i) out[i] = centroids[(in.w[0] >> (4 * i)) & 15];
    } else {
        const unsigned int w = in.w[0];
#pragma unroll
        for (int i = 0; i < N; ++i)
            out[i] = centroids[((w >> i) & 1) | (((w >> (8 + i)) & 1) << 1) | (((w >> (16 + i)) & 1) << 2)];
    }
}

// Values [dim0, dim0 + N) of a stored row in the attention domain, scaled (code * d, or centroid * norm):
// what a shared-memory tile holds. dim0 is a multiple of N; N values never straddle a 32- or 128-block.
template <int C, int N>
__device__ __forceinline__ void dequant(const unsigned char* __restrict__ row, const __half* __restrict__ side,
                                        int dim0, const float* centroids, float* out) {
    Packed<C, N> p;
    load_packed<C, N>(row, side, dim0, p);
    expand<C, N>(p, centroids, out);
#pragma unroll
    for (int i = 0; i < N; ++i) out[i] *= p.scale;
}

// Unnormalised Walsh-Hadamard transform of n_blocks consecutive 128-float blocks in shared memory, by
// all `nthreads` threads of the block (butterflies h = 1, 2, ..., 64: the reference's order, so both
// round alike). Starts and ends with a barrier.
__device__ __forceinline__ void fwht_shared(float* buf, int n_blocks, int tid, int nthreads) {
#pragma unroll 1
    for (int h = 1; h < BLOCK; h <<= 1) {
        __syncthreads();
        for (int idx = tid; idx < n_blocks * (BLOCK / 2); idx += nthreads) {
            const int j = idx & (BLOCK / 2 - 1);
            float* p = buf + (idx >> 6) * BLOCK + (j & ~(h - 1)) * 2 + (j & (h - 1));
            const float a = p[0], b = p[h];
            p[0] = a + b;
            p[h] = a - b;
        }
    }
    __syncthreads();
}

}  // namespace kv

// Un-rotate n_blocks 128-blocks in shared memory in place: x = s * (H y / sqrt(128)), the reference's order.
__device__ __forceinline__ void unrotate_shared(float* buf, int n_blocks, const float* sign, int tid, int nthreads) {
    kv::fwht_shared(buf, n_blocks, tid, nthreads);
    for (int idx = tid; idx < n_blocks * kv::BLOCK; idx += nthreads)
        buf[idx] = (buf[idx] * kv::INV_SQRT_BLOCK) * sign[idx & (kv::BLOCK - 1)];
    __syncthreads();
}

// The codec's codebook into shared memory (rotated codecs; INT8 has none), by the first threads.
__device__ __forceinline__ void load_centroids(float* dst, int codec, const float* __restrict__ tables) {
    if (kv::rotated(codec) && (int)threadIdx.x < kv::levels(codec))
        dst[threadIdx.x] = tables[kv::table_centroids(codec) + threadIdx.x];
}
