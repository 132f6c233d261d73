/* Tests for lm_softmax_out / lm_softmax against a float64 re-derivation and PyTorch
 * fixtures: random shapes (size-1 and zero-size dims), random scales, causal rows
 * with Tq <= Tk (masked entries exactly 0), transposed input and output views, all
 * three float dtypes, large logits (max subtraction), in-place use, NaN-poisoned
 * outputs and every error path with its exact status.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
/* Probabilities are computed in double and rounded once to the dtype (relative
 * 2^-24 / 2^-9 / 2^-12); they lie in [0, 1], which bounds the absolute error. */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-6 : dt == LM_BF16 ? 4e-3 : 5e-4; }

/* Row-major softmax of x [rows, n] * scale in double; causal rows are the rows of
 * trailing [tq, n] blocks and see columns j <= i + n - tq. Written without the max
 * shift (inputs here are small) so it does not mirror the kernel. */
static double *softmax_f64(const double *x, int64_t rows, int64_t n, int64_t tq, double scale, int causal) {
    double *y = calloc((size_t)(rows * n + 1), sizeof(double));
    for (int64_t r = 0; r < rows; r++) {
        int64_t vis = causal ? r % tq + n - tq + 1 : n;
        double z = 0;
        for (int64_t j = 0; j < vis; j++) z += exp(scale * x[r * n + j]);
        for (int64_t j = 0; j < vis; j++) y[r * n + j] = exp(scale * x[r * n + j]) / z;
    }
    return y;
}

/* A poisoned tensor of logical shape `shape`; when transposed (nd >= 2) it is stored
 * with the last two dims swapped and *v is its transposed view. */
static lm_tensor *make_view(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, int transposed, int random,
                            lm_tensor_view *v) {
    int64_t s[LM_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
    if (transposed) s[nd - 2] = shape[nd - 1], s[nd - 1] = shape[nd - 2];
    lm_tensor *t = random ? lt_random_tensor(r, dt, nd, s, 1.5) : lt_poisoned_tensor(dt, nd, s);
    *v = *lm_tensor_as_view(t);
    if (transposed) LT_CHECK_OK(lm_tensor_view_transpose(v, nd - 2, nd - 1, v));
    return t;
}

static void test_softmax_matches_f64_random_shapes_causal_and_not(void) {
    lt_rng r = lt_rng_seed(21);
    for (int trial = 0; trial < 90; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int nd = (int)lt_rng_int(&r, 1, 4), causal = nd >= 2 && lt_rng_int(&r, 0, 1);
        int64_t shape[LM_MAX_DIMS];
        for (int i = 0; i < nd; i++) shape[i] = lt_rng_int(&r, 0, 12) == 0 ? 0 : lt_rng_int(&r, 1, 6);
        if (causal) shape[nd - 1] = shape[nd - 2] + lt_rng_int(&r, 0, 3); /* Tk >= Tq */
        double scale = lt_rng_uniform(&r) * 4 - 2;
        int tx = nd >= 2 && lt_rng_int(&r, 0, 1), to = nd >= 2 && lt_rng_int(&r, 0, 1);
        lm_tensor_view x, o;
        lm_tensor *tx_t = make_view(&r, dt, nd, shape, tx, 1, &x), *to_t = make_view(&r, dt, nd, shape, to, 0, &o);
        LT_CHECK_OK(lm_softmax_out(g_ctx, &x, (float)scale, causal, &o));
        int64_t n = shape[nd - 1], numel = lm_tensor_view_numel(&x), rows = n ? numel / n : 0;
        double *xv = lt_view_to_f64(&x), *got = lt_view_to_f64(&o);
        double *want = softmax_f64(xv, rows, n, causal ? shape[nd - 2] : 1, (double)(float)scale, causal);
        char what[64];
        snprintf(what, sizeof what, "softmax trial %d (%s, causal %d)", trial, lm_dtype_name(dt), causal);
        lt_check_close(what, got, want, numel, tol_nmse(dt), tol_abs(dt));
        if (causal) {
            int64_t tq = shape[nd - 2], masked_nonzero = 0;
            for (int64_t rr = 0; rr < rows; rr++)
                for (int64_t j = rr % tq + n - tq + 1; j < n; j++) masked_nonzero += got[rr * n + j] != 0.0;
            LT_CHECK_MSG(masked_nonzero == 0, "%s: %lld masked entries are not exactly 0", what, (long long)masked_nonzero);
        }
        free(xv), free(got), free(want);
        lm_tensor_destroy(tx_t), lm_tensor_destroy(to_t);
    }
}

static void test_softmax_causal_aligns_queries_to_the_last_keys(void) {
    /* Tq = 2, Tk = 4: query 0 is position 2 (sees keys 0..2), query 1 sees all. */
    int64_t s[2] = {2, 4};
    lm_tensor *x = NULL, *o = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, s, &x));
    LT_CHECK_OK(lm_softmax(g_ctx, lm_tensor_as_view(x), 1.0f, 1, &o));
    const float *p = lm_tensor_data(o), third = (float)(1.0 / 3.0);
    LT_CHECK(p[0] == third && p[1] == third && p[2] == third && p[3] == 0.0f);
    LT_CHECK(p[4] == 0.25f && p[5] == 0.25f && p[6] == 0.25f && p[7] == 0.25f);
    lm_tensor_destroy(x), lm_tensor_destroy(o);
}

static void test_softmax_is_stable_for_large_logits(void) {
    float src[4] = {1e4f, 1e4f - 1.0f, -1e4f, 3e4f};
    int64_t s[1] = {4};
    lm_tensor *x = NULL, *o = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, s, src, &x));
    LT_CHECK_OK(lm_softmax(g_ctx, lm_tensor_as_view(x), 0.5f, 0, &o)); /* logits 5000, 4999.5, -5000, 15000 */
    const float *p = lm_tensor_data(o);
    LT_CHECK(p[0] == 0.0f && p[1] == 0.0f && p[2] == 0.0f && p[3] == 1.0f);
    lm_tensor_destroy(o);
    LT_CHECK_OK(lm_softmax(g_ctx, lm_tensor_as_view(x), 0.001f, 0, &o)); /* 10, 9.999, -10, 30: all finite */
    double want[4], z = 0, got[4];
    for (int i = 0; i < 4; i++) z += want[i] = exp((double)src[i] * (double)0.001f - 30.0);
    for (int i = 0; i < 4; i++) want[i] /= z;
    for (int i = 0; i < 4; i++) got[i] = ((const float *)lm_tensor_data(o))[i];
    lt_check_close("large logits", got, want, 4, 1e-12, 1e-6);
    lm_tensor_destroy(x), lm_tensor_destroy(o);
}

static void test_softmax_in_place_and_partial_overlap(void) {
    lt_rng r = lt_rng_seed(22);
    int64_t s[3] = {2, 3, 5};
    lm_tensor *x = lt_random_tensor(&r, LM_F16, 3, s, 1.0);
    double *xv = lt_view_to_f64(lm_tensor_as_view(x));
    double *want = softmax_f64(xv, 6, 5, 3, 1.25, 1);
    LT_CHECK_OK(lm_softmax_out(g_ctx, lm_tensor_as_view(x), 1.25f, 1, lm_tensor_as_view(x)));
    double *got = lt_view_to_f64(lm_tensor_as_view(x));
    lt_check_close("in place", got, want, 30, tol_nmse(LM_F16), tol_abs(LM_F16));
    free(xv), free(want), free(got);
    /* out shifted by one element against x: same buffer, overlapping ranges */
    int64_t n9[1] = {9};
    lm_tensor *buf = lt_random_tensor(&r, LM_F32, 1, n9, 1.0);
    lm_tensor_view a, b;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(buf), 0, 0, 8, 1, &a));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(buf), 0, 1, 9, 1, &b));
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, &a, 1.0f, 0, &b), LM_INVALID_ARGUMENT);
    /* same address, different layout */
    int64_t s33[2] = {3, 3};
    lm_tensor *sq = lt_random_tensor(&r, LM_F32, 2, s33, 1.0);
    lm_tensor_view sqt;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(sq), 0, 1, &sqt));
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, lm_tensor_as_view(sq), 1.0f, 0, &sqt), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(x), lm_tensor_destroy(buf), lm_tensor_destroy(sq);
}

static void test_softmax_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/matmul_attention.lmfx", &fx)) return;
    /* f32 inputs are exact; bf16/f16 also round the logits (|x * scale| < ~6, so a
     * logit error up to 6 * 2^-9 / 2^-12 moves probabilities by ~1% / ~0.15%). */
    static const double nmse[] = {1e-12, 4e-5, 1e-6}, abs_tol[] = {1e-6, 6e-3, 1.5e-3};
    double scale = lt_fixture_get(&fx, "sm_scale")->f64[0];
    for (int i = 0; i < 3; i++) {
        lm_tensor *x = lt_fixture_tensor_to(lt_fixture_get(&fx, "sm_x"), k_floats[i]);
        for (int causal = 0; causal < 2; causal++) {
            const lt_fixture_tensor *want = lt_fixture_get(&fx, causal ? "sm_causal_out" : "sm_plain_out");
            lm_tensor *o = lt_poisoned_tensor(k_floats[i], want->ndim, want->shape);
            LT_CHECK_OK(lm_softmax_out(g_ctx, lm_tensor_as_view(x), (float)scale, causal, lm_tensor_as_view(o)));
            double *got = lt_view_to_f64(lm_tensor_as_view(o));
            lt_check_close(causal ? "torch causal softmax" : "torch softmax", got, want->f64, want->numel, nmse[i],
                           abs_tol[i]);
            free(got);
            lm_tensor_destroy(o);
        }
        lm_tensor_destroy(x);
    }
    lt_fixture_free(&fx);
}

static void test_softmax_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(23);
    int64_t s34[2] = {3, 4}, s43[2] = {4, 3}, s4[1] = {4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s34, 1), *xt = lt_random_tensor(&r, LM_F32, 2, s43, 1);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, s34), *ot = lt_poisoned_tensor(LM_F32, 2, s43);
    lm_tensor *oh = lt_poisoned_tensor(LM_F16, 2, s34), *xi = lt_random_tensor(&r, LM_I32, 2, s34, 1);
    lm_tensor *v1 = lt_random_tensor(&r, LM_F32, 1, s4, 1), *o1 = lt_poisoned_tensor(LM_F32, 1, s4), *o2 = NULL;
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vo = lm_tensor_as_view(o);
    /* causal with Tk < Tq */
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, lm_tensor_as_view(xt), 1.0f, 1, lm_tensor_as_view(ot)), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "Tq = 4") && strstr(lm_last_error(), "Tk = 3"));
    LT_CHECK_STATUS(lm_softmax(g_ctx, lm_tensor_as_view(xt), 1.0f, 1, &o2), LM_SHAPE_MISMATCH);
    LT_CHECK(o2 == NULL);
    /* causal needs two dims; a scalar has no last dim */
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, lm_tensor_as_view(v1), 1.0f, 1, lm_tensor_as_view(o1)), LM_SHAPE_MISMATCH);
    lm_tensor_view scalar;
    LT_CHECK_OK(lm_tensor_view_select(lm_tensor_as_view(v1), 0, 2, &scalar));
    lm_tensor_view scalar_out;
    LT_CHECK_OK(lm_tensor_view_select(lm_tensor_as_view(o1), 0, 2, &scalar_out));
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, &scalar, 1.0f, 0, &scalar_out), LM_SHAPE_MISMATCH);
    /* shape and dtype of out, integer input */
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, vx, 1.0f, 0, lm_tensor_as_view(ot)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, vx, 1.0f, 0, lm_tensor_as_view(oh)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, lm_tensor_as_view(xi), 1.0f, 0, vo), LM_UNSUPPORTED);
    /* NULLs, foreign device, self-overlapping out */
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, NULL, 1.0f, 0, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, vx, 1.0f, 0, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_softmax(g_ctx, NULL, 1.0f, 0, &o2), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vo;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, vx, 1.0f, 0, &dev), LM_INVALID_ARGUMENT);
    lm_tensor_view bc;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(o1), 2, s34, &bc));
    LT_CHECK_STATUS(lm_softmax_out(g_ctx, vx, 1.0f, 0, &bc), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(x), lm_tensor_destroy(xt), lm_tensor_destroy(o), lm_tensor_destroy(ot), lm_tensor_destroy(oh);
    lm_tensor_destroy(xi), lm_tensor_destroy(v1), lm_tensor_destroy(o1);
}

static void test_softmax_allocating_form_leaks_nothing_when_allocation_fails(void) {
    lt_rng r = lt_rng_seed(24);
    int64_t s[2] = {3, 5};
    lm_tensor *x = lt_random_tensor(&r, LM_BF16, 2, s, 1);
    for (int k = 1; k <= 4; k++) {
        lm_tensor *o = NULL;
        lt_alloc_track(k);
        lm_status st = lm_softmax(g_ctx, lm_tensor_as_view(x), 1.0f, 1, &o);
        if (k <= lt_alloc_count()) {
            LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
            LT_CHECK(o == NULL);
        }
        lm_tensor_destroy(o);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor_destroy(x);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_softmax_matches_f64_random_shapes_causal_and_not);
    LT_RUN(test_softmax_causal_aligns_queries_to_the_last_keys);
    LT_RUN(test_softmax_is_stable_for_large_logits);
    LT_RUN(test_softmax_in_place_and_partial_overlap);
    LT_RUN(test_softmax_matches_torch_fixture);
    LT_RUN(test_softmax_errors_name_the_problem);
    LT_RUN(test_softmax_allocating_form_leaks_nothing_when_allocation_fails);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
