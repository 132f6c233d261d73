/* ops/cuda/attention_rows.cu — causal attention of single query tokens over the bf16
 * KV cache, split along the keys (decode; also the prefill path for head dims or
 * query dtypes the tensor-core kernel does not take).
 *
 * Token tok (slot of its row tok / T, position pos) attends keys [lo, pos] with lo =
 * max(0, pos + 1 - window) (0 without a window); a token whose slot or position is
 * outside the cache writes NaN and reads nothing. One block per (split, query
 * head, token): query head h reads kv head h / (Hq / Hkv) in place, so a group's K/V
 * rows are read by each of its heads (from L2 after the first) and a one-token decode
 * still spreads over Hq blocks. A block walks its key range in tiles of TILE keys:
 * thread j scores key j (its K row loaded BATCH 16-byte chunks at a time), one warp
 * updates the running max and sum, and for P V thread (grp, d2) accumulates dims
 * (2 d2, 2 d2 + 1) over every kg-th key in registers, BATCH V loads in flight at once;
 * the kg partial sums meet in shared memory once, after the last tile. Splits are at
 * least MIN_CHUNK keys; with one split the block normalizes and writes the output
 * directly, otherwise each split leaves (acc, max, sum) in the workspace and the last
 * block to finish (a per (token, head) counter, reset by that block so a captured graph
 * can replay) combines them. The grid depends only on the cache capacity, never on the
 * current lengths, which live in device memory: this is what makes decode capturable.
 * Work O(ntok * Hq * pos * hd); bytes ~ 2 * pos * hd * 2 per (token, kv head) from HBM.
 */
#include "ops/cuda/common.cuh"

#define TILE 256      /* keys per tile = threads per block */
#define MIN_CHUNK 256 /* fewest keys worth a split (a split costs a combine step) */
#define BATCH 8       /* loads issued together before their values are used */
#define MAX_SPLITS 32

int lm__cuda_attention_rows_splits(int64_t max_tokens) {
    int64_t n = (max_tokens + MIN_CHUNK - 1) / MIN_CHUNK;
    return (int)LM_MAX(1, LM_MIN(n, MAX_SPLITS));
}

size_t lm__cuda_attention_rows_workspace(int64_t ntok, int q_heads, int head_dim, int nsplit) {
    return (size_t)ntok * (size_t)q_heads * (size_t)nsplit * (size_t)(head_dim + 2);
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

template <typename QT, typename OT>
__global__ void __launch_bounds__(TILE) attn_rows_kernel(lm__cuda_attn_params p, lm__cuda_kv kv) {
    extern __shared__ float sm[];
    const int Hq = p.q_heads, Hkv = kv.kv_heads, hd = kv.head_dim;
    float *qs = sm, *acc = qs + hd, *sc = acc + hd; /* q [hd], acc [hd], sc [TILE] */
    __shared__ float mx, sum, alpha;
    __shared__ int is_last;
    pdl_trigger(); /* the output projection's GEMV may start streaming its weights */
    const int split = blockIdx.x, h = blockIdx.y, kvh = h / (Hq / Hkv), warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t tok = blockIdx.z, len = (int64_t)p.tok_pos[tok] + 1, slot = p.row_slot[tok / p.T];
    if (slot < 0 || slot >= kv.slots || len < 1 || len > kv.max_tokens) { /* a bad row: NaN, nothing read */
        OT *bad = (OT *)p.out + (tok * Hq + h) * hd;
        for (int i = threadIdx.x; split == 0 && i < hd; i += TILE) st(bad + i, NAN);
        return;
    }
    const int64_t lo = p.window > 0 ? LM_MAX((int64_t)0, len - p.window) : 0, nkeys = len - lo;
    int64_t chunk = LM_MAX((nkeys + p.nsplit - 1) / p.nsplit, (int64_t)MIN_CHUNK);
    const int used = (int)((nkeys + chunk - 1) / chunk);
    if (split >= used) return; /* no keys: the combine waits for `used` splits only */
    const int64_t k0 = lo + (int64_t)split * chunk, k1 = LM_MIN(k0 + chunk, len);
    const bf16 *K = (const bf16 *)kv.k + (slot * Hkv + kvh) * kv.max_tokens * hd;
    const bf16 *V = (const bf16 *)kv.v + (slot * Hkv + kvh) * kv.max_tokens * hd;
    const QT *q = (const QT *)p.q + (tok * Hq + h) * hd;
    for (int i = threadIdx.x; i < hd; i += TILE) {
        qs[i] = ld(q + i);
        acc[i] = 0.f;
    }
    if (threadIdx.x == 0) mx = -INFINITY, sum = 0.f;
    /* P V: thread (grp, d2) owns dims 2*d2, 2*d2+1 for keys j = grp mod kg */
    const int npairs = hd / 2, kg = TILE / npairs, d2 = threadIdx.x % npairs, grp = threadIdx.x / npairs;
    float2 o = make_float2(0.f, 0.f);
    __syncthreads();
    for (int64_t t0 = k0; t0 < k1; t0 += TILE) {
        int n = (int)LM_MIN((int64_t)TILE, k1 - t0);
        if (threadIdx.x < n) sc[threadIdx.x] = score_key(K + (t0 + threadIdx.x) * hd, qs, hd, p.scale);
        __syncthreads();
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
        if (grp < kg) {
            o.x *= alpha, o.y *= alpha;
            for (int j0 = grp; j0 < n; j0 += BATCH * kg) { /* BATCH V loads in flight, then their use */
                float2 v[BATCH];
#pragma unroll
                for (int u = 0; u < BATCH; u++) {
                    int j = j0 + u * kg;
                    v[u] = j < n ? __bfloat1622float2(*(const __nv_bfloat162 *)(V + (t0 + j) * hd + 2 * d2))
                                 : make_float2(0.f, 0.f);
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
    if (grp < kg) {
        atomicAdd(&acc[2 * d2], o.x);
        atomicAdd(&acc[2 * d2 + 1], o.y);
    }
    __syncthreads();
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

template <typename QT, typename OT>
static lm_status launch(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, size_t smem, cudaStream_t s) {
    dim3 grid((unsigned)p->nsplit, (unsigned)p->q_heads, (unsigned)p->ntok);
    attn_rows_kernel<QT, OT><<<grid, TILE, smem, s>>>(*p, *kv);
    return lm__cuda_launched("attention_rows");
}

lm_status lm__cuda_attention_rows(const lm__cuda_attn_params *p, const lm__cuda_kv *kv, cudaStream_t s) {
    if (p->ntok == 0) return LM_OK;
    int hd = kv->head_dim;
    if (hd % 2 || hd / 2 > TILE || p->nsplit < 1 || p->nsplit > MAX_SPLITS || p->q_heads % kv->kv_heads)
        return lm__error(LM_UNSUPPORTED, "attention_rows: head dim %d (even, <= %d), %d splits (1..%d)", hd, 2 * TILE,
                         p->nsplit, MAX_SPLITS);
    if (p->ntok > 65535) return lm__error(LM_UNSUPPORTED, "attention_rows: %lld tokens in one call", (long long)p->ntok);
    size_t smem = sizeof(float) * (size_t)(2 * hd + TILE);
    if (p->q_bf16) return p->out_bf16 ? launch<bf16, bf16>(p, kv, smem, s) : launch<bf16, float>(p, kv, smem, s);
    return p->out_bf16 ? launch<float, bf16>(p, kv, smem, s) : launch<float, float>(p, kv, smem, s);
}
