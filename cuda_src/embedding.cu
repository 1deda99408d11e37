// Token embedding: gather rows of the Q8_0 token-embedding table and dequantise them to fp32.
//
//   out[t][k] = float(d[id][k / 32]) * qs[id][k]      with id = ids[t]
//
// Inputs (the shared SoA weight format): qs int8 [vocab][D] (each row in the blocked payload of
// q8_blocked.cuh, read back in natural order), d __half [vocab][D/32] (D % 32 == 0),
// ids int32 [T] on the device (so a decode graph reads the token the sampler just wrote), out fp32
// [T][D]. One CTA per token; each thread expands 16 int8 values (half a block) per step with one
// 16-byte load and four 16-byte stores.
//
// An id outside [0, vocab) cannot come from our tokenizer or sampler, so it means a bug upstream: the
// row is filled with NaN, which the sampler reports as a failed step (token -1), instead of reading
// out of bounds or silently producing a plausible embedding.

#include <cuda_fp16.h>

#include "q8_blocked.cuh"

extern "C" __global__ void __launch_bounds__(256)
embed_q8_0(const signed char* __restrict__ qs, const __half* __restrict__ d, const int* __restrict__ ids,
           float* __restrict__ out, int T, int D, int vocab) {
    const int t = blockIdx.x;
    if (t >= T) return;
    const int id = ids[t];
    float4* dst = reinterpret_cast<float4*>(out + (size_t)t * D);
    const int n_chunks = D / 16;
    if (id < 0 || id >= vocab) {
        const float nan = __int_as_float(0x7fc00000);
        for (int c = threadIdx.x; c < n_chunks * 4; c += blockDim.x) dst[c] = make_float4(nan, nan, nan, nan);
        return;
    }
    const signed char* row = qs + (size_t)id * D;
    const __half* scales = d + (size_t)id * (D / 32);
    for (int c = threadIdx.x; c < n_chunks; c += blockDim.x) {
        const int4 packed = reinterpret_cast<const int4*>(row)[rigllm::q8_blocked_unit(c, D / 32)];
        const float s = __half2float(scales[c / 2]);
        const int words[4] = {packed.x, packed.y, packed.z, packed.w};
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const int v = words[w];
            dst[c * 4 + w] = make_float4(s * (float)(signed char)(v & 0xff), s * (float)(signed char)((v >> 8) & 0xff),
                                         s * (float)(signed char)((v >> 16) & 0xff), s * (float)(signed char)(v >> 24));
        }
    }
}
