/* Tests for the tuned CPU pointwise paths (src/ops/cpu/pointwise.h): add/mul with
 * broadcasting, scale, silu, swiglu, cast, embedding, rmsnorm, add_rmsnorm, rope (both
 * styles) and softmax against the reference level (LM_IMPL_REF) on fresh random
 * inputs, for every ISA path this CPU can run, with 1 and 2 threads (which must agree
 * bit for bit), in place and out of place, on padded rows and permuted outer dims,
 * with sizes around the vector widths. Outputs start NaN-poisoned and the memory
 * around every output view must stay untouched. Then the dispatch contract (forced
 * tuned level, fallback to the reference, validation first), special values, and
 * float32 PyTorch results (tests/data/ops/cpu_pointwise.lmfx, written by
 * scripts/gen_fixtures_cpu_pointwise.py).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ref, *g_t1, *g_t2; /* reference level; forced tuned level on 1 and 2 threads */
static lt_rng g_rng;
static const char *g_isa = "auto";

/* Gates, tuned vs reference (which computes in double and rounds once):
 * add, mul, scale, cast and embedding are one correctly rounded operation (or a copy)
 * in both, so they must agree exactly. */
#define EXACT 0.0, 0.0
/* silu/swiglu: vector exp within ~2 ulp, then a divide and a multiply: relative error
 * < 5e-7 on outputs up to ~40. */
#define SILU_GATE 1e-12, 2e-5
/* rmsnorm: f32 sum of squares (rel ~1e-7) and two f32 products, outputs up to ~6. */
#define NORM_GATE 1e-12, 1e-5
/* rope: cos/sin rounded to f32, then two f32 roundings per output (NMSE 1e-12 is the
 * contract), outputs up to ~8. */
#define ROPE_GATE 1e-12, 1e-5
/* softmax: f32 exp and sum (rel ~1e-6 for rows of hundreds), probabilities <= 1. */
#define SOFTMAX_GATE 1e-12, 1e-6

/* Row lengths around the AVX2 (8) and AVX-512 (16) widths, and a model's hidden size. */
static const int64_t k_ns[] = {1, 2, 3, 7, 8, 9, 15, 16, 17, 31, 33, 47, 64, 65, 100, 129, 896};
#define NNS ((int)(sizeof k_ns / sizeof k_ns[0]))

/* ---- operands: a view inside a larger, possibly padded or permuted tensor ---------- */
typedef enum layout { DENSE, PADDED, OUTER_T } layout; /* OUTER_T: outer dims reversed + padded */

typedef struct buf {
    lm_tensor *t;     /* backing memory */
    lm_tensor_view v; /* the operand, inside t */
} buf;

/* scale < 0: NaN-poisoned. */
static buf buf_make(lm_dtype dt, int nd, const int64_t *shape, layout lay, double scale) {
    int64_t ms[LM_MAX_DIMS];
    int perm[LM_MAX_DIMS];
    int permute = lay == OUTER_T && nd >= 3;
    for (int i = 0; i < nd; i++) {
        ms[i] = permute && i < nd - 1 ? shape[nd - 2 - i] : shape[i];
        perm[i] = permute && i < nd - 1 ? nd - 2 - i : i;
    }
    int64_t pad = lay == DENSE || nd == 0 ? 0 : lt_rng_int(&g_rng, 1, 5);
    if (nd > 0) ms[nd - 1] += pad;
    buf b = {scale < 0 ? lt_poisoned_tensor(dt, nd, ms) : lt_random_tensor(&g_rng, dt, nd, ms, scale), {0}};
    b.v = *lm_tensor_as_view(b.t);
    if (permute) LT_CHECK_OK(lm_tensor_view_permute(&b.v, perm, &b.v));
    if (pad) LT_CHECK_OK(lm_tensor_view_slice(&b.v, nd - 1, 0, shape[nd - 1], 1, &b.v));
    return b;
}

/* Same memory shape, contents and view layout in a fresh tensor. */
static buf buf_clone(const buf *src) {
    buf b = {lt_poisoned_tensor(lm_tensor_dtype(src->t), lm_tensor_ndim(src->t), lm_tensor_as_view(src->t)->shape),
             src->v};
    size_t bytes = (size_t)lm_tensor_numel(src->t) * lm_dtype_size(src->v.dtype);
    memcpy(lm_tensor_data(b.t), lm_tensor_data(src->t), bytes);
    b.v.data = (char *)lm_tensor_data(b.t) + ((const char *)src->v.data - (const char *)lm_tensor_data(src->t));
    return b;
}

static void buf_free(buf *b) {
    lm_tensor_destroy(b->t);
    b->t = NULL;
}

static size_t buf_bytes(const buf *b) { return (size_t)lm_tensor_numel(b->t) * lm_dtype_size(b->v.dtype); }

/* Fails unless every byte of b's tensor outside the view equals snap. */
static void check_outside(const char *what, const buf *b, const unsigned char *snap) {
    size_t es = lm_dtype_size(b->v.dtype), n = (size_t)lm_tensor_numel(b->t);
    unsigned char *in = calloc(n ? n : 1, 1);
    int64_t base = ((const char *)b->v.data - (const char *)lm_tensor_data(b->t)) / (int64_t)es;
    int64_t idx[LM_MAX_DIMS] = {0}, count = lm_tensor_view_numel(&b->v);
    for (int64_t i = 0; i < count; i++) {
        int64_t off = base;
        for (int d = 0; d < b->v.ndim; d++) off += idx[d] * b->v.stride[d];
        in[off] = 1;
        for (int d = b->v.ndim - 1; d >= 0 && ++idx[d] == b->v.shape[d]; d--) idx[d] = 0;
    }
    const unsigned char *now = lm_tensor_data(b->t);
    int64_t bad = 0;
    for (size_t e = 0; e < n; e++)
        if (!in[e] && memcmp(now + e * es, snap + e * es, es) != 0) bad++;
    LT_CHECK_MSG(bad == 0, "%s [%s]: %lld elements outside the output view were written", what, g_isa, (long long)bad);
    free(in);
}

/* ---- the level comparison ------------------------------------------------------------ */
typedef lm_status (*op_fn)(lm_ctx *ctx, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                           const void *arg);

typedef struct op_io {
    int nin, nout;
    buf *in[4];   /* NULL: an absent optional operand */
    buf *out[2];  /* poisoned layout templates of the outputs (NULL when aliased) */
    int alias[2]; /* output k is input alias[k]'s very view (in place), or -1 */
} op_io;

/* Runs fn at the reference level and at the forced tuned level on 1 and 2 threads,
 * each on fresh copies of the outputs (and aliased inputs); tuned must match the
 * reference within (nmse, abs_tol) and 2 threads must match 1 thread exactly. */
static void check_op(const char *what, op_fn fn, const void *arg, const op_io *io, double nmse, double abs_tol) {
    lm_ctx *levels[3] = {g_ref, g_t1, g_t2};
    double *vals[3][2];
    int64_t n[2];
    for (int lv = 0; lv < 3; lv++) {
        const lm_tensor_view *in[4] = {0}, *out[2] = {0};
        buf outs[2];
        unsigned char *snap[2];
        for (int i = 0; i < io->nin; i++) in[i] = io->in[i] ? &io->in[i]->v : NULL;
        for (int k = 0; k < io->nout; k++) {
            outs[k] = buf_clone(io->alias[k] >= 0 ? io->in[io->alias[k]] : io->out[k]);
            out[k] = &outs[k].v;
            if (io->alias[k] >= 0) in[io->alias[k]] = out[k];
            snap[k] = malloc(buf_bytes(&outs[k]) + 1);
            memcpy(snap[k], lm_tensor_data(outs[k].t), buf_bytes(&outs[k]));
        }
        LT_CHECK_OK(fn(levels[lv], in, out, arg));
        for (int k = 0; k < io->nout; k++) {
            check_outside(what, &outs[k], snap[k]);
            vals[lv][k] = lt_view_to_f64(out[k]);
            n[k] = lm_tensor_view_numel(out[k]);
            free(snap[k]);
            buf_free(&outs[k]);
        }
    }
    for (int k = 0; k < io->nout; k++) {
        char msg[160];
        snprintf(msg, sizeof msg, "%s out%d [%s]: tuned vs reference", what, k, g_isa);
        lt_check_close(msg, vals[1][k], vals[0][k], n[k], nmse, abs_tol);
        snprintf(msg, sizeof msg, "%s out%d [%s]: 2 threads vs 1", what, k, g_isa);
        lt_check_close(msg, vals[2][k], vals[1][k], n[k], 0.0, 0.0);
        for (int lv = 0; lv < 3; lv++) free(vals[lv][k]);
    }
}

static layout any_layout(void) { return (layout)lt_rng_int(&g_rng, 0, 2); }
/* Cases c < NNS are small, with row length k_ns[c]; case NNS is a model-sized one,
 * rows of 896 and over the 64K-element threshold where the pool takes part. */
static int64_t n_for(int c) { return c == NNS ? 896 : k_ns[c]; }
static int64_t rows_for(int c, int64_t n, int64_t big_elems) {
    return c == NNS ? (big_elems + n - 1) / n : lt_rng_int(&g_rng, 1, 5);
}

/* ---- adapters: in[] and out[] to each operator --------------------------------------- */
static lm_status op_add(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out, const void *a) {
    (void)a;
    return lm_add_out(c, in[0], in[1], out[0]);
}
static lm_status op_mul(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out, const void *a) {
    (void)a;
    return lm_mul_out(c, in[0], in[1], out[0]);
}
static lm_status op_scale(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                          const void *a) {
    return lm_scale_out(c, in[0], *(const float *)a, out[0]);
}
static lm_status op_silu(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out, const void *a) {
    (void)a;
    return lm_silu_out(c, in[0], out[0]);
}
static lm_status op_swiglu(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                           const void *a) {
    (void)a;
    return lm_swiglu_out(c, in[0], in[1], out[0]);
}
static lm_status op_cast(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out, const void *a) {
    (void)a;
    return lm_cast_out(c, in[0], out[0]);
}
static lm_status op_embedding(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                              const void *a) {
    (void)a;
    return lm_embedding_out(c, in[0], in[1], out[0]);
}
static lm_status op_rmsnorm(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                            const void *a) {
    return lm_rmsnorm_out(c, in[0], in[1], *(const float *)a, out[0]);
}
/* in: x, residual, weight; out: sum_out, out */
static lm_status op_add_rmsnorm(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                                const void *a) {
    return lm_add_rmsnorm_out(c, in[0], in[1], in[2], *(const float *)a, out[0], out[1]);
}
/* in: x, inv_freq, positions (or NULL), bias (or NULL); a: the rest of the params */
static lm_status op_rope(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                         const void *a) {
    lm_rope_params p = *(const lm_rope_params *)a;
    p.inv_freq = in[1];
    p.positions = in[2];
    p.bias = in[3];
    return lm_rope_out(c, in[0], &p, out[0]);
}
typedef struct softmax_arg {
    float scale;
    int causal;
} softmax_arg;
static lm_status op_softmax(lm_ctx *c, const lm_tensor_view *const *in, const lm_tensor_view *const *out,
                            const void *a) {
    const softmax_arg *s = a;
    return lm_softmax_out(c, in[0], s->scale, s->causal, out[0]);
}

/* ---- every fast path against the reference ---------------------------------------------- */
static void test_add_mul_broadcasts_match_reference(void) {
    for (int c = 0; c <= NNS; c++) {
        int64_t n = n_for(c), rows = rows_for(c, n, 70000);
        int64_t shape[2] = {rows, n}, bias_shape[1] = {n}, col[2] = {rows, 1}, row1[2] = {1, n};
        buf a = buf_make(LM_F32, 2, shape, any_layout(), 2.0), o = buf_make(LM_F32, 2, shape, any_layout(), -1);
        buf bs[3] = {buf_make(LM_F32, 2, shape, any_layout(), 1.5), buf_make(LM_F32, 1, bias_shape, DENSE, 1.0),
                     buf_make(LM_F32, 2, col, any_layout(), 1.0)};
        for (int v = 0; v < 3; v++) /* b: same shape, a [N] bias over rows, a [rows, 1] column */
            for (int op = 0; op < 2; op++)
                for (int inplace = 0; inplace < 2; inplace++) {
                    op_io io = {2, 1, {&a, &bs[v]}, {inplace ? NULL : &o}, {inplace ? 0 : -1}};
                    check_op(op ? "mul" : "add", op ? op_mul : op_add, NULL, &io, EXACT);
                }
        /* [rows, 1] + [1, N]: both broadcast, the first one within rows */
        buf ac = buf_make(LM_F32, 2, col, any_layout(), 1.0), br = buf_make(LM_F32, 2, row1, DENSE, 1.0);
        op_io io = {2, 1, {&ac, &br}, {&o}, {-1}};
        check_op("add outer", op_add, NULL, &io, EXACT);
        check_op("mul outer", op_mul, NULL, &io, EXACT);
        buf_free(&a), buf_free(&o), buf_free(&ac), buf_free(&br);
        for (int v = 0; v < 3; v++) buf_free(&bs[v]);
    }
}

static void test_scale_silu_swiglu_match_reference(void) {
    for (int c = 0; c <= NNS; c++) {
        int64_t n = n_for(c), rows = rows_for(c, n, 70000);
        int64_t shape[3] = {2, rows, n};
        buf x = buf_make(LM_F32, 3, shape, any_layout(), 3.0), u = buf_make(LM_F32, 3, shape, any_layout(), 1.0);
        buf o = buf_make(LM_F32, 3, shape, any_layout(), -1);
        float s = (float)(lt_rng_normal(&g_rng) * 2);
        for (int inplace = 0; inplace < 2; inplace++) {
            op_io io1 = {1, 1, {&x}, {inplace ? NULL : &o}, {inplace ? 0 : -1}};
            check_op("scale", op_scale, &s, &io1, EXACT);
            check_op("silu", op_silu, NULL, &io1, SILU_GATE);
            op_io io2 = {2, 1, {&x, &u}, {inplace ? NULL : &o}, {inplace ? 0 : -1}}; /* out = gate, as in the MLP */
            check_op("swiglu", op_swiglu, NULL, &io2, SILU_GATE);
        }
        buf_free(&x), buf_free(&u), buf_free(&o);
    }
}

static void test_cast_widens_exactly(void) {
    static const lm_dtype from[3] = {LM_F32, LM_BF16, LM_F16};
    for (int c = 0; c <= NNS; c++) {
        int64_t n = n_for(c), rows = rows_for(c, n, 70000);
        int64_t shape[2] = {rows, n};
        for (int d = 0; d < 3; d++) {
            buf x = buf_make(from[d], 2, shape, any_layout(), 4.0), o = buf_make(LM_F32, 2, shape, any_layout(), -1);
            op_io io = {1, 1, {&x}, {&o}, {-1}};
            check_op("cast", op_cast, NULL, &io, EXACT);
            buf_free(&x), buf_free(&o);
        }
    }
}

static void test_embedding_gathers_rows_exactly(void) {
    static const lm_dtype dts[3] = {LM_F32, LM_BF16, LM_F16};
    for (int c = 0; c <= NNS; c++) {
        int64_t d = n_for(c), vocab = lt_rng_int(&g_rng, 1, 40);
        int64_t k = c == NNS ? 80000 / d + 1 : lt_rng_int(&g_rng, 1, 6);
        int64_t tshape[2] = {vocab, d}, ishape[2] = {k, 2}, oshape[3] = {2, k, d};
        buf table = buf_make(dts[c % 3], 2, tshape, c % 2 ? PADDED : DENSE, 1.0);
        buf ids = buf_make(c % 2 ? LM_I32 : LM_I64, 2, ishape, DENSE, 1.0);
        for (int64_t i = 0; i < 2 * k; i++) {
            int64_t id = lt_rng_int(&g_rng, 0, vocab - 1);
            if (ids.v.dtype == LM_I32) ((int32_t *)ids.v.data)[i] = (int32_t)id;
            else ((int64_t *)ids.v.data)[i] = id;
        }
        LT_CHECK_OK(lm_tensor_view_transpose(&ids.v, 0, 1, &ids.v)); /* ids [2, k], not row-major */
        buf o = buf_make(dts[c % 3], 3, oshape, any_layout(), -1);
        op_io io = {2, 1, {&table, &ids}, {&o}, {-1}};
        check_op("embedding", op_embedding, NULL, &io, EXACT);
        buf_free(&table), buf_free(&ids), buf_free(&o);
    }
}

static void test_rmsnorm_and_add_rmsnorm_match_reference(void) {
    float eps = 1e-6f;
    for (int c = 0; c <= NNS; c++) {
        int64_t n = n_for(c), rows = rows_for(c, n, 70000);
        int64_t shape[2] = {rows, n}, qk[4] = {2, rows, 3, n}; /* activations, and per-head q/k norms */
        buf w = buf_make(LM_F32, 1, &n, DENSE, 0.3);
        for (int64_t i = 0; i < n; i++) ((float *)w.v.data)[i] += 1.0f;
        for (int form = 0; form < 2; form++) {
            int nd = form ? 4 : 2;
            const int64_t *s = form ? qk : shape;
            buf x = buf_make(LM_F32, nd, s, any_layout(), 3.0), o = buf_make(LM_F32, nd, s, any_layout(), -1);
            for (int inplace = 0; inplace < 2; inplace++) {
                op_io io = {2, 1, {&x, &w}, {inplace ? NULL : &o}, {inplace ? 0 : -1}};
                check_op("rmsnorm", op_rmsnorm, &eps, &io, NORM_GATE);
            }
            buf_free(&x), buf_free(&o);
        }
        buf x = buf_make(LM_F32, 2, shape, any_layout(), 1.0), res = buf_make(LM_F32, 2, shape, any_layout(), 4.0);
        buf sum = buf_make(LM_F32, 2, shape, any_layout(), -1), o = buf_make(LM_F32, 2, shape, any_layout(), -1);
        for (int form = 0; form < 3; form++) { /* sum_out: its own buffer, residual's view, x's view */
            op_io io = {3, 2, {&x, &res, &w}, {form ? NULL : &sum, &o}, {form == 0 ? -1 : form == 1 ? 1 : 0, -1}};
            check_op("add_rmsnorm", op_add_rmsnorm, &eps, &io, NORM_GATE);
        }
        buf_free(&w), buf_free(&x), buf_free(&res), buf_free(&sum), buf_free(&o);
    }
}

static lm_tensor *inv_freq(double theta, int64_t d) {
    int64_t half = d / 2;
    lm_tensor *t = lt_poisoned_tensor(LM_F32, 1, &half);
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, theta, d, lm_tensor_as_view(t)));
    return t;
}

static void test_rope_matches_reference(void) {
    static const int64_t ds[] = {2, 4, 6, 8, 14, 16, 30, 32, 34, 64, 66, 128};
    int nds = (int)(sizeof ds / sizeof ds[0]);
    for (int c = 0; c <= nds; c++) {
        int64_t d = c == nds ? 64 : ds[c], t = c == nds ? 100 : lt_rng_int(&g_rng, 1, 6);
        int64_t shape[4] = {c == nds ? 1 : lt_rng_int(&g_rng, 1, 3), t, c == nds ? 14 : lt_rng_int(&g_rng, 1, 4), d};
        int64_t bt[2] = {shape[0], t}, hd[2] = {shape[2], d};
        lm_tensor *inv = inv_freq(c % 2 ? 1e6 : 1e4, d);
        buf invb = {inv, *lm_tensor_as_view(inv)};
        buf x = buf_make(LM_F32, 4, shape, any_layout(), 1.5), o = buf_make(LM_F32, 4, shape, any_layout(), -1);
        buf bias = buf_make(LM_F32, 2, hd, PADDED, 0.5);
        /* positions [B, T] i32 spanning +-2^20 (large angles, negative positions) */
        buf pos = buf_make(LM_I32, 2, bt, DENSE, 1.0);
        for (int64_t i = 0; i < bt[0] * t; i++)
            ((int32_t *)pos.v.data)[i] = (int32_t)lt_rng_int(&g_rng, -(1 << 20), 1 << 20);
        for (int form = 0; form < 4; form++) {
            lm_rope_params p = {form % 2 ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF, NULL,
                                (float)(0.5 + lt_rng_uniform(&g_rng)), NULL, lt_rng_int(&g_rng, 0, 5000), NULL};
            int with_pos = form >= 2;
            for (int inplace = 0; inplace < 2; inplace++) {
                op_io io = {4, 1, {&x, &invb, with_pos ? &pos : NULL, with_pos ? &bias : NULL},
                            {inplace ? NULL : &o}, {inplace ? 0 : -1}};
                check_op(form % 2 ? "rope interleaved" : "rope split-half", op_rope, &p, &io, ROPE_GATE);
            }
        }
        buf_free(&invb), buf_free(&x), buf_free(&o), buf_free(&bias), buf_free(&pos);
    }
}

static void test_softmax_matches_reference(void) {
    for (int c = 0; c <= NNS; c++) {
        int64_t tk = n_for(c), tq = lt_rng_int(&g_rng, 1, tk), heads = c == NNS ? 70000 / (tq * tk) + 1 : 2;
        int64_t shape[4] = {lt_rng_int(&g_rng, 1, 2), heads, tq, tk};
        buf x = buf_make(LM_F32, 4, shape, any_layout(), 3.0), o = buf_make(LM_F32, 4, shape, any_layout(), -1);
        for (int causal = 0; causal < 2; causal++)
            for (int inplace = 0; inplace < 2; inplace++) {
                softmax_arg a = {(float)(lt_rng_normal(&g_rng) * 0.7), causal};
                op_io io = {1, 1, {&x}, {inplace ? NULL : &o}, {inplace ? 0 : -1}};
                check_op(causal ? "softmax causal" : "softmax", op_softmax, &a, &io, SOFTMAX_GATE);
            }
        buf_free(&x), buf_free(&o);
    }
}

/* ---- special values ----------------------------------------------------------------------- */
/* got and want agree as IEEE values: both NaN, equal, or within rel 5e-7 (or both tiny). */
static int same_value(float got, float want) {
    if (isnan(want) || isnan(got)) return isnan(want) && isnan(got);
    if (isinf(want) || isinf(got)) return got == want;
    return fabsf(got - want) <= 5e-7f * fabsf(want) + 1e-37f;
}

static void test_silu_and_softmax_special_values(void) {
    static const float xs[] = {INFINITY, -INFINITY, NAN, 0.0f, -0.0f, 1e-30f, -1e-30f, 200.0f, -200.0f, 88.7f,
                               -88.7f, 103.9f, -103.9f, 104.5f, -104.5f, 87.0f, -87.0f, 20.0f, -20.0f, 0.5f};
    int64_t n = (int64_t)(sizeof xs / sizeof xs[0]);
    lm_tensor *x = NULL, *a = lt_poisoned_tensor(LM_F32, 1, &n), *b = lt_poisoned_tensor(LM_F32, 1, &n);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, &n, xs, &x));
    LT_CHECK_OK(lm_silu_out(g_ref, lm_tensor_as_view(x), lm_tensor_as_view(a)));
    LT_CHECK_OK(lm_silu_out(g_t1, lm_tensor_as_view(x), lm_tensor_as_view(b)));
    const float *ra = lm_tensor_data(a), *rb = lm_tensor_data(b);
    for (int64_t i = 0; i < n; i++)
        LT_CHECK_MSG(same_value(rb[i], ra[i]), "silu(%g) [%s]: tuned %g, reference %g", xs[i], g_isa, rb[i], ra[i]);
    /* softmax rows: -inf entries (masked logits) give exact zeros; a NaN makes its row NaN */
    float rows[3][5] = {{1, -INFINITY, 3, -INFINITY, 2}, {NAN, 1, 2, 3, 4}, {-1e30f, 0, 5, -INFINITY, 80}};
    int64_t s2[2] = {3, 5};
    lm_tensor *sx = NULL, *sa = lt_poisoned_tensor(LM_F32, 2, s2), *sb = lt_poisoned_tensor(LM_F32, 2, s2);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, s2, rows, &sx));
    LT_CHECK_OK(lm_softmax_out(g_ref, lm_tensor_as_view(sx), 1.0f, 0, lm_tensor_as_view(sa)));
    LT_CHECK_OK(lm_softmax_out(g_t1, lm_tensor_as_view(sx), 1.0f, 0, lm_tensor_as_view(sb)));
    const float *pa = lm_tensor_data(sa), *pb = lm_tensor_data(sb);
    for (int i = 0; i < 15; i++)
        LT_CHECK_MSG(same_value(pb[i], pa[i]), "softmax element %d [%s]: tuned %g, reference %g", i, g_isa, pb[i],
                     pa[i]);
    LT_CHECK(pb[1] == 0.0f && pb[3] == 0.0f && pb[13] == 0.0f && isnan(pb[5]) && isnan(pb[9]));
    lm_tensor_destroy(x), lm_tensor_destroy(a), lm_tensor_destroy(b);
    lm_tensor_destroy(sx), lm_tensor_destroy(sa), lm_tensor_destroy(sb);
}

/* ---- float32 PyTorch ---------------------------------------------------------------------- */
static lm_tensor *fx_f32(const lt_fixture *fx, const char *name) {
    return lt_fixture_tensor_to(lt_fixture_get(fx, name), LM_F32);
}

/* max |got - want| <= rel * max |want| and NMSE <= rel^2, on got and want as f32 tensors. */
static void check_rel(const char *what, const lm_tensor *got, const lt_fixture_tensor *want, double rel) {
    double *g = lt_view_to_f64(lm_tensor_as_view(got)), peak = 0;
    for (int64_t i = 0; i < want->numel; i++) peak = fmax(peak, fabs(want->f64[i]));
    char msg[128];
    snprintf(msg, sizeof msg, "%s [%s] vs float32 PyTorch", what, g_isa);
    lt_check_close(msg, g, want->f64, want->numel, rel * rel, rel * peak);
    free(g);
}

static void test_tuned_paths_match_float32_pytorch(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/cpu_pointwise.lmfx", &fx)) return;
    lm_tensor *x = fx_f32(&fx, "rmsnorm.x"), *w = fx_f32(&fx, "rmsnorm.weight");
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, lm_tensor_as_view(x)->shape);
    float eps = (float)lt_fixture_get(&fx, "rmsnorm.eps")->f64[0];
    LT_CHECK_OK(lm_rmsnorm_out(g_t1, lm_tensor_as_view(x), lm_tensor_as_view(w), eps, lm_tensor_as_view(o)));
    /* the brief: a float32 PyTorch RMSNorm to ~1e-6 relative */
    check_rel("rmsnorm", o, lt_fixture_get(&fx, "rmsnorm.out"), 1e-6);
    lm_tensor *g = fx_f32(&fx, "swiglu.gate"), *u = fx_f32(&fx, "swiglu.up");
    lm_tensor *so = lt_poisoned_tensor(LM_F32, 2, lm_tensor_as_view(g)->shape);
    LT_CHECK_OK(lm_swiglu_out(g_t1, lm_tensor_as_view(g), lm_tensor_as_view(u), lm_tensor_as_view(so)));
    check_rel("swiglu", so, lt_fixture_get(&fx, "swiglu.out"), 1e-6); /* both: ~2 ulp exp, one divide */
    lm_tensor *sx = fx_f32(&fx, "softmax.x");
    lm_tensor *sm = lt_poisoned_tensor(LM_F32, 2, lm_tensor_as_view(sx)->shape);
    float scale = (float)lt_fixture_get(&fx, "softmax.scale")->f64[0];
    LT_CHECK_OK(lm_softmax_out(g_t1, lm_tensor_as_view(sx), scale, 0, lm_tensor_as_view(sm)));
    check_rel("softmax", sm, lt_fixture_get(&fx, "softmax.out"), 1e-6);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(o), lm_tensor_destroy(g), lm_tensor_destroy(u);
    lm_tensor_destroy(so), lm_tensor_destroy(sx), lm_tensor_destroy(sm);
    lt_fixture_free(&fx);
}

/* ---- dispatch ----------------------------------------------------------------------------- */
static lm_ctx *g_auto; /* LM_IMPL_AUTO, 1 thread */

typedef struct out_spec {
    lm_dtype dt;
    int nd;
    int64_t shape[4];
} out_spec;

/* Views the tuned level cannot take: forced tuned is LM_UNSUPPORTED naming the path;
 * auto falls back and gives exactly the reference's result. */
static void check_fallback(const char *what, op_fn fn, const void *arg, const lm_tensor_view *const *in, int nout,
                           const out_spec *os) {
    lm_tensor *oa[2], *ob[2];
    const lm_tensor_view *va[2], *vb[2];
    for (int k = 0; k < nout; k++) {
        oa[k] = lt_poisoned_tensor(os[k].dt, os[k].nd, os[k].shape);
        ob[k] = lt_poisoned_tensor(os[k].dt, os[k].nd, os[k].shape);
        va[k] = lm_tensor_as_view(oa[k]), vb[k] = lm_tensor_as_view(ob[k]);
    }
    LT_CHECK_STATUS(fn(g_t1, in, va, arg), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "tuned CPU path needs"), "%s: detail '%s' does not say why", what,
                 lm_last_error());
    LT_CHECK_OK(fn(g_auto, in, va, arg));
    LT_CHECK_OK(fn(g_ref, in, vb, arg));
    for (int k = 0; k < nout; k++) {
        double *a = lt_view_to_f64(va[k]), *b = lt_view_to_f64(vb[k]);
        lt_check_close(what, a, b, lm_tensor_numel(oa[k]), 0.0, 0.0);
        free(a), free(b);
        lm_tensor_destroy(oa[k]), lm_tensor_destroy(ob[k]);
    }
}

static void test_forced_tuned_rejects_what_auto_sends_to_the_reference(void) {
    int64_t s[2] = {6, 10}, d = 10, hd[4] = {1, 2, 3, 6};
    lm_tensor *x = lt_random_tensor(&g_rng, LM_F32, 2, s, 1), *y = lt_random_tensor(&g_rng, LM_F32, 2, s, 1);
    lm_tensor *xb = lt_random_tensor(&g_rng, LM_BF16, 2, s, 1), *xi = lt_random_tensor(&g_rng, LM_I32, 2, s, 1);
    lm_tensor *wb = lt_random_tensor(&g_rng, LM_BF16, 1, &d, 1), *xh = lt_random_tensor(&g_rng, LM_F16, 4, hd, 1);
    lm_tensor *inv = inv_freq(1e4, 6), *tab = lt_random_tensor(&g_rng, LM_F32, 2, s, 1);
    lm_tensor *ids = NULL;
    int64_t three = 3;
    int32_t idv[3] = {5, 0, 2};
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &three, idv, &ids));
    lm_tensor_view xt, yt, xbt, tcols; /* [10, 6] views with a stride-10 last dim; every 2nd table column */
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(x), 0, 1, &xt));
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(y), 0, 1, &yt));
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(xb), 0, 1, &xbt));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(tab), 1, 0, 10, 2, &tcols));
    const out_spec f32_t = {LM_F32, 2, {10, 6}}, bf16_s = {LM_BF16, 2, {6, 10}}, f16_h = {LM_F16, 4, {1, 2, 3, 6}};
    const out_spec two_bf16[2] = {bf16_s, bf16_s}, rows5 = {LM_F32, 2, {3, 5}};
    float s1 = 0.5f, eps = 1e-5f;
    softmax_arg sm = {0.3f, 0};
    lm_rope_params rp = {LM_ROPE_SPLIT_HALF, NULL, 1.0f, NULL, 0, NULL};
    const lm_tensor_view *in_xy[] = {&xt, &yt}, *in_x[] = {&xt}, *in_xbt[] = {&xbt};
    const lm_tensor_view *in_i[] = {lm_tensor_as_view(xi)};
    const lm_tensor_view *in_norm[] = {lm_tensor_as_view(xb), lm_tensor_as_view(wb)};
    const lm_tensor_view *in_add_norm[] = {lm_tensor_as_view(xb), lm_tensor_as_view(xb), lm_tensor_as_view(wb)};
    const lm_tensor_view *in_rope[] = {lm_tensor_as_view(xh), lm_tensor_as_view(inv), NULL, NULL};
    const lm_tensor_view *in_emb[] = {&tcols, lm_tensor_as_view(ids)};
    check_fallback("add, strided", op_add, NULL, in_xy, 1, &f32_t);
    check_fallback("mul, strided", op_mul, NULL, in_xy, 1, &f32_t);
    check_fallback("scale, strided", op_scale, &s1, in_x, 1, &f32_t);
    check_fallback("silu, strided", op_silu, NULL, in_x, 1, &f32_t);
    check_fallback("swiglu, strided", op_swiglu, NULL, in_xy, 1, &f32_t);
    check_fallback("softmax, strided", op_softmax, &sm, in_x, 1, &f32_t);
    check_fallback("cast bf16, strided", op_cast, NULL, in_xbt, 1, &f32_t);
    const out_spec f32_s = {LM_F32, 2, {6, 10}};
    check_fallback("cast i32", op_cast, NULL, in_i, 1, &f32_s);
    check_fallback("rmsnorm bf16", op_rmsnorm, &eps, in_norm, 1, &bf16_s);
    check_fallback("add_rmsnorm bf16", op_add_rmsnorm, &eps, in_add_norm, 2, two_bf16);
    check_fallback("rope f16", op_rope, &rp, in_rope, 1, &f16_h);
    check_fallback("embedding, strided table", op_embedding, NULL, in_emb, 1, &rows5);
    lm_tensor_destroy(x), lm_tensor_destroy(y), lm_tensor_destroy(xb), lm_tensor_destroy(xi), lm_tensor_destroy(wb);
    lm_tensor_destroy(xh), lm_tensor_destroy(inv), lm_tensor_destroy(tab), lm_tensor_destroy(ids);
}

/* LM_IMPL_REF reaches the reference: silu equals the double formula rounded once,
 * bit for bit, which the f32 vector path does not promise. */
static void test_ref_level_is_the_double_precision_reference(void) {
    int64_t n = 1000;
    lm_tensor *x = lt_random_tensor(&g_rng, LM_F32, 1, &n, 4.0), *o = lt_poisoned_tensor(LM_F32, 1, &n);
    LT_CHECK_OK(lm_silu_out(g_ref, lm_tensor_as_view(x), lm_tensor_as_view(o)));
    const float *xv = lm_tensor_data(x), *ov = lm_tensor_data(o);
    int64_t bad = 0;
    for (int64_t i = 0; i < n; i++) bad += ov[i] != (float)(xv[i] / (1.0 + exp(-(double)xv[i])));
    LT_CHECK_MSG(bad == 0, "%lld silu values at LM_IMPL_REF differ from the double formula", (long long)bad);
    lm_tensor_destroy(x), lm_tensor_destroy(o);
}

/* Every argument check still runs first at the tuned level, and a bad id leaves out
 * untouched with the reference's message. */
static void test_validation_runs_before_the_tuned_path(void) {
    int64_t s[2] = {4, 8}, s2[2] = {4, 9}, odd[4] = {1, 1, 1, 5}, d = 8, tshape[2] = {7, 8}, two = 2;
    lm_tensor *x = lt_random_tensor(&g_rng, LM_F32, 2, s, 1), *w = lt_random_tensor(&g_rng, LM_F32, 1, &d, 1);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, s), *o9 = lt_poisoned_tensor(LM_F32, 2, s2);
    lm_tensor *xo = lt_random_tensor(&g_rng, LM_F32, 4, odd, 1), *inv = inv_freq(1e4, 8);
    lm_tensor *oi = lt_poisoned_tensor(LM_I32, 2, s), *table = lt_random_tensor(&g_rng, LM_F32, 2, tshape, 1);
    lm_tensor *ids = NULL, *eo = lt_poisoned_tensor(LM_F32, 2, (const int64_t[2]){2, 8});
    int64_t idv[2] = {3, 7};
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &two, idv, &ids));
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vo = lm_tensor_as_view(o);
    LT_CHECK_STATUS(lm_add_out(g_t1, vx, vx, lm_tensor_as_view(o9)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_swiglu_out(g_t1, vx, lm_tensor_as_view(o9), vo), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_t1, vx, lm_tensor_as_view(w), -1.0f, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_cast_out(g_t1, vx, lm_tensor_as_view(oi)), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "float to integer"));
    lm_tensor_view shifted; /* rows 1..3 of out over rows 0..2 of x: a partial overlap */
    LT_CHECK_OK(lm_tensor_view_slice(vx, 0, 1, 4, 1, &shifted));
    lm_tensor_view head;
    LT_CHECK_OK(lm_tensor_view_slice(vx, 0, 0, 3, 1, &head));
    LT_CHECK_STATUS(lm_softmax_out(g_t1, &head, 1.0f, 0, &shifted), LM_INVALID_ARGUMENT);
    lm_rope_params p = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 0, NULL};
    LT_CHECK_STATUS(lm_rope_out(g_t1, lm_tensor_as_view(xo), &p, lm_tensor_as_view(xo)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_embedding_out(g_t1, lm_tensor_as_view(table), lm_tensor_as_view(ids), lm_tensor_as_view(eo)),
                    LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "ids[1] = 7"));
    const float *ev = lm_tensor_data(eo);
    for (int i = 0; i < 16; i++) LT_CHECK(isnan(ev[i]));
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(o), lm_tensor_destroy(o9), lm_tensor_destroy(xo);
    lm_tensor_destroy(inv), lm_tensor_destroy(oi), lm_tensor_destroy(table), lm_tensor_destroy(ids);
    lm_tensor_destroy(eo);
}

/* The tuned paths work in place on caller memory and the pool: no allocation at all,
 * on one thread or two (an allocation would make a failure path necessary). */
static void test_tuned_paths_never_allocate(void) {
    int64_t s[2] = {100, 896}, d = 896, q[4] = {1, 100, 14, 64};
    lm_tensor *x = lt_random_tensor(&g_rng, LM_F32, 2, s, 1), *w = lt_random_tensor(&g_rng, LM_F32, 1, &d, 1);
    lm_tensor *r = lt_random_tensor(&g_rng, LM_F32, 2, s, 1), *qt = lt_random_tensor(&g_rng, LM_F32, 4, q, 1);
    lm_tensor *inv = inv_freq(1e6, 64), *o = lt_poisoned_tensor(LM_F32, 2, s);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vw = lm_tensor_as_view(w), *vr = lm_tensor_as_view(r);
    const lm_tensor_view *vq = lm_tensor_as_view(qt);
    lm_rope_params p = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 7, NULL};
    lt_alloc_track(1);
    for (int t = 0; t < 2; t++) {
        lm_ctx *c = t ? g_t2 : g_t1;
        LT_CHECK_OK(lm_add_out(c, vx, vw, vx));
        LT_CHECK_OK(lm_swiglu_out(c, vx, vr, vx));
        LT_CHECK_OK(lm_add_rmsnorm_out(c, vx, vr, vw, 1e-6f, vr, lm_tensor_as_view(o)));
        LT_CHECK_OK(lm_rope_out(c, vq, &p, vq));
        LT_CHECK_OK(lm_softmax_out(c, vx, 0.1f, 0, vx));
    }
    LT_CHECK(lt_alloc_count() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(r), lm_tensor_destroy(qt), lm_tensor_destroy(inv);
    lm_tensor_destroy(o);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ref));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_t1));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_t2));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_auto));
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    lm_ctx_set_impl(g_t1, LM_IMPL_TUNED);
    lm_ctx_set_impl(g_t2, LM_IMPL_TUNED);
    g_rng = lt_rng_seed(20240601);
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
        if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) {
            printf("skip %s path: this CPU or build cannot run it\n", lm__cpu_isa_name((lm__cpu_isa)isa));
            continue;
        }
        LT_CHECK_OK(lm__cpu_set_isa_override(isa));
        g_isa = lm__cpu_isa_name((lm__cpu_isa)isa);
        printf("-- %s path\n", g_isa);
        LT_RUN(test_add_mul_broadcasts_match_reference);
        LT_RUN(test_scale_silu_swiglu_match_reference);
        LT_RUN(test_cast_widens_exactly);
        LT_RUN(test_embedding_gathers_rows_exactly);
        LT_RUN(test_rmsnorm_and_add_rmsnorm_match_reference);
        LT_RUN(test_rope_matches_reference);
        LT_RUN(test_softmax_matches_reference);
        LT_RUN(test_silu_and_softmax_special_values);
        LT_RUN(test_tuned_paths_match_float32_pytorch);
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    g_isa = "auto";
    LT_RUN(test_forced_tuned_rejects_what_auto_sends_to_the_reference);
    LT_RUN(test_ref_level_is_the_double_precision_reference);
    LT_RUN(test_validation_runs_before_the_tuned_path);
    LT_RUN(test_tuned_paths_never_allocate);
    lm_ctx_destroy(g_ref), lm_ctx_destroy(g_t1), lm_ctx_destroy(g_t2), lm_ctx_destroy(g_auto);
    return lt_finish();
}
