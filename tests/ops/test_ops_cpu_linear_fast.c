/* Tests for the fast-precision CPU GEMM (lm__cpu_linear_prec with LM_PRECISION_FAST:
 * x rounded to bf16, VDPBF16PS products, f32 sums; docs/QUANTIZATION.md "Fast
 * precision") on fresh random inputs, against the exact path and a float64 reference,
 * over shapes around the gemv/GEMM switch (M 8/9), the 64-wide panels, odd K (a padded
 * last pair), K blocks (> 256: the accumulate form the GEMM uses between K blocks),
 * N blocks (> 512) and padded rows; NaN-poisoned outputs (padding must stay NaN);
 * 1 vs 2 threads bit-identical; the thread's precision (what a model's forward sets);
 * what stays exact (the gemv, f32/f16 weights) and what is refused.
 *
 * Gates, with u = 2^-8 the unit roundoff of bf16 (8 significant bits, round to nearest
 * even: |bf16(x) - x| <= u |x|) and g = K * 2^-24 (f32 summation of K terms, any order):
 *  - emulation: |y - sum_k bf16(x_k) w_k| <= g * sum_k |bf16(x_k) w_k| (float64 sum of
 *    the rounded x): the kernel is exactly "round x once, exact products, f32 sums";
 *  - against exact: |y - sum_k x_k w_k| <= (u + g + u g) * sum_k |x_k w_k| per element
 *    (max-abs, rigorous), and NMSE sum((y-y64)^2)/sum(y64^2) <= u^2 = 1.5e-5: the
 *    error is sum_k d_k x_k w_k with independent relative roundings |d_k| <= u, so its
 *    expected square is E[d^2] sum_k (x_k w_k)^2 against E[y^2] = sum_k (x_k w_k)^2 for
 *    independent zero-mean terms: NMSE ~ E[d^2] <= u^2 (exactly bounded for K = 1).
 *    For random mantissas E[d^2] = (u^2 / 3) E[1/m^2] (m in [1, 2), log-uniform) = 0.18 u^2
 *    = 2.8e-6, which is what large shapes show (printed below). A wrong rounding mode
 *    (truncation) fails the emulation gate; a dropped or mispaired k fails both.
 * Skipped (exit 77, with a message) on a CPU without AVX512_BF16.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double k_u = 1.0 / 256.0; /* 2^-8 */
static lm_threadpool *g_pool2;
static double g_worst_nmse, g_worst_rel;

typedef struct fast_shape {
    int64_t M, N, K, pad; /* pad: extra elements per row of x, W and y (NaN in x and W) */
} fast_shape;

static const fast_shape k_shapes[] = {
    {9, 1, 1, 0},      {9, 17, 2, 3},     {10, 64, 31, 0},   {13, 65, 33, 1},   {16, 130, 64, 2}, {37, 75, 250, 0},
    {12, 129, 257, 5}, {50, 200, 300, 0}, {7 * 6 + 1, 64, 511, 3}, {64, 600, 530, 1}, {130, 96, 1000, 0},
    {25, 1100, 48, 7}, {200, 16, 100, 0},  {9, 20, 4096, 1}, {33, 896, 896, 0},
    /* the gemv (M <= 8): K tails of every length mod 32, odd K, rows in groups of 4 */
    {1, 1, 1, 0},      {1, 33, 31, 0},    {2, 70, 90, 3},    {3, 17, 65, 2},    {4, 130, 257, 1}, {5, 40, 127, 0},
    {8, 64, 896, 0},   {1, 896, 4864, 0}, {1, 300, 129, 5},
};

static uint16_t *random_bf16(lt_rng *r, int64_t N, int64_t K, int64_t ld) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(N * ld + 1));
    for (int64_t i = 0; i < N * ld; i++) w[i] = lm_f32_to_bf16(i % ld < K ? (float)lt_rng_normal(r) : NAN);
    return w;
}

static float *random_rows(lt_rng *r, int64_t M, int64_t K, int64_t ld) {
    float *x = malloc(sizeof(float) * (size_t)(M * ld + 1));
    for (int64_t i = 0; i < M * ld; i++) x[i] = i % ld < K ? (float)lt_rng_normal(r) : NAN;
    return x;
}

static float *poisoned(int64_t M, int64_t ld) {
    float *y = malloc(sizeof(float) * (size_t)(M * ld + 1));
    for (int64_t i = 0; i < M * ld + 1; i++) y[i] = NAN;
    return y;
}

/* One shape: fast on 1 and 2 threads, against the exact path and the two gates. */
static void run_shape(lt_rng *r, const fast_shape *s) {
    int64_t M = s->M, N = s->N, K = s->K, ld = K + s->pad, ldy = N + s->pad;
    uint16_t *w = random_bf16(r, N, K, ld);
    float *x = random_rows(r, M, K, ld);
    float *y1 = poisoned(M, ldy), *y2 = poisoned(M, ldy), *ye = poisoned(M, ldy);
    char what[128];
    snprintf(what, sizeof what, "fast M=%lld N=%lld K=%lld pad=%lld", (long long)M, (long long)N, (long long)K,
             (long long)s->pad);
    LT_CHECK_OK(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, x, ld, w, LM_BF16, ld, y1, ldy, M, N, K));
    LT_CHECK_OK(lm__cpu_linear_prec(g_pool2, LM_PRECISION_FAST, x, ld, w, LM_BF16, ld, y2, ldy, M, N, K));
    LT_CHECK_OK(lm__cpu_linear_prec(g_pool2, LM_PRECISION_EXACT, x, ld, w, LM_BF16, ld, ye, ldy, M, N, K));
    LT_CHECK_MSG(memcmp(y1, y2, sizeof(float) * (size_t)(M * ldy)) == 0, "%s: 1 and 2 threads differ", what);
    double sq = 0, sref = 0, worst = 0;
    int bad = 0;
    for (int64_t m = 0; m < M && !bad; m++) {
        for (int64_t n = 0; n < N && !bad; n++) {
            double exact = 0, emul = 0, mag = 0, mag_b = 0;
            for (int64_t k = 0; k < K; k++) {
                double wk = lm_bf16_to_f32(w[n * ld + k]), xk = x[m * ld + k];
                double xb = lm_bf16_to_f32(lm_f32_to_bf16(x[m * ld + k])); /* round to nearest even */
                exact += xk * wk, emul += xb * wk, mag += fabs(xk * wk), mag_b += fabs(xb * wk);
            }
            double got = y1[m * ldy + n], g = (double)K * ldexp(1.0, -24);
            double tol_emul = g * mag_b + 1e-30, tol_exact = (k_u + g + k_u * g) * mag + 1e-30;
            if (!(fabs(got - emul) <= tol_emul)) {
                LT_CHECK_MSG(0, "%s: y[%lld, %lld] = %.9g, bf16(x) @ W = %.9g (f32 summation bound %.3g)", what,
                             (long long)m, (long long)n, got, emul, tol_emul);
                bad = 1;
            }
            if (!(fabs(got - exact) <= tol_exact)) {
                LT_CHECK_MSG(0, "%s: y[%lld, %lld] = %.9g, x @ W = %.9g (bound %.3g)", what, (long long)m,
                             (long long)n, got, exact, tol_exact);
                bad = 1;
            }
            sq += (got - exact) * (got - exact), sref += exact * exact;
            if (fabs(got - exact) / (mag + 1e-30) > worst) worst = fabs(got - exact) / (mag + 1e-30);
        }
        for (int64_t n = N; n < ldy; n++)
            if (!isnan(y1[m * ldy + n]) && !bad) {
                LT_CHECK_MSG(0, "%s: padding y[%lld, %lld] was written", what, (long long)m, (long long)n);
                bad = 1;
            }
    }
    double nmse = sq / (sref > 0 ? sref : 1);
    LT_CHECK_MSG(nmse <= k_u * k_u, "%s: NMSE %.3g against exact > u^2 = %.3g", what, nmse, k_u * k_u);
    if (M * N * K >= 100000 && nmse > g_worst_nmse) g_worst_nmse = nmse; /* enough terms for a mean */
    if (worst > g_worst_rel) g_worst_rel = worst;
    /* the exact path is untouched by the mode: its own gate is test_ops_cpu_linear's */
    LT_CHECK_MSG(memcmp(y1, ye, sizeof(float) * (size_t)(M * ldy)) != 0 || K < 2, "%s: fast equals exact bit for bit "
                 "(did the fast kernels run?)", what);
    free(w), free(x), free(y1), free(y2), free(ye);
}

static void test_fast_linear_matches_bf16_rounded_reference_and_exact_within_gate(void) {
    lt_rng r = lt_rng_seed(19);
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++) run_shape(&r, &k_shapes[i]);
    printf("  observed: NMSE vs exact up to %.2e (gate %.2e), |y - y64| / sum|x w| up to %.2e (gate ~%.2e)\n",
           g_worst_nmse, k_u * k_u, g_worst_rel, k_u);
}

/* f32 and f16 weights, K == 0 and empty sizes do not change with the mode (bf16
 * weights, gemv and GEMM: above). */
static void test_fast_leaves_other_dtypes_exact(void) {
    lt_rng r = lt_rng_seed(23);
    const lm_dtype dts[] = {LM_F32, LM_F16};
    for (int d = 0; d < 2; d++)
        for (int64_t M = 1; M <= 20; M += 7) {
            int64_t N = 70, K = 90;
            size_t es = dts[d] == LM_F32 ? 4 : 2;
            char *w = malloc(es * (size_t)(N * K));
            for (int64_t i = 0; i < N * K; i++) {
                float v = (float)lt_rng_normal(&r);
                if (dts[d] == LM_F32) ((float *)w)[i] = v;
                else ((uint16_t *)w)[i] = dts[d] == LM_F16 ? lm_f32_to_f16(v) : lm_f32_to_bf16(v);
            }
            float *x = random_rows(&r, M, K, K), *yf = poisoned(M, N), *ye = poisoned(M, N);
            LT_CHECK_OK(lm__cpu_linear_prec(g_pool2, LM_PRECISION_FAST, x, K, w, dts[d], K, yf, N, M, N, K));
            LT_CHECK_OK(lm__cpu_linear_prec(g_pool2, LM_PRECISION_EXACT, x, K, w, dts[d], K, ye, N, M, N, K));
            LT_CHECK_MSG(memcmp(yf, ye, sizeof(float) * (size_t)(M * N)) == 0, "w=%s M=%lld: fast differs from exact",
                         lm_dtype_name(dts[d]), (long long)M);
            free(w), free(x), free(yf), free(ye);
        }
    float y[4] = {NAN, NAN, NAN, NAN};
    uint16_t w[4] = {0};
    LT_CHECK_OK(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, NULL, 0, w, LM_BF16, 0, y, 2, 20, 0, 0)); /* N == 0 */
    LT_CHECK_OK(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, y, 0, w, LM_BF16, 0, y, 2, 2, 2, 0));    /* K == 0 */
    LT_CHECK(y[0] == 0 && y[1] == 0 && y[2] == 0 && y[3] == 0);
}

/* lm__cpu_linear follows the calling thread's precision (what nn/step.c sets around a
 * fast model's forward pass); the default is exact, and setting returns the previous. */
static void test_thread_precision_selects_the_kernels(void) {
    lt_rng r = lt_rng_seed(29);
    int64_t M = 20, N = 100, K = 300;
    uint16_t *w = random_bf16(&r, N, K, K);
    float *x = random_rows(&r, M, K, K), *yt = poisoned(M, N), *yf = poisoned(M, N), *yd = poisoned(M, N);
    LT_CHECK(lm__cpu_precision() == LM_PRECISION_EXACT);
    LT_CHECK(lm__cpu_precision_set(LM_PRECISION_FAST) == LM_PRECISION_EXACT);
    LT_CHECK_OK(lm__cpu_linear(g_pool2, x, K, w, LM_BF16, K, yt, N, M, N, K));
    LT_CHECK(lm__cpu_precision_set(LM_PRECISION_EXACT) == LM_PRECISION_FAST);
    LT_CHECK_OK(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, x, K, w, LM_BF16, K, yf, N, M, N, K));
    LT_CHECK_OK(lm__cpu_linear(g_pool2, x, K, w, LM_BF16, K, yd, N, M, N, K));
    LT_CHECK_MSG(memcmp(yt, yf, sizeof(float) * (size_t)(M * N)) == 0, "thread precision fast != explicit fast");
    LT_CHECK_MSG(memcmp(yd, yf, sizeof(float) * (size_t)(M * N)) != 0, "the default (exact) ran the fast kernels");
    free(w), free(x), free(yt), free(yf), free(yd);
}

/* No silent fallback: fast under an ISA override below avx512 is LM_UNSUPPORTED; bad
 * precision values are LM_INVALID_ARGUMENT; the public names and check. */
static void test_refusals_and_names(void) {
    float x[40 * 4] = {0}, y[40 * 4];
    uint16_t w[4 * 4] = {0};
    if (lm__cpu_isa_supported(LM__CPU_ISA_AVX2)) {
        LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AVX2));
        LT_CHECK_STATUS(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, x, 4, w, LM_BF16, 4, y, 4, 40, 4, 4),
                        LM_UNSUPPORTED);
        LT_CHECK_MSG(strstr(lm_last_error(), "avx2") != NULL, "message: %s", lm_last_error());
        LT_CHECK_STATUS(lm__cpu_linear_prec(NULL, LM_PRECISION_FAST, x, 4, w, LM_BF16, 4, y, 4, 4, 4, 4),
                        LM_UNSUPPORTED); /* the gemv too */
        LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    }
    LT_CHECK_STATUS(lm__cpu_linear_prec(NULL, (lm_precision)7, x, 4, w, LM_BF16, 4, y, 4, 40, 4, 4),
                    LM_INVALID_ARGUMENT);
    lm_precision p = LM_PRECISION_EXACT;
    LT_CHECK_OK(lm_precision_parse("fast", &p));
    LT_CHECK(p == LM_PRECISION_FAST);
    LT_CHECK_OK(lm_precision_parse("exact", &p));
    LT_CHECK(p == LM_PRECISION_EXACT);
    LT_CHECK_STATUS(lm_precision_parse("Fast", &p), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "'Fast'") != NULL, "message: %s", lm_last_error());
    LT_CHECK(strcmp(lm_precision_name(LM_PRECISION_FAST), "fast") == 0);
    LT_CHECK(strcmp(lm_precision_name((lm_precision)9), "invalid") == 0);
    LT_CHECK_OK(lm_precision_check(lm_device_cpu(), LM_PRECISION_FAST));
    LT_CHECK_OK(lm_precision_check(lm_device_cpu(), LM_PRECISION_EXACT));
    LT_CHECK_STATUS(lm_precision_check(lm_device_cpu(), (lm_precision)2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_precision_check(lm_device_cuda(0), LM_PRECISION_FAST), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "CUDA") != NULL, "message: %s", lm_last_error());
}

int main(void) {
    if (!lm__cpu_bf16dot_supported())
        lt_skip("this CPU lacks AVX512_BF16 (or AVX-512 F/BW/VL): the fast-precision GEMM cannot run here; "
                "lm_precision_check refuses it (tests/nn/test_nn_precision.c checks that refusal)");
    LT_CHECK_OK(lm_threadpool_create(2, &g_pool2));
    LT_RUN(test_fast_linear_matches_bf16_rounded_reference_and_exact_within_gate);
    LT_RUN(test_fast_leaves_other_dtypes_exact);
    LT_RUN(test_thread_precision_selects_the_kernels);
    LT_RUN(test_refusals_and_names);
    lm_threadpool_destroy(g_pool2);
    return lt_finish();
}
