/* fp8 e4m3 weights: the dtype's conversions (every byte decodes and re-encodes to
 * itself, NaN, ties to even, subnormals, saturation at 448), lm_quantize_fp8_rows
 * (exactly representable rows round-trip; scales = rowmax / 448; an all-zero row;
 * NaN/Inf rejected naming the row, nothing written), and the CPU reference
 * lm_linear_out with f8_e4m3 weights against a direct double computation (every
 * input form, bias, accumulate; gate NMSE <= 1e-12: both are exact products summed in
 * double, rounded once to f32). Also the safetensors name and the dtype's name.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

#define V(t) lm_tensor_as_view(t)

static void test_conversions(void) {
    int bad = 0;
    for (int b = 0; b < 256; b++) {
        float v = lm_f8e4m3_to_f32((uint8_t)b);
        if ((b & 0x7f) == 0x7f) {
            LT_CHECK_MSG(isnan(v), "byte 0x%02x decodes to %g, not NaN", b, v);
            LT_CHECK(lm_f32_to_f8e4m3(v) == (uint8_t)(0x7f | (b & 0x80)));
            continue;
        }
        if (lm_f32_to_f8e4m3(v) != (uint8_t)b && bad++ < 3) LT_CHECK_MSG(0, "byte 0x%02x (%g) re-encodes wrong", b, v);
    }
    LT_CHECK(bad == 0);
    LT_CHECK(lm_f8e4m3_to_f32(0x7e) == 448.0f && lm_f8e4m3_to_f32(0x01) == 0x1p-9f && lm_f8e4m3_to_f32(0x08) == 0x1p-6f);
    LT_CHECK(lm_f8e4m3_to_f32(0x38) == 1.0f && lm_f8e4m3_to_f32(0xb8) == -1.0f);
    /* saturation: beyond 448 (and inf) to +-448 */
    LT_CHECK(lm_f32_to_f8e4m3(449.0f) == 0x7e && lm_f32_to_f8e4m3(1e9f) == 0x7e && lm_f32_to_f8e4m3(-1e9f) == 0xfe);
    LT_CHECK(lm_f32_to_f8e4m3(INFINITY) == 0x7e && lm_f32_to_f8e4m3(-INFINITY) == 0xfe);
    /* ties to even: 1.0625 between 1 (m 0) and 1.125 (m 1) -> 1; 1.1875 -> 1.25 (m 2) */
    LT_CHECK(lm_f32_to_f8e4m3(1.0625f) == 0x38 && lm_f32_to_f8e4m3(1.1875f) == 0x3a);
    LT_CHECK(lm_f32_to_f8e4m3(1.07f) == 0x39);
    /* subnormals: half the smallest rounds to 0 (even), 1.5 of it to 2 steps */
    LT_CHECK(lm_f32_to_f8e4m3(0x1p-10f) == 0x00 && lm_f32_to_f8e4m3(1.5f * 0x1p-9f) == 0x02);
    LT_CHECK(lm_f32_to_f8e4m3(-0.0f) == 0x80 && lm_f32_to_f8e4m3(1e-30f) == 0x00);
    /* the largest subnormal rounds up into the smallest normal */
    LT_CHECK(lm_f32_to_f8e4m3(0x1p-6f - 0x1p-11f) == 0x08);
    LT_CHECK(strcmp(lm_dtype_name(LM_F8_E4M3), "f8_e4m3") == 0 && lm_dtype_size(LM_F8_E4M3) == 1);
    LT_CHECK(!lm_dtype_is_float(LM_F8_E4M3));
    lm_dtype d;
    LT_CHECK_OK(lm_dtype_parse("f8_e4m3", &d));
    LT_CHECK(d == LM_F8_E4M3);
}

/* Row 0: every finite e4m3 value (so rowmax = 448, scale 1, exact); row 1 the same
 * times 2^-3; row 2 zeros. */
static void test_quantizer_round_trip(void) {
    int64_t K = 254, ws[2] = {3, K}, ss[1] = {3};
    lm_tensor *w = NULL, *q = NULL, *sc = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, ws, &w));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F8_E4M3, 2, ws, &q));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, ss, &sc));
    float *wd = lm_tensor_data(w);
    int k = 0;
    uint8_t bytes[254];
    for (int b = 0; b < 256; b++)
        if ((b & 0x7f) != 0x7f) bytes[k] = (uint8_t)b, wd[k] = lm_f8e4m3_to_f32((uint8_t)b), wd[K + k] = wd[k] / 8, k++;
    LT_CHECK(k == K);
    LT_CHECK_OK(lm_quantize_fp8_rows(g_ctx, V(w), V(q), V(sc)));
    const uint8_t *qd = lm_tensor_data(q);
    const float *s = lm_tensor_data(sc);
    LT_CHECK(s[0] == 1.0f && s[1] == 0.125f && s[2] == 1.0f);
    int bad = 0;
    for (int64_t i = 0; i < K; i++) {
        /* -0 quantizes to -0 (0x80), +0 to 0x00 */
        bad += qd[i] != bytes[i];
        bad += qd[K + i] != bytes[i];
        bad += (qd[2 * K + i] & 0x7f) != 0;
    }
    LT_CHECK_MSG(bad == 0, "%d bytes differ", bad);
    /* a non-representable value rounds to nearest: 1.07 * 448 / 448 */
    wd[0] = 448.0f, wd[1] = 1.07f;
    LT_CHECK_OK(lm_quantize_fp8_rows(g_ctx, V(w), V(q), V(sc)));
    LT_CHECK(qd[1] == 0x39);
    /* NaN and Inf: refused naming the row, nothing written */
    memset(lm_tensor_data(q), 0xaa, (size_t)(3 * K));
    wd[K + 5] = NAN;
    LT_CHECK_STATUS(lm_quantize_fp8_rows(g_ctx, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "row 1") && strstr(lm_last_error(), "finite"), "%s", lm_last_error());
    LT_CHECK(qd[0] == 0xaa);
    wd[K + 5] = INFINITY;
    LT_CHECK_STATUS(lm_quantize_fp8_rows(g_ctx, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    /* wrong q dtype */
    lm_tensor *q8 = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I8, 2, ws, &q8));
    wd[K + 5] = 1.0f;
    LT_CHECK_STATUS(lm_quantize_fp8_rows(g_ctx, V(w), V(q8), V(sc)), LM_DTYPE_MISMATCH);
    lm_tensor_destroy(q8), lm_tensor_destroy(w), lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

/* The reference linear with fp8 weights against sum_k in(x)[m, k] * decode(q[n, k]) * s[n]. */
static void check_linear(lm_linear_input in, int bias, int acc) {
    lt_rng r = lt_rng_seed(40 + (uint64_t)(in * 4 + bias * 2 + acc));
    int64_t M = 3, N = 7, K = 48, ws[2] = {N, K}, xs[2] = {M, in == LM_LINEAR_IN_SWIGLU ? 2 * K : K}, os[2] = {M, N};
    int64_t ns[1] = {N}, ks[1] = {K};
    lm_tensor *w = lt_random_tensor(&r, LM_F32, 2, ws, 1.0), *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0);
    lm_tensor *b = lt_random_tensor(&r, LM_F32, 1, ns, 1.0), *nw = lt_random_tensor(&r, LM_F32, 1, ks, 1.0);
    lm_tensor *out = lt_random_tensor(&r, LM_F32, 2, os, 1.0), *q = NULL, *sc = NULL;
    if (!acc) {
        lm_tensor_destroy(out);
        out = lt_poisoned_tensor(LM_F32, 2, os);
    }
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F8_E4M3, 2, ws, &q));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, ns, &sc));
    LT_CHECK_OK(lm_quantize_fp8_rows(g_ctx, V(w), V(q), V(sc)));
    double *want = malloc(sizeof(double) * (size_t)(M * N)), *got = NULL;
    const float *xd = lm_tensor_data(x), *bd = lm_tensor_data(b), *nd = lm_tensor_data(nw), *sd = lm_tensor_data(sc);
    const float *od = lm_tensor_data(out);
    const uint8_t *qd = lm_tensor_data(q);
    for (int64_t m = 0; m < M; m++) {
        double ss = 0;
        for (int64_t k = 0; k < K; k++) ss += (double)xd[m * xs[1] + k] * xd[m * xs[1] + k];
        double inv = 1.0 / sqrt(ss / (double)K + 1e-5);
        for (int64_t n = 0; n < N; n++) {
            double a = bias ? bd[n] : 0;
            for (int64_t k = 0; k < K; k++) {
                double v = xd[m * xs[1] + k];
                if (in == LM_LINEAR_IN_RMSNORM) v *= inv * nd[k];
                if (in == LM_LINEAR_IN_SWIGLU) v = v / (1 + exp(-v)) * xd[m * xs[1] + K + k];
                a += v * (double)lm_f8e4m3_to_f32(qd[n * K + k]) * sd[n];
            }
            want[m * N + n] = (double)(float)(a + (acc ? od[m * N + n] : 0));
        }
    }
    lm_linear_params p = {.input = in, .norm_weight = V(nw), .eps = 1e-5f, .accumulate = acc, .w_scales = V(sc)};
    LT_CHECK_OK(lm_linear_out(g_ctx, V(x), V(q), bias ? V(b) : NULL, &p, V(out)));
    got = lt_view_to_f64(V(out));
    char what[64];
    snprintf(what, sizeof what, "fp8 linear in=%d bias=%d acc=%d", (int)in, bias, acc);
    lt_check_close(what, got, want, M * N, 1e-12, 1e-5);
    /* fp8 weights without scales, or with w_bits 4, are argument errors */
    lm_linear_params bad = {.input = LM_LINEAR_IN};
    if (in == LM_LINEAR_IN && !bias && !acc) {
        lm_tensor *o2 = lt_poisoned_tensor(LM_F32, 2, os);
        LT_CHECK_STATUS(lm_linear_out(g_ctx, V(x), V(q), NULL, &bad, V(o2)), LM_INVALID_ARGUMENT);
        bad.w_scales = V(sc), bad.w_bits = 4, bad.w_group = 32;
        LT_CHECK_STATUS(lm_linear_out(g_ctx, V(x), V(q), NULL, &bad, V(o2)), LM_INVALID_ARGUMENT);
        lm_tensor_destroy(o2);
    }
    free(want), free(got);
    lm_tensor_destroy(w), lm_tensor_destroy(x), lm_tensor_destroy(b), lm_tensor_destroy(nw);
    lm_tensor_destroy(out), lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

static void test_reference_linear(void) {
    for (int in = 0; in <= 2; in++)
        for (int bias = 0; bias < 2; bias++)
            for (int acc = 0; acc < 2; acc++) check_linear((lm_linear_input)in, bias, acc);
    /* the CPU does not claim a tuned fp8 path */
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 64, LM_F32, LM_F8_E4M3));
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_conversions);
    LT_RUN(test_quantizer_round_trip);
    LT_RUN(test_reference_linear);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
