// Log-probabilities on the card, so a request that asks for them downloads 176 bytes per token instead of
// its whole logits row (about 1 MB at the 248,320-token vocabulary: ~4 ms per token over a CMP's PCIe
// Gen1 x1; architecture rule 8).
//
// Semantics: engine/generation/logprobs.py (the truth). Raw logits, before penalties or temperature: the
// log-normaliser lse = log sum exp(logits) over the finite entries, the picked token's logit, and the
// LOGPROB_TOP best (logit descending, ties by lower id; NaN never listed). The host subtracts lse and
// keeps as many alternatives as the request asked for.
//
// Two launches per row, both static so they can be captured in the decode graph; `wanted` (a slot's
// flag, written by the host per request) makes both return at once for rows that asked for nothing:
//   logprob_partial  grid nparts, block 256: its slice's (max, sum exp(x - max)) and its LOGPROB_TOP best,
//                    found by LOGPROB_TOP block-wide passes over the slice, each taking the best entry
//                    strictly after the previous one in that order (the slice stays in L1/L2)
//   logprob_final    grid 1, block 256: the partials combined in float64, the best LOGPROB_TOP of all
//                    candidates by the same passes, and the logit of the token the sampler picked
// A slice shorter than LOGPROB_TOP pads with id -1; a vocabulary with fewer than LOGPROB_TOP entries
// leaves the tail of the record at id -1.
#include "sampling.cuh"

#define LOGPROB_TOP 20  // engine/generation/logprobs.py MAX_TOP_LOGPROBS

struct __align__(8) LogprobPartial {
    float max;  // -inf: no finite entry in the slice
    float sum;  // sum of exp(x - max) over the slice's finite entries
};

// The record the host downloads (engine/cuda/logprobs.py LOGPROB_DTYPE).
struct LogprobRow {
    double lse;          // log sum exp over the finite logits (-inf when none is finite)
    float token_logit;   // logits[token] of the sampler's pick (NaN when the pick is -1)
    int token;
    int top_id[LOGPROB_TOP];
    float top_logit[LOGPROB_TOP];
};

__device__ __forceinline__ bool after(float v, int id, Best prev) {
    return v < prev.value || (v == prev.value && id > prev.index);
}

__device__ __forceinline__ LogprobPartial merge(LogprobPartial a, LogprobPartial b) {
    if (b.max == NEG_INF_F) return a;
    if (a.max == NEG_INF_F) return b;
    const float m = fmaxf(a.max, b.max);
    return LogprobPartial{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

struct BetterOf {
    __device__ Best operator()(Best a, Best b) const { return better(a, b); }
    __device__ Best down(Best v, int off) const {
        return Best{__shfl_down_sync(0xffffffffu, v.value, off), __shfl_down_sync(0xffffffffu, v.index, off)};
    }
};

struct MergeOf {
    __device__ LogprobPartial operator()(LogprobPartial a, LogprobPartial b) const { return merge(a, b); }
    __device__ LogprobPartial down(LogprobPartial v, int off) const {
        return LogprobPartial{__shfl_down_sync(0xffffffffu, v.max, off), __shfl_down_sync(0xffffffffu, v.sum, off)};
    }
};

// Block-wide reduction of one value per thread by `op` (an associative combine and its warp shuffle);
// every thread gets the result. All SAMPLE_THREADS threads must call it.
template <class T, class Op>
__device__ T block_all_reduce(T v, Op op) {
    __shared__ T warp_vals[SAMPLE_THREADS / 32];
    __shared__ T result;
    for (int off = 16; off > 0; off >>= 1) v = op(v, op.down(v, off));
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SAMPLE_THREADS / 32; ++w) v = op(v, warp_vals[w]);
        result = v;
    }
    __syncthreads();
    const T out = result;
    __syncthreads();  // the next call may overwrite `result`
    return out;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
logprob_partial(const float* __restrict__ logits, int V, const int* __restrict__ wanted,
                LogprobPartial* __restrict__ part, float* __restrict__ cand_logit, int* __restrict__ cand_id,
                const int* __restrict__ row_slot) {
    const int row = blockIdx.y;  // several rows in one launch: sampling.cu's "Rows" (wanted is the slot's)
    if (row_slot != nullptr) wanted += row_slot[row];
    if (*wanted == 0) return;
    logits += (size_t)row * V;
    part += (size_t)row * gridDim.x;
    cand_logit += (size_t)row * gridDim.x * LOGPROB_TOP;
    cand_id += (size_t)row * gridDim.x * LOGPROB_TOP;
    int begin, end;
    block_slice(V, gridDim.x, blockIdx.x, &begin, &end);
    LogprobPartial acc{NEG_INF_F, 0.0f};
    for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
        const float x = logits[v];
        if (!isfinite(x)) continue;
        if (x > acc.max) {
            acc.sum = acc.sum * expf(acc.max - x) + 1.0f;  // expf(-inf) = 0 for the first entry
            acc.max = x;
        } else {
            acc.sum += expf(x - acc.max);
        }
    }
    acc = block_all_reduce(acc, MergeOf{});
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
    Best prev{__int_as_float(0x7f800000), -1};  // +inf, before every entry
    for (int r = 0; r < LOGPROB_TOP; ++r) {
        Best b{NEG_INF_F, 0x7fffffff};
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
            const float x = logits[v];
            if (after(x, v, prev)) b = better(b, Best{x, v});
        }
        b = block_all_reduce(b, BetterOf{});
        if (threadIdx.x == 0) {
            cand_logit[blockIdx.x * LOGPROB_TOP + r] = b.value;
            cand_id[blockIdx.x * LOGPROB_TOP + r] = b.index == 0x7fffffff ? -1 : b.index;
        }
        prev = b;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
logprob_final(const float* __restrict__ logits, int V, const int* __restrict__ wanted,
              const LogprobPartial* __restrict__ part, const float* __restrict__ cand_logit,
              const int* __restrict__ cand_id, int nparts, const int* __restrict__ token, LogprobRow* __restrict__ out,
              const int* __restrict__ row_slot) {
    const int row = blockIdx.y;
    if (row_slot != nullptr) wanted += row_slot[row];
    if (*wanted == 0) return;
    logits += (size_t)row * V;
    part += (size_t)row * nparts;
    cand_logit += (size_t)row * nparts * LOGPROB_TOP;
    cand_id += (size_t)row * nparts * LOGPROB_TOP;
    token += row;
    out += row;
    __shared__ double shared_sum[SAMPLE_THREADS];
    float m = NEG_INF_F;
    for (int i = 0; i < nparts; ++i) m = fmaxf(m, part[i].max);
    double s = 0.0;
    if (m != NEG_INF_F) {
        for (int i = threadIdx.x; i < nparts; i += SAMPLE_THREADS) {
            if (part[i].max != NEG_INF_F) s += (double)part[i].sum * exp((double)part[i].max - (double)m);
        }
    }
    shared_sum[threadIdx.x] = s;
    __syncthreads();
    for (int off = SAMPLE_THREADS / 2; off > 0; off >>= 1) {
        if ((int)threadIdx.x < off) shared_sum[threadIdx.x] += shared_sum[threadIdx.x + off];
        __syncthreads();
    }
    const int n = nparts * LOGPROB_TOP;
    Best prev{__int_as_float(0x7f800000), -1};
    for (int r = 0; r < LOGPROB_TOP; ++r) {
        Best b{NEG_INF_F, 0x7fffffff};
        for (int i = threadIdx.x; i < n; i += SAMPLE_THREADS) {
            const int id = cand_id[i];
            if (id >= 0 && after(cand_logit[i], id, prev)) b = better(b, Best{cand_logit[i], id});
        }
        b = block_all_reduce(b, BetterOf{});
        if (threadIdx.x == 0) {
            out->top_id[r] = b.index == 0x7fffffff ? -1 : b.index;
            out->top_logit[r] = b.value;
        }
        prev = b;
    }
    if (threadIdx.x == 0) {
        out->lse = m == NEG_INF_F ? (double)NEG_INF_F : (double)m + log(shared_sum[0]);
        const int t = *token;
        out->token = t;
        out->token_logit = (t >= 0 && t < V) ? logits[t] : __int_as_float(0x7fc00000);
    }
}
