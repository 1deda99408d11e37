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
//   logprob_partial  grid nparts, block 256: its slice's (max, sum exp(x - max)) and its LOGPROB_TOP best
//   logprob_final    grid 1, block 256: the partials combined in float64, the best LOGPROB_TOP of all the
//                    slices' lists, and the logit of the token the sampler picked
// An entry's place in the listing order is one 64-bit key (list_key), so "best" is an unsigned max and a
// list is a descending run of keys, 0-padded.
//   - the partial takes its slice's best in LOGPROB_TOP block-wide rounds, each the best key below the
//     previous round's (the slice stays in L1 after the normaliser's pass);
//   - the final merges the slices' lists: each thread holds one (staged in shared memory, nparts <=
//     LOGPROB_MAX_PARTS), each warp merges its 32 lists in rounds of a warp max (shuffles only), then warp 0
//     merges the 8 warps' lists. Block-wide rounds over every candidate, three barriers and a serial combine
//     each, took 42.9 µs here on the H200 (2026-12-04, s18a), the merge 9.0 (s18b). The same warp rounds in
//     the partial (each warp's part of the slice, then the 8 lists merged) were slower than its block rounds:
//     21.5 µs for one row and 59.8 for four (s18b), against 19.2 and 47.5 for the block rounds over keys
//     (s18c) and 18.9 and 42.6 for the block rounds before keys (s18a).
// A vocabulary with fewer than LOGPROB_TOP non-NaN entries leaves the tail of the record at id -1.
#include "sampling.cuh"

#define LOGPROB_TOP 20          // engine/generation/logprobs.py MAX_TOP_LOGPROBS
#define LOGPROB_MAX_PARTS 256   // engine/cuda/logprobs.py LOGPROB_MAX_PARTS: one slice's list per final thread
#define LOGPROB_WARPS (SAMPLE_THREADS / 32)

typedef unsigned long long ListKey;  // 0: no entry

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

// Larger keys are listed first: the logit's sampling.cuh order_key (-0.0 as +0.0: they compare equal), then
// ~id, so equal logits go to the lower id. NaN is never listed (key 0); every other key is above 0, since
// ~id has its top bit set for id >= 0.
__device__ __forceinline__ ListKey list_key(float x, int id) {
    if (x != x) return 0ull;
    return ((ListKey)order_key(x) << 32) | (unsigned)~id;
}

__device__ __forceinline__ float key_logit(ListKey k) {
    return k == 0ull ? NEG_INF_F : key_value((unsigned)(k >> 32));
}

__device__ __forceinline__ int key_id(ListKey k) { return k == 0ull ? -1 : (int)~(unsigned)k; }

// Every lane gets the warp's largest key.
__device__ __forceinline__ ListKey warp_max_key(ListKey k) {
    for (int off = 16; off > 0; off >>= 1) {
        const ListKey o = __shfl_xor_sync(0xffffffffu, k, off);
        k = o > k ? o : k;
    }
    return k;
}

// The warp's LOGPROB_TOP best of its lanes' lists (each descending, LOGPROB_TOP keys, 0-padded; nullptr:
// the lane has none) into out[] (lane 0 writes): each round the warp's max of the lanes' heads, and the
// lane whose head it was moves to its next key (keys are unique: ids are).
__device__ void warp_merge_lists(const ListKey* list, ListKey* out) {
    const int lane = threadIdx.x % 32;
    int pos = 0;
    ListKey head = list != nullptr ? list[0] : 0ull;
    for (int r = 0; r < LOGPROB_TOP; ++r) {
        const ListKey best = warp_max_key(head);
        if (lane == 0) out[r] = best;
        if (head == best && best != 0ull) head = ++pos < LOGPROB_TOP ? list[pos] : 0ull;
    }
}

struct MergeOf {
    __device__ LogprobPartial operator()(LogprobPartial a, LogprobPartial b) const {
        if (b.max == NEG_INF_F) return a;
        if (a.max == NEG_INF_F) return b;
        const float m = fmaxf(a.max, b.max);
        return LogprobPartial{m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
    }
    __device__ LogprobPartial down(LogprobPartial v, int off) const {
        return LogprobPartial{__shfl_down_sync(0xffffffffu, v.max, off), __shfl_down_sync(0xffffffffu, v.sum, off)};
    }
};

struct MaxKeyOf {
    __device__ ListKey operator()(ListKey a, ListKey b) const { return a > b ? a : b; }
    __device__ ListKey down(ListKey v, int off) const { return __shfl_down_sync(0xffffffffu, v, off); }
};

struct MaxOf {
    __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
    __device__ float down(float v, int off) const { return __shfl_down_sync(0xffffffffu, v, off); }
};

// Block-wide reduction of one value per thread by `op` (an associative combine and its warp shuffle);
// every thread gets the result. All SAMPLE_THREADS threads must call it.
template <class T, class Op>
__device__ T block_all_reduce(T v, Op op) {
    __shared__ T warp_vals[LOGPROB_WARPS];
    __shared__ T result;
    for (int off = 16; off > 0; off >>= 1) v = op(v, op.down(v, off));
    if (threadIdx.x % 32 == 0) warp_vals[threadIdx.x / 32] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < LOGPROB_WARPS; ++w) v = op(v, warp_vals[w]);
        result = v;
    }
    __syncthreads();
    const T out = result;
    __syncthreads();  // the next call may overwrite `result`
    return out;
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
logprob_partial(const float* __restrict__ logits, int V, const int* __restrict__ wanted,
                LogprobPartial* __restrict__ part, ListKey* __restrict__ cand, const int* __restrict__ row_slot) {
    const int row = blockIdx.y;  // several rows in one launch: sampling.cu's "Rows" (wanted is the slot's)
    if (row_slot != nullptr) wanted += row_slot[row];
    if (*wanted == 0) return;
    logits += (size_t)row * V;
    part += (size_t)row * gridDim.x;
    cand += ((size_t)row * gridDim.x + blockIdx.x) * LOGPROB_TOP;
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
    ListKey prev = ~0ull;
    for (int r = 0; r < LOGPROB_TOP; ++r) {  // each round the slice's best key below the previous round's
        ListKey best = 0ull;
        for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
            const ListKey k = list_key(logits[v], v);
            if (k < prev && k > best) best = k;
        }
        prev = block_all_reduce(best, MaxKeyOf{});
        if (threadIdx.x == 0) cand[r] = prev;
    }
}

extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
logprob_final(const float* __restrict__ logits, int V, const int* __restrict__ wanted,
              const LogprobPartial* __restrict__ part, const ListKey* __restrict__ cand, int nparts,
              const int* __restrict__ token, LogprobRow* __restrict__ out, const int* __restrict__ row_slot) {
    const int row = blockIdx.y;
    if (row_slot != nullptr) wanted += row_slot[row];
    if (*wanted == 0) return;
    logits += (size_t)row * V;
    part += (size_t)row * nparts;
    cand += (size_t)row * nparts * LOGPROB_TOP;
    token += row;
    out += row;
    __shared__ ListKey lists[LOGPROB_MAX_PARTS * LOGPROB_TOP];  // nparts <= LOGPROB_MAX_PARTS (host-checked)
    for (int i = threadIdx.x; i < nparts * LOGPROB_TOP; i += SAMPLE_THREADS) lists[i] = cand[i];
    const int t = threadIdx.x;
    const LogprobPartial mine = t < nparts ? part[t] : LogprobPartial{NEG_INF_F, 0.0f};
    const float m = block_all_reduce(mine.max, MaxOf{});  // also the barrier after the staging
    __shared__ double shared_sum[SAMPLE_THREADS];
    shared_sum[t] = (m != NEG_INF_F && mine.max != NEG_INF_F) ? (double)mine.sum * exp((double)mine.max - (double)m)
                                                              : 0.0;
    __syncthreads();
    for (int off = SAMPLE_THREADS / 2; off > 0; off >>= 1) {
        if (t < off) shared_sum[t] += shared_sum[t + off];
        __syncthreads();
    }
    __shared__ ListKey warp_lists[LOGPROB_WARPS][LOGPROB_TOP];
    warp_merge_lists(t < nparts ? lists + t * LOGPROB_TOP : nullptr, warp_lists[t / 32]);
    __syncthreads();
    if (t < 32) {
        __shared__ ListKey best[LOGPROB_TOP];
        warp_merge_lists(t < LOGPROB_WARPS ? warp_lists[t] : nullptr, best);
        __syncwarp();
        if (t < LOGPROB_TOP) {
            out->top_id[t] = key_id(best[t]);
            out->top_logit[t] = key_logit(best[t]);
        }
    }
    if (t == 0) {
        out->lse = m == NEG_INF_F ? (double)NEG_INF_F : (double)m + log(shared_sum[0]);
        const int tok = *token;
        out->token = tok;
        out->token_logit = (tok >= 0 && tok < V) ? logits[tok] : __int_as_float(0x7fc00000);
    }
}
