// Activation quantization to Q8_1: fp32 rows -> int8 values + one scale per 32-value block, the input format of
// every DP4A GEMV/GEMM. One launch quantizes all T rows.
//
// Exactly engine/reference/activation_rounding.py (the reference's "kernel" rounding mode), per 32-block:
//     amax = max|x|;  d = amax / 127 (fp32);  q = amax == 0 ? 0 : roundf(x / d)   (IEEE division, half away from 0)
// and the scale stored is fp16(d) (round to nearest even) widened back to fp32: the dot products use q * fp16(d),
// as the reference does, while q itself is computed with the fp32 d.
//
// Layout: x [T][ld_x] fp32 (the K values of a row are x[row * ld_x + 0 .. K-1], so a column range of a wider
// matrix can be quantized in place); xq [T][K] int8; xd [T][K/32] fp32. K % 32 == 0.
// Launch: one thread per 4 values, 8 threads per block of 32; blockDim a multiple of 32 (e.g. 256),
// grid.x = ceil(T * K / 4 / blockDim.x).
#include "common.cuh"

extern "C" __global__ void __launch_bounds__(256) quantize_q8_1(const float* __restrict__ x, long long ld_x,
                                                                signed char* __restrict__ xq, float* __restrict__ xd,
                                                                int K, int n_rows) {
    const int quads_per_row = K >> 2;
    const long long total = (long long)n_rows * quads_per_row;
    const long long g = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const bool active = g < total;

    long long row = 0;
    int quad = 0;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (active) {
        row = g / quads_per_row;
        quad = (int)(g - row * quads_per_row);
        const float* src = x + row * ld_x + 4 * quad;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = src[i];
    }
    float amax = fmaxf(fmaxf(fabsf(v[0]), fabsf(v[1])), fmaxf(fabsf(v[2]), fabsf(v[3])));
    // The 8 threads of one 32-block are 8 aligned lanes: K % 32 == 0 keeps blocks from straddling rows, and
    // blockDim % 32 == 0 keeps thread g at lane g % 32. Inactive lanes hold zeros and take part in the shuffle.
    amax = rigllm::group_max<8>(amax);
    if (!active) return;

    const float d = amax / 127.0f;
    unsigned packed = 0;
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const int q = amax == 0.0f ? 0 : (int)roundf(v[i] / d);
        packed |= (unsigned)(q & 0xff) << (8 * i);
    }
    *reinterpret_cast<unsigned*>(xq + row * K + 4 * quad) = packed;
    if ((quad & 7) == 0) xd[row * (K >> 5) + (quad >> 3)] = __half2float(__float2half_rn(d));
}
