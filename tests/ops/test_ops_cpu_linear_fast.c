/* Tests for the fast-precision CPU GEMM (lm__cpu_linear_prec with LM_PRECISION_FAST:
 * x rounded to bf16, VDPBF16PS products, f32 sums; docs/QUANTIZATION.md "Fast
 * precision") on fresh random inputs, against the exact path and a float64 reference,
 * over shapes around the gemv/GEMM switch (M 8/9), the 64-wide panels, odd K (a padded
 * last pair), K blocks (> 256: the accumulate form the GEMM uses between K blocks),
 * N blocks (> 512) and padded rows; NaN-poisoned outputs (padding must stay NaN);
 * 1 vs 2 threads bit-identical; the thread's precision (what a model's forward sets);
 * on a CPU with AMX-BF16 every shape runs on both microkernels (tiles, then
 * LOOM_CPU_AMX=0);
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
 * int8 weights (lm__cpu_linear_i8_prec): the fast gemv quantizes each x row per block
 * of 64 k to int8 (d = max |x| / 127, nearest even) and sums exact int8 products:
 *  - emulation: y equals the float64 sum of d_b * (xq . q)_b (times the row scale, plus
 *    bias and accumulate) within f32 summation ((nb + 10) * 2^-24 of sum |d xq q|);
 *  - against exact: NMSE <= 1e-4 on normal random x (expected ~(2.4 / 127)^2 / 12 =
 *    3e-5: the rounding of x is uniform within d / 2 and max |x| of 64 normals ~ 2.4);
 *  - NaN or Inf in a block of x reaches the output; a zero row gives the bias; q = -128
 *    (which files may hold) is multiplied as -128; 1 vs 2 threads bit-identical; refused
 *    under the scalar ISA override. All of it for the gemv (M <= 8) and the GEMM
 *    (M > 8: the same quantized x against packed byte panels; partial 6 x 32 tiles, K
 *    blocks past 1,024, N blocks past 256, K tails), on every kernel set the CPU runs:
 *    AVX-512 VNNI (on a CPU with AMX-INT8: its GEMM on the tiles, then LOOM_CPU_AMX=0),
 *    the AMX GEMM with its tile instructions carried out in C (any AVX512_VNNI CPU; it
 *    must also be bit-identical to the VPDPBUSD GEMM), then the avx2 path with AVX-VNNI
 *    and with AVX2 alone (4 x 16 tiles).
 * int4 weights (lm__cpu_linear_i4_prec) the same way: groups of 32, 64 and 128, K = 32
 * mod 64 (a half block), the float64 emulation and NMSE <= 1e-4 against exact, gemv
 * and GEMM; the same scales given as bf16 give bit-identical outputs at both precisions
 * (read as bf16 by the gemv kernels and the GEMMs' packs).
 * The bf16 tests run where AVX512_BF16 is; skipped (exit 77, with a message) on a CPU
 * without AVX2.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"
#include "ops/cpu/matmul_kernels.h"
#include "ops/cpu/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const double k_u = 1.0 / 256.0; /* 2^-8 */
static lm_threadpool *g_pool2;
static double g_worst_nmse, g_worst_rel, g_worst_nmse_i8, g_worst_nmse_i4;
static lm__cpu_isa g_auto_isa; /* the path this CPU runs without an override */

typedef struct fast_shape {
    int64_t M, N, K, pad; /* pad: extra elements per row of x, W and y (NaN in x and W) */
} fast_shape;

static const fast_shape k_shapes[] = {
    {9, 1, 1, 0},      {9, 17, 2, 3},     {10, 64, 31, 0},   {13, 65, 33, 1},   {16, 130, 64, 2}, {37, 75, 250, 0},
    {12, 129, 257, 5}, {50, 200, 300, 0}, {7 * 6 + 1, 64, 511, 3}, {64, 600, 530, 1}, {130, 96, 1000, 0},
    {25, 1100, 48, 7}, {200, 16, 100, 0},  {9, 20, 4096, 1}, {33, 896, 896, 0},
    /* whole 32-row strips over several K blocks (AMX: C tiles loaded and stored in place),
     * a K tail of 5 pairs in the last block */
    {64, 128, 2090, 0}, {96, 192, 1500, 2},
    /* the gemv (M <= 8): K tails of every length mod 32, odd K, rows in groups of 4 */
    {1, 1, 1, 0},      {1, 33, 31, 0},    {2, 70, 90, 3},    {3, 17, 65, 2},    {4, 130, 257, 1}, {5, 40, 127, 0},
    {8, 64, 896, 0},   {1, 896, 4864, 0}, {1, 300, 129, 5},
};

static uint16_t *random_bf16(lt_rng *r, int64_t N, int64_t K, int64_t ld) {
    uint16_t *w = malloc(sizeof(uint16_t) * (size_t)(N * ld + 1));
    for (int64_t i = 0; i < N * ld; i++) w[i] = lm_f32_to_bf16(i % ld < K ? (float)lt_rng_normal(r) : NAN);
    return w;
}

/* One shape: fast on 1 and 2 threads, against the exact path and the two gates. */
static void run_shape(lt_rng *r, const fast_shape *s) {
    int64_t M = s->M, N = s->N, K = s->K, ld = K + s->pad, ldy = N + s->pad;
    uint16_t *w = random_bf16(r, N, K, ld);
    float *x = lt_random_rows(r, M, K, ld);
    float *y1 = lt_poisoned_rows(M, ldy), *y2 = lt_poisoned_rows(M, ldy), *ye = lt_poisoned_rows(M, ldy);
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

/* Every shape on the microkernel this CPU picks, and where that is the AMX one, again
 * on the AVX-512 one (LOOM_CPU_AMX=0). */
static void test_fast_linear_matches_bf16_rounded_reference_and_exact_within_gate(void) {
    int amx = lm__cpu_amx_bf16_active();
    for (int pass = 0; pass < (amx ? 2 : 1); pass++) {
        if (pass == 1) setenv("LOOM_CPU_AMX", "0", 1);
        LT_CHECK(lm__cpu_amx_bf16_active() == (amx && pass == 0));
        lt_rng r = lt_rng_seed(19);
        g_worst_nmse = g_worst_rel = 0;
        for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++) run_shape(&r, &k_shapes[i]);
        printf("  %s microkernel: NMSE vs exact up to %.2e (gate %.2e), |y - y64| / sum|x w| up to %.2e (gate "
               "~%.2e)\n", amx && pass == 0 ? "AMX" : "AVX512_BF16", g_worst_nmse, k_u * k_u, g_worst_rel, k_u);
    }
    unsetenv("LOOM_CPU_AMX");
    if (!amx) printf("  (no AMX-BF16 tiles here: the AMX microkernel is not tested on this CPU)\n");
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
            float *x = lt_random_rows(&r, M, K, K), *yf = lt_poisoned_rows(M, N), *ye = lt_poisoned_rows(M, N);
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
    float *x = lt_random_rows(&r, M, K, K);
    float *yt = lt_poisoned_rows(M, N), *yf = lt_poisoned_rows(M, N), *yd = lt_poisoned_rows(M, N);
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
    /* CUDA passes the device check (fast is fp8 weights' mode there; model load refuses
     * other weights: tests/cuda/test_cuda_linear_fp8_fast.c) */
    LT_CHECK_OK(lm_precision_check(lm_device_cuda(0), LM_PRECISION_FAST));
    LT_CHECK_STATUS(lm_precision_check(lm_device_cuda(0), (lm_precision)2), LM_INVALID_ARGUMENT);
}

/* ---- int8 and int4 weights ---- */
/* A quantized case's outputs: fast on 1 thread, fast on 2, exact; poisoned, or under
 * accumulate one shared random residual (padding NaN), which y0 keeps a copy of. */
typedef struct qouts {
    float *y1, *y2, *ye, *y0;
} qouts;

static qouts qouts_make(lt_rng *r, int64_t M, int64_t N, int64_t ldy, int acc) {
    qouts o = {lt_poisoned_rows(M, ldy), lt_poisoned_rows(M, ldy), lt_poisoned_rows(M, ldy), lt_poisoned_rows(M, ldy)};
    if (acc)
        for (int64_t i = 0; i < M * ldy; i++) o.y1[i] = o.y2[i] = o.ye[i] = i % ldy < N ? (float)lt_rng_normal(r) : NAN;
    memcpy(o.y0, o.y1, sizeof(float) * (size_t)(M * ldy));
    return o;
}

static void qouts_free(qouts *o) { free(o->y1), free(o->y2), free(o->ye), free(o->y0); }
static void i8_case(lt_rng *r, int64_t M, int64_t N, int64_t K, int pad, int bias, int acc, int special) {
    int64_t ldx = K + pad, ldq = K + pad, ldy = N + pad;
    int8_t *q = malloc((size_t)(N * ldq + 1));
    for (int64_t i = 0; i < N * ldq; i++) q[i] = (int8_t)lt_rng_int(r, -128, 127);
    float *sc = malloc(sizeof(float) * (size_t)N), *bs = malloc(sizeof(float) * (size_t)N);
    for (int64_t n = 0; n < N; n++) sc[n] = (float)(0.01 + 0.02 * lt_rng_uniform(r)), bs[n] = (float)lt_rng_normal(r);
    float *x = lt_random_rows(r, M, K, ldx);
    if (special && M > 1) { /* row 0 all zero; row 1 NaN in its last block */
        for (int64_t k = 0; k < K; k++) x[k] = 0.0f;
        x[ldx + K - 1] = NAN;
    }
    qouts o = qouts_make(r, M, N, ldy, acc);
    float *y1 = o.y1, *y2 = o.y2, *ye = o.ye, *y0 = o.y0;
    char what[128];
    snprintf(what, sizeof what, "int8 fast M=%lld N=%lld K=%lld pad=%d bias=%d acc=%d", (long long)M, (long long)N,
             (long long)K, pad, bias, acc);
    const float *b = bias ? bs : NULL;
    LT_CHECK_OK(lm__cpu_linear_i8_prec(NULL, LM_PRECISION_FAST, x, ldx, q, ldq, sc, b, acc, y1, ldy, M, N, K));
    LT_CHECK_OK(lm__cpu_linear_i8_prec(g_pool2, LM_PRECISION_FAST, x, ldx, q, ldq, sc, b, acc, y2, ldy, M, N, K));
    LT_CHECK_OK(lm__cpu_linear_i8_prec(g_pool2, LM_PRECISION_EXACT, x, ldx, q, ldq, sc, b, acc, ye, ldy, M, N, K));
    LT_CHECK_MSG(memcmp(y1, y2, sizeof(float) * (size_t)(M * ldy)) == 0, "%s: 1 and 2 threads differ", what);
    double sq = 0, sref = 0;
    int bad = 0;
    int64_t nb = (K + 63) / 64;
    for (int64_t m = 0; m < M && !bad; m++) {
        const float *xr = x + m * ldx;
        int8_t xq[64];
        double *d = malloc(sizeof(double) * (size_t)nb);
        int8_t *xqa = malloc((size_t)(nb * 64));
        for (int64_t bk = 0; bk < nb; bk++) { /* the specified quantization, in the kernel's float steps */
            float am = 0.0f;
            int finite = 1;
            for (int64_t k = bk * 64; k < LM_MIN(K, bk * 64 + 64); k++) {
                finite &= isfinite(xr[k]) != 0;
                am = fmaxf(am, fabsf(xr[k]));
            }
            float inv = am > 0 ? 127.0f / am : 0.0f;
            for (int i = 0; i < 64; i++) {
                int64_t k = bk * 64 + i;
                float v = k < K && finite && am > 0 ? rintf(xr[k] * inv) : 0.0f;
                xq[i] = (int8_t)(v > 127 ? 127 : v < -127 ? -127 : v);
            }
            memcpy(xqa + bk * 64, xq, 64);
            d[bk] = !finite ? NAN : am > 0 ? (double)(am / 127.0f) : 0.0;
        }
        for (int64_t n = 0; n < N && !bad; n++) {
            double emul = 0, mag = 0, exact = 0;
            for (int64_t bk = 0; bk < nb; bk++) {
                long s = 0;
                double sa = 0;
                for (int64_t k = bk * 64; k < LM_MIN(K, bk * 64 + 64); k++) {
                    s += (long)xqa[k] * q[n * ldq + k];
                    sa += fabs((double)xqa[k] * q[n * ldq + k]);
                }
                emul += d[bk] * (double)s, mag += fabs(d[bk]) * sa;
            }
            for (int64_t k = 0; k < K; k++) exact += (double)xr[k] * q[n * ldq + k];
            double add = (b ? bs[n] : 0.0) + (acc ? y0[m * ldy + n] : 0.0);
            double want = emul * sc[n] + add, got = y1[m * ldy + n], ex = exact * sc[n] + add;
            /* f32: a block's lanes times d into 4 accumulators, 64 lanes summed, the epilogue */
            double tol = ((double)nb + 10) * ldexp(1.0, -24) * (mag * sc[n] + fabs(add)) + 1e-30;
            if (isnan(want) ? !isnan(got) : !(fabs(got - want) <= tol)) {
                LT_CHECK_MSG(0, "%s: y[%lld, %lld] = %.9g, quantized-x reference %.9g (bound %.3g)", what, (long long)m,
                             (long long)n, got, want, tol);
                bad = 1;
            }
            if (!isnan(ex)) sq += (got - ex) * (got - ex), sref += (ex - add) * (ex - add);
        }
        for (int64_t n = N; n < ldy && !bad; n++)
            if (!isnan(y1[m * ldy + n])) {
                LT_CHECK_MSG(0, "%s: padding y[%lld, %lld] was written", what, (long long)m, (long long)n);
                bad = 1;
            }
        free(d), free(xqa);
    }
    double nmse = sq / (sref > 0 ? sref : 1);
    if (!special) LT_CHECK_MSG(nmse <= 1e-4, "%s: NMSE %.3g against exact > 1e-4", what, nmse);
    if (!special && M * N * K >= 100000 && nmse > g_worst_nmse_i8) g_worst_nmse_i8 = nmse;
    LT_CHECK_MSG(memcmp(y1, ye, sizeof(float) * (size_t)(M * ldy)) != 0 || K < 2, "%s: fast equals exact (did it run?)",
                 what);
    free(q), free(sc), free(bs), free(x);
    qouts_free(&o);
}

/* int4 (nibbles, group scales) at fast precision: the same x quantization, against the
 * float64 emulation and exact. */
static void i4_case(lt_rng *r, int64_t M, int64_t N, int64_t K, int group, int bias, int acc) {
    int64_t ldq = K / 2 + 3, lds = K / group + 1, ldx = K + 2, ldy = N + 1;
    uint8_t *q = malloc((size_t)(N * ldq));
    for (int64_t i = 0; i < N * ldq; i++) q[i] = (uint8_t)lt_rng_int(r, 0, 255); /* -8 .. 7 each */
    float *sc = malloc(sizeof(float) * (size_t)(N * lds)), *bs = malloc(sizeof(float) * (size_t)N);
    uint16_t *sc16 = malloc(sizeof(uint16_t) * (size_t)(N * lds)); /* the same scales as bf16 */
    for (int64_t i = 0; i < N * lds; i++) {
        sc16[i] = lm_f32_to_bf16((float)(0.05 + 0.1 * lt_rng_uniform(r)));
        sc[i] = lm_bf16_to_f32(sc16[i]);
    }
    for (int64_t n = 0; n < N; n++) bs[n] = (float)lt_rng_normal(r);
    float *x = lt_random_rows(r, M, K, ldx);
    qouts o = qouts_make(r, M, N, ldy, acc);
    float *y1 = o.y1, *y2 = o.y2, *ye = o.ye, *y0 = o.y0;
    const float *b = bias ? bs : NULL;
    char what[128];
    snprintf(what, sizeof what, "int4 fast M=%lld N=%lld K=%lld G=%d bias=%d acc=%d", (long long)M, (long long)N,
             (long long)K, group, bias, acc);
    LT_CHECK_OK(lm__cpu_linear_i4_prec(NULL, LM_PRECISION_FAST, x, ldx, q, ldq, sc, LM_F32, lds, group, b, acc, y1, ldy, M, N, K));
    LT_CHECK_OK(lm__cpu_linear_i4_prec(g_pool2, LM_PRECISION_FAST, x, ldx, q, ldq, sc, LM_F32, lds, group, b, acc, y2, ldy, M, N,
                                       K));
    LT_CHECK_OK(lm__cpu_linear_i4_prec(g_pool2, LM_PRECISION_EXACT, x, ldx, q, ldq, sc, LM_F32, lds, group, b, acc, ye, ldy, M, N,
                                       K));
    LT_CHECK_MSG(memcmp(y1, y2, sizeof(float) * (size_t)(M * ldy)) == 0, "%s: 1 and 2 threads differ", what);
    LT_CHECK_MSG(memcmp(y1, ye, sizeof(float) * (size_t)(M * ldy)) != 0, "%s: fast equals exact", what);
    /* bf16 group scales are widened exactly before any kernel reads them: both precisions
     * give the very bits of the f32 scales holding the same values */
    float *yb = malloc(sizeof(float) * (size_t)(M * ldy));
    for (int p = 0; p < 2; p++) {
        lm_precision prec = p ? LM_PRECISION_EXACT : LM_PRECISION_FAST;
        memcpy(yb, o.y0, sizeof(float) * (size_t)(M * ldy));
        LT_CHECK_OK(lm__cpu_linear_i4_prec(g_pool2, prec, x, ldx, q, ldq, sc16, LM_BF16, lds, group, b, acc, yb, ldy,
                                           M, N, K));
        LT_CHECK_MSG(memcmp(yb, p ? ye : y2, sizeof(float) * (size_t)(M * ldy)) == 0,
                     "%s: bf16 scales at %s precision differ from the same f32 scales", what, p ? "exact" : "fast");
    }
    free(yb);
    int64_t nb = (K + 63) / 64;
    double sq = 0, sref = 0;
    int bad = 0;
    for (int64_t m = 0; m < M && !bad; m++) {
        const float *xr = x + m * ldx;
        for (int64_t n = 0; n < N && !bad; n++) {
            double emul = 0, mag = 0, exact = 0;
            for (int64_t bk = 0; bk < nb; bk++) {
                int64_t k1 = LM_MIN(K, bk * 64 + 64);
                float am = 0.0f;
                for (int64_t k = bk * 64; k < k1; k++) am = fmaxf(am, fabsf(xr[k]));
                float inv = am > 0 ? 127.0f / am : 0.0f;
                double d = am > 0 ? (double)(am / 127.0f) : 0.0;
                for (int64_t k = bk * 64; k < k1; k++) {
                    float v = am > 0 ? rintf(xr[k] * inv) : 0.0f;
                    int xq = (int)(v > 127 ? 127 : v < -127 ? -127 : v);
                    int nib = (q[n * ldq + k / 2] >> ((k & 1) * 4)) & 15, qv = nib >= 8 ? nib - 16 : nib;
                    double t = d * sc[n * lds + k / group] * xq * qv;
                    emul += t, mag += fabs(t);
                }
            }
            for (int64_t k = 0; k < K; k++) {
                int nib = (q[n * ldq + k / 2] >> ((k & 1) * 4)) & 15, qv = nib >= 8 ? nib - 16 : nib;
                exact += (double)xr[k] * qv * sc[n * lds + k / group];
            }
            double add = (b ? bs[n] : 0.0) + (acc ? y0[m * ldy + n] : 0.0);
            double want = emul + add, got = y1[m * ldy + n], ex = exact + add;
            double tol = ((double)nb + 10) * ldexp(1.0, -24) * 2 * (mag + fabs(add)) + 1e-30;
            if (!(fabs(got - want) <= tol)) {
                LT_CHECK_MSG(0, "%s: y[%lld, %lld] = %.9g, quantized-x reference %.9g (bound %.3g)", what, (long long)m,
                             (long long)n, got, want, tol);
                bad = 1;
            }
            sq += (got - ex) * (got - ex), sref += exact * exact;
        }
        if (!isnan(y1[m * ldy + N])) {
            LT_CHECK_MSG(0, "%s: padding written", what);
            bad = 1;
        }
    }
    double nmse = sq / (sref > 0 ? sref : 1);
    LT_CHECK_MSG(nmse <= 1e-4, "%s: NMSE %.3g against exact > 1e-4", what, nmse);
    if (M * N * K >= 100000 && nmse > g_worst_nmse_i4) g_worst_nmse_i4 = nmse;
    free(q), free(sc), free(sc16), free(bs), free(x);
    qouts_free(&o);
}

static void test_fast_int4_gemv(void) {
    lt_rng r = lt_rng_seed(37);
    static const int64_t shapes[][4] = {{1, 5, 32, 32},   {1, 33, 96, 32},  {2, 17, 64, 64},   {3, 40, 160, 32},
                                        {4, 70, 256, 128}, {5, 64, 384, 64}, {8, 64, 896, 32},  {1, 896, 4864, 32},
                                        {7, 100, 1024, 128}, {1, 300, 896, 64}, {1, 70, 384, 128}, {1, 7, 1056, 32},
                                        /* the GEMM: partial tiles and panels, K = 32 mod 64, K blocks
                                         * (> 1024) ending off a group, N blocks (> 256) */
                                        {9, 5, 32, 32},   {10, 33, 96, 32},  {13, 31, 160, 32}, {17, 64, 384, 64},
                                        {25, 70, 1056, 32}, {40, 300, 1152, 64}, {9, 40, 1280, 128},
                                        {64, 96, 896, 32}, {130, 40, 256, 128}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int v = 0; v < 2; v++) i4_case(&r, shapes[i][0], shapes[i][1], shapes[i][2], (int)shapes[i][3], v, v);
    for (int i = 0; i < 8; i++) { /* random shapes, gemv (M 1-4) and GEMM: K a multiple of the group */
        int group = 32 << lt_rng_int(&r, 0, 2);
        i4_case(&r, i < 3 ? lt_rng_int(&r, 1, 4) : lt_rng_int(&r, 9, 80), lt_rng_int(&r, 1, 300),
                group * lt_rng_int(&r, 1, 1300 / group), group, i & 1, (i >> 1) & 1);
    }
    printf("  int4: observed NMSE vs exact up to %.2e (gate 1e-4)\n", g_worst_nmse_i4);
}

static void test_fast_int8_gemv(void) {
    lt_rng r = lt_rng_seed(31);
    static const int64_t shapes[][3] = {{1, 1, 1},    {1, 33, 63},  {1, 70, 64},    {2, 17, 65},   {3, 40, 127},
                                        {4, 130, 128}, {5, 64, 200}, {8, 64, 896},  {1, 896, 4864}, {7, 300, 1000},
                                        /* the GEMM: partial tiles and panels, K tails, K blocks (> 1024),
                                         * N blocks (> 256) */
                                        {9, 1, 1},    {10, 31, 63}, {13, 33, 65},  {16, 64, 128}, {25, 70, 200},
                                        {40, 300, 1000}, {9, 40, 1100}, {64, 96, 2100}, {130, 40, 896}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++)
        for (int v = 0; v < 2; v++)
            i8_case(&r, shapes[i][0], shapes[i][1], shapes[i][2], v ? 3 : 0, v, v, 0);
    for (int i = 0; i < 8; i++) /* random GEMM shapes: any M past the gemv, N past a panel, K past a block */
        i8_case(&r, lt_rng_int(&r, 9, 80), lt_rng_int(&r, 1, 300), lt_rng_int(&r, 1, 1300), (int)lt_rng_int(&r, 0, 3),
                i & 1, (i >> 1) & 1, 0);
    i8_case(&r, 3, 50, 130, 1, 1, 0, 1);  /* a zero row, a NaN */
    i8_case(&r, 20, 50, 130, 1, 1, 1, 1); /* the same through the GEMM */
    printf("  int8: observed NMSE vs exact up to %.2e (gate 1e-4)\n", g_worst_nmse_i8);
    int64_t N = 30, K = 100;
    int8_t *q = malloc((size_t)(N * K));
    for (int64_t i = 0; i < N * K; i++) q[i] = (int8_t)lt_rng_int(&r, -127, 127);
    float sc[30], *x = lt_random_rows(&r, 20, K, K); /* row 0 for the gemv; 20 rows for the GEMM */
    for (int i = 0; i < 30; i++) sc[i] = 0.01f;
    /* the thread's precision reaches lm__cpu_linear_i8 */
    float *yt = lt_poisoned_rows(1, N), *y1 = lt_poisoned_rows(1, N);
    LT_CHECK(lm__cpu_precision_set(LM_PRECISION_FAST) == LM_PRECISION_EXACT);
    LT_CHECK_OK(lm__cpu_linear_i8(NULL, x, K, q, K, sc, NULL, 0, yt, N, 1, N, K));
    lm__cpu_precision_set(LM_PRECISION_EXACT);
    LT_CHECK_OK(lm__cpu_linear_i8_prec(NULL, LM_PRECISION_FAST, x, K, q, K, sc, NULL, 0, y1, N, 1, N, K));
    LT_CHECK_MSG(memcmp(yt, y1, sizeof(float) * (size_t)N) == 0, "int8: thread precision fast != explicit fast");
    /* no silent exact run under an override that has no fast int8 kernels (scalar) */
    const lm__cpu_isa isa = lm__cpu_isa_active();
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_SCALAR));
    LT_CHECK_STATUS(lm__cpu_linear_i8_prec(NULL, LM_PRECISION_FAST, x, K, q, K, sc, NULL, 0, y1, N, 1, N, K),
                    LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "int8") != NULL, "message: %s", lm_last_error());
    float *yg = lt_poisoned_rows(20, N);
    LT_CHECK_STATUS(lm__cpu_linear_i8_prec(NULL, LM_PRECISION_FAST, x, K, q, K, sc, NULL, 0, yg, N, 20, N, K),
                    LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "int8") != NULL, "message: %s", lm_last_error());
    free(yg);
    LT_CHECK_OK(lm__cpu_set_isa_override(isa == g_auto_isa ? LM__CPU_ISA_AUTO : (int)isa));
    LT_CHECK_STATUS(lm__cpu_linear_i8_prec(NULL, (lm_precision)5, x, K, q, K, sc, NULL, 0, y1, N, 1, N, K),
                    LM_INVALID_ARGUMENT);
    free(q), free(x), free(yt), free(y1);
}

/* The int8 and int4 suites on one fast kernel set: the ISA path isa (AUTO: the CPU's
 * best), vnni 0 forcing the AVX2-only set on that path (LOOM_CPU_AVX_VNNI=0), amx 0
 * keeping the AVX-512 GEMM off the tiles (LOOM_CPU_AMX=0); force: a set run instead of
 * the CPU's choice (lm__cpu_i8fast_force: the AMX set's simulation). */
static void run_int_suites(int isa, int vnni, int amx, const lm__i8dot_kernels *force, const char *name) {
    printf("  fast int8 / int4 kernels: %s\n", name);
    LT_CHECK_OK(lm__cpu_set_isa_override(isa));
    if (!vnni) setenv("LOOM_CPU_AVX_VNNI", "0", 1);
    if (!amx) setenv("LOOM_CPU_AMX", "0", 1);
    lm__cpu_i8fast_force(force);
    g_worst_nmse_i8 = g_worst_nmse_i4 = 0;
    LT_RUN(test_fast_int8_gemv);
    LT_RUN(test_fast_int4_gemv);
    lm__cpu_i8fast_force(NULL);
    unsetenv("LOOM_CPU_AVX_VNNI");
    unsetenv("LOOM_CPU_AMX");
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
}

#ifdef LM__HAVE_X86_KERNELS
/* One GEMM shape through set (lm__cpu_i8fast_force): int8 when group is 0, else int4 with
 * that group; x, weights, scales, bias and the accumulated y from seed. y: M x (N + 1),
 * poisoned, then written. */
static void int_gemm_with(const lm__i8dot_kernels *set, uint64_t seed, int64_t M, int64_t N, int64_t K, int group,
                          float *y) {
    lt_rng r = lt_rng_seed(seed);
    int64_t ldy = N + 1, ldq = group ? K / 2 : K, lds = group ? K / group : 1;
    uint8_t *q = malloc((size_t)(N * ldq));
    for (int64_t i = 0; i < N * ldq; i++) q[i] = (uint8_t)lt_rng_int(&r, 0, 255);
    float *sc = malloc(sizeof(float) * (size_t)(N * lds)), *bs = malloc(sizeof(float) * (size_t)N);
    for (int64_t i = 0; i < N * lds; i++) sc[i] = (float)(0.01 + 0.1 * lt_rng_uniform(&r));
    for (int64_t n = 0; n < N; n++) bs[n] = (float)lt_rng_normal(&r);
    float *x = lt_random_rows(&r, M, K, K);
    for (int64_t i = 0; i < M * ldy; i++) y[i] = i % ldy < N ? (float)lt_rng_normal(&r) : NAN;
    lm__cpu_i8fast_force(set);
    if (group)
        LT_CHECK_OK(lm__cpu_linear_i4_prec(g_pool2, LM_PRECISION_FAST, x, K, q, ldq, sc, LM_F32, lds, group, bs, 1, y, ldy, M,
                                           N, K));
    else
        LT_CHECK_OK(lm__cpu_linear_i8_prec(g_pool2, LM_PRECISION_FAST, x, K, (const int8_t *)q, ldq, sc, bs, 1, y, ldy,
                                           M, N, K));
    lm__cpu_i8fast_force(NULL);
    free(q), free(sc), free(bs), free(x);
}

/* The AMX GEMM computes what the VPDPBUSD GEMM does: the same quantized x and panels,
 * the same exact int32 sum per unit, the same float steps, so every output is
 * bit-identical, on partial 32 x 32 tiles (rows 1-16, 17-31; columns 1-16, 17-31), K
 * blocks past 1,024, N blocks past 256, int8 and int4 groups of 64 and 128. int4 groups of
 * 32 (units of 32 k, which the AMX GEMM does not take) must be routed to the VPDPBUSD
 * GEMM; given to the tile code they would stop at its unit assertion. The simulation
 * everywhere; the tile unit too where the CPU has AMX-INT8. */
static void test_amx_gemm_bitwise_equals_vpdpbusd(void) {
    const lm__i8dot_kernels *sets[2] = {&lm__i8dot_kernels_amx_sim,
                                        lm__cpu_amx_int8_active() ? &lm__i8dot_kernels_amx : NULL};
    static const int64_t shapes[][4] = {{9, 5, 64, 0},       {17, 17, 200, 0},  {32, 32, 1024, 0}, {33, 48, 1100, 0},
                                        {70, 300, 2100, 0},  {100, 33, 130, 0}, {9, 5, 32, 32},    {20, 31, 96, 32},
                                        {40, 70, 1056, 32},  {33, 300, 1152, 64}, {64, 40, 1280, 128},
                                        {47, 100, 4864, 32}};
    for (int s = 0; s < 2; s++) {
        if (!sets[s]) continue;
        for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
            int64_t M = shapes[i][0], N = shapes[i][1], K = shapes[i][2];
            int group = (int)shapes[i][3];
            float *ya = lt_poisoned_rows(M, N + 1), *yb = lt_poisoned_rows(M, N + 1);
            int_gemm_with(&lm__i8dot_kernels_avx512, 100 + i, M, N, K, group, ya);
            int_gemm_with(sets[s], 100 + i, M, N, K, group, yb);
            LT_CHECK_MSG(memcmp(ya, yb, sizeof(float) * (size_t)(M * (N + 1))) == 0,
                         "%s M=%lld N=%lld K=%lld %s%d: the AMX GEMM differs from the VPDPBUSD one",
                         s ? "tiles" : "simulated tiles", (long long)M, (long long)N, (long long)K,
                         group ? "int4 G=" : "int8", group);
            free(ya), free(yb);
        }
    }
}
#endif

int main(void) {
    if (!lm__cpu_i8fast_supported())
        lt_skip("this CPU lacks AVX2 (or the build its x86 kernels): no fast kernels can run here; "
                "lm_precision_check refuses fast (tests/nn/test_nn_precision.c checks that refusal)");
    LT_CHECK_OK(lm_threadpool_create(2, &g_pool2));
    g_auto_isa = lm__cpu_isa_active();
    if (lm__cpu_bf16dot_supported()) {
        LT_RUN(test_fast_linear_matches_bf16_rounded_reference_and_exact_within_gate);
        LT_RUN(test_fast_leaves_other_dtypes_exact);
        LT_RUN(test_thread_precision_selects_the_kernels);
        LT_RUN(test_refusals_and_names);
    } else {
        printf("  (no AVX512_BF16: the fast bf16 GEMM is not tested here)\n");
    }
    /* every int8 / int4 set this CPU runs: AVX-512 VNNI, AVX-VNNI and AVX2 */
#ifdef LM__HAVE_X86_KERNELS
    if (lm__cpu_i8dot_supported()) {
        const int amx = lm__cpu_amx_int8_active();
        run_int_suites(LM__CPU_ISA_AUTO, 1, 1, NULL,
                       amx ? "avx512 (AVX512_VNNI gemv, GEMM on AMX-INT8 tiles)"
                           : "avx512 (AVX512_VNNI, gemv and packed GEMM)");
        if (amx) run_int_suites(LM__CPU_ISA_AUTO, 1, 0, NULL, "avx512 with LOOM_CPU_AMX=0 (VPDPBUSD GEMM)");
        else printf("  (no AMX-INT8 tiles here: the AMX GEMM runs in its simulation only)\n");
        run_int_suites(LM__CPU_ISA_AUTO, 1, 1, &lm__i8dot_kernels_amx_sim,
                       "avx512, the AMX GEMM with its tile instructions carried out in C");
        LT_RUN(test_amx_gemm_bitwise_equals_vpdpbusd);
    } else {
        printf("  (no AVX512_VNNI: the AVX-512 and AMX int8 kernels are not tested here)\n");
    }
#endif
    if (lm_cpu_get_features()->avx_vnni)
        run_int_suites(LM__CPU_ISA_AVX2, 1, 1, NULL, "avx2 path, AVX-VNNI (gemv and packed GEMM)");
    else printf("  (no AVX-VNNI: its int8 kernels are not tested here)\n");
    run_int_suites(LM__CPU_ISA_AVX2, 0, 1, NULL, "avx2 path, AVX2 only (gemv and packed GEMM)");
    lm_threadpool_destroy(g_pool2);
    return lt_finish();
}
