/* plan/package.c — executable plan packages (.lmx): a compiled plan written to one
 * versioned binary file and loaded back, without the planner, as an lm_plan that the
 * simulator, the checker and the reports accept (docs/PLAN.md section 8 documents the
 * format field by field).
 *
 * Layout: a header (magic, version, sizes, tiles, SRAM bytes, a table of 15 sections
 * with offset, size, record count and CRC-32, the header's own CRC-32) followed by the
 * sections back to back, each an array of fixed-size little-endian records (the
 * machine section is lm_plan_machine_to_json's text). A package carries what the
 * simulator reads of a compiled plan: the machine, the low program (per-tile calls,
 * buffers and offsets, exchange transfers per phase and slot, checkpoint steps), the
 * mid values whose layouts say where each element of an input, parameter, checkpoint
 * and output lives, and the graph the data generator and the CPU reference read. The
 * graph is rebuilt through the public builders, so it passes every shape check a
 * graph built in memory passes.
 *
 * Loading trusts nothing: sizes and checksums first, then every count, index and
 * range, every kernel operand's footprint as kernels.c, sim.c, check.c and report.c
 * will address it, and finally the independent checker (lm_plan_check). Every
 * failure is LM_PARSE_ERROR naming the source and what is wrong. O(file size +
 * checker work); the encoder is O(plan size).
 */
#include "plan/low.h"

#include "loom/io_write.h"

#include <jansson.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>

#define PKG_VERSION 1u
#define PKG_FIXED 64 /* header bytes before the section table */
#define PKG_ENTRY 32 /* one section table entry */
static const uint8_t k_magic[8] = {0x89, 'L', 'M', 'X', '\r', '\n', 0x1a, '\n'};

enum {
    S_MACHINE = 1,
    S_SUMMARY,
    S_GRAPH_OPS,
    S_GRAPH_REGIONS,
    S_GRAPH_CHECKS,
    S_BINDINGS,
    S_MID_VALUES,
    S_MID_OPS,
    S_TILES,
    S_BUFFERS,
    S_BUFFER_MAP,
    S_STEPS,
    S_CALLS,
    S_TRANSFERS,
    S_DESTINATIONS,
    S_END
};
#define NSEC (S_END - 1)
#define HEADER_BYTES (PKG_FIXED + PKG_ENTRY * NSEC + 8)

/* Record sizes in bytes (0: the machine section, one JSON text). */
enum {
    R_OPND = 56,
    R_SUMMARY = 112,
    R_GOP = 224,
    R_REGION = 88,
    R_CHECK = 72,
    R_BIND = 128,
    R_LAYOUT = 216,
    R_MVAL = 24 + R_LAYOUT,
    R_MOP = 96,
    R_TILE = 16,
    R_BUF = 48,
    R_BUFMAP = 16,
    R_STEP = 112,
    R_CALL = 8 + 4 * R_OPND + 8 + 24 + 8,
    R_XFER = 8 + R_OPND + 24,
    R_XDST = 8 + R_OPND
};

static const struct {
    const char *name;
    int64_t rec;
} k_sec[S_END] = {
    [S_MACHINE] = {"machine", 0},
    [S_SUMMARY] = {"summary", R_SUMMARY},
    [S_GRAPH_OPS] = {"graph ops", R_GOP},
    [S_GRAPH_REGIONS] = {"graph regions", R_REGION},
    [S_GRAPH_CHECKS] = {"graph checkpoints", R_CHECK},
    [S_BINDINGS] = {"bindings", R_BIND},
    [S_MID_VALUES] = {"mid values", R_MVAL},
    [S_MID_OPS] = {"mid ops", R_MOP},
    [S_TILES] = {"tiles", R_TILE},
    [S_BUFFERS] = {"buffers", R_BUF},
    [S_BUFFER_MAP] = {"buffer map", R_BUFMAP},
    [S_STEPS] = {"steps", R_STEP},
    [S_CALLS] = {"calls", R_CALL},
    [S_TRANSFERS] = {"transfers", R_XFER},
    [S_DESTINATIONS] = {"destinations", R_XDST},
};

/* ---- CRC-32 (IEEE 802.3, reflected, as zlib's crc32) ----------------------------------------- */
static uint32_t crc32_of(const uint8_t *p, size_t n) {
    static const uint32_t nib[16] = {0x00000000, 0x1db71064, 0x3b6e20c8, 0x26d930ac, 0x76dc4190, 0x6b6b51f4,
                                     0x4db26158, 0x5005713c, 0xedb88320, 0xf00f9344, 0xd6d6a3e8, 0xcb61b38c,
                                     0x9b64c2b0, 0x86d3d2d4, 0xa00ae278, 0xbdbdf21c};
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        c = (c >> 4) ^ nib[c & 15];
        c = (c >> 4) ^ nib[c & 15];
    }
    return c ^ 0xffffffffu;
}

/* ---- little-endian fields through a cursor ----------------------------------------------------- */
static void pu(uint8_t **c, uint64_t v, int n) {
    for (int i = 0; i < n; i++) (*c)[i] = (uint8_t)(v >> (8 * i));
    *c += n;
}
static uint64_t gu(const uint8_t **c, int n) {
    uint64_t v = 0;
    for (int i = 0; i < n; i++) v |= (uint64_t)(*c)[i] << (8 * i);
    *c += n;
    return v;
}
static void pi32(uint8_t **c, int64_t v) { pu(c, (uint32_t)(int32_t)v, 4); }
static void pi64(uint8_t **c, int64_t v) { pu(c, (uint64_t)v, 8); }
static int32_t gi32(const uint8_t **c) { return (int32_t)(uint32_t)gu(c, 4); }
static int64_t gi64(const uint8_t **c) { return (int64_t)gu(c, 8); }
static void pf32(uint8_t **c, float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    pu(c, u, 4);
}
static float gf32(const uint8_t **c) {
    uint32_t u = (uint32_t)gu(c, 4);
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static void pf64(uint8_t **c, double f) {
    uint64_t u;
    memcpy(&u, &f, 8);
    pu(c, u, 8);
}
static double gf64(const uint8_t **c) {
    uint64_t u = gu(c, 8);
    double f;
    memcpy(&f, &u, 8);
    return f;
}
static void pzero(uint8_t **c, int n) {
    memset(*c, 0, (size_t)n);
    *c += n;
}
/* A fixed field of n bytes: the text, NUL, zero fill (text is cut to n - 1 bytes). */
static void pstr(uint8_t **c, const char *s, int n) {
    size_t len = strnlen(s, (size_t)n - 1);
    memset(*c, 0, (size_t)n);
    memcpy(*c, s, len);
    *c += n;
}
/* Copies a fixed field; 0 when it holds no NUL. */
static int gstr(const uint8_t **c, char *dst, int n) {
    memcpy(dst, *c, (size_t)n);
    *c += n;
    return memchr(dst, 0, (size_t)n) != NULL;
}

/* A growing byte buffer; the first allocation failure sticks. */
typedef struct wbuf {
    uint8_t *p; /* [n] */
    int64_t n, cap;
    lm_status st;
} wbuf;

/* n new zeroed bytes at the end, or NULL after a failure. */
static uint8_t *w_take(wbuf *b, int64_t n) {
    if (b->st != LM_OK) return NULL;
    b->st = lm__reserve((void **)&b->p, &b->cap, b->n + n, 1);
    if (b->st != LM_OK) return NULL;
    uint8_t *q = b->p + b->n;
    memset(q, 0, (size_t)n);
    b->n += n;
    return q;
}

/* ---- records ------------------------------------------------------------------------------------ */
static void p_opnd(uint8_t **c, const lm__plan_opnd *o) {
    pi32(c, o->buf);
    pi32(c, o->ndim);
    pu(c, (uint32_t)o->dtype, 4);
    pzero(c, 4);
    pi64(c, o->off);
    for (int d = 0; d < 4; d++) pi32(c, o->dims[d]);
    for (int d = 0; d < 4; d++) pi32(c, o->strides[d]);
}
static void g_opnd(const uint8_t **c, lm__plan_opnd *o) {
    memset(o, 0, sizeof *o);
    o->buf = gi32(c);
    o->ndim = gi32(c);
    o->dtype = (lm_dtype)gu(c, 4);
    *c += 4;
    o->off = gi64(c);
    for (int d = 0; d < 4; d++) o->dims[d] = gi32(c);
    for (int d = 0; d < 4; d++) o->strides[d] = gi32(c);
}

static void p_layout(uint8_t **c, const lm__plan_layout *l) {
    pu(c, (uint8_t)l->ndim, 1);
    pu(c, (uint8_t)l->nrep, 1);
    pu(c, (uint8_t)l->partial, 1);
    pzero(c, 1);
    for (int d = 0; d < 4; d++) pu(c, (uint8_t)l->order[d], 1);
    pu(c, (uint32_t)l->dtype, 4);
    pzero(c, 4);
    for (int d = 0; d < 4; d++) pi64(c, l->dims[d]);
    for (int d = 0; d < 4; d++) pi64(c, l->block[d]);
    for (int d = 0; d < 4; d++) pi64(c, l->grid[d]);
    for (int d = 0; d < 4; d++) pi64(c, l->tstride[d]);
    for (int a = 0; a < 4; a++) pi64(c, l->rcount[a]);
    for (int a = 0; a < 4; a++) pi64(c, l->rstride[a]);
    pi64(c, l->tile0);
}
static void g_layout(const uint8_t **c, lm__plan_layout *l) {
    memset(l, 0, sizeof *l);
    l->ndim = (int8_t)gu(c, 1);
    l->nrep = (int8_t)gu(c, 1);
    l->partial = (int8_t)gu(c, 1);
    *c += 1;
    for (int d = 0; d < 4; d++) l->order[d] = (int8_t)gu(c, 1);
    l->dtype = (lm_dtype)gu(c, 4);
    *c += 4;
    for (int d = 0; d < 4; d++) l->dims[d] = gi64(c);
    for (int d = 0; d < 4; d++) l->block[d] = gi64(c);
    for (int d = 0; d < 4; d++) l->grid[d] = gi64(c);
    for (int d = 0; d < 4; d++) l->tstride[d] = gi64(c);
    for (int a = 0; a < 4; a++) l->rcount[a] = gi64(c);
    for (int a = 0; a < 4; a++) l->rstride[a] = gi64(c);
    l->tile0 = gi64(c);
}

/* The graph as stored: op i and the value i it defines (plans' graphs have one value per op). */
typedef struct gop_rec {
    lm__gopk kind;
    int nin;
    char name[LM__G_NAME];
    int in[LM__G_MAX_IN];
    double a, b;
    int64_t i[4];
    int perm[4];
    int ndim;
    lm_dtype dtype;
    int output, region;
    int64_t dims[4];
} gop_rec;

static void p_gop(uint8_t **c, const lm_graph *g, int64_t k) {
    const lm__gop *op = &g->ops[k];
    const lm__gvalue *v = &g->values[k];
    pu(c, (uint32_t)op->kind, 4);
    pi32(c, op->nin);
    pstr(c, op->name, LM__G_NAME);
    for (int i = 0; i < LM__G_MAX_IN; i++) pi32(c, op->in[i]);
    pf64(c, op->a);
    pf64(c, op->b);
    for (int i = 0; i < 4; i++) pi64(c, op->i[i]);
    for (int i = 0; i < 4; i++) pi32(c, op->perm[i]);
    pi32(c, v->ndim);
    pu(c, (uint32_t)v->dtype, 4);
    pi32(c, v->output);
    pi32(c, v->region);
    for (int d = 0; d < 4; d++) pi64(c, d < v->ndim ? v->dims[d] : 0);
}
static int g_gop(const uint8_t **c, gop_rec *r) {
    memset(r, 0, sizeof *r);
    r->kind = (lm__gopk)gu(c, 4);
    r->nin = gi32(c);
    int ok = gstr(c, r->name, LM__G_NAME);
    for (int i = 0; i < LM__G_MAX_IN; i++) r->in[i] = gi32(c);
    r->a = gf64(c);
    r->b = gf64(c);
    for (int i = 0; i < 4; i++) r->i[i] = gi64(c);
    for (int i = 0; i < 4; i++) r->perm[i] = gi32(c);
    r->ndim = gi32(c);
    r->dtype = (lm_dtype)gu(c, 4);
    r->output = gi32(c);
    r->region = gi32(c);
    for (int d = 0; d < 4; d++) r->dims[d] = gi64(c);
    return ok;
}

static void p_region(uint8_t **c, const lm__gregion *r) {
    pi64(c, r->count);
    pi32(c, r->begin);
    pi32(c, r->end);
    pi32(c, r->ncarry);
    pzero(c, 4);
    for (int i = 0; i < 4; i++) pi32(c, i < r->ncarry ? r->outer_in[i] : -1);
    for (int i = 0; i < 4; i++) pi32(c, i < r->ncarry ? r->body_in[i] : -1);
    for (int i = 0; i < 4; i++) pi32(c, i < r->ncarry ? r->body_out[i] : -1);
    for (int i = 0; i < 4; i++) pi32(c, i < r->ncarry ? r->outer_out[i] : -1);
}
static void g_region(const uint8_t **c, lm__gregion *r) {
    memset(r, 0, sizeof *r);
    r->count = gi64(c);
    r->begin = gi32(c);
    r->end = gi32(c);
    r->ncarry = gi32(c);
    *c += 4;
    for (int i = 0; i < 4; i++) r->outer_in[i] = gi32(c);
    for (int i = 0; i < 4; i++) r->body_in[i] = gi32(c);
    for (int i = 0; i < 4; i++) r->body_out[i] = gi32(c);
    for (int i = 0; i < 4; i++) r->outer_out[i] = gi32(c);
}

/* ---- bindings: what a caller feeds and reads (shared with the public accessors) ---------------------- */
typedef struct bind {
    lm_plan_binding b;
    int32_t value; /* graph value */
    int32_t mval;  /* inputs/params: the first placed mid value holding it; outputs: the checked one; -1 none */
} bind;

static int is_leaf(const lm_graph *g, int64_t v, lm_plan_binding_kind *k) {
    lm__gopk op = g->ops[g->values[v].op].kind;
    if (op != LM__GOP_INPUT && op != LM__GOP_PARAM) return 0;
    *k = op == LM__GOP_INPUT ? LM_PLAN_BIND_INPUT : LM_PLAN_BIND_PARAM;
    return 1;
}

int64_t lm_plan_binding_count(const lm_plan *p) {
    if (!p || !p->g) return 0;
    int64_t n = 0;
    lm_plan_binding_kind k;
    for (int64_t v = 0; v < p->g->nvalues; v++) n += is_leaf(p->g, v, &k) + (p->g->values[v].output != 0);
    return n;
}

/* Binding i: inputs and parameters in value order, then outputs in value order. */
static int bind_of(const lm_plan *p, int64_t i, bind *out) {
    const lm_graph *g = p->g;
    int64_t k = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int64_t v = 0; v < g->nvalues; v++) {
            lm_plan_binding_kind kind = LM_PLAN_BIND_OUTPUT;
            if (pass == 0 ? !is_leaf(g, v, &kind) : !g->values[v].output) continue;
            if (k++ != i) continue;
            const lm__gvalue *val = &g->values[v];
            memset(out, 0, sizeof *out);
            snprintf(out->b.name, sizeof out->b.name, "%s", val->name);
            out->b.kind = kind;
            out->b.dtype = val->dtype;
            out->b.ndim = val->ndim;
            for (int d = 0; d < val->ndim; d++) out->b.shape[d] = val->dims[d];
            out->b.copies = pass == 0 && val->region >= 0 ? g->regions[val->region].count : 1;
            out->value = (int32_t)v;
            out->mval = -1;
            if (pass == 0) {
                for (int64_t m = 0; m < p->mid.nvals && out->mval < 0; m++)
                    if (p->mid.vals[m].value == v && p->mid.vals[m].placed && p->mid.vals[m].view_of < 0)
                        out->mval = (int32_t)m;
            } else {
                for (int64_t s = 0; s < p->low.nsteps && out->mval < 0; s++)
                    if (p->low.steps[s].kind == LM__PLAN_S_CHECK && p->low.steps[s].check == -1 - (int)v)
                        out->mval = p->low.steps[s].mval;
            }
            return 1;
        }
    return 0;
}

lm_status lm_plan_binding_get(const lm_plan *p, int64_t i, lm_plan_binding *out) {
    if (!p || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_binding_get: NULL argument");
    bind b;
    if (i < 0 || !bind_of(p, i, &b))
        return lm__error(LM_OUT_OF_RANGE, "plan binding %lld of %lld", (long long)i,
                         (long long)lm_plan_binding_count(p));
    *out = b.b;
    return LM_OK;
}

const lm_plan_machine *lm_plan_get_machine(const lm_plan *p) { return p ? &p->m : NULL; }

static void p_bind(uint8_t **c, const bind *b) {
    pu(c, (uint32_t)b->b.kind, 4);
    pu(c, (uint32_t)b->b.dtype, 4);
    pstr(c, b->b.name, 64);
    pi32(c, b->b.ndim);
    pi32(c, b->value);
    pi32(c, b->mval);
    pzero(c, 4);
    for (int d = 0; d < 4; d++) pi64(c, b->b.shape[d]);
    pi64(c, b->b.copies);
}

/* ---- machine identity --------------------------------------------------------------------------- */
/* The first key whose value differs between two machines' JSON forms, into why. */
static void machine_diff(const lm_plan_machine *a, const lm_plan_machine *b, char *why, size_t n) {
    snprintf(why, n, "a field differs beyond its JSON precision");
    char *ja = NULL, *jb = NULL;
    json_t *oa = NULL, *ob = NULL;
    if (lm_plan_machine_to_json(a, &ja) == LM_OK && lm_plan_machine_to_json(b, &jb) == LM_OK) {
        oa = json_loads(ja, 0, NULL);
        ob = json_loads(jb, 0, NULL);
    }
    const char *key;
    json_t *va;
    if (oa && ob) json_object_foreach(oa, key, va) {
            json_t *vb = json_object_get(ob, key);
            char *sa = json_dumps(va, JSON_ENCODE_ANY), *sb = vb ? json_dumps(vb, JSON_ENCODE_ANY) : NULL;
            int differ = sa && (!sb || strcmp(sa, sb));
            if (differ) snprintf(why, n, "%s %s vs %s", key, sa, sb ? sb : "(absent)");
            free(sa);
            free(sb);
            if (differ) break;
        }
    json_decref(oa);
    json_decref(ob);
    lm_free(ja);
    lm_free(jb);
}

/* 1 when a and b describe the same machine bit for bit (every field after the name:
 * all are 8-byte integers and doubles); otherwise *why names the first difference. */
static int machine_same(const lm_plan_machine *a, const lm_plan_machine *b, char *why, size_t n) {
    if (strcmp(a->name, b->name)) {
        snprintf(why, n, "name '%s' vs '%s'", a->name, b->name);
        return 0;
    }
    if (!memcmp((const char *)a + sizeof a->name, (const char *)b + sizeof b->name, sizeof *a - sizeof a->name))
        return 1;
    machine_diff(a, b, why, n);
    return 0;
}

/* ---- encoder ------------------------------------------------------------------------------------- */
static lm_status sec_summary(const lm_plan *p, wbuf *b) {
    const lm_plan_summary *s = &p->summary;
    uint8_t *c = w_take(b, R_SUMMARY);
    if (!c) return b->st;
    pf64(&c, s->predicted_cycles);
    pf64(&c, s->lower_bound_cycles);
    pf64(&c, s->matmul_flops);
    pi64(&c, s->sram_peak_bytes);
    pi64(&c, s->sram_live_bound);
    pf64(&c, s->sram_alloc_ratio);
    pi64(&c, s->exchange_bytes);
    pi64(&c, s->compute_steps);
    pi64(&c, s->exchange_steps);
    pi64(&c, s->kernel_calls);
    pi64(&c, s->transfers);
    pf64(&c, s->plan_seconds);
    pi64(&c, s->candidates_costed);
    pi64(&c, s->planner_peak_bytes);
    return LM_OK;
}

/* Appends section id's records to b; *count receives the record count. */
static lm_status encode_section(const lm_plan *p, int id, wbuf *b, int64_t *count) {
    const lm_graph *g = p->g;
    const lm__plan_mid *mid = &p->mid;
    const lm__plan_low *low = &p->low;
    uint8_t *c;
    *count = 0;
    switch (id) {
    case S_MACHINE: {
        char *json = NULL;
        LM_TRY(lm_plan_machine_to_json(&p->m, &json));
        size_t n = strlen(json);
        c = w_take(b, (int64_t)n);
        if (c) memcpy(c, json, n);
        lm_free(json);
        *count = 1;
        return b->st;
    }
    case S_SUMMARY: *count = 1; return sec_summary(p, b);
    case S_GRAPH_OPS:
        for (int64_t k = 0; k < g->nops; k++) {
            if (!(c = w_take(b, R_GOP))) return b->st;
            p_gop(&c, g, k);
        }
        *count = g->nops;
        return LM_OK;
    case S_GRAPH_REGIONS:
        for (int r = 0; r < g->nregions; r++) {
            if (!(c = w_take(b, R_REGION))) return b->st;
            p_region(&c, &g->regions[r]);
        }
        *count = g->nregions;
        return LM_OK;
    case S_GRAPH_CHECKS:
        for (int64_t k = 0; k < g->nchecks; k++) {
            if (!(c = w_take(b, R_CHECK))) return b->st;
            pi32(&c, g->checks[k].value);
            pstr(&c, g->checks[k].name, 64);
            pzero(&c, 4);
        }
        *count = g->nchecks;
        return LM_OK;
    case S_BINDINGS: {
        int64_t n = lm_plan_binding_count(p);
        for (int64_t i = 0; i < n; i++) {
            bind bd;
            bind_of(p, i, &bd);
            if (!(c = w_take(b, R_BIND))) return b->st;
            p_bind(&c, &bd);
        }
        *count = n;
        return LM_OK;
    }
    case S_MID_VALUES:
        for (int64_t k = 0; k < mid->nvals; k++) {
            const lm__plan_mval *v = &mid->vals[k];
            if (!(c = w_take(b, R_MVAL))) return b->st;
            pi32(&c, v->value);
            pi32(&c, v->view_of);
            pi32(&c, v->placed);
            pi32(&c, v->stacked);
            pi32(&c, v->region);
            pzero(&c, 4);
            p_layout(&c, &v->l);
        }
        *count = mid->nvals;
        return LM_OK;
    case S_MID_OPS:
        for (int64_t k = 0; k < mid->nops; k++) {
            const lm__plan_mop *o = &mid->ops[k];
            if (!(c = w_take(b, R_MOP))) return b->st;
            pu(&c, (uint32_t)o->kind, 4);
            pi32(&c, o->gop);
            pi32(&c, o->out);
            for (int i = 0; i < 3; i++) pi32(&c, i < o->nin ? o->in[i] : -1);
            pi32(&c, o->nin);
            pi32(&c, o->body_end);
            pi32(&c, o->check);
            pi32(&c, o->epi); /* zero in packages written before fused epilogues: none */
            for (int i = 0; i < 4; i++) pi64(&c, o->grid[i]);
            pi64(&c, o->count);
            pi64(&c, o->steps);
            pf64(&c, o->cost);
        }
        *count = mid->nops;
        return LM_OK;
    case S_TILES:
        for (int64_t t = 0; t < low->tiles; t++) {
            if (!(c = w_take(b, R_TILE))) return b->st;
            pi64(&c, low->peak[t]);
            pi64(&c, low->live_bound[t]);
        }
        *count = low->tiles;
        return LM_OK;
    case S_BUFFERS:
        for (int64_t k = 0; k < low->nbufs; k++) {
            const lm__plan_buf *x = &low->bufs[k];
            if (!(c = w_take(b, R_BUF))) return b->st;
            pi32(&c, x->tile);
            pi32(&c, x->mval);
            pi32(&c, x->alias);
            pi32(&c, x->first);
            pi32(&c, x->last);
            pi32(&c, x->placed);
            pi64(&c, x->bytes);
            pi64(&c, x->copies);
            pi64(&c, x->offset);
        }
        *count = low->nbufs;
        return LM_OK;
    case S_BUFFER_MAP:
        for (int64_t v = 0; v < low->nmvals; v++)
            for (int64_t t = 0; t < low->tiles; t++) {
                int32_t bf = low->buf_of[(size_t)v * (size_t)low->tiles + (size_t)t];
                if (bf < 0) continue;
                if (!(c = w_take(b, R_BUFMAP))) return b->st;
                pi32(&c, v);
                pi32(&c, t);
                pi32(&c, bf);
                pzero(&c, 4);
                ++*count;
            }
        return LM_OK;
    case S_STEPS:
        for (int64_t k = 0; k < low->nsteps; k++) {
            const lm__plan_step *s = &low->steps[k];
            if (!(c = w_take(b, R_STEP))) return b->st;
            pu(&c, (uint32_t)s->kind, 4);
            pi32(&c, s->mop);
            pi64(&c, s->c0);
            pi64(&c, s->c1);
            pi64(&c, s->x0);
            pi64(&c, s->x1);
            pi32(&c, s->nslots);
            pi32(&c, s->match);
            pi64(&c, s->count);
            pi32(&c, s->check);
            pi32(&c, s->mval);
            pstr(&c, s->label, 48);
        }
        *count = low->nsteps;
        return LM_OK;
    case S_CALLS:
        for (int64_t k = 0; k < low->ncalls; k++) {
            const lm__plan_call *x = &low->calls[k];
            if (!(c = w_take(b, R_CALL))) return b->st;
            pi32(&c, x->tile);
            pu(&c, (uint16_t)x->kernel, 2);
            pu(&c, (uint16_t)x->nops, 2);
            for (int i = 0; i < 4; i++) p_opnd(&c, &x->op[i]);
            pf32(&c, x->f[0]);
            pf32(&c, x->f[1]);
            for (int i = 0; i < 3; i++) pi64(&c, x->i[i]);
            pf64(&c, x->cycles);
        }
        *count = low->ncalls;
        return LM_OK;
    case S_TRANSFERS:
        for (int64_t k = 0; k < low->nxfers; k++) {
            const lm__plan_xfer *x = &low->xfers[k];
            if (!(c = w_take(b, R_XFER))) return b->st;
            pi32(&c, x->src_tile);
            pi32(&c, x->slot);
            p_opnd(&c, &x->src);
            pi64(&c, x->bytes);
            pi64(&c, x->dst0);
            pi32(&c, x->ndst);
            pzero(&c, 4);
        }
        *count = low->nxfers;
        return LM_OK;
    case S_DESTINATIONS:
        for (int64_t k = 0; k < low->nxdst; k++) {
            if (!(c = w_take(b, R_XDST))) return b->st;
            pi32(&c, low->xdst[k].tile);
            pzero(&c, 4);
            p_opnd(&c, &low->xdst[k].dst);
        }
        *count = low->nxdst;
        return LM_OK;
    default: return lm__error(LM_INTERNAL, "plan package: unknown section %d", id);
    }
}

/* What the format cannot carry: graphs whose ops do not define exactly one value each
 * in order, and machines whose JSON form does not parse back to the same numbers. */
static lm_status encodable(const lm_plan *p) {
    const lm_graph *g = p->g;
    if (g->nvalues != g->nops)
        return lm__error(LM_UNSUPPORTED,
                         "plan package: the graph has %lld values for %lld ops (one value per op needed)",
                         (long long)g->nvalues, (long long)g->nops);
    for (int64_t k = 0; k < g->nops; k++)
        if (g->ops[k].out != k || g->ops[k].out2 >= 0)
            return lm__error(LM_UNSUPPORTED, "plan package: graph op '%s' does not define value %lld alone",
                             g->ops[k].name, (long long)k);
    char *json = NULL;
    LM_TRY(lm_plan_machine_to_json(&p->m, &json));
    lm_plan_machine *back = NULL;
    lm_status st = lm_plan_machine_parse(json, "plan package machine", &back);
    lm_free(json);
    if (st != LM_OK)
        return lm__error_context(st, "plan package: machine '%s' does not survive its JSON form", p->m.name);
    char why[160];
    int same = machine_same(&p->m, back, why, sizeof why);
    lm_plan_machine_destroy(back);
    if (!same)
        return lm__error(LM_UNSUPPORTED,
                         "plan package: machine '%s' does not survive its JSON form (%s): the simulated cycles "
                         "would differ",
                         p->m.name, why);
    return LM_OK;
}

lm_status lm__plan_package_encode(const lm_plan *p, uint8_t **out, size_t *size) {
    if (!p || !out || !size) return lm__error(LM_INVALID_ARGUMENT, "plan package encode: NULL argument");
    *out = NULL;
    *size = 0;
    LM_TRY(encodable(p));
    wbuf b = {NULL, 0, 0, LM_OK};
    if (!w_take(&b, HEADER_BYTES)) return b.st;
    int64_t off[S_END], cnt[S_END];
    lm_status st = LM_OK;
    for (int id = 1; id < S_END && st == LM_OK; id++) {
        off[id] = b.n;
        st = encode_section(p, id, &b, &cnt[id]);
        if (st == LM_OK) st = b.st;
    }
    if (st != LM_OK) {
        lm__free(b.p);
        return st;
    }
    uint8_t *c = b.p;
    memcpy(c, k_magic, 8);
    c += 8;
    pu(&c, PKG_VERSION, 4);
    pu(&c, HEADER_BYTES, 4);
    pi64(&c, b.n);
    pu(&c, NSEC, 4);
    pu(&c, 0, 4);
    pi64(&c, p->m.tiles);
    pi64(&c, p->m.sram_bytes);
    pzero(&c, 16);
    for (int id = 1; id < S_END; id++) {
        int64_t end = id + 1 < S_END ? off[id + 1] : b.n;
        pu(&c, (uint32_t)id, 4);
        pu(&c, crc32_of(b.p + off[id], (size_t)(end - off[id])), 4);
        pi64(&c, off[id]);
        pi64(&c, end - off[id]);
        pi64(&c, cnt[id]);
    }
    pu(&c, crc32_of(b.p, HEADER_BYTES - 8), 4);
    pzero(&c, 4);
    LM_ASSERT(c == b.p + HEADER_BYTES);
    *out = b.p;
    *size = (size_t)b.n;
    return LM_OK;
}

lm_status lm_plan_package_write(const lm_plan *p, const char *path) {
    if (!p || !path) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_package_write: NULL argument");
    uint8_t *data = NULL;
    size_t n = 0;
    lm_status st = lm__plan_package_encode(p, &data, &n);
    if (st != LM_OK) return lm__error_context(st, "plan package '%s'", path);
    st = lm_file_write_atomic(path, data, n);
    lm__free(data);
    if (st != LM_OK) return lm__error_context(st, "plan package '%s'", path);
    return LM_OK;
}

int lm__plan_package_section(const uint8_t *data, size_t size, int id, size_t *offset, size_t *bytes, int64_t *count) {
    if (!data || size < HEADER_BYTES || id < 1 || id >= S_END) return 0;
    const uint8_t *c = data + PKG_FIXED + (size_t)(id - 1) * PKG_ENTRY + 8;
    int64_t o = gi64(&c), n = gi64(&c), k = gi64(&c);
    if (o < 0 || n < 0 || (uint64_t)o > size || (uint64_t)n > size - (uint64_t)o) return 0;
    if (offset) *offset = (size_t)o;
    if (bytes) *bytes = (size_t)n;
    if (count) *count = k;
    return 1;
}

void lm__plan_package_reseal(uint8_t *data, size_t size) {
    if (!data || size < HEADER_BYTES) return;
    for (int id = 1; id < S_END; id++) {
        size_t o, n;
        if (!lm__plan_package_section(data, size, id, &o, &n, NULL)) continue;
        uint8_t *c = data + PKG_FIXED + (size_t)(id - 1) * PKG_ENTRY + 4;
        pu(&c, crc32_of(data + o, n), 4);
    }
    uint8_t *c = data + HEADER_BYTES - 8;
    pu(&c, crc32_of(data, HEADER_BYTES - 8), 4);
}

/* ---- loader ---------------------------------------------------------------------------------------- */
typedef struct loader {
    const char *src;     /* the path or the caller's source name */
    const uint8_t *data; /* [size] the package */
    size_t size;
    int64_t off[S_END], bytes[S_END], count[S_END];
    lm_plan *p;         /* being filled */
    gop_rec *gops;      /* [count[S_GRAPH_OPS]] */
    int32_t *enclosing; /* [nsteps] repeat count around each step (1 outside) */
} loader;

static lm_status bad(const loader *L, const char *fmt, ...) LM__PRINTF(2, 3);
static lm_status bad(const loader *L, const char *fmt, ...) {
    char msg[400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return lm__error(LM_PARSE_ERROR, "plan package '%s': %s", L->src, msg);
}

static const uint8_t *rec(const loader *L, int id, int64_t i) {
    return L->data + L->off[id] + (size_t)(i * k_sec[id].rec);
}

/* 1 when the product of dims[0..nd) is at most 2^40 (no int64 overflow anywhere after). */
static int numel_ok(int nd, const int64_t *dims) {
    int64_t n = 1;
    for (int d = 0; d < nd; d++) {
        if (dims[d] < 1 || dims[d] > (1LL << 40) / n) return 0;
        n *= dims[d];
    }
    return 1;
}

static lm_status read_header(loader *L) {
    const uint8_t *d = L->data;
    if (L->size < PKG_FIXED) return bad(L, "truncated: %zu bytes, the header alone needs %d", L->size, HEADER_BYTES);
    if (memcmp(d, k_magic, 8)) return bad(L, "not a loom plan package (bad magic)");
    const uint8_t *c = d + 8;
    uint32_t version = (uint32_t)gu(&c, 4), hbytes = (uint32_t)gu(&c, 4);
    uint64_t fbytes = gu(&c, 8);
    uint32_t nsec = (uint32_t)gu(&c, 4), flags = (uint32_t)gu(&c, 4);
    int64_t tiles = gi64(&c), sram = gi64(&c);
    if (version != PKG_VERSION) return bad(L, "format version %u (this loom reads version %u)", version, PKG_VERSION);
    if (nsec != NSEC || hbytes != HEADER_BYTES)
        return bad(L, "header: %u sections in %u bytes (version %u has %d in %d)", nsec, hbytes, PKG_VERSION, NSEC,
                   HEADER_BYTES);
    if (L->size < HEADER_BYTES) return bad(L, "truncated: %zu bytes, the header alone needs %d", L->size, HEADER_BYTES);
    c = d + HEADER_BYTES - 8;
    uint32_t hcrc = (uint32_t)gu(&c, 4), pad = (uint32_t)gu(&c, 4);
    if (hcrc != crc32_of(d, HEADER_BYTES - 8)) return bad(L, "header checksum mismatch (the header is corrupt)");
    if (fbytes != L->size)
        return bad(L, "%s: the file has %zu bytes, its header says %llu",
                   fbytes > L->size ? "truncated" : "trailing bytes", L->size, (unsigned long long)fbytes);
    for (int i = 48; i < 64; i++) pad |= d[i];
    if (flags || pad) return bad(L, "header: reserved fields are not zero");
    if (tiles < 1 || sram < 1) return bad(L, "header: %lld tiles of %lld bytes", (long long)tiles, (long long)sram);
    int64_t at = HEADER_BYTES;
    for (int id = 1; id < S_END; id++) {
        c = d + PKG_FIXED + (size_t)(id - 1) * PKG_ENTRY;
        uint32_t sid = (uint32_t)gu(&c, 4), crc = (uint32_t)gu(&c, 4);
        int64_t o = gi64(&c), n = gi64(&c), k = gi64(&c);
        if (sid != (uint32_t)id) return bad(L, "section table entry %d has id %u (expected %d)", id - 1, sid, id);
        if (o != at || n < 0 || (uint64_t)n > L->size - (uint64_t)o)
            return bad(L, "section '%s': bytes [%lld, +%lld) do not follow the previous section inside the file",
                       k_sec[id].name, (long long)o, (long long)n);
        int64_t r = k_sec[id].rec;
        if (r ? (k < 0 || k > n / r || k * r != n) : (k != 1 || n < 2))
            return bad(L, "section '%s': %lld bytes do not hold %lld records of %lld bytes", k_sec[id].name,
                       (long long)n, (long long)k, (long long)r);
        if (crc != crc32_of(d + o, (size_t)n))
            return bad(L, "section '%s': checksum mismatch (its bytes are corrupt)", k_sec[id].name);
        L->off[id] = o, L->bytes[id] = n, L->count[id] = k;
        at = o + n;
    }
    if ((uint64_t)at != L->size) return bad(L, "%llu bytes after the last section", (unsigned long long)(L->size - at));
    if (L->count[S_SUMMARY] != 1)
        return bad(L, "section 'summary': %lld records (1 expected)", (long long)L->count[S_SUMMARY]);
    (void)tiles;
    return LM_OK;
}

static lm_status read_machine(loader *L, const lm_plan_machine *expect) {
    int64_t n = L->bytes[S_MACHINE];
    char *json = lm__alloc((size_t)n + 1, 1);
    if (!json) return LM_OUT_OF_MEMORY;
    memcpy(json, L->data + L->off[S_MACHINE], (size_t)n);
    json[n] = '\0';
    char where[300];
    snprintf(where, sizeof where, "%s: machine section", L->src);
    lm_plan_machine *m = NULL;
    if (strlen(json) != (size_t)n) {
        lm__free(json);
        return bad(L, "section 'machine': the JSON text holds a NUL byte");
    }
    lm_status st = lm_plan_machine_parse(json, where, &m);
    if (st != LM_OK) {
        lm__free(json);
        return st == LM_OUT_OF_MEMORY ? st : lm__error_context(LM_PARSE_ERROR, "plan package '%s'", L->src);
    }
    char *canon = NULL;
    st = lm_plan_machine_to_json(m, &canon);
    if (st == LM_OK && strcmp(canon, json))
        st = bad(L, "section 'machine': not in this loom's lm_plan_machine_to_json form (written by another version, "
                    "or edited)");
    lm_free(canon);
    lm__free(json);
    const uint8_t *c = L->data + 32;
    int64_t tiles = gi64(&c), sram = gi64(&c);
    char why[160];
    if (st == LM_OK && (tiles != m->tiles || sram != m->sram_bytes))
        st = bad(L, "header says %lld tiles x %lld bytes, the machine section %lld x %lld", (long long)tiles,
                 (long long)sram, (long long)m->tiles, (long long)m->sram_bytes);
    if (st == LM_OK && expect && !machine_same(m, expect, why, sizeof why))
        st = bad(L, "built for machine '%s' (%lld tiles x %lld bytes), not for '%s' (%lld tiles x %lld bytes): %s",
                 m->name, (long long)m->tiles, (long long)m->sram_bytes, expect->name, (long long)expect->tiles,
                 (long long)expect->sram_bytes, why);
    if (st == LM_OK && L->count[S_TILES] != m->tiles)
        st = bad(L, "section 'tiles': %lld records for %lld tiles", (long long)L->count[S_TILES], (long long)m->tiles);
    if (st == LM_OK) L->p->m = *m;
    lm_plan_machine_destroy(m);
    return st;
}

static lm_status read_summary(loader *L) {
    const uint8_t *c = rec(L, S_SUMMARY, 0);
    lm_plan_summary *s = &L->p->summary;
    s->predicted_cycles = gf64(&c);
    s->lower_bound_cycles = gf64(&c);
    s->matmul_flops = gf64(&c);
    s->sram_peak_bytes = gi64(&c);
    s->sram_live_bound = gi64(&c);
    s->sram_alloc_ratio = gf64(&c);
    s->exchange_bytes = gi64(&c);
    s->compute_steps = gi64(&c);
    s->exchange_steps = gi64(&c);
    s->kernel_calls = gi64(&c);
    s->transfers = gi64(&c);
    s->plan_seconds = gf64(&c);
    s->candidates_costed = gi64(&c);
    s->planner_peak_bytes = gi64(&c);
    double d[] = {s->predicted_cycles, s->lower_bound_cycles, s->matmul_flops, s->sram_alloc_ratio, s->plan_seconds};
    for (size_t i = 0; i < sizeof d / sizeof d[0]; i++)
        if (!(isfinite(d[i]) && d[i] >= 0)) return bad(L, "section 'summary': field %zu is %g", i, d[i]);
    if (s->candidates_costed < 0 || s->planner_peak_bytes < 0)
        return bad(L, "section 'summary': negative planner figures");
    return LM_OK;
}

/* ---- the graph: replayed through the builders ---------------------------------------------------------- */
/* Compare a rebuilt op/value with its record. */
static lm_status same_op(const loader *L, const lm_graph *g, int64_t k, const gop_rec *r) {
    const lm__gop *op = &g->ops[k];
    const lm__gvalue *v = &g->values[k];
    const char *what = NULL;
    if (g->nops <= k || g->nvalues <= k || op->out != k || v->op != k)
        what = "value numbering";
    else if (op->kind != r->kind || strcmp(op->name, r->name))
        what = "kind or name";
    else if (op->nin != r->nin || memcmp(op->in, r->in, sizeof op->in))
        what = "inputs";
    else if (memcmp(&op->a, &r->a, 8) || memcmp(&op->b, &r->b, 8) || memcmp(op->i, r->i, sizeof op->i))
        what = "attributes";
    else if (memcmp(op->perm, r->perm, sizeof op->perm))
        what = "permutation";
    else if (v->ndim != r->ndim || v->dtype != r->dtype || v->region != r->region || op->region != r->region)
        what = "value";
    for (int d = 0; !what && d < 4; d++)
        if ((d < v->ndim ? v->dims[d] : 0) != r->dims[d]) what = "shape";
    if (what)
        return bad(L, "graph op %lld '%s': its record disagrees with the op rebuilt from it (%s)", (long long)k,
                   r->name, what);
    return LM_OK;
}

/* The checks of plan.c's supported(): what the tile machine and the reference run. */
static lm_status graph_supported(const loader *L, const lm_graph *g) {
    int outputs = 0;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        int ok_kind = op->kind <= LM__GOP_REPEAT_OUT || op->kind == LM__GOP_SWIGLU || op->kind == LM__GOP_ROPE ||
                      op->kind == LM__GOP_ATTENTION;
        if (!ok_kind) return bad(L, "graph op '%s' (%s) has no tile-machine kernel", op->name, lm__gop_name(op->kind));
        const lm__gvalue *v = &g->values[op->out];
        outputs += v->output;
        if (v->dtype == LM_I32) {
            if (op->kind != LM__GOP_INPUT && !lm__gop_is_view(op->kind))
                return bad(L, "graph op '%s' (%s) produces i32", op->name, lm__gop_name(op->kind));
            for (int64_t j = 0; j < g->nops; j++) {
                const lm__gop *u = &g->ops[j];
                for (int k = 0; k < u->nin; k++)
                    if (u->in[k] == op->out && !lm__gop_is_view(u->kind) && !(u->kind == LM__GOP_ROPE && k == 1))
                        return bad(L, "graph op '%s' reads the i32 value '%s' (only RoPE positions may be i32)",
                                   u->name, v->name);
            }
        } else if (v->dtype != LM_F32 && v->dtype != LM_F16) {
            return bad(L, "graph op '%s': dtype %s", op->name, lm_dtype_name(v->dtype));
        }
        if (op->kind == LM__GOP_MATMUL) {
            const lm__gvalue *a = &g->values[op->in[0]], *b = &g->values[op->in[1]];
            if (a->ndim > 3 || a->dtype != b->dtype)
                return bad(L, "graph matmul '%s': needs [B?,M,K] x [B?,K,N] operands of one dtype", op->name);
        }
        if (op->kind == LM__GOP_ATTENTION && g->values[op->in[0]].dims[0] != 1)
            return bad(L, "graph attention '%s': batch %lld", op->name, (long long)g->values[op->in[0]].dims[0]);
        int first = op->kind == LM__GOP_ROPE ? 2 : 1;
        if (op->kind == LM__GOP_BIAS_ADD || op->kind == LM__GOP_LAYERNORM || op->kind == LM__GOP_RMSNORM ||
            op->kind == LM__GOP_ROPE)
            for (int k = first; k < op->nin; k++)
                if (op->in[k] >= 0 && g->ops[g->values[op->in[k]].op].kind != LM__GOP_PARAM)
                    return bad(L, "graph op '%s' (%s): its bias/scale/inv_freq must be a parameter", op->name,
                               lm__gop_name(op->kind));
    }
    if (!outputs) return bad(L, "the graph has no outputs");
    return LM_OK;
}

static lm_status replay_op(loader *L, lm_graph *g, int64_t k, int64_t *consumed) {
    const gop_rec *r = &L->gops[k];
    int64_t n = L->count[S_GRAPH_OPS];
    lm_graph_value out = -1;
    const int *in = r->in;
    *consumed = 1;
    if (r->nin < 0 || r->nin > LM__G_MAX_IN) return bad(L, "graph op %lld: %d inputs", (long long)k, r->nin);
    for (int i = r->nin; i < LM__G_MAX_IN; i++)
        if (in[i] != -1)
            return bad(L, "graph op %lld '%s': input slot %d is set past its %d inputs", (long long)k, r->name, i,
                       r->nin);
    if (r->ndim < 1 || r->ndim > 4) return bad(L, "graph op %lld '%s': %d dimensions", (long long)k, r->name, r->ndim);
    if ((unsigned)r->dtype >= LM_DTYPE_COUNT)
        return bad(L, "graph op %lld '%s': dtype %u", (long long)k, r->name, (unsigned)r->dtype);
#define NEED(cnt)                                                                                                      \
    if (r->nin != (cnt))                                                                                               \
    return bad(L, "graph op %lld '%s' (%s): %d inputs", (long long)k, r->name, lm__gop_name(r->kind), r->nin)
    lm_status st;
    switch (r->kind) {
    case LM__GOP_INPUT:
        NEED(0);
        if (r->a != 0.0) return bad(L, "graph input '%s': mean %g (inputs have mean 0)", r->name, r->a);
        st = lm_graph_input(g, r->name, r->dtype, r->ndim, r->dims, r->b, &out);
        break;
    case LM__GOP_PARAM:
        NEED(0);
        st = lm_graph_param(g, r->name, r->dtype, r->ndim, r->dims, r->a, r->b, &out);
        break;
    case LM__GOP_MATMUL:
        NEED(2);
        st = lm_graph_matmul(g, r->name, in[0], in[1], r->dtype, &out);
        break;
    case LM__GOP_BIAS_ADD:
        NEED(2);
        st = lm_graph_bias_add(g, r->name, in[0], in[1], &out);
        break;
    case LM__GOP_GELU:
    case LM__GOP_SILU:
        NEED(1);
        st = lm_graph_unary(g, r->name, r->kind == LM__GOP_GELU ? LM_GRAPH_GELU : LM_GRAPH_SILU, in[0], &out);
        break;
    case LM__GOP_ADD:
    case LM__GOP_MUL:
        NEED(2);
        st = lm_graph_binary(g, r->name, r->kind == LM__GOP_ADD ? LM_GRAPH_ADD : LM_GRAPH_MUL, in[0], in[1], &out);
        break;
    case LM__GOP_SOFTMAX:
        NEED(1);
        st = lm_graph_softmax(g, r->name, in[0], r->a, &out);
        break;
    case LM__GOP_LAYERNORM:
        if (r->nin != 2 && r->nin != 3) NEED(3);
        st = lm_graph_layer_norm(g, r->name, in[0], in[1], r->nin == 3 ? in[2] : -1, r->a, &out);
        break;
    case LM__GOP_RMSNORM:
        NEED(2);
        st = lm__graph_rmsnorm(g, r->name, in[0], in[1], r->a, r->dtype, &out);
        break;
    case LM__GOP_RESHAPE:
        NEED(1);
        st = lm_graph_reshape(g, r->name, in[0], r->ndim, r->dims, &out);
        break;
    case LM__GOP_PERMUTE:
        NEED(1);
        st = lm_graph_permute(g, r->name, in[0], r->perm, &out);
        break;
    case LM__GOP_SWIGLU:
        NEED(2);
        st = lm_graph_swiglu(g, r->name, in[0], in[1], &out);
        break;
    case LM__GOP_ROPE:
        NEED(3);
        st = lm_graph_rope(g, r->name, in[0], in[1], in[2], r->a, &out);
        break;
    case LM__GOP_ATTENTION:
        NEED(3);
        if (r->i[0] != 0 && r->i[0] != 1)
            return bad(L, "graph attention '%s': causal flag %lld", r->name, (long long)r->i[0]);
        st = lm_graph_attention(g, r->name, in[0], in[1], in[2], r->a, (int)r->i[0], r->i[1], &out);
        break;
    case LM__GOP_REPEAT_IN:
    case LM__GOP_REPEAT_OUT: {
        /* a run of carried values opens (closes) one region */
        int cnt = 0;
        lm_graph_value vals[LM__G_MAX_CARRY], res[LM__G_MAX_CARRY];
        while (k + cnt < n && L->gops[k + cnt].kind == r->kind && cnt < LM__G_MAX_CARRY) {
            if (L->gops[k + cnt].nin != 1)
                return bad(L, "graph op %lld: a repeat carry with %d inputs", (long long)(k + cnt),
                           L->gops[k + cnt].nin);
            vals[cnt] = L->gops[k + cnt].in[0];
            cnt++;
        }
        if (r->kind == LM__GOP_REPEAT_IN) {
            int reg = g->nregions;
            if (reg >= L->count[S_GRAPH_REGIONS])
                return bad(L, "graph op %lld opens region %d of %lld", (long long)k, reg,
                           (long long)L->count[S_GRAPH_REGIONS]);
            lm__gregion rg;
            const uint8_t *c = rec(L, S_GRAPH_REGIONS, reg);
            g_region(&c, &rg);
            st = lm_graph_repeat_begin(g, rg.count, cnt, vals, res);
        } else {
            st = lm_graph_repeat_end(g, cnt, vals, res);
        }
        if (st != LM_OK) break;
        if (g->nops != k + cnt || g->nvalues != k + cnt) return bad(L, "graph op %lld: value numbering", (long long)k);
        for (int i = 0; i < cnt; i++) LM_TRY(same_op(L, g, k + i, &L->gops[k + i]));
        *consumed = cnt;
        return LM_OK;
    }
    default:
        return bad(L, "graph op %lld '%s': kind %d has no tile-machine kernel", (long long)k, r->name, (int)r->kind);
    }
#undef NEED
    if (st == LM_OUT_OF_MEMORY) return st;
    if (st != LM_OK) return lm__error_context(LM_PARSE_ERROR, "plan package '%s': graph op %lld", L->src, (long long)k);
    if (g->nops != k + 1 || g->nvalues != k + 1 || out != k)
        return bad(L, "graph op %lld: value numbering", (long long)k);
    if (!numel_ok(g->values[k].ndim, g->values[k].dims))
        return bad(L, "graph op %lld '%s': more than 2^40 elements", (long long)k, r->name);
    return same_op(L, g, k, r);
}

static lm_status read_graph(loader *L) {
    int64_t n = L->count[S_GRAPH_OPS], nchk = L->count[S_GRAPH_CHECKS];
    if (n < 1 || n > (1 << 24)) return bad(L, "section 'graph ops': %lld ops", (long long)n);
    if (L->count[S_GRAPH_REGIONS] > 8)
        return bad(L, "section 'graph regions': %lld regions (at most 8)", (long long)L->count[S_GRAPH_REGIONS]);
    L->gops = lm__alloc(sizeof *L->gops * (size_t)n, 16);
    if (!L->gops) return LM_OUT_OF_MEMORY;
    for (int64_t k = 0; k < n; k++) {
        const uint8_t *c = rec(L, S_GRAPH_OPS, k);
        if (!g_gop(&c, &L->gops[k])) return bad(L, "graph op %lld: its name has no terminating NUL", (long long)k);
    }
    LM_TRY(lm_graph_create(&L->p->g));
    lm_graph *g = L->p->g;
    int64_t next = 0; /* checkpoints join as soon as their value exists, in order */
    for (int64_t k = 0; k <= n; k++) {
        while (next < nchk) {
            const uint8_t *c = rec(L, S_GRAPH_CHECKS, next);
            int32_t v = gi32(&c);
            char name[64];
            if (!gstr(&c, name, 64))
                return bad(L, "graph checkpoint %lld: its name has no terminating NUL", (long long)next);
            if (v < 0 || v >= n)
                return bad(L, "graph checkpoint %lld '%s': value %d of %lld", (long long)next, name, v, (long long)n);
            if (v >= g->nvalues) break;
            lm_status st = lm_graph_checkpoint(g, v, name);
            if (st == LM_OUT_OF_MEMORY) return st;
            if (st != LM_OK)
                return lm__error_context(LM_PARSE_ERROR, "plan package '%s': graph checkpoint %lld", L->src,
                                         (long long)next);
            next++;
        }
        if (k == n) break;
        int64_t used = 1;
        LM_TRY(replay_op(L, g, k, &used));
        k += used - 1;
    }
    if (next != nchk) return bad(L, "graph checkpoint %lld cannot be placed", (long long)next);
    if (g->open_region >= 0) return bad(L, "the graph's last repeat is not closed");
    if (g->nregions != L->count[S_GRAPH_REGIONS])
        return bad(L, "section 'graph regions': %lld records for %d repeats", (long long)L->count[S_GRAPH_REGIONS],
                   g->nregions);
    for (int r = 0; r < g->nregions; r++) {
        lm__gregion rg, *b = &g->regions[r];
        const uint8_t *c = rec(L, S_GRAPH_REGIONS, r);
        g_region(&c, &rg);
        int same = rg.count == b->count && rg.begin == b->begin && rg.end == b->end && rg.ncarry == b->ncarry;
        for (int i = 0; same && i < 4; i++)
            same = rg.outer_in[i] == (i < b->ncarry ? b->outer_in[i] : -1) &&
                   rg.body_in[i] == (i < b->ncarry ? b->body_in[i] : -1) &&
                   rg.body_out[i] == (i < b->ncarry ? b->body_out[i] : -1) &&
                   rg.outer_out[i] == (i < b->ncarry ? b->outer_out[i] : -1);
        if (!same) return bad(L, "graph region %d: its record disagrees with the rebuilt repeat", r);
    }
    for (int64_t k = 0; k < n; k++) {
        if (L->gops[k].output != 0 && L->gops[k].output != 1)
            return bad(L, "graph value %lld: output flag %d", (long long)k, L->gops[k].output);
        if (!L->gops[k].output) continue;
        lm_status st = lm_graph_output(g, (lm_graph_value)k);
        if (st != LM_OK)
            return lm__error_context(LM_PARSE_ERROR, "plan package '%s': graph output %lld", L->src, (long long)k);
    }
    return graph_supported(L, g);
}

static int dtype_ok(lm_dtype dt) { return dt == LM_F32 || dt == LM_F16 || dt == LM_I32; }

/* ---- mid values and ops ------------------------------------------------------------------------------ */
static lm_status layout_ok(const loader *L, int64_t mv, const lm__plan_layout *l, const lm__gvalue *v) {
    int64_t T = L->p->m.tiles;
    const char *what = NULL;
    if (l->ndim != v->ndim || !dtype_ok(l->dtype))
        what = "rank differs from the graph value's, or its dtype is invalid";
    else if (l->nrep < 0 || l->nrep > LM__PLAN_MAX_REP || (l->partial != 0 && l->partial != 1) ||
             (l->partial && !l->nrep))
        what = "replica axes";
    else if (l->tile0 < 0 || l->tile0 >= T)
        what = "first tile";
    int seen = 0;
    for (int d = 0; !what && d < 4; d++) {
        if (d >= l->ndim) {
            if (l->dims[d] || l->block[d] || l->grid[d] || l->tstride[d] || l->order[d]) what = "fields past its dims";
            continue;
        }
        if (l->dims[d] != v->dims[d])
            what = "shape differs from the graph value";
        else if (l->block[d] < 1 || l->block[d] > l->dims[d] ||
                 l->grid[d] != lm__plan_ceil_div(l->dims[d], l->block[d]))
            what = "blocks";
        else if (l->tstride[d] < 0 || l->tstride[d] >= T)
            what = "tile strides";
        else if (l->order[d] < 0 || l->order[d] >= l->ndim || (seen >> l->order[d] & 1))
            what = "storage order";
        else
            seen |= 1 << l->order[d];
    }
    for (int a = 0; !what && a < LM__PLAN_MAX_REP; a++) {
        if (a >= l->nrep) {
            if (l->rcount[a] || l->rstride[a]) what = "fields past its replica axes";
        } else if (l->rcount[a] < 1 || l->rcount[a] > T || l->rstride[a] < 0 || l->rstride[a] >= T) {
            what = "replica axes";
        }
    }
    int64_t places = 1; /* shards x replicas, each on its own tile */
    for (int d = 0; !what && d < l->ndim + l->nrep; d++) {
        int64_t k = d < l->ndim ? l->grid[d] : l->rcount[d - l->ndim];
        if (k > T / places)
            what = "more shards and replicas than tiles";
        else
            places *= k;
    }
    if (!what && lm__plan_layout_shard_bytes(l) > L->p->m.sram_bytes) what = "a shard larger than the SRAM";
    if (!what && !lm__plan_layout_valid(l, T)) what = "two shards on one tile or a tile out of range";
    if (what) return bad(L, "mid value %lld ('%s'): layout: %s", (long long)mv, v->name, what);
    return LM_OK;
}

static lm_status read_mid(loader *L) {
    lm_plan *p = L->p;
    const lm_graph *g = p->g;
    lm__plan_mid *mid = &p->mid;
    int64_t nv = L->count[S_MID_VALUES], no = L->count[S_MID_OPS];
    if (nv > (1 << 24) || no > (1 << 24)) return bad(L, "%lld mid values, %lld mid ops", (long long)nv, (long long)no);
    mid->vals = lm__calloc((size_t)nv + 1, sizeof *mid->vals);
    mid->ops = lm__calloc((size_t)no + 1, sizeof *mid->ops);
    if (!mid->vals || !mid->ops) return LM_OUT_OF_MEMORY;
    mid->cap_vals = nv + 1, mid->cap_ops = no + 1;
    mid->nvals = nv, mid->nops = no;
    mid->cost = p->summary.predicted_cycles;
    for (int64_t k = 0; k < nv; k++) {
        lm__plan_mval *v = &mid->vals[k];
        const uint8_t *c = rec(L, S_MID_VALUES, k);
        v->value = gi32(&c);
        v->view_of = gi32(&c);
        v->placed = gi32(&c);
        v->stacked = gi32(&c);
        v->region = gi32(&c);
        c += 4;
        g_layout(&c, &v->l);
        if (v->value < 0 || v->value >= g->nvalues)
            return bad(L, "mid value %lld: graph value %d of %lld", (long long)k, v->value, (long long)g->nvalues);
        const lm__gvalue *gv = &g->values[v->value];
        if (v->view_of < -1 || v->view_of >= k)
            return bad(L, "mid value %lld ('%s'): view of mid value %d", (long long)k, gv->name, v->view_of);
        if (v->placed != 0 && v->placed != 1)
            return bad(L, "mid value %lld ('%s'): placed flag %d", (long long)k, gv->name, v->placed);
        if (v->region != gv->region)
            return bad(L, "mid value %lld ('%s'): region %d, the graph value's is %d", (long long)k, gv->name,
                       v->region, gv->region);
        int64_t copies = gv->region >= 0 ? g->regions[gv->region].count : 1;
        if (v->stacked < 1 || v->stacked > copies)
            return bad(L, "mid value %lld ('%s'): %d stacked copies", (long long)k, gv->name, v->stacked);
        if (v->placed) {
            lm__gopk kind = g->ops[gv->op].kind;
            if (kind != LM__GOP_INPUT && kind != LM__GOP_PARAM)
                return bad(L, "mid value %lld ('%s'): placed but not an input or parameter", (long long)k, gv->name);
        }
        if (v->view_of >= 0 && mid->vals[v->view_of].view_of >= 0)
            return bad(L, "mid value %lld ('%s'): a view of a view", (long long)k, gv->name);
        LM_TRY(layout_ok(L, k, &v->l, gv));
    }
    for (int64_t k = 0; k < no; k++) {
        lm__plan_mop *o = &mid->ops[k];
        const uint8_t *c = rec(L, S_MID_OPS, k);
        o->kind = (lm__plan_mk)gu(&c, 4);
        o->gop = gi32(&c);
        o->out = gi32(&c);
        for (int i = 0; i < 3; i++) o->in[i] = gi32(&c);
        o->nin = gi32(&c);
        o->body_end = gi32(&c);
        o->check = gi32(&c);
        o->epi = gi32(&c);
        for (int i = 0; i < 4; i++) o->grid[i] = gi64(&c);
        o->count = gi64(&c);
        o->steps = gi64(&c);
        o->cost = gf64(&c);
        o->flash_k = o->flash_v = -1;
        if ((unsigned)o->kind > LM__PLAN_M_CHECKPOINT)
            return bad(L, "mid op %lld: kind %u", (long long)k, (unsigned)o->kind);
        if (o->gop < -1 || o->gop >= g->nops)
            return bad(L, "mid op %lld: graph op %d of %lld", (long long)k, o->gop, (long long)g->nops);
        if ((o->kind == LM__PLAN_M_COMPUTE || o->kind == LM__PLAN_M_FLASH) && o->gop < 0)
            return bad(L, "mid op %lld: a compute without its graph op", (long long)k);
        if (o->out < -1 || o->out >= nv)
            return bad(L, "mid op %lld: output mid value %d of %lld", (long long)k, o->out, (long long)nv);
        if (o->kind <= LM__PLAN_M_FLASH && o->out < 0) return bad(L, "mid op %lld: no output", (long long)k);
        if (o->nin < 0 || o->nin > 3) return bad(L, "mid op %lld: %d inputs", (long long)k, o->nin);
        for (int i = 0; i < 3; i++)
            if (i < o->nin ? (o->in[i] < 0 || o->in[i] >= nv) : o->in[i] != -1)
                return bad(L, "mid op %lld: input %d is mid value %d", (long long)k, i, o->in[i]);
        if (o->kind == LM__PLAN_M_CHECKPOINT &&
            (o->check >= 0 ? o->check >= g->nchecks : (-1 - (int64_t)o->check) >= g->nvalues))
            return bad(L, "mid op %lld: checkpoint %d", (long long)k, o->check);
        if (!isfinite(o->cost)) return bad(L, "mid op %lld: cost %g", (long long)k, o->cost);
        int host = o->kind == LM__PLAN_M_REDUCE ||
                   (o->kind == LM__PLAN_M_COMPUTE && g->ops[o->gop].kind == LM__GOP_MATMUL);
        if (o->epi && (!host || !lm__plan_epi_valid(o->epi) ||
                       o->nin != (o->kind == LM__PLAN_M_REDUCE ? 1 : 2) + (o->epi & LM__PLAN_EPI_BIAS)))
            return bad(L, "mid op %lld: epilogue %d on a %s of %d inputs", (long long)k, o->epi,
                       lm__plan_mid_kind_name(o->kind), o->nin);
    }
    return LM_OK;
}

/* ---- the low program ----------------------------------------------------------------------------------- */
/* Buffer b on tile t, and its copies inside the tile's allocated peak. */
static lm_status buf_ok(const loader *L, int64_t b, int64_t t, const char *what) {
    const lm__plan_low *low = &L->p->low;
    if (b < 0 || b >= low->nbufs) return bad(L, "%s: buffer %lld of %lld", what, (long long)b, (long long)low->nbufs);
    const lm__plan_buf *x = &low->bufs[b];
    if (x->tile != t)
        return bad(L, "%s: buffer %lld lives on tile %d, not %lld", what, (long long)b, x->tile, (long long)t);
    int64_t peak = low->peak[t];
    if (x->offset > peak || x->bytes > peak - x->offset || (x->bytes && x->copies > (peak - x->offset) / x->bytes))
        return bad(L, "%s: buffer %lld ([%lld, +%lld x %lld)) leaves tile %lld's %lld allocated bytes", what,
                   (long long)b, (long long)x->offset, (long long)x->bytes, (long long)x->copies, (long long)t,
                   (long long)peak);
    return LM_OK;
}

/* Elements off + sum_d x_d * str[d] (0 <= x_d < ext[d]) of es bytes inside bytes. */
static int span_in(int64_t bytes, int64_t es, int64_t off, int nd, const int64_t *ext, const int64_t *str) {
    int64_t lim = bytes / es; /* elements available */
    if (off < 0 || off >= lim) return 0;
    int64_t acc = off;
    for (int d = 0; d < nd; d++) {
        if (ext[d] < 1) return 0;
        if (str[d] < 0) return 0;
        if (str[d] && ext[d] - 1 > (lim - 1 - acc) / str[d]) return 0;
        acc += (ext[d] - 1) * str[d];
    }
    return 1;
}

/* A present operand on tile t: buffer, dims, strides and its box inside one copy of the buffer. */
static lm_status opnd_ok(const loader *L, const lm__plan_opnd *o, int64_t t, const char *what) {
    LM_TRY(buf_ok(L, o->buf, t, what));
    if (o->ndim < 1 || o->ndim > 4 || !dtype_ok(o->dtype))
        return bad(L, "%s: %d dims of dtype %u", what, o->ndim, (unsigned)o->dtype);
    int64_t ext[4], str[4];
    for (int d = 0; d < o->ndim; d++) {
        if (o->dims[d] < 1 || o->strides[d] < 0)
            return bad(L, "%s: dim %d is %d with stride %d", what, d, o->dims[d], o->strides[d]);
        ext[d] = o->dims[d], str[d] = o->strides[d];
    }
    if (!numel_ok(o->ndim, ext)) return bad(L, "%s: more than 2^40 elements", what);
    const lm__plan_buf *b = &L->p->low.bufs[o->buf];
    if (!span_in(b->bytes, (int64_t)lm_dtype_size(o->dtype), o->off, o->ndim, ext, str))
        return bad(L, "%s: the box at element %lld leaves buffer %d (%lld bytes)", what, (long long)o->off, o->buf,
                   (long long)b->bytes);
    return LM_OK;
}

/* An extra footprint a kernel reads beyond the operand's own box (bias rows, norm
 * scales, reduce pieces, flash states): ext/str in elements of es bytes from o's origin. */
static lm_status extra_ok(const loader *L, const lm__plan_opnd *o, int64_t es, int nd, const int64_t *ext,
                          const int64_t *str, const char *what) {
    const lm__plan_buf *b = &L->p->low.bufs[o->buf];
    int64_t off = o->off * (int64_t)lm_dtype_size(o->dtype);
    if (off % es || !span_in(b->bytes, es, off / es, nd, ext, str))
        return bad(L, "%s: the kernel's reads leave buffer %d (%lld bytes)", what, o->buf, (long long)b->bytes);
    return LM_OK;
}

/* Float-pointer state operands must be 4-byte aligned in every copy. */
static lm_status aligned4(const loader *L, const lm__plan_opnd *o, const char *what) {
    const lm__plan_buf *b = &L->p->low.bufs[o->buf];
    if (b->offset % 4 || (b->copies > 1 && b->bytes % 4) || o->dtype != LM_F32 || o->ndim != 3 || o->strides[2] != 1)
        return bad(L, "%s: a flash state must be a 3-d f32 box, rows contiguous, 4-byte aligned", what);
    return LM_OK;
}

static int same_dims(const lm__plan_opnd *a, const lm__plan_opnd *b) {
    if (a->ndim != b->ndim) return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d]) return 0;
    return 1;
}

/* One call as kernels.c runs it and check.c replays it. */
static lm_status call_ok(const loader *L, int64_t k, const lm__plan_call *c) {
    char what[96];
    snprintf(what, sizeof what, "call %lld (tile %d, kernel %d)", (long long)k, c->tile, c->kernel);
    if (c->tile < 0 || c->tile >= L->p->m.tiles) return bad(L, "%s: tile out of range", what);
    if (c->kernel < 0 || c->kernel >= LM__PLAN_K_COUNT) return bad(L, "%s: unknown kernel", what);
    if (c->nops < 0 || c->nops > 4) return bad(L, "%s: %d operands", what, c->nops);
    if (!isfinite(c->f[0]) || !isfinite(c->f[1]) || !isfinite(c->cycles) || c->cycles < 0)
        return bad(L, "%s: attributes not finite", what);
    static const uint8_t need[LM__PLAN_K_COUNT] = {
        /* bit i: operand i present; high nibble: optional operands */
        [LM__PLAN_K_MATMUL] = 0x87,      [LM__PLAN_K_BIAS] = 0x07,         [LM__PLAN_K_UNARY] = 0x03,
        [LM__PLAN_K_BINARY] = 0x07,      [LM__PLAN_K_SOFTMAX] = 0x03,      [LM__PLAN_K_LAYERNORM] = 0x87,
        [LM__PLAN_K_RMSNORM] = 0x07,     [LM__PLAN_K_COPY] = 0x03,         [LM__PLAN_K_REDUCE] = 0xE1,
        [LM__PLAN_K_FLASH_INIT] = 0x01,  [LM__PLAN_K_FLASH_UPDATE] = 0x07, [LM__PLAN_K_FLASH_COMBINE] = 0x03,
        [LM__PLAN_K_FLASH_FINAL] = 0x03, [LM__PLAN_K_ROPE] = 0x0f,
    };
    const lm__plan_opnd *o = c->op;
    for (int i = 0; i < 4; i++) {
        int present = o[i].buf >= 0, req = need[c->kernel] >> i & 1, opt = need[c->kernel] >> (4 + i) & 1;
        if (o[i].buf < -1 || (present && !req && !opt) || (!present && req))
            return bad(L, "%s: operand %d is %s", what, i, present ? "set but unused" : "missing");
        if (!present && (o[i].ndim != 0 || o[i].off != 0))
            return bad(L, "%s: absent operand %d carries a %d-d box", what, i, o[i].ndim);
        if (present) {
            char w2[128];
            snprintf(w2, sizeof w2, "%s operand %d", what, i);
            LM_TRY(opnd_ok(L, &o[i], c->tile, w2));
        }
    }
    int64_t e0 = lm__plan_opnd_elems(&o[0]);
    if (c->kernel == LM__PLAN_K_MATMUL || c->kernel == LM__PLAN_K_REDUCE) { /* a fused epilogue */
        const lm__plan_opnd *out = c->kernel == LM__PLAN_K_MATMUL ? &o[2] : &o[0];
        int64_t last = out->dims[out->ndim - 1], one[1] = {last}, s[1] = {o[3].strides[0]};
        int bias = (c->i[2] & LM__PLAN_EPI_BIAS) != 0;
        if (!lm__plan_epi_valid(c->i[2]) || bias != (o[3].buf >= 0) ||
            (c->kernel == LM__PLAN_K_MATMUL && c->i[2] && c->i[0]))
            return bad(L, "%s: epilogue %lld", what, (long long)c->i[2]);
        if (bias && (o[3].ndim != 1 || o[3].dims[0] != last)) return bad(L, "%s: epilogue bias shape", what);
        if (bias) LM_TRY(extra_ok(L, &o[3], (int64_t)lm_dtype_size(o[3].dtype), 1, one, s, what));
    }
    switch ((lm__plan_kk)c->kernel) {
    case LM__PLAN_K_MATMUL: {
        const lm__plan_opnd *A = &o[0], *B = &o[1], *C = &o[2];
        if (A->ndim != 3 || B->ndim != 3 || C->ndim != 3 || A->dims[0] != C->dims[0] || B->dims[0] != C->dims[0] ||
            A->dims[1] != C->dims[1] || B->dims[1] != A->dims[2] || B->dims[2] != C->dims[2] || C->dtype == LM_I32)
            return bad(L, "%s: operands are not [b,m,k] x [b,k,n] -> [b,m,n]", what);
        if (c->i[0] != 0 && c->i[0] != 1) return bad(L, "%s: accumulate flag %lld", what, (long long)c->i[0]);
        break;
    }
    case LM__PLAN_K_BIAS: {
        int64_t last = o[2].dims[o[2].ndim - 1], one[1] = {last}, s[1] = {o[1].strides[0]};
        if (e0 != lm__plan_opnd_elems(&o[2]) || o[1].ndim != 1 || o[1].dims[0] != last)
            return bad(L, "%s: operand shapes", what);
        LM_TRY(extra_ok(L, &o[1], (int64_t)lm_dtype_size(o[1].dtype), 1, one, s, what));
        break;
    }
    case LM__PLAN_K_UNARY:
    case LM__PLAN_K_COPY:
        if (e0 != lm__plan_opnd_elems(&o[1])) return bad(L, "%s: operand sizes differ", what);
        if (c->kernel == LM__PLAN_K_UNARY && c->i[0] != 0 && c->i[0] != 1)
            return bad(L, "%s: unary kind %lld", what, (long long)c->i[0]);
        break;
    case LM__PLAN_K_BINARY:
        if (e0 != lm__plan_opnd_elems(&o[1]) || e0 != lm__plan_opnd_elems(&o[2]) || (uint64_t)c->i[0] > 2)
            return bad(L, "%s: operand sizes or kind", what);
        break;
    case LM__PLAN_K_SOFTMAX:
    case LM__PLAN_K_LAYERNORM:
    case LM__PLAN_K_RMSNORM: {
        if (!same_dims(&o[0], &o[1])) return bad(L, "%s: input and output shapes differ", what);
        int64_t n[1] = {o[0].dims[o[0].ndim - 1]};
        for (int i = 2; i < 4; i++)
            if (o[i].buf >= 0) {
                int64_t s[1] = {o[i].strides[0]};
                if (o[i].ndim != 1 || o[i].dims[0] != n[0]) return bad(L, "%s: scale %d shape", what, i);
                LM_TRY(extra_ok(L, &o[i], (int64_t)lm_dtype_size(o[i].dtype), 1, n, s, what));
            }
        break;
    }
    case LM__PLAN_K_REDUCE: {
        if (c->i[0] < 0 || c->i[0] > (1 << 20) || c->i[1] < 0 || c->i[1] > (1LL << 40))
            return bad(L, "%s: %lld pieces %lld apart", what, (long long)c->i[0], (long long)c->i[1]);
        if (o[1].buf >= 0 && lm__plan_opnd_elems(&o[1]) != e0) return bad(L, "%s: operand sizes differ", what);
        if (c->i[0] > 0) {
            if (o[2].buf < 0 || lm__plan_opnd_elems(&o[2]) != e0)
                return bad(L, "%s: pieces missing or of another size", what);
            int64_t ext[5] = {c->i[0]}, str[5] = {c->i[1]};
            for (int d = 0; d < o[2].ndim; d++) ext[d + 1] = o[2].dims[d], str[d + 1] = o[2].strides[d];
            LM_TRY(extra_ok(L, &o[2], (int64_t)lm_dtype_size(o[2].dtype), o[2].ndim + 1, ext, str, what));
        }
        break;
    }
    case LM__PLAN_K_FLASH_INIT:
        if (o[0].dtype == LM_I32 || o[0].dims[o[0].ndim - 1] < 2) return bad(L, "%s: state shape", what);
        break;
    case LM__PLAN_K_FLASH_UPDATE: {
        const lm__plan_opnd *S = &o[0], *P = &o[1], *st = &o[2];
        LM_TRY(aligned4(L, st, what));
        if (S->ndim != 3 || S->dtype != LM_F32 || !same_dims(S, P) || P->dtype == LM_I32 || st->dims[0] != S->dims[0] ||
            st->dims[1] != S->dims[1] || st->dims[2] < 2)
            return bad(L, "%s: scores, probabilities and state disagree", what);
        if (c->i[0] != 0 && c->i[0] != 1) return bad(L, "%s: mask flag %lld", what, (long long)c->i[0]);
        if (llabs(c->i[1]) > (1LL << 40) || llabs(c->i[2]) > (1LL << 40)) return bad(L, "%s: mask offsets", what);
        break;
    }
    case LM__PLAN_K_FLASH_COMBINE: {
        const lm__plan_opnd *st = &o[0], *rv = &o[1];
        LM_TRY(aligned4(L, st, what));
        LM_TRY(aligned4(L, rv, what));
        if (!same_dims(st, rv) || st->dims[2] < 2) return bad(L, "%s: states disagree", what);
        if (c->i[0] < 0 || c->i[0] > (1 << 20) || c->i[1] < 0 || c->i[1] > (1LL << 40))
            return bad(L, "%s: %lld states %lld apart", what, (long long)c->i[0], (long long)c->i[1]);
        if (c->i[0] > 0) {
            int64_t ext[4] = {c->i[0], st->dims[0], st->dims[1], st->dims[2]},
                    str[4] = {c->i[1], rv->strides[0], rv->strides[1], 1};
            LM_TRY(extra_ok(L, rv, 4, 4, ext, str, what));
        }
        break;
    }
    case LM__PLAN_K_FLASH_FINAL: {
        const lm__plan_opnd *st = &o[0], *out = &o[1];
        LM_TRY(aligned4(L, st, what));
        if (out->ndim != 3 || out->dtype == LM_I32 || st->dims[0] != out->dims[0] || st->dims[1] != out->dims[1] ||
            st->dims[2] != out->dims[2] + 2)
            return bad(L, "%s: state and output disagree", what);
        break;
    }
    case LM__PLAN_K_ROPE: {
        const lm__plan_opnd *x = &o[0], *ps = &o[2], *fq = &o[3];
        if (x->ndim != 4 || !same_dims(x, &o[1]) || x->dtype == LM_I32 || o[1].dtype == LM_I32 || ps->dtype != LM_I32 ||
            ps->ndim != 2 || ps->dims[0] != x->dims[0] || ps->dims[1] != x->dims[1] || fq->dtype != LM_F32 ||
            fq->ndim != 1 || fq->dims[0] != x->dims[3] / 2)
            return bad(L, "%s: operand shapes or dtypes", what);
        break;
    }
    default: break;
    }
    /* the cost model of the package's machine must give the cycles the compiler stored:
     * the calls and the machine belong together */
    double want = lm__plan_call_cycles(&L->p->m, c);
    if (!(fabs(c->cycles - want) <= 1e-9 * fmax(1.0, fabs(want))))
        return bad(L, "%s: %.17g cycles, but machine '%s' costs it %.17g (a program for another machine?)", what,
                   c->cycles, L->p->m.name, want);
    return LM_OK;
}

static lm_status read_low(loader *L) {
    lm_plan *p = L->p;
    lm__plan_low *low = &p->low;
    int64_t T = p->m.tiles, S = L->count[S_STEPS];
    if (p->mid.nvals > 0 && T > (1LL << 28) / p->mid.nvals)
        return bad(L, "%lld mid values x %lld tiles is too large", (long long)p->mid.nvals, (long long)T);
    low->tiles = T;
    low->nmvals = p->mid.nvals;
    low->peak = lm__calloc((size_t)T, sizeof(int64_t));
    low->live_bound = lm__calloc((size_t)T, sizeof(int64_t));
    low->buf_of = lm__alloc(sizeof(int32_t) * (size_t)(low->nmvals * T + 1), 16);
    low->nsteps = low->cap_steps = S;
    low->ncalls = low->cap_calls = L->count[S_CALLS];
    low->nxfers = low->cap_xfers = L->count[S_TRANSFERS];
    low->nxdst = low->cap_xdst = L->count[S_DESTINATIONS];
    low->nbufs = low->cap_bufs = L->count[S_BUFFERS];
    low->steps = lm__calloc((size_t)S + 1, sizeof *low->steps);
    low->calls = lm__calloc((size_t)low->ncalls + 1, sizeof *low->calls);
    low->xfers = lm__calloc((size_t)low->nxfers + 1, sizeof *low->xfers);
    low->xdst = lm__calloc((size_t)low->nxdst + 1, sizeof *low->xdst);
    low->bufs = lm__calloc((size_t)low->nbufs + 1, sizeof *low->bufs);
    L->enclosing = lm__calloc((size_t)S + 1, sizeof *L->enclosing);
    if (!low->peak || !low->live_bound || !low->buf_of || !low->steps || !low->calls || !low->xfers || !low->xdst ||
        !low->bufs || !L->enclosing)
        return LM_OUT_OF_MEMORY;
    if (low->ncalls > INT32_MAX || low->nxfers > INT32_MAX || low->nbufs > INT32_MAX || S > INT32_MAX)
        return bad(L, "too many records");
    /* tiles */
    for (int64_t t = 0; t < T; t++) {
        const uint8_t *c = rec(L, S_TILES, t);
        low->peak[t] = gi64(&c);
        low->live_bound[t] = gi64(&c);
        if (low->peak[t] < 0 || low->peak[t] > p->m.sram_bytes || low->live_bound[t] < 0 ||
            low->live_bound[t] > low->peak[t])
            return bad(L, "tile %lld: peak %lld, live bound %lld bytes (SRAM %lld)", (long long)t,
                       (long long)low->peak[t], (long long)low->live_bound[t], (long long)p->m.sram_bytes);
    }
    /* buffers */
    for (int64_t b = 0; b < low->nbufs; b++) {
        lm__plan_buf *x = &low->bufs[b];
        const uint8_t *c = rec(L, S_BUFFERS, b);
        x->tile = gi32(&c);
        x->mval = gi32(&c);
        x->alias = gi32(&c);
        x->first = gi32(&c);
        x->last = gi32(&c);
        x->placed = gi32(&c);
        x->bytes = gi64(&c);
        x->copies = gi64(&c);
        x->offset = gi64(&c);
        if (x->tile < 0 || x->tile >= T || x->mval < -1 || x->mval >= p->mid.nvals || x->alias < -1 || x->alias >= b ||
            (x->alias >= 0 && low->bufs[x->alias].tile != x->tile) || (x->placed != 0 && x->placed != 1) ||
            x->first < -1 || x->first >= S + 1 || x->last < -1 || x->last > S || x->bytes < 0 ||
            x->bytes > p->m.sram_bytes || x->copies < 1 || x->copies > (1 << 24) || x->offset < 0 ||
            x->offset > p->m.sram_bytes)
            return bad(L,
                       "buffer %lld: fields out of range (tile %d, mid value %d, alias %d, %lld bytes x %lld at %lld)",
                       (long long)b, x->tile, x->mval, x->alias, (long long)x->bytes, (long long)x->copies,
                       (long long)x->offset);
        if (x->first >= 0 || x->placed) LM_TRY(buf_ok(L, b, x->tile, "buffer"));
    }
    /* buffer map */
    for (int64_t i = 0; i < low->nmvals * T; i++) low->buf_of[i] = -1;
    for (int64_t i = 0; i < L->count[S_BUFFER_MAP]; i++) {
        const uint8_t *c = rec(L, S_BUFFER_MAP, i);
        int32_t v = gi32(&c), t = gi32(&c), b = gi32(&c);
        if (v < 0 || v >= low->nmvals || t < 0 || t >= T || p->mid.vals[v].view_of >= 0)
            return bad(L, "buffer map entry %lld: mid value %d on tile %d", (long long)i, v, t);
        int32_t *slot = &low->buf_of[(size_t)v * (size_t)T + (size_t)t];
        if (*slot >= 0)
            return bad(L, "buffer map entry %lld: mid value %d has two buffers on tile %d", (long long)i, v, t);
        LM_TRY(buf_ok(L, b, t, "buffer map"));
        *slot = b;
    }
    /* steps: ranges in order, repeats paired, checks consistent */
    int64_t nc = 0, nx = 0, open = -1;
    for (int64_t s = 0; s < S; s++) {
        lm__plan_step *st = &low->steps[s];
        const uint8_t *c = rec(L, S_STEPS, s);
        st->kind = (lm__plan_sk)gu(&c, 4);
        st->mop = gi32(&c);
        st->c0 = gi64(&c);
        st->c1 = gi64(&c);
        st->x0 = gi64(&c);
        st->x1 = gi64(&c);
        st->nslots = gi32(&c);
        st->match = gi32(&c);
        st->count = gi64(&c);
        st->check = gi32(&c);
        st->mval = gi32(&c);
        if (!gstr(&c, st->label, 48)) return bad(L, "step %lld: its label has no terminating NUL", (long long)s);
        if ((unsigned)st->kind > LM__PLAN_S_END || st->mop < -1 || st->mop >= p->mid.nops)
            return bad(L, "step %lld: kind %u, mid op %d", (long long)s, (unsigned)st->kind, st->mop);
        int compute = st->kind == LM__PLAN_S_COMPUTE, xchg = st->kind == LM__PLAN_S_EXCHANGE;
        if (compute ? (st->c0 != nc || st->c1 < st->c0 || st->c1 > low->ncalls)
                    : (st->c0 != st->c1 || st->c0 < 0 || st->c0 > low->ncalls))
            return bad(L, "step %lld: calls [%lld, %lld) (the previous step ended at %lld of %lld)", (long long)s,
                       (long long)st->c0, (long long)st->c1, (long long)nc, (long long)low->ncalls);
        if (xchg ? (st->x0 != nx || st->x1 < st->x0 || st->x1 > low->nxfers)
                 : (st->x0 != st->x1 || st->x0 < 0 || st->x0 > low->nxfers))
            return bad(L, "step %lld: transfers [%lld, %lld) (the previous step ended at %lld of %lld)", (long long)s,
                       (long long)st->x0, (long long)st->x1, (long long)nx, (long long)low->nxfers);
        if (compute) nc = st->c1;
        if (xchg) nx = st->x1;
        if (st->nslots < 0 || st->nslots > (xchg ? st->x1 - st->x0 : 0) || (xchg && st->x1 > st->x0 && st->nslots < 1))
            return bad(L, "step %lld: %d slots for %lld transfers", (long long)s, st->nslots,
                       (long long)(st->x1 - st->x0));
        L->enclosing[s] = open >= 0 ? (int32_t)low->steps[open].count : 1;
        if (st->kind == LM__PLAN_S_REPEAT) {
            if (open >= 0) return bad(L, "step %lld: repeats do not nest", (long long)s);
            if (st->count < 1 || st->count > INT32_MAX || st->match <= s || st->match >= S)
                return bad(L, "step %lld: a repeat of %lld ending at step %d", (long long)s, (long long)st->count,
                           st->match);
            open = s;
        } else if (st->kind == LM__PLAN_S_END) {
            if (open < 0 || low->steps[open].match != s || st->match != open)
                return bad(L, "step %lld: an end without its repeat", (long long)s);
            open = -1;
        }
        if (st->kind == LM__PLAN_S_CHECK) {
            const lm_graph *g = p->g;
            if (st->mval < 0 || st->mval >= p->mid.nvals)
                return bad(L, "step %lld: checks mid value %d", (long long)s, st->mval);
            int value = p->mid.vals[st->mval].value, target;
            if (st->check >= 0) {
                if (st->check >= g->nchecks)
                    return bad(L, "step %lld: checkpoint %d of %lld", (long long)s, st->check, (long long)g->nchecks);
                target = g->checks[st->check].value;
            } else {
                target = -1 - st->check;
                if (target >= g->nvalues || !g->values[target].output)
                    return bad(L, "step %lld: value %d is not a program output", (long long)s, target);
            }
            if (target != value)
                return bad(L, "step %lld: checks '%s' but reads '%s'", (long long)s, g->values[target].name,
                           g->values[value].name);
            const lm__gvalue *gv = &g->values[value];
            int64_t count = gv->region >= 0 ? g->regions[gv->region].count : 1;
            if (count > 1 && L->enclosing[s] > count)
                return bad(L, "step %lld: checks '%s' in %d iterations, the reference records %lld", (long long)s,
                           gv->name, L->enclosing[s], (long long)count);
        } else if (st->check != -1 || st->mval != -1) {
            return bad(L, "step %lld: checkpoint fields on a step of kind %u", (long long)s, (unsigned)st->kind);
        }
        if (st->kind != LM__PLAN_S_REPEAT && st->kind != LM__PLAN_S_END && (st->count != 0 || st->match != -1))
            return bad(L, "step %lld: repeat fields on a step of kind %u", (long long)s, (unsigned)st->kind);
    }
    if (open >= 0) return bad(L, "step %lld: a repeat without its end", (long long)open);
    if (nc != low->ncalls || nx != low->nxfers)
        return bad(L, "%lld of %lld calls and %lld of %lld transfers belong to steps", (long long)nc,
                   (long long)low->ncalls, (long long)nx, (long long)low->nxfers);
    /* calls */
    for (int64_t k = 0; k < low->ncalls; k++) {
        lm__plan_call *x = &low->calls[k];
        const uint8_t *c = rec(L, S_CALLS, k);
        x->tile = gi32(&c);
        x->kernel = (int16_t)gu(&c, 2);
        x->nops = (int16_t)gu(&c, 2);
        for (int i = 0; i < 4; i++) g_opnd(&c, &x->op[i]);
        x->f[0] = gf32(&c);
        x->f[1] = gf32(&c);
        for (int i = 0; i < 3; i++) x->i[i] = gi64(&c);
        x->cycles = gf64(&c);
        LM_TRY(call_ok(L, k, x));
    }
    for (int64_t s = 0; s < S; s++) /* the simulator walks each compute step's calls tile by tile */
        for (int64_t k = low->steps[s].c0 + 1; k < low->steps[s].c1; k++)
            if (low->calls[k].tile < low->calls[k - 1].tile)
                return bad(L, "step %lld: calls are not grouped by tile (call %lld)", (long long)s, (long long)k);
    /* destinations, transfers */
    for (int64_t k = 0; k < low->nxdst; k++) {
        const uint8_t *c = rec(L, S_DESTINATIONS, k);
        low->xdst[k].tile = gi32(&c);
        c += 4;
        g_opnd(&c, &low->xdst[k].dst);
    }
    int64_t nd = 0;
    for (int64_t s = 0; s < S; s++)
        for (int64_t k = low->steps[s].x0; k < low->steps[s].x1; k++) {
            lm__plan_xfer *x = &low->xfers[k];
            const uint8_t *c = rec(L, S_TRANSFERS, k);
            x->src_tile = gi32(&c);
            x->slot = gi32(&c);
            g_opnd(&c, &x->src);
            x->bytes = gi64(&c);
            x->dst0 = gi64(&c);
            x->ndst = gi32(&c);
            char what[96];
            snprintf(what, sizeof what, "transfer %lld (step %lld)", (long long)k, (long long)s);
            if (x->src_tile < 0 || x->src_tile >= T || x->slot < 0 || x->slot >= low->steps[s].nslots)
                return bad(L, "%s: tile %d, slot %d of %d", what, x->src_tile, x->slot, low->steps[s].nslots);
            LM_TRY(opnd_ok(L, &x->src, x->src_tile, what));
            if (x->bytes != lm__plan_opnd_elems(&x->src) * (int64_t)lm_dtype_size(x->src.dtype))
                return bad(L, "%s: %lld bytes for its box", what, (long long)x->bytes);
            if (x->dst0 != nd || x->ndst < 1 || x->ndst > low->nxdst - nd)
                return bad(L, "%s: destinations [%lld, +%d) (expected from %lld of %lld)", what, (long long)x->dst0,
                           x->ndst, (long long)nd, (long long)low->nxdst);
            nd += x->ndst;
            for (int64_t d = x->dst0; d < x->dst0 + x->ndst; d++) {
                const lm__plan_xdst *xd = &low->xdst[d];
                if (xd->tile < 0 || xd->tile >= T) return bad(L, "%s: destination tile %d", what, xd->tile);
                LM_TRY(opnd_ok(L, &xd->dst, xd->tile, what));
                if (!same_dims(&xd->dst, &x->src) || xd->dst.dtype != x->src.dtype)
                    return bad(L, "%s: a destination box differs from the source's", what);
            }
        }
    if (nd != low->nxdst)
        return bad(L, "%lld of %lld destinations belong to transfers", (long long)nd, (long long)low->nxdst);
    return LM_OK;
}

/* Placement of inputs and parameters, and the checkpoints' reads, as sim.c does them. */
static lm_status data_ok(loader *L) {
    lm_plan *p = L->p;
    const lm__plan_mid *mid = &p->mid;
    const lm__plan_low *low = &p->low;
    for (int64_t mv = 0; mv < mid->nvals; mv++) {
        const lm__plan_mval *v = &mid->vals[mv];
        if (!v->placed || v->view_of >= 0) continue;
        int64_t S = lm__plan_layout_shards(&v->l), R = lm__plan_layout_reps(&v->l),
                need = lm__plan_layout_shard_bytes(&v->l);
        for (int64_t sh = 0; sh < S; sh++)
            for (int64_t r = 0; r < R; r++) {
                int64_t t = lm__plan_layout_tile(&v->l, sh, r);
                int32_t b = low->buf_of[(size_t)mv * (size_t)low->tiles + (size_t)t];
                if (b < 0 || low->bufs[b].bytes < need || low->bufs[b].copies < v->stacked || !low->bufs[b].placed)
                    return bad(L, "mid value %lld ('%s'): no placed buffer of %lld bytes x %d on tile %lld",
                               (long long)mv, p->g->values[v->value].name, (long long)need, v->stacked, (long long)t);
            }
    }
    for (int64_t s = 0; s < low->nsteps; s++) {
        const lm__plan_step *st = &low->steps[s];
        if (st->kind != LM__PLAN_S_CHECK) continue;
        const lm__plan_layout *l = &mid->vals[st->mval].l;
        for (int64_t sh = 0; sh < lm__plan_layout_shards(l); sh++) {
            int64_t lo[LM__PLAN_MAX_DIMS], hi[LM__PLAN_MAX_DIMS];
            if (!lm__plan_layout_box(l, sh, lo, hi)) continue;
            int64_t t = lm__plan_layout_tile(l, sh, 0);
            lm__plan_opnd o;
            if (lm__plan_low_operand(low, mid, st->mval, t, lo, hi, &o) != LM_OK)
                return bad(L, "step %lld: checkpoint shard %lld on tile %lld: %s", (long long)s, (long long)sh,
                           (long long)t, lm_last_error());
            char what[64];
            snprintf(what, sizeof what, "step %lld checkpoint shard %lld", (long long)s, (long long)sh);
            LM_TRY(opnd_ok(L, &o, t, what));
        }
    }
    return LM_OK;
}

static lm_status bindings_ok(loader *L) {
    int64_t n = lm_plan_binding_count(L->p);
    if (n != L->count[S_BINDINGS])
        return bad(L, "section 'bindings': %lld records, the graph has %lld bindings", (long long)L->count[S_BINDINGS],
                   (long long)n);
    for (int64_t i = 0; i < n; i++) {
        bind want;
        bind_of(L->p, i, &want);
        uint8_t buf[R_BIND], *c = buf;
        p_bind(&c, &want);
        if (memcmp(buf, rec(L, S_BINDINGS, i), R_BIND))
            return bad(L, "binding %lld ('%s'): its record disagrees with the graph and the program", (long long)i,
                       want.b.name);
    }
    return LM_OK;
}

static lm_status summary_ok(loader *L) {
    const lm_plan *p = L->p;
    const lm__plan_low *low = &p->low;
    const lm_plan_summary *s = &p->summary;
    int64_t cs = 0, xs = 0, xb = 0, peak = 0, live = 0;
    for (int64_t i = 0; i < low->nsteps; i++) {
        cs += low->steps[i].kind == LM__PLAN_S_COMPUTE;
        if (low->steps[i].kind != LM__PLAN_S_EXCHANGE) continue;
        xs++;
        for (int64_t x = low->steps[i].x0; x < low->steps[i].x1; x++) xb += low->xfers[x].bytes * low->xfers[x].ndst;
    }
    for (int64_t t = 0; t < low->tiles; t++) peak = LM_MAX(peak, low->peak[t]), live = LM_MAX(live, low->live_bound[t]);
    if (s->kernel_calls != low->ncalls || s->transfers != low->nxfers || s->compute_steps != cs ||
        s->exchange_steps != xs || s->exchange_bytes != xb || s->sram_peak_bytes != peak || s->sram_live_bound != live)
        return bad(L, "section 'summary': its counts disagree with the program");
    return LM_OK;
}

static lm_status parse(loader *L, const lm_plan_machine *expect) {
    LM_TRY(read_header(L));
    L->p = lm__calloc(1, sizeof *L->p);
    if (!L->p) return LM_OUT_OF_MEMORY;
    lm_plan_options_default(&L->p->opt);
    LM_TRY(read_machine(L, expect));
    LM_TRY(read_summary(L));
    L->p->search_cost = L->p->summary.predicted_cycles;
    LM_TRY(read_graph(L));
    LM_TRY(read_mid(L));
    LM_TRY(read_low(L));
    LM_TRY(data_ok(L));
    LM_TRY(bindings_ok(L));
    LM_TRY(summary_ok(L));
    lm_status st = lm__plan_check_low(&L->p->m, &L->p->mid, &L->p->low);
    if (st == LM_OUT_OF_MEMORY) return st;
    if (st != LM_OK) return bad(L, "the plan checker refuses its program: %s", lm_last_error());
    return LM_OK;
}

lm_status lm_plan_package_parse(const void *data, size_t size, const char *source, const lm_plan_machine *expect,
                                lm_plan **out) {
    if (!out || (!data && size)) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_package_parse: NULL argument");
    *out = NULL;
    loader L;
    memset(&L, 0, sizeof L);
    L.src = source ? source : "<memory>";
    L.data = data;
    L.size = size;
    lm_status st = parse(&L, expect);
    lm__free(L.gops);
    lm__free(L.enclosing);
    if (st != LM_OK) {
        lm_plan_destroy(L.p);
        return st;
    }
    *out = L.p;
    return LM_OK;
}

lm_status lm_plan_package_load(const char *path, const lm_plan_machine *expect, lm_plan **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_package_load: NULL argument");
    *out = NULL;
    char *data = NULL;
    size_t n = 0;
    LM_TRY(lm_file_read_all(path, &data, &n));
    lm_status st = lm_plan_package_parse(data, n, path, expect, out);
    lm_free(data);
    return st;
}
