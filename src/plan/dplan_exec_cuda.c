/* plan/dplan_exec_cuda.c — a decode schedule run on its CUDA executor's GPU as one
 * persistent launch (loom/plan.h lm_decode_plan_run_cuda; the kernel: dplan_exec.cu).
 *
 * The records are built once per plan from the executor's resolved views, through the
 * same functions the step's own launches take their parameters from
 * (lm__cuda_linear_gemv_args and its siblings), so an item runs exactly the operator the
 * executor would run, on a piece of it:
 *  - linear, linear_swiglu, linear_qkv_rope: the decode GEMV's record; the item's output
 *    rows (SwiGLU: columns, a gate and an up row each; the front: heads, or pairs of one
 *    head, in the GEMV's pair order) as a range of whole row groups;
 *  - attention_cache: the cache attention's record; units, key chunks and merges as the
 *    plan cut them;
 *  - whole ops before the first split op and after the last (the embedding, sampling)
 *    run as the executor runs them, before and after the launch; a whole op in between
 *    has no item code and the plan is refused (LM_UNSUPPORTED naming it).
 * Waits on items outside the launch are dropped: the stream orders them.
 */
#include "plan/dplan.h"
#include "plan/dplan_exec.h"
#include "plan/internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

size_t lm__dx_gemv_smem(int64_t K, int M); /* dplan_exec.cu */

struct lm__dp_exec {
    lm__dx *dx;
    int64_t first, last; /* items [first, last) run in the launch; the rest before / after it */
    int64_t nent;
    int32_t *ent_item;  /* [nent] the item at each list position */
    int64_t *sm_begin;  /* [sms + 1] list positions of each list */
};

void lm__dp_exec_free(lm_decode_plan *p) {
    if (!p->exec) return;
    lm__dx_destroy(p->exec->dx);
    lm__free(p->exec->ent_item), lm__free(p->exec->sm_begin);
    lm__free(p->exec);
    p->exec = NULL;
}

/* Rows of one warp's group in the GEMV of format wf at M rows (gemv_cfg). */
static int group_rows(int wf, int M) {
    return M > 2 || wf == LM__CUDA_GEMV_BF16 ? 2 : wf == LM__CUDA_GEMV_I4 ? 8 : 4;
}

/* Op i's record; LM_UNSUPPORTED naming what no item code runs. */
static lm_status op_record(lm_decode_plan *p, int64_t i, lm__dx_op *r) {
    const lm_exec *e = p->e;
    const lm__gop *op = &p->g->ops[i];
    const lm_tensor_view *V = e->view;
#define IN(k) (op->in[k] >= 0 ? &V[op->in[k]] : NULL)
    memset(r, 0, sizeof *r);
    lm_linear_params lin;
    lm_qkv_rope_params qp;
    lm__exec_linear_params(e, i, &lin, &qp);
    r->kind = LM__DX_GEMV, r->ksplit = 1;
    switch (op->kind) {
    case LM__GOP_LINEAR:
        LM_TRY(lm__cuda_linear_gemv_args(&V[op->in[0]], &V[op->in[1]], IN(2), &lin, &V[op->out], &r->u.g));
        r->form = r->u.g.in == LM__CUDA_GEMV_RMSNORM ? LM__DX_NORM_OUT
                  : r->u.g.in == LM__CUDA_GEMV_PLAIN ? LM__DX_PLAIN_OUT
                                                     : LM__DX_SWIGLU_OUT;
        return LM_OK;
    case LM__GOP_LINEAR_SWIGLU:
        LM_TRY(lm__cuda_linear_swiglu_args(&V[op->in[0]], &V[op->in[1]], IN(2), &lin, &V[op->out], &r->u.g));
        r->form = LM__DX_NORM_SWIGLU;
        return LM_OK;
    case LM__GOP_LINEAR_QKV_ROPE:
        LM_TRY(lm__cuda_linear_qkv_rope_args(&V[op->in[0]], &V[op->in[1]], &lin, &qp, IN(7), IN(6), IN(8), IN(9),
                                             &V[op->out], &r->u.g));
        r->form = LM__DX_NORM_FRONT;
        return LM_OK;
    case LM__GOP_ATTENTION_CACHE: {
        lm_kv_attention_params ap = {(float)op->a, op->i[1], NULL};
        r->kind = LM__DX_ATTN;
        LM_TRY(lm__cuda_attention_cache_args(&V[op->in[0]], IN(1), IN(2), IN(3), IN(4), &ap, &V[op->out], &r->u.at.a,
                                             &r->u.at.kv));
        const int hd = r->u.at.kv.head_dim;
        if (hd != 16 && hd != 32 && hd != 64 && hd != 128 && hd != 256)
            return lm__error(LM_UNSUPPORTED, "the persistent kernel's attention takes head dims 16, 32, 64, 128 and 256 "
                             "(%d)", hd);
        if (r->u.at.a.q_heads % r->u.at.kv.kv_heads)
            return lm__error(LM_UNSUPPORTED, "%d query heads are not a whole number per kv head (%d)",
                             r->u.at.a.q_heads, r->u.at.kv.kv_heads);
        return LM_OK;
    }
    default:
        return lm__error(LM_UNSUPPORTED, "the persistent kernel has no item code for %s", lm__gop_name(op->kind));
    }
#undef IN
}

/* The GEMV row groups [*g0, *g1) item it covers (its rows in the GEMV's own order). */
static lm_status item_groups(const lm_decode_plan *p, const lm__dp_item *it, const lm__dx_op *r, int rpw, int64_t *g0,
                             int64_t *g1) {
    const lm__cuda_gemv_params *gp = &r->u.g;
    int64_t v0, v1;
    if (it->kind == LM__DP_ROWS) {
        v0 = it->lo, v1 = it->hi;
    } else if (it->kind == LM__DP_SWIGLU) {
        v0 = 2 * it->lo, v1 = 2 * it->hi;
    } else { /* the front: whole heads, or pairs [k0, k1) of one head, i and hd / 2 + i side by side */
        const int64_t hd = gp->kv.head_dim;
        if (it->k0 == 0 && it->k1 == hd / 2) v0 = it->lo * hd, v1 = it->hi * hd;
        else v0 = it->lo * hd + 2 * it->k0, v1 = it->lo * hd + 2 * it->k1;
    }
    if (v0 % rpw || (v1 % rpw && v1 != gp->N))
        return lm__error(LM_UNSUPPORTED, "item %lld covers GEMV rows [%lld, %lld) of '%s', not whole groups of %d rows",
                         (long long)(it - p->items), (long long)v0, (long long)v1, p->g->ops[it->op].name, rpw);
    *g0 = v0 / rpw, *g1 = (v1 + rpw - 1) / rpw;
    return LM_OK;
}

static lm_status build(lm_decode_plan *p) {
    const lm_graph *g = p->g;
    const int64_t n = p->nitems;
    int64_t first = 0, last = n;
    while (first < n && p->items[first].kind == LM__DP_WHOLE) first++;
    while (last > first && p->items[last - 1].kind == LM__DP_WHOLE) last--;
    int64_t *rec_of = lm__alloc(sizeof(int64_t) * (size_t)LM_MAX(g->nops, 1), 64);
    lm__dx_op *ops = lm__calloc((size_t)LM_MAX(g->nops, 1), sizeof *ops);
    lm__dx_entry *ent = lm__calloc((size_t)LM_MAX(n, 1), sizeof *ent);
    int32_t *waits = lm__alloc(sizeof(int32_t) * (size_t)LM_MAX(p->wait_begin[n], 1), 64);
    int64_t *sm_begin = lm__alloc(sizeof(int64_t) * (size_t)(p->opt.sms + 1), 64);
    unsigned char *named = lm__calloc((size_t)LM_MAX(n, 1), 1), *op_named = lm__calloc((size_t)LM_MAX(p->nops, 1), 1);
    int64_t *max_groups = lm__calloc((size_t)LM_MAX(g->nops, 1), sizeof *max_groups);
    int64_t *g0s = lm__alloc(sizeof(int64_t) * 2 * (size_t)LM_MAX(n, 1), 64);
    unsigned char *op_in = lm__calloc((size_t)LM_MAX(p->nops, 1), 1); /* the plan's op numbers in the launch */
    lm_status st = rec_of && ops && ent && waits && sm_begin && named && op_named && max_groups && g0s && op_in
                       ? LM_OK
                       : LM_OUT_OF_MEMORY;
    for (int64_t i = first; st == LM_OK && i < last; i++) op_in[p->item_op[i]] = 1;
    int64_t nops = 0, nw = 0, ne = 0;
    int wf = -1, rows = 0;
    size_t smem = 0;
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++) rec_of[i] = -1;
    /* the records, and each item's row groups */
    for (int64_t i = first; st == LM_OK && i < last; i++) {
        const lm__dp_item *it = &p->items[i];
        const lm__gop *op = &g->ops[it->op];
        if (it->kind == LM__DP_WHOLE || it->kind == LM__DP_MROWS) {
            st = lm__error(LM_UNSUPPORTED, "the persistent kernel has no item code for '%s' (%s) inside the step",
                           op->name, lm__gop_name(op->kind));
            break;
        }
        if (rec_of[it->op] < 0) {
            lm__dx_op *r = &ops[nops];
            st = op_record(p, it->op, r);
            if (st != LM_OK) {
                lm__error_context(st, "decode plan (cuda): op '%s'", op->name);
                break;
            }
            if (r->kind == LM__DX_GEMV) {
                if (wf < 0) wf = r->u.g.wf, rows = r->u.g.M;
                if ((int)r->u.g.wf != wf || r->u.g.M != rows) {
                    st = lm__error(LM_UNSUPPORTED, "decode plan (cuda): op '%s' has weight format %d and %d rows, "
                                   "another op %d and %d (one launch runs one of each)", op->name, r->u.g.wf,
                                   r->u.g.M, wf, rows);
                    break;
                }
                smem = LM_MAX(smem, lm__dx_gemv_smem(r->u.g.K, r->u.g.M));
            } else {
                smem = LM_MAX(smem, (size_t)8 * (size_t)r->u.at.kv.head_dim * sizeof(float));
            }
            rec_of[it->op] = nops++;
        }
        const lm__dx_op *r = &ops[rec_of[it->op]];
        g0s[2 * i] = it->lo, g0s[2 * i + 1] = it->hi;
        if (r->kind == LM__DX_GEMV) {
            st = item_groups(p, it, r, group_rows(wf, rows), &g0s[2 * i], &g0s[2 * i + 1]);
            if (st != LM_OK) {
                lm__error_context(st, "decode plan (cuda)");
                break;
            }
            max_groups[it->op] = LM_MAX(max_groups[it->op], g0s[2 * i + 1] - g0s[2 * i]);
        }
    }
    if (st == LM_OK && wf < 0) st = lm__error(LM_UNSUPPORTED, "decode plan (cuda): the step has no GEMV to run");
    /* a row's K split over the block's warps when the op's pieces have fewer row groups
     * than half the warps (LOOM_DPLAN_KSPLIT=1 or 8 forces one) */
    const char *ks = getenv("LOOM_DPLAN_KSPLIT");
    for (int64_t i = 0; st == LM_OK && i < g->nops; i++)
        if (rec_of[i] >= 0 && ops[rec_of[i]].kind == LM__DX_GEMV)
            ops[rec_of[i]].ksplit = ks && !strcmp(ks, "1") ? 1 : ks && !strcmp(ks, "8") ? 8 : max_groups[i] < 4 ? 8 : 1;
    /* which waits stay (those on items of the launch) and what each item must release */
    for (int64_t i = first; st == LM_OK && i < last; i++)
        for (int64_t k = p->wait_begin[i]; k < p->wait_begin[i + 1]; k++) {
            int32_t w = p->waits[k];
            if (w >= 0 && w >= first) named[w] = 1;
            if (w < 0) op_named[-w - 1] = 1;
        }
    sm_begin[0] = 0;
    for (int s = 0; st == LM_OK && s < p->opt.sms; s++) {
        for (int64_t k = p->sm_begin[s]; k < p->sm_begin[s + 1]; k++) {
            const int32_t i = p->order[k];
            if (i < first || i >= last) continue;
            const lm__dp_item *it = &p->items[i];
            lm__dx_entry *x = &ent[ne++];
            x->lo = g0s[2 * i], x->hi = g0s[2 * i + 1], x->k0 = it->k0, x->k1 = it->k1, x->poff = it->poff;
            x->item = i, x->op = (int32_t)rec_of[it->op], x->c = it->c, x->nc = it->nc;
            x->kind = it->kind == LM__DP_ATTN_PART      ? LM__DX_PART
                      : it->kind == LM__DP_ATTN_COMBINE ? LM__DX_COMBINE
                      : it->kind == LM__DP_ATTN         ? LM__DX_ATTN
                                                        : LM__DX_GEMV;
            x->counter = p->item_op[i];
            x->rel = (named[i] ? 1u : 0u) | (op_named[p->item_op[i]] ? 2u : 0u);
            x->wait0 = nw;
            for (int64_t w = p->wait_begin[i]; w < p->wait_begin[i + 1]; w++) {
                const int32_t v = p->waits[w];
                if (v >= 0 && v < first) continue; /* done before the launch */
                if (v < 0 && !op_in[-v - 1]) continue; /* an op outside the launch: before it */
                waits[nw++] = v;
            }
            x->nwait = (int32_t)(nw - x->wait0);
        }
        sm_begin[s + 1] = ne;
    }
    if (st == LM_OK) {
        lm__dx_tables t = {p->opt.sms, wf, rows, ne, sm_begin, ent, nw, waits, n, p->nops, p->op_count, nops, ops,
                           smem, p->part_on_device ? p->part : NULL, p->e->device.index};
        lm__dx *dx = NULL;
        st = lm__dx_create(&t, &dx);
        if (st == LM_OK) {
            p->exec = lm__calloc(1, sizeof *p->exec);
            int32_t *ent_item = lm__alloc(sizeof(int32_t) * (size_t)LM_MAX(ne, 1), 64);
            if (!p->exec || !ent_item) {
                lm__dx_destroy(dx);
                lm__free(p->exec), lm__free(ent_item);
                p->exec = NULL;
                st = LM_OUT_OF_MEMORY;
            } else {
                for (int64_t k = 0; k < ne; k++) ent_item[k] = ent[k].item;
                p->exec->dx = dx, p->exec->first = first, p->exec->last = last;
                p->exec->nent = ne, p->exec->ent_item = ent_item, p->exec->sm_begin = sm_begin;
                sm_begin = NULL; /* kept */
            }
        }
    }
    lm__free(rec_of), lm__free(ops), lm__free(ent), lm__free(waits), lm__free(sm_begin), lm__free(named);
    lm__free(op_named), lm__free(max_groups), lm__free(g0s), lm__free(op_in);
    return st;
}

lm_status lm__dp_exec_enqueue(lm_decode_plan *p, lm_ctx *ctx) {
    lm_exec *e = p->e;
    lm_device_caps caps;
    LM_TRY(lm_device_caps_get(e->device, &caps));
    if (caps.host_addressable || !lm_device_equal(lm_ctx_device(ctx), e->device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cuda: the executor and the context must be on the "
                         "same CUDA device");
    LM_TRY(lm__exec_prepare(e));
    if (e->resolves != p->resolves)
        return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cuda: the executor's bindings changed since the plan "
                         "was made (its views are stale); make a new plan");
    if (!p->exec) LM_TRY(build(p));
    if (e->opt.poison) {
        static const uint8_t ones = 0xff;
        LM_TRY(lm__exec_poison(e));
        if (p->part) LM_TRY(lm_device_fill(p->part_device, p->part, (size_t)p->npart * sizeof *p->part, &ones, 1));
    }
    for (int64_t i = 0; i < p->exec->first; i++) LM_TRY(lm__exec_run_op(e, ctx, p->items[i].op));
    LM_TRY(lm__dx_launch(p->exec->dx, (cudaStream_t)lm_ctx_stream(ctx)));
    for (int64_t i = p->exec->last; i < p->nitems; i++) LM_TRY(lm__exec_run_op(e, ctx, p->items[i].op));
    e->runs++;
    return LM_OK;
}

lm_status lm__dp_exec_finish(lm_decode_plan *p, lm_ctx *ctx) {
    LM_TRY(lm_ctx_synchronize(ctx));
    return p->exec ? lm__dx_status(p->exec->dx) : LM_OK;
}

/* An op's name without its layer ("layers.3.q_rope" -> "q_rope"). */
static void op_family(const char *name, char *out, size_t n) {
    const char *l = strstr(name, "layers.");
    if (!l) {
        snprintf(out, n, "%s", name);
        return;
    }
    const char *r = l + 7;
    while (*r >= '0' && *r <= '9') r++;
    if (*r == '.') r++;
    snprintf(out, n, "%s", r);
}

typedef struct family {
    char name[64];
    const char *kind;
    int64_t items;
    double wait, run; /* cycles */
} family;

lm_status lm__dp_exec_profile(lm_decode_plan *p, lm_ctx *ctx, char **out) {
    *out = NULL;
    if (!p->exec) LM_TRY(lm__dp_exec_enqueue(p, ctx)); /* builds the tables */
    LM_TRY(lm__dp_exec_finish(p, ctx));
    LM_TRY(lm__dx_profile(p->exec->dx, 1));
    const int poison = p->e->opt.poison;
    p->e->opt.poison = 0;
    lm_status st = LM_OK;
    for (int k = 0; k < 3 && st == LM_OK; k++) st = lm__dp_exec_enqueue(p, ctx); /* the last one is read */
    p->e->opt.poison = poison;
    if (st == LM_OK) st = lm__dp_exec_finish(p, ctx);
    const int64_t ne = p->exec->nent;
    long long *sp = lm__alloc(sizeof(long long) * 3 * (size_t)LM_MAX(ne, 1), 64);
    family *fam = lm__calloc((size_t)LM_MAX(ne, 1), sizeof *fam);
    double khz = 0;
    if (st == LM_OK && (!sp || !fam)) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = lm__dx_stamps(p->exec->dx, sp, &khz);
    lm__dx_profile(p->exec->dx, 0);
    int64_t nf = 0;
    double span = 0, busy = 0, waited = 0;
    for (int s = 0; st == LM_OK && s < p->opt.sms; s++) {
        const int64_t a = p->exec->sm_begin[s], b = p->exec->sm_begin[s + 1];
        if (a < b) span = fmax(span, (double)(sp[3 * (b - 1) + 2] - sp[3 * a]));
        for (int64_t k = a; k < b; k++) {
            const lm__dp_item *it = &p->items[p->exec->ent_item[k]];
            char name[64];
            op_family(p->g->ops[it->op].name, name, sizeof name);
            const char *kind = it->kind == LM__DP_ATTN_PART ? "key chunks" : it->kind == LM__DP_ATTN_COMBINE ? "merges" : "";
            int64_t f = 0;
            while (f < nf && (strcmp(fam[f].name, name) || strcmp(fam[f].kind, kind))) f++;
            if (f == nf) snprintf(fam[nf].name, sizeof fam[nf].name, "%s", name), fam[nf++].kind = kind;
            const double w = (double)(sp[3 * k + 1] - sp[3 * k]), r = (double)(sp[3 * k + 2] - sp[3 * k + 1]);
            fam[f].items++, fam[f].wait += w, fam[f].run += r;
            busy += r, waited += w;
        }
    }
    lm__plan_sbuf text = {0};
    const double us = khz > 0 ? 1e3 / khz : 0; /* microseconds a cycle at the rated SM clock */
    if (st == LM_OK) {
        lm__plan_sbuf_printf(&text, "persistent launch profile (one step, %d lists, clock64 at the rated %.0f MHz): "
                             "longest list %.1f us; list time %.0f%% running items, %.0f%% waiting\n", p->opt.sms,
                             khz / 1e3, span * us, 100 * busy / fmax(busy + waited, 1),
                             100 * waited / fmax(busy + waited, 1));
        for (int64_t f = 0; f < nf; f++)
            lm__plan_sbuf_printf(&text, "  %-32s %-10s %6lld items  wait %7.2f us  run %7.2f us an item  (%4.1f%% of "
                                 "item time)\n", fam[f].name, fam[f].kind, (long long)fam[f].items,
                                 fam[f].wait * us / (double)fam[f].items, fam[f].run * us / (double)fam[f].items,
                                 100 * fam[f].run / fmax(busy, 1));
    }
    lm__free(sp), lm__free(fam);
    if (st != LM_OK) {
        lm__free(text.p);
        return st;
    }
    return lm__plan_sbuf_finish(&text, out);
}
