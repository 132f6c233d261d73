/* int8 weights: lm_quantize_int8_rows against a direct computation (ties, all-zero
 * rows, extreme and subnormal values, strided views, refusals), and lm_linear_out
 * with i8 weights and f32 row scales on the CPU: the tuned level (every ISA path this
 * CPU runs, 1 and 2 threads bit-identical) against the reference level on fresh
 * random inputs, for M from 1 to 200 (gemv and GEMM), K and N odd and aligned, every
 * input form, bias or not, accumulate or not, strided x and out rows, NaN-poisoned
 * outputs whose padding must stay untouched; the int8 product against the float
 * product of the dequantized weights; argument errors and the CUDA refusal.
 *
 * Gate (tuned vs the double reference, outputs O(1)): NMSE <= 1e-10 and max-abs
 * <= 2e-4. The tuned path differs only by f32 rounding: the f32 dot product (K
 * terms), the f32 RMSNorm/SwiGLU prologue and, in the GEMM, q * scale rounded once
 * to f32 when packed. Observed: NMSE ~1e-14 typically; the worst, 5.9e-11, is a single
 * output (M = N = 1, K = 7) whose dot product cancels; max-abs 6e-6.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ref, *g_one, *g_two; /* reference level; tuned level with 1 and 2 threads */

#include "linear_quant_util.h"

/* ---- quantization ------------------------------------------------------------------ */

/* Quantizes the view w (any dtype, any strides) into fresh q [N, K] and scales [N]
 * and checks both against the direct computation. Returns the number of mismatches. */
static int64_t quantize_and_check(const char *what, const lm_tensor_view *w, const lm_tensor_view *q,
                                  const lm_tensor_view *sc) {
    LT_CHECK_OK(lm_quantize_int8_rows(g_one, w, q, sc));
    int64_t N = w->shape[0], K = w->shape[1], bad = 0;
    double *w64 = lt_view_to_f64(w), *q64 = lt_view_to_f64(q), *s64 = lt_view_to_f64(sc);
    for (int64_t n = 0; n < N; n++) {
        float s = direct_scale(w64 + n * K, K, 127);
        if ((float)s64[n] != s && bad++ < 3)
            LT_CHECK_MSG(0, "%s: scale of row %lld is %.9g, want %.9g", what, (long long)n, s64[n], (double)s);
        for (int64_t k = 0; k < K; k++) {
            int want = direct_q(w64[n * K + k], s, 127);
            if (q64[n * K + k] != want && bad++ < 3)
                LT_CHECK_MSG(0, "%s: q[%lld, %lld] = %g for w %.9g / scale %.9g, want %d", what, (long long)n,
                             (long long)k, q64[n * K + k], w64[n * K + k], (double)s, want);
        }
    }
    free(w64), free(q64), free(s64);
    return bad;
}

static lm_tensor *from_f32(int64_t N, int64_t K, const float *v, lm_dtype dt) {
    int64_t sh[2] = {N, K};
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), dt, 2, sh, &t));
    for (int64_t i = 0; i < N * K; i++) {
        if (dt == LM_F32) ((float *)lm_tensor_data(t))[i] = v[i];
        else if (dt == LM_BF16) ((uint16_t *)lm_tensor_data(t))[i] = lm_f32_to_bf16(v[i]);
        else ((uint16_t *)lm_tensor_data(t))[i] = lm_f32_to_f16(v[i]);
    }
    return t;
}

/* Hand-made rows with known answers: ties at scale 1 and 2, an all-zero row (with a
 * negative zero), and the extremes. */
static void test_quantize_known_rows(void) {
    enum { K = 10 };
    static const float rows[5][K] = {
        {127, 0.5f, 1.5f, 2.5f, -0.5f, -1.5f, -2.5f, 3.25f, -126.5f, 126.5f}, /* scale 1 */
        {254, 1, 3, 5, -3, 0.99f, -1, 7, -9, 251},                           /* scale 2: halves of odd values */
        {0, -0.0f, 0, 0, 0, 0, 0, 0, 0, 0},                                   /* all zero: scale 1 */
        {FLT_MAX, -FLT_MAX, FLT_MAX / 254, 1, -1, 0, 0, 0, 0, 0},             /* the largest f32 */
        {1e-44f, -7e-45f, 1.4e-45f, 0, 0, 0, 0, 0, 0, 0},                     /* subnormal: scale underflows */
    };
    static const int want_q[3][K] = {
        {127, 0, 2, 2, 0, -2, -2, 3, -126, 126},
        {127, 0, 2, 2, -2, 0, 0, 4, -4, 126},
        {0},
    };
    static const float want_s[3] = {1, 2, 1};
    lm_tensor *w = from_f32(5, K, &rows[0][0], LM_F32);
    int64_t qs[2] = {5, K}, ss[1] = {5};
    lm_tensor *q = lt_poisoned_tensor(LM_I8, 2, qs), *sc = lt_poisoned_tensor(LM_F32, 1, ss);
    LT_CHECK(quantize_and_check("known rows", V(w), V(q), V(sc)) == 0);
    const int8_t *qd = lm_tensor_data(q);
    const float *sd = lm_tensor_data(sc);
    for (int n = 0; n < 3; n++) {
        LT_CHECK_MSG(sd[n] == want_s[n], "row %d: scale %g, want %g", n, (double)sd[n], (double)want_s[n]);
        for (int k = 0; k < K; k++)
            LT_CHECK_MSG(qd[n * K + k] == want_q[n][k], "row %d col %d: q %d, want %d", n, k, qd[n * K + k],
                         want_q[n][k]);
    }
    LT_CHECK(qd[3 * K] == 127 && qd[3 * K + 1] == -127 && qd[3 * K + 3] == 0 && qd[3 * K + 4] == 0);
    LT_CHECK(sd[3] == FLT_MAX / 127.0f && isfinite(sd[3]));
    LT_CHECK(sd[4] > 0 && isfinite(sd[4])); /* amax / 127 underflowed: the smallest positive f32 */
    for (int k = 0; k < 3; k++) /* still the nearest representable: |w - q * s| <= s / 2 */
        LT_CHECK(fabs((double)rows[4][k] - qd[4 * K + k] * (double)sd[4]) <= 0.5 * sd[4]);
    lm_tensor_destroy(w), lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

/* Random rows in every float dtype, contiguous and as strided views (w transposed,
 * q and scales every other element), against the direct computation. */
static void test_quantize_random_rows_any_dtype_and_strides(void) {
    lt_rng r = lt_rng_seed(81);
    static const lm_dtype dts[3] = {LM_F32, LM_BF16, LM_F16};
    const int64_t N = 37, K = 53;
    for (int d = 0; d < 3; d++) {
        int64_t ws[2] = {N, K}, wts[2] = {K, N}, qs[2] = {N, 2 * K}, ss[1] = {2 * N};
        lm_tensor *w = lt_random_tensor(&r, dts[d], 2, ws, 3.0), *wt = lt_random_tensor(&r, dts[d], 2, wts, 0.01);
        /* a few exact ties: w = (c + 1/2) * scale in the first row, whose max is 127 */
        if (dts[d] == LM_F32) {
            float *p = lm_tensor_data(w);
            p[0] = 127.0f, p[1] = 10.5f, p[2] = -11.5f, p[3] = 0.5f;
        }
        lm_tensor *q = lt_poisoned_tensor(LM_I8, 2, ws), *sc = lt_poisoned_tensor(LM_F32, 1, ws);
        char what[64];
        snprintf(what, sizeof what, "random %s", lm_dtype_name(dts[d]));
        LT_CHECK(quantize_and_check(what, V(w), V(q), V(sc)) == 0);
        /* strided: w^T of a [K, N] tensor, q [N, K] over every other column, scales every other */
        lm_tensor *q2 = lt_poisoned_tensor(LM_I8, 2, qs), *s2 = lt_poisoned_tensor(LM_F32, 1, ss);
        lm_tensor_view wv, qv, sv;
        LT_CHECK_OK(lm_tensor_view_transpose(V(wt), 0, 1, &wv));
        LT_CHECK_OK(lm_tensor_view_slice(V(q2), 1, 0, 2 * K, 2, &qv));
        LT_CHECK_OK(lm_tensor_view_slice(V(s2), 0, 0, 2 * N, 2, &sv));
        snprintf(what, sizeof what, "strided %s", lm_dtype_name(dts[d]));
        LT_CHECK(quantize_and_check(what, &wv, &qv, &sv) == 0);
        const uint8_t *q2d = lm_tensor_data(q2);
        const float *s2d = lm_tensor_data(s2);
        int untouched = 1;
        for (int64_t i = 0; i < N * 2 * K; i += 2) untouched &= q2d[i + 1] == 0xA5;
        for (int64_t i = 0; i < 2 * N; i += 2) untouched &= isnan(s2d[i + 1]);
        LT_CHECK_MSG(untouched, "%s: elements between the strided ones were written", what);
        lm_tensor *all[] = {w, wt, q, sc, q2, s2};
        for (int i = 0; i < 6; i++) lm_tensor_destroy(all[i]);
    }
}

static void test_quantize_refusals(void) {
    lt_rng r = lt_rng_seed(82);
    int64_t ws[2] = {4, 6}, ss[1] = {4}, bad_q[2] = {4, 7}, bad_s[1] = {5}, w3[3] = {1, 4, 6};
    lm_tensor *w = lt_random_tensor(&r, LM_F32, 2, ws, 1.0), *q = lt_poisoned_tensor(LM_I8, 2, ws);
    lm_tensor *sc = lt_poisoned_tensor(LM_F32, 1, ss);
    /* NaN and Inf are refused naming the row; nothing is written */
    float *wd = lm_tensor_data(w);
    wd[2 * 6 + 3] = NAN;
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "row 2") != NULL);
    wd[2 * 6 + 3] = 1.0f, wd[3 * 6] = -INFINITY;
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "row 3") != NULL);
    int untouched = 1;
    for (int i = 0; i < 24; i++) untouched &= ((uint8_t *)lm_tensor_data(q))[i] == 0xA5;
    for (int i = 0; i < 4; i++) untouched &= isnan(((float *)lm_tensor_data(sc))[i]);
    LT_CHECK_MSG(untouched, "a refused quantization wrote its outputs");
    wd[3 * 6] = 0.0f;
    /* dtypes */
    lm_tensor *wi = lt_poisoned_tensor(LM_I32, 2, ws), *qu = lt_poisoned_tensor(LM_U8, 2, ws);
    lm_tensor *sb = lt_poisoned_tensor(LM_BF16, 1, ss);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(wi), V(q), V(sc)), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(qu), V(sc)), LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "q") != NULL);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(q), V(sb)), LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    /* shapes */
    lm_tensor *qb = lt_poisoned_tensor(LM_I8, 2, bad_q), *sbad = lt_poisoned_tensor(LM_F32, 1, bad_s);
    lm_tensor *w3t = lt_random_tensor(&r, LM_F32, 3, w3, 1.0);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(qb), V(sc)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(q), V(sbad)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w3t), V(q), V(sc)), LM_SHAPE_MISMATCH);
    /* outputs that overlap themselves, NULLs, another device */
    lm_tensor_view qbc = *V(q);
    qbc.stride[0] = 0;
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), &qbc, V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, NULL, V(q), V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, V(w), V(q), NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_quantize_int8_rows(NULL, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    lm_tensor_view wg = *V(w);
    wg.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_one, &wg, V(q), V(sc)), LM_INVALID_ARGUMENT);
    lm_tensor *all[] = {w, q, sc, wi, qu, sb, qb, sbad, w3t};
    for (int i = 0; i < 9; i++) lm_tensor_destroy(all[i]);
}

/* ---- lm_linear_out with int8 weights ------------------------------------------------- */

/* Random int8 weights [N, K] (all of [-127, 127]) and scales ~ 1 / (127 sqrt(K)) so
 * products stay O(1). */
static void random_int8(lt_rng *r, int64_t N, int64_t K, lm_tensor **q, lm_tensor **sc) {
    int64_t qs[2] = {N, K}, ss[1] = {N};
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I8, 2, qs, q));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, ss, sc));
    int8_t *qd = lm_tensor_data(*q);
    float *sd = lm_tensor_data(*sc);
    for (int64_t i = 0; i < N * K; i++) qd[i] = (int8_t)lt_rng_int(r, -127, 127);
    for (int64_t n = 0; n < N; n++) sd[n] = (float)((0.5 + lt_rng_uniform(r)) / (127.0 * sqrt((double)K) * 0.6));
}

/* One (M, K, N) with random int8 weights (the shared loop of linear_quant_util.h). */
static void run_case(lt_rng *r, int64_t M, int64_t K, int64_t N, int64_t pad) {
    lm_tensor *q, *sc;
    random_int8(r, N, K, &q, &sc);
    lm_linear_params fmt = {.w_scales = V(sc)};
    run_quant_case(r, "int8", M, K, N, pad, q, &fmt);
    lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

static void test_linear_int8_tuned_matches_reference(void) {
    lt_rng r = lt_rng_seed(83);
    static const int64_t Ms[] = {1, 2, 5, 8, 17, 64, 200};
    /* (K, N): every K and N of {1, 7, 31, 64, 100, 896}, odd and aligned, both ways round */
    static const int64_t KN[][2] = {{1, 7}, {7, 1}, {31, 64}, {64, 31}, {100, 7}, {7, 100}, {896, 31},
                                    {31, 896}, {64, 100}, {1, 1}, {896, 64}};
    memset(&g_res, 0, sizeof g_res);
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
        for (size_t s = 0; s < sizeof KN / sizeof KN[0]; s++) {
            if (Ms[m] == 200 && KN[s][0] * KN[s][1] > 896 * 31) continue; /* keeps the double reference quick */
            run_case(&r, Ms[m], KN[s][0], KN[s][1], (int64_t)(s % 3) * 3);
        }
    run_case(&r, 1, 896, 896, 5); /* one square decode GEMV */
    run_case(&r, 3, 896, 896, 0);
    printf("  int8 linear: %lld tuned runs, %lld failed; worst NMSE %.3g, worst max-abs %.3g\n", (long long)g_res.runs,
           (long long)g_res.fails, g_res.worst_nmse, g_res.worst_abs);
}

/* The int8 product equals the float product of its dequantized weights (q * scale
 * rounded to f32) through lm_matmul_out's tuned f32 GEMM, within f32 rounding. */
static void test_int8_equals_dequantized_float_product(void) {
    lt_rng r = lt_rng_seed(84);
    static const int64_t Ms[3] = {1, 7, 64};
    for (int i = 0; i < 3; i++) {
        int64_t M = Ms[i], K = 300, N = 130, xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N};
        lm_tensor *q, *sc;
        random_int8(&r, N, K, &q, &sc);
        lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *wf = NULL;
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 2, ws, &wf));
        const int8_t *qd = lm_tensor_data(q);
        const float *sd = lm_tensor_data(sc);
        for (int64_t n = 0; n < N; n++)
            for (int64_t k = 0; k < K; k++) ((float *)lm_tensor_data(wf))[n * K + k] = (float)qd[n * K + k] * sd[n];
        lm_tensor *a = lt_poisoned_tensor(LM_F32, 2, os), *b = lt_poisoned_tensor(LM_F32, 2, os);
        lm_linear_params p = {.input = LM_LINEAR_IN, .w_scales = V(sc)};
        LT_CHECK_OK(lm_linear_out(g_two, V(x), V(q), NULL, &p, V(a)));
        lm_tensor_view wt;
        LT_CHECK_OK(lm_tensor_view_transpose(V(wf), 0, 1, &wt));
        LT_CHECK_OK(lm_matmul_out(g_two, V(x), &wt, V(b)));
        double *ga = lt_view_to_f64(V(a)), *gb = lt_view_to_f64(V(b));
        char what[64];
        snprintf(what, sizeof what, "int8 vs dequantized f32, M=%lld", (long long)M);
        lt_check_close(what, ga, gb, M * N, 1e-11, 1e-5);
        free(ga), free(gb);
        lm_tensor *all[] = {q, sc, x, wf, a, b};
        for (int j = 0; j < 6; j++) lm_tensor_destroy(all[j]);
    }
}

/* Layouts the tuned path does not take (a bf16 out, strided scales) run the reference
 * under LM_IMPL_AUTO and are refused under LM_IMPL_TUNED. */
static void test_int8_other_layouts_fall_back_to_reference(void) {
    lt_rng r = lt_rng_seed(85);
    int64_t M = 3, K = 20, N = 9, xs[2] = {M, K}, os[2] = {M, N}, s2[1] = {2 * N};
    lm_tensor *q, *sc;
    random_int8(&r, N, K, &q, &sc);
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *want = lt_poisoned_tensor(LM_F32, 2, os);
    lm_tensor *ob = lt_poisoned_tensor(LM_BF16, 2, os), *sw = lt_poisoned_tensor(LM_F32, 1, s2);
    lm_tensor_view sv;
    LT_CHECK_OK(lm_tensor_view_slice(V(sw), 0, 0, 2 * N, 2, &sv));
    LT_CHECK_OK(lm_tensor_view_copy(g_ref, &sv, V(sc)));
    lm_linear_params p = {.input = LM_LINEAR_IN, .w_scales = V(sc)}, ps = p;
    ps.w_scales = &sv;
    LT_CHECK_OK(lm_linear_out(g_ref, V(x), V(q), NULL, &p, V(want)));
    double *w64 = lt_view_to_f64(V(want));
    lm_ctx_set_impl(g_one, LM_IMPL_AUTO);
    LT_CHECK_OK(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(ob)));
    double *b64 = lt_view_to_f64(V(ob));
    lt_check_close("int8 into a bf16 out (reference)", b64, w64, M * N, 1e-5, 2e-2);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, os);
    LT_CHECK_OK(lm_linear_out(g_one, V(x), V(q), NULL, &ps, V(o)));
    double *o64 = lt_view_to_f64(V(o));
    lt_check_close("int8 with strided scales (reference)", o64, w64, M * N, 1e-14, 1e-6);
    lm_ctx_set_impl(g_one, LM_IMPL_TUNED);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(ob)), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &ps, V(o)), LM_UNSUPPORTED);
    free(w64), free(b64), free(o64);
    lm_tensor *all[] = {q, sc, x, want, ob, sw, o};
    for (int j = 0; j < 7; j++) lm_tensor_destroy(all[j]);
}

static void test_int8_linear_errors(void) {
    lt_rng r = lt_rng_seed(86);
    int64_t M = 2, K = 8, N = 4, xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N}, s5[1] = {N + 1}, s1[1] = {N};
    lm_tensor *q, *sc;
    random_int8(&r, N, K, &q, &sc);
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *xb = lt_random_tensor(&r, LM_BF16, 2, xs, 1.0);
    lm_tensor *wf = lt_random_tensor(&r, LM_F32, 2, ws, 1.0), *o = lt_poisoned_tensor(LM_F32, 2, os);
    lm_tensor *s_long = lt_poisoned_tensor(LM_F32, 1, s5), *s_bf = lt_poisoned_tensor(LM_BF16, 1, s1);
    lm_linear_params none = {.input = LM_LINEAR_IN}, p = none;
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, NULL, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "int8 weights need w_scales") != NULL);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &none, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    p.w_scales = V(s_long);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(o)), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    p.w_scales = V(s_bf);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(o)), LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    p.w_scales = V(sc);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(wf), NULL, &p, V(o)), LM_INVALID_ARGUMENT); /* scales, float w */
    LT_CHECK(strstr(lm_last_error(), "only for int8") != NULL);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(xb), V(q), NULL, &p, V(o)), LM_DTYPE_MISMATCH); /* int8 takes f32 x */
    lm_tensor_view sg = *V(sc);
    sg.device = lm_device_cuda(0);
    p.w_scales = &sg;
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    /* an out over the scales */
    lm_tensor_view so;
    int64_t one[2] = {1, N};
    LT_CHECK_OK(lm_tensor_view_reshape(V(sc), 2, one, &so));
    lm_tensor *x1 = lt_random_tensor(&r, LM_F32, 2, (int64_t[2]){1, K}, 1.0);
    p.w_scales = V(sc);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x1), V(q), NULL, &p, &so), LM_INVALID_ARGUMENT);
    /* what lm_linear_supported says: the CPU's tuned path; on CUDA (when built) every form
     * of f32 x, any rows (ops/cuda/gemv_quant.cu), never bf16 x */
#ifdef LOOM_HAVE_CUDA
    const int cuda = 1;
#else
    const int cuda = 0;
#endif
    for (int form = 0; form < 3; form++)
        for (int acc = 0; acc < 2; acc++) {
            LT_CHECK(lm_linear_supported(lm_device_cpu(), (lm_linear_input)form, acc, 1, 896, LM_F32, LM_I8));
            LT_CHECK(lm_linear_supported(lm_device_cpu(), (lm_linear_input)form, acc, 300, 7, LM_F32, LM_I8));
            LT_CHECK(lm_linear_supported(lm_device_cuda(0), (lm_linear_input)form, acc, 1, 896, LM_F32, LM_I8) == cuda);
            LT_CHECK(lm_linear_supported(lm_device_cuda(0), (lm_linear_input)form, acc, 300, 7, LM_F32, LM_I8) == cuda);
            LT_CHECK(!lm_linear_supported(lm_device_cuda(0), (lm_linear_input)form, acc, 1, 896, LM_BF16, LM_I8));
        }
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 896, LM_BF16, LM_I8));
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 896, LM_F32, LM_BF16));
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 0, 896, LM_F32, LM_I8));
    /* an allocation failure in the prologue scratch leaks nothing */
    lm_linear_params pn = {.input = LM_LINEAR_IN_SWIGLU, .w_scales = V(sc)};
    lm_tensor *x2 = lt_random_tensor(&r, LM_F32, 2, (int64_t[2]){M, 2 * K}, 1.0);
    lm_ctx_set_impl(g_one, LM_IMPL_TUNED);
    lt_alloc_track(1);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x2), V(q), NULL, &pn, V(o)), LM_OUT_OF_MEMORY);
    LT_CHECK(lt_alloc_live() == 0);
    lt_alloc_untrack();
    LT_CHECK_OK(lm_linear_out(g_one, V(x2), V(q), NULL, &pn, V(o)));
    lm_tensor *all[] = {q, sc, x, xb, wf, o, s_long, s_bf, x1, x2};
    for (int j = 0; j < 10; j++) lm_tensor_destroy(all[j]);
}

/* On a CUDA context int8 weights run (the quantizer stays host-only). */
static void test_int8_refused_on_cuda(void) {
    lm_ctx *gpu = NULL;
    if (!lm_cuda_compiled() || lm_cuda_device_count() < 1 || lm_ctx_create(lm_device_cuda(0), 1, &gpu) != LM_OK) {
        printf("  (no CUDA device: the CUDA refusal is not exercised)\n");
        lm_clear_error();
        return;
    }
    int64_t xs[2] = {1, 16}, ws[2] = {8, 16}, os[2] = {1, 8}, ss[1] = {8};
    lm_tensor *x = NULL, *q = NULL, *o = NULL, *sc = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 2, xs, &x));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_I8, 2, ws, &q));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 2, os, &o));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 1, ss, &sc));
    lm_linear_params p = {.input = LM_LINEAR_IN, .w_scales = V(sc)};
    /* CUDA runs quantized weights now (tests/cuda/test_cuda_linear_quant.c checks the values) */
    LT_CHECK_OK(lm_linear_out(gpu, V(x), V(q), NULL, &p, V(o)));
    LT_CHECK_OK(lm_ctx_synchronize(gpu));
    LT_CHECK_STATUS(lm_quantize_int8_rows(gpu, V(o), V(q), V(sc)), LM_UNSUPPORTED);
    lm_tensor_destroy(x), lm_tensor_destroy(q), lm_tensor_destroy(o), lm_tensor_destroy(sc);
    lm_ctx_destroy(gpu);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ref));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_one));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_two));
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    lm_ctx_set_impl(g_one, LM_IMPL_TUNED); /* refuses rather than falls back: proves the tuned path ran */
    lm_ctx_set_impl(g_two, LM_IMPL_TUNED);
    LT_RUN(test_quantize_known_rows);
    LT_RUN(test_quantize_random_rows_any_dtype_and_strides);
    LT_RUN(test_quantize_refusals);
    LT_RUN(test_linear_int8_tuned_matches_reference);
    LT_RUN(test_int8_equals_dequantized_float_product);
    LT_RUN(test_int8_other_layouts_fall_back_to_reference);
    LT_RUN(test_int8_linear_errors);
    LT_RUN(test_int8_refused_on_cuda);
    lm_ctx_destroy(g_ref), lm_ctx_destroy(g_one), lm_ctx_destroy(g_two);
    return lt_finish();
}
