/* Tests for rmsnorm and add_rmsnorm: PyTorch float64 fixtures (tests/data/ops/
 * norm_rope.lmfx, from scripts/gen_fixtures_norm_rope.py) in all three float dtypes,
 * float64 re-derivations on random shapes with size-1 / zero-size dims and
 * transposed or strided views, the rounded-sum semantics of add_rmsnorm, the allowed
 * in-place forms, and every error path with its exact status.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
static const char *k_fixture = "tests/data/ops/norm_rope.lmfx";

/* Against a re-derivation from the stored inputs only the final rounding to the dtype
 * differs: relative error <= 2^-24 / 2^-9 / 2^-12, so NMSE ~1e-15 / 1e-6 / 1e-7. */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
/* Against float64 fixtures the inputs are rounded too (x, weight, and for
 * add_rmsnorm the stored sum): about three roundings. */
/* outputs reach |x / rms * w| ~ 10; max-abs of a few units in the last place */
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.1 : 0.01; }
static double fx_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 1e-4 : 3e-6; }
static double fx_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.15 : 0.02; }

/* A random tensor stored with its dims reversed; *v is the permuted view of it with
 * logical shape `shape`, so no stride is row-major when ndim >= 2. */
static lm_tensor *random_reversed(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, double scale,
                                  lm_tensor_view *v) {
    int64_t rs[LM_MAX_DIMS];
    int perm[LM_MAX_DIMS];
    for (int i = 0; i < nd; i++) rs[i] = shape[nd - 1 - i], perm[i] = nd - 1 - i;
    lm_tensor *t = lt_random_tensor(r, dt, nd, rs, scale);
    LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(t), perm, v));
    return t;
}

/* A NaN-poisoned tensor whose last dim is twice as long; *v takes every second
 * element, a strided output view of logical shape `shape`. */
static lm_tensor *poisoned_strided(lm_dtype dt, int nd, const int64_t *shape, lm_tensor_view *v) {
    int64_t s[LM_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
    s[nd - 1] *= 2;
    lm_tensor *t = lt_poisoned_tensor(dt, nd, s);
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(t), nd - 1, 0, s[nd - 1], 2, v));
    return t;
}

/* out[r, :] = x[r, :] / sqrt(mean(x[r, :]^2) + eps) * w, all in double. */
static void rmsnorm_f64(const double *x, const double *w, int64_t rows, int64_t d, double eps, double *out) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++) ss += x[r * d + i] * x[r * d + i];
        double inv = 1.0 / sqrt(ss / (double)d + eps);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = x[r * d + i] * inv * w[i];
    }
}

static double *fixture_values(const lt_fixture *fx, const char *name) { return lt_fixture_get(fx, name)->f64; }

static void test_rmsnorm_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load(k_fixture, &fx)) return;
    const char *cases[] = {"rmsnorm_a", "rmsnorm_b"};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 3; k++) {
            char name[64];
            lm_dtype dt = k_floats[k];
            snprintf(name, sizeof name, "%s.x", cases[c]);
            const lt_fixture_tensor *fxx = lt_fixture_get(&fx, name);
            lm_tensor *x = lt_fixture_tensor_to(fxx, dt);
            snprintf(name, sizeof name, "%s.weight", cases[c]);
            lm_tensor *w = lt_fixture_tensor_to(lt_fixture_get(&fx, name), dt);
            snprintf(name, sizeof name, "%s.eps", cases[c]);
            float eps = (float)fixture_values(&fx, name)[0];
            lm_tensor *o = NULL;
            LT_CHECK_OK(lm_rmsnorm(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), eps, &o));
            snprintf(name, sizeof name, "%s.out", cases[c]);
            double *got = lt_view_to_f64(lm_tensor_as_view(o));
            lt_check_close(name, got, fixture_values(&fx, name), fxx->numel, fx_nmse(dt), fx_abs(dt));
            free(got);
            lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(o);
        }
    lt_fixture_free(&fx);
}

static void test_add_rmsnorm_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load(k_fixture, &fx)) return;
    const lt_fixture_tensor *fxx = lt_fixture_get(&fx, "add_rmsnorm.x");
    float eps = (float)fixture_values(&fx, "add_rmsnorm.eps")[0];
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = k_floats[k];
        lm_tensor *x = lt_fixture_tensor_to(fxx, dt);
        lm_tensor *res = lt_fixture_tensor_to(lt_fixture_get(&fx, "add_rmsnorm.residual"), dt);
        lm_tensor *w = lt_fixture_tensor_to(lt_fixture_get(&fx, "add_rmsnorm.weight"), dt);
        lm_tensor *sum = lt_poisoned_tensor(dt, fxx->ndim, fxx->shape);
        lm_tensor *o = lt_poisoned_tensor(dt, fxx->ndim, fxx->shape);
        LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(res), lm_tensor_as_view(w), eps,
                                       lm_tensor_as_view(sum), lm_tensor_as_view(o)));
        double *gs = lt_view_to_f64(lm_tensor_as_view(sum)), *go = lt_view_to_f64(lm_tensor_as_view(o));
        const double *ws = fixture_values(&fx, "add_rmsnorm.sum"), *wo = fixture_values(&fx, "add_rmsnorm.out");
        lt_check_close("add_rmsnorm.sum", gs, ws, fxx->numel, fx_nmse(dt), fx_abs(dt));
        lt_check_close("add_rmsnorm.out", go, wo, fxx->numel, fx_nmse(dt), fx_abs(dt));
        free(gs), free(go);
        lm_tensor_destroy(x), lm_tensor_destroy(res), lm_tensor_destroy(w);
        lm_tensor_destroy(sum), lm_tensor_destroy(o);
    }
    lt_fixture_free(&fx);
}

static void test_rmsnorm_random_views_match_f64(void) {
    lt_rng r = lt_rng_seed(11);
    for (int trial = 0; trial < 45; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int nd = (int)lt_rng_int(&r, 1, 4);
        int64_t shape[LM_MAX_DIMS];
        for (int i = 0; i < nd; i++) shape[i] = lt_rng_int(&r, 1, 5);
        shape[nd - 1] = lt_rng_int(&r, 1, 40); /* D, sometimes 1 */
        int64_t d = shape[nd - 1], n = 1;
        for (int i = 0; i < nd; i++) n *= shape[i];
        lm_tensor_view xv, ov, wv;
        lm_tensor *x = random_reversed(&r, dt, nd, shape, 2.0, &xv);
        lm_tensor *o = poisoned_strided(dt, nd, shape, &ov);
        int64_t w2 = 2 * d;
        lm_tensor *w = lt_random_tensor(&r, dt, 1, &w2, 1.0); /* every second element: stride 2 */
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(w), 0, 1, w2, 2, &wv));
        float eps = trial % 2 ? 1e-6f : 1e-2f;
        LT_CHECK_OK(lm_rmsnorm_out(g_ctx, &xv, &wv, eps, &ov));
        double *xs = lt_view_to_f64(&xv), *ws = lt_view_to_f64(&wv), *got = lt_view_to_f64(&ov);
        double *want = malloc(sizeof(double) * (size_t)n);
        rmsnorm_f64(xs, ws, n / d, d, eps, want);
        lt_check_close("rmsnorm random", got, want, n, tol_nmse(dt), tol_abs(dt));
        free(xs), free(ws), free(got), free(want);
        lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(w);
    }
}

static void test_rmsnorm_zero_size_and_in_place(void) {
    lt_rng r = lt_rng_seed(12);
    int64_t s0[2] = {0, 4}, s1[2] = {3, 0}, w4 = 4, w0 = 0;
    lm_tensor *x0 = lt_poisoned_tensor(LM_F32, 2, s0), *o0 = lt_poisoned_tensor(LM_F32, 2, s0);
    lm_tensor *x1 = lt_poisoned_tensor(LM_F32, 2, s1), *o1 = lt_poisoned_tensor(LM_F32, 2, s1);
    lm_tensor *wa = lt_random_tensor(&r, LM_F32, 1, &w4, 1), *wb = lt_random_tensor(&r, LM_F32, 1, &w0, 1);
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, lm_tensor_as_view(x0), lm_tensor_as_view(wa), 1e-6f, lm_tensor_as_view(o0)));
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, lm_tensor_as_view(x1), lm_tensor_as_view(wb), 1e-6f, lm_tensor_as_view(o1)));
    lm_tensor_destroy(x0), lm_tensor_destroy(o0), lm_tensor_destroy(x1), lm_tensor_destroy(o1), lm_tensor_destroy(wb);
    /* out == x (the very same view) gives exactly the out-of-place result */
    for (int k = 0; k < 3; k++) {
        int64_t s[3] = {2, 3, 4};
        lm_tensor *x = lt_random_tensor(&r, k_floats[k], 3, s, 1.5), *ref = NULL;
        lm_tensor *w = lt_random_tensor(&r, k_floats[k], 1, &w4, 1);
        LT_CHECK_OK(lm_rmsnorm(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), 1e-5f, &ref));
        LT_CHECK_OK(lm_rmsnorm_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), 1e-5f, lm_tensor_as_view(x)));
        LT_CHECK(memcmp(lm_tensor_data(x), lm_tensor_data(ref), 24 * lm_dtype_size(k_floats[k])) == 0);
        lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(ref);
    }
    lm_tensor_destroy(wa);
}

/* Expected bits of add_rmsnorm for one bf16 row set, computed the way the operator
 * defines it: s = bf16(x + r), out = bf16(s * inv_rms(s) * w). With round_sum = 0 the
 * unrounded sum is normalized instead (what the operator must not do). */
static void add_rmsnorm_bf16_expect(const uint16_t *x, const uint16_t *res, const uint16_t *w, int64_t rows,
                                    int64_t d, float eps, int round_sum, uint16_t *sum, uint16_t *out) {
    for (int64_t r = 0; r < rows; r++) {
        double s[64], ss = 0;
        for (int64_t i = 0; i < d; i++) {
            double exact = (double)lm_bf16_to_f32(x[r * d + i]) + (double)lm_bf16_to_f32(res[r * d + i]);
            sum[r * d + i] = lm_f32_to_bf16((float)exact);
            s[i] = round_sum ? (double)lm_bf16_to_f32(sum[r * d + i]) : exact;
            ss += s[i] * s[i];
        }
        double inv = 1.0 / sqrt(ss / (double)d + (double)eps);
        for (int64_t i = 0; i < d; i++) out[r * d + i] = lm_f32_to_bf16((float)(s[i] * inv * lm_bf16_to_f32(w[i])));
    }
}

static void test_add_rmsnorm_normalizes_the_rounded_sum(void) {
    lt_rng r = lt_rng_seed(13);
    int64_t s[2] = {64, 48}, d = 48, n = 64 * 48;
    lm_tensor *x = lt_random_tensor(&r, LM_BF16, 2, s, 1.0), *res = lt_random_tensor(&r, LM_BF16, 2, s, 8.0);
    lm_tensor *w = lt_random_tensor(&r, LM_BF16, 1, &d, 1.0);
    lm_tensor *sum = lt_poisoned_tensor(LM_BF16, 2, s), *o = lt_poisoned_tensor(LM_BF16, 2, s);
    LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(res), lm_tensor_as_view(w), 1e-6f,
                                   lm_tensor_as_view(sum), lm_tensor_as_view(o)));
    uint16_t *es = malloc(sizeof(uint16_t) * (size_t)n), *eo = malloc(sizeof(uint16_t) * (size_t)n);
    uint16_t *uo = malloc(sizeof(uint16_t) * (size_t)n);
    add_rmsnorm_bf16_expect(lm_tensor_data(x), lm_tensor_data(res), lm_tensor_data(w), 64, d, 1e-6f, 1, es, eo);
    LT_CHECK(memcmp(es, lm_tensor_data(sum), sizeof(uint16_t) * (size_t)n) == 0);
    LT_CHECK(memcmp(eo, lm_tensor_data(o), sizeof(uint16_t) * (size_t)n) == 0);
    /* the check above is sensitive: normalizing the unrounded sum changes some bits */
    add_rmsnorm_bf16_expect(lm_tensor_data(x), lm_tensor_data(res), lm_tensor_data(w), 64, d, 1e-6f, 0, es, uo);
    LT_CHECK(memcmp(uo, eo, sizeof(uint16_t) * (size_t)n) != 0);
    free(es), free(eo), free(uo);
    lm_tensor_destroy(x), lm_tensor_destroy(res), lm_tensor_destroy(w), lm_tensor_destroy(sum), lm_tensor_destroy(o);
}

static void test_add_rmsnorm_in_place_residual_and_views(void) {
    lt_rng r = lt_rng_seed(14);
    for (int trial = 0; trial < 18; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int64_t s[3] = {lt_rng_int(&r, 1, 3), lt_rng_int(&r, 1, 4), lt_rng_int(&r, 1, 33)}, d = s[2];
        int64_t n = s[0] * s[1] * s[2];
        size_t bytes = (size_t)n * lm_dtype_size(dt);
        lm_tensor_view xv;
        lm_tensor *x = random_reversed(&r, dt, 3, s, 1.0, &xv), *res = lt_random_tensor(&r, dt, 3, s, 3.0);
        lm_tensor *w = lt_random_tensor(&r, dt, 1, &d, 1.0);
        lm_tensor *sum = lt_poisoned_tensor(dt, 3, s), *o1 = lt_poisoned_tensor(dt, 3, s);
        lm_tensor *o2 = lt_poisoned_tensor(dt, 3, s);
        const lm_tensor_view *vr = lm_tensor_as_view(res), *vw = lm_tensor_as_view(w);
        LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, &xv, vr, vw, 1e-6f, lm_tensor_as_view(sum), lm_tensor_as_view(o1)));
        /* f64 re-derivation from the stored sum */
        double *xs = lt_view_to_f64(&xv), *rs = lt_view_to_f64(vr), *ss = lt_view_to_f64(lm_tensor_as_view(sum));
        double *ws = lt_view_to_f64(vw), *got = lt_view_to_f64(lm_tensor_as_view(o1));
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) want[i] = xs[i] + rs[i];
        lt_check_close("add_rmsnorm sum", ss, want, n, tol_nmse(dt), tol_abs(dt));
        rmsnorm_f64(ss, ws, n / d, d, 1e-6, want);
        lt_check_close("add_rmsnorm out", got, want, n, tol_nmse(dt), tol_abs(dt));
        /* in place: sum_out is residual's own view; same bits as out of place */
        LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, &xv, vr, vw, 1e-6f, vr, lm_tensor_as_view(o2)));
        LT_CHECK(memcmp(lm_tensor_data(res), lm_tensor_data(sum), bytes) == 0);
        LT_CHECK(memcmp(lm_tensor_data(o1), lm_tensor_data(o2), bytes) == 0);
        free(xs), free(rs), free(ss), free(ws), free(got), free(want);
        lm_tensor_destroy(x), lm_tensor_destroy(res), lm_tensor_destroy(w), lm_tensor_destroy(sum);
        lm_tensor_destroy(o1), lm_tensor_destroy(o2);
    }
}

static void test_norm_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(15);
    int64_t s[2] = {4, 4}, s5[2] = {5, 4}, d = 4, d3 = 3;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *w = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    lm_tensor *w3 = lt_random_tensor(&r, LM_F32, 1, &d3, 1), *wh = lt_random_tensor(&r, LM_F16, 1, &d, 1);
    lm_tensor *xi = lt_random_tensor(&r, LM_I32, 2, s, 1), *o = lt_poisoned_tensor(LM_F32, 2, s);
    lm_tensor *sum = lt_poisoned_tensor(LM_F32, 2, s), *big = lt_random_tensor(&r, LM_F32, 2, s5, 1);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vw = lm_tensor_as_view(w), *vo = lm_tensor_as_view(o);
    const lm_tensor_view *vs = lm_tensor_as_view(sum);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, NULL, vw, 1e-6f, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, vw, 1e-6f, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, lm_tensor_as_view(w3), 1e-6f, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "weight") && strstr(lm_last_error(), "[3]"));
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, lm_tensor_as_view(wh), 1e-6f, vo), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, lm_tensor_as_view(xi), vw, 1e-6f, vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, vw, -1.0f, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, vw, NAN, vo), LM_INVALID_ARGUMENT);
    lm_tensor_view sc, t, bcast, rows;
    LT_CHECK_OK(lm_tensor_view_select(vw, 0, 0, &sc)); /* a scalar x has no last dim */
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, &sc, vw, 1e-6f, &sc), LM_SHAPE_MISMATCH);
    LT_CHECK_OK(lm_tensor_view_expand(vw, 2, s, &bcast)); /* a stride-0 output */
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, vw, 1e-6f, &bcast), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_tensor_view_transpose(vx, 0, 1, &t)); /* same memory as x, other layout */
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, vx, vw, 1e-6f, &t), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "overlaps"));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(big), 0, 1, 5, 1, &rows)); /* rows 1..4 vs rows 0..3 */
    lm_tensor_view rows0;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(big), 0, 0, 4, 1, &rows0));
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, &rows0, vw, 1e-6f, &rows), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vx;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, &dev, vw, 1e-6f, vo), LM_INVALID_ARGUMENT);
    /* add_rmsnorm: only sum_out may be an input's own view */
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, vx, vw, 1e-6f, vs, vs), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, lm_tensor_as_view(sum), vw, 1e-6f, vs, vx), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, vo, vw, 1e-6f, vs, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, vx, vw, 1e-6f, &t, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, vx, vw, 1e-6f, vw, vo), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, lm_tensor_as_view(big), vw, 1e-6f, vs, vo), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, lm_tensor_as_view(xi), vw, 1e-6f, vs, vo), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_add_rmsnorm_out(g_ctx, vx, vx, vw, 1e-6f, NULL, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, vx, vx, vw, 1e-6f, vx, vo)); /* sum_out may also be x's view */
    /* a forced tuned level rejects what it cannot take: here a non-unit-stride last dim */
    lm_ctx_set_impl(g_ctx, LM_IMPL_TUNED);
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, &t, vw, 1e-6f, vo), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    lm_tensor *a = NULL;
    LT_CHECK_STATUS(lm_rmsnorm(g_ctx, vx, lm_tensor_as_view(w3), 1e-6f, &a), LM_SHAPE_MISMATCH);
    LT_CHECK(a == NULL);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(w3), lm_tensor_destroy(wh), lm_tensor_destroy(xi);
    lm_tensor_destroy(o), lm_tensor_destroy(sum), lm_tensor_destroy(big);
}

static void test_rmsnorm_allocation_failure_leaks_nothing(void) {
    lt_rng r = lt_rng_seed(16);
    int64_t s[2] = {3, 8}, d = 8;
    lm_tensor *x = lt_random_tensor(&r, LM_BF16, 2, s, 1), *w = lt_random_tensor(&r, LM_BF16, 1, &d, 1);
    for (int k = 1; k <= 3; k++) {
        lm_tensor *o = NULL;
        lt_alloc_track(k);
        lm_status st = lm_rmsnorm(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(w), 1e-6f, &o);
        if (k <= lt_alloc_count()) {
            LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
            LT_CHECK(o == NULL);
        }
        lm_tensor_destroy(o);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor_destroy(x), lm_tensor_destroy(w);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_rmsnorm_matches_torch_fixture);
    LT_RUN(test_add_rmsnorm_matches_torch_fixture);
    LT_RUN(test_rmsnorm_random_views_match_f64);
    LT_RUN(test_rmsnorm_zero_size_and_in_place);
    LT_RUN(test_add_rmsnorm_normalizes_the_rounded_sum);
    LT_RUN(test_add_rmsnorm_in_place_residual_and_views);
    LT_RUN(test_norm_errors_name_the_problem);
    LT_RUN(test_rmsnorm_allocation_failure_leaks_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
