/* plan/dplan_exec.cu — a decode schedule as one persistent launch (plan/dplan_exec.h):
 * every block walks one SM list, and each item runs its piece of a step operator.
 *
 * Per item, in list order:
 *  - the item's entry and its op's record (the parameters the step's own GEMV or
 *    attention launch would take) sit in shared memory; both were loaded while the item
 *    before it ran (records and entries two deep: no table read sits between items);
 *  - a GEMV piece calls the decode GEMV's body (ops/cuda/gemv_body.cuh) over its range
 *    of row groups: each warp issues its first batch of weight loads, then the block
 *    waits for the item's dependencies (thread t polls waits t, t + 256, ... with
 *    ld.acquire.gpu, a barrier), then stages the input and streams the rest; so an
 *    item's first weights are in flight while the items it needs finish elsewhere;
 *  - attention pieces wait first, then a warp per (token, query head): 32 keys at a time,
 *    one per lane (its q . k from the bf16 cache), an online softmax across the warp,
 *    and each lane's hd / 32 dims of the weighted values; key chunks leave their
 *    partials (max, sum, weighted values) in the plan's buffer for a merge item;
 *  - a barrier, then thread 0 releases the item (a fence, st.release.gpu of its flag,
 *    red.release.gpu.add on its op's counter: whichever some wait reads).
 * Inputs written in the same launch are read through L2 or plainly (never through the
 * read-only path, whose cache need not see other SMs' writes). Flags and counters keep
 * their values between launches: each launch waits for its own epoch. A wait of more
 * than 2^32 cycles (~2 s) records the item and every block leaves.
 */
#include "ops/cuda/gemv_body.cuh"
#include "plan/dplan_exec.h"
#include "plan/dplan_part.h"
#include "plan/dplan_sync.cuh"

#include <stdlib.h>
#include <string.h>

#define DX_WARPS WARPS
#define DX_THREADS THREADS


struct dx_args {
    const int64_t *sm_begin;
    const lm__dx_entry *ent;
    const int32_t *waits;
    const lm__dx_op *ops;
    unsigned *flags, *counters;
    const int32_t *counts;
    unsigned epoch;
    unsigned *err; /* 1 + the item whose wait timed out */
    float *part;
    long long *stamps; /* profiling, or NULL: per list position, clock64 at its start, after its wait, at its end */
};


/* ---- attention: a warp per (token, query head) ------------------------------------------- */

/* The cache row of kv head kvh's key at position j of a row with block table `table`;
 * -1 when its block lies outside the pool. */
__device__ __forceinline__ int64_t dx_key_row(const lm__cuda_kv &kv, const int32_t *table, int kvh, int64_t j) {
    int64_t blk, off;
    if (kv.nb == 1) blk = table[0], off = j;
    else blk = table[j / kv.block_tokens], off = j % kv.block_tokens;
    if (blk < 0 || blk >= kv.blocks) return -1;
    return (blk * kv.kv_heads + kvh) * kv.block_tokens + off;
}

/* Dims of the head a lane owns (HD 16: lanes 0..15 one each) and keys per chunk: a
 * chunk's value rows are loaded together, 32 words a lane at most. */
template <int HD>
struct dx_attn_cfg {
    static constexpr int DPL = HD >= 32 ? HD / 32 : 1;
    static constexpr int W = DPL >= 2 ? DPL / 2 : 1; /* 32-bit words of a lane's dims */
    static constexpr int KC = DPL <= 2 ? 32 : 64 / DPL;
};

/* The running softmax of one query: max m and sum l (every lane), the lane's dims. */
template <int HD>
struct dx_soft {
    float m, l, acc[dx_attn_cfg<HD>::DPL];
};

/* A lane's dims of one value row (bf16) as words: dims 2i, 2i + 1 in word i (one dim:
 * word 0's low half). */
template <int DPL>
__device__ __forceinline__ void dx_vload(const bf16 *p, uint32_t *w) {
    if constexpr (DPL == 1) {
        w[0] = __ldcg((const unsigned short *)p);
    } else if constexpr (DPL == 2) {
        w[0] = __ldcg((const unsigned int *)p);
    } else if constexpr (DPL == 4) {
        const uint2 v = __ldcg((const uint2 *)p);
        w[0] = v.x, w[1] = v.y;
    } else {
        const uint4 v = __ldcg((const uint4 *)p);
        w[0] = v.x, w[1] = v.y, w[2] = v.z, w[3] = v.w;
    }
}
__device__ __forceinline__ float dx_lo(uint32_t w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float dx_hi(uint32_t w) { return __uint_as_float(w & 0xffff0000u); }

/* Keys [j0, j1) of kv head kvh into s (q in qs, HD floats). Per chunk of KC keys: each
 * lane's key row (its score) and every key's value dims the lane owns are loaded
 * together, one round trip to the cache a chunk. False when a key's block lies outside
 * the pool. */
template <int HD>
__device__ bool dx_keys(const lm__cuda_attn_params &a, const lm__cuda_kv &kv, const int32_t *table, int kvh,
                        const float *qs, int64_t j0, int64_t j1, dx_soft<HD> &s) {
    typedef dx_attn_cfg<HD> cfg;
    constexpr int DPL = cfg::DPL, W = cfg::W, KC = cfg::KC, NCH = HD / 8, KB = NCH < 8 ? NCH : 8;
    const int lane = threadIdx.x & 31;
    const bool dl = lane * DPL < HD;
    const bf16 *K = (const bf16 *)kv.k, *V = (const bf16 *)kv.v;
    for (int64_t c0 = j0; c0 < j1; c0 += KC) {
        const int n = (int)LM_MIN((int64_t)KC, j1 - c0);
        const bool mine = lane < n;
        const int64_t row = mine ? dx_key_row(kv, table, kvh, c0 + lane) : -1;
        if (__any_sync(0xffffffffu, mine && row < 0)) return false;
        uint32_t vw[KC][W];
#pragma unroll
        for (int kk = 0; kk < KC; kk++) {
            const int64_t r = __shfl_sync(0xffffffffu, row, kk);
#pragma unroll
            for (int i = 0; i < W; i++) vw[kk][i] = 0u;
            if (kk < n && dl) dx_vload<DPL>(V + r * HD + lane * DPL, vw[kk]);
        }
        float sc = -INFINITY;
        if (mine) {
            const uint4 *kr = (const uint4 *)(K + row * HD);
            float d = 0.f;
#pragma unroll
            for (int cb = 0; cb < NCH; cb += KB) {
                uint4 raw[KB];
#pragma unroll
                for (int c = 0; c < KB; c++) raw[c] = __ldcg(kr + cb + c);
#pragma unroll
                for (int c = 0; c < KB; c++) {
                    const uint32_t u[4] = {raw[c].x, raw[c].y, raw[c].z, raw[c].w};
#pragma unroll
                    for (int i = 0; i < 4; i++)
                        d += dx_lo(u[i]) * qs[(cb + c) * 8 + 2 * i] + dx_hi(u[i]) * qs[(cb + c) * 8 + 2 * i + 1];
                }
            }
            sc = d * a.scale;
        }
        const float mn = fmaxf(s.m, warp_max(sc));
        const float e = mine ? __expf(sc - mn) : 0.f, f = __expf(s.m - mn);
        s.l = s.l * f + warp_sum(e);
        s.m = mn;
#pragma unroll
        for (int i = 0; i < DPL; i++) s.acc[i] *= f;
#pragma unroll
        for (int kk = 0; kk < KC; kk++) {
            const float ek = __shfl_sync(0xffffffffu, e, kk); /* 0 past n */
            if (DPL == 1) {
                s.acc[0] += ek * dx_lo(vw[kk][0]);
            } else {
#pragma unroll
                for (int i = 0; i < W; i++) s.acc[2 * i] += ek * dx_lo(vw[kk][i]), s.acc[2 * i + 1] += ek * dx_hi(vw[kk][i]);
            }
        }
    }
    return true;
}

/* Token tok's query head hq into qs (the warp's HD floats). */
template <int HD>
__device__ __forceinline__ void dx_load_q(const lm__cuda_attn_params &a, int64_t tok, int hq, float *qs) {
    const int lane = threadIdx.x & 31;
    const int64_t o = (tok * a.q_heads + hq) * HD;
    __syncwarp();
    for (int d = lane; d < HD; d += 32)
        qs[d] = a.q_bf16 ? __bfloat162float(__ldcg((const bf16 *)a.q + o + d)) : __ldcg((const float *)a.q + o + d);
    __syncwarp();
}

/* Row tok / T's table and the keys [lo, len) its token at tok sees; false for a bad
 * token (a position past the row, a slot outside the pool). */
__device__ __forceinline__ bool dx_token(const lm__cuda_attn_params &a, const lm__cuda_kv &kv, int64_t tok,
                                         const int32_t **table, int64_t *lo, int64_t *len) {
    *len = (int64_t)a.tok_pos[tok] + 1;
    *table = a.row_table + (tok / a.T) * kv.nb;
    *lo = a.window > 0 ? LM_MAX((int64_t)0, *len - a.window) : 0;
    if (kv.nb == 1) return (*table)[0] >= 0 && (*table)[0] < kv.blocks && *len >= 1 && *len <= kv.block_tokens;
    return *len >= 1 && *len <= kv.nb * kv.block_tokens;
}

/* The lane's dims of one output row: v[i] / den (NaN when !ok). */
template <int HD>
__device__ __forceinline__ void dx_store_row(const lm__cuda_attn_params &a, int64_t off, const float *v, float den,
                                             bool ok) {
    constexpr int DPL = dx_attn_cfg<HD>::DPL;
    const int lane = threadIdx.x & 31;
    if (lane * DPL >= HD) return;
#pragma unroll
    for (int i = 0; i < DPL; i++) {
        const float x = ok ? (den > 0.f ? v[i] / den : 0.f) : NAN;
        if (a.out_bf16) st((bf16 *)a.out + off + lane * DPL + i, x);
        else st((float *)a.out + off + lane * DPL + i, x);
    }
}

template <int HD>
__device__ void dx_attention(const lm__dx_op &op, const lm__dx_entry &e, float *smem, float *part) {
    constexpr int DPL = dx_attn_cfg<HD>::DPL;
    const lm__cuda_attn_params &a = op.u.at.a;
    const lm__cuda_kv &kv = op.u.at.kv;
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, Hq = a.q_heads, Hkv = kv.kv_heads, G = Hq / Hkv;
    const bool dl = lane * DPL < HD;
    const int64_t T = a.T, B = a.ntok / T;
    float *qs = smem + warp * HD;
    if (e.kind == LM__DX_COMBINE) { /* (row, token, query head of kv heads lo..hi) */
        const int64_t work = B * T * (e.hi - e.lo) * G;
        for (int64_t w = warp; w < work; w += DX_WARPS) {
            const int64_t bt = w / ((e.hi - e.lo) * G), hq = e.lo * G + w % ((e.hi - e.lo) * G);
            const int64_t b = bt / T, t = bt % T;
            const float *r0 = part + lm__dp_part_at(e.poff, T, Hq, e.nc, HD, b, t, hq, 0);
            const int64_t rs = HD + 2; /* one chunk's record */
            /* the chunks' maxima and sums, 32 chunks a pass across the lanes */
            float M = -INFINITY, L = 0.f, o[DPL];
            for (int c = lane; c < e.nc; c += 32) M = fmaxf(M, __ldcg(r0 + c * rs));
            M = warp_max(M);
#pragma unroll
            for (int i = 0; i < DPL; i++) o[i] = 0.f;
            for (int c0 = 0; c0 < e.nc && M > -INFINITY; c0 += 32) {
                const int c = c0 + lane;
                const float rm = c < e.nc ? __ldcg(r0 + c * rs) : -INFINITY;
                const float f = rm == -INFINITY ? 0.f : __expf(rm - M); /* chunks that saw no key weigh 0 */
                L += warp_sum(c < e.nc ? f * __ldcg(r0 + c * rs + 1) : 0.f);
                const int n = LM_MIN(32, e.nc - c0);
                for (int k0 = 0; k0 < n; k0 += 8) { /* 8 chunks' dims in flight */
                    float v[8][DPL], fk[8];
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        fk[u] = __shfl_sync(0xffffffffu, f, (k0 + u) & 31);
#pragma unroll
                        for (int i = 0; i < DPL; i++)
                            v[u][i] = k0 + u < n && dl ? __ldcg(r0 + (c0 + k0 + u) * rs + 2 + lane * DPL + i) : 0.f;
                    }
#pragma unroll
                    for (int u = 0; u < 8; u++)
#pragma unroll
                        for (int i = 0; i < DPL; i++) o[i] += k0 + u < n ? fk[u] * v[u][i] : 0.f;
                }
            }
            dx_store_row<HD>(a, ((b * T + t) * Hq + hq) * HD, o, L, true);
        }
        return;
    }
    /* ATTN: (unit, token, query head of the unit's kv head); PART: (row, token, query head) of kv head lo */
    const int64_t units = e.kind == LM__DX_ATTN ? e.hi - e.lo : B, work = units * T * G;
    for (int64_t w = warp; w < work; w += DX_WARPS) {
        const int64_t u = w / (T * G), t = (w / G) % T, g = w % G;
        const int64_t b = e.kind == LM__DX_ATTN ? (e.lo + u) / Hkv : u;
        const int kvh = e.kind == LM__DX_ATTN ? (int)((e.lo + u) % Hkv) : (int)e.lo, hq = kvh * G + (int)g;
        const int64_t tok = b * T + t;
        const int32_t *table;
        int64_t lo, len;
        bool ok = dx_token(a, kv, tok, &table, &lo, &len);
        dx_soft<HD> s;
        s.m = -INFINITY, s.l = 0.f;
#pragma unroll
        for (int i = 0; i < DPL; i++) s.acc[i] = 0.f;
        dx_load_q<HD>(a, tok, hq, qs);
        const int64_t j0 = e.kind == LM__DX_PART ? LM_MAX(lo, e.k0) : lo, j1 = e.kind == LM__DX_PART ? LM_MIN(len, e.k1) : len;
        if (ok) ok = dx_keys<HD>(a, kv, table, kvh, qs, j0, j1, s);
        if (e.kind == LM__DX_PART) {
            float *r = part + lm__dp_part_at(e.poff, T, Hq, e.nc, HD, b, t, hq, e.c);
            if (lane == 0) r[0] = ok ? s.m : NAN, r[1] = s.l;
            if (dl)
#pragma unroll
                for (int i = 0; i < DPL; i++) r[2 + lane * DPL + i] = s.acc[i];
        } else {
            dx_store_row<HD>(a, (tok * Hq + hq) * HD, s.acc, s.l, ok);
        }
    }
}

/* ---- the GEMV pieces ------------------------------------------------------------------------ */

template <int F, int M, typename Wait>
__device__ __forceinline__ void dx_gemv(const lm__dx_op &op, int64_t g0, int64_t g1, Wait wait, float4 *xs) {
    constexpr int RN = LM__CUDA_GEMV_RMSNORM, PL = LM__CUDA_GEMV_PLAIN, SW = LM__CUDA_GEMV_SWIGLU;
    constexpr int FR = LM__CUDA_GEMV_EPI_FRONT, SE = LM__CUDA_GEMV_EPI_SWIGLU, OUT = LM__CUDA_GEMV_EPI_OUT;
    const lm__cuda_gemv_params &p = op.u.g;
    switch (op.form * 2 + (op.ksplit > 1)) {
    case 0: gemv_body<F, RN, M, 1, 1, 0, FR>(p, g0, g1, 0, 1, wait, xs); break;
    case 1: gemv_body<F, RN, M, WARPS, 1, 0, FR>(p, g0, g1, 0, 1, wait, xs); break;
    case 2: gemv_body<F, RN, M, 1, 1, 0, SE>(p, g0, g1, 0, 1, wait, xs); break;
    case 3: gemv_body<F, RN, M, WARPS, 1, 0, SE>(p, g0, g1, 0, 1, wait, xs); break;
    case 4: gemv_body<F, RN, M, 1, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    case 5: gemv_body<F, RN, M, WARPS, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    case 6: gemv_body<F, PL, M, 1, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    case 7: gemv_body<F, PL, M, WARPS, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    case 8: gemv_body<F, SW, M, 1, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    default: gemv_body<F, SW, M, WARPS, 1, 0, OUT>(p, g0, g1, 0, 1, wait, xs); break;
    }
}

/* ---- the kernel ------------------------------------------------------------------------------ */

#define DX_RW ((int)(sizeof(lm__dx_op) / 4))
#define DX_EW ((int)(sizeof(lm__dx_entry) / 4))
static_assert(sizeof(lm__dx_op) % 4 == 0 && DX_RW <= DX_THREADS, "an op record is loaded a word a thread");
static_assert(sizeof(lm__dx_entry) % 4 == 0 && DX_EW <= DX_THREADS, "an entry is loaded a word a thread");

/* One block (SM list) an SM: two lists an SM (128 registers a thread, state spilled
 * around the bodies) measured slower (bench/NOTES.md, "Decode schedules v2"). */
template <int F, int M>
__global__ void __launch_bounds__(DX_THREADS, 1) dx_kernel(dx_args a) {
    extern __shared__ float4 dx_xs[];
    __shared__ __align__(16) lm__dx_op rec;
    __shared__ __align__(16) lm__dx_entry es[2];
    __shared__ int bail;
    const int t = threadIdx.x;
    const int64_t k0 = a.sm_begin[blockIdx.x], k1 = a.sm_begin[blockIdx.x + 1];
    if (k0 >= k1) return;
    if (t < DX_EW) {
        ((uint32_t *)&es[0])[t] = ((const uint32_t *)(a.ent + k0))[t];
        ((uint32_t *)&es[1])[t] = ((const uint32_t *)(a.ent + LM_MIN(k0 + 1, k1 - 1)))[t];
    }
    if (t == 0) bail = 0;
    __syncthreads();
    if (t < DX_RW) ((uint32_t *)&rec)[t] = ((const uint32_t *)(a.ops + es[0].op))[t];
    int32_t w_cur = t < es[0].nwait ? a.waits[es[0].wait0 + t] : 0;
    __syncthreads();
    for (int64_t k = k0; k < k1; k++) {
        const int cs = (int)((k - k0) & 1);
        const lm__dx_entry &cur = es[cs], &nx = es[cs ^ 1];
        const bool more = k + 1 < k1;
        /* for the items after this one, landing while it runs */
        const uint32_t ew = t < DX_EW ? ((const uint32_t *)(a.ent + LM_MIN(k + 2, k1 - 1)))[t] : 0u;
        const uint32_t rw = more && t < DX_RW ? ((const uint32_t *)(a.ops + nx.op))[t] : 0u;
        const int32_t w_nx = more && t < nx.nwait ? a.waits[nx.wait0 + t] : 0;
        const int32_t item = cur.item, nwait = cur.nwait;
        const uint32_t rel = cur.rel;
        const int32_t counter = cur.counter;
        const int64_t wait0 = cur.wait0;
        auto wait = [&]() {
            const long long c0 = clock64();
            for (int d = t; d < nwait; d += DX_THREADS) {
                const int32_t w = d == t ? w_cur : a.waits[wait0 + d];
                const unsigned *f = w >= 0 ? a.flags + w : a.counters + (-w - 1);
                const unsigned want = w >= 0 ? a.epoch : a.epoch * (unsigned)a.counts[-w - 1];
                /* counters only grow; a flag holds the last epoch that released it; another
                 * block's failure is looked for every 64 polls (a poll is one L2 round trip) */
                for (unsigned polls = 1;
                     w >= 0 ? lm__dp_ld_acquire(f) != want : (int)(lm__dp_ld_acquire(f) - want) < 0; polls++) {
                    if ((polls & 63) == 0 && *(volatile unsigned *)a.err) {
                        bail = 1;
                        break;
                    }
                    if (clock64() - c0 > (1LL << 32)) {
                        atomicCAS(a.err, 0u, (unsigned)item + 1u);
                        bail = 1;
                        break;
                    }
                }
            }
            __syncthreads();
            if (a.stamps && t == 0) a.stamps[3 * k + 1] = clock64();
        };
        if (a.stamps && t == 0) a.stamps[3 * k] = clock64();
        switch (cur.kind) {
        case LM__DX_GEMV: dx_gemv<F, M>(rec, cur.lo, cur.hi, wait, dx_xs); break;
        default: {
            wait();
            if (bail) break;
            switch (rec.u.at.kv.head_dim) { /* the builder admits these */
            case 16: dx_attention<16>(rec, cur, (float *)dx_xs, a.part); break;
            case 32: dx_attention<32>(rec, cur, (float *)dx_xs, a.part); break;
            case 64: dx_attention<64>(rec, cur, (float *)dx_xs, a.part); break;
            case 128: dx_attention<128>(rec, cur, (float *)dx_xs, a.part); break;
            default: dx_attention<256>(rec, cur, (float *)dx_xs, a.part); break;
            }
            break;
        }
        }
        __syncthreads();
        if (bail) return;
        if (t == 0) { /* the barrier orders the block's writes before thread 0's release (cumulativity) */
            if (a.stamps) a.stamps[3 * k + 2] = clock64();
            if (rel & 1u) lm__dp_st_release(a.flags + item, a.epoch);
            if (rel & 2u) lm__dp_add_release(a.counters + counter, 1u);
        }
        if (t < DX_EW) ((uint32_t *)&es[cs])[t] = ew; /* entry k + 2 where entry k was */
        if (more && t < DX_RW) ((uint32_t *)&rec)[t] = rw;
        w_cur = w_nx;
        __syncthreads();
    }
}

/* ---- the launcher ---------------------------------------------------------------------------- */

struct lm__dx {
    int device, sms;
    int64_t nent;
    size_t smem;
    void (*kernel)(dx_args);
    dx_args args;
    void *mem; /* one allocation holding every table */
    unsigned epoch;
};

extern "C" size_t lm__dx_gemv_smem(int64_t K, int M) { return (size_t)M * (size_t)smx_row_chunks(K) * 16; }

static size_t dx_align(size_t n) { return (n + 255) / 256 * 256; }

extern "C" lm_status lm__dx_create(const lm__dx_tables *t, lm__dx **out) {
    *out = NULL;
    int prev = 0, sm_count = 0, coop = 0, per_sm = 0;
    cudaGetDevice(&prev);
    lm_status st = LM_OK;
    lm__dx *x = (lm__dx *)calloc(1, sizeof *x);
    if (!x) return lm__error(LM_OUT_OF_MEMORY, "decode plan (cuda): its launch record");
    x->device = t->device, x->sms = t->sms, x->smem = t->smem, x->nent = t->nent;
    if (t->wf == LM__CUDA_GEMV_BF16 && t->rows == 1) x->kernel = dx_kernel<LM__CUDA_GEMV_BF16, 1>;
    else if (t->wf == LM__CUDA_GEMV_BF16 && t->rows == 2) x->kernel = dx_kernel<LM__CUDA_GEMV_BF16, 2>;
    else {
        free(x);
        return lm__error(LM_UNSUPPORTED, "decode plan (cuda): the persistent kernel is built for bf16 weights and 1 or "
                         "2 rows (weight format %d, %d rows)", t->wf, t->rows);
    }
    const size_t sizes[7] = {sizeof(int64_t) * (size_t)(t->sms + 1), sizeof(lm__dx_entry) * (size_t)t->nent,
                             sizeof(int32_t) * (size_t)t->nwaits,     sizeof(lm__dx_op) * (size_t)t->nops,
                             sizeof(int32_t) * (size_t)t->ncounters,  sizeof(unsigned) * (size_t)(t->nitems + t->ncounters + 1),
                             0};
    const void *src[5] = {t->sm_begin, t->ent, t->waits, t->ops, t->counts};
    size_t off[7], total = 0;
    for (int i = 0; i < 6; i++) off[i] = total, total += dx_align(sizes[i] ? sizes[i] : 1);
    cudaError_t e = cudaSetDevice(t->device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, t->device);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, t->device);
    if (e == cudaSuccess) e = cudaFuncSetAttribute((const void *)x->kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                                   (int)t->smem);
    if (e == cudaSuccess)
        e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, (const void *)x->kernel, DX_THREADS, t->smem);
    if (e != cudaSuccess) {
        st = lm__cuda_check((int)e, "decode plan (cuda): device attributes");
        goto fail;
    }
    if (!coop || per_sm < 1 || t->sms > sm_count * per_sm) {
        st = lm__error(LM_UNSUPPORTED, "decode plan (cuda): %d SM lists on a device of %d SMs holding %d blocks each "
                       "with %zu bytes of shared memory (cooperative launch %s): every list needs a resident block",
                       t->sms, sm_count, per_sm, t->smem, coop ? "yes" : "no");
        goto fail;
    }
    e = cudaMalloc(&x->mem, total);
    for (int i = 0; e == cudaSuccess && i < 5; i++)
        if (sizes[i]) e = cudaMemcpy((char *)x->mem + off[i], src[i], sizes[i], cudaMemcpyHostToDevice);
    if (e == cudaSuccess) e = cudaMemset((char *)x->mem + off[5], 0, sizes[5]);
    if (e == cudaSuccess) e = cudaDeviceSynchronize();
    if (e != cudaSuccess) {
        st = lm__cuda_check((int)e, "decode plan (cuda): its tables");
        goto fail;
    }
    {
        char *m = (char *)x->mem;
        unsigned *flags = (unsigned *)(m + off[5]);
        x->args.sm_begin = (const int64_t *)(m + off[0]);
        x->args.ent = (const lm__dx_entry *)(m + off[1]);
        x->args.waits = (const int32_t *)(m + off[2]);
        x->args.ops = (const lm__dx_op *)(m + off[3]);
        x->args.counts = (const int32_t *)(m + off[4]);
        x->args.flags = flags, x->args.counters = flags + t->nitems, x->args.err = flags + t->nitems + t->ncounters;
        x->args.part = t->part;
    }
    cudaSetDevice(prev);
    *out = x;
    return LM_OK;
fail:
    if (x->mem) cudaFree(x->mem);
    free(x);
    cudaSetDevice(prev);
    return st;
}

extern "C" void lm__dx_destroy(lm__dx *x) {
    if (!x) return;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(x->device);
    cudaFree(x->mem);
    cudaFree(x->args.stamps);
    cudaSetDevice(prev);
    free(x);
}

extern "C" lm_status lm__dx_launch(lm__dx *x, cudaStream_t s) {
    x->args.epoch = ++x->epoch;
    void *args[] = {&x->args};
    cudaError_t e = cudaLaunchCooperativeKernel((const void *)x->kernel, dim3((unsigned)x->sms), dim3(DX_THREADS), args,
                                                x->smem, s);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "decode plan (cuda): launch");
    return LM_OK;
}

extern "C" lm_status lm__dx_status(lm__dx *x) {
    unsigned err = 0;
    cudaError_t e = cudaMemcpy(&err, x->args.err, sizeof err, cudaMemcpyDeviceToHost);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "decode plan (cuda): its status");
    if (!err) return LM_OK;
    const unsigned zero = 0;
    cudaMemcpy(x->args.err, &zero, sizeof zero, cudaMemcpyHostToDevice);
    return lm__error(LM_INTERNAL, "decode plan (cuda): item %u waited more than 2^32 cycles for a dependency", err - 1u);
}

extern "C" lm_status lm__dx_profile(lm__dx *x, int on) {
    if (!on) {
        cudaFree(x->args.stamps);
        x->args.stamps = NULL;
        return LM_OK;
    }
    if (x->args.stamps) return LM_OK;
    int prev = 0;
    cudaGetDevice(&prev);
    cudaSetDevice(x->device);
    cudaError_t e = cudaMalloc((void **)&x->args.stamps, sizeof(long long) * 3 * (size_t)(x->nent > 0 ? x->nent : 1));
    cudaSetDevice(prev);
    if (e != cudaSuccess) {
        x->args.stamps = NULL;
        return lm__cuda_check((int)e, "decode plan (cuda): profile stamps");
    }
    return LM_OK;
}

extern "C" lm_status lm__dx_stamps(lm__dx *x, long long *out, double *khz) {
    int clock = 0;
    cudaError_t e = cudaMemcpy(out, x->args.stamps, sizeof(long long) * 3 * (size_t)x->nent, cudaMemcpyDeviceToHost);
    if (e == cudaSuccess) e = cudaDeviceGetAttribute(&clock, cudaDevAttrClockRate, x->device);
    if (e != cudaSuccess) return lm__cuda_check((int)e, "decode plan (cuda): profile stamps");
    *khz = clock;
    return LM_OK;
}
