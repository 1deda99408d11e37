// Microbenchmark kernels (engine/cuda/bench/microbench.py, `rigllm bench`): the DP4A peak probe and random Q8_0 weights
// made on the device, so speed runs need neither a model file nor gigabytes over PCIe.
#include "common.cuh"

// DP4A throughput: CHAINS independent accumulator chains per thread, `iters` rounds. Inputs come from the thread
// index so nothing folds at compile time; the result is stored only if it equals `never` (a value the caller
// knows cannot occur), which keeps the work alive without a store per thread.
// Work: gridDim.x * blockDim.x * iters * CHAINS DP4A instructions, 4 int8 MACs (8 ops) each.
#define RIGLLM_DP4A_CHAINS 8

extern "C" __global__ void __launch_bounds__(256) dp4a_peak(int* __restrict__ out, int iters, int never) {
    const int seed = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int b = seed ^ 0x5a5a5a5a;
    int acc[RIGLLM_DP4A_CHAINS];
#pragma unroll
    for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) acc[c] = seed + c;
    for (int i = 0; i < iters; ++i) {
#pragma unroll
        for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) acc[c] = __dp4a(acc[c], b, acc[c]);  // one DP4A per step, no other ALU op
    }
    int total = 0;
#pragma unroll
    for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) total += acc[c];
    if (total == never) out[0] = total;
}

// The ceiling of a Q8 dot product's instruction mix: as dp4a_peak, but every DOTS DP4As of a chain are folded into an
// fp32 accumulator as the GEMM and GEMV fold a block's integer sum (acc += float(sum) * (d_w * d_x)): the bias
// subtraction, the scale product and the FMA, three FP32 instructions. A Q8_0 x Q8_1 product takes 8 DP4As per
// 32-value block, so per output and block the GEMM's tile runs DOTS = 8; the GEMV, whose lanes each take half a
// block, runs DOTS = 4 per (row, token). Where DP4A and FP32 share the FMA pipe, the mix caps the DP4A rate at
// DOTS / (DOTS + 3) of dp4a_peak's; where they issue side by side, at its full rate. Each round's first DP4A takes
// the last one's sum as its input (so the chain carries over rounds with no extra instruction) and starts from the
// bias; the scale product changes each round (the round number's bits), as a tile's scales change per block.
template <int DOTS>
__device__ __forceinline__ void dp4a_fold_body(float* out, int iters, int never) {
    const int seed = (int)(blockIdx.x * blockDim.x + threadIdx.x);
    const int b = seed ^ 0x5a5a5a5a;
    int x[RIGLLM_DP4A_CHAINS];
    float acc[RIGLLM_DP4A_CHAINS], scale[RIGLLM_DP4A_CHAINS];
#pragma unroll
    for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) {
        x[c] = seed + c;
        acc[c] = 0.f;
        scale[c] = __int_as_float(0x3f800000 + seed + c);
    }
    for (int i = 0; i < iters; ++i) {
        const float round_scale = __int_as_float(0x3f800000 + i);
#pragma unroll
        for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) {
            x[c] = __dp4a(x[c], b, rigllm::DOT_FLOAT_BIAS);
#pragma unroll
            for (int d = 1; d < DOTS; ++d) x[c] = __dp4a(x[c], b, x[c]);
            acc[c] = fmaf(rigllm::biased_dot_to_float(x[c]), scale[c] * round_scale, acc[c]);
        }
    }
    float total = 0.f;
#pragma unroll
    for (int c = 0; c < RIGLLM_DP4A_CHAINS; ++c) total += acc[c] + (float)x[c];
    if (__float_as_int(total) == never) out[0] = total;
}

extern "C" __global__ void __launch_bounds__(256) dp4a_fold_peak_d8(float* __restrict__ out, int iters, int never) {
    dp4a_fold_body<8>(out, iters, never);
}

extern "C" __global__ void __launch_bounds__(256) dp4a_fold_peak_d4(float* __restrict__ out, int iters, int never) {
    dp4a_fold_body<4>(out, iters, never);
}

// The cost of one node of a CUDA graph: a launch that does (almost) nothing, so back-to-back launches of it in a graph
// time the launch, dependency and drain of a kernel with no work (engine/cuda/bench/decode_bounds.py). It stores only
// if `never` matches, like dp4a_peak, so it has a parameter and a body as a real kernel has.
extern "C" __global__ void graph_node_probe(int* __restrict__ out, int never) {
    if ((int)threadIdx.x == never) out[0] = never;
}

// A stateless 32-bit hash (lowbias32): the same (seed, index) always gives the same value on any device.
__device__ __forceinline__ unsigned hash_u32(unsigned x) {
    x ^= x >> 16;
    x *= 0x7feb352du;
    x ^= x >> 15;
    x *= 0x846ca68bu;
    x ^= x >> 16;
    return x;
}

// Random Q8_0 weights in the device layout: wq int8 uniform in [-127, 127], wd fp16 uniform in
// [scale_lo, scale_lo * 2). n_values = rows * K; grid-stride over 4-byte words of wq and over the scales.
extern "C" __global__ void __launch_bounds__(256) fill_random_q8_0(signed char* __restrict__ wq,
                                                                   __half* __restrict__ wd, long long n_values,
                                                                   unsigned seed, float scale_lo) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n_words = n_values >> 2;
    for (long long i = first; i < n_words; i += stride) {
        const unsigned h = hash_u32((unsigned)i ^ hash_u32(seed ^ (unsigned)(i >> 32)));
        unsigned word = 0;
#pragma unroll
        for (int b = 0; b < 4; ++b) {
            const int v = (int)((h >> (8 * b)) & 0xffu) % 255 - 127;
            word |= (unsigned)(v & 0xff) << (8 * b);
        }
        reinterpret_cast<unsigned*>(wq)[i] = word;
    }
    const long long n_scales = n_values >> 5;
    for (long long i = first; i < n_scales; i += stride) {
        const unsigned h = hash_u32((unsigned)i ^ hash_u32(~seed ^ (unsigned)(i >> 32)));
        wd[i] = __float2half_rn(scale_lo * (1.0f + (float)(h >> 8) * (1.0f / 16777216.0f)));
    }
}

// Random K-quant weights (Q4_K, Q5_K, Q6_K; device layouts in kquant.cuh) for speed runs, in two launches on one
// stream: fill_random_bytes sets every byte from the hash, then set_kq_scales overwrites the fp16 super-block
// scales so values stay small. Q4_K/Q5_K blocks of `block_bytes` get d = scale and dmin = min_scale (random 6-bit
// sc and m centre the values in expectation when min_scale = scale * mean(q)); Q6_K (block_bytes == 0) gets
// d = scale in its d array, the last 2 * n_blocks bytes of the buffer of n_bytes.
extern "C" __global__ void __launch_bounds__(256) fill_random_bytes(unsigned char* __restrict__ w, long long n_bytes,
                                                                    unsigned seed) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long first = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    const long long n_words = n_bytes >> 2;
    for (long long i = first; i < n_words; i += stride)
        reinterpret_cast<unsigned*>(w)[i] = hash_u32((unsigned)i ^ hash_u32(seed ^ (unsigned)(i >> 32)));
    if (first < (n_bytes & 3)) w[n_words * 4 + first] = (unsigned char)hash_u32(seed + (unsigned)first);
}

extern "C" __global__ void __launch_bounds__(256) set_kq_scales(unsigned char* __restrict__ w, long long n_bytes,
                                                                long long n_blocks, int block_bytes, float scale,
                                                                float min_scale) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const unsigned short d = __half_as_ushort(__float2half_rn(scale));
    const unsigned short dmin = __half_as_ushort(__float2half_rn(min_scale));
    for (long long b = (long long)blockIdx.x * blockDim.x + threadIdx.x; b < n_blocks; b += stride) {
        if (block_bytes > 0) {
            unsigned short* head = reinterpret_cast<unsigned short*>(w + b * block_bytes);
            head[0] = d;
            head[1] = dmin;
        } else {
            reinterpret_cast<unsigned short*>(w + n_bytes - 2 * n_blocks)[b] = d;
        }
    }
}
