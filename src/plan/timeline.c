/* plan/timeline.c — the per-tile timeline of a plan as one self-contained HTML page
 * (lm_plan_timeline_html): the data as JSON in a <script> element, drawn by a small
 * inline script on a canvas; no external resources.
 *
 * The schedule is derived from the low program with the simulator's timing rules
 * (sim.c): consecutive compute steps form one superstep in which each tile runs its
 * calls back to back from the superstep's start, and the superstep lasts as long as
 * its busiest tile; an exchange phase is the sync barrier (every tile) followed by its
 * slots, each as long as its longest transfer, in which a tile sends and receives at
 * most one stream each. Repeats are unrolled. Every other interval of a tile is idle.
 * Invariants: per tile the spans are ordered, disjoint and inside [0, total]; with a
 * simulation the total equals its cycles (else LM_INTERNAL). The gap to the compute
 * bound is split along the critical path (the busiest tile of each superstep, the
 * longest transfer of each slot), so its categories add up to the total exactly.
 * Output: span types (category, cycles, label, step, iteration, bytes) are interned;
 * tiles with identical (start, type) sequences share one row (a group, expandable in
 * the page) listing runs "idle gap, type, count" of back-to-back spans (GEMM 4096^3 on
 * ipu21: 3.4 M spans, 1,409 groups, 6 MB). O(spans + tiles log tiles), 16 B per span.
 */
#include "plan/low.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { CAT_MATMUL, CAT_KERNEL, CAT_EXCHANGE, CAT_SYNC, CAT_CRIT = 4 };

/* Span labels: the kernels (UNARY and BINARY split by their function), then the two
 * non-kernel spans. */
enum {
    L_MATMUL, L_BIAS, L_GELU, L_SILU, L_ADD, L_MUL, L_SWIGLU, L_SOFTMAX, L_LAYERNORM, L_RMSNORM, L_COPY, L_REDUCE,
    L_FLASH_INIT, L_FLASH_UPDATE, L_FLASH_COMBINE, L_FLASH_FINAL, L_ROPE, L_EXCHANGE, L_SYNC, L_COUNT
};
static const char *const label_names[L_COUNT] = {
    "matmul", "bias_add", "gelu", "silu", "add", "mul", "swiglu", "softmax", "layer_norm", "rms_norm",
    "copy", "reduce", "flash_init", "flash_update", "flash_combine", "flash_final", "rope", "exchange", "sync"};

/* The gap to the compute bound, per category, along the critical path (the
 * categories are lm__plan_gap's, low.h). */
static const char *const gap_keys[G_COUNT] = {"bound",    "mm_work",    "mm_call", "mm_pass",  "padding",
                                              "kernels",  "reductions", "copies",  "exchange", "sync"};
static const char *const gap_labels[G_COUNT] = {
    "compute bound (matmul FLOPs at the matrix units' peak on every tile)",
    "matmul work above the bound (uneven split, idle tiles, matmuls the bound does not count)",
    "matmul call overheads",
    "matmul weight-pass overheads (fixed cost per grain of weights loaded)",
    "padding (matmul shapes rounded up to the matrix unit's grain)",
    "other kernels (bias, activations, norms, softmax, RoPE, attention updates)",
    "reductions (partial-sum exchange and add kernels)",
    "layout conversions (on-tile copies)",
    "exchange (other than reductions)",
    "sync barriers"};

/* Per-tile accumulators of the open superstep. */
enum { A_MM, A_MM_PEAK, A_MM_CALL, A_MM_PASS, A_MM_PAD, A_KERNEL, A_REDUCE, A_COPY, A_COUNT };

/* What a span is, apart from its tile and start. */
typedef struct stype {
    double dur;     /* cycles */
    int64_t iter;   /* repeat iteration */
    int64_t b0, b1; /* compute: operand bytes, matmul FLOPs; exchange: bytes sent, bytes received */
    int32_t step;
    int16_t label;
    int8_t cat; /* CAT_* | CAT_CRIT */
} stype;

typedef struct span {
    double start;
    int32_t tile, type;
} span;

typedef struct tl_phase {
    int kind; /* 0 compute superstep, 1 exchange phase */
    int32_t step;
    int64_t iter;
    double start, dur, sync;
    int64_t bytes;
} tl_phase;

typedef struct tl {
    const lm_plan *p;
    const lm__plan_low *low;
    span *sp; /* [nsp] in time order per tile */
    int64_t nsp, cap_sp;
    stype *ty; /* [nty] interned */
    int64_t nty, cap_ty;
    int32_t *tyhash; /* [tyslots] open addressing: type index or -1 */
    int64_t tyslots;
    tl_phase *ph; /* [nph] */
    int64_t nph, cap_ph;
    double clock;
    int64_t iter;
    int open;            /* a compute superstep is open */
    int32_t open_step;   /* its first step */
    int64_t open_sp;     /* its first span */
    double *cur;         /* [tiles] busy cycles in the open superstep */
    double *acc;         /* [tiles][A_COUNT] of which per category */
    double gap[G_COUNT]; /* along the critical path */
    double *xd;          /* [tiles] exchange slot scratch: a tile's longest stream, */
    int64_t *xsb, *xrb;  /* [tiles] bytes it sends and receives, */
    int8_t *mark;        /* [tiles] whether it takes part in the slot */
    int32_t *touched;    /* [tiles] the tiles taking part */
} tl;

static uint64_t mix(uint64_t h, uint64_t v) {
    h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h * 0xff51afd7ed558ccdull;
}

static uint64_t dbits(double d) {
    uint64_t u;
    memcpy(&u, &d, sizeof u);
    return u;
}

static uint64_t type_hash(const stype *t) {
    uint64_t h = mix(dbits(t->dur), (uint64_t)t->iter);
    h = mix(h, (uint64_t)t->b0), h = mix(h, (uint64_t)t->b1);
    return mix(h, (uint64_t)(uint32_t)t->step << 24 ^ (uint64_t)(uint16_t)t->label << 8 ^ (uint64_t)(uint8_t)t->cat);
}

static int type_same(const stype *a, const stype *b) {
    return a->dur == b->dur && a->iter == b->iter && a->b0 == b->b0 && a->b1 == b->b1 && a->step == b->step &&
           a->label == b->label && a->cat == b->cat;
}

/* The index of type t, added when new (the table stays at most half full). */
static lm_status intern(tl *T, const stype *t, int32_t *out) {
    if (2 * (T->nty + 1) > T->tyslots) {
        int64_t n = T->tyslots ? 2 * T->tyslots : 1024;
        int32_t *h = lm__alloc(sizeof(int32_t) * (size_t)n, 16);
        if (!h) return LM_OUT_OF_MEMORY;
        for (int64_t i = 0; i < n; i++) h[i] = -1;
        for (int64_t i = 0; i < T->nty; i++) {
            uint64_t k = type_hash(&T->ty[i]) & (uint64_t)(n - 1);
            while (h[k] >= 0) k = (k + 1) & (uint64_t)(n - 1);
            h[k] = (int32_t)i;
        }
        lm__free(T->tyhash);
        T->tyhash = h, T->tyslots = n;
    }
    uint64_t k = type_hash(t) & (uint64_t)(T->tyslots - 1);
    for (; T->tyhash[k] >= 0; k = (k + 1) & (uint64_t)(T->tyslots - 1))
        if (type_same(&T->ty[T->tyhash[k]], t)) {
            *out = T->tyhash[k];
            return LM_OK;
        }
    if (T->nty >= INT32_MAX) return LM_OUT_OF_MEMORY;
    LM_TRY(LM__PUSH(T->ty, T->nty, T->cap_ty, *t));
    T->tyhash[k] = (int32_t)(T->nty - 1);
    *out = (int32_t)(T->nty - 1);
    return LM_OK;
}

static lm_status add_span(tl *T, int64_t tile, double start, const stype *t) {
    span s = {start, (int32_t)tile, 0};
    LM_TRY(intern(T, t, &s.type));
    return LM__PUSH(T->sp, T->nsp, T->cap_sp, s);
}

/* Marks span i critical (its type with CAT_CRIT). */
static lm_status mark_critical(tl *T, int64_t i) {
    stype t = T->ty[T->sp[i].type];
    if (t.cat & CAT_CRIT) return LM_OK;
    t.cat |= CAT_CRIT;
    return intern(T, &t, &T->sp[i].type);
}

static int call_label(const lm__plan_call *c) {
    switch ((lm__plan_kk)c->kernel) {
    case LM__PLAN_K_MATMUL: return L_MATMUL;
    case LM__PLAN_K_BIAS: return L_BIAS;
    case LM__PLAN_K_UNARY: return c->i[0] ? L_SILU : L_GELU;
    case LM__PLAN_K_BINARY: return c->i[0] == 2 ? L_SWIGLU : c->i[0] == 1 ? L_MUL : L_ADD;
    case LM__PLAN_K_SOFTMAX: return L_SOFTMAX;
    case LM__PLAN_K_LAYERNORM: return L_LAYERNORM;
    case LM__PLAN_K_RMSNORM: return L_RMSNORM;
    case LM__PLAN_K_COPY: return L_COPY;
    case LM__PLAN_K_REDUCE: return L_REDUCE;
    case LM__PLAN_K_FLASH_INIT: return L_FLASH_INIT;
    case LM__PLAN_K_FLASH_UPDATE: return L_FLASH_UPDATE;
    case LM__PLAN_K_FLASH_COMBINE: return L_FLASH_COMBINE;
    case LM__PLAN_K_FLASH_FINAL: return L_FLASH_FINAL;
    case LM__PLAN_K_ROPE: return L_ROPE;
    default: return L_COPY;
    }
}

/* Bytes a call reads and writes: its operand boxes (a reduction's pieces counted each). */
static int64_t call_bytes(const lm__plan_call *c) {
    int64_t n = 0;
    for (int k = 0; k < 4; k++) {
        if (c->op[k].buf < 0) continue;
        int64_t times = 1;
        if ((c->kernel == LM__PLAN_K_REDUCE && k == 2) || (c->kernel == LM__PLAN_K_FLASH_COMBINE && k == 1))
            times = c->i[0] > 1 ? c->i[0] : 1;
        n += times * lm__plan_opnd_elems(&c->op[k]) * (int64_t)lm_dtype_size(c->op[k].dtype);
    }
    return n;
}

static lm_status push_phase(tl *T, int kind, int32_t step, double dur, double sync, int64_t bytes) {
    tl_phase ph = {kind, step, T->iter, T->clock, dur, sync, bytes};
    T->clock += dur;
    return LM__PUSH(T->ph, T->nph, T->cap_ph, ph);
}

static int mop_kind(const lm_plan *p, int32_t mop) {
    return mop >= 0 && mop < p->mid.nops ? (int)p->mid.ops[mop].kind : -1;
}

/* Ends the open superstep: its length is the busiest tile's; that tile's spans are
 * critical (all tied tiles are marked) and its cycles go into the gap categories. */
static lm_status close_compute(tl *T) {
    if (!T->open) return LM_OK;
    int64_t tiles = T->low->tiles, crit = 0;
    double mx = 0;
    for (int64_t t = 0; t < tiles; t++)
        if (T->cur[t] > mx) mx = T->cur[t], crit = t;
    for (int64_t i = T->open_sp; i < T->nsp; i++)
        if (T->cur[T->sp[i].tile] == mx) LM_TRY(mark_critical(T, i));
    const double *a = T->acc + crit * A_COUNT;
    T->gap[G_MM_WORK] += a[A_MM] - a[A_MM_CALL] - a[A_MM_PASS] - a[A_MM_PAD]; /* the row work */
    T->gap[G_MM_CALL] += a[A_MM_CALL];
    T->gap[G_MM_PASS] += a[A_MM_PASS];
    T->gap[G_MM_PAD] += a[A_MM_PAD];
    T->gap[G_KERNEL] += a[A_KERNEL];
    T->gap[G_REDUCE] += a[A_REDUCE];
    T->gap[G_COPY] += a[A_COPY];
    memset(T->cur, 0, sizeof(double) * (size_t)tiles);
    memset(T->acc, 0, sizeof(double) * (size_t)(tiles * A_COUNT));
    T->open = 0;
    return push_phase(T, 0, T->open_step, mx, 0, 0);
}

static lm_status compute_step(tl *T, int64_t si) {
    const lm__plan_low *low = T->low;
    const lm__plan_step *st = &low->steps[si];
    const lm_plan_machine *m = &T->p->m;
    if (st->c1 == st->c0) return LM_OK;
    if (!T->open) T->open = 1, T->open_step = (int32_t)si, T->open_sp = T->nsp;
    int reduce_op = mop_kind(T->p, st->mop) == LM__PLAN_M_REDUCE;
    for (int64_t i = st->c0; i < st->c1; i++) {
        const lm__plan_call *c = &low->calls[i];
        stype y;
        memset(&y, 0, sizeof y);
        y.step = (int32_t)si, y.iter = T->iter, y.dur = c->cycles;
        y.label = (int16_t)call_label(c);
        y.cat = c->kernel == LM__PLAN_K_MATMUL ? CAT_MATMUL : CAT_KERNEL;
        y.b0 = call_bytes(c);
        double *a = T->acc + (int64_t)c->tile * A_COUNT;
        if (c->kernel == LM__PLAN_K_MATMUL) {
            double flops = 2.0 * (double)c->op[2].dims[0] * (double)c->op[2].dims[1] * (double)c->op[2].dims[2] *
                           (double)c->op[0].dims[2];
            double rate = c->op[0].dtype == LM_F32 ? m->mm_flops_f32 : m->mm_flops_f16;
            y.b1 = (int64_t)flops;
            double parts[LM__PLAN_MM_PARTS];
            lm__plan_cost_matmul_parts(m, c->op[0].dtype, c->op[2].dims[0], c->op[2].dims[1], c->op[2].dims[2],
                                       c->op[0].dims[2], parts);
            a[A_MM] += c->cycles;
            a[A_MM_PEAK] += rate > 0 ? fmin(c->cycles, flops / rate) : 0;
            a[A_MM_CALL] += parts[LM__PLAN_MM_CALL];
            a[A_MM_PASS] += parts[LM__PLAN_MM_PASS];
            a[A_MM_PAD] += parts[LM__PLAN_MM_PAD];
        } else if (c->kernel == LM__PLAN_K_REDUCE || c->kernel == LM__PLAN_K_FLASH_COMBINE || reduce_op) {
            a[A_REDUCE] += c->cycles;
        } else if (c->kernel == LM__PLAN_K_COPY) {
            a[A_COPY] += c->cycles;
        } else {
            a[A_KERNEL] += c->cycles;
        }
        LM_TRY(add_span(T, c->tile, T->clock + T->cur[c->tile], &y));
        T->cur[c->tile] += c->cycles;
    }
    return LM_OK;
}

static int cmp_slot(const void *a, const void *b) {
    const int64_t *x = a, *y = b; /* pairs (slot, transfer) */
    return x[0] != y[0] ? (x[0] < y[0] ? -1 : 1) : (x[1] < y[1] ? -1 : x[1] > y[1]);
}

/* The spans of one slot of step si: transfers order[2*i0+1], ..., order[2*(i1-1)+1],
 * starting at slot0; the slot's length goes to *len. */
static lm_status exchange_slot(tl *T, int64_t si, const int64_t *order, int64_t i0, int64_t i1, double slot0,
                               double *len) {
    const lm__plan_low *low = T->low;
    const lm_plan_machine *m = &T->p->m;
    int64_t nt = 0;
    double smax = 0;
    for (int64_t j = i0; j < i1; j++) {
        const lm__plan_xfer *x = &low->xfers[order[2 * j + 1]];
        double d = (double)x->bytes / m->exch_bytes_per_cycle + (double)m->msg_cycles;
        smax = fmax(smax, d);
        for (int32_t k = -1; k < x->ndst; k++) {
            int32_t t = k < 0 ? x->src_tile : low->xdst[x->dst0 + k].tile;
            if (!T->mark[t]) T->mark[t] = 1, T->touched[nt++] = t;
            T->xd[t] = fmax(T->xd[t], d);
            if (k < 0)
                T->xsb[t] += x->bytes;
            else
                T->xrb[t] += x->bytes;
        }
    }
    lm_status e = LM_OK;
    for (int64_t k = 0; k < nt; k++) {
        int32_t t = T->touched[k];
        stype y;
        memset(&y, 0, sizeof y);
        y.step = (int32_t)si, y.iter = T->iter, y.dur = T->xd[t], y.label = L_EXCHANGE;
        y.cat = (int8_t)(CAT_EXCHANGE | (T->xd[t] == smax ? CAT_CRIT : 0));
        y.b0 = T->xsb[t], y.b1 = T->xrb[t];
        T->xd[t] = 0, T->xsb[t] = T->xrb[t] = 0, T->mark[t] = 0;
        if (e == LM_OK) e = add_span(T, t, slot0, &y);
    }
    *len = smax;
    return e;
}

static lm_status exchange_step(tl *T, int64_t si) {
    const lm__plan_low *low = T->low;
    const lm__plan_step *st = &low->steps[si];
    LM_TRY(close_compute(T));
    int64_t nx = st->x1 - st->x0, bytes = 0;
    double sync = nx > 0 ? (double)T->p->m.sync_cycles : 0, total = 0;
    int64_t *order = nx ? lm__alloc(sizeof(int64_t) * 2 * (size_t)nx, 16) : NULL;
    if (nx && !order) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < nx; i++) {
        order[2 * i] = low->xfers[st->x0 + i].slot, order[2 * i + 1] = st->x0 + i;
        bytes += low->xfers[st->x0 + i].bytes * low->xfers[st->x0 + i].ndst;
    }
    if (nx) qsort(order, (size_t)nx, 2 * sizeof(int64_t), cmp_slot);
    lm_status e = LM_OK;
    if (sync > 0) {
        stype y;
        memset(&y, 0, sizeof y);
        y.step = (int32_t)si, y.iter = T->iter, y.dur = sync, y.label = L_SYNC, y.cat = CAT_SYNC | CAT_CRIT;
        for (int64_t t = 0; t < low->tiles && e == LM_OK; t++) e = add_span(T, t, T->clock, &y);
    }
    for (int64_t i = 0; i < nx && e == LM_OK;) {
        int64_t j = i;
        while (j < nx && order[2 * j] == order[2 * i]) j++;
        double len = 0;
        e = exchange_slot(T, si, order, i, j, T->clock + sync + total, &len);
        total += len;
        i = j;
    }
    lm__free(order);
    LM_TRY(e);
    T->gap[mop_kind(T->p, st->mop) == LM__PLAN_M_REDUCE ? G_REDUCE : G_EXCH] += total;
    T->gap[G_SYNC] += sync;
    return push_phase(T, 1, (int32_t)si, total + sync, sync, bytes);
}

/* Walks the program exactly like the simulator's execute() (sim.c). */
static lm_status schedule(tl *T) {
    const lm__plan_low *low = T->low;
    for (int64_t si = 0; si < low->nsteps; si++) {
        const lm__plan_step *st = &low->steps[si];
        switch (st->kind) {
        case LM__PLAN_S_COMPUTE: LM_TRY(compute_step(T, si)); break;
        case LM__PLAN_S_EXCHANGE: LM_TRY(exchange_step(T, si)); break;
        case LM__PLAN_S_CHECK: break;
        case LM__PLAN_S_REPEAT: T->iter = 0; break;
        case LM__PLAN_S_END:
            if (++T->iter < low->steps[st->match].count)
                si = st->match;
            else
                T->iter = 0;
            break;
        }
    }
    return close_compute(T);
}

/* ---- output ------------------------------------------------------------------------------------ */
typedef struct tile_key {
    uint64_t hash;
    int64_t tile;
} tile_key;

static int cmp_key(const void *a, const void *b) {
    const tile_key *x = a, *y = b;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return x->tile < y->tile ? -1 : x->tile > y->tile;
}

static void jnum(lm__plan_sbuf *b, double v) {
    if (!isfinite(v))
        lm__plan_sbuf_printf(b, "0");
    else if (v == floor(v) && fabs(v) < 1e15)
        lm__plan_sbuf_printf(b, "%.0f", v);
    else
        lm__plan_sbuf_printf(b, "%.12g", v);
}

/* A JSON string safe inside <script>: '<', '>' and '&' are escaped too. */
static void jstr(lm__plan_sbuf *b, const char *s) {
    lm__plan_sbuf_printf(b, "\"");
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            lm__plan_sbuf_printf(b, "\\%c", c);
        else if (c < 0x20 || c == '<' || c == '>' || c == '&')
            lm__plan_sbuf_printf(b, "\\u%04x", (unsigned)c);
        else
            lm__plan_sbuf_printf(b, "%c", c);
    }
    lm__plan_sbuf_printf(b, "\"");
}

/* An ascending tile list as strided runs [first, last, stride, ...] (first..last every
 * stride-th tile; a single tile has stride 1): layouts place shards with tile strides. */
static void tile_ranges(lm__plan_sbuf *b, const int64_t *t, int64_t n) {
    lm__plan_sbuf_printf(b, "[");
    for (int64_t i = 0; i < n;) {
        int64_t j = i, d = i + 1 < n ? t[i + 1] - t[i] : 1;
        while (j + 1 < n && t[j + 1] - t[j] == d) j++;
        if (j == i) d = 1;
        lm__plan_sbuf_printf(b, "%s%lld,%lld,%lld", i ? "," : "", (long long)t[i], (long long)t[j], (long long)d);
        i = j + 1;
    }
    lm__plan_sbuf_printf(b, "]");
}

static const char *mop_label(const lm_plan *p, int64_t i) {
    const lm__plan_mop *o = &p->mid.ops[i];
    if (o->gop >= 0 && o->gop < p->g->nops) return p->g->ops[o->gop].name;
    if (o->out >= 0 && o->out < p->mid.nvals) {
        int v = p->mid.vals[o->out].value;
        if (v >= 0 && v < p->g->nvalues) return p->g->values[v].name;
    }
    return "";
}

static int graph_has(const lm_plan *p, lm__gopk k) {
    for (int64_t i = 0; i < p->g->nops; i++)
        if (p->g->ops[i].kind == k) return 1;
    return 0;
}

/* Everything but the groups: title, totals, names, phases, span types, the gap. */
static double gap_value(const tl *T, int g) {
    double bound = T->p->summary.lower_bound_cycles;
    return g == G_BOUND ? bound : g == G_MM_WORK ? T->gap[g] - bound : T->gap[g];
}

static void emit_header(const tl *T, const lm_plan_sim *s, lm__plan_sbuf *b) {
    const lm_plan *p = T->p;
    char title[200];
    size_t k = (size_t)snprintf(title, sizeof title, "plan on %s", p->m.name);
    int nout = 0;
    for (int64_t i = 0; i < p->g->nvalues && k < sizeof title; i++)
        if (p->g->values[i].output)
            k += (size_t)snprintf(title + k, sizeof title - k, "%s%s", nout++ ? ", " : " (output ",
                                  p->g->values[i].name);
    if (nout && k < sizeof title) snprintf(title + k, sizeof title - k, ")");
    lm__plan_sbuf_printf(b, "{\"version\":1,\"title\":");
    jstr(b, title);
    lm__plan_sbuf_printf(b, ",\"machine\":");
    jstr(b, p->m.name);
    lm__plan_sbuf_printf(b, ",\"tiles\":%lld,\"clock_hz\":", (long long)T->low->tiles);
    jnum(b, p->m.clock_hz);
    lm__plan_sbuf_printf(b, ",\"source\":\"%s\",\"total\":", s ? "simulation" : "predicted");
    jnum(b, T->clock);
    lm__plan_sbuf_printf(b, ",\"bound\":");
    jnum(b, p->summary.lower_bound_cycles);
    lm__plan_sbuf_printf(b, ",\"predicted\":");
    jnum(b, p->summary.predicted_cycles);
    lm__plan_sbuf_printf(b, ",\"labels\":[");
    for (int i = 0; i < L_COUNT; i++) lm__plan_sbuf_printf(b, "%s\"%s\"", i ? "," : "", label_names[i]);
    lm__plan_sbuf_printf(b, "],\"mops\":[");
    for (int64_t i = 0; i < p->mid.nops; i++) {
        lm__plan_sbuf_printf(b, "%s[\"%s\",", i ? "," : "", lm__plan_mid_kind_name(p->mid.ops[i].kind));
        jstr(b, mop_label(p, i));
        lm__plan_sbuf_printf(b, "]");
    }
    lm__plan_sbuf_printf(b, "],\"steps\":[");
    for (int64_t i = 0; i < T->low->nsteps; i++) {
        const lm__plan_step *st = &T->low->steps[i];
        lm__plan_sbuf_printf(b, "%s[%d,", i ? "," : "", st->mop >= 0 && st->mop < p->mid.nops ? st->mop : -1);
        char lab[sizeof st->label + 1];
        memcpy(lab, st->label, sizeof st->label);
        lab[sizeof st->label] = 0;
        jstr(b, lab);
        lm__plan_sbuf_printf(b, "]");
    }
    /* phases: kind, start, cycles, sync, step, iteration, bytes */
    lm__plan_sbuf_printf(b, "],\"phases\":[");
    for (int64_t i = 0; i < T->nph; i++) {
        const tl_phase *ph = &T->ph[i];
        lm__plan_sbuf_printf(b, "%s%d,", i ? "," : "", ph->kind);
        jnum(b, ph->start);
        lm__plan_sbuf_printf(b, ",");
        jnum(b, ph->dur);
        lm__plan_sbuf_printf(b, ",");
        jnum(b, ph->sync);
        lm__plan_sbuf_printf(b, ",%d,%lld,%lld", ph->step, (long long)ph->iter, (long long)ph->bytes);
    }
    /* span types: category (| 4 critical), cycles, label, step, iteration, b0, b1 */
    lm__plan_sbuf_printf(b, "],\"types\":[");
    for (int64_t i = 0; i < T->nty; i++) {
        const stype *y = &T->ty[i];
        lm__plan_sbuf_printf(b, "%s%d,", i ? "," : "", y->cat);
        jnum(b, y->dur);
        lm__plan_sbuf_printf(b, ",%d,%d,%lld,%lld,%lld", y->label, y->step, (long long)y->iter, (long long)y->b0,
                             (long long)y->b1);
    }
    lm__plan_sbuf_printf(b, "],\"gap\":[");
    double bound = p->summary.lower_bound_cycles;
    for (int g = 0; g < G_COUNT; g++) {
        double v = gap_value(T, g);
        lm__plan_sbuf_printf(b, "%s[\"%s\",\"%s\",", g ? "," : "", gap_keys[g], gap_labels[g]);
        jnum(b, v);
        lm__plan_sbuf_printf(b, "]");
    }
    lm__plan_sbuf_printf(b, "],\"notes\":[");
    lm__plan_sbuf_printf(b, "\"padding counts the matrix unit's grain rounding; shards are cut to the real extent, "
                            "so an uneven split shows as matmul work above the bound.\"");
    if (graph_has(p, LM__GOP_ATTENTION))
        lm__plan_sbuf_printf(b, ",\"the compute bound counts the graph's matmuls only: attention's inner products "
                                "are in 'matmul work above the bound'.\"");
    if (bound <= 0)
        lm__plan_sbuf_printf(b, ",\"no matmul in the graph: no compute bound; matmul work is counted from zero.\"");
    if (fabs(p->summary.predicted_cycles - T->clock) > 0.5)
        lm__plan_sbuf_printf(b, ",\"the planner's estimate (its mid-program cost model) differs from this schedule, "
                                "which follows the low program's kernel calls and transfers.\"");
    lm__plan_sbuf_printf(b, "]");
}

/* One group's spans as runs: idle cycles since the previous run's end, type, count of
 * back-to-back spans of that type. */
static void emit_runs(const tl *T, const int64_t *idx, int64_t n, lm__plan_sbuf *b) {
    double end = 0;
    for (int64_t i = 0; i < n;) {
        const span *s = &T->sp[idx[i]];
        double d = T->ty[s->type].dur, e = s->start + d;
        int64_t j = i + 1;
        while (j < n && T->sp[idx[j]].type == s->type && T->sp[idx[j]].start == e) e += d, j++;
        double idle = s->start - end; /* >= 0 up to rounding */
        lm__plan_sbuf_printf(b, "%s", i ? "," : "");
        jnum(b, idle > 1e-6 ? idle : 0);
        lm__plan_sbuf_printf(b, ",%d,%lld", s->type, (long long)(j - i));
        end = s->start + (double)(j - i) * d; /* the page's arithmetic */
        i = j;
    }
}

static lm_status emit(tl *T, const lm_plan_sim *s, lm__plan_sbuf *b) {
    int64_t tiles = T->low->tiles;
    /* span indices by tile (stable: time order per tile kept) */
    int64_t *ts = lm__calloc((size_t)tiles + 1, sizeof(int64_t));
    int64_t *idx = lm__alloc(sizeof(int64_t) * (size_t)(T->nsp ? T->nsp : 1), 16);
    tile_key *key = lm__alloc(sizeof(tile_key) * (size_t)tiles, 16);
    int64_t *group = lm__alloc(sizeof(int64_t) * (size_t)tiles, 16);   /* a tile's group (its first tile) */
    int64_t *members = lm__alloc(sizeof(int64_t) * (size_t)tiles, 16); /* scratch: tiles of one group */
    int64_t *next = lm__alloc(sizeof(int64_t) * (size_t)tiles, 16);    /* next tile of the same group */
    double *end = lm__calloc((size_t)tiles, sizeof(double));            /* a tile's last busy cycle */
    lm_status st = ts && idx && key && group && members && next && end ? LM_OK : LM_OUT_OF_MEMORY;
    if (st == LM_OK) {
        for (int64_t i = 0; i < T->nsp; i++) ts[T->sp[i].tile + 1]++;
        for (int64_t t = 0; t < tiles; t++) ts[t + 1] += ts[t];
        for (int64_t t = 0; t < tiles; t++) members[t] = ts[t];
        for (int64_t i = 0; i < T->nsp; i++) idx[members[T->sp[i].tile]++] = i;
        for (int64_t t = 0; t < tiles; t++) {
            uint64_t h = mix(0, (uint64_t)(ts[t + 1] - ts[t]));
            for (int64_t i = ts[t]; i < ts[t + 1]; i++) {
                const span *x = &T->sp[idx[i]];
                h = mix(mix(h, dbits(x->start)), (uint64_t)x->type);
                if ((T->ty[x->type].cat & 3) != CAT_SYNC) end[t] = fmax(end[t], x->start + T->ty[x->type].dur);
            }
            key[t].hash = h, key[t].tile = t;
        }
        qsort(key, (size_t)tiles, sizeof *key, cmp_key);
        /* within a run of equal hashes, a tile joins the first earlier tile with the same spans */
        for (int64_t i = 0; i < tiles; i++) {
            int64_t t = key[i].tile;
            group[t] = t, next[t] = -1;
            for (int64_t j = i - 1; j >= 0 && key[j].hash == key[i].hash; j--) {
                int64_t u = key[j].tile;
                if (group[u] != u || ts[t + 1] - ts[t] != ts[u + 1] - ts[u]) continue;
                int same = 1;
                for (int64_t k = 0; same && k < ts[t + 1] - ts[t]; k++) {
                    const span *x = &T->sp[idx[ts[t] + k]], *y = &T->sp[idx[ts[u] + k]];
                    same = x->start == y->start && x->type == y->type;
                }
                if (same) {
                    group[t] = u;
                    break;
                }
            }
        }
        /* member lists in ascending tile order: members[g] is the last member seen of group g */
        for (int64_t t = 0; t < tiles; t++) members[t] = -1;
        for (int64_t t = 0; t < tiles; t++) {
            if (members[group[t]] >= 0) next[members[group[t]]] = t;
            members[group[t]] = t;
        }
        double last_end = 0;
        for (int64_t t = 0; t < tiles; t++) last_end = fmax(last_end, end[t]);
        emit_header(T, s, b);
        lm__plan_sbuf_printf(b, ",\"last_end\":");
        jnum(b, last_end);
        lm__plan_sbuf_printf(b, ",\"last\":");
        int64_t nl = 0;
        for (int64_t t = 0; t < tiles; t++)
            if (end[t] == last_end) members[nl++] = t;
        tile_ranges(b, members, nl);
        /* groups: tile count, tiles, last busy cycle, runs */
        lm__plan_sbuf_printf(b, ",\"groups\":[");
        int first = 1;
        for (int64_t t = 0; t < tiles; t++) {
            if (group[t] != t) continue;
            int64_t n = 0;
            for (int64_t u = t; u >= 0; u = next[u]) members[n++] = u;
            lm__plan_sbuf_printf(b, "%s{\"n\":%lld,\"tiles\":", first ? "" : ",\n", (long long)n);
            first = 0;
            tile_ranges(b, members, n);
            lm__plan_sbuf_printf(b, ",\"end\":");
            jnum(b, end[t]);
            lm__plan_sbuf_printf(b, ",\"runs\":[");
            emit_runs(T, idx + ts[t], ts[t + 1] - ts[t], b);
            lm__plan_sbuf_printf(b, "]}");
        }
        lm__plan_sbuf_printf(b, "]}");
    }
    lm__free(ts), lm__free(idx), lm__free(key), lm__free(group), lm__free(members), lm__free(next), lm__free(end);
    return st;
}

/* The page around the data, as NULL-terminated arrays of lines (at the end of the file). */
static const char *const *page_head(void);
static const char *const *page_tail(void);

static void tl_free(tl *T) {
    lm__free(T->sp), lm__free(T->ty), lm__free(T->tyhash), lm__free(T->ph), lm__free(T->cur), lm__free(T->acc);
    lm__free(T->xd), lm__free(T->xsb), lm__free(T->xrb), lm__free(T->mark), lm__free(T->touched);
}

/* The schedule of p (LM_OUT_OF_MEMORY, nothing held, on failure). */
static lm_status tl_build(tl *T, const lm_plan *p) {
    memset(T, 0, sizeof *T);
    T->p = p, T->low = &p->low;
    size_t n = (size_t)(p->low.tiles > 0 ? p->low.tiles : 1);
    T->cur = lm__calloc(n, sizeof(double));
    T->acc = lm__calloc(n * A_COUNT, sizeof(double));
    T->xd = lm__calloc(n, sizeof(double));
    T->xsb = lm__calloc(n, sizeof(int64_t));
    T->xrb = lm__calloc(n, sizeof(int64_t));
    T->mark = lm__calloc(n, 1);
    T->touched = lm__calloc(n, sizeof(int32_t));
    lm_status st = T->cur && T->acc && T->xd && T->xsb && T->xrb && T->mark && T->touched ? LM_OK : LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = schedule(T);
    if (st != LM_OK) tl_free(T);
    return st;
}

lm_status lm__plan_gap_get(const lm_plan *p, lm__plan_gap *out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm__plan_gap_get: NULL argument");
    tl T;
    lm_status st = tl_build(&T, p);
    if (st != LM_OK) return lm__error(st, "plan gap: out of memory");
    memset(out, 0, sizeof *out);
    out->total = T.clock;
    for (int g = 0; g < G_COUNT; g++) out->v[g] = gap_value(&T, g), out->key[g] = gap_keys[g], out->label[g] = gap_labels[g];
    tl_free(&T);
    return LM_OK;
}

lm_status lm_plan_timeline_html(const lm_plan *p, const lm_plan_sim *s, char **out) {
    if (out) *out = NULL;
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_timeline_html: NULL argument");
    tl T;
    lm_status st = tl_build(&T, p);
    if (st != LM_OK) return lm__error(st, "lm_plan_timeline_html: out of memory");
    if (s) {
        lm_plan_sim_summary ss;
        lm_plan_sim_get_summary(s, &ss);
        if (fabs(ss.cycles - T.clock) > 1e-6 * fmax(1.0, ss.cycles))
            st = lm__error(LM_INTERNAL, "lm_plan_timeline_html: the low program's schedule takes %.1f cycles, the "
                                        "simulation %.1f (not a simulation of this plan?)",
                           T.clock, ss.cycles);
    }
    lm__plan_sbuf b = {0};
    if (st == LM_OK) {
        for (const char *const *l = page_head(); *l; l++) lm__plan_sbuf_printf(&b, "%s", *l);
        st = emit(&T, s, &b);
        for (const char *const *l = page_tail(); *l; l++)
            if (*l == lm__html_nav_marker)
                for (const char *const *n = lm__html_nav_js; *n; n++) lm__plan_sbuf_printf(&b, "%s", *n);
            else
                lm__plan_sbuf_printf(&b, "%s", *l);
    }
    tl_free(&T);
    if (st != LM_OK) {
        lm__free(b.p);
        return st == LM_OUT_OF_MEMORY ? lm__error(st, "lm_plan_timeline_html: out of memory") : st;
    }
    return lm__plan_sbuf_finish(&b, out);
}

/* ---- the page ---------------------------------------------------------------------------------- */
/* Plain HTML, CSS and ES5 JavaScript (no library, no network), one C string per line; the
 * data element sits between the two halves. window.loomTimeline is the hook scripts and
 * tests/plan/browser_timeline.py use (draw, expandAll, zoom, findSpan, draw counters). */
static const char *const *page_head(void) {
    static const char *const lines[] = {
        "<!DOCTYPE html>\n",
        "<html lang=\"en\"><head><meta charset=\"utf-8\">\n",
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n",
        "<title>loom plan timeline</title>\n",
        "<style>\n",
        "body{margin:0;font:13px/1.35 system-ui,sans-serif;color:#222;background:#fff;display:flex;flex-direction:column;height:100vh}\n",
        "#top{padding:8px 12px 4px;border-bottom:1px solid #ddd}\n",
        "h1{font-size:16px;margin:0 0 4px}\n",
        "#summary{margin:2px 0}\n",
        "#gapbar{display:block;width:100%;height:20px;margin:4px 0 2px}\n",
        "#gaptable{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));font-size:12px;column-gap:16px}\n",
        "#gaptable div{white-space:nowrap;overflow:hidden;text-overflow:ellipsis}\n",
        "#gaptable .n{display:inline-block;min-width:62px;text-align:right;margin-right:6px}\n",
        "#gaptable .p{display:inline-block;min-width:44px;text-align:right;margin-right:8px}\n",
        ".sw{display:inline-block;width:10px;height:10px;margin-right:4px;vertical-align:-1px;border:1px solid #0002}\n",
        "#legend span{margin-right:12px;white-space:nowrap}\n",
        "#controls{margin:4px 0}\n",
        "#controls button{font:inherit;margin-right:4px}\n",
        "#notes{color:#555;font-size:12px}\n",
        "#scroller{flex:1;overflow-y:auto;overflow-x:hidden;position:relative}\n",
        "#cv{position:sticky;top:0;display:block;cursor:crosshair}\n",
        "#tip{position:fixed;display:none;pointer-events:none;background:#fffff4;border:1px solid #888;padding:4px 6px;\n",
        "font-size:12px;white-space:pre-line;max-width:520px;box-shadow:1px 1px 4px #0003;z-index:9}\n",
        "details summary{cursor:pointer}\n",
        "</style></head><body>\n",
        "<div id=\"top\">\n",
        "<h1 id=\"title\">loom plan timeline</h1>\n",
        "<div id=\"summary\"></div>\n",
        "<svg id=\"gapbar\" preserveAspectRatio=\"none\"></svg>\n",
        "<details open><summary>gap to the compute bound, by category (along the critical path)</summary>\n",
        "<div id=\"gaptable\"></div><div id=\"notes\"></div></details>\n",
        "<div id=\"legend\"></div>\n",
        "<div id=\"controls\"><button id=\"fit\">fit</button><button id=\"zin\">zoom in</button><button id=\"zout\">zoom out</button>\n",
        "<button id=\"expand\">expand all</button><button id=\"collapse\">collapse all</button>\n",
        "<label><input type=\"checkbox\" id=\"crit\" checked> mark the critical path</label>\n",
        "<span id=\"hint\">&nbsp;ctrl+wheel or +/&minus; zoom, drag or shift+wheel pans, click a row's label to expand its group</span></div>\n",
        "</div>\n",
        "<div id=\"scroller\"><canvas id=\"cv\"></canvas><div id=\"spacer\"></div></div>\n",
        "<div id=\"tip\"></div>\n",
        "<script type=\"application/json\" id=\"tl-data\">\n",
        NULL};
    return lines;
}

static const char *const *page_tail(void) {
    static const char *const lines[] = {
        "</script>\n",
        "<script>\n",
        "(function () {\n",
        "'use strict';\n",
        "var D = JSON.parse(document.getElementById('tl-data').textContent);\n",
        "var COL = ['#2f64b1', '#8dbbe8', '#e8912d', '#9a9a9a'], IDLE = '#f1f1f1', CRIT = '#d62728';\n",
        "var CATN = ['compute: matmul', 'compute: other kernels', 'exchange', 'sync'];\n",
        "var GAPC = {bound: '#1f3f73', mm_work: '#5b8fd6', mm_over: '#a9c8ef', kernels: '#8cc56b', reductions: '#b07cd8',\n",
        "  copies: '#f0d35b', exchange: '#e8912d', sync: '#9a9a9a'};\n",
        "var NT = 7, TY = D.types, LABELW = 180, RIGHT = 10, AXISH = 20, PHASEH = 16, GROUPH = 16, TILEH = 11;\n",
        "var api = window.loomTimeline = {data: D, drawnRows: 0, drawnSpans: 0, aggregated: 0, draws: 0};\n",
        "var $ = function (id) { return document.getElementById(id); };\n",
        "var cv = $('cv'), sc = $('scroller'), spacer = $('spacer'), tip = $('tip'), ctx = cv.getContext('2d');\n",
        "var G = D.groups, total = D.total > 0 ? D.total : 1, showCrit = true;\n",
        "function fmt(v) { return Math.round(v).toLocaleString('en-US'); }\n",
        "function fmtb(v) { return v >= 1048576 ? (v / 1048576).toFixed(2) + ' MiB' : v >= 1024 ? (v / 1024).toFixed(1) + ' KiB' : v + ' B'; }\n",
        "function us(c) { return D.clock_hz > 0 ? ' (' + (c / D.clock_hz * 1e6).toFixed(c / D.clock_hz * 1e6 < 10 ? 2 : 1) + ' \\u00b5s)' : ''; }\n",
        "function ranges(r, max) { /* strided runs [first, last, stride, ...] */\n",
        "  var out = [], i;\n",
        "  for (i = 0; i < r.length && out.length < max; i += 3)\n",
        "    out.push(r[i] === r[i + 1] ? '' + r[i] : r[i] + '\\u2013' + r[i + 1] + (r[i + 2] > 1 ? ' by ' + r[i + 2] : ''));\n",
        "  return out.join(', ') + (i < r.length ? ', \\u2026' : '');\n",
        "}\n",
        "G.forEach(function (g) { /* runs: idle gap, type, count -> start, end, type, count */\n",
        "  var R = g.runs, n = R.length / 3, e = 0;\n",
        "  g.nr = n; g.rs = new Float64Array(n); g.re = new Float64Array(n); g.rt = new Int32Array(n); g.rc = new Int32Array(n);\n",
        "  g.crit = false;\n",
        "  for (var r = 0; r < n; r++) {\n",
        "    var y = R[3 * r + 1], c = TY[y * NT];\n",
        "    g.rs[r] = e + R[3 * r]; g.rt[r] = y; g.rc[r] = R[3 * r + 2]; e = g.re[r] = g.rs[r] + g.rc[r] * TY[y * NT + 1];\n",
        "    if ((c & 4) && (c & 3) !== 3) g.crit = true;\n",
        "  }\n",
        "  g.open = false; g.list = [];\n",
        "  for (var i = 0; i < g.tiles.length; i += 3) for (var t = g.tiles[i]; t <= g.tiles[i + 1]; t += g.tiles[i + 2]) g.list.push(t);\n",
        "  g.last = g.end === D.last_end && g.end > 0;\n",
        "});\n",
        "/* ---- summary strip ---- */\n",
        "$('title').textContent = 'Plan timeline: ' + D.title + ' \\u2014 ' + D.tiles.toLocaleString('en-US') + ' tiles, ' + G.length + ' distinct schedules';\n",
        "(function () {\n",
        "  var s = 'total ' + fmt(D.total) + ' cycles' + us(D.total) + ', ' +\n",
        "    (D.source === 'simulation' ? 'as simulated' : 'as predicted from the low program (no simulation)');\n",
        "  if (D.bound > 0) s += ' \\u00b7 compute bound ' + fmt(D.bound) + ' (total = ' + (D.total / D.bound).toFixed(2) + '\\u00d7 the bound)';\n",
        "  else s += ' \\u00b7 no compute bound (no matmul)';\n",
        "  s += ' \\u00b7 planner\\u2019s estimate ' + fmt(D.predicted) + '.';\n",
        "  s += ' Critical path: the busiest tile of each compute superstep and the longest transfer of each exchange slot' +\n",
        "    ' (marked red); tiles finishing their last operation last (' + fmt(D.last_end) + '): ' + ranges(D.last, 8) + '.';\n",
        "  $('summary').textContent = s;\n",
        "  var svg = $('gapbar'), x = 0, NS = svg.namespaceURI, tb = $('gaptable');\n",
        "  svg.setAttribute('viewBox', '0 0 ' + total + ' 1');\n",
        "  D.gap.forEach(function (g) {\n",
        "    var key = g[0], label = g[1], c = g[2];\n",
        "    var it = document.createElement('div');\n",
        "    it.innerHTML = '<span class=\"sw\"></span><span class=\"n\"></span><span class=\"p\"></span><span></span>';\n",
        "    it.children[0].style.background = GAPC[key] || '#ccc';\n",
        "    it.children[1].textContent = fmt(c);\n",
        "    it.children[2].textContent = (100 * c / total).toFixed(1) + '%';\n",
        "    it.children[3].textContent = label + (c < 0 ? ' (negative: not drawn)' : '');\n",
        "    tb.appendChild(it);\n",
        "    if (c <= 0) return;\n",
        "    var r = document.createElementNS(NS, 'rect');\n",
        "    r.setAttribute('x', x); r.setAttribute('y', 0); r.setAttribute('width', c); r.setAttribute('height', 1);\n",
        "    r.setAttribute('fill', GAPC[key] || '#ccc');\n",
        "    var t = document.createElementNS(NS, 'title'); t.textContent = label + ': ' + fmt(c) + ' cycles'; r.appendChild(t);\n",
        "    svg.appendChild(r); x += c;\n",
        "  });\n",
        "  var it = document.createElement('div');\n",
        "  it.innerHTML = '<span class=\"sw\" style=\"visibility:hidden\"></span><span class=\"n\"></span><span class=\"p\">100%</span><span>total</span>';\n",
        "  it.children[1].textContent = fmt(D.total); tb.appendChild(it);\n",
        "  D.notes.forEach(function (n) { var p = document.createElement('div'); p.textContent = 'Note \\u2014 ' + n; $('notes').appendChild(p); });\n",
        "  var lg = $('legend'), items = CATN.map(function (n, i) { return [n, COL[i]]; }).concat([['idle', IDLE], ['critical path', CRIT]]);\n",
        "  items.forEach(function (it) { var s = document.createElement('span'); s.innerHTML = '<span class=\"sw\"></span>'; s.firstChild.style.background = it[1]; s.appendChild(document.createTextNode(it[0])); lg.appendChild(s); });\n",
        "})();\n",
        "/* ---- rows ---- */\n",
        "var rows = [], rowY = [0], contentH = 0;\n",
        "function buildRows() {\n",
        "  rows = []; rowY = [0]; var y = 0;\n",
        "  G.forEach(function (g, gi) {\n",
        "    rows.push({g: gi, tile: -1}); y += GROUPH; rowY.push(y);\n",
        "    if (g.open && g.n > 1) g.list.forEach(function (t) { rows.push({g: gi, tile: t}); y += TILEH; rowY.push(y); });\n",
        "  });\n",
        "  contentH = y;\n",
        "}\n",
        "var t0 = 0, t1 = total, W = 0, H = 0, drag = null, pending = false;\n",
        "function plotW() { return Math.max(10, W - LABELW - RIGHT); }\n",
        "function X(t) { return LABELW + (t - t0) * plotW() / (t1 - t0); }\n",
        "function T(x) { return t0 + (x - LABELW) * (t1 - t0) / plotW(); }\n",
        "function rowAt(y) { var lo = 0, hi = rows.length - 1; if (hi < 0 || y < 0 || y >= contentH) return -1;\n",
        "  while (lo < hi) { var m = (lo + hi + 1) >> 1; if (rowY[m] <= y) lo = m; else hi = m - 1; } return lo; }\n",
        "function niceStep(span) { var p = Math.pow(10, Math.floor(Math.log10(span))), f = span / p; return (f <= 1 ? 1 : f <= 2 ? 2 : f <= 5 ? 5 : 10) * p; }\n",
        "function drawRow(r, y, h) {\n",
        "  var g = G[r.g], xa = X(0), xb = X(total), x0 = LABELW, x1 = W - RIGHT;\n",
        "  ctx.fillStyle = r.tile < 0 ? '#fff' : '#fafafa'; ctx.fillRect(0, y, LABELW, h);\n",
        "  ctx.fillStyle = '#333'; ctx.font = (r.tile < 0 ? '11px' : '10px') + ' system-ui,sans-serif';\n",
        "  var lab = r.tile < 0 ? (g.n < 2 ? '  ' : g.open ? '\\u25be ' : '\\u25b8 ') + (g.n > 1 ? g.n + ' tiles: ' + ranges(g.tiles, 2) : 'tile ' + g.tiles[0]) : '    tile ' + r.tile;\n",
        "  ctx.fillText(lab, 4, y + h - 4, LABELW - 14);\n",
        "  if (g.last && showCrit) { ctx.fillStyle = CRIT; ctx.fillRect(LABELW - 7, y + h / 2 - 2, 4, 4); }\n",
        "  ctx.fillStyle = IDLE; ctx.fillRect(Math.max(x0, xa), y + 1, Math.min(x1, xb) - Math.max(x0, xa), h - 2);\n",
        "  var lo = 0, hi = g.nr;\n",
        "  while (lo < hi) { var m = (lo + hi) >> 1; if (g.re[m] <= t0) lo = m + 1; else hi = m; }\n",
        "  var bpx = -1, cov = [0, 0, 0, 0], bcrit = false, k = plotW() / (t1 - t0);\n",
        "  function flush() {\n",
        "    if (bpx < 0) return;\n",
        "    var best = 0, sum = 0; for (var c = 0; c < 4; c++) { sum += cov[c]; if (cov[c] > cov[best]) best = c; }\n",
        "    ctx.globalAlpha = Math.max(0.35, Math.min(1, sum)); ctx.fillStyle = COL[best]; ctx.fillRect(bpx, y + 1, 1, h - 2);\n",
        "    ctx.globalAlpha = 1;\n",
        "    if (bcrit && showCrit) { ctx.fillStyle = CRIT; ctx.fillRect(bpx, y + 1, 1, 2); }\n",
        "    api.aggregated++; bpx = -1; cov = [0, 0, 0, 0]; bcrit = false;\n",
        "  }\n",
        "  for (var i = lo; i < g.nr; i++) {\n",
        "    var st = g.rs[i]; if (st >= t1) break;\n",
        "    var ty = g.rt[i] * NT, cat = TY[ty] & 3, crit = (TY[ty] & 4) && cat !== 3, d = TY[ty + 1];\n",
        "    var a = LABELW + (st - t0) * k, b = LABELW + (g.re[i] - t0) * k;\n",
        "    if (a < x0) a = x0; if (b > x1) b = x1; if (b <= a) continue;\n",
        "    if (b - a >= 1.5) {\n",
        "      flush(); ctx.fillStyle = COL[cat]; ctx.fillRect(a, y + 1, b - a, h - 2);\n",
        "      if (d * k >= 4) { /* span boundaries inside the run */\n",
        "        ctx.fillStyle = '#fff8';\n",
        "        var j0 = Math.max(1, Math.floor((t0 - st) / d)), j1 = Math.min(g.rc[i], Math.ceil((t1 - st) / d) + 1);\n",
        "        for (var j = j0; j <= j1; j++) { var xs = LABELW + (st + j * d - t0) * k; if (xs > a && xs <= b) ctx.fillRect(xs - 1, y + 1, 1, h - 2); }\n",
        "      }\n",
        "      if (crit && showCrit) { ctx.fillStyle = CRIT; ctx.fillRect(a, y + 1, b - a, 2); }\n",
        "      api.drawnSpans++;\n",
        "    } else {\n",
        "      var px = Math.floor(a); if (px !== bpx) { flush(); bpx = px; }\n",
        "      cov[cat] += b - a; if (crit) bcrit = true;\n",
        "    }\n",
        "  }\n",
        "  flush();\n",
        "}\n",
        "function draw() {\n",
        "  pending = false; api.draws++;\n",
        "  var dpr = window.devicePixelRatio || 1;\n",
        "  W = sc.clientWidth; H = sc.clientHeight;\n",
        "  if (cv.width !== Math.round(W * dpr) || cv.height !== Math.round(H * dpr)) {\n",
        "    cv.width = Math.round(W * dpr); cv.height = Math.round(H * dpr); cv.style.width = W + 'px'; cv.style.height = H + 'px';\n",
        "  }\n",
        "  var top = AXISH + PHASEH;\n",
        "  spacer.style.height = Math.max(0, contentH - (H - top)) + 'px';\n",
        "  ctx.setTransform(dpr, 0, 0, dpr, 0, 0); ctx.clearRect(0, 0, W, H);\n",
        "  api.drawnRows = 0; api.drawnSpans = 0; api.aggregated = 0;\n",
        "  ctx.save(); ctx.beginPath(); ctx.rect(0, top, W, H - top); ctx.clip();\n",
        "  var off = sc.scrollTop, r = Math.max(0, rowAt(off));\n",
        "  for (; r < rows.length && top + rowY[r] - off < H; r++) {\n",
        "    drawRow(rows[r], top + rowY[r] - off, rowY[r + 1] - rowY[r]); api.drawnRows++;\n",
        "  }\n",
        "  ctx.restore();\n",
        "  /* axis */\n",
        "  ctx.fillStyle = '#fff'; ctx.fillRect(0, 0, W, top);\n",
        "  ctx.fillStyle = '#333'; ctx.font = '10px system-ui,sans-serif';\n",
        "  ctx.fillText('cycles', 4, 13);\n",
        "  var step = niceStep((t1 - t0) / Math.max(2, Math.floor(plotW() / 90)));\n",
        "  for (var t = Math.ceil(t0 / step) * step; t <= t1; t += step) {\n",
        "    var x = X(t); ctx.fillRect(x, AXISH - 5, 1, 5);\n",
        "    var s = t >= 1e6 ? (t / 1e6).toFixed(step >= 1e6 ? 0 : 2) + 'M' : t >= 1e3 ? (t / 1e3).toFixed(step >= 1e3 ? 0 : 1) + 'k' : '' + Math.round(t);\n",
        "    ctx.fillText(s, x + 2, 12);\n",
        "  }\n",
        "  /* phase strip: compute supersteps and exchange phases (sync grey) */\n",
        "  ctx.fillText('phases', 4, AXISH + 12);\n",
        "  var P = D.phases, k = plotW() / (t1 - t0);\n",
        "  for (var i = 0; i < P.length; i += 7) {\n",
        "    var a = LABELW + (P[i + 1] - t0) * k, b = a + P[i + 2] * k, sy = P[i + 3] * k;\n",
        "    if (b < LABELW || a > W - RIGHT) continue;\n",
        "    a = Math.max(a, LABELW); b = Math.min(b, W - RIGHT);\n",
        "    ctx.fillStyle = P[i] ? COL[2] : COL[0]; ctx.fillRect(a, AXISH + 2, Math.max(1, b - a), PHASEH - 4);\n",
        "    if (sy > 0) { ctx.fillStyle = COL[3]; ctx.fillRect(a, AXISH + 2, Math.max(1, Math.min(sy, b - a)), PHASEH - 4); }\n",
        "    if (b - a > 3) { ctx.fillStyle = '#fff'; ctx.fillRect(b - 1, AXISH + 2, 1, PHASEH - 4); }\n",
        "  }\n",
        "  ctx.fillStyle = '#ccc'; ctx.fillRect(0, top - 1, W, 1); ctx.fillRect(LABELW - 1, 0, 1, H);\n",
        "}\n",
        "var MINW = 4; /* the narrowest zoom, cycles (redraw, zoom, fit: lm__html_nav_js) */\n",
        "function setOpen(v) { G.forEach(function (g) { g.open = v; }); buildRows(); redraw(); }\n",
        "/* ---- hover ---- */\n",
        "function spanAt(g, t, slack) { /* {run, k (span within the run), start} or null */\n",
        "  var lo = 0, hi = g.nr - 1, best = -1;\n",
        "  while (lo <= hi) { var m = (lo + hi) >> 1; if (g.rs[m] <= t) { best = m; lo = m + 1; } else hi = m - 1; }\n",
        "  var r = -1;\n",
        "  if (best >= 0 && t < g.re[best]) r = best;\n",
        "  else if (best + 1 < g.nr && g.rs[best + 1] - t <= slack) { r = best + 1; t = g.rs[r]; }\n",
        "  else if (best >= 0 && t - g.re[best] <= slack) { r = best; t = g.re[r] - 1e-9; }\n",
        "  if (r < 0) return null;\n",
        "  var d = TY[g.rt[r] * NT + 1], k = d > 0 ? Math.min(g.rc[r] - 1, Math.max(0, Math.floor((t - g.rs[r]) / d))) : 0;\n",
        "  return {run: r, k: k, start: g.rs[r] + k * d};\n",
        "}\n",
        "function mopText(step) {\n",
        "  var st = D.steps[step] || [-1, ''], m = st[0] >= 0 ? D.mops[st[0]] : null;\n",
        "  return (m ? m[0] + ' ' + (m[1] || '(unnamed)') + ' (mid op #' + st[0] + ')' : 'no mid op') + '\\nstep ' + step + (st[1] ? ' \\u201c' + st[1] + '\\u201d' : '');\n",
        "}\n",
        "function describe(X0, Y0) {\n",
        "  var top = AXISH + PHASEH, k = plotW() / (t1 - t0);\n",
        "  if (Y0 < AXISH) return null;\n",
        "  var t = T(X0);\n",
        "  if (Y0 < top) {\n",
        "    if (X0 < LABELW) return 'phases: compute supersteps (blue) and exchange phases (orange, sync grey)';\n",
        "    var P = D.phases;\n",
        "    for (var i = 0; i < P.length; i += 7) if (t >= P[i + 1] && t < P[i + 1] + P[i + 2] + 1 / k)\n",
        "      return (P[i] ? 'exchange phase' : 'compute superstep') + ' \\u2014 ' + mopText(P[i + 4]) +\n",
        "        (P[i + 5] ? ' \\u00b7 iteration ' + P[i + 5] : '') + '\\nstart ' + fmt(P[i + 1]) + ' \\u00b7 ' + fmt(P[i + 2]) + ' cycles' + us(P[i + 2]) +\n",
        "        (P[i] ? ' (sync ' + fmt(P[i + 3]) + ')\\n' + fmtb(P[i + 6]) + ' received over all tiles' : '');\n",
        "    return null;\n",
        "  }\n",
        "  var ri = rowAt(Y0 - top + sc.scrollTop); if (ri < 0) return null;\n",
        "  var r = rows[ri], g = G[r.g], who = r.tile >= 0 ? 'tile ' + r.tile : g.n > 1 ? g.n + ' tiles with this schedule: ' + ranges(g.tiles, 12) : 'tile ' + g.tiles[0];\n",
        "  if (X0 < LABELW) return who + '\\nlast operation ends at ' + fmt(g.end) + (g.last ? ' (among the last to finish: red square)' : '') + (r.tile < 0 && g.n > 1 ? '\\nclick to ' + (g.open ? 'collapse' : 'expand') : '');\n",
        "  var f = spanAt(g, t, 1.5 / k);\n",
        "  if (!f) return 'idle \\u2014 ' + who + '\\nat cycle ' + fmt(t);\n",
        "  var o = g.rt[f.run] * NT, cat = TY[o] & 3, lab = D.labels[TY[o + 2]], txt = lab + ' \\u2014 ' + mopText(TY[o + 3]);\n",
        "  if (TY[o + 4]) txt += ' \\u00b7 iteration ' + TY[o + 4];\n",
        "  txt += '\\nstart ' + fmt(f.start) + ' \\u00b7 ' + fmt(TY[o + 1]) + ' cycles' + us(TY[o + 1]) + '\\n';\n",
        "  if (cat === 2) txt += 'sends ' + fmtb(TY[o + 5]) + ' \\u00b7 receives ' + fmtb(TY[o + 6]);\n",
        "  else if (cat === 3) txt += 'barrier before the exchange phase';\n",
        "  else txt += 'operands ' + fmtb(TY[o + 5]) + (TY[o + 6] ? ' \\u00b7 ' + TY[o + 6].toLocaleString('en-US') + ' FLOP' : '');\n",
        "  if (g.rc[f.run] > 1) txt += '\\n' + (f.k + 1) + ' of ' + g.rc[f.run] + ' identical spans back to back';\n",
        "  txt += '\\n' + who;\n",
        "  if ((TY[o] & 4) && cat !== 3) txt += '\\non the critical path: sets the length of its ' + (cat === 2 ? 'slot' : 'superstep');\n",
        "  return txt;\n",
        "}\n",
        "function hover(ev) {\n",
        "  var rc = cv.getBoundingClientRect(), txt = describe(ev.clientX - rc.left, ev.clientY - rc.top);\n",
        "  if (drag) { var dx = ev.clientX - drag.x; t0 = drag.t0 - dx * (t1 - t0) / plotW(); t1 = t0 + drag.w; clampPan(); redraw(); }\n",
        "  if (!txt) { tip.style.display = 'none'; return; }\n",
        "  tip.textContent = txt; tip.style.display = 'block';\n",
        "  var x = ev.clientX + 14, y = ev.clientY + 14;\n",
        "  if (x + tip.offsetWidth > window.innerWidth) x = Math.max(0, ev.clientX - tip.offsetWidth - 8);\n",
        "  if (y + tip.offsetHeight > window.innerHeight) y = Math.max(0, ev.clientY - tip.offsetHeight - 8);\n",
        "  tip.style.left = x + 'px'; tip.style.top = y + 'px';\n",
        "}\n",
        "cv.addEventListener('mousemove', hover);\n",
        "cv.addEventListener('mouseleave', function () { tip.style.display = 'none'; });\n",
        "cv.addEventListener('mousedown', function (ev) {\n",
        "  var rc = cv.getBoundingClientRect(), x = ev.clientX - rc.left, y = ev.clientY - rc.top, top = AXISH + PHASEH;\n",
        "  if (x < LABELW && y >= top) {\n",
        "    var ri = rowAt(y - top + sc.scrollTop);\n",
        "    if (ri >= 0 && rows[ri].tile < 0) { G[rows[ri].g].open = !G[rows[ri].g].open; buildRows(); redraw(); }\n",
        "    return;\n",
        "  }\n",
        "  drag = {x: ev.clientX, t0: t0, w: t1 - t0};\n",
        "});\n",
        lm__html_nav_marker, /* the shared navigation: lm__html_nav_js */
        "$('expand').onclick = function () { setOpen(true); };\n",
        "$('collapse').onclick = function () { setOpen(false); };\n",
        "$('crit').onchange = function () { showCrit = this.checked; redraw(); };\n",
        "/* for tests and scripts: draw now, and the page position of a visible span of a label */\n",
        "api.draw = draw; api.expandAll = function () { setOpen(true); draw(); };\n",
        "api.zoom = function (a, b) { t0 = a; t1 = b; clampPan(); draw(); };\n",
        "api.findSpan = function (label) {\n",
        "  var want = D.labels.indexOf(label), top = AXISH + PHASEH, rc = cv.getBoundingClientRect(), k = plotW() / (t1 - t0);\n",
        "  for (var r = Math.max(0, rowAt(sc.scrollTop)); r < rows.length && top + rowY[r] - sc.scrollTop < H; r++) {\n",
        "    var g = G[rows[r].g];\n",
        "    for (var i = 0; i < g.nr; i++) {\n",
        "      var a = X(g.rs[i]), b = a + TY[g.rt[i] * NT + 1] * k;\n",
        "      if (TY[g.rt[i] * NT + 2] === want && b - a >= 2 && a >= LABELW && b <= W - RIGHT)\n",
        "        return {x: rc.left + (a + b) / 2, y: rc.top + top + (rowY[r] + rowY[r + 1]) / 2 - sc.scrollTop};\n",
        "    }\n",
        "  }\n",
        "  return null;\n",
        "};\n",
        "buildRows(); draw();\n",
        "api.readyMs = performance.now(); api.ready = true;\n",
        "})();\n",
        "</script>\n",
        "</body></html>\n",
        NULL};
    return lines;
}
