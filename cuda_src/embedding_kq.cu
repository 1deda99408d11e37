// Token embedding from a K-quant table (Q4_K, Q5_K, Q6_K; device layouts in kquant.cuh): gather rows and
// dequantise them to fp32, bit for bit as ggml / gguf-py dequantise (both compute in fp32):
//
//   Q4_K, Q5_K:  value = (d * sc) * q - (dmin * m)      Q6_K:  value = (d * sc) * (q - 32)
//
// each product and the difference rounded once (no fused multiply-add: __fmul_rn / __fsub_rn keep the
// compiler from contracting them). One CTA per token, each thread expands one 32-value slice per step.
// ids outside [0, vocab) give a NaN row, as embed_q8_0 does (a bug upstream, reported by the sampler).

#include "kquant.cuh"

template <int TYPE>
__device__ __forceinline__ void embed_kq_body(const unsigned char* __restrict__ w, const int* __restrict__ ids,
                                              float* __restrict__ out, int T, int D, int vocab) {
    using Q = rigllm::KQuant<TYPE>;
    const int t = blockIdx.x;
    if (t >= T) return;
    const int id = ids[t];
    float* dst = out + (size_t)t * D;
    if (id < 0 || id >= vocab) {
        const float nan = __int_as_float(0x7fc00000);
        for (int k = threadIdx.x; k < D; k += blockDim.x) dst[k] = nan;
        return;
    }
    for (int g = threadIdx.x; g < D / 32; g += blockDim.x) {
        rigllm::KqRaw raw;
        Q::load(w, vocab, D, id, g, raw);
        rigllm::KqSlice s;
        Q::decode(raw, g, s);
        const float scale[2] = {__fmul_rn(s.d, (float)s.s_lo), __fmul_rn(s.d, (float)s.s_hi)};
        const float mins[2] = {s.m_lo, s.m_hi};
        const int* lanes[2] = {s.lo, s.hi};
        const int first = 32 * ((g >> 1) << 1) + 16 * (g & 1);  // position of the slice's first lo value
#pragma unroll
        for (int part = 0; part < 2; ++part) {
            float4* o = reinterpret_cast<float4*>(dst + first + 32 * part);
#pragma unroll
            for (int i = 0; i < 4; ++i) {
                const int v = lanes[part][i];
                float q[4];
#pragma unroll
                for (int b = 0; b < 4; ++b) q[b] = (float)(signed char)((v >> (8 * b)) & 0xff);
                float r[4];
#pragma unroll
                for (int b = 0; b < 4; ++b)
                    r[b] = Q::HAS_MIN ? __fsub_rn(__fmul_rn(scale[part], q[b]), mins[part]) : __fmul_rn(scale[part], q[b]);
                o[i] = make_float4(r[0], r[1], r[2], r[3]);
            }
        }
    }
}

#define RIGLLM_EMBED_KQ(TNAME, TYPE)                                                                          \
    extern "C" __global__ void __launch_bounds__(256)                                                         \
        embed_##TNAME(const unsigned char* __restrict__ w, const int* __restrict__ ids, float* __restrict__ out, \
                      int T, int D, int vocab) {                                                             \
        embed_kq_body<TYPE>(w, ids, out, T, D, vocab);                                                        \
    }

RIGLLM_EMBED_KQ(q4_k, RIGLLM_Q4_K)
RIGLLM_EMBED_KQ(q5_k, RIGLLM_Q5_K)
RIGLLM_EMBED_KQ(q6_k, RIGLLM_Q6_K)
