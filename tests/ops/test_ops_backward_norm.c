/* Tests for lm_rmsnorm_backward_out and lm_add_rmsnorm_backward_out against float64
 * finite differences of L = sum(rmsnorm(x) * w * dy) (+ sum(sum * dsum) for the fused
 * form, whose x and residual gradients are the same dx): 2-d and 4-d (per-head)
 * inputs, a strided x, bf16 operands with f32 gradients, poisoned outputs, errors.
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx;

typedef struct norm_fd {
    double *x, *w, *dy, *ds; /* x, dy, ds [rows, D]; w [D]; ds may be NULL */
    int64_t rows, D;
    double eps;
} norm_fd;

static double norm_loss(void *u) {
    norm_fd *f = u;
    double L = 0;
    for (int64_t r = 0; r < f->rows; r++) {
        const double *x = f->x + r * f->D;
        double ss = 0;
        for (int64_t i = 0; i < f->D; i++) ss += x[i] * x[i];
        double inv = 1.0 / sqrt(ss / (double)f->D + f->eps);
        for (int64_t i = 0; i < f->D; i++) {
            L += x[i] * inv * f->w[i] * f->dy[r * f->D + i];
            if (f->ds) L += x[i] * f->ds[r * f->D + i]; /* the sum output's own reader */
        }
    }
    return L;
}

/* x of shape [ndim] (last dim D); fused: the operator gets x as the forward's sum. */
static void run_case(int ndim, const int64_t *shape, int fused, int strided, lm_dtype dt, lt_rng *r) {
    norm_fd f = {0};
    f.D = shape[ndim - 1];
    f.rows = 1;
    for (int i = 0; i < ndim - 1; i++) f.rows *= shape[i];
    f.eps = 1e-5;
    lm_tensor *xt, *store = NULL;
    lm_tensor_view xv;
    if (strided) { /* x = columns [0, D) of a [rows, 2D] buffer */
        int64_t s2[2] = {f.rows, 2 * f.D};
        store = lt_random_tensor(r, dt, 2, s2, 1.5);
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(store), 1, 0, f.D, 1, &xv));
        xt = NULL;
        f.x = lt_view_to_f64(&xv);
    } else {
        xt = fd_random(r, dt, ndim, shape, 1.5, &f.x);
        xv = *lm_tensor_as_view(xt);
    }
    lm_tensor *w = fd_random(r, dt, 1, &f.D, 1.0, &f.w), *dy = fd_random(r, dt, xv.ndim, xv.shape, 1.0, &f.dy);
    lm_tensor *ds = fused ? fd_random(r, dt, xv.ndim, xv.shape, 1.0, &f.ds) : NULL;
    int64_t n = f.rows * f.D;
    double *gx = malloc(sizeof(double) * (size_t)n), *gw = malloc(sizeof(double) * (size_t)f.D);
    fd_gradient(norm_loss, &f, f.x, n, gx);
    fd_gradient(norm_loss, &f, f.w, f.D, gw);
    lm_tensor *dx = lt_poisoned_tensor(LM_F32, xv.ndim, xv.shape), *dw = lt_poisoned_tensor(LM_F32, 1, &f.D);
    if (fused)
        LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, &xv, lm_tensor_as_view(w), (float)f.eps, lm_tensor_as_view(dy),
                                                lm_tensor_as_view(ds), lm_tensor_as_view(dx), lm_tensor_as_view(dw)));
    else
        LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, &xv, lm_tensor_as_view(w), (float)f.eps, lm_tensor_as_view(dy),
                                            lm_tensor_as_view(dx), lm_tensor_as_view(dw)));
    /* eps is passed as f32: the forward used (double)(float)1e-5; the differences use
     * 1e-5, a 1e-13 relative change of r, far below the gate */
    fd_check("dx", lm_tensor_as_view(dx), gx, 1e-10, 1e-6);
    fd_check("dweight", lm_tensor_as_view(dw), gw, 1e-10, 1e-6);
    free(f.x), free(f.w), free(f.dy), free(f.ds), free(gx), free(gw);
    lm_tensor_destroy(xt), lm_tensor_destroy(store), lm_tensor_destroy(w), lm_tensor_destroy(dy);
    lm_tensor_destroy(ds), lm_tensor_destroy(dx), lm_tensor_destroy(dw);
}

static void test_norm_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(21);
    int64_t s2[2] = {5, 8}, s4[4] = {2, 3, 2, 6};
    for (int fused = 0; fused < 2; fused++) {
        run_case(2, s2, fused, 0, LM_F32, &r);
        run_case(4, s4, fused, 0, LM_F32, &r);
        run_case(2, s2, fused, 1, LM_F32, &r);
        run_case(2, s2, fused, 0, LM_BF16, &r);
    }
}

static void test_norm_backward_optional_outputs(void) {
    lt_rng r = lt_rng_seed(22);
    int64_t s[2] = {3, 4}, d = 4;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *w = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    lm_tensor *dy = lt_random_tensor(&r, LM_F32, 2, s, 1), *dw1 = lt_poisoned_tensor(LM_F32, 1, &d);
    lm_tensor *dw2 = lt_poisoned_tensor(LM_F32, 1, &d), *dx = lt_poisoned_tensor(LM_F32, 2, s);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vw = lm_tensor_as_view(w), *vy = lm_tensor_as_view(dy);
    LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vy, NULL, lm_tensor_as_view(dw1)));
    LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vy, lm_tensor_as_view(dx), lm_tensor_as_view(dw2)));
    LT_CHECK(memcmp(lm_tensor_data(dw1), lm_tensor_data(dw2), 4 * sizeof(float)) == 0);
    /* the fused form without dsum equals the plain one */
    lm_tensor *dx2 = lt_poisoned_tensor(LM_F32, 2, s);
    LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vy, NULL, lm_tensor_as_view(dx2), NULL));
    LT_CHECK(memcmp(lm_tensor_data(dx), lm_tensor_data(dx2), 12 * sizeof(float)) == 0);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(dy), lm_tensor_destroy(dw1);
    lm_tensor_destroy(dw2), lm_tensor_destroy(dx), lm_tensor_destroy(dx2);
}

static void test_norm_backward_errors(void) {
    lt_rng r = lt_rng_seed(23);
    int64_t s[2] = {3, 4}, d = 4, d5 = 5, s5[2] = {3, 5};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *w = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    lm_tensor *w5 = lt_random_tensor(&r, LM_F32, 1, &d5, 1), *dy5 = lt_random_tensor(&r, LM_F32, 2, s5, 1);
    lm_tensor *dxh = lt_poisoned_tensor(LM_F16, 2, s);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vw = lm_tensor_as_view(w);
    LT_CHECK_STATUS(lm_rmsnorm_backward_out(g_ctx, vx, lm_tensor_as_view(w5), 1e-6f, vx, NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "weight") != NULL);
    LT_CHECK_STATUS(lm_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, lm_tensor_as_view(dy5), NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_rmsnorm_backward_out(g_ctx, vx, vw, -1.0f, vx, NULL, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vx, lm_tensor_as_view(dxh), NULL), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vx, vx, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add_rmsnorm_backward_out(g_ctx, vx, vw, 1e-6f, vx, lm_tensor_as_view(dy5), NULL, NULL),
                    LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "dsum") != NULL);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(w5), lm_tensor_destroy(dy5), lm_tensor_destroy(dxh);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_norm_backward_matches_finite_differences);
    LT_RUN(test_norm_backward_optional_outputs);
    LT_RUN(test_norm_backward_errors);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
