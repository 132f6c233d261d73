/* plan/ref.c — the CPU reference of a graph: every op in double precision on dense
 * row-major values, each output rounded once to its dtype (the semantics the
 * compiled program must reproduce up to accumulation order).
 *
 * Views are materialized copies (reshape keeps element order, permute reorders).
 * Repeat bodies run count times with per-iteration parameters; checkpoint and output
 * values are recorded per iteration for the simulator's comparisons. Matmul rows
 * run on the thread pool (O(B*M*N*K) double FLOPs).
 */
#include "plan/low.h"

#include <math.h>

typedef struct rctx {
    const lm_graph *g;          /* borrowed */
    const lm__plan_data *data; /* borrowed: inputs and parameters */
    lm_threadpool *pool; /* borrowed */
    float **val;         /* [nvalues] dense values in their own shape */
    lm__plan_ref *ref;   /* receives the recorded targets */
} rctx;

static float round_to(float x, lm_dtype dt) { return dt == LM_F16 ? lm_f16_to_f32(lm_f32_to_f16(x)) : x; }

typedef struct mm_job {
    const float *a, *b;       /* [B, M, K], [B or 1, K, N] */
    float *c;                 /* [B, M, N] */
    int64_t M, N, K, bstride; /* bstride: elements between batches of b (0 = shared) */
    double *acc;              /* [workers][N] */
    lm_dtype dt;
} mm_job;

static void mm_row(void *arg, int64_t task, int worker) {
    mm_job *j = arg;
    int64_t bi = task / j->M, m = task % j->M;
    const float *a = j->a + (bi * j->M + m) * j->K, *b = j->b + bi * j->bstride;
    double *acc = j->acc + (int64_t)worker * j->N;
    for (int64_t n = 0; n < j->N; n++) acc[n] = 0;
    for (int64_t k = 0; k < j->K; k++) {
        double av = a[k];
        const float *row = b + k * j->N;
        for (int64_t n = 0; n < j->N; n++) acc[n] += av * row[n];
    }
    float *c = j->c + (bi * j->M + m) * j->N;
    for (int64_t n = 0; n < j->N; n++) c[n] = round_to((float)acc[n], j->dt);
}

static lm_status matmul(rctx *r, const lm__gop *op) {
    const lm__gvalue *va = &r->g->values[op->in[0]], *vb = &r->g->values[op->in[1]], *vo = &r->g->values[op->out];
    int64_t B = va->ndim == 3 ? va->dims[0] : 1;
    mm_job j = {r->val[op->in[0]],
                r->val[op->in[1]],
                r->val[op->out],
                va->dims[va->ndim - 2],
                vb->dims[vb->ndim - 1],
                va->dims[va->ndim - 1],
                0,
                NULL,
                vo->dtype};
    j.bstride = vb->ndim == 3 ? j.K * j.N : 0;
    int workers = lm_threadpool_size(r->pool);
    j.acc = lm__alloc(sizeof(double) * (size_t)(j.N * workers), 64);
    if (!j.acc) return LM_OUT_OF_MEMORY;
    lm_threadpool_run(r->pool, B * j.M, mm_row, &j);
    lm__free(j.acc);
    return LM_OK;
}

static void rows(rctx *r, const lm__gop *op) {
    const lm__gvalue *vx = &r->g->values[op->in[0]];
    int64_t n = vx->dims[vx->ndim - 1], R = lm__gvalue_numel(vx) / n;
    const float *x = r->val[op->in[0]];
    float *o = r->val[op->out];
    const float *gm = op->nin > 1 ? r->val[op->in[1]] : NULL, *bt = op->nin > 2 ? r->val[op->in[2]] : NULL;
    for (int64_t i = 0; i < R; i++) {
        const float *xr = x + i * n;
        float *orow = o + i * n;
        if (op->kind == LM__GOP_SOFTMAX) {
            double mx = -INFINITY, sum = 0;
            for (int64_t k = 0; k < n; k++) mx = fmax(mx, op->a * xr[k]);
            for (int64_t k = 0; k < n; k++) sum += exp(op->a * xr[k] - mx);
            for (int64_t k = 0; k < n; k++) orow[k] = round_to((float)(exp(op->a * xr[k] - mx) / sum), vx->dtype);
            continue;
        }
        double mean = 0, var = 0;
        for (int64_t k = 0; k < n; k++) mean += xr[k];
        mean /= (double)n;
        double shift = op->kind == LM__GOP_LAYERNORM ? mean : 0.0;
        for (int64_t k = 0; k < n; k++) var += (xr[k] - shift) * (xr[k] - shift);
        double inv = 1.0 / sqrt(var / (double)n + op->a);
        for (int64_t k = 0; k < n; k++)
            orow[k] = round_to((float)((xr[k] - shift) * inv * gm[k] + (bt ? bt[k] : 0.0)), vx->dtype);
    }
}

/* x [B, T, H, D] at positions [B, T], inv_freq [D/2]: angles and cos/sin in double. */
static void rope(rctx *r, const lm__gop *op) {
    const lm__gvalue *vx = &r->g->values[op->in[0]];
    int64_t T = vx->dims[0] * vx->dims[1], H = vx->dims[2], D = vx->dims[3], half = D / 2;
    const float *x = r->val[op->in[0]], *pos = r->val[op->in[1]], *inv = r->val[op->in[2]];
    float *o = r->val[op->out];
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < half; i++) {
            double ang = (double)pos[t] * (double)inv[i], c = cos(ang) * op->a, s = sin(ang) * op->a;
            for (int64_t h = 0; h < H; h++) {
                const float *xr = x + (t * H + h) * D;
                float *orow = o + (t * H + h) * D;
                orow[i] = round_to((float)(xr[i] * c - xr[i + half] * s), vx->dtype);
                orow[i + half] = round_to((float)(xr[i + half] * c + xr[i] * s), vx->dtype);
            }
        }
}

/* Token-major q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv]: per (b, head,
 * query) the scores of its visible keys in double, a stable softmax, the weighted
 * sum of V rows. O(B Hq Tq Tk (D + Dv)). */
static lm_status attention(rctx *r, const lm__gop *op) {
    const lm__gvalue *vq = &r->g->values[op->in[0]], *vk = &r->g->values[op->in[1]], *vv = &r->g->values[op->in[2]];
    int64_t B = vq->dims[0], Tq = vq->dims[1], Hq = vq->dims[2], D = vq->dims[3];
    int64_t Tk = vk->dims[1], Hkv = vk->dims[2], Dv = vv->dims[3], group = Hq / Hkv, off = Tk - Tq;
    const float *q = r->val[op->in[0]], *k = r->val[op->in[1]], *v = r->val[op->in[2]];
    float *o = r->val[op->out];
    double *p = lm__alloc(sizeof(double) * (size_t)(Tk + Dv), 64), *acc = p + Tk;
    if (!p) return LM_OUT_OF_MEMORY;
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t kh = h / group, hi = op->i[0] ? LM_MIN(Tk, i + off + 1) : Tk;
                int64_t lo = op->i[0] && op->i[1] > 0 ? LM_MAX(0, i + off - op->i[1] + 1) : 0;
                const float *qr = q + ((b * Tq + i) * Hq + h) * D;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = lo; j < hi; j++) {
                    const float *kr = k + ((b * Tk + j) * Hkv + kh) * D;
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += (double)qr[d] * kr[d];
                    p[j] = op->a * dot;
                    mx = fmax(mx, p[j]);
                }
                for (int64_t j = lo; j < hi; j++) sum += p[j] = exp(p[j] - mx);
                for (int64_t e = 0; e < Dv; e++) acc[e] = 0;
                for (int64_t j = lo; j < hi; j++)
                    for (int64_t e = 0; e < Dv; e++) acc[e] += p[j] * v[((b * Tk + j) * Hkv + kh) * Dv + e];
                float *orow = o + ((b * Tq + i) * Hq + h) * Dv;
                for (int64_t e = 0; e < Dv; e++) orow[e] = round_to((float)(hi > lo ? acc[e] / sum : 0.0), vq->dtype);
            }
    lm__free(p);
    return LM_OK;
}

static void permute(rctx *r, const lm__gop *op) {
    const lm__gvalue *vi = &r->g->values[op->in[0]], *vo = &r->g->values[op->out];
    int64_t istr[LM__PLAN_MAX_DIMS], s = 1;
    for (int d = vi->ndim - 1; d >= 0; d--) istr[d] = s, s *= vi->dims[d];
    int64_t n = lm__gvalue_numel(vo);
    const float *x = r->val[op->in[0]];
    float *o = r->val[op->out];
    for (int64_t i = 0; i < n; i++) {
        int64_t rem = i, off = 0;
        for (int d = vo->ndim - 1; d >= 0; d--) {
            off += (rem % vo->dims[d]) * istr[op->perm[d]];
            rem /= vo->dims[d];
        }
        o[i] = x[off];
    }
}

static lm_status run_op(rctx *r, const lm__gop *op, int64_t iter) {
    const lm_graph *g = r->g;
    const lm__gvalue *vo = &g->values[op->out];
    int64_t n = lm__gvalue_numel(vo);
    float *o = r->val[op->out];
    const float *x = op->nin ? r->val[op->in[0]] : NULL;
    switch (op->kind) {
    case LM__GOP_INPUT:
    case LM__GOP_PARAM: lm__plan_data_get(r->data, op->out, op->kind == LM__GOP_PARAM ? iter : 0, o); break;
    case LM__GOP_MATMUL: LM_TRY(matmul(r, op)); break;
    case LM__GOP_BIAS_ADD: {
        const float *b = r->val[op->in[1]];
        int64_t last = vo->dims[vo->ndim - 1];
        for (int64_t i = 0; i < n; i++) o[i] = round_to((float)((double)x[i] + b[i % last]), vo->dtype);
        break;
    }
    case LM__GOP_GELU:
        for (int64_t i = 0; i < n; i++) {
            double v = x[i];
            o[i] =
                round_to((float)(0.5 * v * (1.0 + tanh(0.7978845608028654 * (v + 0.044715 * v * v * v)))), vo->dtype);
        }
        break;
    case LM__GOP_SILU:
        for (int64_t i = 0; i < n; i++) o[i] = round_to((float)(x[i] / (1.0 + exp(-(double)x[i]))), vo->dtype);
        break;
    case LM__GOP_SWIGLU: {
        const float *up = r->val[op->in[1]];
        for (int64_t i = 0; i < n; i++)
            o[i] = round_to((float)(x[i] / (1.0 + exp(-(double)x[i])) * up[i]), vo->dtype);
        break;
    }
    case LM__GOP_ADD:
    case LM__GOP_MUL: {
        const float *y = r->val[op->in[1]];
        for (int64_t i = 0; i < n; i++)
            o[i] =
                round_to((float)(op->kind == LM__GOP_ADD ? (double)x[i] + y[i] : (double)x[i] * y[i]), vo->dtype);
        break;
    }
    case LM__GOP_SOFTMAX:
    case LM__GOP_LAYERNORM:
    case LM__GOP_RMSNORM: rows(r, op); break;
    case LM__GOP_RESHAPE:
    case LM__GOP_REPEAT_IN:
    case LM__GOP_REPEAT_OUT: memcpy(o, x, sizeof(float) * (size_t)n); break;
    case LM__GOP_PERMUTE: permute(r, op); break;
    case LM__GOP_ROPE: rope(r, op); break;
    case LM__GOP_ATTENTION: LM_TRY(attention(r, op)); break;
    default: /* lm_plan_compile rejected every other kind before a plan existed */
        return lm__error(LM_INTERNAL, "plan reference: op '%s' (%s) has no tile-machine kernel", op->name,
                         lm__gop_name(op->kind));
    }
    return LM_OK;
}

static void record(rctx *r, int v, int64_t iter) {
    for (int k = 0; k < r->ref->ntargets; k++) {
        if (r->ref->value[k] != v) continue;
        int64_t n = lm__gvalue_numel(&r->g->values[v]);
        memcpy(r->ref->data[k] + iter * n, r->val[v], sizeof(float) * (size_t)n);
    }
}

static lm_status run_range(rctx *r, int begin, int end, int region, int64_t iter) {
    const lm_graph *g = r->g;
    for (int i = begin; i < end; i++) {
        const lm__gop *op = &g->ops[i];
        if (op->region != region) { /* a repeat region starts here */
            const lm__gregion *rg = &g->regions[op->region];
            for (int64_t it = 0; it < rg->count; it++) {
                for (int c = 0; c < rg->ncarry; c++) {
                    const float *src = r->val[it ? rg->body_out[c] : rg->outer_in[c]];
                    int64_t n = lm__gvalue_numel(&g->values[rg->body_in[c]]);
                    if (src != r->val[rg->body_in[c]]) memcpy(r->val[rg->body_in[c]], src, sizeof(float) * (size_t)n);
                    record(r, rg->body_in[c], it);
                }
                LM_TRY(run_range(r, rg->begin, rg->end, op->region, it));
            }
            i = rg->end - 1;
            continue;
        }
        if (op->kind == LM__GOP_REPEAT_IN) continue; /* filled by the region loop */
        LM_TRY(run_op(r, op, iter));
        record(r, op->out, iter);
    }
    return LM_OK;
}

void lm__plan_ref_free(lm__plan_ref *ref) {
    if (!ref) return;
    for (int k = 0; k < ref->ntargets; k++) lm__free(ref->data ? ref->data[k] : NULL);
    lm__free(ref->data);
    lm__free(ref->value);
    lm__free(ref->count);
    memset(ref, 0, sizeof *ref);
}

lm_status lm__plan_ref_run(const lm_graph *g, const lm__plan_data *data, lm_threadpool *pool, lm__plan_ref *ref) {
    memset(ref, 0, sizeof *ref);
    int nt = (int)g->nchecks;
    for (int64_t v = 0; v < g->nvalues; v++) nt += g->values[v].output;
    rctx r = {g, data, pool, lm__calloc((size_t)g->nvalues, sizeof(float *)), ref};
    ref->value = lm__calloc((size_t)nt + 1, sizeof(int));
    ref->count = lm__calloc((size_t)nt + 1, sizeof(int64_t));
    ref->data = lm__calloc((size_t)nt + 1, sizeof(float *));
    lm_status st = (!r.val || !ref->value || !ref->count || !ref->data) ? LM_OUT_OF_MEMORY : LM_OK;
    if (st == LM_OK) {
        ref->ntargets = nt;
        int k = 0;
        for (int64_t i = 0; i < g->nchecks; i++) ref->value[k++] = g->checks[i].value;
        for (int64_t v = 0; v < g->nvalues; v++)
            if (g->values[v].output) ref->value[k++] = (int)v;
        for (k = 0; k < nt && st == LM_OK; k++) {
            const lm__gvalue *v = &g->values[ref->value[k]];
            ref->count[k] = v->region >= 0 ? g->regions[v->region].count : 1;
            ref->data[k] = lm__alloc(sizeof(float) * (size_t)(ref->count[k] * lm__gvalue_numel(v)), 64);
            if (!ref->data[k]) st = LM_OUT_OF_MEMORY;
        }
    }
    for (int64_t v = 0; v < g->nvalues && st == LM_OK; v++) {
        r.val[v] = lm__alloc(sizeof(float) * (size_t)lm__gvalue_numel(&g->values[v]), 64);
        if (!r.val[v]) st = LM_OUT_OF_MEMORY;
    }
    if (st == LM_OK) st = run_range(&r, 0, (int)g->nops, -1, 0);
    if (r.val)
        for (int64_t v = 0; v < g->nvalues; v++) lm__free(r.val[v]);
    lm__free(r.val);
    if (st != LM_OK) lm__plan_ref_free(ref);
    return st;
}
