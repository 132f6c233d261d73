/* Tests for the cross-entropy backward and the fused output projection +
 * cross-entropy against float64 finite differences: ignored rows, dloss != 1, all
 * rows ignored (NaN loss, zero gradients, as PyTorch); the fused loss equals
 * matmul + cross_entropy; its dx and dw through the composed (chunked) and the
 * reference levels, including a vocabulary large enough for several chunks; targets
 * out of range fail before anything is written. The grads form (loss and gradients at
 * dloss = 1 in one pass) equals the forward followed by the backward at dloss = 1, at
 * both levels and with either gradient left out; scale_by multiplies by a scalar
 * view.
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx, *g_ref;

typedef struct ce_fd {
    double *x, *w;      /* fused: x [N, H], w [V, H]; plain: x = logits [N, V], w unused */
    const int64_t *t;   /* [N] */
    int64_t N, V, H;
    double dloss;
    int fused;
    double *z; /* [V] scratch */
} ce_fd;

static double ce_loss(void *u) {
    ce_fd *f = u;
    double total = 0, *z = f->z;
    int64_t counted = 0;
    for (int64_t r = 0; r < f->N; r++) {
        if (f->t[r] < 0) continue;
        double mx = -INFINITY, sum = 0;
        for (int64_t v = 0; v < f->V; v++) {
            if (f->fused) {
                z[v] = 0;
                for (int64_t h = 0; h < f->H; h++) z[v] += f->x[r * f->H + h] * f->w[v * f->H + h];
            } else z[v] = f->x[r * f->V + v];
            mx = z[v] > mx ? z[v] : mx;
        }
        for (int64_t v = 0; v < f->V; v++) sum += exp(z[v] - mx);
        total += mx + log(sum) - z[f->t[r]];
        counted++;
    }
    return f->dloss * total / (double)counted;
}

static lm_tensor *targets_tensor(const int64_t *t, int64_t n) {
    lm_tensor *out = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &n, t, &out));
    return out;
}

static void test_cross_entropy_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(71);
    int64_t t[5] = {2, -100, 0, 10, 4}, s[2] = {5, 11};
    double z[11];
    ce_fd f = {NULL, NULL, t, 5, 11, 0, 0.75, 0, z};
    lm_tensor *logits = fd_random(&r, LM_F32, 2, s, 3.0, &f.x), *tt = targets_tensor(t, 5), *dl = fd_scalar(0.75f);
    double *g = malloc(sizeof(double) * 55);
    fd_gradient(ce_loss, &f, f.x, 55, g);
    lm_tensor *out = lt_poisoned_tensor(LM_F32, 2, s);
    LT_CHECK_OK(lm_cross_entropy_backward_out(g_ctx, lm_tensor_as_view(logits), lm_tensor_as_view(tt), -100,
                                              lm_tensor_as_view(dl), lm_tensor_as_view(out)));
    fd_check("dlogits", lm_tensor_as_view(out), g, 1e-10, 1e-6);
    /* every row ignored: zero gradient */
    int64_t none[5] = {-100, -100, -100, -100, -100};
    lm_tensor *tn = targets_tensor(none, 5);
    LT_CHECK_OK(lm_cross_entropy_backward_out(g_ctx, lm_tensor_as_view(logits), lm_tensor_as_view(tn), -100,
                                              lm_tensor_as_view(dl), lm_tensor_as_view(out)));
    const float *o = lm_tensor_data(out);
    for (int i = 0; i < 55; i++) LT_CHECK(o[i] == 0.0f);
    int64_t bad[5] = {0, 0, 11, 0, 0};
    lm_tensor *tb = targets_tensor(bad, 5);
    LT_CHECK_STATUS(lm_cross_entropy_backward_out(g_ctx, lm_tensor_as_view(logits), lm_tensor_as_view(tb), -100,
                                                  lm_tensor_as_view(dl), lm_tensor_as_view(out)),
                    LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "targets[2] = 11") != NULL);
    LT_CHECK_STATUS(lm_cross_entropy_backward_out(g_ctx, lm_tensor_as_view(logits), lm_tensor_as_view(tt), -100,
                                                  lm_tensor_as_view(logits), lm_tensor_as_view(out)),
                    LM_SHAPE_MISMATCH);
    free(f.x), free(g);
    lm_tensor_destroy(logits), lm_tensor_destroy(tt), lm_tensor_destroy(dl), lm_tensor_destroy(out);
    lm_tensor_destroy(tn), lm_tensor_destroy(tb);
}

static void test_linear_cross_entropy_equals_matmul_then_cross_entropy(void) {
    lt_rng r = lt_rng_seed(72);
    int64_t t[6] = {1, 8, -100, 0, 3, 3}, xs[2] = {6, 5}, ws[2] = {9, 5}, ls[2] = {6, 9};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1);
    lm_tensor *tt = targets_tensor(t, 6), *logits = lt_poisoned_tensor(LM_F32, 2, ls);
    lm_tensor *l1 = lt_poisoned_tensor(LM_F32, 0, NULL), *l2 = lt_poisoned_tensor(LM_F32, 0, NULL);
    lm_tensor *l3 = lt_poisoned_tensor(LM_F32, 0, NULL);
    lm_tensor_view wt;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &wt));
    LT_CHECK_OK(lm_matmul_out(g_ref, lm_tensor_as_view(x), &wt, lm_tensor_as_view(logits)));
    LT_CHECK_OK(lm_cross_entropy_out(g_ref, lm_tensor_as_view(logits), lm_tensor_as_view(tt), -100, lm_tensor_as_view(l1)));
    LT_CHECK_OK(lm_linear_cross_entropy_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt), -100,
                                            lm_tensor_as_view(l2)));
    LT_CHECK_OK(lm_linear_cross_entropy_out(g_ref, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt), -100,
                                            lm_tensor_as_view(l3)));
    float a = *(float *)lm_tensor_data(l1), b = *(float *)lm_tensor_data(l2), c = *(float *)lm_tensor_data(l3);
    LT_CHECK_MSG(fabsf(a - b) <= 1e-6f * fabsf(a) && fabsf(a - c) <= 1e-6f * fabsf(a), "losses %.9g %.9g %.9g", a, b, c);
    int64_t none[6] = {-100, -100, -100, -100, -100, -100};
    lm_tensor *tn = targets_tensor(none, 6);
    LT_CHECK_OK(lm_linear_cross_entropy_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tn), -100,
                                            lm_tensor_as_view(l2)));
    LT_CHECK(isnan(*(float *)lm_tensor_data(l2)));
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(tt), lm_tensor_destroy(logits);
    lm_tensor_destroy(l1), lm_tensor_destroy(l2), lm_tensor_destroy(l3), lm_tensor_destroy(tn);
}

/* rel: the max-abs gate relative to max |gradient|; the composed level accumulates in
 * f32 when lm_matmul_out runs the tuned GEMM, whose error grows with the V-term sums of
 * dx (about sqrt(V) * 2^-24: 3e-5 at V = 2^18). */
static void fused_case(int64_t N, int64_t V, int64_t H, const int64_t *t, int sample_dw, double rel, lt_rng *r) {
    ce_fd f = {NULL, NULL, t, N, V, H, 1.5, 1, malloc(sizeof(double) * (size_t)V)};
    int64_t xs[2] = {N, H}, ws[2] = {V, H};
    lm_tensor *x = fd_random(r, LM_F32, 2, xs, 1.0, &f.x), *w = fd_random(r, LM_F32, 2, ws, 1.0, &f.w);
    lm_tensor *tt = targets_tensor(t, N), *dl = fd_scalar(1.5f);
    double *gx = malloc(sizeof(double) * (size_t)(N * H)), *gw = calloc((size_t)(V * H), sizeof(double));
    fd_gradient(ce_loss, &f, f.x, N * H, gx);
    if (!sample_dw) fd_gradient(ce_loss, &f, f.w, V * H, gw);
    for (int level = 0; level < 2; level++) {
        lm_tensor *dx = lt_poisoned_tensor(LM_F32, 2, xs), *dw = lt_poisoned_tensor(LM_F32, 2, ws);
        LT_CHECK_OK(lm_linear_cross_entropy_backward_out(level ? g_ref : g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w),
                                                         lm_tensor_as_view(tt), -100, lm_tensor_as_view(dl),
                                                         lm_tensor_as_view(dx), lm_tensor_as_view(dw)));
        fd_check(level ? "dx (ref)" : "dx", lm_tensor_as_view(dx), gx, 1e-10, level ? 1e-6 : rel);
        if (!sample_dw) {
            fd_check(level ? "dw (ref)" : "dw", lm_tensor_as_view(dw), gw, 1e-10, level ? 1e-6 : rel);
        } else { /* a few rows of w: every target row and some others, by differences */
            const float *got = lm_tensor_data(dw);
            int64_t rows[6] = {t[0] >= 0 ? t[0] : 0, t[1] >= 0 ? t[1] : 1, 0, V / 2, V - 1, 12345 % V};
            for (int i = 0; i < 6; i++) {
                double g2[8];
                fd_gradient(ce_loss, &f, f.w + rows[i] * H, H, g2);
                for (int64_t h = 0; h < H; h++)
                    LT_CHECK_MSG(fabs(got[rows[i] * H + h] - g2[h]) <= 1e-6 * fabs(g2[h]) + 1e-9, "dw[%lld, %lld] %g vs %g",
                                 (long long)rows[i], (long long)h, got[rows[i] * H + h], g2[h]);
            }
        }
        lm_tensor_destroy(dx), lm_tensor_destroy(dw);
    }
    free(f.x), free(f.w), free(f.z), free(gx), free(gw);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(tt), lm_tensor_destroy(dl);
}

static void test_linear_cross_entropy_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(73);
    int64_t t[7] = {3, -100, 0, 9, 9, 4, 1};
    fused_case(7, 10, 6, t, 0, 1e-6, &r);
    /* V = 2^18: chunks of 4 rows, so 10 rows take three chunks (the last partial) */
    int64_t tb[10] = {5, 262143, -100, 77, 0, 5, 131072, 9, 1000, 2};
    fused_case(10, 262144, 2, tb, 1, 3e-5, &r);
}

static void test_linear_cross_entropy_errors(void) {
    lt_rng r = lt_rng_seed(74);
    int64_t t[2] = {0, 5}, xs[2] = {2, 3}, ws[2] = {5, 3}, w4[2] = {5, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1);
    lm_tensor *wb = lt_random_tensor(&r, LM_F32, 2, w4, 1), *tt = targets_tensor(t, 2);
    lm_tensor *loss = lt_poisoned_tensor(LM_F32, 0, NULL), *dx = lt_poisoned_tensor(LM_F32, 2, xs);
    LT_CHECK_STATUS(lm_linear_cross_entropy_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt),
                                                -100, lm_tensor_as_view(loss)),
                    LM_OUT_OF_RANGE);
    LT_CHECK(isnan(*(float *)lm_tensor_data(loss)));
    LT_CHECK_STATUS(lm_linear_cross_entropy_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(wb), lm_tensor_as_view(tt),
                                                -100, lm_tensor_as_view(loss)),
                    LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_linear_cross_entropy_backward_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w),
                                                         lm_tensor_as_view(tt), 5, lm_tensor_as_view(x), lm_tensor_as_view(dx),
                                                         NULL),
                    LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "dloss") != NULL);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(wb), lm_tensor_destroy(tt);
    lm_tensor_destroy(loss), lm_tensor_destroy(dx);
}

/* 1 when every element of f32 tensor t is NaN (still poisoned). */
static int all_nan(const lm_tensor *t) {
    const float *p = lm_tensor_data(t);
    int64_t n = lm_tensor_view_numel(lm_tensor_as_view(t));
    for (int64_t i = 0; i < n; i++)
        if (!isnan(p[i])) return 0;
    return 1;
}

/* lm_linear_cross_entropy_grads_out against lm_linear_cross_entropy_out +
 * lm_linear_cross_entropy_backward_out (dloss = 1) on the same context: the composed
 * level (g_ctx) runs the same chunk arithmetic in both, so the results are identical;
 * the reference (g_ref) runs exactly its forward and backward. */
static void grads_case(lm_ctx *ctx, int64_t N, int64_t V, int64_t H, const int64_t *t, lt_rng *r) {
    int64_t xs[2] = {N, H}, ws[2] = {V, H};
    lm_tensor *x = lt_random_tensor(r, LM_F32, 2, xs, 1), *w = lt_random_tensor(r, LM_F32, 2, ws, 1);
    lm_tensor *tt = targets_tensor(t, N), *one = fd_scalar(1.0f);
    lm_tensor *l1 = lt_poisoned_tensor(LM_F32, 0, NULL), *dx1 = lt_poisoned_tensor(LM_F32, 2, xs);
    lm_tensor *dw1 = lt_poisoned_tensor(LM_F32, 2, ws);
    LT_CHECK_OK(lm_linear_cross_entropy_out(ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt), -100,
                                            lm_tensor_as_view(l1)));
    LT_CHECK_OK(lm_linear_cross_entropy_backward_out(ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt),
                                                     -100, lm_tensor_as_view(one), lm_tensor_as_view(dx1),
                                                     lm_tensor_as_view(dw1)));
    for (int which = 0; which < 3; which++) { /* both gradients, dx only, dw only */
        lm_tensor *l2 = lt_poisoned_tensor(LM_F32, 0, NULL), *dx2 = lt_poisoned_tensor(LM_F32, 2, xs);
        lm_tensor *dw2 = lt_poisoned_tensor(LM_F32, 2, ws);
        LT_CHECK_OK(lm_linear_cross_entropy_grads_out(ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), lm_tensor_as_view(tt),
                                                      -100, lm_tensor_as_view(l2), which != 2 ? lm_tensor_as_view(dx2) : NULL,
                                                      which != 1 ? lm_tensor_as_view(dw2) : NULL));
        float a = *(float *)lm_tensor_data(l1), b = *(float *)lm_tensor_data(l2);
        LT_CHECK_MSG(a == b || (isnan(a) && isnan(b)), "grads form (case %d): loss %.9g, forward %.9g", which, b, a);
        if (which != 2)
            LT_CHECK_MSG(memcmp(lm_tensor_data(dx1), lm_tensor_data(dx2), sizeof(float) * (size_t)(N * H)) == 0,
                         "grads form (case %d): dx differs from the backward's", which);
        else
            LT_CHECK(all_nan(dx2));
        if (which != 1)
            LT_CHECK_MSG(memcmp(lm_tensor_data(dw1), lm_tensor_data(dw2), sizeof(float) * (size_t)(V * H)) == 0,
                         "grads form (case %d): dw differs from the backward's", which);
        else
            LT_CHECK(all_nan(dw2));
        lm_tensor_destroy(l2), lm_tensor_destroy(dx2), lm_tensor_destroy(dw2);
    }
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(tt), lm_tensor_destroy(one);
    lm_tensor_destroy(l1), lm_tensor_destroy(dx1), lm_tensor_destroy(dw1);
}

static void test_linear_cross_entropy_grads_equals_forward_then_backward(void) {
    lt_rng r = lt_rng_seed(75);
    int64_t t[7] = {3, -100, 0, 9, 9, 4, 1}, none[3] = {-100, -100, -100};
    for (int level = 0; level < 2; level++) {
        lm_ctx *ctx = level ? g_ref : g_ctx;
        grads_case(ctx, 7, 10, 6, t, &r);
        grads_case(ctx, 3, 10, 6, none, &r); /* NaN loss, zero gradients */
    }
    int64_t tb[10] = {5, 262143, -100, 77, 0, 5, 131072, 9, 1000, 2}; /* several chunks */
    grads_case(g_ctx, 10, 262144, 2, tb, &r);
    /* a bad target: an error naming it, nothing written */
    int64_t bad[2] = {0, 10}, xs[2] = {2, 6}, ws[2] = {10, 6};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1);
    lm_tensor *tt = targets_tensor(bad, 2), *loss = lt_poisoned_tensor(LM_F32, 0, NULL);
    lm_tensor *dx = lt_poisoned_tensor(LM_F32, 2, xs), *dw = lt_poisoned_tensor(LM_F32, 2, ws);
    for (int level = 0; level < 2; level++) {
        LT_CHECK_STATUS(lm_linear_cross_entropy_grads_out(level ? g_ref : g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w),
                                                          lm_tensor_as_view(tt), -100, lm_tensor_as_view(loss),
                                                          lm_tensor_as_view(dx), lm_tensor_as_view(dw)),
                        LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "targets[1] = 10") != NULL, "message: %s", lm_last_error());
        LT_CHECK(all_nan(loss) && all_nan(dx) && all_nan(dw));
    }
    LT_CHECK_STATUS(lm_linear_cross_entropy_grads_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w),
                                                      lm_tensor_as_view(tt), -100, NULL, lm_tensor_as_view(dx), NULL),
                    LM_INVALID_ARGUMENT);
    int64_t good[2] = {0, 9};
    lm_tensor *tg = targets_tensor(good, 2);
    LT_CHECK_STATUS(lm_linear_cross_entropy_grads_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w),
                                                      lm_tensor_as_view(tg), -100, lm_tensor_as_view(loss), lm_tensor_as_view(x),
                                                      NULL),
                    LM_INVALID_ARGUMENT); /* dx overlapping x */
    LT_CHECK(strstr(lm_last_error(), "dx") != NULL);
    lm_tensor_destroy(tg);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(tt), lm_tensor_destroy(loss);
    lm_tensor_destroy(dx), lm_tensor_destroy(dw);
}

/* scale_by: the factor read from a scalar view, in place and out of place, f32 and
 * bf16 (the product rounded once); a non-scalar or non-f32 factor is refused. */
static void test_scale_by(void) {
    lt_rng r = lt_rng_seed(76);
    int64_t xs[2] = {5, 7};
    lm_tensor *s = fd_scalar(-0.3125f), *s3 = lt_random_tensor(&r, LM_F32, 1, xs, 1);
    for (int k = 0; k < 2; k++) {
        lm_dtype dt = k ? LM_BF16 : LM_F32;
        lm_tensor *x = lt_random_tensor(&r, dt, 2, xs, 1), *want = lt_poisoned_tensor(dt, 2, xs);
        lm_tensor *got = lt_poisoned_tensor(dt, 2, xs);
        LT_CHECK_OK(lm_scale_out(g_ref, lm_tensor_as_view(x), -0.3125f, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm_scale_by_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(s), lm_tensor_as_view(got)));
        size_t bytes = lm_dtype_size(dt) * 35;
        LT_CHECK_MSG(memcmp(lm_tensor_data(want), lm_tensor_data(got), bytes) == 0, "scale_by %s", lm_dtype_name(dt));
        LT_CHECK_OK(lm_scale_by_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(s), lm_tensor_as_view(x)));
        LT_CHECK_MSG(memcmp(lm_tensor_data(want), lm_tensor_data(x), bytes) == 0, "scale_by %s in place", lm_dtype_name(dt));
        lm_tensor_destroy(x), lm_tensor_destroy(want), lm_tensor_destroy(got);
    }
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *sb = lt_random_tensor(&r, LM_BF16, 0, NULL, 1);
    LT_CHECK_STATUS(lm_scale_by_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(s3), lm_tensor_as_view(x)),
                    LM_SHAPE_MISMATCH);
    LT_CHECK_MSG(strstr(lm_last_error(), "scale_by: s") != NULL, "message: %s", lm_last_error());
    LT_CHECK_STATUS(lm_scale_by_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(sb), lm_tensor_as_view(x)),
                    LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_scale_by_out(g_ctx, lm_tensor_as_view(x), NULL, lm_tensor_as_view(x)), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(x), lm_tensor_destroy(sb), lm_tensor_destroy(s), lm_tensor_destroy(s3);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 2, &g_ctx) != LM_OK || lm_ctx_create(lm_device_cpu(), 1, &g_ref) != LM_OK) return 1;
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    LT_RUN(test_cross_entropy_backward_matches_finite_differences);
    LT_RUN(test_linear_cross_entropy_equals_matmul_then_cross_entropy);
    LT_RUN(test_linear_cross_entropy_backward_matches_finite_differences);
    LT_RUN(test_linear_cross_entropy_errors);
    LT_RUN(test_linear_cross_entropy_grads_equals_forward_then_backward);
    LT_RUN(test_scale_by);
    lm_ctx_destroy(g_ctx);
    lm_ctx_destroy(g_ref);
    return lt_finish();
}
