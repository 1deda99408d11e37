// The speculative-sampling rule on the card (engine/generation/speculative_rule.py is the truth): K drafts
// d_i drawn from the head's distributions q_i, K+1 target rows p_0..p_K from one verify pass; accept d_i
// with probability min(1, p_i(d_i) / q_i(d_i)); at the first rejection draw from norm(max(p_i - q_i, 0))
// and stop; when all K are accepted draw a bonus token from p_K. The emitted tokens are distributed
// exactly as plain token-by-token sampling from p, for any draft distribution.
//
// Every row (draft or target) went through sampling.cu's selection (sample_scores .. sample_draw_partial)
// with the request's parameters and the penalties of its own history, so its distribution is
//   p(v) = w(v) / W,   w(v) = fixed_weight(score v) for v in the support, else 0
// where the support is {key > final_key} plus the first final_ntie ids with key == final_key.
// spec_row_dist turns that into an explicit membership test (tied ids below `tie_cut`) and the total W,
// so p(d) of one token and p(v) - q(v) over the vocabulary can be evaluated anywhere.
//
// A round's launch sequence is static (captured once per slot and owed-row count); a stage that does not
// apply exits at once, steered by SpecRound in device memory:
//   spec_round_begin                                         grid 1
//   per row: sample_scores .. sample_draw_partial, spec_row_dist (drafts also draw, into `drafts`)
//   for i in 0..K-1: spec_accept(i)              grid 1      RUNNING at row i: accept (row i+1) or not
//                    spec_residual_partial(i)    grid nparts only after a rejection at i
//                    spec_final(i)               grid 1      the residual draw (or p_i's, see below)
//   spec_final(K)                                grid 1      the bonus draw after K accepted drafts
// Uniforms come from the request's SampleParams counter (one per acceptance test, one per final draw),
// so a replayed round draws fresh numbers and a seeded request repeats.
// Failures (non-finite scores, a backend bug): a target row that failed ends the round with -1; a draft
// row that failed (its draw wrote -1) ends the drafts, and the round draws its last token from p_i.
#include "sampling.cuh"

#define SPEC_RUNNING 0   // testing drafts; `row` is the next one
#define SPEC_RESIDUAL 1  // draft `row` was rejected: the last token comes from the residual of row `row`
#define SPEC_FINAL 2     // the last token comes from p_row (all drafts accepted, or draft `row` failed)
#define SPEC_DONE 3
#define RESIDUAL_ONE 4503599627370496.0  // 2^52: fixed-point scale of a residual probability

// One row's distribution in explicit form (engine/cuda/speculative_sampling.py mirrors it).
struct __align__(8) RowDist {
    unsigned long long total;  // W: the support's fixed-point mass
    int tie_cut;               // tied tokens (key == final_key) with id < tie_cut are in the support
    int ok;                    // 0: the row failed (non-finite scores) or never ran the selection
};

// The round's progress; `emitted` [K+1] holds the round's tokens (-1 past `n_emitted`).
struct SpecRound {
    int state;
    int row;
    int n_emitted;
    int reserved;
};

static_assert(sizeof(RowDist) == 16, "ROW_DIST_BYTES in engine/cuda/speculative_sampling.py");
static_assert(sizeof(SpecRound) == 16, "ROUND_INTS in engine/cuda/speculative_sampling.py");

__device__ __forceinline__ unsigned long long member_weight(const float* __restrict__ scores, int v,
                                                            const SampleState& st, const RowDist& dist) {
    const float s = scores[v];
    const unsigned key = order_key(s);
    if (!key_finite(key)) return 0ull;
    if (key > st.final_key || (key == st.final_key && v < dist.tie_cut)) return fixed_weight(s, st.smax, st.inv_temp);
    return 0ull;
}

__device__ __forceinline__ double probability(const float* __restrict__ scores, int v, const SampleState& st,
                                              const RowDist& dist) {
    return (double)member_weight(scores, v, st, dist) / (double)dist.total;
}

// max(p(v) - q(v), 0) in fixed point; summed over the vocabulary it stays below 2^53.
__device__ __forceinline__ unsigned long long residual_weight(int v, const float* __restrict__ sp, const SampleState& stp,
                                                              const RowDist& dp, const float* __restrict__ sq,
                                                              const SampleState& stq, const RowDist& dq) {
    const double r = probability(sp, v, stp, dp) - probability(sq, v, stq, dq);
    return r > 0.0 ? (unsigned long long)(r * RESIDUAL_ONE) : 0ull;
}

extern "C" __global__ void spec_round_begin(SpecRound* __restrict__ round, int* __restrict__ emitted, int k) {
    for (int t = threadIdx.x; t <= k; t += blockDim.x) emitted[t] = -1;
    if (threadIdx.x == 0) *round = SpecRound{SPEC_RUNNING, 0, 0, 0};
}

// After a row's sample_draw_partial: its total mass and the id below which tied tokens belong to the support.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
spec_row_dist(const float* __restrict__ scores, int V, const SampleState* __restrict__ st_ptr,
              const DrawPartial* __restrict__ dpart, int nparts, RowDist* __restrict__ out) {
    const SampleState st = *st_ptr;
    if (st.done) {  // failed (or greedy, which a sampled round never is)
        if (threadIdx.x == 0) *out = RowDist{0ull, 0, 0};
        return;
    }
    __shared__ unsigned long long rank;
    __shared__ int slice;
    unsigned long long mass = 0ull, eq = 0ull;
    for (int i = threadIdx.x; i < nparts; i += SAMPLE_THREADS) {
        mass += dpart[i].mass_gt;
        eq += (unsigned long long)dpart[i].n_eq;
    }
    mass = block_sum_u64(mass);  // both sums are valid in thread 0 only: it publishes what all threads need
    eq = block_sum_u64(eq);
    __shared__ unsigned long long ntie, n_eq;
    if (threadIdx.x == 0) {
        n_eq = eq;
        ntie = min(eq, (unsigned long long)st.final_ntie);
        const unsigned long long w_eq = ntie > 0ull ? fixed_weight(key_value(st.final_key), st.smax, st.inv_temp) : 0ull;
        out->total = mass + ntie * w_eq;
        out->ok = out->total > 0ull;
        rank = ntie > 0ull ? ntie - 1ull : 0ull;  // the last tied token inside the support
        slice = slice_of(nparts, (unsigned long long*)&rank, [&](int b) { return (unsigned long long)dpart[b].n_eq; });
    }
    __syncthreads();
    if (ntie == 0ull || ntie == n_eq) {  // no tied token in, or all of them
        if (threadIdx.x == 0) out->tie_cut = ntie == 0ull ? 0 : V;
        return;
    }
    const int last = find_in_slice(V, nparts, slice, rank,
                                   [&](int v) { return (unsigned long long)(order_key(scores[v]) == st.final_key); });
    if (threadIdx.x == 0) out->tie_cut = last + 1;
}

// The acceptance test of draft i against target row i (one thread).
extern "C" __global__ void spec_accept(const float* __restrict__ sp, const SampleState* __restrict__ stp,
                                       const RowDist* __restrict__ dp, const float* __restrict__ sq,
                                       const SampleState* __restrict__ stq, const RowDist* __restrict__ dq,
                                       const int* __restrict__ drafts, SampleParams* __restrict__ params,
                                       SpecRound* __restrict__ round, int* __restrict__ emitted, int i, int k) {
    if (threadIdx.x != 0 || round->state != SPEC_RUNNING || round->row != i) return;
    if (!dp->ok) {
        emitted[i] = -1;
        *round = SpecRound{SPEC_DONE, i, i + 1, 0};
        return;
    }
    const int d = drafts[i];
    if (d < 0 || !dq->ok) {
        round->state = SPEC_FINAL;
        return;
    }
    const double p = probability(sp, d, *stp, *dp);
    const double q = probability(sq, d, *stq, *dq);
    const double u = uniform01(params->seed, params->counter);
    params->counter += 1ull;
    if (u * q < p) {  // u < p/q without dividing (the reference's comparison)
        emitted[i] = d;
        round->row = i + 1;
        if (i + 1 == k) round->state = SPEC_FINAL;
    } else {
        round->state = SPEC_RESIDUAL;
    }
}

// After a rejection at row i: each block's fixed-point residual mass, into rpart.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
spec_residual_partial(const float* __restrict__ sp, const SampleState* __restrict__ stp, const RowDist* __restrict__ dp,
                      const float* __restrict__ sq, const SampleState* __restrict__ stq, const RowDist* __restrict__ dq,
                      int V, const SpecRound* __restrict__ round, int i, DrawPartial* __restrict__ rpart) {
    if (round->state != SPEC_RESIDUAL || round->row != i) return;
    const SampleState st_p = *stp, st_q = *stq;
    const RowDist d_p = *dp, d_q = *dq;
    int begin, end;
    block_slice(V, gridDim.x, blockIdx.x, &begin, &end);
    unsigned long long mass = 0ull;
    for (int v = begin + (int)threadIdx.x; v < end; v += SAMPLE_THREADS) {
        mass += residual_weight(v, sp, st_p, d_p, sq, st_q, d_q);
    }
    mass = block_sum_u64(mass);
    if (threadIdx.x == 0) rpart[blockIdx.x] = DrawPartial{mass, 0, 0};
}

// The round's last token at row i: from the residual after a rejection there, else from p_i (all drafts
// accepted, i = K, or draft i failed). A residual of no mass (p = q to 2^-52 everywhere, where the test
// accepts with certainty anyway) falls back to p_i.
extern "C" __global__ void __launch_bounds__(SAMPLE_THREADS)
spec_final(const float* __restrict__ sp, const SampleState* __restrict__ stp, const RowDist* __restrict__ dp,
           const DrawPartial* __restrict__ dpart_p, const float* __restrict__ sq, const SampleState* __restrict__ stq,
           const RowDist* __restrict__ dq, const DrawPartial* __restrict__ rpart, int V, int nparts,
           SampleParams* __restrict__ params, SpecRound* __restrict__ round, int* __restrict__ emitted, int i) {
    const SpecRound r = *round;
    if ((r.state != SPEC_RESIDUAL && r.state != SPEC_FINAL) || r.row != i) return;
    __syncthreads();  // every thread has read the round before thread 0 rewrites it
    const SampleState st_p = *stp;
    const RowDist d_p = *dp;
    if (!d_p.ok) {
        if (threadIdx.x == 0) {
            emitted[i] = -1;
            *round = SpecRound{SPEC_DONE, i, i + 1, 0};
        }
        return;
    }
    const double u = uniform01(params->seed, params->counter);
    unsigned long long residual = 0ull;
    if (r.state == SPEC_RESIDUAL) {
        for (int b = threadIdx.x; b < nparts; b += SAMPLE_THREADS) residual += rpart[b].mass_gt;
        residual = block_sum_u64(residual);
    }
    __shared__ unsigned long long total, want;
    __shared__ int slice;
    if (threadIdx.x == 0) {
        total = residual;
        unsigned long long rank = (unsigned long long)(u * (double)residual);
        if (rank >= residual) rank = residual - 1ull;
        if (residual > 0ull) slice = slice_of(nparts, &rank, [&](int b) { return rpart[b].mass_gt; });
        want = rank;
    }
    __syncthreads();
    int v;
    if (total > 0ull) {
        const SampleState st_q = *stq;
        const RowDist d_q = *dq;
        v = find_in_slice(V, nparts, slice, want,
                          [&](int t) { return residual_weight(t, sp, st_p, d_p, sq, st_q, d_q); });
    } else {
        v = draw_support(sp, V, st_p, dpart_p, nparts, u);
    }
    if (threadIdx.x == 0) {
        params->counter += 1ull;
        emitted[i] = v;
        *round = SpecRound{SPEC_DONE, i, i + 1, 0};
    }
}
