/* Gradient checks of every tape operation against finite differences. Each case
 * builds L = sum(c * f(inputs)) for a fixed random c and compares, per input leaf,
 * the backward gradient's derivative along a random unit direction with central
 * differences of L (Richardson-extrapolated from steps 0.02 and 0.01) — the same
 * forward code both ways, so this proves the wrappers' wiring: broadcast reductions
 * of add/mul, the bias sum of linear, batched matmul, both outputs of add_rmsnorm
 * (including only the sum being read), rope/attention layouts, the losses. The
 * context runs the reference level (double accumulation), so the f32 loss is
 * accurate to ~1e-7 relative and the gate is 1e-3 of the gradient's norm.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

#define V(t) lm_tensor_as_view(t)
#define MAXIN 4
#define TRY(e)                          \
    do {                                \
        lm_status s_ = (e);             \
        if (s_ != LM_OK) return s_;     \
    } while (0)

typedef struct gc_case gc_case;
/* Builds f from the leaves (in[0..n)); returns the variable to contract with c. */
typedef lm_status (*gc_build)(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out);

struct gc_case {
    const char *name;
    int n;
    int ndim[MAXIN];
    int64_t shape[MAXIN][4];
    gc_build build;
    const lm_tensor *ids, *targets, *inv_freq; /* extra operands some cases use */
};

static lm_tensor *g_in[MAXIN], *g_c;

/* L for the current input values (no tape recording). */
static double loss(const gc_case *k, lm_tensor **grads_into /* NULL: no backward */) {
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    lm_ag_var *in[MAXIN], *f = NULL, *cv = NULL, *L = NULL, *prod = NULL;
    for (int i = 0; i < k->n; i++) LT_CHECK_OK(lm_ag_leaf(ag, g_in[i], grads_into != NULL, &in[i]));
    double value = NAN;
    if (k->build(ag, in, k, &f) == LM_OK) {
        const lm_tensor_view *fv = V(lm_ag_value(f));
        if (!g_c) {
            lt_rng r = lt_rng_seed(1234);
            g_c = lt_random_tensor(&r, LM_F32, fv->ndim, fv->shape, 1.0);
        }
        LT_CHECK_OK(lm_ag_leaf(ag, g_c, 0, &cv));
        LT_CHECK_OK(lm_ag_mul(ag, cv, f, &prod));
        LT_CHECK_OK(lm_ag_sum(ag, prod, &L));
        float l = 0;
        LT_CHECK_OK(lm_tensor_view_read(g_ctx, V(lm_ag_value(L)), &l));
        value = l;
        if (grads_into) {
            LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
            for (int i = 0; i < k->n; i++) {
                const lm_tensor *g = lm_ag_grad(in[i]);
                grads_into[i] = NULL;
                if (g) LT_CHECK_OK(lm_cast(g_ctx, V(g), LM_F32, &grads_into[i])); /* a copy beyond the tape */
            }
        }
    } else {
        LT_CHECK_MSG(0, "%s: build failed: %s", k->name, lm_last_error());
    }
    lm_ag_destroy(ag);
    return value;
}

static void shift(lm_tensor *t, const double *u, double h) {
    float *p = lm_tensor_data(t);
    for (int64_t i = 0; i < lm_tensor_numel(t); i++) p[i] = (float)((double)p[i] + h * u[i]);
}

static void run(const gc_case *k) {
    lt_rng r = lt_rng_seed(77);
    for (int i = 0; i < k->n; i++) g_in[i] = lt_random_tensor(&r, LM_F32, k->ndim[i], k->shape[i], 1.0);
    lm_tensor *grads[MAXIN];
    loss(k, grads);
    for (int i = 0; i < k->n; i++) {
        lm_tensor *g = grads[i];
        int64_t n = lm_tensor_numel(g_in[i]);
        double *u = malloc(sizeof(double) * (size_t)n), len = 0, gu = 0, gn = 0;
        for (int64_t j = 0; j < n; j++) {
            u[j] = lt_rng_normal(&r);
            len += u[j] * u[j];
        }
        const float *gp = g ? lm_tensor_data(g) : NULL;
        for (int64_t j = 0; j < n; j++) {
            u[j] /= sqrt(len);
            gu += gp ? gp[j] * u[j] : 0;
            gn += gp ? (double)gp[j] * gp[j] : 0;
        }
        double d[2];
        for (int s = 0; s < 2; s++) {
            double h = s ? 0.01 : 0.02;
            shift(g_in[i], u, h);
            double up = loss(k, NULL);
            shift(g_in[i], u, -2 * h);
            double down = loss(k, NULL);
            shift(g_in[i], u, h);
            d[s] = (up - down) / (2 * h);
        }
        double fd = (4 * d[1] - d[0]) / 3, err = fabs(fd - gu) / (sqrt(gn) + 1e-6);
        /* no gradient at all is right only where L does not depend on the input */
        LT_CHECK_MSG((g != NULL || fabs(fd) < 1e-9) && err <= 1e-3, "%s input %d: analytic %.7g vs differences %.7g (err %.1e of |g| %.3g)",
                     k->name, i, gu, fd, err, sqrt(gn));
        free(u);
        lm_tensor_destroy(g);
    }
    for (int i = 0; i < k->n; i++) lm_tensor_destroy(g_in[i]);
    lm_tensor_destroy(g_c);
    g_c = NULL;
}

/* ---- cases ------------------------------------------------------------------------------------ */
static lm_status b_add(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    return lm_ag_add(ag, in[0], in[1], out); /* [3, 4] + [4]: b broadcast over rows */
}
static lm_status b_mul(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    lm_ag_var *m;
    TRY(lm_ag_mul(ag, in[0], in[1], &m)); /* [2, 1, 4] * [3, 1]: both broadcast */
    return lm_ag_scale(ag, m, -1.5f, out);
}
static lm_status b_matmul(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    return lm_ag_matmul(ag, in[0], in[1], out); /* [2, 3, 4] @ [4, 5] */
}
static lm_status b_linear(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    return lm_ag_linear(ag, in[0], in[1], in[2], out); /* [2, 3, 4] x [5, 4] + [5] */
}
static lm_status b_norms(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    lm_ag_var *s, *n, *n2, *t;
    TRY(lm_ag_add_rmsnorm(ag, in[0], in[1], in[2], 1e-5f, &s, &n)); /* both outputs read */
    TRY(lm_ag_rmsnorm(ag, s, in[2], 1e-5f, &n2));
    TRY(lm_ag_add(ag, n, n2, &t));
    return lm_ag_swiglu(ag, t, s, out);
}
static lm_status b_sum_only(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    (void)k;
    lm_ag_var *n;
    return lm_ag_add_rmsnorm(ag, in[0], in[1], in[2], 1e-5f, out, &n); /* the normalized output unused */
}
static lm_status b_attention(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    /* q, k, v as [B, T, H, D] buffers: rope on q and k, transposed views into attention */
    lm_rope_params p = {LM_ROPE_SPLIT_HALF, V(k->inv_freq), 1.0f, NULL, 2, NULL};
    lm_ag_var *q, *kk, *v, *a;
    TRY(lm_ag_rope(ag, in[0], &p, &q));
    TRY(lm_ag_rope(ag, in[1], &p, &kk));
    TRY(lm_ag_transpose(ag, q, 1, 2, &q));
    TRY(lm_ag_transpose(ag, kk, 1, 2, &kk));
    TRY(lm_ag_transpose(ag, in[2], 1, 2, &v));
    TRY(lm_ag_attention(ag, q, kk, v, 0.5f, 1, &a));
    TRY(lm_ag_transpose(ag, a, 1, 2, &a));
    int64_t flat[2] = {2 * 3, 4 * 4};
    return lm_ag_reshape(ag, a, 2, flat, out);
}
static lm_status b_losses(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    lm_ag_var *e, *h, *l1, *l2, *lg, *sl;
    TRY(lm_ag_embedding(ag, in[0], V(k->ids), &e));            /* [6, 4] from table [9, 4] */
    TRY(lm_ag_slice(ag, e, 1, 0, 4, 1, &sl));
    TRY(lm_ag_linear_cross_entropy(ag, sl, in[1], V(k->targets), -100, &l1));
    TRY(lm_ag_linear(ag, e, in[1], NULL, &lg));
    TRY(lm_ag_cross_entropy(ag, lg, V(k->targets), -100, &l2));
    TRY(lm_ag_add(ag, l1, l2, &h));
    return lm_ag_reshape(ag, h, 1, (int64_t[]){1}, out);
}

/* A tied table: the output projection's gradient arrives first, the embedding's is
 * added into it in place (lm_embedding_backward_acc_out: rows of the ids only). */
static lm_status b_tied(lm_ag *ag, lm_ag_var **in, const gc_case *k, lm_ag_var **out) {
    lm_ag_var *e, *l;
    TRY(lm_ag_embedding(ag, in[0], V(k->ids), &e)); /* [6, 4] from table [9, 4] */
    TRY(lm_ag_linear_cross_entropy(ag, e, in[0], V(k->targets), -100, &l));
    return lm_ag_reshape(ag, l, 1, (int64_t[]){1}, out);
}

static void test_every_tape_operation_matches_finite_differences(void) {
    int64_t half = 2;
    lm_tensor *inv = NULL, *ids = NULL, *tg = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ctx, 50.0, 4, V(inv)));
    int32_t idv[6] = {1, 8, 8, 0, 3, 1}, tgv[6] = {2, -100, 5, 5, 0, 7};
    int64_t n6 = 6;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n6, idv, &ids));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n6, tgv, &tg));
    const gc_case cases[] = {
        {"add broadcast", 2, {2, 1}, {{3, 4}, {4}}, b_add, NULL, NULL, NULL},
        {"mul broadcast + scale", 2, {3, 2}, {{2, 1, 4}, {3, 1}}, b_mul, NULL, NULL, NULL},
        {"batched matmul", 2, {3, 2}, {{2, 3, 4}, {4, 5}}, b_matmul, NULL, NULL, NULL},
        {"linear with bias", 3, {3, 2, 1}, {{2, 3, 4}, {5, 4}, {5}}, b_linear, NULL, NULL, NULL},
        {"add_rmsnorm, rmsnorm, swiglu", 3, {2, 2, 1}, {{3, 6}, {3, 6}, {6}}, b_norms, NULL, NULL, NULL},
        {"add_rmsnorm sum only", 3, {2, 2, 1}, {{3, 6}, {3, 6}, {6}}, b_sum_only, NULL, NULL, NULL},
        {"rope + GQA attention views", 3, {4, 4, 4}, {{2, 3, 4, 4}, {2, 3, 2, 4}, {2, 3, 2, 4}}, b_attention, NULL, NULL,
         inv},
        {"embedding, slice, losses (tied)", 2, {2, 2}, {{9, 4}, {9, 4}}, b_losses, ids, tg, NULL},
        {"tied embedding and output projection", 1, {2}, {{9, 4}}, b_tied, ids, tg, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i]);
    lm_tensor_destroy(inv), lm_tensor_destroy(ids), lm_tensor_destroy(tg);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    lm_ctx_set_impl(g_ctx, LM_IMPL_REF);
    LT_RUN(test_every_tape_operation_matches_finite_differences);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
