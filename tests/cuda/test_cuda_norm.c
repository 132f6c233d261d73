/* CUDA RMSNorm kernels against the CPU reference, per float dtype: rmsnorm on a
 * permuted input into a strided output and in place; add_rmsnorm with sum_out in
 * place over the residual (the rounded sum and the normalized output both checked);
 * the register-resident rows path (contiguous rows, several team shapes); and the
 * forward pass's kernels (f32 residual stream -> bf16 rows, with and without the fused
 * residual add; the team form and the block-per-row form, rows D apart and strided)
 * against reference f32 norm + cast; and a chain of fused adds launched back to back
 * (programmatic launch) against the host's f32 sums.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

static void test_rmsnorm_strided_and_in_place(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(21 + (uint64_t)k);
        int64_t shape[3] = {4, 7, 96}, d = 96;
        lm_tensor_view xh, xd, oh, od;
        ct_pair x = ct_random_reversed(&r, dt, 3, shape, 2.0, &xh, &xd);
        ct_pair w = ct_random(&r, dt, 1, &d, 1.0);
        ct_pair o = ct_poisoned_strided(dt, 3, shape, &oh, &od);
        lm_tensor *want = lt_poisoned_tensor(dt, 3, shape);
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, &xh, lm_tensor_as_view(w.h), 1e-5f, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_rmsnorm(&xd, lm_tensor_as_view(w.d), 1e-5f, &od, ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "rmsnorm %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        /* in place on a contiguous copy */
        ct_pair c = ct_random(&r, dt, 3, shape, 2.0);
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(c.h), lm_tensor_as_view(w.h), 1e-5f, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_rmsnorm(lm_tensor_as_view(c.d), lm_tensor_as_view(w.d), 1e-5f, lm_tensor_as_view(c.d),
                                    ct_stream(g_ctx)));
        snprintf(what, sizeof what, "rmsnorm in place %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &c, lm_tensor_as_view(c.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&o), ct_pair_free(&c);
        lm_tensor_destroy(want);
    }
}

static void test_add_rmsnorm_in_place_residual(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(31 + (uint64_t)k);
        int64_t shape[2] = {9, 200}, d = 200;
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 2, shape, 1.0, &xh, &xd);
        ct_pair res = ct_random(&r, dt, 2, shape, 3.0);
        ct_pair w = ct_random(&r, dt, 1, &d, 1.0);
        ct_pair o = ct_poisoned(dt, 2, shape);
        lm_tensor *want = lt_poisoned_tensor(dt, 2, shape), *want_sum = lt_poisoned_tensor(dt, 2, shape);
        LT_CHECK_OK(lm_tensor_view_copy(NULL, lm_tensor_as_view(want_sum), lm_tensor_as_view(res.h)));
        /* reference: sum_out in place over its copy of the residual */
        LT_CHECK_OK(lm_add_rmsnorm_out(g_ref, &xh, lm_tensor_as_view(want_sum), lm_tensor_as_view(w.h), 1e-6f,
                                       lm_tensor_as_view(want_sum), lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_add_rmsnorm(&xd, lm_tensor_as_view(res.d), lm_tensor_as_view(w.d), 1e-6f,
                                        lm_tensor_as_view(res.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "add_rmsnorm sum %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &res, lm_tensor_as_view(res.d), lm_tensor_as_view(want_sum), 0.0, 0.0); /* exact */
        snprintf(what, sizeof what, "add_rmsnorm out %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        ct_pair_free(&x), ct_pair_free(&res), ct_pair_free(&w), ct_pair_free(&o);
        lm_tensor_destroy(want), lm_tensor_destroy(want_sum);
    }
}

/* Contiguous rows on 16-byte boundaries take the register-resident path: team shapes
 * of 1 to 8 warps and 1, 2 or 4 vectors a lane, row counts that leave a block's last
 * teams idle; sum_out written beside the residual (exact), and the plain RMSNorm. */
static void test_norms_rows_path(void) {
    static const struct { lm_dtype dt; int64_t rows, D; } cases[] = {
        {LM_BF16, 37, 896}, {LM_BF16, 13, 4096}, {LM_F32, 9, 200}, {LM_F16, 11, 24}, {LM_F32, 5, 4096}, {LM_BF16, 3, 520}, {LM_F16, 7, 2048},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        lm_dtype dt = cases[k].dt;
        int64_t shape[2] = {cases[k].rows, cases[k].D}, d = cases[k].D;
        lt_rng r = lt_rng_seed(41 + (uint64_t)k);
        ct_pair x = ct_random(&r, dt, 2, shape, 1.0), res = ct_random(&r, dt, 2, shape, 3.0);
        ct_pair w = ct_random(&r, dt, 1, &d, 1.0);
        ct_pair o = ct_poisoned(dt, 2, shape), sum = ct_poisoned(dt, 2, shape);
        lm_tensor *want = lt_poisoned_tensor(dt, 2, shape), *want_sum = lt_poisoned_tensor(dt, 2, shape);
        LT_CHECK_OK(lm_add_rmsnorm_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(res.h), lm_tensor_as_view(w.h),
                                       1e-6f, lm_tensor_as_view(want_sum), lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_add_rmsnorm(lm_tensor_as_view(x.d), lm_tensor_as_view(res.d), lm_tensor_as_view(w.d), 1e-6f,
                                        lm_tensor_as_view(sum.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        char what[80];
        snprintf(what, sizeof what, "add_rmsnorm rows path sum %s %lldx%lld", lm_dtype_name(dt), (long long)shape[0],
                 (long long)d);
        ct_check(g_ctx, what, &sum, lm_tensor_as_view(sum.d), lm_tensor_as_view(want_sum), 0.0, 0.0);
        snprintf(what, sizeof what, "add_rmsnorm rows path out %s %lldx%lld", lm_dtype_name(dt), (long long)shape[0],
                 (long long)d);
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        ct_pair o2 = ct_poisoned(dt, 2, shape);
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(w.h), 1e-5f, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_rmsnorm(lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), 1e-5f, lm_tensor_as_view(o2.d),
                                    ct_stream(g_ctx)));
        snprintf(what, sizeof what, "rmsnorm rows path %s %lldx%lld", lm_dtype_name(dt), (long long)shape[0], (long long)d);
        ct_check(g_ctx, what, &o2, lm_tensor_as_view(o2.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 10.0));
        ct_pair_free(&x), ct_pair_free(&res), ct_pair_free(&w), ct_pair_free(&o), ct_pair_free(&sum), ct_pair_free(&o2);
        lm_tensor_destroy(want), lm_tensor_destroy(want_sum);
    }
}

/* rows x D: the team kernel at 1, 2 and 4 vectors a lane and 1-8 warps a row (D 64,
 * 896, 900, 2048, 4096; 37 rows: teams past the last row), the block-per-row kernel (D
 * not a multiple of 4, and D over 4096); plain and the fused residual add. */
static void check_bf16_norms(int64_t rows, int64_t D) {
    lt_rng r = lt_rng_seed(41 + (uint64_t)D);
    int64_t shape[2] = {rows, D};
    ct_pair x = ct_random(&r, LM_F32, 2, shape, 3.0), delta = ct_random(&r, LM_F32, 2, shape, 1.0);
    ct_pair w = ct_random(&r, LM_F32, 1, &D, 1.0);
    ct_pair o = ct_poisoned(LM_BF16, 2, shape);
    lm_tensor *n32 = lt_poisoned_tensor(LM_F32, 2, shape), *want = lt_poisoned_tensor(LM_BF16, 2, shape);
    lm_tensor *sum = lt_poisoned_tensor(LM_F32, 2, shape);
    float eps = 1e-6f;
    char what[96];
    /* plain: bf16(rmsnorm(x) * w) */
    LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(w.h), eps, lm_tensor_as_view(n32)));
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(n32), lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cuda_rmsnorm_to_bf16(lm_tensor_data(x.d), D, lm_tensor_data(w.d), eps, rows, D, lm_tensor_data(o.d),
                                   ct_stream(g_ctx)));
    snprintf(what, sizeof what, "rmsnorm_to_bf16 %lld x %lld", (long long)rows, (long long)D);
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_BF16), ct_abs(LM_BF16, 10.0));
    /* fused add: x += delta, then the same */
    LT_CHECK_OK(lm_tensor_view_poison(NULL, lm_tensor_as_view(o.d)));
    LT_CHECK_OK(lm_add_rmsnorm_out(g_ref, lm_tensor_as_view(delta.h), lm_tensor_as_view(x.h), lm_tensor_as_view(w.h), eps,
                                   lm_tensor_as_view(sum), lm_tensor_as_view(n32)));
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(n32), lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cuda_add_rmsnorm_to_bf16(lm_tensor_data(x.d), lm_tensor_data(delta.d), lm_tensor_data(w.d), eps, rows, D,
                                       lm_tensor_data(o.d), ct_stream(g_ctx)));
    snprintf(what, sizeof what, "add_rmsnorm_to_bf16 residual %lld x %lld", (long long)rows, (long long)D);
    ct_check(g_ctx, what, &x, lm_tensor_as_view(x.d), lm_tensor_as_view(sum), 0.0, 0.0);
    snprintf(what, sizeof what, "add_rmsnorm_to_bf16 out %lld x %lld", (long long)rows, (long long)D);
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_BF16), ct_abs(LM_BF16, 10.0));
    ct_pair_free(&x), ct_pair_free(&delta), ct_pair_free(&w), ct_pair_free(&o);
    lm_tensor_destroy(n32), lm_tensor_destroy(want), lm_tensor_destroy(sum);
}

static void test_bf16_norms_match_reference(void) {
    const int64_t cases[8][2] = {{5, 896}, {37, 896}, {37, 64}, {9, 900}, {9, 2048}, {3, 4096}, {9, 898}, {2, 4100}};
    for (int k = 0; k < 8; k++) check_bf16_norms(cases[k][0], cases[k][1]);
}

/* A row stride other than D (each sequence's last position): x rows 4 (team kernel)
 * and 3 floats (block per row) apart beyond D, against the reference on the gathered
 * rows. */
static void test_rmsnorm_to_bf16_strided_rows(void) {
    for (int64_t pad = 3; pad <= 4; pad++) {
        lt_rng r = lt_rng_seed(43 + (uint64_t)pad);
        int64_t rows = 6, D = 896, ld = D + pad, xs[2] = {rows, ld}, shape[2] = {rows, D};
        ct_pair x = ct_random(&r, LM_F32, 2, xs, 3.0), w = ct_random(&r, LM_F32, 1, &D, 1.0);
        lm_tensor_view xv;
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(x.h), 1, 0, D, 1, &xv));
        lm_tensor *n32 = lt_poisoned_tensor(LM_F32, 2, shape), *want = lt_poisoned_tensor(LM_BF16, 2, shape);
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, &xv, lm_tensor_as_view(w.h), 1e-6f, lm_tensor_as_view(n32)));
        LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(n32), lm_tensor_as_view(want)));
        ct_pair o = ct_poisoned(LM_BF16, 2, shape);
        LT_CHECK_OK(lm__cuda_rmsnorm_to_bf16(lm_tensor_data(x.d), ld, lm_tensor_data(w.d), 1e-6f, rows, D,
                                       lm_tensor_data(o.d), ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "rmsnorm_to_bf16 row stride %lld", (long long)ld);
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_BF16),
                 ct_abs(LM_BF16, 10.0));
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&o);
        lm_tensor_destroy(n32), lm_tensor_destroy(want);
    }
}

/* The team kernel runs under programmatic launch: it lets its successor start at once
 * and reads x and delta only after waiting for the kernel before. A chain of 40 fused
 * adds on one residual (each call's x is the previous call's output, nothing between
 * them on the stream) must leave exactly the host's f32 sums, and the last call's rows
 * the reference norm of them: a call that read x before its predecessor finished would
 * add to a stale row. 512 rows (128 blocks, the whole GPU) and 32 rows (8 blocks). */
static void test_add_rmsnorm_chain(void) {
    for (int c = 0; c < 2; c++) {
        int64_t rows = c ? 32 : 512, D = 896, shape[2] = {rows, D};
        lt_rng r = lt_rng_seed(47 + (uint64_t)c);
        ct_pair x = ct_random(&r, LM_F32, 2, shape, 3.0), w = ct_random(&r, LM_F32, 1, &D, 1.0);
        ct_pair d0 = ct_random(&r, LM_F32, 2, shape, 1.0), d1 = ct_random(&r, LM_F32, 2, shape, 1.0);
        ct_pair o = ct_poisoned(LM_BF16, 2, shape);
        lm_tensor *want_x = lt_poisoned_tensor(LM_F32, 2, shape), *n32 = lt_poisoned_tensor(LM_F32, 2, shape);
        lm_tensor *want = lt_poisoned_tensor(LM_BF16, 2, shape);
        float *hx = lm_tensor_data(want_x);
        const float *x0 = lm_tensor_data(x.h), *h0 = lm_tensor_data(d0.h), *h1 = lm_tensor_data(d1.h);
        const int calls = 40;
        for (int64_t i = 0; i < rows * D; i++) {
            float v = x0[i];
            for (int k = 0; k < calls; k++) v += (k & 1) ? h1[i] : h0[i];
            hx[i] = v;
        }
        for (int k = 0; k < calls; k++)
            LT_CHECK_OK(lm__cuda_add_rmsnorm_to_bf16(lm_tensor_data(x.d), lm_tensor_data(((k & 1) ? d1 : d0).d),
                                                     lm_tensor_data(w.d), 1e-6f, rows, D, lm_tensor_data(o.d),
                                                     ct_stream(g_ctx)));
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(want_x), lm_tensor_as_view(w.h), 1e-6f, lm_tensor_as_view(n32)));
        LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(n32), lm_tensor_as_view(want)));
        char what[80];
        snprintf(what, sizeof what, "add_rmsnorm_to_bf16 chain of %d, residual %lld rows", calls, (long long)rows);
        ct_check(g_ctx, what, &x, lm_tensor_as_view(x.d), lm_tensor_as_view(want_x), 0.0, 0.0);
        snprintf(what, sizeof what, "add_rmsnorm_to_bf16 chain of %d, out %lld rows", calls, (long long)rows);
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_BF16),
                 ct_abs(LM_BF16, 10.0));
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&d0), ct_pair_free(&d1), ct_pair_free(&o);
        lm_tensor_destroy(want_x), lm_tensor_destroy(n32), lm_tensor_destroy(want);
    }
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_rmsnorm_strided_and_in_place);
    LT_RUN(test_add_rmsnorm_in_place_residual);
    LT_RUN(test_norms_rows_path);
    LT_RUN(test_bf16_norms_match_reference);
    LT_RUN(test_rmsnorm_to_bf16_strided_rows);
    LT_RUN(test_add_rmsnorm_chain);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
