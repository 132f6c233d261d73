/* Tests for lm_cross_entropy_out against a float64 re-derivation and PyTorch fixtures
 * (F.cross_entropy with ignore_index = -100): random N/V with ignored rows, custom
 * ignore indices, i32/i64 targets, transposed logits and strided targets, all three
 * float dtypes, large logits, the all-ignored NaN rule, and every error path with its
 * exact status (an out-of-range target names its row and value and leaves out alone).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};

/* Mean of log(sum_j exp(x[r, j])) - x[r, t[r]] over rows with t[r] != ignore, in
 * double and without a max shift (inputs here are small); NaN when no row counts. */
static double cross_entropy_f64(const double *x, const double *t, int64_t N, int64_t V, int64_t ignore) {
    double total = 0;
    int64_t counted = 0;
    for (int64_t r = 0; r < N; r++) {
        if ((int64_t)t[r] == ignore) continue;
        double z = 0;
        for (int64_t j = 0; j < V; j++) z += exp(x[r * V + j]);
        total += log(z) - x[r * V + (int64_t)t[r]];
        counted++;
    }
    return counted ? total / (double)counted : NAN;
}

static float run_ce(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore) {
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 0, NULL);
    LT_CHECK_OK(lm_cross_entropy_out(g_ctx, logits, targets, ignore, lm_tensor_as_view(o)));
    float v = *(const float *)lm_tensor_data(o);
    lm_tensor_destroy(o);
    return v;
}

static void test_cross_entropy_matches_f64_with_ignored_rows_and_strided_views(void) {
    lt_rng r = lt_rng_seed(41);
    for (int trial = 0; trial < 60; trial++) {
        lm_dtype dt = k_floats[trial % 3], tdt = trial % 2 ? LM_I32 : LM_I64;
        int64_t N = lt_rng_int(&r, 0, 8), V = lt_rng_int(&r, 1, 12);
        int64_t ignore = lt_rng_int(&r, 0, 1) ? -100 : lt_rng_int(&r, 0, V - 1); /* an in-range ignore index too */
        /* logits: contiguous [N, V] or the transpose of a [V, N] buffer */
        int transposed = (int)lt_rng_int(&r, 0, 1);
        int64_t ls[2] = {transposed ? V : N, transposed ? N : V};
        lm_tensor *lt = lt_random_tensor(&r, dt, 2, ls, 2.0);
        lm_tensor_view logits = *lm_tensor_as_view(lt);
        if (transposed) LT_CHECK_OK(lm_tensor_view_transpose(&logits, 0, 1, &logits));
        /* targets: every other element of a [2N] buffer */
        int64_t ts[1] = {2 * N};
        lm_tensor *tt = NULL;
        LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), tdt, 1, ts, &tt));
        lm_tensor_view targets;
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(tt), 0, 0, 2 * N, 2, &targets));
        for (int64_t i = 0; i < N; i++) {
            int64_t t = lt_rng_int(&r, 0, 3) == 0 ? ignore : lt_rng_int(&r, 0, V - 1);
            if (tdt == LM_I32) ((int32_t *)lm_tensor_data(tt))[2 * i] = (int32_t)t;
            else ((int64_t *)lm_tensor_data(tt))[2 * i] = t;
        }
        double *x = lt_view_to_f64(&logits), *t = lt_view_to_f64(&targets);
        double want = cross_entropy_f64(x, t, N, V, ignore), got = run_ce(&logits, &targets, ignore);
        if (isnan(want)) {
            LT_CHECK_MSG(isnan(got), "trial %d: all rows ignored but loss is %g", trial, got);
        } else {
            /* the mean is computed in double and rounded once to f32 (relative 2^-24); a
             * relative metric is meaningless for V = 1, where the loss is exactly 0 */
            LT_CHECK_MSG(fabs(got - want) <= 1e-6 * (1 + fabs(want)), "trial %d (%s): loss %.9g, want %.9g", trial,
                         lm_dtype_name(dt), got, want);
        }
        free(x), free(t);
        lm_tensor_destroy(lt), lm_tensor_destroy(tt);
    }
}

static void test_cross_entropy_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/matmul_attention.lmfx", &fx)) return;
    /* f32 logits are exact; bf16/f16 round logits of size up to ~9 by 2^-9 / 2^-12
     * relative (up to ~0.02 / ~0.002 each), which mostly averages out over rows:
     * measured |error| 4e-3 / 5e-4 on a loss of ~4. */
    static const double nmse[] = {1e-12, 1e-5, 2e-7}, abs_tol[] = {1e-5, 0.02, 3e-3};
    int64_t ignore = lt_fixture_get(&fx, "ce_ignore")->i64[0];
    for (int i = 0; i < 3; i++) {
        lm_tensor *x = lt_fixture_tensor_to(lt_fixture_get(&fx, "ce_logits"), k_floats[i]);
        lm_tensor *t = lt_fixture_tensor_to(lt_fixture_get(&fx, "ce_targets"), i == 1 ? LM_I32 : LM_I64);
        double got = run_ce(lm_tensor_as_view(x), lm_tensor_as_view(t), ignore);
        lt_check_close("torch cross_entropy", &got, lt_fixture_get(&fx, "ce_out")->f64, 1, nmse[i], abs_tol[i]);
        lm_tensor *ta = lt_fixture_tensor_to(lt_fixture_get(&fx, "ce_all_ignored_targets"), LM_I64);
        LT_CHECK(isnan(lt_fixture_get(&fx, "ce_all_ignored_out")->f64[0]));
        LT_CHECK(isnan(run_ce(lm_tensor_as_view(x), lm_tensor_as_view(ta), ignore)));
        lm_tensor_destroy(x), lm_tensor_destroy(t), lm_tensor_destroy(ta);
    }
    lt_fixture_free(&fx);
}

static void test_cross_entropy_large_logits_and_empty_batch(void) {
    float x[6] = {1e4f, 0.0f, -1e4f, 5e4f, 5e4f, 5e4f};
    int64_t t[2] = {1, 2}, s[2] = {2, 3}, n2[1] = {2};
    lm_tensor *lx = NULL, *lt = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, s, x, &lx));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, n2, t, &lt));
    /* row 0: logsumexp = 1e4 (exp(-1e4) vanishes), loss 1e4; row 1: log(3) */
    double got = run_ce(lm_tensor_as_view(lx), lm_tensor_as_view(lt), -100), want = (1e4 + log(3.0)) / 2;
    lt_check_close("large logits", &got, &want, 1, 1e-12, 1e-3);
    lm_tensor_destroy(lx), lm_tensor_destroy(lt);
    /* N = 0: nothing counted, 0/0 */
    int64_t s0[2] = {0, 5}, n0[1] = {0};
    lm_tensor *ex = lt_poisoned_tensor(LM_BF16, 2, s0), *et = lt_poisoned_tensor(LM_I32, 1, n0);
    LT_CHECK(isnan(run_ce(lm_tensor_as_view(ex), lm_tensor_as_view(et), -100)));
    lm_tensor_destroy(ex), lm_tensor_destroy(et);
}

static void test_cross_entropy_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(42);
    int64_t s[2] = {4, 11}, n4[1] = {4}, n3[1] = {3}, one[1] = {1};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *o = NULL, *ob = lt_poisoned_tensor(LM_BF16, 0, NULL);
    lm_tensor *o1 = lt_poisoned_tensor(LM_F32, 1, one), *tf = lt_random_tensor(&r, LM_F32, 1, n4, 1);
    lm_tensor *xi = lt_random_tensor(&r, LM_I32, 2, s, 1), *x1 = lt_random_tensor(&r, LM_F32, 1, n4, 1);
    lm_tensor *t = NULL, *t3 = NULL, *tok = NULL;
    int64_t tv[4] = {0, 11, 3, -100}, tv3[3] = {0, 1, 2};
    int32_t tvok[4] = {0, 10, -100, 3};
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, n4, tv, &t));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, n4, tvok, &tok));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, n3, tv3, &t3));
    float sentinel = 123.0f;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 0, NULL, &sentinel, &o));
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vt = lm_tensor_as_view(t), *vo = lm_tensor_as_view(o);
    /* target 11 with V = 11 names row 1 and the value; out stays untouched */
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, vt, -100, vo), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "targets[1]") && strstr(lm_last_error(), "= 11"));
    LT_CHECK(*(const float *)lm_tensor_data(o) == 123.0f);
    /* ignoring 11 instead leaves -100 as an out-of-range (negative) target in row 3 */
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, vt, 11, vo), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "targets[3]") && strstr(lm_last_error(), "= -100"));
    /* out must be an f32 scalar */
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, lm_tensor_as_view(tok), -100, lm_tensor_as_view(ob)),
                    LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, vt, -100, lm_tensor_as_view(o1)), LM_SHAPE_MISMATCH);
    /* operand dtypes and shapes */
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, lm_tensor_as_view(tf), -100, vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, lm_tensor_as_view(xi), vt, -100, vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, lm_tensor_as_view(t3), -100, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "targets") != NULL);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, lm_tensor_as_view(x1), vt, -100, vo), LM_SHAPE_MISMATCH);
    /* NULLs, devices, out inside the logits */
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, NULL, vt, -100, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, vt, -100, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vt;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, &dev, -100, vo), LM_INVALID_ARGUMENT);
    lm_tensor_view inside;
    LT_CHECK_OK(lm_tensor_view_init(&inside, lm_tensor_data(x), LM_F32, lm_device_cpu(), 0, NULL, NULL));
    LT_CHECK_STATUS(lm_cross_entropy_out(g_ctx, vx, lm_tensor_as_view(tok), -100, &inside), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_cross_entropy_out(g_ctx, vx, lm_tensor_as_view(tok), -100, vo));
    lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(ob), lm_tensor_destroy(o1), lm_tensor_destroy(tf);
    lm_tensor_destroy(xi), lm_tensor_destroy(x1), lm_tensor_destroy(t), lm_tensor_destroy(t3);
    lm_tensor_destroy(tok);
}

static void test_cross_entropy_allocates_nothing(void) {
    lt_rng r = lt_rng_seed(43);
    int64_t s[2] = {3, 5}, n3[1] = {3}, tv[3] = {4, -100, 0};
    lm_tensor *x = lt_random_tensor(&r, LM_F16, 2, s, 1), *t = NULL, *o = lt_poisoned_tensor(LM_F32, 0, NULL);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, n3, tv, &t));
    lt_alloc_track(1); /* any allocation would fail */
    LT_CHECK_OK(lm_cross_entropy_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(t), -100, lm_tensor_as_view(o)));
    LT_CHECK(lt_alloc_count() == 0 && lt_alloc_live() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(x), lm_tensor_destroy(t), lm_tensor_destroy(o);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_cross_entropy_matches_f64_with_ignored_rows_and_strided_views);
    LT_RUN(test_cross_entropy_matches_torch_fixture);
    LT_RUN(test_cross_entropy_large_logits_and_empty_batch);
    LT_RUN(test_cross_entropy_errors_name_the_problem);
    LT_RUN(test_cross_entropy_allocates_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
