/* Tests for lm_swiglu_backward_out against float64 finite differences of
 * L = sum(silu(gate) * up * dy), on contiguous and transposed views, bf16 operands
 * with f32 gradients, a large |gate| (saturated sigmoid), and the error paths.
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx;

typedef struct swiglu_fd {
    double *g, *u, *dy;
    int64_t n;
} swiglu_fd;

static double swiglu_loss(void *p) {
    swiglu_fd *f = p;
    double L = 0;
    for (int64_t i = 0; i < f->n; i++) L += f->g[i] / (1 + exp(-f->g[i])) * f->u[i] * f->dy[i];
    return L;
}

static void run_case(int transposed, lm_dtype dt, double scale, lt_rng *r) {
    int64_t s[2] = {4, 7};
    swiglu_fd f = {NULL, NULL, NULL, 28};
    lm_tensor *g = lt_random_tensor(r, dt, 2, s, scale), *u = lt_random_tensor(r, dt, 2, s, 1.0);
    lm_tensor *dy = lt_random_tensor(r, dt, 2, s, 1.0);
    lm_tensor_view gv = *lm_tensor_as_view(g), uv = *lm_tensor_as_view(u), yv = *lm_tensor_as_view(dy);
    if (transposed) {
        LT_CHECK_OK(lm_tensor_view_transpose(&gv, 0, 1, &gv));
        LT_CHECK_OK(lm_tensor_view_transpose(&uv, 0, 1, &uv));
        LT_CHECK_OK(lm_tensor_view_transpose(&yv, 0, 1, &yv));
    }
    f.g = lt_view_to_f64(&gv), f.u = lt_view_to_f64(&uv), f.dy = lt_view_to_f64(&yv);
    double *gg = malloc(sizeof(double) * 28), *gu = malloc(sizeof(double) * 28);
    fd_gradient(swiglu_loss, &f, f.g, 28, gg);
    fd_gradient(swiglu_loss, &f, f.u, 28, gu);
    lm_tensor *dg = lt_poisoned_tensor(LM_F32, 2, gv.shape), *du = lt_poisoned_tensor(LM_F32, 2, gv.shape);
    LT_CHECK_OK(lm_swiglu_backward_out(g_ctx, &gv, &uv, &yv, lm_tensor_as_view(dg), lm_tensor_as_view(du)));
    fd_check("dgate", lm_tensor_as_view(dg), gg, 1e-10, 1e-6);
    fd_check("dup", lm_tensor_as_view(du), gu, 1e-10, 1e-6);
    free(f.g), free(f.u), free(f.dy), free(gg), free(gu);
    lm_tensor_destroy(g), lm_tensor_destroy(u), lm_tensor_destroy(dy), lm_tensor_destroy(dg), lm_tensor_destroy(du);
}

static void test_swiglu_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(31);
    run_case(0, LM_F32, 2.0, &r);
    run_case(1, LM_F32, 2.0, &r);
    run_case(0, LM_BF16, 2.0, &r);
    run_case(0, LM_F32, 12.0, &r);
}

static void test_swiglu_backward_errors(void) {
    lt_rng r = lt_rng_seed(32);
    int64_t s[2] = {2, 3}, t[2] = {3, 2};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s, 1), *b = lt_random_tensor(&r, LM_F32, 2, t, 1);
    lm_tensor *h = lt_random_tensor(&r, LM_F16, 2, s, 1), *o = lt_poisoned_tensor(LM_F32, 2, s);
    const lm_tensor_view *va = lm_tensor_as_view(a);
    LT_CHECK_STATUS(lm_swiglu_backward_out(g_ctx, va, lm_tensor_as_view(b), va, NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_swiglu_backward_out(g_ctx, va, lm_tensor_as_view(h), va, NULL, NULL), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_swiglu_backward_out(g_ctx, va, va, va, va, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_swiglu_backward_out(g_ctx, va, va, va, lm_tensor_as_view(o), lm_tensor_as_view(o)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "dup") != NULL);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(h), lm_tensor_destroy(o);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_swiglu_backward_matches_finite_differences);
    LT_RUN(test_swiglu_backward_errors);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
