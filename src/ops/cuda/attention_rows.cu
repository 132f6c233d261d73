/* ops/cuda/attention_rows.cu — causal attention of single query tokens over the bf16
 * KV cache, split along the keys (decode; also the prefill path for head dims or
 * query dtypes the tensor-core kernel does not take).
 *
 * Token tok (row tok / T, position pos) attends keys [lo, pos] with lo =
 * max(0, pos + 1 - window) (0 without a window). Key j of the row lives in block
 * table[row, j / P] of the pool at offset j % P. With one entry per row (nb = 1: the
 * row's slot) the kernel keeps a slot's base pointer and indexes keys directly; with
 * nb > 1 (a paged cache) the thread scoring key j looks its block up (32-bit division;
 * the first tile's entry loads beside q, so a one-tile split pays no extra round trip)
 * and leaves the key's cache row in shared memory for the P V step. Keeping this
 * state small holds the kernel at 64 registers (4 blocks per SM): a variant that
 * prefetched every next tile's entries took 71 (3 blocks per SM) and ran decode 75%
 * slower on an H200. A token whose position is past nb * P writes NaN and reads
 * nothing; a split meeting a key whose block is outside the pool stops reading and
 * leaves NaN, which the combine carries into the token's output (only the entries of
 * keys [lo, pos] are read). One block per (split, query head, token): query head h
 * reads kv head h / (Hq / Hkv) in place, so a group's K/V
 * rows are read by each of its heads (from L2 after the first) and a one-token decode
 * still spreads over Hq blocks. A block walks its key range in tiles of TILE keys:
 * thread j scores key j (its K row loaded BATCH 16-byte chunks at a time), one warp
 * updates the running max and sum, and for P V thread (grp, d2) accumulates dims
 * (2 d2, 2 d2 + 1) over every kg-th key in registers, BATCH V loads in flight at once;
 * the kg partial sums meet in shared memory once, after the last tile, and are added in
 * a fixed order (so a decode gives the same bits every run; shared-memory atomics here
 * did not). Splits are at
 * least MIN_CHUNK keys; with one split the block normalizes and writes the output
 * directly, otherwise each split leaves (acc, max, sum) in the workspace and the last
 * block to finish (a per (token, head) counter, reset by that block so a captured graph
 * can replay) combines them. The grid depends only on the row capacity nb * P, never on the
 * current lengths, which live in device memory: this is what makes decode capturable.
 * All the kernels are launched with programmatic dependent launch: a block waits for the
 * kernel before it (the attention front) before it reads anything (the tensor-core
 * kernel at one token a row: anything but the positions, the table and the older
 * keys), and lets the output projection after it start streaming its weights.
 * Early-V form (head dims 8..256, powers of two; chosen when the grid fits the GPU in
 * one wave at its occupancy, e.g. one-sequence decode): each thread also issues the V
 * loads of its first VBATCH keys of a tile (16-byte chunks, keys vg mod kgv) before
 * scoring its own key, so a tile of a short context costs one round trip to the cache
 * for K and V together instead of one for K and three for V in batches of pairs; its
 * kgv partial sums meet in shared memory. It holds ~120 registers a thread (2 blocks
 * per SM; ptxas), which is why the many-block grids of long contexts and batches keep
 * the 64-register form.
 * Work O(ntok * Hq * pos * hd); bytes ~ 2 * pos * hd * 2 per (token, kv head) from HBM.
 *
 * Grouped variant (attn_group_kernel, for 2..GMAX query heads per kv head): one block
 * per (split, kv head, token) serves the whole group, so each key and value row is read
 * once per step rather than once per query head: thread j loads key j's row once and
 * scores it against the G queries (held in shared memory), warp g keeps head g's
 * running max and sum, and each P V thread applies one loaded value pair to all G
 * accumulators. Splits, the combine and the NaN rules are those of the per-head
 * kernel, per head of the group. It is chosen for calls of many rows over long
 * caches (use_group_kernel says when and why) where the tensor-core kernel does not
 * apply.
 *
 * Tensor-core variant (attn_mma_kernel, head dims 64 and 128, up to MMA_GMAX query heads
 * per kv head; the default wherever it applies): the grid of the grouped kernel, the
 * group's queries as the rows of an m16 tile against tiles of 16 keys staged by
 * cp.async, products of f32 accuracy from bf16 hi + lo halves, its own split count
 * (mma_splits); described at the kernel. Same combine, workspace and NaN rules.
 */
#include "ops/cuda/attention_rows_body.cuh"
#include "ops/cuda/mma.cuh"

#define GMAX 8 /* the grouped kernel's largest group (the block's warps) */

int lm__cuda_attention_rows_splits(int64_t capacity) {
    int64_t n = (capacity + MIN_CHUNK - 1) / MIN_CHUNK;
    return (int)LM_MAX(1, LM_MIN(n, MAX_SPLITS));
}

size_t lm__cuda_attention_rows_workspace(int64_t ntok, int q_heads, int head_dim, int nsplit) {
    return (size_t)ntok * (size_t)q_heads * (size_t)nsplit * (size_t)(head_dim + 2);
}

template <typename QT, typename OT, bool PAGED, bool EARLY>
__global__ void __launch_bounds__(TILE) attn_rows_kernel(lm__cuda_attn_params p, lm__cuda_kv kv) {
    attn_rows_body<QT, OT, PAGED, EARLY>(p, kv, blockIdx.x, blockIdx.y, blockIdx.z, pdl_wait_fn());
}

/* scale * q_g . k for the G queries of a group (qs [G][hd] in shared memory) against
 * key row kr, loaded once; the scores go to out[g * TILE]. */
__device__ __forceinline__ void score_key_group(const bf16 *kr, const float *qs, int G, int hd, float scale,
                                                float *out) {
    float a[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) a[g] = 0.f;
    if (hd % 8 == 0) {
        for (int c0 = 0; c0 < hd / 8; c0 += BATCH) {
            uint4 raw[BATCH];
#pragma unroll
            for (int u = 0; u < BATCH; u++)
                raw[u] = c0 + u < hd / 8 ? *(const uint4 *)(kr + (c0 + u) * 8) : make_uint4(0, 0, 0, 0);
#pragma unroll
            for (int u = 0; u < BATCH; u++) {
                if (c0 + u >= hd / 8) break;
                const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)&raw[u];
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float2 kf = __bfloat1622float2(k2[i]);
                    int d = (c0 + u) * 8 + 2 * i;
#pragma unroll
                    for (int g = 0; g < GMAX; g++) {
                        if (g >= G) break;
                        float2 qv = *(const float2 *)&qs[g * hd + d];
                        a[g] += kf.x * qv.x + kf.y * qv.y;
                    }
                }
            }
        }
    } else {
        const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)kr;
        for (int d2 = 0; d2 < hd / 2; d2++) {
            float2 kf = __bfloat1622float2(k2[d2]);
#pragma unroll
            for (int g = 0; g < GMAX; g++) {
                if (g >= G) break;
                float2 qv = *(const float2 *)&qs[g * hd + 2 * d2];
                a[g] += kf.x * qv.x + kf.y * qv.y;
            }
        }
    }
#pragma unroll
    for (int g = 0; g < GMAX; g++)
        if (g < G) out[g * TILE] = a[g] * scale;
}

/* The end of a block that holds the (unnormalized) P V sums acc [G][hd] and the running
 * max mx [G] (natural-log units) and sum [G] of the G adjacent query heads h0.. of
 * token tok over its split of the keys (all in shared memory, visible to every
 * thread): with one split the block writes out = acc / sum; otherwise it leaves its
 * partials in the workspace ([tok][h][split][hd + 2]) and the last block of the
 * (token, group) to arrive combines them (the counter of head h0, reset by that block
 * so a captured graph can replay). Scratch: wsplit [G][WS] (WS >= the splits) and scl
 * [G] floats of shared memory, is_last one shared int. Called by all NT threads of the
 * block; a warp per head weighs the splits, and each output sums them with 8 loads in
 * flight. */
template <int NT, int WS, typename OT>
__device__ __forceinline__ void group_finish(const lm__cuda_attn_params &p, int64_t tok, int h0, int G, int hd,
                                             int split, int used, const float *acc, const float *mx, const float *sum,
                                             float *wsplit, float *scl, int *is_last, OT *out) {
    if (used == 1) {
        for (int i = threadIdx.x; i < G * hd; i += NT) st(out + i, acc[i] / sum[i / hd]);
        return;
    }
    /* partials per head: [tok][h][split][hd + 2], as the per-head kernel lays them out */
    float *part = p.partial + ((tok * p.q_heads + h0) * p.nsplit) * (int64_t)(hd + 2);
    const int64_t head_stride = (int64_t)p.nsplit * (hd + 2);
    for (int i = threadIdx.x; i < G * hd; i += NT)
        part[(i / hd) * head_stride + (int64_t)split * (hd + 2) + i % hd] = acc[i];
    if (threadIdx.x < G) {
        float *mine = part + threadIdx.x * head_stride + (int64_t)split * (hd + 2);
        mine[hd] = mx[threadIdx.x], mine[hd + 1] = sum[threadIdx.x];
    }
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *counter = p.counters + tok * p.q_heads + h0; /* the group's first head's counter */
        *is_last = atomicAdd(counter, 1) == used - 1;
        if (*is_last) *counter = 0;
    }
    __syncthreads();
    if (!*is_last) return;
    __threadfence();
    for (int i = threadIdx.x; i < G * used; i += NT)
        wsplit[(i / used) * WS + i % used] =
            __ldcg(part + (i / used) * head_stride + (int64_t)(i % used) * (hd + 2) + hd);
    __syncthreads();
    const int lane = threadIdx.x & 31;
    for (int g = threadIdx.x >> 5; g < G; g += NT / 32) { /* warp: head g's split weights, lanes over splits */
        float *w = wsplit + g * WS, m = -INFINITY, den = 0.f;
        for (int s = lane; s < used; s += 32) m = fmaxf(m, w[s]);
        m = warp_max(m);
        for (int s = lane; s < used; s += 32) {
            w[s] = __expf(w[s] - m);
            den += w[s] * __ldcg(part + g * head_stride + (int64_t)s * (hd + 2) + hd + 1);
        }
        den = warp_sum(den);
        if (lane == 0) scl[g] = 1.f / den;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < G * hd; i += NT) {
        const int g = i / hd;
        const float *pg = part + g * head_stride + i % hd, *w = wsplit + g * WS;
        float num = 0.f;
#pragma unroll 8
        for (int s = 0; s < used; s++) num += __ldcg(pg + (int64_t)s * (hd + 2)) * w[s];
        st(out + i, num * scl[g]);
    }
}

/* The keys [k0, k1) of split `split` of token tok's row (the row's `used` splits) and
 * the K/V rows of kv head kvh (the slot's own rows for nb = 1, the pool for a paged
 * cache), or 0 when the block has nothing to do: a bad row (split 0 writes NaN to the
 * group's G * hd outputs, after wait(): a caller that has not waited for the kernel
 * before it passes pdl_wait_fn) or a split past `used`. Reads only the step's inputs
 * (positions, the table). Called by all NT threads. */
template <int NT, bool PAGED, typename OT, typename Wait>
__device__ __forceinline__ bool group_split(const lm__cuda_attn_params &p, const lm__cuda_kv &kv, int64_t tok, int kvh,
                                            int G, int hd, int split, OT *out, int64_t *k0, int64_t *k1, int *used,
                                            const bf16 **K, const bf16 **V, Wait wait) {
    const int64_t len = (int64_t)p.tok_pos[tok] + 1, P = kv.block_tokens;
    const int64_t slot = PAGED ? 0 : p.row_table[(tok / p.T) * kv.nb];
    if (PAGED ? len < 1 || len > kv.nb * P : slot < 0 || slot >= kv.blocks || len < 1 || len > P) {
        wait();
        for (int i = threadIdx.x; split == 0 && i < G * hd; i += NT) st(out + i, NAN);
        return false;
    }
    const int64_t lo = p.window > 0 ? LM_MAX((int64_t)0, len - p.window) : 0, nkeys = len - lo;
    int64_t chunk = LM_MAX((nkeys + p.nsplit - 1) / p.nsplit, (int64_t)MIN_CHUNK);
    *used = (int)((nkeys + chunk - 1) / chunk);
    if (split >= *used) return false; /* no keys: the combine waits for `used` splits only */
    *k0 = lo + (int64_t)split * chunk, *k1 = LM_MIN(*k0 + chunk, len);
    *K = (const bf16 *)kv.k, *V = (const bf16 *)kv.v;
    if (!PAGED) *K += (slot * kv.kv_heads + kvh) * P * hd, *V += (slot * kv.kv_heads + kvh) * P * hd;
    return true;
}

/* One block per (split, kv head, token) for the G = Hq / Hkv query heads of the kv
 * head (2 <= G <= GMAX); see the file comment. */
template <typename QT, typename OT, bool PAGED>
__global__ void __launch_bounds__(TILE) attn_group_kernel(lm__cuda_attn_params p, lm__cuda_kv kv) {
    extern __shared__ float sm[];
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim, G = Hq / Hkv;
    float *qs = sm, *acc = qs + G * hd, *sc = acc + G * hd; /* q [G][hd], acc [G][hd], sc [G][TILE] */
    int32_t *krow = (int32_t *)(sc + G * TILE);             /* PAGED: [TILE] cache row of each key of the tile */
    __shared__ float mx[GMAX], sum[GMAX], alpha[GMAX];
    __shared__ int is_last;
    pdl_wait(); /* launched with programmatic launch: the inputs are the previous kernel's */
    pdl_trigger();
    const int split = blockIdx.x, kvh = blockIdx.y, h0 = kvh * G, warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t tok = blockIdx.z, P = kv.block_tokens;
    const int32_t *table = p.row_table + (tok / p.T) * kv.nb;
    OT *out = (OT *)p.out + (tok * Hq + h0) * hd; /* the group's G heads are adjacent: [G][hd] */
    int64_t k0 = 0, k1 = 0;
    int used = 0;
    const bf16 *K = NULL, *V = NULL;
    if (!group_split<TILE, PAGED>(p, kv, tok, kvh, G, hd, split, out, &k0, &k1, &used, &K, &V, no_wait_fn()))
        return;
    int32_t nblock = 0, noff = 0;
    if (PAGED && threadIdx.x < k1 - k0) key_entry(table, k0 + threadIdx.x, P, &nblock, &noff);
    const QT *q = (const QT *)p.q + (tok * Hq + h0) * hd;
    for (int i = threadIdx.x; i < G * hd; i += TILE) {
        qs[i] = ld(q + i);
        acc[i] = 0.f;
    }
    if (threadIdx.x < G) mx[threadIdx.x] = -INFINITY, sum[threadIdx.x] = 0.f;
    const int npairs = hd / 2, kg = TILE / npairs, d2 = threadIdx.x % npairs, grp = threadIdx.x / npairs;
    float2 o[GMAX];
#pragma unroll
    for (int g = 0; g < GMAX; g++) o[g] = make_float2(0.f, 0.f);
    bool bad = false;
    __syncthreads();
    for (int64_t t0 = k0; t0 < k1; t0 += TILE) {
        int n = (int)LM_MIN((int64_t)TILE, k1 - t0);
        if (PAGED) {
            int miss = 0;
            if (threadIdx.x < n) {
                int32_t block = nblock, off = noff;
                if (t0 > k0) key_entry(table, t0 + threadIdx.x, P, &block, &off);
                miss = block < 0 || block >= kv.blocks;
                int32_t row = ((miss ? 0 : block) * Hkv + kvh) * (int32_t)P + off;
                krow[threadIdx.x] = row;
                if (!miss) score_key_group(K + (int64_t)row * hd, qs, G, hd, p.scale, sc + threadIdx.x);
            }
            if (__syncthreads_or(miss)) {
                bad = true;
                break;
            }
        } else {
            if (threadIdx.x < n) score_key_group(K + (t0 + threadIdx.x) * hd, qs, G, hd, p.scale, sc + threadIdx.x);
            __syncthreads();
        }
        if (warp < G) { /* warp g: the online softmax update of head g */
            float *sg = sc + warp * TILE, m = -INFINITY;
            for (int j = lane; j < n; j += 32) m = fmaxf(m, sg[j]);
            m = fmaxf(warp_max(m), mx[warp]);
            float s = 0.f;
            for (int j = lane; j < n; j += 32) {
                float e = __expf(sg[j] - m);
                sg[j] = e;
                s += e;
            }
            s = warp_sum(s);
            if (lane == 0) {
                alpha[warp] = __expf(mx[warp] - m);
                sum[warp] = sum[warp] * alpha[warp] + s;
                mx[warp] = m;
            }
        }
        __syncthreads();
        if (grp < kg) {
#pragma unroll
            for (int g = 0; g < GMAX; g++)
                if (g < G) o[g].x *= alpha[g], o[g].y *= alpha[g];
            for (int j0 = grp; j0 < n; j0 += BATCH * kg) {
                float2 v[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    int j = j0 + u * kg;
                    v[u] = make_float2(0.f, 0.f);
                    if (j < n)
                        v[u] = __bfloat1622float2(
                            *(const __nv_bfloat162 *)(V + (PAGED ? (int64_t)krow[j] : t0 + j) * hd + 2 * d2));
                }
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    int j = j0 + u * kg;
                    if (j >= n) break;
#pragma unroll
                    for (int g = 0; g < GMAX; g++) {
                        if (g >= G) break;
                        float w = sc[g * TILE + j];
                        o[g].x += w * v[u].x, o[g].y += w * v[u].y;
                    }
                }
            }
        }
        __syncthreads();
    }
    /* the kg partial sums of each head meet in sc (free after the last tile; G * TILE >=
     * kg * hd floats) and are added in group order: the same bits every run */
#pragma unroll
    for (int g = 0; g < GMAX; g++) {
        if (g >= G) break;
        if (grp < kg) sc[grp * hd + 2 * d2] = o[g].x, sc[grp * hd + 2 * d2 + 1] = o[g].y;
        __syncthreads();
        for (int i = threadIdx.x; i < hd; i += TILE) {
            float t = 0.f;
            for (int r = 0; r < kg; r++) t += sc[r * hd + i];
            acc[g * hd + i] = t;
        }
        __syncthreads();
    }
    if (PAGED && bad) {
        for (int i = threadIdx.x; i < G * hd; i += TILE) acc[i] = NAN;
        if (threadIdx.x < G) mx[threadIdx.x] = sum[threadIdx.x] = NAN;
        __syncthreads();
    }
    group_finish<TILE, MAX_SPLITS>(p, tok, h0, G, hd, split, used, acc, mx, sum, sc, alpha, &is_last, out);
}

/* ---- tensor-core form ------------------------------------------------------------------------ */
#define MMA_NW 8    /* warps per block: each walks its own tiles of the split */
#define MMA_GMAX 16 /* query heads per kv head: the rows of one m16 tile */
#define MMA_KEYS 16 /* keys per tile */
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

template <int HD> struct mma_shape {
    static constexpr int LD = HD + 8;                        /* shared row pitch: ldmatrix rows over all banks */
    static constexpr int STAGES = HD == 64 ? 4 : 2;          /* tiles in flight per warp: ~16 KiB of K and V */
    static constexpr int TILE_ELEMS = MMA_KEYS * LD;         /* one K (or V) tile */
    static constexpr int PER = MMA_KEYS * (HD / 8) / 32;     /* 16-byte chunks per lane of a tile */
    static constexpr size_t STAGE_BYTES = (size_t)MMA_NW * STAGES * 2 * TILE_ELEMS * sizeof(bf16);
    /* after the keys: per warp m, l [16] and O [16][HD]; acc [16][HD], mx, sum, scl [16],
     * wsplit [16][MAX_SPLITS] */
    static constexpr size_t COMBINE_BYTES =
        sizeof(float) * ((size_t)MMA_NW * 16 * (2 + HD) + 16 * HD + 48 + 16 * MAX_SPLITS);
    static constexpr size_t SMEM = STAGE_BYTES > COMBINE_BYTES ? STAGE_BYTES : COMBINE_BYTES;
};

/* x0, x1 as a bf16 pair hi and the pair of what hi misses, lo: hi + lo holds x to ~16
 * bits, so products of hi and lo with bf16 operands, summed in f32, are those of x. */
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t *hi, uint32_t *lo) {
    __nv_bfloat162 h = __floats2bfloat162_rn(x0, x1);
    float2 f = __bfloat1622float2(h);
    *hi = *(uint32_t *)&h;
    *lo = pk(x0 - f.x, x1 - f.y);
}

/* The tensor-core decode attention (head dims 64 and 128, 1..16 query heads per kv
 * head): one block per (split, kv head, token), MMA_NW warps. The group's queries are
 * the rows of an m16 tile (rows past G are zeros, never stored), held as A fragments in
 * registers, pre-scaled by scale * log2 e and split into bf16 hi + lo; warp w walks
 * tiles w, w + MMA_NW, ... of 16 keys of the split, its K and V rows staged by
 * cp.async STAGES tiles ahead (a paged row's table entry looked up one tile before its
 * copy is issued; keys past the split, or in a block outside the pool, stage as zeros).
 * Per tile S = Q K^T (m16n8k16, hi and lo), the online softmax in the exp2 domain, and
 * O += P V with P split into hi + lo as well, so every product is that of f32 operands
 * with the bf16 cache to ~2^-16: the result matches the per-head kernel's f32 arithmetic
 * to rounding. The warps' (m, l, O) meet in shared memory (reusing the staging space);
 * group_finish writes the output or the split's partials. Each K/V row is read once per
 * step for all the group's heads, and the block's loads are STAGES tiles deep per warp,
 * so a split of a long context is one or two round trips to the cache. With one token a
 * row (decode) the first STAGES tiles of each warp, but for the one holding the newest
 * key, are copied before the programmatic wait, while the front that stores that key
 * and q still runs (`LOOM_CUDA_ATTN_EARLY_KEYS=0`: everything after the wait). */
template <typename QT, typename OT, bool PAGED, int HD>
__global__ void __launch_bounds__(MMA_NW * 32, 1) attn_mma_kernel(lm__cuda_attn_params p, lm__cuda_kv kv) {
    using S = mma_shape<HD>;
    constexpr int ST = S::STAGES, NT = MMA_NW * 32;
    extern __shared__ __align__(16) unsigned char smraw[];
    __shared__ int is_last, any_bad;
    /* launched with programmatic launch: q and the newest key are the previous kernel's.
     * With p.early_keys and one token a row, the keys before the newest are read before
     * the wait (below); otherwise nothing is read before it. */
    const bool early = p.early_keys && p.T == 1;
    if (!early) {
        pdl_wait();
        pdl_trigger();
    }
    const int Hq = p.q_heads, Hkv = kv.kv_heads, G = Hq / Hkv;
    const int split = blockIdx.x, kvh = blockIdx.y, h0 = kvh * G;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, c = lane & 3;
    const int64_t tok = blockIdx.z, P = kv.block_tokens;
    const int32_t *table = p.row_table + (tok / p.T) * kv.nb;
    OT *out = (OT *)p.out + (tok * Hq + h0) * HD; /* the group's G heads are adjacent: [G][HD] */
    int64_t k0 = 0, k1 = 0;
    int used = 0;
    const bf16 *K = NULL, *V = NULL;
    if (!group_split<NT, PAGED>(p, kv, tok, kvh, G, HD, split, out, &k0, &k1, &used, &K, &V, pdl_wait_fn())) return;
    if (threadIdx.x == 0) any_bad = 0;

    /* this warp's tiles t = warp + i * MMA_NW, i < nwt; tile t holds keys k0 + 16 t .. */
    const int ntile = (int)((k1 - k0 + MMA_KEYS - 1) / MMA_KEYS);
    const int nwt = ntile > warp ? (ntile - warp + MMA_NW - 1) / MMA_NW : 0;
    bf16 *stage0 = (bf16 *)smraw + (size_t)warp * ST * 2 * S::TILE_ELEMS;
    bool bad = false; /* PAGED: a key of this warp's tiles sits in a block outside the pool */
    /* lane l (and l + 16) stages key l % 16 of a tile: its table entry (PAGED) first */
    auto entry = [&](int i, int32_t *block, int32_t *off) {
        const int64_t key = k0 + (int64_t)(warp + i * MMA_NW) * MMA_KEYS + (lane & 15);
        *block = -1, *off = 0;
        if (PAGED && i < nwt && key < k1) key_entry(table, key, P, block, off);
    };
    auto issue = [&](int i, int32_t block, int32_t off) {
        bf16 *ks = stage0 + (i % ST) * 2 * S::TILE_ELEMS, *vs = ks + S::TILE_ELEMS;
        const int64_t key = k0 + (int64_t)(warp + i * MMA_NW) * MMA_KEYS + (lane & 15);
        bool ok = key < k1;
        int64_t row = key;
        if (PAGED) {
            const bool miss = ok && (block < 0 || block >= kv.blocks);
            bad |= miss;
            ok = ok && !miss;
            row = ok ? ((int64_t)block * Hkv + kvh) * P + off : 0;
        }
#pragma unroll
        for (int j = 0; j < S::PER; j++) {
            const int id = lane + 32 * j, r = id / (HD / 8), ch = id % (HD / 8);
            const long long rr = __shfl_sync(0xffffffffu, (long long)row, r);
            const int okr = __shfl_sync(0xffffffffu, (int)ok, r);
            cp_async16(ks + r * S::LD + ch * 8, K + (okr ? rr * HD + ch * 8 : 0), okr);
            cp_async16(vs + r * S::LD + ch * 8, V + (okr ? rr * HD + ch * 8 : 0), okr);
        }
    };
    {
        int32_t eb[ST], eo[ST]; /* the first tiles' entries, loaded together */
#pragma unroll
        for (int i = 0; i < ST; i++) entry(i, &eb[i], &eo[i]);
        /* Early keys: tiles [0, u) are copied before the wait. With one token a row, the
         * only key of the row that this step writes is the newest (len - 1, stored by
         * the front), and no kernel of a step writes the positions or the table, so
         * every tile without that key may be read while the front still runs. The tile
         * holding it is this warp's last one (the split's last key), so the copies
         * before the wait are a prefix of the warp's tiles and the commit groups keep
         * their order. */
        int u = ST;
        if (early) {
            const int64_t newest = p.tok_pos[tok];
#pragma unroll
            for (int i = ST - 1; i >= 0; i--)
                if (i < nwt && k0 + (int64_t)(warp + i * MMA_NW) * MMA_KEYS + MMA_KEYS > newest) u = i;
        }
#pragma unroll
        for (int i = 0; i < ST; i++)
            if (i < u) {
                if (i < nwt) issue(i, eb[i], eo[i]);
                cp_async_commit(); /* one group per tile slot, empty or not: the waits count them */
            }
        if (early) {
            pdl_wait();
            pdl_trigger();
        }
#pragma unroll
        for (int i = 0; i < ST; i++)
            if (i >= u) {
                if (i < nwt) issue(i, eb[i], eo[i]);
                cp_async_commit();
            }
    }
    /* the queries (their loads in flight with the first tiles'): A fragments of rows g,
     * g + 8 (heads h0 + row), hi and lo */
    const float qscale = p.scale * LOG2E;
    const QT *q = (const QT *)p.q + (tok * Hq + h0) * HD;
    uint32_t qh[HD / 16][4], ql[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++)
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const int row = g + (r & 1) * 8, col = kk * 16 + 2 * c + (r >> 1) * 8;
            float x0 = 0.f, x1 = 0.f;
            if (row < G) x0 = ld(q + row * HD + col) * qscale, x1 = ld(q + row * HD + col + 1) * qscale;
            split_pair(x0, x1, &qh[kk][r], &ql[kk][r]);
        }

    float o[HD / 8][4], mrun[2] = {-INFINITY, -INFINITY}, lrun[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < HD / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    for (int i = 0; i < nwt; i++) {
        int32_t nb_ = -1, no_ = 0;
        entry(i + ST, &nb_, &no_); /* in flight while this tile is computed */
        asm volatile("cp.async.wait_group %0;\n" ::"n"(ST - 1) : "memory");
        __syncwarp();
        const bf16 *ks = stage0 + (i % ST) * 2 * S::TILE_ELEMS, *vs = ks + S::TILE_ELEMS;
        /* S in four independent sums (even / odd k chunks, hi / lo q) so that no chain of
         * dependent products is longer than HD / 32 */
        float s4[4][2][4];
#pragma unroll
        for (int a = 0; a < 4; a++)
#pragma unroll
            for (int e = 0; e < 4; e++) s4[a][0][e] = s4[a][1][e] = 0.f;
#pragma unroll
        for (int kk = 0; kk < HD / 16; kk++) {
            uint32_t b[4];
            frag_b_x4(ks, S::LD, 0, kk * 16, lane, b);
            float(*sh)[4] = s4[(kk & 1) * 2], (*sl)[4] = s4[(kk & 1) * 2 + 1];
            mma16816(sh[0], qh[kk], b[0], b[1]);
            mma16816(sh[1], qh[kk], b[2], b[3]);
            mma16816(sl[0], ql[kk], b[0], b[1]);
            mma16816(sl[1], ql[kk], b[2], b[3]);
        }
        float s[2][4];
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = (s4[0][j][e] + s4[2][j][e]) + (s4[1][j][e] + s4[3][j][e]);
        const int64_t kb = k0 + (int64_t)(warp + i * MMA_NW) * MMA_KEYS;
        if (kb + MMA_KEYS > k1) { /* the split's last tile: keys past k1 are hidden */
            const int nvalid = (int)(k1 - kb);
#pragma unroll
            for (int j = 0; j < 2; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (j * 8 + 2 * c + (e & 1) >= nvalid) s[j][e] = -INFINITY;
        }
        float alpha[2];
#pragma unroll
        for (int r = 0; r < 2; r++) { /* rows g (r 0) and g + 8 (r 1); key 0 of a tile is always visible */
            float m = fmaxf(fmaxf(s[0][2 * r], s[0][2 * r + 1]), fmaxf(s[1][2 * r], s[1][2 * r + 1]));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
            m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
            m = fmaxf(m, mrun[r]);
            alpha[r] = fa_exp2(mrun[r] - m);
            mrun[r] = m;
        }
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = fa_exp2(s[j][e] - mrun[e >> 1]);
#pragma unroll
        for (int r = 0; r < 2; r++)
            lrun[r] = lrun[r] * alpha[r] + (s[0][2 * r] + s[0][2 * r + 1] + s[1][2 * r] + s[1][2 * r + 1]);
#pragma unroll
        for (int n = 0; n < HD / 8; n++) o[n][0] *= alpha[0], o[n][1] *= alpha[0], o[n][2] *= alpha[1], o[n][3] *= alpha[1];
        uint32_t ph[4], pl[4]; /* P as the A fragment of one k16 chunk (the keys), hi and lo */
        split_pair(s[0][0], s[0][1], &ph[0], &pl[0]);
        split_pair(s[0][2], s[0][3], &ph[1], &pl[1]);
        split_pair(s[1][0], s[1][1], &ph[2], &pl[2]);
        split_pair(s[1][2], s[1][3], &ph[3], &pl[3]);
#pragma unroll
        for (int nd = 0; nd < HD / 16; nd++) {
            uint32_t b[4];
            frag_b_trans(vs, S::LD, 0, nd * 16, lane, b);
            mma16816(o[2 * nd], ph, b[0], b[1]);
            mma16816(o[2 * nd + 1], ph, b[2], b[3]);
            mma16816(o[2 * nd], pl, b[0], b[1]);
            mma16816(o[2 * nd + 1], pl, b[2], b[3]);
        }
        __syncwarp(); /* every lane is done with this stage before it is refilled */
        if (i + ST < nwt) issue(i + ST, nb_, no_);
        cp_async_commit();
    }
    cp_async_wait_all();
#pragma unroll
    for (int r = 0; r < 2; r++) {
        lrun[r] += __shfl_xor_sync(0xffffffffu, lrun[r], 1);
        lrun[r] += __shfl_xor_sync(0xffffffffu, lrun[r], 2);
    }
    const bool wbad = __any_sync(0xffffffffu, bad);
    __syncthreads(); /* the staging space is free: the warps' results go there */
    float *wm = (float *)smraw, *wl = wm + MMA_NW * 16, *wo = wl + MMA_NW * 16, *acc = wo + MMA_NW * 16 * HD;
    float *mx = acc + 16 * HD, *sum = mx + 16, *scl = sum + 16, *wsplit = scl + 16;
    if (c == 0) {
        wm[warp * 16 + g] = mrun[0], wm[warp * 16 + g + 8] = mrun[1];
        wl[warp * 16 + g] = lrun[0], wl[warp * 16 + g + 8] = lrun[1];
    }
#pragma unroll
    for (int n = 0; n < HD / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) wo[(warp * 16 + g + (e >> 1) * 8) * HD + n * 8 + 2 * c + (e & 1)] = o[n][e];
    if (lane == 0 && wbad) any_bad = 1;
    __syncthreads();
    /* the warps' rows combined in warp order (a warp without tiles has m = -inf, l = 0) */
    for (int i = threadIdx.x; i < G * HD; i += NT) {
        const int row = i / HD;
        float m = -INFINITY, a = 0.f;
#pragma unroll
        for (int w = 0; w < MMA_NW; w++) m = fmaxf(m, wm[w * 16 + row]);
#pragma unroll
        for (int w = 0; w < MMA_NW; w++) a += wo[(w * 16 + row) * HD + i % HD] * fa_exp2(wm[w * 16 + row] - m);
        acc[i] = any_bad ? NAN : a;
    }
    if (threadIdx.x < G) {
        const int row = threadIdx.x;
        float m = -INFINITY, l = 0.f;
#pragma unroll
        for (int w = 0; w < MMA_NW; w++) m = fmaxf(m, wm[w * 16 + row]);
#pragma unroll
        for (int w = 0; w < MMA_NW; w++) l += wl[w * 16 + row] * fa_exp2(wm[w * 16 + row] - m);
        mx[row] = any_bad ? NAN : m * LN2, sum[row] = any_bad ? NAN : l; /* m back to natural-log units */
    }
    __syncthreads();
    group_finish<NT, MAX_SPLITS>(p, tok, h0, G, HD, split, used, acc, mx, sum, wsplit, scl, &is_last, out);
}

/* The grouped kernel for 2..GMAX query heads per kv head once a call is large enough
 * to be bound by reading the cache: GROUP_MIN_TOKENS rows of GROUP_MIN_CAPACITY or
 * more positions. On an H200 (Qwen2.5-0.5B shape, group 7, bench/NOTES.md) it decodes
 * B32 at context 4,096 1.51x faster than the per-head kernel, but B1 (whose few
 * blocks run one after another through the group's heads) 18% slower at context 16
 * and 4,096, and B32 at context 16 12% slower. LOOM_CUDA_ATTN_ROWS=head|early|group
 * overrides the choice (for comparisons and tests; each also turns the tensor-core kernel
 * off, which mma or no setting leaves on where it applies): head is the per-head kernel
 * without its early-V form, early the per-head kernel with it wherever the head dim
 * allows. */
#define GROUP_MIN_TOKENS 8
#define GROUP_MIN_CAPACITY 2048
static int use_group_kernel(int G, int64_t ntok, int64_t capacity) {
    const char *e = getenv("LOOM_CUDA_ATTN_ROWS");
    if (G < 2 || G > GMAX || (e && (strcmp(e, "head") == 0 || strcmp(e, "early") == 0))) return 0;
    return (e && strcmp(e, "group") == 0) || (ntok >= GROUP_MIN_TOKENS && capacity >= GROUP_MIN_CAPACITY);
}

/* The tensor-core kernel wherever it applies (head dims 64 and 128, groups of up to 16
 * heads, a device that grants a block its ~140 KiB of shared memory) unless
 * LOOM_CUDA_ATTN_ROWS names one of the others. */
static int use_mma_kernel(int hd, int G) {
    const char *e = getenv("LOOM_CUDA_ATTN_ROWS");
    if ((hd != 64 && hd != 128) || G > MMA_GMAX) return 0;
    if ((size_t)lm__cuda_smem_optin() < (hd == 64 ? mma_shape<64>::SMEM : mma_shape<128>::SMEM)) return 0;
    return !(e && (strcmp(e, "head") == 0 || strcmp(e, "early") == 0 || strcmp(e, "group") == 0));
}

/* The tensor-core kernel's splits: as many as whole (kv head, token) sets of them fit
 * the GPU in one wave (per_sm blocks on each SM; a nearly empty second wave would double
 * the call), within what the workspace holds (p->nsplit, at most MAX_SPLITS: 64 splits
 * were slower than 32 at B1 and context 16,000, the combine growing with them; H200,
 * bench/NOTES.md). LOOM_CUDA_ATTN_MMA_SPLITS=N asks for N instead (measurements). */
static int mma_splits(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, int per_sm) {
    const char *e = getenv("LOOM_CUDA_ATTN_MMA_SPLITS");
    int64_t want = e && atoi(e) > 0 ? atoi(e) : (int64_t)lm__cuda_sm_count() * per_sm / (kv->kv_heads * p->ntok);
    return (int)LM_MAX(1, LM_MIN(want, (int64_t)p->nsplit));
}

template <typename QT, typename OT, int HD>
static lm_status launch_mma(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    static lm__cuda_kernel_facts facts[2]; /* slot and paged */
    const int paged = kv->nb != 1;
    void (*kernel)(lm__cuda_attn_params, lm__cuda_kv) = paged ? attn_mma_kernel<QT, OT, true, HD>
                                                              : attn_mma_kernel<QT, OT, false, HD>;
    const size_t smem = mma_shape<HD>::SMEM;
    int per_sm = 0;
    cudaError_t e = lm__cuda_blocks_per_sm(&facts[paged], (const void *)kernel, MMA_NW * 32, smem, &per_sm);
    if (e == cudaSuccess && per_sm < 1) e = cudaErrorInvalidConfiguration;
    if (e != cudaSuccess) return lm__cuda_check((int)e, "attention_rows (tensor cores) occupancy");
    lm__cuda_attn_params q = *p;
    q.nsplit = mma_splits(p, kv, per_sm);
    const char *ek = getenv("LOOM_CUDA_ATTN_EARLY_KEYS"); /* =0: nothing read before the wait (measurements) */
    q.early_keys = !(ek && strcmp(ek, "0") == 0);
    dim3 grid((unsigned)q.nsplit, (unsigned)kv->kv_heads, (unsigned)p->ntok);
    e = lm__cuda_launch_pdl(kernel, grid, dim3(MMA_NW * 32), smem, s, q, *kv);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "attention_rows (tensor cores) launch");
    return lm__cuda_launched("attention_rows (tensor cores)");
}

template <typename QT, typename OT>
static lm_status launch(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    const int hd = kv->head_dim, G = p->q_heads / kv->kv_heads;
    const size_t paged = kv->nb != 1 ? sizeof(int32_t) * TILE : 0;
    if (use_mma_kernel(hd, G)) return hd == 64 ? launch_mma<QT, OT, 64>(p, kv, s) : launch_mma<QT, OT, 128>(p, kv, s);
    if (use_group_kernel(G, p->ntok, kv->nb * kv->block_tokens)) {
        dim3 grid((unsigned)p->nsplit, (unsigned)kv->kv_heads, (unsigned)p->ntok);
        size_t smem = sizeof(float) * (size_t)(2 * G * hd + G * TILE) + paged;
        cudaError_t e = paged ? lm__cuda_launch_pdl(attn_group_kernel<QT, OT, true>, grid, dim3(TILE), smem, s, *p, *kv)
                              : lm__cuda_launch_pdl(attn_group_kernel<QT, OT, false>, grid, dim3(TILE), smem, s, *p, *kv);
        if (e != cudaSuccess) return lm__cuda_check((int)e, "attention_rows (grouped) launch");
        return lm__cuda_launched("attention_rows (grouped)");
    }
    dim3 grid((unsigned)p->nsplit, (unsigned)p->q_heads, (unsigned)p->ntok);
    const size_t base = sizeof(float) * (size_t)(2 * hd + TILE) + paged;
    const size_t smem = base + sizeof(float) * 2 * TILE; /* red: kg x hd <= 2 TILE floats */
    /* the early-V variant where its head dim allows and the grid fits the GPU in one wave
     * at its occupancy (its V batch costs registers: a second wave would cost more than
     * the round trips it saves) */
    static lm__cuda_kernel_facts facts[2]; /* the early kernels, slot and paged */
    void (*early)(lm__cuda_attn_params, lm__cuda_kv) = paged ? attn_rows_kernel<QT, OT, true, true>
                                                             : attn_rows_kernel<QT, OT, false, true>;
    const size_t early_smem = base + sizeof(float) * 8 * TILE; /* red: kgv x hd = 8 TILE floats */
    const char *force = getenv("LOOM_CUDA_ATTN_ROWS");
    int per_sm = 0, use_early = hd >= 8 && hd <= 256 && (hd & (hd - 1)) == 0 && !(force && strcmp(force, "head") == 0);
    if (use_early && !(force && strcmp(force, "early") == 0)) {
        cudaError_t e = lm__cuda_blocks_per_sm(&facts[paged ? 1 : 0], (const void *)early, TILE, early_smem, &per_sm);
        if (e != cudaSuccess) return lm__cuda_check((int)e, "attention_rows occupancy");
        use_early = (int64_t)grid.x * grid.y * grid.z <= (int64_t)lm__cuda_sm_count() * per_sm;
    }
    cudaError_t e;
    if (use_early) e = lm__cuda_launch_pdl(early, grid, dim3(TILE), early_smem, s, *p, *kv);
    else if (paged) e = lm__cuda_launch_pdl(attn_rows_kernel<QT, OT, true, false>, grid, dim3(TILE), smem, s, *p, *kv);
    else e = lm__cuda_launch_pdl(attn_rows_kernel<QT, OT, false, false>, grid, dim3(TILE), smem, s, *p, *kv);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "attention_rows launch");
    return lm__cuda_launched("attention_rows");
}

lm_status lm__cuda_attention_rows(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    if (p->ntok == 0) return LM_OK;
    int hd = kv->head_dim;
    if (hd % 2 || hd / 2 > TILE || p->nsplit < 1 || p->nsplit > MAX_SPLITS || p->q_heads % kv->kv_heads)
        return lm__error(LM_UNSUPPORTED, "attention_rows: head dim %d (even, <= %d), %d splits (1..%d)", hd, 2 * TILE,
                         p->nsplit, MAX_SPLITS);
    if (kv->nb != 1 && (kv->block_tokens > INT32_MAX || kv->blocks * kv->kv_heads * kv->block_tokens > INT32_MAX))
        return lm__error(LM_UNSUPPORTED, "attention_rows: a paged cache of %lld x %d x %lld key rows (int32 indices)",
                         (long long)kv->blocks, kv->kv_heads, (long long)kv->block_tokens);
    if (p->ntok > 65535) return lm__error(LM_UNSUPPORTED, "attention_rows: %lld tokens in one call", (long long)p->ntok);
    if (p->q_bf16) return p->out_bf16 ? launch<bf16, bf16>(p, kv, s) : launch<bf16, float>(p, kv, s);
    return p->out_bf16 ? launch<float, bf16>(p, kv, s) : launch<float, float>(p, kv, s);
}
