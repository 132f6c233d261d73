/* tests/ops/linear_quant_util.h — what the int8 and int4 linear tests share
 * (test_linear_int8.c, test_linear_int4.c): the direct quantizer (nearest integer by
 * exact distances, ties to even), padded NaN-poisoned views, and one (M, K, N) case of
 * lm_linear_out with quantized weights run on the tuned level for every input form x
 * bias x accumulate, every ISA this CPU runs and 1 and 2 threads (bit-identical)
 * against the reference level. Each including test defines g_ref, g_one, g_two (the
 * reference level and the tuned level with 1 and 2 threads) before including it.
 */
#ifndef LOOM_TESTS_LINEAR_QUANT_UTIL_H
#define LOOM_TESTS_LINEAR_QUANT_UTIL_H

#include "harness.h"
#include "ops/cpu/isa.h"

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define V(t) lm_tensor_as_view(t)

/* Gate, tuned vs the double reference, outputs O(1): the tuned path differs only by f32
 * rounding (q * scale rounded once per weight, the f32 dot product, the prologue). */
static const double k_nmse = 1e-10, k_abs = 2e-4;

/* The integer c in [-qmax, qmax] nearest to w / s, ties to even, found by comparing the
 * exact distances |w - c * s| of the candidates around the quotient (c * s is exact in
 * double, and so is the difference for every c that can win). */
static int direct_q(double w, double s, int qmax) {
    double c0 = floor(w / s);
    int best = 0;
    double bd = INFINITY;
    for (double c = c0 - 1; c <= c0 + 2; c++) {
        double d = fabs(w - c * s);
        if (d < bd || (d == bd && fmod(c, 2.0) == 0.0)) bd = d, best = (int)c;
    }
    return best > qmax ? qmax : best < -qmax ? -qmax : best;
}

/* max |v| / qmax as one f32 division (1 for all zeros, the smallest float if it rounds to 0). */
static float direct_scale(const double *v, int64_t n, int qmax) {
    float amax = 0.0f;
    for (int64_t k = 0; k < n; k++) amax = fmaxf(amax, (float)fabs(v[k]));
    if (amax == 0.0f) return 1.0f;
    float s = amax / (float)qmax;
    return s > 0.0f ? s : FLT_TRUE_MIN;
}

/* A [rows, cols] f32 view whose rows are cols + pad apart, over a tensor of NaN. */
static lm_tensor *padded(int64_t rows, int64_t cols, int64_t pad, lm_tensor_view *v) {
    int64_t sh[2] = {rows, cols + pad};
    lm_tensor *t = lt_poisoned_tensor(LM_F32, 2, sh);
    LT_CHECK_OK(lm_tensor_view_slice(V(t), 1, 0, cols, 1, v));
    return t;
}

static void fill_random(lt_rng *r, const lm_tensor_view *v) {
    for (int64_t m = 0; m < v->shape[0]; m++)
        for (int64_t k = 0; k < v->shape[1]; k++) ((float *)v->data)[m * v->stride[0] + k] = (float)lt_rng_normal(r);
}

/* 1 when every element of t outside the view v (its padding) is still NaN. */
static int padding_untouched(const lm_tensor *t, const lm_tensor_view *v) {
    const float *d = lm_tensor_data(t);
    int64_t ld = lm_tensor_dim(t, 1);
    for (int64_t m = 0; m < v->shape[0]; m++)
        for (int64_t c = v->shape[1]; c < ld; c++)
            if (!isnan(d[m * ld + c])) return 0;
    return 1;
}

typedef struct case_result {
    int64_t runs, fails;
    double worst_nmse, worst_abs;
} case_result;
static case_result g_res;

/* One (M, K, N) with quantized weights q: fmt carries w_scales, w_bits and w_group;
 * every form x bias x accumulate, tuned on every ISA and both thread counts against
 * the reference; tag names the format in failures. */
static void run_quant_case(lt_rng *r, const char *tag, int64_t M, int64_t K, int64_t N, int64_t pad,
                           const lm_tensor *q, const lm_linear_params *fmt) {
    int64_t bs[1] = {N}, ks[1] = {K};
    lm_tensor *bias = lt_random_tensor(r, LM_F32, 1, bs, 0.5), *nw = lt_random_tensor(r, LM_F32, 1, ks, 1.0);
    for (int form = 0; form < 3; form++)
        for (int variant = 0; variant < 4; variant++) {
            int has_bias = variant & 1, acc = variant >> 1;
            lm_tensor_view xv, ov, wantv;
            lm_tensor *xt = padded(M, form == LM_LINEAR_IN_SWIGLU ? 2 * K : K, pad, &xv);
            fill_random(r, &xv);
            lm_tensor *init = padded(M, N, 0, &ov);
            fill_random(r, &ov); /* accumulate's starting residual */
            lm_tensor *want = padded(M, N, pad, &wantv);
            if (acc) LT_CHECK_OK(lm_tensor_view_copy(g_ref, &wantv, &ov));
            lm_linear_params p = *fmt;
            p.input = (lm_linear_input)form, p.norm_weight = V(nw), p.eps = 1e-5f, p.accumulate = acc;
            const lm_tensor_view *b = has_bias ? V(bias) : NULL;
            LT_CHECK_OK(lm_linear_out(g_ref, &xv, V(q), b, &p, &wantv));
            double *w64 = lt_view_to_f64(&wantv);
            float *first = NULL;
            for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
                if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) continue;
                LT_CHECK_OK(lm__cpu_set_isa_override(isa));
                for (int th = 0; th < 2; th++) {
                    lm_tensor_view gv;
                    lm_tensor *got = padded(M, N, pad, &gv);
                    if (acc) LT_CHECK_OK(lm_tensor_view_copy(g_ref, &gv, &ov));
                    char what[192];
                    snprintf(what, sizeof what, "%s %s %d thread(s) M=%lld K=%lld N=%lld form %d bias %d acc %d pad %lld",
                             tag, lm__cpu_isa_name((lm__cpu_isa)isa), th + 1, (long long)M, (long long)K, (long long)N,
                             form, has_bias, acc, (long long)pad);
                    LT_CHECK_OK(lm_linear_out(th ? g_two : g_one, &xv, V(q), b, &p, &gv));
                    double *g64 = lt_view_to_f64(&gv);
                    lt_metrics mt = lt_measure(g64, w64, M * N);
                    g_res.runs++;
                    if (mt.nmse > g_res.worst_nmse) g_res.worst_nmse = mt.nmse;
                    if (mt.max_abs > g_res.worst_abs) g_res.worst_abs = mt.max_abs;
                    if (!lt_check_close(what, g64, w64, M * N, k_nmse, k_abs)) g_res.fails++;
                    LT_CHECK_MSG(padding_untouched(got, &gv), "%s: padding of out was written", what);
                    float *d = lm_tensor_data(got);
                    size_t bytes = sizeof(float) * (size_t)(M * (N + pad));
                    if (th == 0) first = memcpy(malloc(bytes), d, bytes);
                    else LT_CHECK_MSG(memcmp(first, d, bytes) == 0, "%s: 1 and 2 threads differ", what);
                    if (th) free(first), first = NULL;
                    free(g64);
                    lm_tensor_destroy(got);
                }
            }
            LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
            free(w64);
            lm_tensor_destroy(xt), lm_tensor_destroy(init), lm_tensor_destroy(want);
        }
    lm_tensor_destroy(bias), lm_tensor_destroy(nw);
}

#endif
