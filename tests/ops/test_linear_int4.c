/* int4 weights: lm_quantize_int4_groups against a direct computation (ties, the
 * clamp, all-zero groups, the nibble packing, every group size, strided views, f32 and
 * bf16 scales, refusals), and lm_linear_out with packed int4 weights and f32 or bf16
 * group scales (w_bits = 4) on the CPU: the tuned level (every ISA path this CPU runs, 1 and 2
 * threads bit-identical) against the reference level on fresh random inputs (every
 * nibble value, -8 included), for M from 1 to 200 (gemv and GEMM), N odd and aligned,
 * groups 32/64/128, every input form, bias or not, accumulate or not, strided x and
 * out rows, NaN-poisoned outputs whose padding must stay untouched; argument errors
 * and the CUDA device accepting f32 and bf16 scales (refusing f16 ones).
 *
 * Gate (tuned vs the double reference, outputs O(1)): NMSE <= 1e-10 and max-abs
 * <= 2e-4, as for int8: the tuned path differs only by f32 rounding (q * scale rounded
 * once per weight, the f32 dot product of K terms, the f32 RMSNorm/SwiGLU prologue).
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

/* Nibble k of packed row q (signed). */
static int nib(const uint8_t *q, int64_t k) {
    int v = (q[k / 2] >> (k % 2 * 4)) & 15;
    return v >= 8 ? v - 16 : v;
}

/* The direct scale as bf16 scales hold it: rounded to nearest even, bf16's smallest
 * positive value where that is 0 (the direct rule of the quantizer's bf16 form). */
static float direct_scale_bf16(float s) {
    uint16_t h = lm_f32_to_bf16(s);
    return lm_bf16_to_f32(h ? h : 1);
}

/* Quantizes the view w into q [N, K/2] u8 and scales [N, K/G] (any strides; f32 or
 * bf16) and checks them against the direct computation. Returns the number of
 * mismatches. */
static int64_t quantize_and_check(const char *what, const lm_tensor_view *w, const lm_tensor_view *q,
                                  const lm_tensor_view *sc, int G) {
    LT_CHECK_OK(lm_quantize_int4_groups(g_one, w, q, sc, G));
    int64_t N = w->shape[0], K = w->shape[1], bad = 0;
    double *w64 = lt_view_to_f64(w), *s64 = lt_view_to_f64(sc);
    uint8_t *qb = malloc((size_t)(N * K / 2));
    for (int64_t n = 0; n < N; n++)
        for (int64_t j = 0; j < K / 2; j++)
            qb[n * (K / 2) + j] = ((const uint8_t *)q->data)[n * q->stride[0] + j * q->stride[1]];
    for (int64_t n = 0; n < N; n++)
        for (int64_t g = 0; g < K / G; g++) {
            float s = direct_scale(w64 + n * K + g * G, G, 7);
            if (sc->dtype == LM_BF16) s = direct_scale_bf16(s);
            if ((float)s64[n * (K / G) + g] != s && bad++ < 3)
                LT_CHECK_MSG(0, "%s: scale of row %lld group %lld is %.9g, want %.9g", what, (long long)n,
                             (long long)g, s64[n * (K / G) + g], (double)s);
            for (int64_t k = g * G; k < (g + 1) * G; k++) {
                int want = direct_q(w64[n * K + k], s, 7), got = nib(qb + n * (K / 2), k);
                if (got != want && bad++ < 3)
                    LT_CHECK_MSG(0, "%s: q[%lld, %lld] = %d for w %.9g / scale %.9g, want %d", what, (long long)n,
                                 (long long)k, got, w64[n * K + k], (double)s, want);
            }
        }
    free(w64), free(s64), free(qb);
    return bad;
}

static lm_tensor *f32_tensor(int64_t N, int64_t K, const float *v) {
    int64_t sh[2] = {N, K};
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 2, sh, &t));
    memcpy(lm_tensor_data(t), v, sizeof(float) * (size_t)(N * K));
    return t;
}

/* Hand-made groups with known answers (group 32): ties at scale 1 (max 7) and 2 (max
 * 14), an all-zero group (with a negative zero), a group whose quotients would pass
 * 7 after rounding of the scale, and the packing of known nibbles. */
static void test_quantize_known_groups(void) {
    enum { K = 64, G = 32 };
    float w[2 * K] = {0};
    /* row 0 group 0, scale 1: ties 0.5 -> 0, 1.5 -> 2, 2.5 -> 2, -3.5 -> -4, 6.5 -> 6 */
    const float g0[] = {7, 0.5f, 1.5f, 2.5f, -3.5f, 6.5f, -6.5f, -7, 3.25f, -0.5f};
    const int q0[] = {7, 0, 2, 2, -4, 6, -6, -7, 3, 0};
    memcpy(w, g0, sizeof g0);
    /* row 0 group 1: all zero (a -0 too) -> scale 1, q 0 */
    w[G + 3] = -0.0f;
    /* row 1 group 0, scale 2: 14, 3 (1.5 -> 2), 5 (2.5 -> 2), -1 (-0.5 -> 0), 13 (6.5 -> 6) */
    const float g1[] = {14, 3, 5, -1, 13, -14};
    const int q1[] = {7, 2, 2, 0, 6, -7};
    memcpy(w + K, g1, sizeof g1);
    /* row 1 group 1: max 0.1 (scale 0.1f / 7 rounded), every value +-max must give +-7 */
    for (int k = 0; k < G; k++) w[K + G + k] = k % 2 ? 0.1f : -0.1f;
    lm_tensor *wt = f32_tensor(2, K, w);
    int64_t qs[2] = {2, K / 2}, ss[2] = {2, K / G};
    lm_tensor *q = lt_poisoned_tensor(LM_U8, 2, qs), *sc = lt_poisoned_tensor(LM_F32, 2, ss);
    LT_CHECK(quantize_and_check("known groups", V(wt), V(q), V(sc), G) == 0);
    const uint8_t *qd = lm_tensor_data(q);
    const float *sd = lm_tensor_data(sc);
    LT_CHECK(sd[0] == 1.0f && sd[1] == 1.0f && sd[2] == 2.0f && sd[3] == 0.1f / 7.0f);
    for (int k = 0; k < 10; k++) LT_CHECK_MSG(nib(qd, k) == q0[k], "row 0 k %d: %d, want %d", k, nib(qd, k), q0[k]);
    for (int k = 0; k < 6; k++)
        LT_CHECK_MSG(nib(qd + K / 2, k) == q1[k], "row 1 k %d: %d, want %d", k, nib(qd + K / 2, k), q1[k]);
    for (int k = G; k < K; k++) LT_CHECK(nib(qd, k) == 0);
    for (int k = G; k < K; k++) LT_CHECK(nib(qd + K / 2, k) == (k % 2 ? 7 : -7));
    /* the byte layout: k = 0 (7) low nibble, k = 1 (0) high; k = 4 (-4 = 0xC), k = 5 (6) */
    LT_CHECK_MSG(qd[0] == 0x07 && qd[2] == 0x6C, "packing: byte 0 = 0x%02x, byte 2 = 0x%02x", qd[0], qd[2]);
    /* bf16 scales: 1 and 2 are bf16 values, 0.1 / 7 is rounded (and its group still
     * reaches +-7); a group of f32 subnormals whose scale is below bf16's range takes
     * bf16's smallest positive value, and its weights round to 0 against it */
    for (int k = 0; k < G; k++) w[G + k] = k % 3 ? 1e-42f : -3e-42f;
    lm_tensor_destroy(wt);
    wt = f32_tensor(2, K, w);
    lm_tensor *s16 = lt_poisoned_tensor(LM_BF16, 2, ss);
    LT_CHECK(quantize_and_check("known groups, bf16 scales", V(wt), V(q), V(s16), G) == 0);
    const uint16_t *s16d = lm_tensor_data(s16);
    LT_CHECK_MSG(s16d[0] == 0x3f80 && s16d[1] == 0x0001 && s16d[2] == 0x4000 &&
                     s16d[3] == lm_f32_to_bf16(0.1f / 7.0f) && s16d[3] != 0,
                 "bf16 scales %04x %04x %04x %04x", s16d[0], s16d[1], s16d[2], s16d[3]);
    for (int k = G; k < K; k++) LT_CHECK(nib(qd, k) == 0 && nib(qd + K / 2, k) == (k % 2 ? 7 : -7));
    lm_tensor_destroy(s16);
    lm_tensor_destroy(wt), lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

/* Random rows in every float dtype and group size, contiguous and strided (w
 * transposed, q and scales every other element), against the direct computation. */
static void test_quantize_random_any_group_dtype_and_strides(void) {
    lt_rng r = lt_rng_seed(91);
    static const lm_dtype dts[3] = {LM_F32, LM_BF16, LM_F16};
    static const int Gs[3] = {32, 64, 128};
    const int64_t N = 13, K = 256;
    for (int d = 0; d < 6; d++)
        for (int gi = 0; gi < 3; gi++) {
            int G = Gs[gi];
            lm_dtype sdt = d < 3 ? LM_F32 : LM_BF16; /* the scales' dtype */
            int64_t ws[2] = {N, K}, wts[2] = {K, N}, qs[2] = {N, K / 2}, ss[2] = {N, K / G};
            int64_t q2s[2] = {N, K}, s2s[2] = {N, 2 * K / G};
            lm_tensor *w = lt_random_tensor(&r, dts[d % 3], 2, ws, 3.0), *wt = lt_random_tensor(&r, dts[d % 3], 2, wts, 0.01);
            if (dts[d % 3] == LM_F32) { /* exact ties in the first group: max 7 gives scale 1 */
                float *p = lm_tensor_data(w);
                for (int k = 0; k < G; k++) p[k] = (float)(k % 15 - 7) + (k % 3 ? 0.0f : 0.5f);
                p[0] = 7.0f;
            }
            lm_tensor *q = lt_poisoned_tensor(LM_U8, 2, qs), *sc = lt_poisoned_tensor(sdt, 2, ss);
            char what[64];
            snprintf(what, sizeof what, "random %s group %d, %s scales", lm_dtype_name(dts[d % 3]), G, lm_dtype_name(sdt));
            LT_CHECK(quantize_and_check(what, V(w), V(q), V(sc), G) == 0);
            lm_tensor *q2 = lt_poisoned_tensor(LM_U8, 2, q2s), *s2 = lt_poisoned_tensor(sdt, 2, s2s);
            lm_tensor_view wv, qv, sv;
            LT_CHECK_OK(lm_tensor_view_transpose(V(wt), 0, 1, &wv));
            LT_CHECK_OK(lm_tensor_view_slice(V(q2), 1, 0, K, 2, &qv));
            LT_CHECK_OK(lm_tensor_view_slice(V(s2), 1, 0, 2 * K / G, 2, &sv));
            snprintf(what, sizeof what, "strided %s group %d, %s scales", lm_dtype_name(dts[d % 3]), G,
                     lm_dtype_name(sdt));
            LT_CHECK(quantize_and_check(what, &wv, &qv, &sv, G) == 0);
            const uint8_t *q2d = lm_tensor_data(q2);
            int untouched = 1;
            for (int64_t i = 0; i < N * K; i += 2) untouched &= q2d[i + 1] == 0xA5;
            double *s2d = lt_view_to_f64(V(s2));
            for (int64_t i = 0; i < N * 2 * K / G; i += 2) untouched &= isnan(s2d[i + 1]);
            free(s2d);
            LT_CHECK_MSG(untouched, "%s: elements between the strided ones were written", what);
            lm_tensor *all[] = {w, wt, q, sc, q2, s2};
            for (int i = 0; i < 6; i++) lm_tensor_destroy(all[i]);
        }
}

static void test_quantize_refusals(void) {
    lt_rng r = lt_rng_seed(92);
    int64_t ws[2] = {4, 64}, qs[2] = {4, 32}, ss[2] = {4, 2}, w48[2] = {4, 48}, q48[2] = {4, 24}, s48[2] = {4, 1};
    lm_tensor *w = lt_random_tensor(&r, LM_F32, 2, ws, 1.0), *q = lt_poisoned_tensor(LM_U8, 2, qs);
    lm_tensor *sc = lt_poisoned_tensor(LM_F32, 2, ss);
    float *wd = lm_tensor_data(w);
    wd[2 * 64 + 3] = NAN;
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(q), V(sc), 32), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "row 2") != NULL);
    int untouched = 1;
    for (int i = 0; i < 4 * 32; i++) untouched &= ((uint8_t *)lm_tensor_data(q))[i] == 0xA5;
    for (int i = 0; i < 8; i++) untouched &= isnan(((float *)lm_tensor_data(sc))[i]);
    LT_CHECK_MSG(untouched, "a refused quantization wrote its outputs");
    wd[2 * 64 + 3] = 0.0f;
    /* group sizes: not 32/64/128, or not dividing K */
    static const int bad_g[] = {0, -32, 16, 48, 256, 33};
    for (size_t i = 0; i < sizeof bad_g / sizeof bad_g[0]; i++)
        LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(q), V(sc), bad_g[i]), LM_INVALID_ARGUMENT);
    lm_tensor *w2 = lt_random_tensor(&r, LM_F32, 2, w48, 1.0), *q2 = lt_poisoned_tensor(LM_U8, 2, q48);
    lm_tensor *s2 = lt_poisoned_tensor(LM_F32, 2, s48);
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w2), V(q2), V(s2), 32), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "multiple of the group") != NULL);
    /* dtypes and shapes */
    lm_tensor *qi = lt_poisoned_tensor(LM_I8, 2, qs), *qfull = lt_poisoned_tensor(LM_U8, 2, ws);
    lm_tensor *s1 = lt_poisoned_tensor(LM_F32, 1, (int64_t[1]){4});
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(qi), V(sc), 32), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(qfull), V(sc), 32), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(q), V(s1), 32), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, V(w), V(q), V(sc), 64), LM_SHAPE_MISMATCH); /* [4, 1] wanted */
    LT_CHECK_STATUS(lm_quantize_int4_groups(g_one, NULL, V(q), V(sc), 32), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_quantize_int4_groups(NULL, V(w), V(q), V(sc), 32), LM_INVALID_ARGUMENT);
    lm_tensor *all[] = {w, q, sc, w2, q2, s2, qi, qfull, s1};
    for (int i = 0; i < 9; i++) lm_tensor_destroy(all[i]);
}

/* ---- lm_linear_out with int4 weights ------------------------------------------------- */

/* Random packed int4 weights [N, K] (every nibble, -8 included) and group scales ~ 1 /
 * (7 sqrt(K)) so products stay O(1), f32 or bf16 (sdt). */
static void random_int4_scales(lt_rng *r, int64_t N, int64_t K, int G, lm_dtype sdt, lm_tensor **q, lm_tensor **sc) {
    int64_t qs[2] = {N, K / 2}, ss[2] = {N, K / G};
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_U8, 2, qs, q));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), sdt, 2, ss, sc));
    uint8_t *qd = lm_tensor_data(*q);
    for (int64_t i = 0; i < N * K / 2; i++) qd[i] = (uint8_t)lt_rng_int(r, 0, 255);
    for (int64_t i = 0; i < N * K / G; i++) {
        float v = (float)((0.5 + lt_rng_uniform(r)) / (7.0 * sqrt((double)K) * 0.6));
        if (sdt == LM_BF16) ((uint16_t *)lm_tensor_data(*sc))[i] = lm_f32_to_bf16(v);
        else ((float *)lm_tensor_data(*sc))[i] = v;
    }
}

static void random_int4(lt_rng *r, int64_t N, int64_t K, int G, lm_tensor **q, lm_tensor **sc) {
    random_int4_scales(r, N, K, G, LM_F32, q, sc);
}

static lm_linear_params params4(int form, const lm_tensor_view *nw, int acc, const lm_tensor_view *sc, int G) {
    lm_linear_params p = {.input = (lm_linear_input)form, .norm_weight = nw, .eps = 1e-5f, .accumulate = acc,
                          .w_scales = sc, .w_bits = 4, .w_group = G};
    return p;
}

/* One (M, K, N) with random int4 weights of group G and scales of dtype sdt (the shared
 * loop of linear_quant_util.h). */
static void run_case_scales(lt_rng *r, int64_t M, int64_t K, int64_t N, int G, int64_t pad, lm_dtype sdt) {
    lm_tensor *q, *sc;
    random_int4_scales(r, N, K, G, sdt, &q, &sc);
    lm_linear_params fmt = params4(0, NULL, 0, V(sc), G);
    char tag[32];
    snprintf(tag, sizeof tag, "int4 G=%d %s scales", G, lm_dtype_name(sdt));
    run_quant_case(r, tag, M, K, N, pad, q, &fmt);
    lm_tensor_destroy(q), lm_tensor_destroy(sc);
}

static void run_case(lt_rng *r, int64_t M, int64_t K, int64_t N, int G, int64_t pad) {
    run_case_scales(r, M, K, N, G, pad, LM_F32);
}

/* The quantizers split rows over the context's threads (tasks of 65,536 / K rows): the
 * bytes and scales of int8, int4 and fp8 are the same with 1 and 2 threads over a
 * bf16 matrix of several tasks, and a refusal names the first bad row even when a later
 * task finds one too. */
static void test_quantize_thread_count_invariant(void) {
    lt_rng r = lt_rng_seed(77);
    const int64_t N = 3001, K = 64; /* 1,024 rows a task: 3 tasks, the last short */
    int64_t ws[2] = {N, K}, q8s[2] = {N, K}, q4s[2] = {N, K / 2}, s8[1] = {N}, s4[2] = {N, K / 32};
    lm_tensor *w = lt_random_tensor(&r, LM_BF16, 2, ws, 1.0);
    for (int fmt = 0; fmt < 3; fmt++) {
        lm_tensor *q[2], *sc[2];
        for (int t = 0; t < 2; t++) {
            q[t] = lt_poisoned_tensor(fmt == 1 ? LM_U8 : fmt == 2 ? LM_F8_E4M3 : LM_I8, 2, fmt == 1 ? q4s : q8s);
            sc[t] = lt_poisoned_tensor(LM_F32, fmt == 1 ? 2 : 1, fmt == 1 ? s4 : s8);
            lm_ctx *c = t ? g_two : g_one;
            if (fmt == 1) LT_CHECK_OK(lm_quantize_int4_groups(c, V(w), V(q[t]), V(sc[t]), 32));
            else if (fmt == 2) LT_CHECK_OK(lm_quantize_fp8_rows(c, V(w), V(q[t]), V(sc[t])));
            else LT_CHECK_OK(lm_quantize_int8_rows(c, V(w), V(q[t]), V(sc[t])));
        }
        /* written at all (poisoned outputs left alone by both runs would compare equal) */
        int64_t ns = lm_tensor_numel(sc[0]), scales_ok = 1;
        for (int64_t i = 0; i < ns; i++) {
            float v = ((const float *)lm_tensor_data(sc[0]))[i];
            scales_ok &= isfinite(v) && v > 0.0f;
        }
        LT_CHECK_MSG(scales_ok, "format %d: a scale was not written", fmt);
        size_t qb = (size_t)lm_tensor_numel(q[0]), sb = sizeof(float) * (size_t)ns;
        LT_CHECK_MSG(memcmp(lm_tensor_data(q[0]), lm_tensor_data(q[1]), qb) == 0 &&
                         memcmp(lm_tensor_data(sc[0]), lm_tensor_data(sc[1]), sb) == 0,
                     "format %d: 1 and 2 threads quantize differently", fmt);
        for (int t = 0; t < 2; t++) lm_tensor_destroy(q[t]), lm_tensor_destroy(sc[t]);
    }
    uint16_t *wd = lm_tensor_data(w);
    wd[2500 * K + 7] = 0x7fc0; /* NaN in the third task, Inf in the second */
    wd[1500 * K + 9] = 0x7f80;
    lm_tensor *q = lt_poisoned_tensor(LM_I8, 2, q8s), *sc = lt_poisoned_tensor(LM_F32, 1, s8);
    LT_CHECK_STATUS(lm_quantize_int8_rows(g_two, V(w), V(q), V(sc)), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "row 1500") && strstr(lm_last_error(), "column 9"), "%s", lm_last_error());
    int untouched = 1;
    for (int64_t i = 0; i < N * K; i++) untouched &= ((uint8_t *)lm_tensor_data(q))[i] == 0xA5;
    LT_CHECK_MSG(untouched, "a refused quantization wrote its outputs");
    lm_tensor_destroy(q), lm_tensor_destroy(sc), lm_tensor_destroy(w);
}

static void test_linear_int4_tuned_matches_reference(void) {
    lt_rng r = lt_rng_seed(93);
    static const int64_t Ms[] = {1, 2, 5, 8, 17, 64, 200};
    /* (K, N, group): K from one group to many, N odd and aligned; K = 320 splits the
     * GEMM's K blocks off group boundaries (160 + 160 with group 64) */
    static const int64_t KNG[][3] = {{32, 7, 32},   {64, 1, 64},    {128, 31, 128}, {96, 64, 32},  {320, 33, 64},
                                     {256, 100, 128}, {896, 31, 32}, {384, 130, 128}, {64, 896, 32}, {896, 64, 64}};
    memset(&g_res, 0, sizeof g_res);
    for (size_t m = 0; m < sizeof Ms / sizeof Ms[0]; m++)
        for (size_t s = 0; s < sizeof KNG / sizeof KNG[0]; s++) {
            if (Ms[m] == 200 && KNG[s][0] * KNG[s][1] > 896 * 31) continue; /* keeps the double reference quick */
            run_case(&r, Ms[m], KNG[s][0], KNG[s][1], (int)KNG[s][2], (int64_t)(s % 3) * 3);
        }
    run_case(&r, 1, 896, 896, 32, 5); /* a square decode GEMV */
    run_case(&r, 3, 896, 896, 128, 0);
    printf("  int4 linear: %lld tuned runs, %lld failed; worst NMSE %.3g, worst max-abs %.3g\n", (long long)g_res.runs,
           (long long)g_res.fails, g_res.worst_nmse, g_res.worst_abs);
}

/* bf16 group scales (what a model quantized at load holds): every ISA's gemv and GEMM
 * pack reads them as bf16 (K = 1,120: GEMM K blocks off the group boundaries); against
 * the reference, which reads the bf16 values. */
static void test_linear_int4_bf16_scales_match_reference(void) {
    lt_rng r = lt_rng_seed(96);
    static const int64_t MKNG[][4] = {{1, 4864, 100, 32}, {2, 4864, 37, 64},  {5, 896, 70, 32},   {8, 2048, 48, 128},
                                      {1, 64, 130, 32},   {17, 1120, 40, 32}, {64, 320, 33, 64}, {33, 4864, 20, 128}};
    memset(&g_res, 0, sizeof g_res);
    for (size_t s = 0; s < sizeof MKNG / sizeof MKNG[0]; s++)
        run_case_scales(&r, MKNG[s][0], MKNG[s][1], MKNG[s][2], (int)MKNG[s][3], (int64_t)(s % 3) * 3, LM_BF16);
    printf("  int4 linear, bf16 scales: %lld tuned runs, %lld failed; worst NMSE %.3g, worst max-abs %.3g\n",
           (long long)g_res.runs, (long long)g_res.fails, g_res.worst_nmse, g_res.worst_abs);
    LT_CHECK(g_res.runs > 0 && g_res.fails == 0);
}

/* The quantize -> linear chain against the float weights: int4 group 32 of Gaussian
 * weights keeps the product within ~10% (NMSE ~1e-2, the 4-bit rounding error), and
 * a broken nibble order (the two halves of every byte swapped) is far outside it. */
static void test_int4_product_tracks_float_weights(void) {
    lt_rng r = lt_rng_seed(94);
    int64_t M = 4, K = 512, N = 96, xs[2] = {M, K}, ws[2] = {N, K}, os[2] = {M, N}, qs[2] = {N, K / 2};
    int64_t ss[2] = {N, K / 32};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *w = lt_random_tensor(&r, LM_F32, 2, ws, 0.05);
    lm_tensor *q = lt_poisoned_tensor(LM_U8, 2, qs), *sc = lt_poisoned_tensor(LM_F32, 2, ss);
    lm_tensor *a = lt_poisoned_tensor(LM_F32, 2, os), *b = lt_poisoned_tensor(LM_F32, 2, os);
    LT_CHECK_OK(lm_quantize_int4_groups(g_one, V(w), V(q), V(sc), 32));
    lm_linear_params p = params4(0, NULL, 0, V(sc), 32);
    LT_CHECK_OK(lm_linear_out(g_two, V(x), V(q), NULL, &p, V(a)));
    LT_CHECK_OK(lm_linear_out(g_ref, V(x), V(w), NULL, NULL, V(b)));
    double *ga = lt_view_to_f64(V(a)), *gb = lt_view_to_f64(V(b));
    lt_metrics good = lt_measure(ga, gb, M * N);
    uint8_t *qd = lm_tensor_data(q);
    for (int64_t i = 0; i < N * K / 2; i++) qd[i] = (uint8_t)(qd[i] >> 4 | qd[i] << 4);
    LT_CHECK_OK(lm_linear_out(g_two, V(x), V(q), NULL, &p, V(a)));
    free(ga);
    ga = lt_view_to_f64(V(a));
    lt_metrics broken = lt_measure(ga, gb, M * N);
    printf("  int4 g32 vs f32 weights: NMSE %.3g (nibbles swapped: %.3g)\n", good.nmse, broken.nmse);
    LT_CHECK_MSG(good.nmse < 2e-2, "int4 product NMSE %g vs float", good.nmse);
    LT_CHECK_MSG(broken.nmse > 0.5, "swapped nibbles NMSE only %g", broken.nmse);
    free(ga), free(gb);
    lm_tensor *all[] = {x, w, q, sc, a, b};
    for (int j = 0; j < 6; j++) lm_tensor_destroy(all[j]);
}

static void test_int4_linear_errors(void) {
    lt_rng r = lt_rng_seed(95);
    int64_t M = 2, K = 64, N = 4, xs[2] = {M, K}, os[2] = {M, N};
    lm_tensor *q, *sc, *q8, *s8;
    random_int4(&r, N, K, 32, &q, &sc);
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I8, 2, (int64_t[2]){N, K}, &q8));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, (int64_t[1]){N}, &s8));
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *xb = lt_random_tensor(&r, LM_BF16, 2, xs, 1.0);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, os), *s_bad = lt_poisoned_tensor(LM_F32, 2, (int64_t[2]){N, 1});
    lm_linear_params p = params4(0, NULL, 0, V(sc), 32);
    LT_CHECK_OK(lm_linear_out(g_one, V(x), V(q), NULL, &p, V(o)));
    /* u8 without w_bits, w_bits 4 on i8, bad groups, missing / misshapen scales, bf16 x */
    lm_linear_params bad = p;
    bad.w_bits = 0, bad.w_group = 0;
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "w_bits") != NULL);
    bad = p, bad.w_scales = V(s8);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q8), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "u8") != NULL);
    static const int bad_g[] = {0, 16, 48, 256};
    for (int i = 0; i < 4; i++) {
        bad = p, bad.w_group = bad_g[i];
        LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
        LT_CHECK(strstr(lm_last_error(), "w_group") != NULL);
    }
    bad = p, bad.w_group = 128; /* K = 64 is not a multiple of 128 */
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
    bad = p, bad.w_scales = NULL;
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "w_scales") != NULL);
    bad = p, bad.w_scales = V(s_bad);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_SHAPE_MISMATCH);
    lm_tensor *s_f16 = lt_random_tensor(&r, LM_F16, 2, (int64_t[2]){N, K / 32}, 0.1); /* f32 or bf16 only */
    bad = p, bad.w_scales = V(s_f16);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q), NULL, &bad, V(o)), LM_DTYPE_MISMATCH);
    LT_CHECK_MSG(strstr(lm_last_error(), "f32 or bf16") != NULL, "%s", lm_last_error());
    lm_tensor_destroy(s_f16);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(xb), V(q), NULL, &p, V(o)), LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "int4") != NULL);
    bad = p, bad.w_bits = 3;
    LT_CHECK_STATUS(lm_linear_out(g_one, V(x), V(q8), NULL, &bad, V(o)), LM_INVALID_ARGUMENT);
    /* the x of the wrong width (K is twice q's columns) */
    lm_tensor *xh = lt_random_tensor(&r, LM_F32, 2, (int64_t[2]){M, K / 2}, 1.0);
    LT_CHECK_STATUS(lm_linear_out(g_one, V(xh), V(q), NULL, &p, V(o)), LM_SHAPE_MISMATCH);
    LT_CHECK(lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 896, LM_F32, LM_U8));
#ifdef LOOM_HAVE_CUDA
    LT_CHECK(lm_linear_supported(lm_device_cuda(0), LM_LINEAR_IN, 0, 1, 896, LM_F32, LM_U8)); /* gemv_quant.cu */
#else
    LT_CHECK(!lm_linear_supported(lm_device_cuda(0), LM_LINEAR_IN, 0, 1, 896, LM_F32, LM_U8)); /* no CUDA table */
#endif
    LT_CHECK(!lm_linear_supported(lm_device_cuda(0), LM_LINEAR_IN, 0, 1, 896, LM_BF16, LM_U8));
    lm_tensor *all[] = {q, sc, q8, s8, x, xb, o, s_bad, xh};
    for (int j = 0; j < 9; j++) lm_tensor_destroy(all[j]);
}

static void test_int4_scales_on_cuda(void) {
    lm_ctx *gpu = NULL;
    if (!lm_cuda_compiled() || lm_cuda_device_count() < 1 || lm_ctx_create(lm_device_cuda(0), 1, &gpu) != LM_OK) {
        printf("  (no CUDA device: the CUDA checks are not exercised)\n");
        lm_clear_error();
        return;
    }
    int64_t xs[2] = {1, 64}, ws[2] = {8, 32}, os[2] = {1, 8}, ss[2] = {8, 2};
    lm_tensor *x = NULL, *q = NULL, *o = NULL, *sc = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 2, xs, &x));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_U8, 2, ws, &q));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 2, os, &o));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F32, 2, ss, &sc));
    lm_linear_params p = params4(0, NULL, 0, V(sc), 32);
    /* CUDA runs quantized weights now (tests/cuda/test_cuda_linear_quant.c checks the values) */
    LT_CHECK_OK(lm_linear_out(gpu, V(x), V(q), NULL, &p, V(o)));
    LT_CHECK_OK(lm_ctx_synchronize(gpu));
    /* bf16 group scales too (the values: tests/cuda/test_cuda_linear_quant.c); f16 ones are refused, naming them */
    lm_tensor *s16 = NULL, *sh = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_BF16, 2, ss, &s16));
    lm_linear_params p16 = params4(0, NULL, 0, V(s16), 32);
    LT_CHECK_OK(lm_linear_out(gpu, V(x), V(q), NULL, &p16, V(o)));
    LT_CHECK_OK(lm_ctx_synchronize(gpu));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cuda(0), LM_F16, 2, ss, &sh));
    lm_linear_params ph = params4(0, NULL, 0, V(sh), 32);
    LT_CHECK_STATUS(lm_linear_out(gpu, V(x), V(q), NULL, &ph, V(o)), LM_DTYPE_MISMATCH);
    LT_CHECK_MSG(strstr(lm_last_error(), "f16") != NULL, "%s", lm_last_error());
    lm_tensor_destroy(s16), lm_tensor_destroy(sh);
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
    LT_RUN(test_quantize_known_groups);
    LT_RUN(test_quantize_random_any_group_dtype_and_strides);
    LT_RUN(test_quantize_refusals);
    LT_RUN(test_quantize_thread_count_invariant);
    LT_RUN(test_linear_int4_tuned_matches_reference);
    LT_RUN(test_linear_int4_bf16_scales_match_reference);
    LT_RUN(test_int4_product_tracks_float_weights);
    LT_RUN(test_int4_linear_errors);
    LT_RUN(test_int4_scales_on_cuda);
    lm_ctx_destroy(g_ref), lm_ctx_destroy(g_one), lm_ctx_destroy(g_two);
    return lt_finish();
}
