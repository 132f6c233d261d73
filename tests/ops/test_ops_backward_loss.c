/* Tests for the cross-entropy backward and the fused output projection +
 * cross-entropy against float64 finite differences: ignored rows, dloss != 1, all
 * rows ignored (NaN loss, zero gradients, as PyTorch); the fused loss equals
 * matmul + cross_entropy; its dx and dw through the composed (chunked) and the
 * reference levels, including a vocabulary large enough for several chunks; targets
 * out of range fail before anything is written.
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

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 2, &g_ctx) != LM_OK || lm_ctx_create(lm_device_cpu(), 1, &g_ref) != LM_OK) return 1;
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    LT_RUN(test_cross_entropy_backward_matches_finite_differences);
    LT_RUN(test_linear_cross_entropy_equals_matmul_then_cross_entropy);
    LT_RUN(test_linear_cross_entropy_backward_matches_finite_differences);
    LT_RUN(test_linear_cross_entropy_errors);
    lm_ctx_destroy(g_ctx);
    lm_ctx_destroy(g_ref);
    return lt_finish();
}
