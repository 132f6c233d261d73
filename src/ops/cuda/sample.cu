/* ops/cuda/sample.cu — next-token selection on the device, one block per row, so
 * decoding never copies a logits row to the host.
 *
 * Greedy: the max of (value, index) keys (NaN highest, ties to the lower id), found in
 * two passes: PARTS blocks per row each reduce a slice, one block reduces their keys.
 * Sampling follows lm_sampler's rules: v = logit / temperature; top-k keeps the k
 * highest-ranked tokens; top-p then keeps the smallest rank prefix of those whose
 * probability reaches top_p (renormalized over the top-k survivors); min-p keeps
 * tokens with p >= min_p * p_max (and always the top one). Rank is a total order
 * (value, then lower id), so both cut-offs are single 64-bit key thresholds found by
 * radix selection: 8 passes over the row, each building a 256-bucket histogram of
 * the not-yet-decided keys (weight 1 for top-k, exp(v - vmax) for top-p) and
 * descending into the bucket where the weight from the top reaches the target.
 * Finally u = hash(seed, draw, row) * total kept mass and the token is found by a
 * prefix sum in id order (the CPU walks rank order: same distribution, other
 * draws). Histogram masses are float atomics, so an exact top-p boundary can differ
 * between runs by rounding. O(V) per pass; at most 2 * 8 + 3 passes per row.
 */
#include "ops/cuda/common.cuh"

#define THREADS 1024
#define PARTS 64 /* blocks per row of the first (argmax) pass */

__device__ __forceinline__ unsigned long long key_of(float v, int64_t j) {
    unsigned u;
    if (isnan(v)) u = 0xFFFFFFFFu;
    else {
        if (v == 0.f) v = 0.f;
        u = __float_as_uint(v);
        u = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((unsigned long long)u << 32) | (unsigned long long)(0xFFFFFFFFu - (unsigned)j);
}

static __device__ unsigned long long block_max_key(unsigned long long v, unsigned long long *scratch) {
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = v;
    __syncthreads();
    v = (threadIdx.x & 31) < (blockDim.x >> 5) ? scratch[threadIdx.x & 31] : 0ull;
    for (int o = 16; o > 0; o >>= 1) {
        unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
        v = w > v ? w : v;
    }
    return v;
}

/* splitmix64 finalizer over (seed, draw, row): u in [0, 1) with 53 random bits. */
__device__ __forceinline__ double draw_uniform(uint64_t seed, uint64_t draw, uint64_t row) {
    uint64_t z = seed + 0x9E3779B97F4A7C15ull * (draw + 1) + 0xD1B54A32D192ED03ull * (row + 1);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) * (1.0 / 9007199254740992.0);
}

struct row_ctx {
    const float *x;
    int64_t V;
    float temp, vmax;
    unsigned long long kmin_topk; /* keys below are cut by top-k (0: none) */
};

/* Weight of token j in a selection: 1 (mode 0, top-k) or its unnormalized
 * probability if it survived top-k (mode 1, top-p). */
__device__ __forceinline__ float weight(const row_ctx &r, int mode, unsigned long long key, float v) {
    if (mode == 0) return 1.f;
    return key >= r.kmin_topk ? __expf(v - r.vmax) : 0.f;
}

/* The key K with W(keys > K) < target <= W(keys >= K); falls back to the lowest key
 * of positive weight when rounding leaves the total just short of target. */
static __device__ unsigned long long radix_select(const row_ctx &r, int mode, float target, float *hist, float *sel_rem,
                                           int *sel_digit) {
    unsigned long long prefix = 0;
    float remaining = target;
    for (int shift = 56; shift >= 0; shift -= 8) {
        unsigned long long hi = shift == 56 ? 0ull : (~0ull << (shift + 8));
        for (int i = threadIdx.x; i < 256; i += blockDim.x) hist[i] = 0.f;
        __syncthreads();
        for (int64_t j = threadIdx.x; j < r.V; j += blockDim.x) {
            float v = r.x[j] / r.temp;
            unsigned long long key = key_of(v, j);
            if ((key & hi) != prefix) continue;
            float w = weight(r, mode, key, v);
            if (w > 0.f) atomicAdd(&hist[(key >> shift) & 255], w);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            float cum = 0.f;
            int d = 255, lowest = -1;
            for (; d >= 0; d--) {
                if (hist[d] > 0.f) lowest = d;
                if (hist[d] > 0.f && cum + hist[d] >= remaining) break;
                cum += hist[d];
            }
            if (d < 0) { /* rounding: take all of the lowest bucket, down to its lowest key */
                d = lowest < 0 ? 0 : lowest;
                *sel_rem = lowest < 0 ? 0.f : hist[d];
            } else {
                *sel_rem = remaining - cum;
            }
            *sel_digit = d;
        }
        __syncthreads();
        prefix |= (unsigned long long)*sel_digit << shift;
        remaining = *sel_rem;
        __syncthreads();
    }
    return prefix;
}

/* Pass 1, grid (PARTS, rows): the best key of each 1/PARTS of a row -> work[row][part].
 * Dividing by a positive temperature keeps the order, so the raw logits rank alike. */
static __global__ void __launch_bounds__(256) partial_top_kernel(const float *logits, int64_t V, int64_t ld,
                                                          unsigned long long *work) {
    __shared__ unsigned long long kscratch[32];
    const float *x = logits + blockIdx.y * ld;
    int64_t per = (V + gridDim.x - 1) / gridDim.x, lo = blockIdx.x * per, hi = LM_MIN(V, lo + per);
    unsigned long long top = 0;
#pragma unroll 4
    for (int64_t j = lo + threadIdx.x; j < hi; j += blockDim.x) {
        unsigned long long k = key_of(x[j], j);
        top = k > top ? k : top;
    }
    top = block_max_key(top, kscratch);
    if (threadIdx.x == 0) work[blockIdx.y * gridDim.x + blockIdx.x] = top;
}

static __global__ void __launch_bounds__(THREADS) sample_kernel(const float *logits, int64_t V, int64_t ld,
                                                         const lm__cuda_sample_params *params, int per_row,
                                                         const unsigned long long *work, int32_t *out) {
    __shared__ unsigned long long kscratch[32];
    __shared__ float fscratch[32], hist[256], part[THREADS];
    __shared__ float sel_rem;
    __shared__ int sel_digit, picked;
    const lm__cuda_sample_params P = params[per_row ? blockIdx.x : 0];
    const float *x = logits + blockIdx.x * ld;
    row_ctx r = {x, V, P.temperature, 0.f, 0ull};
    int greedy = P.greedy || P.temperature == 0.f;
    unsigned long long top = threadIdx.x < PARTS ? work[blockIdx.x * PARTS + threadIdx.x] : 0ull;
    top = block_max_key(top, kscratch);
    int64_t top_id = (int64_t)(0xFFFFFFFFu - (unsigned)(top & 0xFFFFFFFFull));
    if (greedy || V == 1) {
        if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)top_id;
        return;
    }
    r.vmax = x[top_id] / r.temp;
    if (isinf(r.vmax) || isnan(r.vmax)) { /* degenerate row: the top token */
        if (threadIdx.x == 0) out[blockIdx.x] = (int32_t)top_id;
        return;
    }
    if (P.top_k > 0 && P.top_k < V) r.kmin_topk = radix_select(r, 0, (float)P.top_k, hist, &sel_rem, &sel_digit);
    unsigned long long kmin = r.kmin_topk;
    if (P.top_p < 1.f) {
        float z = 0.f;
        for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
            float v = x[j] / r.temp;
            z += weight(r, 1, key_of(v, j), v);
        }
        z = block_sum(z, fscratch);
        unsigned long long kp = radix_select(r, 1, P.top_p * z, hist, &sel_rem, &sel_digit);
        kmin = kp > kmin ? kp : kmin;
    }
    /* kept: key >= kmin, and (min-p) p >= min_p * p_max or the top token itself */
    int64_t per = (V + blockDim.x - 1) / blockDim.x, lo = threadIdx.x * per, hi = LM_MIN(V, lo + per);
    float mine = 0.f;
    for (int64_t j = lo; j < hi; j++) {
        float v = x[j] / r.temp, e = __expf(v - r.vmax);
        unsigned long long k = key_of(v, j);
        if (k >= kmin && (P.min_p <= 0.f || e >= P.min_p || j == top_id)) mine += e;
    }
    part[threadIdx.x] = mine;
    if (threadIdx.x == 0) picked = (int)top_id;
    __syncthreads();
    if (threadIdx.x == 0) { /* exclusive prefix sums in id order; the total last */
        float acc = 0.f;
        for (int t = 0; t < (int)blockDim.x; t++) {
            float v = part[t];
            part[t] = acc;
            acc += v;
        }
        fscratch[0] = acc;
    }
    __syncthreads();
    float u = (float)(draw_uniform(P.seed, P.draw, (P.flags & 1u) ? 0u : blockIdx.x) * (double)fscratch[0]);
    float base = part[threadIdx.x], next = threadIdx.x + 1 < blockDim.x ? part[threadIdx.x + 1] : fscratch[0];
    if (u >= base && u < next) { /* the token lies in this thread's id range */
        float acc = base;
        for (int64_t j = lo; j < hi; j++) {
            float v = x[j] / r.temp, e = __expf(v - r.vmax);
            unsigned long long k = key_of(v, j);
            if (!(k >= kmin && (P.min_p <= 0.f || e >= P.min_p || j == top_id))) continue;
            acc += e;
            if (u < acc) {
                picked = (int)j;
                break;
            }
        }
    }
    __syncthreads();
    if (threadIdx.x == 0) out[blockIdx.x] = picked;
}

size_t lm__cuda_sample_workspace(int64_t rows) { return (size_t)rows * PARTS * sizeof(unsigned long long); }

lm_status lm__cuda_sample(const float *logits, int64_t rows, int64_t V, int64_t ld,
                            const lm__cuda_sample_params *params, int per_row, int32_t *out_ids, void *work,
                            cudaStream_t s) {
    if (rows == 0) return LM_OK;
    if (V < 1 || V > 0x7FFFFFFF || rows > 65535)
        return lm__error(LM_UNSUPPORTED, "sample: %lld rows of a vocabulary of %lld", (long long)rows, (long long)V);
    partial_top_kernel<<<dim3(PARTS, (unsigned)rows), 256, 0, s>>>(logits, V, ld, (unsigned long long *)work);
    LM_TRY(lm__cuda_launched("sample argmax pass"));
    sample_kernel<<<(unsigned)rows, THREADS, 0, s>>>(logits, V, ld, params, per_row, (const unsigned long long *)work,
                                                     out_ids);
    return lm__cuda_launched("sample");
}
