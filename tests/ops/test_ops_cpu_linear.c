/* Tests for the tuned CPU linear layer lm__cpu_linear (y = x @ W^T, W [N, K]) on every
 * instruction-set path this CPU runs (scalar, AVX2, AVX-512) x every weight dtype x
 * shapes around the vector widths, the gemv/GEMM switch and the cache blocks, with
 * strided rows, 1 vs 2 threads (results must be bit-identical), NaN-poisoned outputs
 * whose padding must stay untouched, PyTorch fixtures, the view predicate, argument
 * errors and allocation failure.
 *
 * Gate: weights widen exactly and x stays f32, so the only error is f32 summation.
 * Every element must satisfy |y - y64| <= K * 2^-24 * sum_k |x_k w_k| (Higham's
 * gamma_K bound for a K-term f32 dot product in any summation order) and the whole
 * output NMSE <= 1e-10 against the float64 loop (observed ~1e-14 at K <= 4096).
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/matmul.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const lm_dtype k_wdtypes[] = {LM_F32, LM_BF16, LM_F16};
static const double k_nmse_gate = 1e-10;

/* A weight matrix stored in dtype (rows ldw apart) plus its exact float64 values. */
typedef struct wmat {
    void *data;  /* [N, ldw] elements of dtype */
    double *f64; /* [N, K] the same values */
} wmat;

/* Row padding (elements K .. ld-1) holds NaN: a kernel reading past K poisons y. */
static wmat random_weights(lt_rng *r, lm_dtype dt, int64_t N, int64_t K, int64_t ldw) {
    wmat w = {malloc(4 * (size_t)(N * ldw + 1)), malloc(sizeof(double) * (size_t)(N * K + 1))};
    for (int64_t n = 0; n < N; n++)
        for (int64_t k = 0; k < ldw; k++) {
            float v = k < K ? (float)lt_rng_normal(r) : NAN;
            int64_t i = n * ldw + k;
            if (dt == LM_F32) ((float *)w.data)[i] = v;
            else if (dt == LM_BF16) v = lm_bf16_to_f32(((uint16_t *)w.data)[i] = lm_f32_to_bf16(v));
            else v = lm_f16_to_f32(((uint16_t *)w.data)[i] = lm_f32_to_f16(v));
            if (k < K) w.f64[n * K + k] = v;
        }
    return w;
}



/* want = x @ W^T in float64 and the per-element summation error bound. */
static void reference(const float *x, int64_t ldx, const double *w64, int64_t M, int64_t N, int64_t K, double *want,
                      double *bound) {
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = 0; n < N; n++) {
            double acc = 0, mag = 0;
            for (int64_t k = 0; k < K; k++) {
                double p = (double)x[m * ldx + k] * w64[n * K + k];
                acc += p;
                mag += fabs(p);
            }
            want[m * N + n] = acc;
            bound[m * N + n] = (double)K * ldexp(1.0, -24) * mag + 1e-30;
        }
}

/* Checks y (rows ldy apart) against the reference and that padding columns still hold
 * the poison. Returns 1 when everything passed. */
static int check_result(const char *what, const float *y, int64_t ldy, const double *want, const double *bound,
                        int64_t M, int64_t N) {
    double *got = malloc(sizeof(double) * (size_t)(M * N + 1));
    int ok = 1;
    for (int64_t m = 0; m < M; m++) {
        for (int64_t n = 0; n < N; n++) {
            got[m * N + n] = y[m * ldy + n];
            if (!(fabs(got[m * N + n] - want[m * N + n]) <= bound[m * N + n]) && ok) {
                LT_CHECK_MSG(0, "%s: y[%lld, %lld] = %.9g, want %.9g (bound %.3g)", what, (long long)m, (long long)n,
                             got[m * N + n], want[m * N + n], bound[m * N + n]);
                ok = 0;
            }
        }
        for (int64_t n = N; n < ldy; n++)
            if (!isnan(y[m * ldy + n]) && ok) {
                LT_CHECK_MSG(0, "%s: padding y[%lld, %lld] was written", what, (long long)m, (long long)n);
                ok = 0;
            }
    }
    ok &= lt_check_close(what, got, want, M * N, k_nmse_gate, INFINITY);
    free(got);
    return ok;
}

typedef struct lin_shape {
    int64_t M, N, K, pad; /* pad: extra elements per row of x, W and y */
} lin_shape;

/* Around the vector widths (8/16), panels (8/16/64), gemv/GEMM switch (M 4..9), K
 * blocks (> 256, up to K = 4096), N blocks (> 512 columns) and the M split (narrow N);
 * the gemv at M 1..8 with K multiples of 32 (the widths of whole 64-byte bf16 rows). */
static const lin_shape k_shapes[] = {
    {1, 1, 1, 0},     {1, 17, 1, 3},     {1, 37, 33, 0},   {1, 200, 300, 5},  {1, 700, 200, 1}, {2, 45, 70, 0},
    {3, 64, 64, 2},   {4, 7, 129, 0},    {4, 1000, 90, 4}, {5, 70, 31, 1},    {6, 33, 17, 0},   {7, 130, 260, 3},
    {8, 65, 16, 0},   {9, 129, 47, 2},   {13, 300, 530, 1}, {37, 75, 250, 0}, {20, 1100, 24, 7}, {50, 16, 100, 0},
    {64, 1, 5, 2},    {1, 3, 1000, 0},   {3, 40, 4096, 0}, {9, 20, 4096, 1},
    {1, 50, 96, 1},   {2, 33, 896, 0},   {4, 20, 128, 3},  {5, 9, 32, 0},     {8, 11, 64, 2},
};

static lm_threadpool *g_pool2;

static void run_shape_all_paths(lt_rng *r, const lin_shape *s, lm_dtype dt) {
    int64_t M = s->M, N = s->N, K = s->K, ldx = K + s->pad, ldw = K + s->pad, ldy = N + s->pad;
    wmat w = random_weights(r, dt, N, K, ldw);
    float *x = lt_random_rows(r, M, K, ldx);
    double *want = malloc(sizeof(double) * (size_t)(M * N)), *bound = malloc(sizeof(double) * (size_t)(M * N));
    reference(x, ldx, w.f64, M, N, K, want, bound);
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
        if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) continue;
        LT_CHECK_OK(lm__cpu_set_isa_override(isa));
        float *y1 = lt_poisoned_rows(M, ldy), *y2 = lt_poisoned_rows(M, ldy);
        char what[128];
        snprintf(what, sizeof what, "%s w=%s M=%lld N=%lld K=%lld pad=%lld", lm__cpu_isa_name((lm__cpu_isa)isa),
                 lm_dtype_name(dt), (long long)M, (long long)N, (long long)K, (long long)s->pad);
        LT_CHECK_OK(lm__cpu_linear(NULL, x, ldx, w.data, dt, ldw, y1, ldy, M, N, K));
        LT_CHECK_OK(lm__cpu_linear(g_pool2, x, ldx, w.data, dt, ldw, y2, ldy, M, N, K));
        check_result(what, y1, ldy, want, bound, M, N);
        LT_CHECK_MSG(memcmp(y1, y2, sizeof(float) * (size_t)(M * ldy)) == 0, "%s: 1 and 2 threads differ", what);
        free(y1), free(y2);
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    free(w.data), free(w.f64), free(x), free(want), free(bound);
}

static void test_linear_matches_f64_on_every_path_dtype_and_shape(void) {
    lt_rng r = lt_rng_seed(11);
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++)
        if (!lm__cpu_isa_supported((lm__cpu_isa)isa))
            printf("  note: the %s path is not supported on this CPU; not tested here\n",
                   lm__cpu_isa_name((lm__cpu_isa)isa));
    for (size_t i = 0; i < sizeof k_shapes / sizeof k_shapes[0]; i++)
        for (int d = 0; d < 3; d++) run_shape_all_paths(&r, &k_shapes[i], k_wdtypes[d]);
}

static void test_linear_matches_pytorch_fixtures(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/cpu_linear.lmfx", &fx)) return;
    static const char *const cases[] = {"f32", "bf16", "f16", "decode_bf16"};
    static const lm_dtype dts[] = {LM_F32, LM_BF16, LM_F16, LM_BF16};
    for (int c = 0; c < 4; c++) {
        char name[64];
        snprintf(name, sizeof name, "%s_x", cases[c]);
        const lt_fixture_tensor *tx = lt_fixture_get(&fx, name);
        snprintf(name, sizeof name, "%s_w", cases[c]);
        const lt_fixture_tensor *tw = lt_fixture_get(&fx, name);
        snprintf(name, sizeof name, "%s_y32", cases[c]);
        const lt_fixture_tensor *t32 = lt_fixture_get(&fx, name);
        snprintf(name, sizeof name, "%s_y64", cases[c]);
        const lt_fixture_tensor *t64 = lt_fixture_get(&fx, name);
        if (!tx || !tw || !t32 || !t64) continue;
        int64_t M = tx->shape[0], K = tx->shape[1], N = tw->shape[0];
        lm_tensor *x = lt_fixture_tensor_to(tx, LM_F32), *w = lt_fixture_tensor_to(tw, dts[c]);
        for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
            if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) continue;
            LT_CHECK_OK(lm__cpu_set_isa_override(isa));
            float *y = lt_poisoned_rows(M, N);
            LT_CHECK_OK(lm__cpu_linear(g_pool2, lm_tensor_data(x), K, lm_tensor_data(w), dts[c], K, y, N, M, N, K));
            double *got = malloc(sizeof(double) * (size_t)(M * N));
            for (int64_t i = 0; i < M * N; i++) got[i] = y[i];
            snprintf(name, sizeof name, "%s %s vs torch f64", lm__cpu_isa_name((lm__cpu_isa)isa), cases[c]);
            lt_check_close(name, got, t64->f64, M * N, k_nmse_gate, 1e-5);
            /* Two f32 sums of K <= 130 products in different orders: ~1e-7 relative apart. */
            snprintf(name, sizeof name, "%s %s vs torch f32 forward", lm__cpu_isa_name((lm__cpu_isa)isa), cases[c]);
            lt_check_close(name, got, t32->f64, M * N, 1e-12, 2e-6);
            free(got), free(y);
        }
        lm_tensor_destroy(x), lm_tensor_destroy(w);
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    lt_fixture_free(&fx);
}

static void test_linear_k_zero_writes_zeros_and_empty_sizes_write_nothing(void) {
    float x[4] = {1, 2, 3, 4};
    uint16_t w[4] = {0x3f80, 0x3f80, 0x3f80, 0x3f80};
    float *y = lt_poisoned_rows(3, 5);
    LT_CHECK_OK(lm__cpu_linear(g_pool2, NULL, 0, NULL, LM_BF16, 0, y, 5, 3, 4, 0));
    for (int m = 0; m < 3; m++)
        for (int n = 0; n < 5; n++) LT_CHECK(n < 4 ? y[m * 5 + n] == 0.0f : m == 2 || isnan(y[m * 5 + n]));
    free(y);
    y = lt_poisoned_rows(2, 2);
    LT_CHECK_OK(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 2, 0, 2, 2));
    LT_CHECK_OK(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 2, 2, 0, 2));
    LT_CHECK_OK(lm__cpu_linear(NULL, NULL, 0, NULL, LM_F16, 0, NULL, 0, 0, 0, 0));
    for (int i = 0; i < 4; i++) LT_CHECK(isnan(y[i]));
    free(y);
}

static void test_linear_rejects_bad_arguments(void) {
    float x[8] = {0}, y[8];
    uint16_t w[8] = {0};
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_I32, 2, y, 2, 2, 2, 2), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, (lm_dtype)99, 2, y, 2, 2, 2, 2), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 2, -1, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 2, 2, -2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 2, 2, 2, -3), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, y, 1, 2, 2, 2), LM_INVALID_ARGUMENT); /* ldy < N */
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, -2, w, LM_BF16, 2, y, 2, 2, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, -2, y, 2, 2, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, NULL, 2, w, LM_BF16, 2, y, 2, 2, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, NULL, LM_BF16, 2, y, 2, 2, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_linear(NULL, x, 2, w, LM_BF16, 2, NULL, 2, 2, 2, 2), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "NULL y") != NULL);
}

static void test_linear_gemv_never_allocates_and_gemm_oom_leaks_nothing(void) {
    lt_rng r = lt_rng_seed(12);
    int64_t M = 40, N = 300, K = 80;
    wmat w = random_weights(&r, LM_BF16, N, K, K);
    float *x = lt_random_rows(&r, M, K, K), *y = lt_poisoned_rows(M, N);
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
        if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) continue;
        LT_CHECK_OK(lm__cpu_set_isa_override(isa));
        lt_alloc_track(0);
        LT_CHECK_OK(lm__cpu_linear(g_pool2, x, K, w.data, LM_BF16, K, y, N, 1, N, K)); /* decode: M = 1 */
        LT_CHECK(lt_alloc_count() == 0);
        lt_alloc_untrack();
        lt_alloc_track(1);
        LT_CHECK_STATUS(lm__cpu_linear(g_pool2, x, K, w.data, LM_BF16, K, y, N, M, N, K), LM_OUT_OF_MEMORY);
        LT_CHECK(lt_alloc_live() == 0);
        LT_CHECK(strstr(lm_last_error(), "packing scratch") != NULL);
        lt_alloc_untrack();
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    free(w.data), free(w.f64), free(x), free(y);
}

static void test_isa_override_validates_and_auto_picks_best(void) {
    LT_CHECK_STATUS(lm__cpu_set_isa_override(7), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm__cpu_set_isa_override(-5), LM_INVALID_ARGUMENT);
    LT_CHECK(lm__cpu_isa_supported(LM__CPU_ISA_SCALAR));
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
        lm_status want = lm__cpu_isa_supported((lm__cpu_isa)isa) ? LM_OK : LM_UNSUPPORTED;
        LT_CHECK_STATUS(lm__cpu_set_isa_override(isa), want);
        if (want == LM_OK) LT_CHECK(lm__cpu_isa_active() == (lm__cpu_isa)isa);
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    lm__cpu_isa best = LM__CPU_ISA_SCALAR;
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++)
        if (lm__cpu_isa_supported((lm__cpu_isa)isa)) best = (lm__cpu_isa)isa;
    LT_CHECK(lm__cpu_isa_active() == best);
    const lm_cpu_features *f = lm_cpu_get_features();
    if (lm__cpu_isa_supported(LM__CPU_ISA_AVX512)) LT_CHECK(f->avx512f && f->avx512bw && f->avx512vl && f->f16c);
    if (lm__cpu_isa_supported(LM__CPU_ISA_AVX2)) LT_CHECK(f->avx2 && f->fma && f->f16c);
}

/* ---- the lm_matmul_out view predicate ------------------------------------------------------ */
static float g_buf[4096];

static lm_tensor_view mkview(lm_dtype dt, int nd, const int64_t *shape, const int64_t *stride) {
    lm_tensor_view v;
    LT_CHECK_OK(lm_tensor_view_init(&v, g_buf, dt, lm_device_cpu(), nd, shape, stride));
    return v;
}

static void test_supported_accepts_linear_views_and_rejects_others(void) {
    const int64_t a_sh[3] = {2, 3, 8}, o_sh[3] = {2, 3, 5}, bt_sh[2] = {8, 5}, bt_st[2] = {1, 8};
    lm_tensor_view a = mkview(LM_F32, 3, a_sh, NULL), out = mkview(LM_F32, 3, o_sh, NULL);
    for (int d = 0; d < 3; d++) { /* b = the [K, N] transpose view of a row-major [N, K] weight */
        lm_tensor_view bt = mkview(k_wdtypes[d], 2, bt_sh, bt_st);
        LT_CHECK(lm__cpu_linear_supported(&a, &bt, &out));
    }
    lm_tensor_view bt = mkview(LM_BF16, 2, bt_sh, bt_st), bad;
    bad = mkview(LM_I32, 2, bt_sh, bt_st);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bad, &out)); /* integer weight */
    bad = mkview(LM_BF16, 3, a_sh, NULL);
    LT_CHECK(!lm__cpu_linear_supported(&bad, &bt, &out)); /* bf16 activations */
    bad = mkview(LM_F16, 3, o_sh, NULL);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bt, &bad)); /* f16 output */
    bad = mkview(LM_BF16, 2, bt_sh, NULL);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bad, &out)); /* row-major [K, N]: K not contiguous */
    const int64_t a_st_k2[3] = {48, 16, 2};
    bad = mkview(LM_F32, 3, a_sh, a_st_k2);
    LT_CHECK(!lm__cpu_linear_supported(&bad, &bt, &out)); /* x inner stride 2 */
    const int64_t a_st_rows[3] = {36, 12, 1}; /* [2, 3, 12] sliced to K = 8: rows 12 apart */
    lm_tensor_view as = mkview(LM_F32, 3, a_sh, a_st_rows);
    LT_CHECK(lm__cpu_linear_supported(&as, &bt, &out));
    const int64_t a_st_perm[3] = {8, 16, 1}; /* permuted [3, 2, 8]: batch and M do not merge */
    bad = mkview(LM_F32, 3, a_sh, a_st_perm);
    LT_CHECK(!lm__cpu_linear_supported(&bad, &bt, &out));
    const int64_t o_st_perm[3] = {5, 10, 1};
    bad = mkview(LM_F32, 3, o_sh, o_st_perm);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bt, &bad));
    const int64_t o_st_n2[3] = {30, 10, 2};
    bad = mkview(LM_F32, 3, o_sh, o_st_n2);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bt, &bad)); /* out inner stride 2 */
    const int64_t b3_sh[3] = {2, 8, 5}, b3_bcast[3] = {0, 1, 8}, b3_real[3] = {40, 1, 8};
    lm_tensor_view b3 = mkview(LM_BF16, 3, b3_sh, b3_bcast);
    LT_CHECK(lm__cpu_linear_supported(&a, &b3, &out)); /* one weight broadcast over the batch */
    b3 = mkview(LM_BF16, 3, b3_sh, b3_real);
    LT_CHECK(!lm__cpu_linear_supported(&a, &b3, &out)); /* a different weight per batch */
    const int64_t a_bcast_st[3] = {0, 8, 1};
    bad = mkview(LM_F32, 3, a_sh, a_bcast_st);
    LT_CHECK(!lm__cpu_linear_supported(&bad, &bt, &out)); /* x broadcast over the batch only */
    const int64_t a_same_st[3] = {0, 0, 1};
    lm_tensor_view asame = mkview(LM_F32, 3, a_sh, a_same_st);
    LT_CHECK(lm__cpu_linear_supported(&asame, &bt, &out)); /* every row the same: ldx = 0 */
    const int64_t a2_sh[2] = {3, 8}, a2_st[2] = {0, 1}, o2_sh[2] = {3, 5};
    lm_tensor_view a2 = mkview(LM_F32, 2, a2_sh, a2_st), o2 = mkview(LM_F32, 2, o2_sh, NULL);
    LT_CHECK(lm__cpu_linear_supported(&a2, &bt, &o2)); /* x rows broadcast along M: ldx = 0 */
    LT_CHECK(!lm__cpu_linear_supported(&a2, &bt, &out)); /* a and out ranks differ */
    const int64_t k1_sh[2] = {3, 1}, k1_st[2] = {7, 5}, bk1_sh[2] = {1, 5}, bk1_st[2] = {9, 3};
    lm_tensor_view ak1 = mkview(LM_F32, 2, k1_sh, k1_st), bk1 = mkview(LM_F16, 2, bk1_sh, bk1_st);
    LT_CHECK(lm__cpu_linear_supported(&ak1, &bk1, &o2)); /* K = 1: inner strides do not matter */
    const int64_t am_sh[3] = {2, 4, 8};
    bad = mkview(LM_F32, 3, am_sh, NULL);
    LT_CHECK(!lm__cpu_linear_supported(&bad, &bt, &out)); /* M mismatch */
    const int64_t bk_sh[2] = {7, 5};
    bad = mkview(LM_BF16, 2, bk_sh, bt_st);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bad, &out)); /* K mismatch */
    lm_tensor_view gpu = out;
    gpu.device = lm_device_cuda(0);
    LT_CHECK(!lm__cpu_linear_supported(&a, &bt, &gpu));
    LT_CHECK(!lm__cpu_linear_supported(NULL, &bt, &out));
    LT_CHECK(!lm__cpu_linear_supported(&a, NULL, &out));
    LT_CHECK(!lm__cpu_linear_supported(&a, &bt, NULL));
    LT_CHECK_STATUS(lm__cpu_linear_views(NULL, &a, &bad, &out), LM_UNSUPPORTED);
}

/* Compares lm__cpu_linear_views with the reference lm_matmul_out on strided views. */
static void compare_with_reference(lm_ctx *ref, const lm_tensor_view *a, const lm_tensor_view *bt, int nd,
                                   const int64_t *out_shape, const char *what) {
    lm_tensor *want = lt_poisoned_tensor(LM_F32, nd, out_shape), *got = lt_poisoned_tensor(LM_F32, nd, out_shape);
    LT_CHECK(lm__cpu_linear_supported(a, bt, lm_tensor_as_view(got)));
    LT_CHECK_OK(lm_matmul_out(ref, a, bt, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cpu_linear_views(g_pool2, a, bt, lm_tensor_as_view(got)));
    double *w = lt_view_to_f64(lm_tensor_as_view(want)), *g = lt_view_to_f64(lm_tensor_as_view(got));
    lt_check_close(what, g, w, lm_tensor_numel(got), k_nmse_gate, 1e-4);
    free(w), free(g);
    lm_tensor_destroy(want), lm_tensor_destroy(got);
}

static void test_linear_views_match_reference_matmul(void) {
    lm_ctx *ref = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &ref));
    lm_ctx_set_impl(ref, LM_IMPL_REF);
    lt_rng r = lt_rng_seed(13);
    const int64_t K = 40, N = 23, xs[3] = {2, 9, K + 3}, ws[2] = {N, K};
    lm_tensor *xw = lt_random_tensor(&r, LM_F32, 3, xs, 1.0);
    lm_tensor_view a, bt, a1, ax;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(xw), 2, 0, K, 1, &a)); /* rows K + 3 apart */
    for (int d = 0; d < 3; d++) {
        lm_tensor *w = lt_random_tensor(&r, k_wdtypes[d], 2, ws, 0.5);
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &bt));
        const int64_t os[3] = {2, 9, N};
        compare_with_reference(ref, &a, &bt, 3, os, "batched strided x");
        /* decode: one row of x, broadcast to 3 rows along M (row stride 0) */
        LT_CHECK_OK(lm_tensor_view_select(&a, 0, 1, &a1));
        LT_CHECK_OK(lm_tensor_view_slice(&a1, 0, 4, 5, 1, &a1));
        const int64_t es[2] = {3, K}, os2[2] = {3, N}, os1[2] = {1, N};
        compare_with_reference(ref, &a1, &bt, 2, os1, "single row");
        LT_CHECK_OK(lm_tensor_view_expand(&a1, 2, es, &ax));
        compare_with_reference(ref, &ax, &bt, 2, os2, "x broadcast along M");
        lm_tensor_destroy(w);
    }
    lm_tensor_destroy(xw);
    lm_ctx_destroy(ref);
}

int main(void) {
    LT_CHECK_OK(lm_threadpool_create(2, &g_pool2));
    LT_RUN(test_isa_override_validates_and_auto_picks_best);
    LT_RUN(test_linear_matches_f64_on_every_path_dtype_and_shape);
    LT_RUN(test_linear_matches_pytorch_fixtures);
    LT_RUN(test_linear_k_zero_writes_zeros_and_empty_sizes_write_nothing);
    LT_RUN(test_linear_rejects_bad_arguments);
    LT_RUN(test_linear_gemv_never_allocates_and_gemm_oom_leaks_nothing);
    LT_RUN(test_supported_accepts_linear_views_and_rejects_others);
    LT_RUN(test_linear_views_match_reference_matmul);
    lm_threadpool_destroy(g_pool2);
    return lt_finish();
}
