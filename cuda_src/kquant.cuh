// K-quant weights (ggml Q4_K, Q5_K, Q6_K) in their device layouts, decoded a "slice" at a time for DP4A.
//
// A super-block holds 256 values of one row (K % 256 == 0). Device layouts (engine/cuda/kq_layout.py writes
// them; every row and every 16-byte load below is 16-byte aligned):
//
//   Q4_K  ggml's own 144-byte blocks, [rows][K/256]: d fp16, dmin fp16, scales[12] (6-bit scale and min of
//         eight 32-value sub-blocks, packed as ggml's get_scale_min_k4 reads them), qs[128]: chunk c (values
//         64c .. 64c+63) is qs[32c .. 32c+31], low nibble = value 64c + l, high nibble = value 64c + 32 + l.
//         value = d * sc_j * q - dmin * m_j, q in 0..15, sub-block j = value / 32.
//   Q5_K  ggml's own 176-byte blocks: d, dmin, scales[12], qh[32], qs[128]; as Q4_K plus a fifth bit:
//         bit 2c of qh[l] for value 64c + l, bit 2c+1 for value 64c + 32 + l. q in 0..31.
//   Q6_K  ggml's 210-byte block is not 16-byte aligned, so rows are repacked into four arrays, one after
//         the other in one buffer (sizes in bytes): q4 [rows][K/2], qh [rows][K/4], sc int8 [rows][K/16],
//         d fp16 [rows][K/256]. Per 64-value unit u of a row: q4 bytes 32u .. 32u+31, byte b: low nibble =
//         low 4 bits of value 64u + b, high nibble = of value 64u + 32 + b; qh bytes 16u .. 16u+15, byte b
//         bits 2s .. 2s+1 = high 2 bits of value 64u + 16s + b (s = 0..3); sc[4u + s] = the int8 scale of
//         values 64u + 16s .. +15. value = d * sc * (q - 32), q in 0..63 (the same numbers as ggml's block).
//
// A slice is 16 bytes of 4-bit payload: slice g of a row (g < K/32) covers 16 values of Q8_1 activation
// block lo = 2 * (g / 2) and the same 16 positions of block hi = lo + 1, namely positions 16 * (g % 2) .. +15
// of each. Per activation block the slice has one integer scale s and one min term m (dmin * m_j for
// Q4_K/Q5_K, 0 for Q6_K), so its exact contribution against Q8_1 activations (xq, xd) is
//
//     xd_lo * (d * s_lo * dot(lo, xq_lo) - m_lo * sum(xq_lo)) + xd_hi * (d * s_hi * dot(hi, xq_hi) - m_hi * sum(xq_hi))
//
// with the dot products and sums over the slice's 16 positions in int32. Weight values in lo/hi are int8
// lanes: 0..15 (Q4_K), 0..31 (Q5_K), -32..31 (Q6_K).
#pragma once

#include "common.cuh"

#define RIGLLM_Q4_K 12  // ggml type ids, used as template arguments
#define RIGLLM_Q5_K 13
#define RIGLLM_Q6_K 14

namespace rigllm {

template <int TYPE>
struct KQuant;

// The raw 16-byte loads of one slice, issued before any is decoded so several are in flight.
struct KqRaw {
    int4 q;       // 4-bit payload
    int4 h;       // Q4_K/Q5_K: block header (d, dmin, scales); Q6_K: the unit's qh bytes
    int4 qh;      // Q5_K: the qh bytes of the slice's 16 positions
    int sc;       // Q6_K: the unit's four int8 scales
    unsigned short d;  // Q6_K: the super-block's fp16 scale
};

struct KqSlice {
    int lo[4], hi[4];  // int8x4 weight lanes against activation blocks lo and hi
    int s_lo, s_hi;    // integer scales
    float d;           // super-block scale
    float m_lo, m_hi;  // min terms (0 for Q6_K)
};

// 6-bit scale and min of sub-block j (0..7) from the three 32-bit words of a block's scales[12]: sub-blocks 0-3
// keep 6 bits in byte j of s0 (scale) and s1 (min); 4-7 keep their low 4 bits in the nibbles of byte j - 4 of s2
// and their high 2 bits in the top bits of byte j - 4 of s0 / s1 (ggml's get_scale_min_k4). Both forms are
// computed and one selected: neighbouring lanes of a GEMV warp decode different j, and a branch here made the
// warp run both sides one after the other (the divergent sections were a third of the Q4_K GEMV's loop, H200
// SASS of 2026-12-02).
__device__ __forceinline__ void scale_min_k4(int j, unsigned s0, unsigned s1, unsigned s2, int& sc, int& m) {
    const int shift = 8 * (j & 3);
    const unsigned q0 = s0 >> shift, q1 = s1 >> shift, q2 = s2 >> shift;
    const bool upper = j >= 4;
    sc = (int)(upper ? (q2 & 0xFu) | ((q0 >> 2) & 0x30u) : q0 & 63u);
    m = (int)(upper ? ((q2 >> 4) & 0xFu) | ((q1 >> 2) & 0x30u) : q1 & 63u);
}

__device__ __forceinline__ void decode_header(const int4 h, int c, KqSlice& s) {
    s.d = __half2float(__ushort_as_half((unsigned short)(h.x & 0xffff)));
    const float dmin = __half2float(__ushort_as_half((unsigned short)((unsigned)h.x >> 16)));
    int m_lo, m_hi;
    scale_min_k4(2 * c, (unsigned)h.y, (unsigned)h.z, (unsigned)h.w, s.s_lo, m_lo);
    scale_min_k4(2 * c + 1, (unsigned)h.y, (unsigned)h.z, (unsigned)h.w, s.s_hi, m_hi);
    s.m_lo = dmin * (float)m_lo;
    s.m_hi = dmin * (float)m_hi;
}

__device__ __forceinline__ void split_nibbles(const int4 q, KqSlice& s) {
    const int w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        s.lo[i] = w[i] & 0x0F0F0F0F;
        s.hi[i] = (w[i] >> 4) & 0x0F0F0F0F;
    }
}

template <>
struct KQuant<RIGLLM_Q4_K> {
    static constexpr bool HAS_MIN = true;
    static constexpr int BLOCK_BYTES = 144;
    // Bytes of one row in the device layout.
    static __device__ __forceinline__ size_t row_bytes(int K) { return (size_t)(K / 256) * BLOCK_BYTES; }
    static __device__ __forceinline__ void load(const unsigned char* __restrict__ w, int rows, int K, int row, int g,
                                                KqRaw& r) {
        const int4* blk = reinterpret_cast<const int4*>(w + (size_t)row * row_bytes(K) + (size_t)(g >> 3) * BLOCK_BYTES);
        r.q = __ldcs(blk + 1 + (g & 7));
        r.h = __ldg(blk);
    }
    static __device__ __forceinline__ void decode(const KqRaw& r, int g, KqSlice& s) {
        split_nibbles(r.q, s);
        decode_header(r.h, (g & 7) >> 1, s);
    }
};

template <>
struct KQuant<RIGLLM_Q5_K> {
    static constexpr bool HAS_MIN = true;
    static constexpr int BLOCK_BYTES = 176;
    static __device__ __forceinline__ size_t row_bytes(int K) { return (size_t)(K / 256) * BLOCK_BYTES; }
    static __device__ __forceinline__ void load(const unsigned char* __restrict__ w, int rows, int K, int row, int g,
                                                KqRaw& r) {
        const int4* blk = reinterpret_cast<const int4*>(w + (size_t)row * row_bytes(K) + (size_t)(g >> 3) * BLOCK_BYTES);
        r.q = __ldcs(blk + 3 + (g & 7));
        r.h = __ldg(blk);
        r.qh = __ldg(blk + 1 + (g & 1));
    }
    static __device__ __forceinline__ void decode(const KqRaw& r, int g, KqSlice& s) {
        split_nibbles(r.q, s);
        const int c = (g & 7) >> 1;
        decode_header(r.h, c, s);
        const int h[4] = {r.qh.x, r.qh.y, r.qh.z, r.qh.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            s.lo[i] |= (((unsigned)h[i] >> (2 * c)) & 0x01010101u) << 4;
            s.hi[i] |= (((unsigned)h[i] >> (2 * c + 1)) & 0x01010101u) << 4;
        }
    }
};

template <>
struct KQuant<RIGLLM_Q6_K> {
    static constexpr bool HAS_MIN = false;
    static __device__ __forceinline__ void load(const unsigned char* __restrict__ w, int rows, int K, int row, int g,
                                                KqRaw& r) {
        const size_t n = (size_t)rows * K;  // values in the matrix
        const size_t unit = (size_t)row * (K / 64) + (g >> 1);
        r.q = __ldcs(reinterpret_cast<const int4*>(w) + (size_t)row * (K / 32) + g);
        r.h = __ldg(reinterpret_cast<const int4*>(w + n / 2) + unit);
        r.sc = __ldg(reinterpret_cast<const int*>(w + n / 2 + n / 4) + unit);
        r.d = __ldg(reinterpret_cast<const unsigned short*>(w + n / 2 + n / 4 + n / 16) + (size_t)row * (K / 256) + (g >> 3));
    }
    static __device__ __forceinline__ void decode(const KqRaw& r, int g, KqSlice& s) {
        const int half = g & 1;
        const int q[4] = {r.q.x, r.q.y, r.q.z, r.q.w};
        const int h[4] = {r.h.x, r.h.y, r.h.z, r.h.w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const unsigned lo = ((unsigned)q[i] & 0x0F0F0F0Fu) | ((((unsigned)h[i] >> (2 * half)) & 0x03030303u) << 4);
            const unsigned hi =
                (((unsigned)q[i] >> 4) & 0x0F0F0F0Fu) | ((((unsigned)h[i] >> (4 + 2 * half)) & 0x03030303u) << 4);
            s.lo[i] = (int)__vsub4(lo, 0x20202020u);  // bytewise q - 32, no borrow between lanes
            s.hi[i] = (int)__vsub4(hi, 0x20202020u);
        }
        s.s_lo = (int)(signed char)((unsigned)r.sc >> (8 * half));
        s.s_hi = (int)(signed char)((unsigned)r.sc >> (8 * (2 + half)));
        s.d = __half2float(__ushort_as_half(r.d));
        s.m_lo = 0.0f;
        s.m_hi = 0.0f;
    }
};

__device__ __forceinline__ int dot4(const int a[4], const int4 b) {
    int acc = __dp4a(a[0], b.x, 0);
    acc = __dp4a(a[1], b.y, acc);
    acc = __dp4a(a[2], b.z, acc);
    return __dp4a(a[3], b.w, acc);
}

// Sum of the 16 int8 lanes of b.
__device__ __forceinline__ int sum16(const int4 b) {
    const int ones = 0x01010101;
    return __dp4a(b.w, ones, __dp4a(b.z, ones, __dp4a(b.y, ones, __dp4a(b.x, ones, 0))));
}

}  // namespace rigllm
