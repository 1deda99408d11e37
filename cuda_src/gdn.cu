// Gated DeltaNet kernels (spec §6.7 steps 2-8, §6.8, §6.9): causal conv + SiLU with its state, the fused
// recurrent form (decode and short batches), the chunked prefill form, and the gated RMSNorm.
//
// The numpy truth is engine/reference/{gated_deltanet,delta_rule,norms,activations}.py; every kernel here
// computes the same quantities in fp32 (spec pitfall 9), only the summation order differs.
//
// Shapes (spec notation; GGUF head order, value head n pairs with key head n % Hk):
//   Ck = Hk*dk, Cv = Hv*dv, Cc = 2*Ck + Cv
//   mix      [T][Cc]  raw attn_qkv output (row stride given), channels q | k | v
//   conv_out [T][Cc]  contiguous, SiLU(conv(mix)): written by gdn_conv_silu, read by the delta-rule kernels
//   conv_w   [Cc][4]  fp32; tap 3 multiplies the current token
//   conv_state [3][Cc] fp32, the last three raw mix rows, oldest first
//   state    [Hv][dk][dv] fp32, rows = key dim, columns = value dim (same orientation as the reference)
//   b, alpha [T][Hv] (row strides given); z [T][Cv] (row stride given); ssm_a, dt_bias [Hv]; norm_w [dv]
// Limits: conv width 4 (every Qwen3.5/3.6 model); dk <= 128; any dv, Hk, Hv with Hv % Hk == 0.
//
// The GDN layer does not depend on the position, so no kernel here reads the per-step buffer: the token
// count of a batch is a kernel argument (a decode graph or a verify-width graph bakes its constant width;
// prefill chunks are launched with their own grids).
#include "q8_1_warp.cuh"

#define GDN_CONV_K 4            // conv width
#define GDN_CONV_TILE 16        // tokens per conv thread; must be >= GDN_CONV_K - 1 (see gdn_conv_silu)
#define GDN_MAX_DK 128          // largest key head dim the delta-rule kernels hold on chip
#define GDN_L2_EPS 1e-6f        // transformers' l2norm: x / sqrt(sum x^2 + 1e-6)
#define GDN_SOFTPLUS_THRESHOLD 20.0f  // torch softplus: identity above 20

#define GDN_RECURRENT_THREADS 256
#define GDN_RECURRENT_COLS 16   // value columns per recurrent block: Hv * dv/16 blocks (256 for 9B, 384 for 27B)
#define GDN_RECURRENT_ROW_GROUPS (GDN_RECURRENT_THREADS / GDN_RECURRENT_COLS)  // 16
#define GDN_RECURRENT_ROWS (GDN_MAX_DK / GDN_RECURRENT_ROW_GROUPS)           // 8 state rows per thread
// 4 resident blocks per SM caps the kernel at 64 registers (no spills; 79 unconstrained), so the 9B shape's
// 256 blocks fit one wave on the CMP's 68 SMs
// gdn_recurrent_wide too: its 16 state rows a thread also fit 64 registers without spills, and the launcher's
// one-wave rule (engine/cuda/gdn.py recurrent_form) counts both forms at this residency
#define GDN_RECURRENT_MIN_BLOCKS 4

#define GDN_CHUNK 64            // chunk length of the parallel form (spec §6.8; same as the reference)
#define GDN_CHUNK_THREADS 256   // 8 warps
#define GDN_CHUNK_WARPS (GDN_CHUNK_THREADS / 32)
#define GDN_CHUNK_COLS 32       // value columns per prefill block: one warp-wide column slice
#define GDN_LDK (GDN_MAX_DK + 1)            // padded row stride of the q/k tiles (conflict-free column reads)
#define GDN_LDM (GDN_CHUNK + 1)             // padded row stride of the 64x64 A / intra matrix
#define GDN_LDU (GDN_CHUNK_COLS + 4)        // row stride of u: conflict-free in the forward substitution
// Dynamic shared memory of gdn_chunk_prefill, in floats: q and k tiles, A/intra, u, then gamma, beta and
// exp(gamma_last - gamma). 23,168 floats = 92,672 bytes: above 48 KB, so the launcher must raise the
// function's CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES (sm_70 allows up to 96 KB per block).
#define GDN_CHUNK_SMEM_FLOATS (2 * GDN_CHUNK * GDN_LDK + GDN_CHUNK * GDN_LDM + GDN_CHUNK * GDN_LDU + 3 * GDN_CHUNK)

// ---------------------------------------------------------------------------------------------------------
// Scalar functions, written in the reference's overflow-free forms (engine/reference/activations.py).

__device__ __forceinline__ float gdn_sigmoid(float x) {
    const float e = expf(-fabsf(x));
    return x >= 0.f ? 1.f / (1.f + e) : e / (1.f + e);
}

__device__ __forceinline__ float gdn_silu(float x) { return x * gdn_sigmoid(x); }

__device__ __forceinline__ float gdn_softplus(float x) {
    return x > GDN_SOFTPLUS_THRESHOLD ? x : log1pf(expf(fminf(x, GDN_SOFTPLUS_THRESHOLD)));
}

// log decay g = ssm_a * softplus(alpha + dt_bias) <= 0 (ssm_a is already -exp(A_log), spec pitfall 2)
__device__ __forceinline__ float gdn_log_decay(float a, float alpha, float dt_bias) {
    return a * gdn_softplus(alpha + dt_bias);
}

// Sum over the whole block (blockDim.x a multiple of 32); every thread gets the same value. `scratch` holds
// >= 32 floats; the leading barrier lets consecutive calls reuse it.
__device__ float gdn_block_sum(float v, float* scratch) {
    v = rigllm::warp_sum(v);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    float total = 0.f;
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) total += scratch[w];
    return total;
}

// Two such sums at once (scratch >= 64 floats), with gdn_block_sum's order for each, so the same bits, in one
// pair of barriers instead of two.
__device__ float2 gdn_block_sum2(float a, float b, float* scratch) {
    a = rigllm::warp_sum(a);
    b = rigllm::warp_sum(b);
    __syncthreads();
    if ((threadIdx.x & 31) == 0) {
        scratch[threadIdx.x >> 5] = a;
        scratch[32 + (threadIdx.x >> 5)] = b;
    }
    __syncthreads();
    float2 total = make_float2(0.f, 0.f);
    for (int w = 0; w < (int)(blockDim.x >> 5); ++w) {
        total.x += scratch[w];
        total.y += scratch[32 + w];
    }
    return total;
}

// y = rmsnorm(o, w, eps) * silu(z) over one head of dv values (spec §6.7 step 8), by the whole block
// (blockDim.x a multiple of 32). When yq is not null the head is also written as Q8_1 for the ssm_out GEMV
// (yq, yd point at the head's first value and first block scale; requires dv % 32 == 0, so no 32-block
// straddles two heads): each warp normalises whole 32-value blocks and quantises them as quantize.cu does.
// o is read through L2 (__ldcg) because in the decode kernel other blocks wrote it; y may alias o (each
// thread rewrites only the elements it read, after the reduction).
__device__ void gdn_gated_norm_head(const float* o, const float* z, const float* w, float* y, signed char* yq,
                                    float* yd, int dv, float eps, float* scratch) {
    float ss = 0.f;
    for (int c = threadIdx.x; c < dv; c += blockDim.x) {
        const float x = __ldcg(o + c);
        ss += x * x;
    }
    ss = gdn_block_sum(ss, scratch);
    const float inv = 1.f / sqrtf(ss / (float)dv + eps);
    const int lane = threadIdx.x & 31;
    for (int c0 = threadIdx.x - lane; c0 < dv; c0 += blockDim.x) {  // warp-uniform loop over 32-blocks
        const int c = c0 + lane;
        float val = 0.f;
        if (c < dv) {
            val = (__ldcg(o + c) * inv) * w[c] * gdn_silu(z[c]);
            y[c] = val;
        }
        if (yq != nullptr) q8_1_quantize_warp(val, yq + c, yd + c0 / 32);
    }
}

// ---------------------------------------------------------------------------------------------------------
// One output of the conv: taps window[0..3] (oldest first) times the channel's weights, summed in tap order.
// gdn_conv_silu and the fused one-token kernels both call it, so both compute the same bits.
__device__ __forceinline__ float gdn_conv_taps(const float (&window)[GDN_CONV_K], const float (&w)[GDN_CONV_K]) {
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < GDN_CONV_K; ++j) acc += window[j] * w[j];
    return acc;
}

// The fused kernels' conv of one new token on channel ch: SiLU(conv) over the state rows and the token's raw value
// mix[row * mix_stride + ch]. (The callers pass the parameters and the row rather than a row pointer: an offset
// pointer held across the recurrence would take registers that, at 64, spill.)
__device__ __forceinline__ float gdn_conv_one(const float* __restrict__ mix, long long mix_stride, int row,
                                              const float* conv_state, const float* __restrict__ conv_w, int ch,
                                              int Cc) {
    float window[GDN_CONV_K], w[GDN_CONV_K];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 1; ++j) window[j] = conv_state[(size_t)j * Cc + ch];
    window[GDN_CONV_K - 1] = mix[(size_t)row * mix_stride + ch];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K; ++j) w[j] = conv_w[(size_t)ch * GDN_CONV_K + j];
    return gdn_silu(gdn_conv_taps(window, w));
}

// ...and its state advance after one token: each state row takes the next one's value, the last the raw value.
__device__ __forceinline__ void gdn_conv_advance(const float* __restrict__ mix, long long mix_stride, int row,
                                                 float* conv_state, int ch, int Cc) {
#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 2; ++j) conv_state[(size_t)j * Cc + ch] = conv_state[(size_t)(j + 1) * Cc + ch];
    conv_state[(size_t)(GDN_CONV_K - 2) * Cc + ch] = mix[(size_t)row * mix_stride + ch];
}

// ---------------------------------------------------------------------------------------------------------
// Causal depthwise conv (width 4) + SiLU over T tokens, continuing from and updating the conv state.
// grid (ceil(Cc / blockDim.x), ceil(T / GDN_CONV_TILE)), any blockDim.x. One thread per (channel, 16-token
// tile). Only tile 0 reads the old state (a tile starting at t0 >= 3 never reaches before the batch), so the
// same thread can then overwrite it with the new state, the last three raw rows of [old state; mix]: a
// batch of fewer than three tokens keeps part of the old state (spec pitfall 7). No other thread touches the
// state, so there is no race.
// conv_ring (null to skip; speculative verify, T <= GDN_CONV_TILE so tile 0 sees every row): also the state
// after each of the first T-1 tokens, ring[k-1] [3][Cc] = rows k..k+2 of [old state; mix], so a rejected
// draft's rows can be dropped by copying ring[j] back instead of re-running the accepted tokens.
// Slot-indexed (row_slot not null, common.cuh; issue 28): grid (ceil(Cc / blockDim.x), 1, rows) with
// n_tokens = 1: row blockIdx.z is the one new token of slot row_slot[row], whose conv state is slot_ptrs entry 0.
extern "C" __global__ void gdn_conv_silu(const float* __restrict__ mix, long long mix_stride,
                                         const float* __restrict__ conv_w, float* __restrict__ conv_state,
                                         float* __restrict__ conv_out, int Cc, int n_tokens,
                                         float* __restrict__ conv_ring, const int* __restrict__ row_slot,
                                         const unsigned long long* __restrict__ slot_ptrs) {
    if (row_slot != nullptr) {  // this block's row as a one-token batch of its own sequence
        const int r = blockIdx.z;
        mix += (size_t)r * mix_stride;
        conv_out += (size_t)r * Cc;
        conv_state = rigllm::slot_ptr<float>(slot_ptrs, row_slot, r, RIGLLM_GDN_SLOT_PTRS, 0);
    }
    const int ch = blockIdx.x * blockDim.x + threadIdx.x;
    const int t0 = blockIdx.y * GDN_CONV_TILE;
    if (ch >= Cc || t0 >= n_tokens) return;
    const int t1 = min(t0 + GDN_CONV_TILE, n_tokens);

    float w[GDN_CONV_K];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K; ++j) w[j] = conv_w[(size_t)ch * GDN_CONV_K + j];

    // window[j] = raw row t - (K-1) + j; rows before the batch come from the state (row K-1+t there)
    float window[GDN_CONV_K];
#pragma unroll
    for (int j = 0; j < GDN_CONV_K - 1; ++j) {
        const int t = t0 - (GDN_CONV_K - 1) + j;
        window[j] = t >= 0 ? mix[(size_t)t * mix_stride + ch] : conv_state[(size_t)(t + GDN_CONV_K - 1) * Cc + ch];
    }
    for (int t = t0; t < t1; ++t) {
        window[GDN_CONV_K - 1] = mix[(size_t)t * mix_stride + ch];
        conv_out[(size_t)t * Cc + ch] = gdn_silu(gdn_conv_taps(window, w));
#pragma unroll
        for (int j = 0; j < GDN_CONV_K - 1; ++j) window[j] = window[j + 1];
    }

    if (blockIdx.y != 0) return;
    if (conv_ring != nullptr) {  // before the state is overwritten below
        for (int k = 1; k < n_tokens; ++k) {
#pragma unroll
            for (int s = 0; s < GDN_CONV_K - 1; ++s) {
                const int row = k + s;
                conv_ring[((size_t)(k - 1) * (GDN_CONV_K - 1) + s) * Cc + ch] =
                    row < GDN_CONV_K - 1 ? conv_state[(size_t)row * Cc + ch]
                                         : mix[(size_t)(row - (GDN_CONV_K - 1)) * mix_stride + ch];
            }
        }
    }
    // new state row s = row T + s of [old state (3 rows); mix (T rows)]; read all three before writing
    float next[GDN_CONV_K - 1];
#pragma unroll
    for (int s = 0; s < GDN_CONV_K - 1; ++s) {
        const int row = n_tokens + s;
        next[s] = row < GDN_CONV_K - 1 ? conv_state[(size_t)row * Cc + ch]
                                       : mix[(size_t)(row - (GDN_CONV_K - 1)) * mix_stride + ch];
    }
#pragma unroll
    for (int s = 0; s < GDN_CONV_K - 1; ++s) conv_state[(size_t)s * Cc + ch] = next[s];
}

// ---------------------------------------------------------------------------------------------------------
// The recurrent form (spec §6.7 steps 4-8), fused, for a decode token or a short batch (e.g. a speculative
// verify), token by token: L2-normalise q and k of the paired key head, gates, S <- decay S;
// u = beta (v - S^T k); S <- S + k u^T; o = S^T q; then y = rmsnorm(o) * silu(z), written fp32 to y [T][Hv*dv]
// and, when yq is not null, as Q8_1 to yq [T][Hv*dv] / yd [T][Hv*dv/32] (requires dv % 32 == 0).
// grid (Hv, ceil(dv / 16)), block 256. Each block owns 16 value columns of one head: the per-column
// reductions over the key dim are independent, so the state is spread over Hv * dv/16 blocks, read once
// and written once per launch, and kept in registers across the batch's tokens. The gated norm needs the
// whole head: every block stores its raw o columns in y, and the last block of the head to finish (counted
// in its head counter, which it resets to 0 for the next launch) normalises the head's T rows in place.
// Counters: [rows][Hv + Hk] uint32 (a row's Hv head counters, then its Hk key counters for the fused conv
// below), zeroed once when allocated; launches sharing them must not run concurrently.
// state_ring (null to skip; speculative verify): also the state after each of the first T-1 tokens,
// ring[t] [Hv][dk][dv], for rolling back to an accepted prefix without re-running it.
// Slot-indexed (row_slot not null, common.cuh; issue 28): grid (Hv, ceil(dv / 16), rows) with n_tokens = 1:
// row blockIdx.z is the one new token of slot row_slot[row] (recurrent state: slot_ptrs entry 1), with its
// own row of counters.
// gdn_recurrent_wide: the same with 32 value columns per block, grid (Hv, ceil(dv / 32), rows), for slot batches
// whose narrow blocks would not fit one wave (8 rows of the 9B: 2,048 blocks, about four waves of the H200's
// 528 resident): each thread holds two row groups (16 state rows), so half the blocks, as many resident per SM,
// run in half the waves of about the same per-block latency. Every sum keeps the narrow kernel's order (each row
// group's partial over its 8 rows, then the 16 partials in group order), so both give the same bits.
// gdn_recurrent_conv(_wide): the same for one token per row (a decode token, or a slot batch), with the conv + SiLU
// of that token done here instead of by gdn_conv_silu (issue 30: one launch fewer per GDN layer). Each block
// convolves the channels it reads, from mix (row stride mix_stride), conv_w and the conv state (conv_state, or
// slot_ptrs entry 0), with gdn_conv_silu's arithmetic (gdn_conv_one), so the same bits. A v channel is read by one
// thread only, which advances its state at once; the q and k channels of key head kh are read by every block of
// the Hv/Hk value heads paired with it, so the last of those blocks to finish (counted in the row's key counter,
// which it resets) advances them. conv_out is not read.
// All four: prefetch, prefetch_bytes name the out projection's leading weight bytes (common.cuh prefetch_l2; null
// for none), prefetched by every block once its loads have landed.

// Calls f(j, i, r) for each state row a thread holds: row i of its j-th row group g = ty + j * (16 / GROUPS),
// r = g + 16 i, in the order every sum of the kernel follows.
template <int GROUPS, typename F>
__device__ __forceinline__ void gdn_thread_rows(int ty, F&& f) {
#pragma unroll
    for (int j = 0; j < GROUPS; ++j)
#pragma unroll
        for (int i = 0; i < GDN_RECURRENT_ROWS; ++i) {
            const int g = ty + j * (GDN_RECURRENT_ROW_GROUPS / GROUPS);
            f(j, i, g + i * GDN_RECURRENT_ROW_GROUPS);
        }
}

// The kernels' body: GROUPS row groups per thread, 16 * GROUPS columns per block. Row group g (of 16) holds state
// rows g, g + 16, .., g + 112; thread (tx, ty) holds groups ty + j * (16 / GROUPS), j < GROUPS.
template <int GROUPS, bool CONV>
__device__ __forceinline__ void gdn_recurrent_body(
    const float* __restrict__ conv_out, const float* __restrict__ mix, long long mix_stride,
    const float* __restrict__ conv_w, float* conv_state, const float* __restrict__ z, long long z_stride,
    const float* __restrict__ b,
    long long b_stride, const float* __restrict__ alpha, long long alpha_stride, const float* __restrict__ ssm_a,
    const float* __restrict__ dt_bias, const float* __restrict__ norm_w, float* __restrict__ state, float* y,
    signed char* yq, float* yd, unsigned int* counters, int batch_tokens, int Hk, int Hv, int dk, int dv, float eps,
    float* __restrict__ state_ring, const int* __restrict__ row_slot,
    const unsigned long long* __restrict__ slot_ptrs, const char* prefetch, long long prefetch_bytes) {
    // The fused kernels run one token (their launcher passes 1). Only the narrow one is given the constant: folded,
    // it fits 64 registers there, while in the wide one the schedule it leads to spilled (ptxas, sm_70).
    const int n_tokens = CONV && GROUPS == 1 ? 1 : batch_tokens;
    constexpr int COLS = GDN_RECURRENT_COLS * GROUPS;
    constexpr int THREAD_GROUPS = GDN_RECURRENT_ROW_GROUPS / GROUPS;  // threads per column
    __shared__ float sq[GDN_MAX_DK];
    __shared__ float sk[GDN_MAX_DK];
    __shared__ float red[GDN_RECURRENT_ROW_GROUPS][COLS];
    __shared__ float scratch[64];
    __shared__ float sv[COLS];  // this token's v on the block's columns
    __shared__ float sgate[2];  // its beta and decay
    __shared__ int is_last, is_last_of_key;

    const int n = blockIdx.x;
    const int tid = threadIdx.x;
    const int Ck = Hk * dk;
    const int Cc = 2 * Ck + Hv * dv;
    const int kh = n % Hk;
    const int tx = tid % COLS;
    const int ty = tid / COLS;
    const int c = blockIdx.y * COLS + tx;
    const bool col_ok = c < dv;
    const float q_scale = 1.f / sqrtf((float)dk);
    // A slot-indexed row r = blockIdx.z is token r of the launch's inputs and outputs, with its own state and
    // head counters; otherwise blockIdx.z = 0. (Indexing by t0 + t keeps the kernel parameters unmodified:
    // offset copies of them would live in registers, and at 64 registers they spilled.)
    const int t0 = blockIdx.z;
    float* S = (row_slot != nullptr ? rigllm::slot_ptr<float>(slot_ptrs, row_slot, t0, RIGLLM_GDN_SLOT_PTRS, 1) : state) +
               (size_t)n * dk * dv;
    // CONV (n_tokens is 1): the row's conv state, looked up where it is used (see gdn_conv_one)
    auto conv_st = [&]() -> float* {
        return row_slot != nullptr ? rigllm::slot_ptr<float>(slot_ptrs, row_slot, t0, RIGLLM_GDN_SLOT_PTRS, 0)
                                   : conv_state;
    };
    // channel ch of token t's conv output: computed here (CONV), or read from gdn_conv_silu's
    auto channel = [&](int t, int ch) -> float {
        if constexpr (CONV) return gdn_conv_one(mix, mix_stride, t0, conv_st(), conv_w, ch, Cc);
        else return conv_out[(size_t)(t0 + t) * Cc + ch];
    };

    float s[GROUPS][GDN_RECURRENT_ROWS];
    auto load_state = [&]() {
        gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
            s[j][i] = (col_ok && r < dk) ? S[(size_t)r * dv + c] : 0.f;
        });
    };
    // the fused wide kernel loads it later (below); the others first, so its loads overlap the token's
    constexpr bool LATE_STATE = CONV && GROUPS > 1;
    if constexpr (!LATE_STATE) load_state();

    for (int t = 0; t < n_tokens; ++t) {
        // Every global read of this token is issued here, before the first barrier: a load after a barrier cannot
        // be moved above it, so a later one would add its whole memory latency to a kernel that is latency-bound
        // (about 7 us for 4 MB of state per 9B layer on the H200, 2026-12-03). The values wait in shared memory
        // (the barriers below publish them): held in registers across the sums they made ptxas spill at 64.
        if (ty == 0) {
            sv[tx] = col_ok ? channel(t, 2 * Ck + n * dv + c) : 0.f;
            if (CONV && col_ok)  // its only reader
                gdn_conv_advance(mix, mix_stride, t0, conv_st(), 2 * Ck + n * dv + c, Cc);
        }
        if (tid == COLS) {
            sgate[0] = gdn_sigmoid(b[(size_t)(t0 + t) * b_stride + n]);
            sgate[1] = expf(gdn_log_decay(ssm_a[n], alpha[(size_t)(t0 + t) * alpha_stride + n], dt_bias[n]));
        }
        float ssq = 0.f, ssk = 0.f;
        if constexpr (CONV) {
            // a convolved channel takes eight loads, so q goes to threads [0, dk) and k to [128, 128 + dk), never
            // both to one thread: that keeps the registers under 64. k's partials then sit in warps 4-7 instead of
            // 0-3, with zeros where they were: the same lanes and the same order of nonzero terms, so the same sums.
            if (tid < dk) {
                const float qv = channel(t, kh * dk + tid);
                sq[tid] = qv;
                ssq += qv * qv;
            } else if (tid >= GDN_MAX_DK && tid - GDN_MAX_DK < dk) {
                const float kv = channel(t, Ck + kh * dk + tid - GDN_MAX_DK);
                sk[tid - GDN_MAX_DK] = kv;
                ssk += kv * kv;
            }
        } else {
            for (int r = tid; r < dk; r += blockDim.x) {
                const float qv = channel(t, kh * dk + r);
                const float kv = channel(t, Ck + kh * dk + r);
                sq[r] = qv;
                sk[r] = kv;
                ssq += qv * qv;
                ssk += kv * kv;
            }
        }
        // the fused wide kernel's 16 state rows a thread after the conv's loads, so that both are not held in
        // registers at once (at 64 they spilled); one token, so loaded once
        if constexpr (LATE_STATE) load_state();
        const float2 norms = gdn_block_sum2(ssq, ssk, scratch);  // its barriers also publish sq, sk, sv, sgate
        const float inv_q = 1.f / sqrtf(norms.x + GDN_L2_EPS);
        const float inv_k = 1.f / sqrtf(norms.y + GDN_L2_EPS);
        for (int r = tid; r < dk; r += blockDim.x) {
            sq[r] = (sq[r] * inv_q) * q_scale;
            sk[r] = sk[r] * inv_k;
        }
        __syncthreads();

        const float decay = sgate[1];
        float part[GROUPS] = {};  // each row group's partial over its rows, in row order
        gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
            s[j][i] *= decay;
            if (r < dk) part[j] += s[j][i] * sk[r];
        });
#pragma unroll
        for (int j = 0; j < GROUPS; ++j) red[ty + j * THREAD_GROUPS][tx] = part[j];
        __syncthreads();
        float sk_dot = 0.f;  // (S^T k)[c] of the decayed state
#pragma unroll
        for (int g = 0; g < GDN_RECURRENT_ROW_GROUPS; ++g) sk_dot += red[g][tx];
        const float u = sgate[0] * (sv[tx] - sk_dot);
        __syncthreads();  // everyone has read red, sv and sgate
        // the block's loads have landed (its state is in use): only now its share of the prefetch, which issued with
        // them slowed the 27B's recurrence by 2 us a layer (7.5 MiB beside 4 MiB of state, H200, s17b); every block
        // of the grid takes a share
        if (t == 0)
            rigllm::prefetch_l2(prefetch, prefetch_bytes,
                                blockIdx.x + (long long)gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z),
                                (long long)gridDim.x * gridDim.y * gridDim.z);

#pragma unroll
        for (int j = 0; j < GROUPS; ++j) part[j] = 0.f;
        gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
            if (col_ok && r < dk) {
                s[j][i] += sk[r] * u;
                part[j] += s[j][i] * sq[r];
            }
        });
#pragma unroll
        for (int j = 0; j < GROUPS; ++j) red[ty + j * THREAD_GROUPS][tx] = part[j];
        __syncthreads();
        if (ty == 0 && col_ok) {
            float o = 0.f;
#pragma unroll
            for (int g = 0; g < GDN_RECURRENT_ROW_GROUPS; ++g) o += red[g][tx];
            y[(size_t)(t0 + t) * Hv * dv + (size_t)n * dv + c] = o;
        }
        // sq and sk were last read before the barrier above; red is next written after the next block sums
        if (!CONV && state_ring != nullptr && t + 1 < n_tokens) {
            float* R = state_ring + ((size_t)t * Hv + n) * dk * dv;
            gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
                if (col_ok && r < dk) R[(size_t)r * dv + c] = s[j][i];
            });
        }
    }
    gdn_thread_rows<GROUPS>(ty, [&](int j, int i, int r) {
        if (col_ok && r < dk) S[(size_t)r * dv + c] = s[j][i];
    });

    __threadfence();  // publish this block's o before it is counted
    __syncthreads();
    unsigned int* done = counters + (size_t)t0 * (Hv + Hk) + n;
    unsigned int* key_done = counters + (size_t)t0 * (Hv + Hk) + Hv + kh;
    if (tid == 0) {
        is_last = atomicAdd(done, 1u) == gridDim.y - 1;
        is_last_of_key = CONV && atomicAdd(key_done, 1u) == (unsigned)(Hv / Hk) * gridDim.y - 1;
    }
    __syncthreads();
    if (CONV && is_last_of_key) {  // every reader of key head kh's q and k channels has read their state
        if (tid == 0) *key_done = 0u;
        __threadfence();
        for (int i = tid; i < 2 * dk; i += blockDim.x)
            gdn_conv_advance(mix, mix_stride, t0, conv_st(), (i < dk ? 0 : Ck - dk) + kh * dk + i, Cc);
    }
    if (!is_last) return;
    if (tid == 0) *done = 0u;
    __threadfence();
    for (int t = t0; t < t0 + n_tokens; ++t) {
        const size_t at = (size_t)t * Hv * dv + (size_t)n * dv;
        gdn_gated_norm_head(y + at, z + (size_t)t * z_stride + (size_t)n * dv, norm_w, y + at,
                            yq == nullptr ? nullptr : yq + at, yd == nullptr ? nullptr : yd + at / 32, dv, eps,
                            scratch);
    }
}

#define RIGLLM_GDN_RECURRENT(NAME, GROUPS, CONV)                                                                    \
    extern "C" __global__ void __launch_bounds__(GDN_RECURRENT_THREADS, GDN_RECURRENT_MIN_BLOCKS) NAME(           \
        const float* __restrict__ conv_out, const float* __restrict__ mix, long long mix_stride,                   \
        const float* __restrict__ conv_w, float* conv_state, const float* __restrict__ z, long long z_stride,      \
        const float* __restrict__ b, long long b_stride, const float* __restrict__ alpha, long long alpha_stride,  \
        const float* __restrict__ ssm_a, const float* __restrict__ dt_bias, const float* __restrict__ norm_w,      \
        float* __restrict__ state, float* y, signed char* yq, float* yd, unsigned int* counters, int n_tokens,    \
        int Hk, int Hv, int dk, int dv, float eps, float* __restrict__ state_ring,                                 \
        const int* __restrict__ row_slot, const unsigned long long* __restrict__ slot_ptrs, const char* prefetch, \
        long long prefetch_bytes) {                                                                                \
        gdn_recurrent_body<GROUPS, CONV>(conv_out, mix, mix_stride, conv_w, conv_state, z, z_stride, b, b_stride, \
                                         alpha, alpha_stride, ssm_a, dt_bias, norm_w, state, y, yq, yd, counters,  \
                                         n_tokens, Hk, Hv, dk, dv, eps, state_ring, row_slot, slot_ptrs,          \
                                         prefetch, prefetch_bytes);                                                \
    }

RIGLLM_GDN_RECURRENT(gdn_recurrent, 1, false)
RIGLLM_GDN_RECURRENT(gdn_recurrent_wide, 2, false)
RIGLLM_GDN_RECURRENT(gdn_recurrent_conv, 1, true)
RIGLLM_GDN_RECURRENT(gdn_recurrent_conv_wide, 2, true)

// ---------------------------------------------------------------------------------------------------------
// Multi-token delta rule in the chunked form (spec §6.8), continuing from the state in `state` and leaving
// the final state there. Writes the raw outputs o [T][Hv*dv] (row stride o_stride); gdn_gated_norm follows.
// grid (Hv, ceil(dv / 32)), block 256, dynamic shared memory GDN_CHUNK_SMEM_FLOATS * 4 bytes (opt-in).
// Each block owns 32 value columns of one head and walks the chunks in order; everything that depends on a
// value column (u, outputs, the state update) is independent per column, the 64x64 A and intra matrices are
// recomputed per column slice. Per chunk, with gamma the cumulative log decay and Gamma_ij = e^(gamma_i -
// gamma_j) formed only for j <= i (no overflow):
//   A_ij  = beta_i (k_i.k_j) Gamma_ij (j < i),  intra_ij = (q_i.k_j) Gamma_ij (j <= i)
//   u     = (I + A)^-1 [beta_i (v_i - e^gamma_i k_i^T S)]       (forward substitution; = U - W S of §6.8)
//   o_i   = e^gamma_i q_i^T S + sum_{j<=i} intra_ij u_j
//   S    <- e^gamma_last S + sum_j e^(gamma_last - gamma_j) k_j u_j^T
// The tail chunk is padded with k = q = v = 0, g = 0, beta = 0, which changes nothing (as in the reference).
extern "C" __global__ void __launch_bounds__(GDN_CHUNK_THREADS)
gdn_chunk_prefill(const float* __restrict__ conv_out, const float* __restrict__ b, long long b_stride,
                  const float* __restrict__ alpha, long long alpha_stride, const float* __restrict__ ssm_a,
                  const float* __restrict__ dt_bias, float* __restrict__ state, float* __restrict__ o,
                  long long o_stride, int n_tokens, int Hk, int Hv, int dk, int dv) {
    extern __shared__ float smem[];
    float* sK = smem;                              // [C][LDK] normalised keys
    float* sQ = sK + GDN_CHUNK * GDN_LDK;          // [C][LDK] normalised, scaled queries
    float* sM = sQ + GDN_CHUNK * GDN_LDK;          // [C][LDM]: A below the diagonal, intra transposed on/above
    float* sU = sM + GDN_CHUNK * GDN_LDM;          // [C][LDU]: right-hand sides, then u
    float* sG = sU + GDN_CHUNK * GDN_LDU;          // [C] gamma
    float* sB = sG + GDN_CHUNK;                    // [C] beta
    float* sE = sB + GDN_CHUNK;                    // [C] exp(gamma_last - gamma_j)

    const int n = blockIdx.x;
    const int tid = threadIdx.x;
    const int lane = tid & 31;
    const int warp = tid >> 5;
    const int Ck = Hk * dk;
    const int Cc = 2 * Ck + Hv * dv;
    const int kh = n % Hk;
    const int c = blockIdx.y * GDN_CHUNK_COLS + lane;  // this thread's value column in steps d, g, h
    const bool col_ok = c < dv;
    const float q_scale = 1.f / sqrtf((float)dk);
    const float a_n = ssm_a[n];
    const float dtb_n = dt_bias[n];
    float* S = state + (size_t)n * dk * dv;

    const int n_chunks = (n_tokens + GDN_CHUNK - 1) / GDN_CHUNK;
    for (int chunk = 0; chunk < n_chunks; ++chunk) {
        const int t0 = chunk * GDN_CHUNK;
        const int len = min(GDN_CHUNK, n_tokens - t0);

        // a. q and k rows of the paired key head, L2-normalised (one warp per row); zero rows past the end
        for (int i = warp; i < GDN_CHUNK; i += GDN_CHUNK_WARPS) {
            const float* row = conv_out + (size_t)(t0 + i) * Cc;
            float ssq = 0.f, ssk = 0.f;
            for (int r = lane; r < dk; r += 32) {
                const float qv = i < len ? row[kh * dk + r] : 0.f;
                const float kv = i < len ? row[Ck + kh * dk + r] : 0.f;
                sQ[i * GDN_LDK + r] = qv;
                sK[i * GDN_LDK + r] = kv;
                ssq += qv * qv;
                ssk += kv * kv;
            }
            ssq = rigllm::warp_sum(ssq);
            ssk = rigllm::warp_sum(ssk);
            const float inv_q = 1.f / sqrtf(ssq + GDN_L2_EPS);
            const float inv_k = 1.f / sqrtf(ssk + GDN_L2_EPS);
            for (int r = lane; r < dk; r += 32) {
                sQ[i * GDN_LDK + r] = (sQ[i * GDN_LDK + r] * inv_q) * q_scale;
                sK[i * GDN_LDK + r] = sK[i * GDN_LDK + r] * inv_k;
            }
        }
        // b. gates and the cumulative log decay
        if (tid < GDN_CHUNK) {
            float g = 0.f, bt = 0.f;
            if (tid < len) {
                const size_t t = (size_t)(t0 + tid);
                g = gdn_log_decay(a_n, alpha[t * alpha_stride + n], dtb_n);
                bt = gdn_sigmoid(b[t * b_stride + n]);
            }
            sG[tid] = g;
            sB[tid] = bt;
        }
        __syncthreads();
        if (tid == 0) {
            float acc = 0.f;
            for (int i = 0; i < GDN_CHUNK; ++i) {
                acc += sG[i];
                sG[i] = acc;
            }
        }
        __syncthreads();
        if (tid < GDN_CHUNK) sE[tid] = expf(sG[GDN_CHUNK - 1] - sG[tid]);

        // c. A and intra: thread (ti, tj) owns rows ti + 16a and columns tj + 16b of the 64x64 pair grid
        {
            const int ti = tid >> 4;
            const int tj = tid & 15;
            float kk[4][4], qk[4][4];
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int bb = 0; bb < 4; ++bb) kk[a][bb] = qk[a][bb] = 0.f;
            for (int r = 0; r < dk; ++r) {
                float ki[4], qi[4], kj[4];
#pragma unroll
                for (int a = 0; a < 4; ++a) {
                    ki[a] = sK[(ti + 16 * a) * GDN_LDK + r];
                    qi[a] = sQ[(ti + 16 * a) * GDN_LDK + r];
                    kj[a] = sK[(tj + 16 * a) * GDN_LDK + r];
                }
#pragma unroll
                for (int a = 0; a < 4; ++a)
#pragma unroll
                    for (int bb = 0; bb < 4; ++bb) {
                        kk[a][bb] += ki[a] * kj[bb];
                        qk[a][bb] += qi[a] * kj[bb];
                    }
            }
#pragma unroll
            for (int a = 0; a < 4; ++a)
#pragma unroll
                for (int bb = 0; bb < 4; ++bb) {
                    const int i = ti + 16 * a;
                    const int j = tj + 16 * bb;
                    if (j < i) {
                        const float decay_ij = expf(sG[i] - sG[j]);
                        sM[i * GDN_LDM + j] = sB[i] * kk[a][bb] * decay_ij;
                        sM[j * GDN_LDM + i] = qk[a][bb] * decay_ij;
                    } else if (j == i) {
                        sM[i * GDN_LDM + i] = qk[a][bb];
                    }
                }
        }

        // d. right-hand sides beta_i (v_i - e^gamma_i k_i^T S) and the state part of the outputs, for rows
        //    i = warp + 8m; lanes are columns, so the state loads are coalesced and the q/k loads broadcast
        float out_state[GDN_CHUNK / GDN_CHUNK_WARPS];
        {
            float acc_k[GDN_CHUNK / GDN_CHUNK_WARPS], acc_q[GDN_CHUNK / GDN_CHUNK_WARPS];
#pragma unroll
            for (int m = 0; m < GDN_CHUNK / GDN_CHUNK_WARPS; ++m) acc_k[m] = acc_q[m] = 0.f;
            for (int r = 0; r < dk; ++r) {
                const float s = col_ok ? S[(size_t)r * dv + c] : 0.f;
#pragma unroll
                for (int m = 0; m < GDN_CHUNK / GDN_CHUNK_WARPS; ++m) {
                    const int i = warp + GDN_CHUNK_WARPS * m;
                    acc_k[m] += sK[i * GDN_LDK + r] * s;
                    acc_q[m] += sQ[i * GDN_LDK + r] * s;
                }
            }
#pragma unroll
            for (int m = 0; m < GDN_CHUNK / GDN_CHUNK_WARPS; ++m) {
                const int i = warp + GDN_CHUNK_WARPS * m;
                const float e = expf(sG[i]);
                const float v = (col_ok && i < len) ? conv_out[(size_t)(t0 + i) * Cc + 2 * Ck + n * dv + c] : 0.f;
                sU[i * GDN_LDU + lane] = sB[i] * (v - e * acc_k[m]);
                out_state[m] = e * acc_q[m];
            }
        }
        __syncthreads();

        // e. forward substitution u_i = rhs_i - sum_{j<i} A_ij u_j: warp w owns columns 4w..4w+3, eight lanes
        //    per column split the sum; the column never leaves the warp, so a warp barrier suffices
        {
            const int col = 4 * warp + (lane >> 3);
            const int sub = lane & 7;
            for (int i = 1; i < GDN_CHUNK; ++i) {
                float p = 0.f;
                for (int j = sub; j < i; j += 8) p += sM[i * GDN_LDM + j] * sU[j * GDN_LDU + col];
                p += __shfl_xor_sync(0xffffffffu, p, 1);
                p += __shfl_xor_sync(0xffffffffu, p, 2);
                p += __shfl_xor_sync(0xffffffffu, p, 4);
                if (sub == 0) sU[i * GDN_LDU + col] -= p;
                __syncwarp();
            }
        }
        __syncthreads();

        // f. outputs o_i = e^gamma_i q_i^T S + sum_{j<=i} intra_ij u_j
#pragma unroll
        for (int m = 0; m < GDN_CHUNK / GDN_CHUNK_WARPS; ++m) {
            const int i = warp + GDN_CHUNK_WARPS * m;
            float acc = 0.f;
            for (int j = 0; j <= i; ++j) acc += sM[j * GDN_LDM + i] * sU[j * GDN_LDU + lane];
            if (col_ok && i < len) o[(size_t)(t0 + i) * o_stride + n * dv + c] = out_state[m] + acc;
        }

        // g. state update S <- e^gamma_last S + sum_j (k_j e^(gamma_last - gamma_j)) u_j^T, rows r = warp + 8m
        {
            float acc[GDN_MAX_DK / GDN_CHUNK_WARPS];
#pragma unroll
            for (int m = 0; m < GDN_MAX_DK / GDN_CHUNK_WARPS; ++m) acc[m] = 0.f;
            for (int j = 0; j < len; ++j) {
                const float uj = sU[j * GDN_LDU + lane];
                const float e = sE[j];
#pragma unroll
                for (int m = 0; m < GDN_MAX_DK / GDN_CHUNK_WARPS; ++m) {
                    const int r = warp + GDN_CHUNK_WARPS * m;
                    if (r < dk) acc[m] += (sK[j * GDN_LDK + r] * e) * uj;
                }
            }
            const float chunk_decay = expf(sG[GDN_CHUNK - 1]);
#pragma unroll
            for (int m = 0; m < GDN_MAX_DK / GDN_CHUNK_WARPS; ++m) {
                const int r = warp + GDN_CHUNK_WARPS * m;
                if (col_ok && r < dk) {
                    const size_t idx = (size_t)r * dv + c;
                    S[idx] = S[idx] * chunk_decay + acc[m];
                }
            }
        }
        __syncthreads();  // the next chunk reads the updated state and overwrites the shared tiles
    }
}

// ---------------------------------------------------------------------------------------------------------
// Gated RMSNorm after the prefill kernel: y[t][n] = rmsnorm(o[t][n], norm_w, eps) * silu(z[t][n]) per value
// head, optionally also as Q8_1 (yq [T][Hv*dv], yd [T][Hv*dv/32], contiguous; null to skip; dv % 32 == 0).
// grid (T * Hv), block: a multiple of 32 (dv rounded up to 32 is ideal). y may alias o.
extern "C" __global__ void gdn_gated_norm(const float* o, long long o_stride, const float* __restrict__ z,
                                          long long z_stride, const float* __restrict__ norm_w, float* y,
                                          long long y_stride, signed char* yq, float* yd, int Hv, int dv,
                                          float eps) {
    __shared__ float scratch[32];
    const int t = blockIdx.x / Hv;
    const int n = blockIdx.x % Hv;
    const size_t head = (size_t)n * dv;
    const size_t q_at = (size_t)t * Hv * dv + head;
    gdn_gated_norm_head(o + (size_t)t * o_stride + head, z + (size_t)t * z_stride + head, norm_w,
                        y + (size_t)t * y_stride + head, yq == nullptr ? nullptr : yq + q_at,
                        yd == nullptr ? nullptr : yd + q_at / 32, dv, eps, scratch);
}
