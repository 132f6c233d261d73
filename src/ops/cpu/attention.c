/* ops/cpu/attention.c — driver of the tuned CPU attention (see attention.h): plans the
 * tasks, owns the one workspace allocation and merges split-key partial results.
 *
 * A unit is (batch b, kv head g, block of bq query positions): its rows are the G =
 * Hq / Hkv query heads of g times the bq positions, so every K/V block is read once
 * per group. When there are fewer units than MIN_TASKS (decode, few kv heads) and
 * many keys, each unit's key range is also split into nsplit chunks; every split
 * task leaves (m, l, acc) per row and the last one to finish merges them. The plan
 * depends on shapes and instruction set only, never on the thread count.
 * Complexity: O(B * Hq * Tq * Tk * (D + Dv)) flops, workspace O(threads * rows *
 * (D + bk + Dv)) floats plus O(units * nsplit * rows * Dv) for split partials.
 */
#include "ops/cpu/attention.h"

#include "ops/cpu/attention_kernels.h"
#include "ops/cpu/precision.h"

#include <stdatomic.h>

#define MIN_TASKS 16    /* units below this get their keys split (when there are enough keys) */
#define SPLIT_KEYS 256  /* fewest keys per split: less would make merging cost more than it spreads */
/* Calls below this many multiply-adds (~10-20 us) run on the calling thread: waking
 * the pool costs about as much (measured ~25 us on a 2-core VM). */
#define SERIAL_MACS 1e6
#define LOG2E 1.4426950408889634

typedef struct attn_job {
    const lm__attn_kernels *kern;
    const lm__attn_fast_kernels *fast; /* fast precision, row lanes: scores and pv on bf16 pairs */
    const float *q, *k, *v; /* [B, Hq, Tq, D], [B, Hkv, Tk, D], [B, Hkv, Tk, Dv] at strides qs, ks, vs */
    float *out;             /* [B, Hq, Tq, Dv] at strides os */
    int64_t qs[3], ks[3], vs[3], os[3]; /* element strides of the batch, head and position dims */
    int64_t Hkv, G, Tq, Tk, D, Dv;
    int64_t D2; /* fast: pairs of d, ceil(D / 2) */
    /* fast without a window: every kv head's keys and values as bf16 pairs, converted once
     * per call (split over the threads) for all the query blocks that read them: k2all
     * [bh][Tk][D2], v2all [bh][Tk2][Dv] (pairs of keys 2i, 2i + 1; Tk2 = ceil(Tk / 2)).
     * NULL: each task packs its blocks (a window can start a block at an odd key). */
    uint32_t *k2all, *v2all;
    int64_t Tk2;
    int64_t bh; /* B * Hkv: (b, g) pairs */
    int64_t off; /* causal: row i sees keys j <= i + off, off = Tk - Tq */
    int causal;
    int64_t window; /* > 0: row i also sees only keys j > i + off - window (then bq = 1) */
    float qscale; /* scale * log2(e): scores come out in log2 units */
    int64_t bq, nqb;         /* query positions per unit, units per (b, g) */
    int64_t rows_max, rp_max; /* G * bq, rounded up to the kernel lanes */
    int keylanes;            /* score layout (attention_kernels.h): 1 key lanes, 0 row lanes */
    int64_t ldq;             /* key lanes: row stride of the packed queries, D rounded up to 16 */
    int64_t lda;             /* row stride of acc: Dv rounded up to 16 */
    int64_t nsplit, chunk;   /* key splits per unit and keys per split (a multiple of bk) */
    size_t worker_floats, part_floats; /* per-worker scratch, per (unit, split) partial */
    float *work;             /* [workers][worker_floats] */
    float *part;             /* [units][nsplit][part_floats]: m [rows_max], l [rows_max], acc [rows_max][lda] */
    atomic_int *pending;     /* [units]: split tasks not yet finished */
} attn_job;

/* One worker's scratch, carved from job->work. */
typedef struct attn_scratch {
    float *qt;     /* row lanes [D][rp], key lanes [rows][ldq]: queries times qscale */
    float *st;     /* row lanes [bk][rp], key lanes [rows][bk]: scores, then probabilities */
    float *acc;    /* [rows][lda]: unnormalised output rows */
    float *m, *l;  /* [rp]: running max (log2 units) and sum of 2^(s - m) */
    float *alpha;  /* [rp]: rescale of acc for the current block */
    int32_t *last; /* [rp]: last visible key of each row within the current block */
    /* fast: the block's keys [bk][D2], values [bk / 2][Dv] and probabilities [bk / 2][rp]
     * as bf16 pairs (attention_kernels.h); the queries as pairs in qt, [D2][rp] */
    uint32_t *k2, *v2, *p2;
} attn_scratch;

static int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
static int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
/* Region sizes are whole 64-byte lines so every region stays aligned. */
static size_t line_floats(int64_t n) { return (size_t)round_up(n, 16); }

static const lm__attn_kernels *kernels_for(lm__cpu_isa isa) {
#ifdef LM__HAVE_X86_KERNELS
    if (isa == LM__CPU_ISA_AVX512) return &lm__attn_kernels_avx512;
    if (isa == LM__CPU_ISA_AVX2) return &lm__attn_kernels_avx2;
#else
    (void)isa;
#endif
    return &lm__attn_kernels_scalar;
}

static attn_scratch scratch_of(const attn_job *j, int worker) {
    attn_scratch s;
    float *p = j->work + (size_t)worker * j->worker_floats;
    s.qt = p, p += line_floats(LM_MAX(j->D * j->rp_max, j->rows_max * j->ldq));
    s.st = p, p += line_floats(j->kern->bk * j->rp_max);
    s.acc = p, p += line_floats(j->rows_max * j->lda);
    s.m = p, p += line_floats(j->rp_max);
    s.l = p, p += line_floats(j->rp_max);
    s.alpha = p, p += line_floats(j->rp_max);
    s.last = (int32_t *)p, p += line_floats(j->rp_max);
    s.k2 = s.v2 = s.p2 = NULL;
    if (j->fast) {
        const int64_t bk2 = (j->kern->bk + 1) / 2;
        s.k2 = (uint32_t *)p, p += line_floats(j->kern->bk * j->D2);
        s.v2 = (uint32_t *)p, p += line_floats(bk2 * j->Dv);
        s.p2 = (uint32_t *)p;
    }
    return s;
}

/* Row r of a unit is query head g * G + r / nq at position i0 + r % nq. Packs
 * qscale * q[b, that head, that position, d] at qt[d * rp + r] (row lanes; rows past
 * `rows` are 0) or qt[r * ldq + d] (key lanes). */
static void pack_queries(const attn_job *j, int64_t b, int64_t g, int64_t i0, int64_t nq, int64_t rp, float *qt) {
    int64_t rows = j->G * nq;
    if (j->fast) { /* pairs along d, rounded to bf16 (nearest even): qt2 [D2][rp], 0 past D and rows */
        uint32_t *qt2 = (uint32_t *)qt;
        for (int64_t r = 0; r < rp; r++) {
            if (r < rows)
                j->fast->pack_q(j->q + b * j->qs[0] + (g * j->G + r / nq) * j->qs[1] + (i0 + r % nq) * j->qs[2], j->D,
                                j->qscale, qt2 + r, rp);
            else
                for (int64_t i = 0; i < j->D2; i++) qt2[i * rp + r] = 0u;
        }
        return;
    }
    int64_t rs = j->keylanes ? j->ldq : 1, ds = j->keylanes ? 1 : rp; /* strides of r and d in qt */
    for (int64_t r = 0; r < rp; r++) {
        if (r >= rows) {
            for (int64_t d = 0; d < j->D; d++) qt[r * rs + d * ds] = 0.0f;
            continue;
        }
        const float *qr = j->q + b * j->qs[0] + (g * j->G + r / nq) * j->qs[1] + (i0 + r % nq) * j->qs[2];
        for (int64_t d = 0; d < j->D; d++) qt[r * rs + d * ds] = qr[d] * j->qscale;
    }
}

/* Streams keys [k0, k1) of kv head (b, g) through the online softmax into s->acc. */
static void attend_keys(const attn_job *j, const attn_scratch *s, int64_t b, int64_t g, int64_t i0, int64_t nq,
                        int64_t rp, int64_t k0, int64_t k1) {
    const lm__attn_kernels *kn = j->kern;
    int64_t rows = j->G * nq;
    const float *kb = j->k + b * j->ks[0] + g * j->ks[1], *vb = j->v + b * j->vs[0] + g * j->vs[1];
    for (int64_t j0 = k0; j0 < k1; j0 += kn->bk) {
        int64_t nk = LM_MIN(kn->bk, k1 - j0);
        const float *kj = kb + j0 * j->ks[2], *vj = vb + j0 * j->vs[2];
        const uint32_t *k2 = NULL, *v2 = NULL;
        if (j->fast) {
            if (j->k2all) {
                k2 = j->k2all + ((b * j->Hkv + g) * j->Tk + j0) * j->D2;
                v2 = j->v2all + ((b * j->Hkv + g) * j->Tk2 + j0 / 2) * j->Dv; /* j0 is a multiple of bk: even */
            } else {
                j->fast->pack_k(kj, j->ks[2], nk, j->D, s->k2);
                k2 = s->k2;
            }
            j->fast->scores((const uint32_t *)s->qt, rp, j->D2, k2, nk, s->st);
        } else if (j->keylanes) {
            kn->scores_kl(s->qt, j->ldq, rows, j->D, kj, j->ks[2], nk, s->st, kn->bk);
        } else {
            kn->scores_rl(s->qt, rp, j->D, kj, j->ks[2], nk, s->st);
        }
        /* The first query of the block has the fewest visible keys: mask only when it
         * cannot see the whole block (the diagonal blocks of causal attention). */
        int need_mask = j->causal && j0 + nk - 1 > i0 + j->off;
        if (need_mask)
            for (int64_t r = 0; r < rp; r++) {
                int64_t lim = r < rows ? i0 + r % nq + j->off - j0 : nk;
                s->last[r] = (int32_t)LM_MAX(-1, LM_MIN(nk, lim));
            }
        const int32_t *last = need_mask ? s->last : NULL;
        if (j->keylanes) {
            kn->softmax_kl(s->st, kn->bk, rows, nk, last, s->m, s->l, s->alpha);
            kn->pv(s->st, kn->bk, 1, rows, nk, vj, j->vs[2], j->Dv, s->alpha, s->acc, j->lda);
        } else if (j->fast) {
            kn->softmax_rl(s->st, rp, nk, last, s->m, s->l, s->alpha);
            /* an odd nk's last pair is p 0 against values 0: packed here, so that a key past
             * the block (a later position's values, perhaps past bf16's range) never
             * meets it as 0 x inf */
            if (!v2 || (nk & 1)) {
                j->fast->pack_v(vj, j->vs[2], nk, j->Dv, s->v2);
                v2 = s->v2;
            }
            j->fast->pack_p(s->st, rp, nk, s->p2);
            j->fast->pv(s->p2, rp, rows, (nk + 1) / 2, v2, j->Dv, s->alpha, s->acc, j->lda);
        } else {
            kn->softmax_rl(s->st, rp, nk, last, s->m, s->l, s->alpha);
            kn->pv(s->st, 1, rp, rows, nk, vj, j->vs[2], j->Dv, s->alpha, s->acc, j->lda);
        }
    }
}

/* out row of (b, query head h, position i). */
static float *out_row(const attn_job *j, int64_t b, int64_t h, int64_t i) {
    return j->out + b * j->os[0] + h * j->os[1] + i * j->os[2];
}

/* out = acc / l for every row of the unit. */
static void finish_rows(const attn_job *j, const attn_scratch *s, int64_t b, int64_t g, int64_t i0, int64_t nq) {
    for (int64_t r = 0; r < j->G * nq; r++) {
        float *o = out_row(j, b, g * j->G + r / nq, i0 + r % nq);
        const float *a = s->acc + r * j->lda;
        float inv = 1.0f / s->l[r];
        for (int64_t e = 0; e < j->Dv; e++) o[e] = a[e] * inv;
    }
}

/* Combines the nsplit partials of a unit: out = sum_s w_s acc_s / sum_s w_s l_s with
 * w_s = 2^(m_s - max m). A split whose keys were all masked has m = -inf, w = 0. */
static void merge_unit(const attn_job *j, int64_t unit, int64_t b, int64_t g, int64_t i0, int64_t nq) {
    const float *base = j->part + (size_t)unit * (size_t)j->nsplit * j->part_floats;
    for (int64_t r = 0; r < j->G * nq; r++) {
        float mx = -INFINITY;
        for (int64_t sp = 0; sp < j->nsplit; sp++) mx = fmaxf(mx, base[sp * j->part_floats + r]);
        float *o = out_row(j, b, g * j->G + r / nq, i0 + r % nq);
        double lsum = 0.0;
        for (int64_t e = 0; e < j->Dv; e++) o[e] = 0.0f;
        for (int64_t sp = 0; sp < j->nsplit; sp++) {
            const float *p = base + sp * j->part_floats;
            float ms = p[r];
            if (ms == -INFINITY) continue;
            float w = exp2f(ms - mx);
            const float *a = p + 2 * j->rows_max + r * j->lda;
            lsum += (double)w * p[j->rows_max + r];
            for (int64_t e = 0; e < j->Dv; e++) o[e] += w * a[e];
        }
        float inv = (float)(1.0 / lsum);
        for (int64_t e = 0; e < j->Dv; e++) o[e] *= inv;
    }
}

/* Conversion task of the fast path's shared keys and values: (b, g) pair task / nc, keys
 * [c * CONV_KEYS, ...) with c = task % nc. */
#define CONV_KEYS 256
static void convert_task(void *arg, int64_t task, int worker) {
    (void)worker;
    const attn_job *j = arg;
    const int64_t nc = ceil_div(j->Tk, CONV_KEYS), bg = task / nc, j0 = task % nc * CONV_KEYS;
    const int64_t b = bg / j->Hkv, g = bg % j->Hkv, nk = LM_MIN(CONV_KEYS, j->Tk - j0);
    const float *kb = j->k + b * j->ks[0] + g * j->ks[1] + j0 * j->ks[2];
    const float *vb = j->v + b * j->vs[0] + g * j->vs[1] + j0 * j->vs[2];
    j->fast->pack_k(kb, j->ks[2], nk, j->D, j->k2all + (bg * j->Tk + j0) * j->D2);
    j->fast->pack_v(vb, j->vs[2], nk, j->Dv, j->v2all + (bg * j->Tk2 + j0 / 2) * j->Dv);
}

static void attn_task(void *arg, int64_t task, int worker) {
    const attn_job *j = arg;
    /* task = (bg * nqb + qbr) * nsplit + sp with query block nqb - 1 - qbr: tasks in
     * flight share one kv head (its K/V stay in cache), and within a head the heaviest
     * blocks (causal rows near the end see the most keys) start first. */
    int64_t sp = task % j->nsplit, qb = j->nqb - 1 - task / j->nsplit % j->nqb, bg = task / (j->nsplit * j->nqb);
    int64_t b = bg / j->Hkv, g = bg % j->Hkv, unit = bg * j->nqb + qb;
    int64_t i0 = qb * j->bq, nq = LM_MIN(j->bq, j->Tq - i0), rows = j->G * nq;
    int64_t rp = j->keylanes ? rows : round_up(rows, j->kern->lanes); /* rows the kernels touch */
    attn_scratch s = scratch_of(j, worker);
    pack_queries(j, b, g, i0, nq, rp, s.qt);
    for (int64_t r = 0; r < rp; r++) s.m[r] = -INFINITY, s.l[r] = 0.0f;
    memset(s.acc, 0, (size_t)(rows * j->lda) * sizeof(float));
    int64_t k0 = sp * j->chunk, k1 = LM_MIN(j->Tk, k0 + j->chunk);
    if (j->causal) k1 = LM_MIN(k1, i0 + nq + j->off); /* the block's last query sees keys < i0 + nq + off */
    if (j->window > 0) k0 = LM_MAX(k0, i0 + j->off - j->window + 1); /* one query per unit: its window */
    attend_keys(j, &s, b, g, i0, nq, rp, k0, k1);
    if (j->nsplit == 1) {
        finish_rows(j, &s, b, g, i0, nq);
        return;
    }
    float *p = j->part + ((size_t)unit * (size_t)j->nsplit + (size_t)sp) * j->part_floats;
    memcpy(p, s.m, (size_t)rows * sizeof(float));
    memcpy(p + j->rows_max, s.l, (size_t)rows * sizeof(float));
    memcpy(p + 2 * j->rows_max, s.acc, (size_t)(rows * j->lda) * sizeof(float));
    /* acq_rel: the last split to finish sees every other split's partial. */
    if (atomic_fetch_sub_explicit(&j->pending[unit], 1, memory_order_acq_rel) == 1) merge_unit(j, unit, b, g, i0, nq);
}

/* Chooses the query block, the key splits and the scratch sizes from the shapes; fast:
 * the thread runs fast precision and the bf16 kernels can run (row-lane tasks then take
 * them; key lanes, decode's few rows, stay f32). */
static void plan(attn_job *j, int64_t B, int fast) {
    const lm__attn_kernels *kn = j->kern;
    j->bq = LM_MIN(j->Tq, LM_MAX(1, kn->rows_max / j->G));
    /* A window that hides keys gives every query its own first key; one query position
     * per unit keeps the key range of all its rows equal (the kernels mask only the
     * causal end). Decode (Tq = 1) loses nothing; windowed prefill runs G-row tasks. */
    if (j->window > 0 && j->Tk > j->window) j->bq = 1;
    j->nqb = ceil_div(j->Tq, j->bq);
    j->bq = ceil_div(j->Tq, j->nqb); /* even blocks: 10 queries as 5 + 5, not 9 + 1 */
    j->rows_max = j->G * j->bq;
    j->rp_max = round_up(j->rows_max, kn->lanes);
    j->keylanes = j->rows_max <= kn->kl_rows_max;
#ifdef LM__HAVE_X86_KERNELS
    j->fast = fast && !j->keylanes ? &lm__attn_fast_kernels_avx512bf16 : NULL;
#else
    (void)fast;
#endif
    j->D2 = (j->D + 1) / 2;
    j->ldq = round_up(j->D, 16);
    j->lda = round_up(j->Dv, 16);
    j->bh = B * j->Hkv;
    int64_t units = j->bh * j->nqb;
    j->nsplit = 1;
    j->chunk = j->Tk;
    if (units < MIN_TASKS && j->Tk > SPLIT_KEYS) {
        int64_t want = LM_MIN(ceil_div(j->Tk, SPLIT_KEYS), ceil_div(MIN_TASKS, units));
        j->chunk = round_up(ceil_div(j->Tk, want), kn->bk);
        j->nsplit = ceil_div(j->Tk, j->chunk);
    }
    j->worker_floats = line_floats(LM_MAX(j->D * j->rp_max, j->rows_max * j->ldq)) +
                       line_floats(kn->bk * j->rp_max) + line_floats(j->rows_max * j->lda) +
                       4 * line_floats(j->rp_max); /* qt, st, acc; m, l, alpha, last */
    if (j->fast) /* k2, v2, p2 */
        j->worker_floats += line_floats(kn->bk * j->D2) + line_floats((kn->bk + 1) / 2 * j->Dv) +
                            line_floats((kn->bk + 1) / 2 * j->rp_max);
    j->part_floats = j->nsplit > 1 ? line_floats(j->rows_max * (2 + j->lda)) : 0;
}

int lm__cpu_attention_supported(const lm_tensor_view *q, const lm_tensor_view *k, const lm_tensor_view *v,
                                const lm_tensor_view *out, char *why, size_t n) {
    const lm_tensor_view *vs[4] = {q, k, v, out};
    static const char *const names[4] = {"q", "k", "v", "out"};
    char tmp[128];
    for (int i = 0; i < 4; i++) {
        const lm_tensor_view *t = vs[i];
        if (!t || t->ndim != 4) snprintf(tmp, sizeof tmp, "%s is %s", names[i], t ? "not 4-d" : "NULL");
        else if (t->device.type != LM_DEVICE_CPU) snprintf(tmp, sizeof tmp, "%s is not on the CPU", names[i]);
        else if (t->dtype != LM_F32) snprintf(tmp, sizeof tmp, "%s is %s, not f32", names[i], lm_dtype_name(t->dtype));
        else if (t->shape[3] > 1 && t->stride[3] != 1)
            snprintf(tmp, sizeof tmp, "%s has stride %lld along its last dim, not 1", names[i],
                     (long long)t->stride[3]);
        else continue;
        if (why && n) snprintf(why, n, "the tuned CPU kernel needs f32 views with unit last-dim stride: %s", tmp);
        return 0;
    }
    return 1;
}

static void write_zeros(const lm_tensor_view *out) {
    for (int64_t b = 0; b < out->shape[0]; b++)
        for (int64_t h = 0; h < out->shape[1]; h++)
            for (int64_t i = 0; i < out->shape[2]; i++) {
                float *o = (float *)out->data + b * out->stride[0] + h * out->stride[1] + i * out->stride[2];
                for (int64_t e = 0; e < out->shape[3]; e++) o[e] = 0.0f;
            }
}

lm_status lm__cpu_attention(lm_threadpool *pool, const lm_tensor_view *q, const lm_tensor_view *k,
                            const lm_tensor_view *v, float scale, int causal, int64_t window,
                            const lm_tensor_view *out) {
    char why[256];
    if (!lm__cpu_attention_supported(q, k, v, out, why, sizeof why))
        return lm__error(LM_UNSUPPORTED, "cpu attention: %s", why);
    if (lm_tensor_view_numel(out) == 0) return LM_OK;
    if (k->shape[2] == 0) { /* an empty softmax: every row is 0, as in the reference */
        write_zeros(out);
        return LM_OK;
    }
    attn_job j = {.kern = kernels_for(lm__cpu_isa_active()), .q = q->data, .k = k->data, .v = v->data,
                  .out = out->data, .Hkv = k->shape[1], .Tq = q->shape[2], .Tk = k->shape[2], .D = q->shape[3],
                  .Dv = v->shape[3], .causal = causal, .window = window, .qscale = (float)((double)scale * LOG2E)};
    j.G = q->shape[1] / j.Hkv;
    j.off = j.Tk - j.Tq;
    for (int d = 0; d < 3; d++)
        j.qs[d] = q->stride[d], j.ks[d] = k->stride[d], j.vs[d] = v->stride[d], j.os[d] = out->stride[d];
    plan(&j, q->shape[0], lm__cpu_precision() == LM_PRECISION_FAST && lm__cpu_bf16dot_runs());
    int64_t units = j.bh * j.nqb, tasks = units * j.nsplit;
    double macs = (double)q->shape[0] * (double)q->shape[1] * (double)j.Tq * (double)j.Tk * (double)(j.D + j.Dv);
    if (tasks == 1 || macs < SERIAL_MACS) pool = NULL; /* same tasks, same results, no wake-up */
    size_t workers = (size_t)lm_threadpool_size(pool);
    size_t parts = j.nsplit > 1 ? (size_t)units * (size_t)j.nsplit * j.part_floats : 0;
    size_t counters = j.nsplit > 1 ? (size_t)units : 0;
    size_t bytes = (workers * j.worker_floats + parts) * sizeof(float) + counters * sizeof(atomic_int);
    j.work = lm__alloc(bytes, 64);
    if (!j.work)
        return lm__error_context(LM_OUT_OF_MEMORY, "cpu attention workspace of %zu bytes for %zu workers", bytes,
                                 workers);
    j.part = j.work + workers * j.worker_floats;
    if (counters) {
        j.pending = (atomic_int *)(j.part + parts);
        for (size_t u = 0; u < counters; u++) atomic_init(&j.pending[u], (int)j.nsplit);
    }
    if (j.fast && !(j.window > 0 && j.Tk > j.window)) {
        j.Tk2 = ceil_div(j.Tk, 2);
        size_t kv_bytes = (size_t)(j.bh * (j.Tk * j.D2 + j.Tk2 * j.Dv)) * sizeof(uint32_t);
        j.k2all = lm__alloc(kv_bytes, 64);
        if (!j.k2all) {
            lm__free(j.work);
            return lm__error_context(LM_OUT_OF_MEMORY, "cpu attention: bf16 keys and values of %zu bytes", kv_bytes);
        }
        j.v2all = j.k2all + j.bh * j.Tk * j.D2;
        lm_threadpool_run(pool, j.bh * ceil_div(j.Tk, CONV_KEYS), convert_task, &j);
    }
    lm_threadpool_run(pool, tasks, attn_task, &j);
    lm__free(j.k2all);
    lm__free(j.work);
    return LM_OK;
}
