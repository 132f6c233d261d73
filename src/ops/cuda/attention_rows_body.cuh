/* ops/cuda/attention_rows_body.cuh — the per-head decode attention's device code
 * (ops/cuda/attention_rows.cu describes the kernel), as a function of the block's
 * coordinates so that a kernel running several step operators in one launch can call
 * it too. Included by .cu files only. */
#ifndef LOOM_OPS_CUDA_ATTENTION_ROWS_BODY_CUH
#define LOOM_OPS_CUDA_ATTENTION_ROWS_BODY_CUH

#include "ops/cuda/common.cuh"

#define TILE 256      /* keys per tile = threads per block */
#define MIN_CHUNK 256 /* fewest keys worth a split (a split costs a combine step) */
#define BATCH 8       /* loads issued together before their values are used */
#define MAX_SPLITS 32
#define VBATCH 8 /* EARLY: keys per thread whose V chunks are loaded together */

/* EARLY: VBATCH 16-byte V chunks of this thread's keys j = j0 + u * kgv of the tile
 * (chunk c of each row; zeros past n), issued before the scores are computed. */
template <bool PAGED>
__device__ __forceinline__ void load_v_batch(const bf16 *V, const int32_t *krow, int64_t t0, int j0, int n, int kgv,
                                             int hd, int c, uint4 *vr) {
#pragma unroll
    for (int u = 0; u < VBATCH; u++) {
        int j = j0 + u * kgv;
        vr[u] = j < n ? *(const uint4 *)(V + (PAGED ? (int64_t)krow[j] : t0 + j) * hd + c * 8) : make_uint4(0, 0, 0, 0);
    }
}

/* scale * q . k for key row kr (q in shared memory). The row's 16-byte chunks are
 * loaded BATCH at a time before any is used: one or two memory round trips a key. */
__device__ __forceinline__ float score_key(const bf16 *kr, const float *qs, int hd, float scale) {
    float a = 0.f;
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
                    a += kf.x * qs[d] + kf.y * qs[d + 1];
                }
            }
        }
    } else {
        const __nv_bfloat162 *k2 = (const __nv_bfloat162 *)kr;
        for (int d2 = 0; d2 < hd / 2; d2++) {
            float2 kf = __bfloat1622float2(k2[d2]);
            a += kf.x * qs[2 * d2] + kf.y * qs[2 * d2 + 1];
        }
    }
    return a * scale;
}

/* The table entry (a block, not yet checked) and the offset in it of key j: 32-bit
 * division (keys are i32 positions, P < 2^31 by the launcher). The load is left in
 * flight until the entry is used. */
static __device__ __forceinline__ void key_entry(const int32_t *table, int64_t j, int64_t P, int32_t *block,
                                                 int32_t *off) {
    uint32_t e = (uint32_t)j / (uint32_t)P;
    *block = table[e];
    *off = (int32_t)(j - (int64_t)e * P);
}

/* PAGED: nb != 1, keys found through the row's block table; else nb = 1, the row's slot.
 * EARLY (head dims 8..256 that are powers of two; for grids that fit the GPU in one
 * wave, where registers per thread cost nothing): thread (vg, c) owns the 8 dims of
 * chunk c over keys vg mod kgv and issues the V loads of a tile's first VBATCH such
 * keys together with its K loads, before the scores are known: a short context's
 * attention is one round trip to the cache instead of one for K and one per V batch.
 * The kgv partial sums meet in shared memory (red, kgv x hd floats past krow); without
 * EARLY the kg partial sums of the (grp, d2) threads meet there too (kg x hd <= 2 TILE
 * floats), both added in a fixed order.
 * The kernel's body for block (split, h, tok) (its own launch passes its block index).
 * wait() is called first, by every thread, before any input is read: pdl_wait in its
 * own launch (programmatic dependent launch), whatever orders it after the producers
 * of its inputs elsewhere. */
template <typename QT, typename OT, bool PAGED, bool EARLY, typename Wait>
__device__ __forceinline__ void attn_rows_body(const lm__cuda_attn_params &p, const lm__cuda_kv &kv, int split, int h,
                                               int64_t tok_, Wait wait) {
    wait();
    extern __shared__ float sm[];
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim;
    float *qs = sm, *acc = qs + hd, *sc = acc + hd; /* q [hd], acc [hd], sc [TILE] */
    int32_t *krow = (int32_t *)(sc + TILE);          /* PAGED: [TILE] cache row of each key of the tile */
    float *red = (float *)(krow + (PAGED ? TILE : 0)); /* [kgv][hd] (EARLY) or [kg][hd] partial P V sums */
    __shared__ float mx, sum, alpha;
    __shared__ int is_last;
    pdl_trigger(); /* the output projection's GEMV may start streaming its weights */
    const int kvh = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t tok = tok_, len = (int64_t)p.tok_pos[tok] + 1, P = kv.block_tokens;
    const int32_t *table = p.row_table + (tok / p.T) * kv.nb;
    const int64_t slot = PAGED ? 0 : table[0];
    if (PAGED ? len < 1 || len > kv.nb * P : slot < 0 || slot >= kv.blocks || len < 1 || len > P) {
        OT *bad = (OT *)p.out + (tok * Hq + h) * hd; /* a bad row: NaN, nothing read */
        for (int i = threadIdx.x; split == 0 && i < hd; i += TILE) st(bad + i, NAN);
        return;
    }
    const int64_t lo = p.window > 0 ? LM_MAX((int64_t)0, len - p.window) : 0, nkeys = len - lo;
    int64_t chunk = LM_MAX((nkeys + p.nsplit - 1) / p.nsplit, (int64_t)MIN_CHUNK);
    const int used = (int)((nkeys + chunk - 1) / chunk);
    if (split >= used) return; /* no keys: the combine waits for `used` splits only */
    const int64_t k0 = lo + (int64_t)split * chunk, k1 = LM_MIN(k0 + chunk, len);
    /* nb = 1: the slot's keys of head kvh, indexed by position; paged: the pool, by krow */
    const bf16 *K = (const bf16 *)kv.k, *V = (const bf16 *)kv.v;
    if (!PAGED) K += (slot * Hkv + kvh) * P * hd, V += (slot * Hkv + kvh) * P * hd;
    int32_t nblock = 0, noff = 0; /* PAGED: the entry of this thread's key in the first tile */
    if (PAGED && threadIdx.x < k1 - k0) key_entry(table, k0 + threadIdx.x, P, &nblock, &noff);
    const QT *q = (const QT *)p.q + (tok * Hq + h) * hd;
    for (int i = threadIdx.x; i < hd; i += TILE) {
        qs[i] = ld(q + i);
        acc[i] = 0.f;
    }
    if (threadIdx.x == 0) mx = -INFINITY, sum = 0.f;
    /* P V: thread (grp, d2) owns dims 2*d2, 2*d2+1 for keys j = grp mod kg */
    const int npairs = hd / 2, kg = TILE / npairs, d2 = threadIdx.x % npairs, grp = threadIdx.x / npairs;
    float2 o = make_float2(0.f, 0.f);
    /* EARLY: thread (vg, c) of kgv key groups, its 8 sums and its batch of V chunks */
    const int nch = EARLY ? hd / 8 : 1, c = threadIdx.x % nch, vg = threadIdx.x / nch, kgv = TILE / nch;
    float o8[8];
    uint4 vr[EARLY ? VBATCH : 1];
#pragma unroll
    for (int i = 0; i < 8; i++) o8[i] = 0.f;
    bool bad = false; /* PAGED: a key of this split sits in a block outside the pool (block-uniform) */
    __syncthreads();
    for (int64_t t0 = k0; t0 < k1; t0 += TILE) {
        int n = (int)LM_MIN((int64_t)TILE, k1 - t0);
        if (PAGED) { /* thread j scores key t0 + j; the P V step reads its row from krow */
            int miss = 0;
            int32_t row = 0;
            if (threadIdx.x < n) {
                int32_t block = nblock, off = noff;
                if (t0 > k0) key_entry(table, t0 + threadIdx.x, P, &block, &off);
                miss = block < 0 || block >= kv.blocks;
                row = ((miss ? 0 : block) * Hkv + kvh) * (int32_t)P + off; /* < 2^31: the launcher */
                krow[threadIdx.x] = row;
            }
            if (EARLY) { /* every key's row is known before the V loads go out */
                if (__syncthreads_or(miss)) {
                    bad = true;
                    break;
                }
                load_v_batch<true>(V, krow, t0, vg, n, kgv, hd, c, vr);
            }
            if (threadIdx.x < n && !miss) sc[threadIdx.x] = score_key(K + (int64_t)row * hd, qs, hd, p.scale);
            if (EARLY) {
                __syncthreads();
            } else if (__syncthreads_or(miss)) {
                bad = true;
                break;
            }
        } else {
            if (EARLY) load_v_batch<false>(V, krow, t0, vg, n, kgv, hd, c, vr);
            if (threadIdx.x < n) sc[threadIdx.x] = score_key(K + (t0 + threadIdx.x) * hd, qs, hd, p.scale);
            __syncthreads();
        }
        if (warp == 0) { /* online softmax update */
            float m = -INFINITY;
            for (int j = lane; j < n; j += 32) m = fmaxf(m, sc[j]);
            m = fmaxf(warp_max(m), mx);
            float s = 0.f;
            for (int j = lane; j < n; j += 32) {
                float e = __expf(sc[j] - m);
                sc[j] = e;
                s += e;
            }
            s = warp_sum(s);
            if (lane == 0) {
                alpha = __expf(mx - m);
                sum = sum * alpha + s;
                mx = m;
            }
        }
        __syncthreads();
        if (EARLY) { /* the first batch is in vr already */
            const float a = alpha;
#pragma unroll
            for (int i = 0; i < 8; i++) o8[i] *= a;
            for (int j0 = vg; j0 < n; j0 += VBATCH * kgv) {
                if (j0 > vg) load_v_batch<PAGED>(V, krow, t0, j0, n, kgv, hd, c, vr);
#pragma unroll
                for (int u = 0; u < VBATCH; u++) {
                    int j = j0 + u * kgv;
                    if (j >= n) break;
                    const float e = sc[j];
                    const __nv_bfloat162 *v2 = (const __nv_bfloat162 *)&vr[u];
#pragma unroll
                    for (int i = 0; i < 4; i++) {
                        float2 f = __bfloat1622float2(v2[i]);
                        o8[2 * i] += e * f.x, o8[2 * i + 1] += e * f.y;
                    }
                }
            }
        } else if (grp < kg) {
            o.x *= alpha, o.y *= alpha;
            for (int j0 = grp; j0 < n; j0 += BATCH * kg) { /* BATCH V loads in flight, then their use */
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
                    o.x += sc[j] * v[u].x, o.y += sc[j] * v[u].y;
                }
            }
        }
        __syncthreads(); /* sc is rewritten by the next tile */
    }
    if (EARLY) {
#pragma unroll
        for (int i = 0; i < 8; i++) red[vg * hd + c * 8 + i] = o8[i];
        __syncthreads();
        for (int i = threadIdx.x; i < hd; i += TILE) {
            float t = 0.f;
            for (int g = 0; g < kgv; g++) t += red[g * hd + i];
            acc[i] = t;
        }
    } else { /* added in group order, as above: the same bits every run */
        if (grp < kg) red[grp * hd + 2 * d2] = o.x, red[grp * hd + 2 * d2 + 1] = o.y;
        __syncthreads();
        for (int i = threadIdx.x; i < hd; i += TILE) {
            float t = 0.f;
            for (int g = 0; g < kg; g++) t += red[g * hd + i];
            acc[i] = t;
        }
    }
    __syncthreads();
    if (PAGED && bad) { /* NaN for this split: written directly, or carried by the combine (its den is NaN) */
        for (int i = threadIdx.x; i < hd; i += TILE) acc[i] = NAN;
        if (threadIdx.x == 0) mx = sum = NAN;
        __syncthreads();
    }
    OT *out = (OT *)p.out + (tok * Hq + h) * hd;
    if (used == 1) {
        for (int i = threadIdx.x; i < hd; i += TILE) st(out + i, acc[i] / sum);
        return;
    }
    /* leave this split's partial result, then the last split to arrive combines */
    float *part = p.partial + ((tok * Hq + h) * p.nsplit) * (int64_t)(hd + 2);
    float *mine = part + (int64_t)split * (hd + 2);
    for (int i = threadIdx.x; i < hd; i += TILE) mine[i] = acc[i];
    if (threadIdx.x == 0) mine[hd] = mx, mine[hd + 1] = sum;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        int *counter = p.counters + tok * Hq + h;
        is_last = atomicAdd(counter, 1) == used - 1;
        if (is_last) *counter = 0;
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    float *wsplit = sc; /* [MAX_SPLITS] weights of the splits; sc is free now */
    if (threadIdx.x < used) wsplit[threadIdx.x] = __ldcg(part + (int64_t)threadIdx.x * (hd + 2) + hd);
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = -INFINITY, den = 0.f;
        for (int s = 0; s < used; s++) m = fmaxf(m, wsplit[s]);
        for (int s = 0; s < used; s++) {
            wsplit[s] = __expf(wsplit[s] - m);
            den += wsplit[s] * __ldcg(part + (int64_t)s * (hd + 2) + hd + 1);
        }
        alpha = 1.f / den;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < hd; i += TILE) {
        float num = 0.f;
#pragma unroll
        for (int s = 0; s < MAX_SPLITS; s++)
            if (s < used) num += __ldcg(part + (int64_t)s * (hd + 2) + i) * wsplit[s];
        st(out + i, num * alpha);
    }
}

#endif
