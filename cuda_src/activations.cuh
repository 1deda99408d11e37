// The model's elementwise nonlinearities in the reference's forms (engine/reference/activations.py), so
// every kernel computes them the same way: overflow-free for any finite input, accurate expf (never
// __expf: these values feed outputs compared against the reference to a few ulp).
#pragma once

namespace rigllm {

// σ(x) from e^-|x|: nothing overflows and small σ keep full relative precision.
__device__ __forceinline__ float sigmoid(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

__device__ __forceinline__ float silu(float x) { return x * sigmoid(x); }

}  // namespace rigllm
