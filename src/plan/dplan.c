/* plan/dplan.c — decode schedules (loom/plan.h "decode schedules"): a prepared decode
 * step cut into work items, their byte footprints in the executor's storage, the
 * dependencies the footprints imply, a static list of items per SM from a
 * list-scheduling simulation under the cost constants, and the independent check.
 *
 * Items are numbered in one global order: ops in program order, an op's pieces in
 * order. Item b depends on item a < b when their footprints conflict (one of them
 * writes bytes the other reads or writes: true data flow, and the reuse of arena bytes
 * by later values); the candidates are reduced to the ones not already implied
 * through another dependency (reachability bit sets, newest candidate first). Each
 * SM's list ascends in the global order, so the lowest unfinished item always has its
 * dependencies done and its SM at it: no schedule on any SM count can deadlock.
 */
#include "plan/dplan.h"
#include "plan/dplan_replay.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ITEMS 24576        /* reachability sets: MAX_ITEMS^2 bits (72 MiB) at most */
#define MAX_VIEW_RUNS (1 << 14) /* a view with more contiguous runs is taken as its bounding interval */

void lm_decode_plan_options_default(lm_decode_plan_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->sms = 132;
    o->full_sms = 132;
    o->bandwidth_bytes_per_s = 4.2e12;
    o->l2_bytes_per_s = 1.0e13;
    o->flops_per_s = 7.8e14;
    o->item_s = 1.2e-6; /* measured on the H200 (docs/PLAN.md section 9, "constants") */
    o->dep_s = 0.1e-6;
    o->item_bytes = 256 << 10;
    o->min_item_bytes = 4 << 10;
    o->max_items_per_sm = 4;
}

static lm_status check_options(const lm_decode_plan_options *o) {
    if (o->sms < 1 || o->sms > 4096)
        return lm__error(LM_INVALID_ARGUMENT, "decode plan: sms = %d; expected 1..4096", o->sms);
    if (o->full_sms < 1) return lm__error(LM_INVALID_ARGUMENT, "decode plan: full_sms = %d; expected >= 1", o->full_sms);
    if (!(o->bandwidth_bytes_per_s > 0) || !(o->l2_bytes_per_s > 0) || !isfinite(o->bandwidth_bytes_per_s) ||
        !isfinite(o->l2_bytes_per_s) || !(o->flops_per_s > 0) || !isfinite(o->flops_per_s))
        return lm__error(LM_INVALID_ARGUMENT, "decode plan: the bandwidths and the FLOP rate must be positive and finite");
    if (!(o->item_s >= 0) || !(o->dep_s >= 0) || !isfinite(o->item_s) || !isfinite(o->dep_s))
        return lm__error(LM_INVALID_ARGUMENT, "decode plan: item_s and dep_s must be >= 0 and finite");
    if (o->item_bytes < 1 || o->min_item_bytes < 1 || o->min_item_bytes > o->item_bytes)
        return lm__error(LM_INVALID_ARGUMENT, "decode plan: item_bytes %lld and min_item_bytes %lld must be >= 1, the "
                         "minimum no larger", (long long)o->item_bytes, (long long)o->min_item_bytes);
    if (o->max_items_per_sm < 1)
        return lm__error(LM_INVALID_ARGUMENT, "decode plan: max_items_per_sm = %d; expected >= 1", o->max_items_per_sm);
    if (o->prefetch_bytes < 0) return lm__error(LM_INVALID_ARGUMENT, "decode plan: prefetch_bytes must be >= 0");
    if (o->context < 0) return lm__error(LM_INVALID_ARGUMENT, "decode plan: context must be >= 0");
    return LM_OK;
}

int64_t lm__dp_heads_q(const lm__gop *op) { return op->i[0]; }

int64_t lm__dp_group(const lm_graph *g, const lm__gop *op) {
    int64_t hq = g->values[op->in[0]].dims[2], hkv = g->values[op->in[1]].dims[1];
    return hkv > 0 ? hq / hkv : 1;
}

void lm__dp_drop_dep(lm_decode_plan *p, int64_t i, int k) {
    lm__dp_item *it = &p->items[i];
    if (k < 0 || k >= it->ndep) return;
    memmove(&p->deps[it->dep0 + k], &p->deps[it->dep0 + k + 1], (size_t)(it->ndep - k - 1) * sizeof *p->deps);
    it->ndep--;
}

void lm__dp_drop_wait(lm_decode_plan *p, int64_t i, int k) {
    int64_t a = p->wait_begin[i] + k;
    if (k < 0 || a >= p->wait_begin[i + 1]) return;
    memmove(&p->waits[a], &p->waits[a + 1], (size_t)(p->wait_begin[p->nitems] - a - 1) * sizeof *p->waits);
    for (int64_t j = i + 1; j <= p->nitems; j++) p->wait_begin[j]--;
}

/* ---- footprints ------------------------------------------------------------------------- */

static lm_status add_iv(lm_decode_plan *p, uintptr_t lo, uintptr_t hi, int write) {
    if (hi <= lo) return LM_OK;
    LM_TRY(lm__reserve((void **)&p->iv, &p->cap_iv, p->niv + 1, sizeof *p->iv));
    p->iv[p->niv++] = (lm__dp_iv){lo, hi, (int32_t)(p->nitems - 1), write};
    p->items[p->nitems - 1].niv++;
    return LM_OK;
}

static size_t elem_bytes(lm_dtype dt) { return lm_dtype_size(dt); }

/* The bytes of view v as contiguous runs (its bounding interval past MAX_VIEW_RUNS). */
static lm_status add_view(lm_decode_plan *p, const lm_tensor_view *v, int write) {
    int64_t n = lm_tensor_view_numel(v);
    if (n <= 0 || !v->data) return LM_OK;
    uintptr_t base = (uintptr_t)v->data, es = elem_bytes(v->dtype);
    int d = v->ndim - 1;
    int64_t run = 1;
    while (d >= 0 && (v->shape[d] == 1 || v->stride[d] == run)) run *= v->shape[d--];
    int64_t runs = n / run;
    if (runs > MAX_VIEW_RUNS) {
        int64_t last = 0;
        for (int k = 0; k < v->ndim; k++) last += (v->shape[k] - 1) * v->stride[k];
        return add_iv(p, base, base + (uintptr_t)(last + 1) * es, write);
    }
    int64_t idx[LM_MAX_DIMS] = {0};
    for (int64_t r = 0; r < runs; r++) {
        int64_t off = 0;
        for (int k = 0; k <= d; k++) off += idx[k] * v->stride[k];
        LM_TRY(add_iv(p, base + (uintptr_t)off * es, base + (uintptr_t)(off + run) * es, write));
        for (int k = d; k >= 0; k--) {
            if (++idx[k] < v->shape[k]) break;
            idx[k] = 0;
        }
    }
    return LM_OK;
}

static const lm_tensor_view *view_of(const lm_decode_plan *p, int v) { return v >= 0 ? &p->fview[v] : NULL; }

/* The views footprints are taken from: the executor's, except that a KV cache [S, Hkv,
 * P, D] keeps one position (dim 2 = [0, 1)). Every item that touches a cache touches all
 * its positions alike (a write's position is known only at run time, so a writer covers
 * them all; a reader reads them all or, for a key chunk, is taken to), so two footprints
 * overlap on position 0 exactly when they overlap at all -- and a cache's footprint is
 * then S x Hkv runs, not S x Hkv x P (a 16k-position cache's took most of the planning). */
static lm_status footprint_views(lm_decode_plan *p) {
    const lm_graph *g = p->g;
    p->fview = lm__alloc((size_t)LM_MAX(g->nvalues, 1) * sizeof *p->fview, 64);
    unsigned char *cache = lm__calloc((size_t)LM_MAX(g->nvalues, 1), 1);
    if (!p->fview || !cache) {
        lm__free(cache);
        return LM_OUT_OF_MEMORY;
    }
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (op->kind == LM__GOP_ATTENTION_CACHE) cache[op->in[1]] = cache[op->in[2]] = 1;
        else if (op->kind == LM__GOP_LINEAR_QKV_ROPE) cache[op->in[8]] = cache[op->in[9]] = 1;
        else if (op->kind == LM__GOP_KV_STORE) cache[op->in[0]] = cache[op->out] = 1;
    }
    lm_status st = LM_OK;
    for (int64_t v = 0; v < g->nvalues && st == LM_OK; v++) {
        p->fview[v] = p->e->view[v];
        if (cache[v] && p->fview[v].data && p->fview[v].ndim == 4 && p->fview[v].shape[2] > 1)
            st = lm_tensor_view_slice(&p->e->view[v], 2, 0, 1, 1, &p->fview[v]);
    }
    lm__free(cache);
    return st;
}

static lm_status add_slice(lm_decode_plan *p, int v, int dim, int64_t lo, int64_t hi, int write) {
    if (v < 0) return LM_OK;
    lm_tensor_view s;
    LM_TRY(lm_tensor_view_slice(view_of(p, v), dim, lo, hi, 1, &s));
    return add_view(p, &s, write);
}

static lm_status add_whole(lm_decode_plan *p, int v, int write) {
    return v >= 0 ? add_view(p, view_of(p, v), write) : LM_OK;
}

static int is_leaf_value(const lm_graph *g, int v) {
    return lm__gop_is_leaf(g->ops[g->values[g->values[v].root].op].kind);
}

static double view_bytes(const lm_tensor_view *v) { return (double)lm_tensor_view_numel(v) * (double)elem_bytes(v->dtype); }

/* ---- items ---------------------------------------------------------------------------------- */

static lm_status new_item(lm_decode_plan *p, int op, lm__dp_kind kind, int64_t lo, int64_t hi) {
    if (p->nitems >= MAX_ITEMS)
        return lm__error(LM_OUT_OF_RANGE, "decode plan: more than %d work items (raise item_bytes or lower "
                         "max_items_per_sm)", MAX_ITEMS);
    LM_TRY(lm__reserve((void **)&p->items, &p->cap_items, p->nitems + 1, sizeof *p->items));
    lm__dp_item *it = &p->items[p->nitems++];
    memset(it, 0, sizeof *it);
    it->op = op, it->kind = kind, it->lo = lo, it->hi = hi, it->sm = -1;
    it->iv0 = p->niv;
    return LM_OK;
}

/* Positions a row of attention op `op` holds (its slot, or its blocks when paged), and
 * the ones its cost counts (opt.context, when smaller). */
static int64_t attn_row(const lm_decode_plan *p, const lm__gop *op) {
    const lm__gvalue *kc = &p->g->values[op->in[1]], *sl = &p->g->values[op->in[3]];
    return sl->ndim == 2 ? sl->dims[1] * kc->dims[2] : kc->dims[2];
}

static int64_t attn_context(const lm_decode_plan *p, const lm__gop *op) {
    int64_t R = attn_row(p, op);
    return p->opt.context > 0 && p->opt.context < R ? p->opt.context : R;
}

/* Streamed bytes of one kv head of attention op `op` (every row's keys and values). */
static double attn_head_bytes(const lm_decode_plan *p, const lm__gop *op) {
    const lm__gvalue *q = &p->g->values[op->in[0]], *kc = &p->g->values[op->in[1]];
    return 2.0 * (double)(q->dims[0] * attn_context(p, op) * kc->dims[3]) * (double)elem_bytes(kc->dtype);
}

static int64_t split_parts(const lm_decode_plan *p, double total, int64_t units, int64_t parts_cap);

/* Key chunks per kv head: the parts the op's bytes call for (at most one per SM),
 * spread over its kv heads, at least 16 positions each; 1 = no key split. */
static int64_t attn_chunks(const lm_decode_plan *p, const lm__gop *op) {
    int64_t hkv = p->g->values[op->in[1]].dims[1], ctx = attn_context(p, op);
    if (p->g->values[op->in[0]].dims[3] > LM__DP_MAX_HEAD_DIM) return 1;
    int64_t parts = split_parts(p, attn_head_bytes(p, op) * (double)hkv, INT64_MAX, p->opt.sms); /* one wave */
    return LM_MAX(1, LM_MIN(parts / LM_MAX(hkv, 1), ctx / 16));
}

/* Multiply-adds x 2 of a weight piece w (rows of op's in[1]) over the rows of op's x
 * (int4: two weights a byte). */
static double weight_flops(const lm_decode_plan *p, const lm__gop *op, const lm_tensor_view *w) {
    const lm__gvalue *x = &p->g->values[op->in[0]];
    double per_byte = w->dtype == LM_U8 ? 2.0 : 1.0 / (double)elem_bytes(w->dtype);
    return 2.0 * (double)x->dims[0] * view_bytes(w) * per_byte;
}

/* Footprint and streamed bytes of the item just added. */
static lm_status footprint(lm_decode_plan *p) {
    lm__dp_item *it = &p->items[p->nitems - 1];
    const lm_graph *g = p->g;
    const lm__gop *op = &g->ops[it->op];
    int64_t lo = it->lo, hi = it->hi;
    double l2 = 0;
    switch (it->kind) {
    case LM__DP_ROWS:
    case LM__DP_SWIGLU: { /* x, w, bias, norm_weight, residual, w_scales */
        int swi = it->kind == LM__DP_SWIGLU;
        int64_t I = g->values[op->out].dims[g->values[op->out].ndim - 1];
        LM_TRY(add_whole(p, op->in[0], 0));
        LM_TRY(add_whole(p, op->in[3], 0));
        for (int h = 0; h <= swi; h++) {
            int64_t a = lo + h * I, b = hi + h * I;
            LM_TRY(add_slice(p, op->in[1], 0, a, b, 0));
            LM_TRY(add_slice(p, op->in[2], 0, a, b, 0));
            LM_TRY(add_slice(p, op->in[5], 0, a, b, 0));
            lm_tensor_view s;
            LM_TRY(lm_tensor_view_slice(view_of(p, op->in[1]), 0, a, b, 1, &s));
            it->hbm += view_bytes(&s);
            it->flops += weight_flops(p, op, &s);
            if (op->in[5] >= 0) {
                LM_TRY(lm_tensor_view_slice(view_of(p, op->in[5]), 0, a, b, 1, &s));
                it->hbm += view_bytes(&s);
            }
        }
        const lm_tensor_view *o = view_of(p, op->out);
        int last = o->ndim - 1;
        if (!swi && op->i[3]) LM_TRY(add_slice(p, op->out, last, lo, hi, 0)); /* the residual, read then written */
        LM_TRY(add_slice(p, op->out, last, lo, hi, 1));
        l2 = view_bytes(view_of(p, op->in[0])) + view_bytes(o) * (double)(hi - lo) / (double)o->shape[last];
        break;
    }
    case LM__DP_QKV: { /* x, w, norm, scales, bias, inv_freq, positions, slots, k_cache, v_cache */
        int64_t D = g->values[op->out].dims[3], hq = lm__dp_heads_q(op), hkv = g->values[op->in[8]].dims[1];
        LM_TRY(add_whole(p, op->in[0], 0));
        LM_TRY(add_whole(p, op->in[2], 0));
        for (int k = 5; k <= 7; k++) LM_TRY(add_whole(p, op->in[k], 0));
        for (int64_t h = lo; h < hi; h++)
            for (int half = 0; half < 2; half++) { /* RoPE's pairs: dims k0.. and D/2 + k0.. */
                int64_t d0 = half * D / 2 + it->k0, d1 = half * D / 2 + it->k1;
                LM_TRY(add_slice(p, op->in[1], 0, h * D + d0, h * D + d1, 0));
                LM_TRY(add_slice(p, op->in[3], 0, h * D + d0, h * D + d1, 0));
                LM_TRY(add_slice(p, op->in[4], 0, h * D + d0, h * D + d1, 0));
                lm_tensor_view s;
                LM_TRY(lm_tensor_view_slice(view_of(p, op->in[1]), 0, h * D + d0, h * D + d1, 1, &s));
                it->hbm += view_bytes(&s);
                it->flops += weight_flops(p, op, &s);
                if (op->in[3] >= 0) {
                    LM_TRY(lm_tensor_view_slice(view_of(p, op->in[3]), 0, h * D + d0, h * D + d1, 1, &s));
                    it->hbm += view_bytes(&s);
                }
                int v = h < hq ? op->out : h < hq + hkv ? op->in[8] : op->in[9];
                int64_t hh = h < hq ? h : h < hq + hkv ? h - hq : h - hq - hkv;
                lm_tensor_view a;
                LM_TRY(lm_tensor_view_slice(view_of(p, v), h < hq ? 2 : 1, hh, hh + 1, 1, &a));
                LM_TRY(lm_tensor_view_slice(&a, 3, d0, d1, 1, &s));
                LM_TRY(add_view(p, &s, 1));
            }
        l2 = view_bytes(view_of(p, op->in[0]));
        break;
    }
    case LM__DP_ATTN: { /* q, k_cache, v_cache, slots, positions; units (row b, kv head h) */
        int64_t G = lm__dp_group(g, op), hkv = g->values[op->in[1]].dims[1], B = g->values[op->in[0]].dims[0];
        for (int64_t u = lo; u < hi; u++) {
            int64_t b = u / hkv, h = u % hkv;
            lm_tensor_view r, s;
            LM_TRY(lm_tensor_view_slice(view_of(p, op->in[0]), 0, b, b + 1, 1, &r));
            LM_TRY(lm_tensor_view_slice(&r, 2, h * G, (h + 1) * G, 1, &s));
            LM_TRY(add_view(p, &s, 0));
            LM_TRY(add_slice(p, op->in[1], 1, h, h + 1, 0)); /* every slot: the row's is found at run time */
            LM_TRY(add_slice(p, op->in[2], 1, h, h + 1, 0));
            LM_TRY(add_slice(p, op->in[3], 0, b, b + 1, 0));
            LM_TRY(add_slice(p, op->in[4], 0, b, b + 1, 0));
            LM_TRY(lm_tensor_view_slice(view_of(p, op->out), 0, b, b + 1, 1, &r));
            LM_TRY(lm_tensor_view_slice(&r, 2, h * G, (h + 1) * G, 1, &s));
            LM_TRY(add_view(p, &s, 1));
            l2 += 2.0 * view_bytes(&s);
        }
        /* no share of the op's split-key workspace (a device executor's): a piece keeps its
         * softmax state to itself, so pieces of one op or of several never wait on it */
        it->hbm = attn_head_bytes(p, op) * (double)(hi - lo) / (double)B;
        it->flops = 4.0 * (double)(g->values[op->in[0]].dims[1] * G * attn_context(p, op) * g->values[op->in[0]].dims[3]) *
                    (double)(hi - lo);
        break;
    }
    case LM__DP_ATTN_PART:
    case LM__DP_ATTN_COMBINE: {
        const lm__gvalue *q = &g->values[op->in[0]];
        int64_t B = q->dims[0], T = q->dims[1], Hq = q->dims[2], D = q->dims[3], G = lm__dp_group(g, op);
        uintptr_t base = (uintptr_t)p->part;
        if (it->kind == LM__DP_ATTN_PART) {
            LM_TRY(add_slice(p, op->in[0], 2, lo * G, hi * G, 0));
            LM_TRY(add_slice(p, op->in[1], 1, lo, hi, 0));
            LM_TRY(add_slice(p, op->in[2], 1, lo, hi, 0));
            LM_TRY(add_whole(p, op->in[3], 0));
            LM_TRY(add_whole(p, op->in[4], 0));
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t h = lo * G; h < hi * G; h++) {
                        uintptr_t a = base + sizeof(float) * (uintptr_t)lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, h, it->c);
                        LM_TRY(add_iv(p, a, a + sizeof(float) * (uintptr_t)(D + 2), 1));
                    }
            const lm_tensor_view *kc = view_of(p, op->in[1]);
            int64_t ctx = attn_context(p, op);
            int64_t n = LM_MAX(0, LM_MIN(it->k1, ctx) - it->k0);
            it->hbm = 2.0 * (double)(B * (hi - lo) * n * kc->shape[3]) * (double)elem_bytes(kc->dtype);
            it->flops = 4.0 * (double)(B * T * (hi - lo) * G * n * D);
            l2 = (double)(B * T * (hi - lo) * G * (2 * D + 2)) * sizeof(float);
        } else {
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++) {
                    uintptr_t a = base + sizeof(float) * (uintptr_t)lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, lo * G, 0);
                    uintptr_t z = base + sizeof(float) * (uintptr_t)lm__dp_part_at(it->poff, T, Hq, it->nc, D, b, t, hi * G, 0);
                    LM_TRY(add_iv(p, a, z, 0));
                }
            LM_TRY(add_slice(p, op->out, 2, lo * G, hi * G, 1));
            l2 = (double)(B * T * (hi - lo) * G * (it->nc * (D + 2) + D)) * sizeof(float);
        }
        break;
    }
    case LM__DP_MROWS:
    case LM__DP_WHOLE: {
        int rows = it->kind == LM__DP_MROWS;
        for (int k = 0; k < op->nin; k++) {
            if (op->in[k] < 0) continue;
            if (rows && lm__dp_row_input(op, k)) {
                lm_tensor_view s;
                LM_TRY(lm_tensor_view_slice(view_of(p, op->in[k]), 0, lo, hi, 1, &s));
                LM_TRY(add_view(p, &s, 0));
                l2 += view_bytes(&s);
                continue;
            }
            LM_TRY(add_whole(p, op->in[k], 0));
            if (!is_leaf_value(g, op->in[k])) l2 += view_bytes(view_of(p, op->in[k]));
        }
        for (int k = 0; k < 2; k++) {
            int v = k ? op->out2 : op->out;
            if (v < 0) continue;
            lm_tensor_view s = *view_of(p, v);
            if (rows) LM_TRY(lm_tensor_view_slice(view_of(p, v), 0, lo, hi, 1, &s));
            LM_TRY(add_view(p, &s, 1));
            l2 += view_bytes(&s);
        }
        if (p->e->work[it->op]) {
            uintptr_t w = (uintptr_t)p->e->work[it->op];
            LM_TRY(add_iv(p, w, w + p->e->work_bytes[it->op], 1));
        }
        break;
    }
    }
    const lm_decode_plan_options *o = &p->opt;
    double sm_hbm = o->bandwidth_bytes_per_s / o->full_sms, sm_l2 = o->l2_bytes_per_s / o->full_sms;
    it->cost = o->item_s + it->hbm / sm_hbm + l2 / sm_l2 + it->flops / (o->flops_per_s / o->full_sms);
    return LM_OK;
}

/* Pieces for `total` streamed bytes: every SM one while pieces keep min_item_bytes,
 * more when they pass item_bytes; at most units, parts_cap (when > 0) and
 * max_items_per_sm per SM. */
static int64_t split_parts(const lm_decode_plan *p, double total, int64_t units, int64_t parts_cap) {
    int64_t spread = LM_MIN((int64_t)p->opt.sms, (int64_t)ceil(total / (double)p->opt.min_item_bytes));
    int64_t parts = LM_MAX(spread, (int64_t)ceil(total / (double)p->opt.item_bytes));
    int64_t cap = (int64_t)p->opt.sms * p->opt.max_items_per_sm;
    if (parts_cap > 0 && parts_cap < cap) cap = parts_cap;
    return LM_MAX(1, LM_MIN(parts, LM_MIN(units, cap)));
}

/* Cuts units [lo, hi) of op i (each unit_bytes streamed) into items whose bounds inside
 * the range are multiples of quantum units (a GPU item then covers whole row groups of
 * its GEMV: see LM__DP_ROW_QUANTUM). */
static lm_status split(lm_decode_plan *p, int op, lm__dp_kind kind, int64_t lo, int64_t hi, double unit_bytes,
                       int64_t parts_cap, int64_t quantum) {
    int64_t units = hi - lo, nq = (units + quantum - 1) / quantum;
    int64_t parts = split_parts(p, unit_bytes * (double)units, nq, parts_cap);
    for (int64_t k = 0; k < parts; k++) {
        int64_t a = lo + LM_MIN(units, nq * k / parts * quantum);
        int64_t b = lo + LM_MIN(units, nq * (k + 1) / parts * quantum);
        LM_TRY(new_item(p, op, kind, a, b));
        LM_TRY(footprint(p));
    }
    return LM_OK;
}

static double row_bytes(const lm_decode_plan *p, const lm__gop *op, int w, int scales) {
    const lm_tensor_view *v = view_of(p, op->in[w]);
    double b = (double)v->shape[1] * (double)elem_bytes(v->dtype);
    if (scales >= 0 && op->in[scales] >= 0) {
        const lm_tensor_view *s = view_of(p, op->in[scales]);
        b += (double)(s->ndim == 2 ? s->shape[1] : 1) * (double)elem_bytes(s->dtype);
    }
    return b;
}

/* Heads [h0, h0 + nh) of the q|k|v front (one of its three sections): ranges of whole
 * heads, or, when the bytes call for more pieces than heads, each head cut into ranges
 * of RoPE's pairs (dims k0..k1 with D/2 + k0..k1, at least 8 pairs a piece). */
static lm_status qkv_items(lm_decode_plan *p, int i, int64_t h0, int64_t nh, int64_t D, double head_bytes,
                           int64_t cap) {
    int64_t half = D / 2, parts = split_parts(p, head_bytes * (double)nh, nh * LM_MAX(1, half / 8), cap);
    int64_t per = parts <= nh ? 1 : parts / nh;
    int64_t runs = per > 1 ? nh : parts;
    for (int64_t r = 0; r < runs; r++)
        for (int64_t c = 0; c < per; c++) {
            int64_t a = per > 1 ? h0 + r : h0 + nh * r / runs, b = per > 1 ? a + 1 : h0 + nh * (r + 1) / runs;
            LM_TRY(new_item(p, i, LM__DP_QKV, a, b));
            lm__dp_item *it = &p->items[p->nitems - 1];
            /* inner bounds at multiples of half the row quantum (a pair is two rows) */
            const int64_t pq = LM__DP_ROW_QUANTUM / 2;
            it->k0 = c ? half * c / per / pq * pq : 0, it->k1 = c + 1 < per ? half * (c + 1) / per / pq * pq : half;
            LM_TRY(footprint(p));
        }
    return LM_OK;
}

/* Attention op i by kv heads, or, when its keys call for more pieces, by key chunks
 * of each kv head (partials into part[] at *poff) and one merge per kv head. */
static lm_status attn_items(lm_decode_plan *p, int i, int64_t *poff) {
    const lm__gop *op = &p->g->ops[i];
    const lm__gvalue *q = &p->g->values[op->in[0]];
    int64_t hkv = p->g->values[op->in[1]].dims[1], nc = attn_chunks(p, op);
    if (nc == 1) /* pieces of (row, kv head) units */
        return split(p, i, LM__DP_ATTN, 0, q->dims[0] * hkv, attn_head_bytes(p, op) / (double)q->dims[0], 0, 1);
    int64_t R = attn_row(p, op), ctx = attn_context(p, op);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t h = 0; h < hkv; h++)
            for (int64_t c = 0; c < (pass ? 1 : nc); c++) {
                LM_TRY(new_item(p, i, pass ? LM__DP_ATTN_COMBINE : LM__DP_ATTN_PART, h, h + 1));
                lm__dp_item *it = &p->items[p->nitems - 1];
                it->c = (int32_t)c, it->nc = (int32_t)nc, it->poff = *poff;
                it->k0 = ctx * c / nc, it->k1 = c == nc - 1 ? R : ctx * (c + 1) / nc;
                LM_TRY(footprint(p));
            }
    *poff += q->dims[0] * q->dims[1] * q->dims[2] * nc * (q->dims[3] + 2);
    return LM_OK;
}

static lm_status make_items(lm_decode_plan *p) {
    const lm_graph *g = p->g;
    int64_t poff = 0;
    for (int64_t i = 0; i < g->nops; i++) { /* the partials' buffer first: footprints hold its addresses */
        const lm__gop *op = &g->ops[i];
        if (op->kind != LM__GOP_ATTENTION_CACHE) continue;
        int64_t nc = attn_chunks(p, op);
        const lm__gvalue *q = &g->values[op->in[0]];
        if (nc > 1) p->npart += q->dims[0] * q->dims[1] * q->dims[2] * nc * (q->dims[3] + 2);
    }
    if (p->npart) { /* on the executor's device: a GPU run of the plan writes them there */
        lm_device_caps caps;
        LM_TRY(lm_device_caps_get(p->e->device, &caps));
        if (caps.host_addressable) {
            if (!(p->part = lm__calloc((size_t)p->npart, sizeof *p->part))) return LM_OUT_OF_MEMORY;
        } else {
            LM_TRY(lm_device_alloc(p->e->device, (size_t)p->npart * sizeof *p->part, (void **)&p->part));
            p->part_device = p->e->device, p->part_on_device = 1;
        }
    }
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (lm__gop_is_leaf(op->kind) || lm__gop_is_view(op->kind)) continue;
        int64_t before = p->nitems;
        switch (op->kind) {
        case LM__GOP_LINEAR: {
            const lm__gvalue *o = &g->values[op->out];
            LM_TRY(split(p, (int)i, LM__DP_ROWS, 0, o->dims[o->ndim - 1], row_bytes(p, op, 1, 5), 0,
                         LM__DP_ROW_QUANTUM));
            break;
        }
        case LM__GOP_LINEAR_SWIGLU: {
            const lm__gvalue *o = &g->values[op->out];
            LM_TRY(split(p, (int)i, LM__DP_SWIGLU, 0, o->dims[o->ndim - 1], 2 * row_bytes(p, op, 1, 5), 0,
                         LM__DP_ROW_QUANTUM / 2));
            break;
        }
        case LM__GOP_LINEAR_QKV_ROPE: { /* the three sections apart, parts in proportion */
            int64_t D = g->values[op->out].dims[3], hq = lm__dp_heads_q(op), hkv = g->values[op->in[8]].dims[1];
            double hb = (double)D * row_bytes(p, op, 1, 3);
            int64_t cap = (int64_t)p->opt.sms * p->opt.max_items_per_sm, total = hq + 2 * hkv;
            LM_TRY(qkv_items(p, (int)i, 0, hq, D, hb, LM_MAX(1, cap * hq / total)));
            LM_TRY(qkv_items(p, (int)i, hq, hkv, D, hb, LM_MAX(1, cap * hkv / total)));
            LM_TRY(qkv_items(p, (int)i, hq + hkv, hkv, D, hb, LM_MAX(1, cap * hkv / total)));
            break;
        }
        case LM__GOP_ATTENTION_CACHE: LM_TRY(attn_items(p, (int)i, &poff)); break;
        case LM__GOP_RMSNORM:
        case LM__GOP_ADD_RMSNORM:
        case LM__GOP_SWIGLU: { /* rows: activation bytes decide the pieces */
            const lm__gvalue *o = &g->values[op->out];
            double bytes = 0;
            for (int k = 0; k < op->nin; k++)
                if (op->in[k] >= 0 && lm__dp_row_input(op, k)) bytes += view_bytes(view_of(p, op->in[k]));
            bytes += view_bytes(view_of(p, op->out)) * (op->out2 >= 0 ? 2 : 1);
            LM_TRY(split(p, (int)i, LM__DP_MROWS, 0, o->dims[0], bytes / (double)o->dims[0], 0, 1));
            break;
        }
        default:
            LM_TRY(new_item(p, (int)i, LM__DP_WHOLE, 0, 1));
            LM_TRY(footprint(p));
            break;
        }
        if (p->nitems - before > 1) p->ops_split++;
        else p->ops_whole++;
    }
    for (int64_t k = 0; k < p->nitems; k++) p->hbm_bytes += p->items[k].hbm;
    return LM_OK;
}

/* ---- dependencies --------------------------------------------------------------------------- */

static int cmp_iv(const void *a, const void *b) {
    const lm__dp_iv *x = a, *y = b;
    return x->lo < y->lo ? -1 : x->lo > y->lo ? 1 : (x->item > y->item) - (x->item < y->item);
}

#define BIT(set, i) (((set)[(i) >> 6] >> ((i) & 63)) & 1)

/* Candidates of each item from the accesses before it, in the global order: per
 * elementary byte segment (the footprints' endpoints cut the written storage into
 * them) the last writer and the readers since; a read waits for the last writer, a
 * write for it and those readers (older accesses are ordered through them). Storage
 * no item writes (the weights) cannot conflict and is left out. */
typedef struct seg {
    int32_t writer;
    int32_t nr;
    int64_t cap;
    int32_t *r; /* readers since the last write */
} seg;

static int cmp_uptr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

static int64_t lower_bound(const uintptr_t *E, int64_t n, uintptr_t x) {
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (E[mid] < x) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

static lm_status make_deps(lm_decode_plan *p) {
    int64_t n = p->nitems, words = (n + 63) / 64, nw = 0, ne = 0, nseg = 0, ncand = 0, cap_cand = 0;
    lm__dp_iv *W = lm__alloc((size_t)LM_MAX(p->niv, 1) * sizeof *W, 64);
    unsigned char *rel = lm__calloc((size_t)LM_MAX(p->niv, 1), 1);
    uintptr_t *E = lm__alloc((size_t)LM_MAX(2 * p->niv, 1) * sizeof *E, 64);
    int32_t *stamp = lm__alloc((size_t)LM_MAX(n, 1) * sizeof *stamp, 64), *cand = NULL;
    uint64_t *reach = lm__calloc((size_t)LM_MAX(n * words, 1), sizeof *reach);
    seg *S = NULL;
    lm_status st = W && rel && E && stamp && reach ? LM_OK : LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < p->niv; i++)
        if (p->iv[i].write) W[nw++] = p->iv[i];
    if (st == LM_OK) qsort(W, (size_t)nw, sizeof *W, cmp_iv);
    int64_t m = 0; /* merged, disjoint, ascending */
    for (int64_t i = 0; st == LM_OK && i < nw; i++) {
        if (m && W[i].lo <= W[m - 1].hi) W[m - 1].hi = LM_MAX(W[m - 1].hi, W[i].hi);
        else W[m++] = W[i];
    }
    for (int64_t i = 0; st == LM_OK && i < p->niv; i++) {
        const lm__dp_iv *v = &p->iv[i];
        int64_t lo = 0, hi = m; /* the first merged write ending after v starts */
        while (lo < hi) {
            int64_t mid = (lo + hi) / 2;
            if (W[mid].hi <= v->lo) lo = mid + 1;
            else hi = mid;
        }
        rel[i] = v->write || (lo < m && W[lo].lo < v->hi);
        if (rel[i]) E[ne++] = v->lo, E[ne++] = v->hi;
    }
    if (st == LM_OK) {
        qsort(E, (size_t)ne, sizeof *E, cmp_uptr);
        int64_t u = 0;
        for (int64_t i = 0; i < ne; i++)
            if (!u || E[i] != E[u - 1]) E[u++] = E[i];
        ne = u, nseg = LM_MAX(ne - 1, 0);
        S = lm__calloc((size_t)LM_MAX(nseg, 1), sizeof *S);
        if (!S) st = LM_OUT_OF_MEMORY;
        for (int64_t k = 0; S && k < nseg; k++) S[k].writer = -1;
        for (int64_t k = 0; k < n; k++) stamp[k] = -1;
    }
    for (int64_t b = 0; b < n && st == LM_OK; b++) {
        const lm__dp_item *it = &p->items[b];
        ncand = 0;
        for (int64_t i = it->iv0; i < it->iv0 + it->niv && st == LM_OK; i++) {
            if (!rel[i]) continue;
            int64_t s0 = lower_bound(E, ne, p->iv[i].lo), s1 = lower_bound(E, ne, p->iv[i].hi);
            for (int64_t k = s0; k < s1 && st == LM_OK; k++) {
                int32_t w = S[k].writer;
                if (w >= 0 && stamp[w] != b) {
                    stamp[w] = (int32_t)b;
                    st = LM__PUSH(cand, ncand, cap_cand, w);
                }
                for (int32_t r = 0; p->iv[i].write && r < S[k].nr && st == LM_OK; r++) {
                    int32_t a = S[k].r[r];
                    if (a == b || stamp[a] == b) continue;
                    stamp[a] = (int32_t)b;
                    st = LM__PUSH(cand, ncand, cap_cand, a);
                }
            }
        }
        for (int pass = 0; pass < 2 && st == LM_OK; pass++) /* reads recorded, then writes */
            for (int64_t i = it->iv0; i < it->iv0 + it->niv && st == LM_OK; i++) {
                if (!rel[i] || p->iv[i].write != pass) continue;
                int64_t s0 = lower_bound(E, ne, p->iv[i].lo), s1 = lower_bound(E, ne, p->iv[i].hi);
                for (int64_t k = s0; k < s1 && st == LM_OK; k++) {
                    if (pass) S[k].writer = (int32_t)b, S[k].nr = 0;
                    else if (!S[k].nr || S[k].r[S[k].nr - 1] != b) {
                        int64_t nr = S[k].nr;
                        st = LM__PUSH(S[k].r, nr, S[k].cap, (int32_t)b);
                        S[k].nr = (int32_t)nr;
                    }
                }
            }
        if (st != LM_OK) break;
        /* newest first: a candidate already reachable through a kept one is implied */
        for (int64_t x = 1; x < ncand; x++)
            for (int64_t y = x; y > 0 && cand[y - 1] < cand[y]; y--) {
                int32_t t = cand[y - 1];
                cand[y - 1] = cand[y], cand[y] = t;
            }
        uint64_t *rb = reach + b * words;
        p->items[b].dep0 = p->ndeps;
        for (int64_t x = 0; x < ncand && st == LM_OK; x++) {
            int32_t a = cand[x];
            if (BIT(rb, a)) continue;
            st = LM__PUSH(p->deps, p->ndeps, p->cap_deps, a);
            if (st != LM_OK) break;
            p->items[b].ndep++;
            const uint64_t *ra = reach + (int64_t)a * words;
            for (int64_t w = 0; w <= a / 64; w++) rb[w] |= ra[w];
            rb[a >> 6] |= (uint64_t)1 << (a & 63);
        }
    }
    for (int64_t k = 0; S && k < nseg; k++) lm__free(S[k].r);
    lm__free(S), lm__free(W), lm__free(rel), lm__free(E), lm__free(stamp), lm__free(cand), lm__free(reach);
    return st;
}

/* ---- SM lists: list scheduling in the global order ------------------------------------------------ */

static lm_status make_lists(lm_decode_plan *p) {
    int S = p->opt.sms;
    int64_t n = p->nitems;
    double *free_at = lm__calloc((size_t)S, sizeof *free_at);
    int64_t *count = lm__calloc((size_t)S + 1, sizeof *count);
    p->order = lm__alloc((size_t)LM_MAX(n, 1) * sizeof *p->order, 64);
    p->sm_begin = lm__calloc((size_t)S + 1, sizeof *p->sm_begin);
    if (!free_at || !count || !p->order || !p->sm_begin) {
        lm__free(free_at), lm__free(count);
        return LM_OUT_OF_MEMORY;
    }
    double sm_hbm = p->opt.bandwidth_bytes_per_s / p->opt.full_sms;
    for (int64_t i = 0; i < n; i++) {
        lm__dp_item *it = &p->items[i];
        double best = INFINITY, best_start = 0;
        int bs = 0;
        /* the first prefetch_bytes of the item's weights may stream while it waits */
        double early = fmin(it->hbm, (double)p->opt.prefetch_bytes) / sm_hbm;
        for (int s = 0; s < S; s++) {
            double ready = 0;
            for (int d = 0; d < it->ndep; d++) {
                const lm__dp_item *q = &p->items[p->deps[it->dep0 + d]];
                double t = q->start + q->cost + (q->sm == s ? 0 : p->opt.dep_s);
                if (t > ready) ready = t;
            }
            double start = fmax(free_at[s], ready - early);
            if (start + it->cost < best) best = start + it->cost, best_start = start, bs = s;
        }
        it->sm = bs, it->start = best_start;
        free_at[bs] = best;
        count[bs]++;
        p->busy_s += it->cost;
        if (free_at[bs] > p->step_s) p->step_s = free_at[bs];
    }
    for (int s = 0; s < S; s++) p->sm_begin[s + 1] = p->sm_begin[s] + count[s];
    memset(count, 0, (size_t)S * sizeof *count);
    for (int64_t i = 0; i < n; i++) {
        int s = p->items[i].sm;
        p->order[p->sm_begin[s] + count[s]++] = (int32_t)i;
    }
    lm__free(free_at), lm__free(count);
    return LM_OK;
}

/* ---- waits: the dependencies with op counters ------------------------------------------------------ */

static lm_status make_waits(lm_decode_plan *p) {
    int64_t n = p->nitems, cap = 0, len = 0;
    const lm_graph *g = p->g;
    int32_t *index = lm__alloc((size_t)LM_MAX(g->nops, 1) * sizeof *index, 64);
    p->item_op = lm__alloc((size_t)LM_MAX(n, 1) * sizeof *p->item_op, 64);
    p->op_count = lm__calloc((size_t)LM_MAX(g->nops, 1), sizeof *p->op_count);
    p->wait_begin = lm__alloc((size_t)(n + 1) * sizeof *p->wait_begin, 64);
    int32_t *seen = lm__calloc((size_t)LM_MAX(g->nops, 1), sizeof *seen);
    int32_t *stamp = lm__alloc((size_t)LM_MAX(g->nops, 1) * sizeof *stamp, 64);
    lm_status st = index && p->item_op && p->op_count && p->wait_begin && seen && stamp ? LM_OK : LM_OUT_OF_MEMORY;
    for (int64_t j = 0; st == LM_OK && j < g->nops; j++) index[j] = -1, stamp[j] = -1;
    for (int64_t i = 0; st == LM_OK && i < n; i++) { /* ops numbered densely, in order of first item */
        int32_t o = p->items[i].op;
        if (index[o] < 0) index[o] = p->nops++;
        p->item_op[i] = index[o];
        p->op_count[index[o]]++;
    }
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        const lm__dp_item *it = &p->items[i];
        p->wait_begin[i] = len;
        for (int d = 0; d < it->ndep; d++) { /* dependencies per op */
            int32_t j = p->item_op[p->deps[it->dep0 + d]];
            if (stamp[j] != (int32_t)i) stamp[j] = (int32_t)i, seen[j] = 0;
            seen[j]++;
        }
        for (int d = 0; d < it->ndep && st == LM_OK; d++) {
            int32_t a = p->deps[it->dep0 + d], j = p->item_op[a];
            if (seen[j] < p->op_count[j]) st = LM__PUSH(p->waits, len, cap, a);
            else if (seen[j] == p->op_count[j]) { /* all of op j: one counter wait, pushed once */
                st = LM__PUSH(p->waits, len, cap, -j - 1);
                seen[j] = INT32_MAX;
            }
        }
    }
    if (st == LM_OK) p->wait_begin[n] = len;
    lm__free(index), lm__free(seen), lm__free(stamp);
    return st;
}

/* ---- public ----------------------------------------------------------------------------------------- */

void lm_decode_plan_destroy(lm_decode_plan *p) {
    if (!p) return;
    lm__free(p->items), lm__free(p->deps), lm__free(p->iv), lm__free(p->order), lm__free(p->sm_begin);
    lm__free(p->fview), lm__free(p->item_op), lm__free(p->op_count), lm__free(p->waits), lm__free(p->wait_begin);
    lm__dp_exec_free(p);
    if (p->part_on_device) lm_device_free(p->part_device, p->part);
    else lm__free(p->part);
    lm__free(p);
}

lm_status lm_decode_plan_create(lm_exec *e, const lm_decode_plan_options *o, lm_decode_plan **out) {
    if (!e || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_create: NULL argument");
    *out = NULL;
    lm_decode_plan_options opt;
    if (o) opt = *o;
    else lm_decode_plan_options_default(&opt);
    LM_TRY(check_options(&opt));
    for (int64_t i = 0; i < e->g->nops; i++)
        if (e->g->ops[i].region >= 0)
            return lm__error(LM_UNSUPPORTED, "decode plan: op '%s' sits in a repeat region", e->g->ops[i].name);
    LM_TRY(lm__exec_prepare(e));
    lm_decode_plan *p = lm__calloc(1, sizeof *p);
    if (!p) return LM_OUT_OF_MEMORY;
    p->e = e, p->g = e->g, p->opt = opt, p->resolves = e->resolves;
    lm_status st = footprint_views(p);
    if (st == LM_OK) st = make_items(p);
    if (st == LM_OK) st = make_deps(p);
    if (st == LM_OK) st = make_waits(p);
    if (st == LM_OK) st = make_lists(p);
    if (st != LM_OK) {
        lm_decode_plan_destroy(p);
        return st;
    }
    *out = p;
    return LM_OK;
}

static void item_name(const lm_decode_plan *p, int64_t i, char *buf, size_t n) {
    const lm__dp_item *it = &p->items[i];
    if (it->kind == LM__DP_WHOLE) snprintf(buf, n, "item %lld (%s)", (long long)i, p->g->ops[it->op].name);
    else
        snprintf(buf, n, "item %lld (%s [%lld, %lld))", (long long)i, p->g->ops[it->op].name, (long long)it->lo,
                 (long long)it->hi);
}

/* The waits as a kernel reads them: each names earlier items only (a counter: every item
 * of its op, which must hold op_count items), and together they cover the item's
 * dependencies. */
static lm_status check_waits(const lm_decode_plan *p) {
    int64_t n = p->nitems;
    char a[160], b[160];
    int64_t *first = lm__calloc((size_t)p->nops + 1, sizeof *first);
    int32_t *by_op = lm__alloc((size_t)LM_MAX(n, 1) * sizeof *by_op, 64);
    int32_t *stamp = lm__alloc((size_t)LM_MAX(n, 1) * sizeof *stamp, 64);
    lm_status st = first && by_op && stamp ? LM_OK : LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        if (p->item_op[i] < 0 || p->item_op[i] >= p->nops)
            st = lm__error(LM_INTERNAL, "decode plan check: item %lld has op counter %d of %d", (long long)i,
                           p->item_op[i], p->nops);
        else first[p->item_op[i] + 1]++;
        stamp[i] = -1;
    }
    for (int32_t j = 0; st == LM_OK && j < p->nops; j++) {
        if (first[j + 1] != p->op_count[j])
            st = lm__error(LM_INTERNAL, "decode plan check: op counter %d expects %d items; %lld add to it", j,
                           p->op_count[j], (long long)first[j + 1]);
        first[j + 1] += first[j];
    }
    if (st == LM_OK) { /* items by op, ascending */
        int64_t *fill = lm__alloc((size_t)LM_MAX(p->nops, 1) * sizeof *fill, 64);
        if (!fill) st = LM_OUT_OF_MEMORY;
        for (int32_t j = 0; fill && j < p->nops; j++) fill[j] = first[j];
        for (int64_t i = 0; fill && i < n; i++) by_op[fill[p->item_op[i]]++] = (int32_t)i;
        lm__free(fill);
    }
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        for (int64_t k = p->wait_begin[i]; st == LM_OK && k < p->wait_begin[i + 1]; k++) {
            int32_t w = p->waits[k];
            if (w >= 0) {
                if (w >= i) st = lm__error(LM_INTERNAL, "decode plan check: item %lld waits for item %d, which is not "
                                           "earlier", (long long)i, w);
                else stamp[w] = (int32_t)i;
                continue;
            }
            int32_t j = -w - 1;
            if (j >= p->nops) {
                st = lm__error(LM_INTERNAL, "decode plan check: item %lld waits for op counter %d of %d", (long long)i,
                               j, p->nops);
                break;
            }
            for (int64_t x = first[j]; st == LM_OK && x < first[j + 1]; x++) {
                int32_t q = by_op[x];
                if (q >= i) {
                    item_name(p, i, a, sizeof a);
                    item_name(p, q, b, sizeof b);
                    st = lm__error(LM_INTERNAL, "decode plan check: %s waits for the counter of an op whose %s is not "
                                   "earlier", a, b);
                } else stamp[q] = (int32_t)i;
            }
        }
        const lm__dp_item *it = &p->items[i];
        for (int d = 0; st == LM_OK && d < it->ndep; d++) {
            int32_t q = p->deps[it->dep0 + d];
            if (stamp[q] == (int32_t)i) continue;
            item_name(p, i, a, sizeof a);
            item_name(p, q, b, sizeof b);
            st = lm__error(LM_INTERNAL, "decode plan check: the waits of %s do not cover its dependency on %s", a, b);
        }
    }
    lm__free(first), lm__free(by_op), lm__free(stamp);
    return st;
}

/* The check's own reachability (from the dependency lists as they are) and its own
 * sweep over the footprints: one active list, every pair with a write tested. */
lm_status lm_decode_plan_check(const lm_decode_plan *p) {
    if (!p) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_check: NULL argument");
    int64_t n = p->nitems, words = (n + 63) / 64;
    char a[160], b[160];
    for (int64_t i = 0; i < n; i++) {
        const lm__dp_item *it = &p->items[i];
        for (int d = 0; d < it->ndep; d++) {
            int32_t q = p->deps[it->dep0 + d];
            if (q < 0 || q >= i) {
                item_name(p, i, a, sizeof a);
                return lm__error(LM_INTERNAL, "decode plan check: %s waits for item %d, which is not earlier", a, q);
            }
        }
        if (it->sm < 0 || it->sm >= p->opt.sms) {
            item_name(p, i, a, sizeof a);
            return lm__error(LM_INTERNAL, "decode plan check: %s is on no SM (%d)", a, it->sm);
        }
    }
    LM_TRY(check_waits(p));
    unsigned char *seen = lm__calloc((size_t)LM_MAX(n, 1), 1);
    if (!seen) return LM_OUT_OF_MEMORY;
    lm_status st = LM_OK;
    if (p->sm_begin[0] != 0 || p->sm_begin[p->opt.sms] != n)
        st = lm__error(LM_INTERNAL, "decode plan check: the SM lists hold %lld items of %lld",
                       (long long)(p->sm_begin[p->opt.sms] - p->sm_begin[0]), (long long)n);
    for (int s = 0; st == LM_OK && s < p->opt.sms; s++)
        for (int64_t k = p->sm_begin[s]; st == LM_OK && k < p->sm_begin[s + 1]; k++) {
            int32_t i = p->order[k];
            if (i < 0 || i >= n || seen[i] || p->items[i].sm != s ||
                (k > p->sm_begin[s] && p->order[k - 1] >= i))
                st = lm__error(LM_INTERNAL, "decode plan check: SM %d's list breaks at position %lld (item %d): "
                               "repeated, out of order or placed on another SM", s, (long long)(k - p->sm_begin[s]), i);
            else seen[i] = 1;
        }
    lm__free(seen);
    if (st != LM_OK) return st;
    uint64_t *reach = lm__calloc((size_t)LM_MAX(n * words, 1), sizeof *reach);
    lm__dp_iv *s = lm__alloc((size_t)LM_MAX(p->niv, 1) * sizeof *s, 64);
    int64_t *act = lm__alloc((size_t)LM_MAX(p->niv, 1) * sizeof *act, 64);
    if (!reach || !s || !act) st = LM_OUT_OF_MEMORY;
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        uint64_t *ri = reach + i * words;
        const lm__dp_item *it = &p->items[i];
        for (int d = 0; d < it->ndep; d++) {
            int32_t q = p->deps[it->dep0 + d];
            for (int64_t w = 0; w < words; w++) ri[w] |= reach[(int64_t)q * words + w];
            ri[q >> 6] |= (uint64_t)1 << (q & 63);
        }
    }
    if (st == LM_OK) {
        memcpy(s, p->iv, (size_t)p->niv * sizeof *s);
        qsort(s, (size_t)p->niv, sizeof *s, cmp_iv);
    }
    int64_t na = 0;
    for (int64_t j = 0; st == LM_OK && j < p->niv; j++) {
        int64_t k = 0;
        for (int64_t x = 0; x < na; x++)
            if (s[act[x]].hi > s[j].lo) act[k++] = act[x];
        na = k;
        for (int64_t x = 0; x < na; x++) {
            const lm__dp_iv *u = &s[act[x]], *v = &s[j];
            if (u->item == v->item || (!u->write && !v->write)) continue;
            int32_t lo = LM_MIN(u->item, v->item), hi = LM_MAX(u->item, v->item);
            if (BIT(reach + (int64_t)hi * words, lo)) continue;
            item_name(p, hi, a, sizeof a);
            item_name(p, lo, b, sizeof b);
            const lm__dp_iv *w = u->item == lo ? u : v;
            st = lm__error(LM_INTERNAL, "decode plan check: %s %s bytes %s %s with no chain of dependencies between "
                           "them", a, (u->item == hi ? u : v)->write ? "writes" : "reads", b,
                           w->write ? "writes" : "reads");
            break;
        }
        act[na++] = j;
    }
    lm__free(reach), lm__free(s), lm__free(act);
    return st;
}

lm_status lm_decode_plan_get_stats(const lm_decode_plan *p, lm_decode_plan_stats *out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_get_stats: NULL argument");
    memset(out, 0, sizeof *out);
    out->sms = p->opt.sms;
    out->items = p->nitems;
    for (int64_t i = 0; i < p->nitems; i++) out->deps += p->items[i].ndep;
    out->waits = p->wait_begin[p->nitems];
    out->ops_split = p->ops_split, out->ops_whole = p->ops_whole;
    for (int s = 0; s < p->opt.sms; s++)
        out->max_items_sm = LM_MAX(out->max_items_sm, p->sm_begin[s + 1] - p->sm_begin[s]);
    out->step_s = p->step_s, out->busy_s = p->busy_s, out->hbm_bytes = p->hbm_bytes;
    int used = LM_MIN(p->opt.sms, p->opt.full_sms);
    out->bound_s = p->hbm_bytes / (p->opt.bandwidth_bytes_per_s * used / p->opt.full_sms);
    return LM_OK;
}

lm_status lm_decode_plan_report(const lm_decode_plan *p, char **out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_report: NULL argument");
    *out = NULL;
    int64_t cap = 4096;
    size_t len = 0;
    char *buf = lm__alloc((size_t)cap, 64);
    unsigned char *used = lm__calloc((size_t)p->opt.sms, 1);
    if (!buf || !used) {
        lm__free(buf), lm__free(used);
        return LM_OUT_OF_MEMORY;
    }
    buf[0] = 0;
    for (int64_t i = 0; i < p->nitems;) {
        int64_t j = i;
        double t0 = INFINITY, t1 = 0, hbm = 0;
        int nsm = 0;
        memset(used, 0, (size_t)p->opt.sms);
        for (; j < p->nitems && p->items[j].op == p->items[i].op; j++) {
            const lm__dp_item *it = &p->items[j];
            t0 = fmin(t0, it->start), t1 = fmax(t1, it->start + it->cost), hbm += it->hbm;
            nsm += !used[it->sm];
            used[it->sm] = 1;
        }
        char line[256];
        int k = snprintf(line, sizeof line, "%-40s %-16s items %5lld on %4d SMs  %9.2f .. %9.2f us  %10.0f bytes\n",
                         p->g->ops[p->items[i].op].name, lm__gop_name(p->g->ops[p->items[i].op].kind),
                         (long long)(j - i), nsm, t0 * 1e6, t1 * 1e6, hbm);
        if (lm__reserve((void **)&buf, &cap, (int64_t)(len + (size_t)k + 1), 1) != LM_OK) {
            lm__free(buf), lm__free(used);
            return LM_OUT_OF_MEMORY;
        }
        memcpy(buf + len, line, (size_t)k + 1);
        len += (size_t)k;
        i = j;
    }
    lm__free(used);
    *out = buf;
    return LM_OK;
}

lm_status lm_decode_plan_replay_cuda(const lm_decode_plan *p, int device, int steps, lm_decode_plan_replay *out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_replay_cuda: NULL argument");
    if (steps < 1) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_replay_cuda: steps = %d; expected >= 1", steps);
    memset(out, 0, sizeof *out);
    int64_t n = p->nitems;
    int64_t *dep_begin = lm__alloc((size_t)(n + 1) * sizeof *dep_begin, 64);
    int64_t *bytes = lm__calloc((size_t)LM_MAX(n, 1), sizeof *bytes);
    lm_status st = dep_begin && bytes ? LM_OK : LM_OUT_OF_MEMORY;
    if (st == LM_OK) dep_begin[0] = 0;
    for (int64_t i = 0; st == LM_OK && i < n; i++) { /* the deps are stored item after item */
        dep_begin[i + 1] = dep_begin[i] + p->items[i].ndep;
        bytes[i] = ((int64_t)p->items[i].hbm + 15) / 16 * 16;
        if (p->items[i].dep0 != dep_begin[i]) st = lm__error(LM_INTERNAL, "decode plan replay: dependency lists out of order");
    }
    lm__dp_replay r = {p->opt.sms,  n, p->sm_begin, p->order, dep_begin, p->deps, p->item_op, p->op_count, p->nops,
                       bytes, p->opt.prefetch_bytes, device, steps};
    lm__dp_replay ro = r;
    ro.dep_begin = p->wait_begin, ro.deps = p->waits;
    if (st == LM_OK) st = lm__dp_replay_cuda(&r, &out->step_us, &out->step_us_min);
    if (st == LM_OK) st = lm__dp_replay_cuda(&ro, &out->ops_step_us, &out->ops_step_us_min);
    if (st == LM_OK) memset(bytes, 0, (size_t)LM_MAX(n, 1) * sizeof *bytes);
    if (st == LM_OK) st = lm__dp_replay_cuda(&r, &out->empty_us, &out->empty_us_min);
    if (st == LM_OK) st = lm__dp_replay_cuda(&ro, &out->ops_empty_us, &out->ops_empty_us_min);
    if (st == LM_OK) out->steps = steps, out->waits = dep_begin[n], out->ops_waits = p->wait_begin[n];
    lm__free(dep_begin), lm__free(bytes);
    return st;
}

lm_status lm_decode_plan_run_cuda(lm_decode_plan *p, lm_ctx *ctx) {
    if (!p || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_run_cuda: NULL argument");
    LM_TRY(lm__dp_exec_enqueue(p, ctx));
    return lm__dp_exec_finish(p, ctx);
}

lm_status lm_decode_plan_time_cuda(lm_decode_plan *p, lm_ctx *ctx, int steps, lm_decode_plan_timing *out) {
    if (!p || !ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_time_cuda: NULL argument");
    if (steps < 1) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_time_cuda: steps = %d; expected >= 1", steps);
    memset(out, 0, sizeof *out);
    LM_TRY(lm_decode_plan_run_cuda(p, ctx)); /* the tables, and one untimed step of each */
    LM_TRY(lm_exec_run(p->e, ctx));
    LM_TRY(lm_ctx_synchronize(ctx));
    const int poison = p->e->opt.poison;
    p->e->opt.poison = 0; /* a fill of the arena is not part of a step */
    lm_status st = LM_OK;
    for (int round = 0; round < 2 && st == LM_OK; round++) { /* plan, executor, plan, executor */
        double t0 = lm__now_seconds();
        for (int k = 0; k < steps && st == LM_OK; k++) st = lm__dp_exec_enqueue(p, ctx);
        if (st == LM_OK) st = lm__dp_exec_finish(p, ctx);
        double t1 = lm__now_seconds();
        for (int k = 0; k < steps && st == LM_OK; k++) st = lm_exec_run(p->e, ctx);
        if (st == LM_OK) st = lm_ctx_synchronize(ctx);
        double t2 = lm__now_seconds();
        double a = (t1 - t0) * 1e6 / steps, b = (t2 - t1) * 1e6 / steps;
        out->plan_us = round ? LM_MIN(out->plan_us, a) : a;
        out->exec_us = round ? LM_MIN(out->exec_us, b) : b;
    }
    p->e->opt.poison = poison;
    out->steps = steps;
    return st;
}

lm_status lm_decode_plan_profile_cuda(lm_decode_plan *p, lm_ctx *ctx, char **out) {
    if (!p || !ctx || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_decode_plan_profile_cuda: NULL argument");
    return lm__dp_exec_profile(p, ctx, out);
}
