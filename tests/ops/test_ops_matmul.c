/* Tests for lm_matmul_out / lm_matmul against a float64 re-derivation and PyTorch
 * fixtures: random shapes with batch broadcasting (missing and size-1 batch dims),
 * zero-size M/K/N, transposed and sliced operand views (a Linear weight [N, K] passed
 * as its transpose), all three float dtypes plus f32 activations with bf16/f16
 * weights, NaN-poisoned outputs, and every error path with its exact status.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
/* The kernel accumulates in double and rounds once to out's dtype, so against a
 * double re-derivation from the same (rounded) inputs the error is one rounding:
 * relative 2^-24 / 2^-9 / 2^-12, i.e. NMSE ~1e-15 / 1e-6 / 1e-8 with margin. */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.1 : 0.01; }

/* want = a @ b in double; a, b any views already broadcastable to out [batch..., M, N]. */
static double *matmul_f64(const lm_tensor_view *a, const lm_tensor_view *b, int nd, const int64_t *oshape) {
    int64_t sa[LM_MAX_DIMS], sb[LM_MAX_DIMS];
    int64_t K = a->shape[a->ndim - 1], M = oshape[nd - 2], N = oshape[nd - 1];
    memcpy(sa, oshape, sizeof(int64_t) * (size_t)nd);
    memcpy(sb, oshape, sizeof(int64_t) * (size_t)nd);
    sa[nd - 1] = sb[nd - 2] = K;
    lm_tensor_view ea, eb;
    LT_CHECK_OK(lm_tensor_view_expand(a, nd, sa, &ea));
    LT_CHECK_OK(lm_tensor_view_expand(b, nd, sb, &eb));
    double *x = lt_view_to_f64(&ea), *y = lt_view_to_f64(&eb);
    int64_t batch = 1;
    for (int i = 0; i < nd - 2; i++) batch *= oshape[i];
    double *want = calloc((size_t)(batch * M * N + 1), sizeof(double));
    for (int64_t t = 0; t < batch; t++)
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++)
                for (int64_t k = 0; k < K; k++)
                    want[(t * M + m) * N + n] += x[(t * M + m) * K + k] * y[(t * K + k) * N + n];
    free(x), free(y);
    return want;
}

/* A random tensor of logical shape [..., r, c]; when transposed it is stored as
 * [..., c, r] and *v is its transposed view (non-contiguous). */
static lm_tensor *random_operand(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, int transposed,
                                 lm_tensor_view *v) {
    int64_t s[LM_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
    if (transposed) s[nd - 2] = shape[nd - 1], s[nd - 1] = shape[nd - 2];
    lm_tensor *t = lt_random_tensor(r, dt, nd, s, 1.0);
    *v = *lm_tensor_as_view(t);
    if (transposed) LT_CHECK_OK(lm_tensor_view_transpose(v, nd - 2, nd - 1, v));
    return t;
}

static int64_t dim_or_zero(lt_rng *r) { return lt_rng_int(r, 0, 9) == 0 ? 0 : lt_rng_int(r, 1, 6); }

static void test_matmul_matches_f64_with_broadcast_and_transposed_views(void) {
    lt_rng r = lt_rng_seed(11);
    for (int trial = 0; trial < 120; trial++) {
        lm_dtype dta = k_floats[trial % 3], dtb = dta;
        if (dta == LM_F32 && trial % 2) dtb = trial % 4 == 1 ? LM_BF16 : LM_F16; /* widened weights */
        int64_t M = dim_or_zero(&r), K = dim_or_zero(&r), N = dim_or_zero(&r);
        int nbatch = (int)lt_rng_int(&r, 0, 3), na = (int)lt_rng_int(&r, 0, nbatch), nb = (int)lt_rng_int(&r, 0, nbatch);
        if (lt_rng_int(&r, 0, 1)) na = nbatch; /* at least one operand carries every batch dim */
        else nb = nbatch;
        int64_t full[LM_MAX_DIMS], sa[LM_MAX_DIMS], sb[LM_MAX_DIMS];
        for (int i = 0; i < nbatch; i++) full[i] = lt_rng_int(&r, 1, 3);
        for (int i = 0; i < na; i++) sa[i] = lt_rng_int(&r, 0, 2) ? full[nbatch - na + i] : 1;
        for (int i = 0; i < nb; i++) sb[i] = lt_rng_int(&r, 0, 2) ? full[nbatch - nb + i] : 1;
        /* out's batch dims are the broadcast of the two */
        int64_t oshape[LM_MAX_DIMS];
        for (int i = 0; i < nbatch; i++) {
            int ia = i - (nbatch - na), ib = i - (nbatch - nb);
            int64_t da = ia >= 0 ? sa[ia] : 1, db = ib >= 0 ? sb[ib] : 1;
            oshape[i] = da == 1 ? db : da;
        }
        sa[na] = M, sa[na + 1] = K, sb[nb] = K, sb[nb + 1] = N;
        oshape[nbatch] = M, oshape[nbatch + 1] = N;
        lm_tensor_view va, vb;
        lm_tensor *ta = random_operand(&r, dta, na + 2, sa, (int)lt_rng_int(&r, 0, 1), &va);
        lm_tensor *tb = random_operand(&r, dtb, nb + 2, sb, (int)lt_rng_int(&r, 0, 1), &vb);
        lm_tensor *out = lt_poisoned_tensor(dta, nbatch + 2, oshape);
        LT_CHECK_OK(lm_matmul_out(g_ctx, &va, &vb, lm_tensor_as_view(out)));
        double *want = matmul_f64(&va, &vb, nbatch + 2, oshape), *got = lt_view_to_f64(lm_tensor_as_view(out));
        char what[64];
        snprintf(what, sizeof what, "matmul trial %d (%s @ %s)", trial, lm_dtype_name(dta), lm_dtype_name(dtb));
        lt_check_close(what, got, want, lm_tensor_numel(out), tol_nmse(dta), tol_abs(dta));
        free(want), free(got);
        lm_tensor_destroy(ta), lm_tensor_destroy(tb), lm_tensor_destroy(out);
    }
}

static void test_matmul_k_zero_writes_zeros(void) {
    int64_t sa[2] = {3, 0}, sb[2] = {0, 4}, so[2] = {3, 4};
    lm_tensor *a = lt_poisoned_tensor(LM_F32, 2, sa), *b = lt_poisoned_tensor(LM_F32, 2, sb);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, so);
    LT_CHECK_OK(lm_matmul_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(o)));
    const float *p = lm_tensor_data(o);
    for (int i = 0; i < 12; i++) LT_CHECK(p[i] == 0.0f);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(o);
}

static void test_matmul_linear_weight_as_transposed_view_of_sliced_input(void) {
    lt_rng r = lt_rng_seed(12);
    for (int i = 0; i < 3; i++) {
        lm_dtype wdt = k_floats[i]; /* f32 activations with f32, bf16 and f16 weights */
        int64_t xs[3] = {2, 5, 14}, ws[2] = {6, 7}, os[3] = {2, 5, 6};
        lm_tensor *xbuf = lt_random_tensor(&r, LM_F32, 3, xs, 1.0), *w = lt_random_tensor(&r, wdt, 2, ws, 0.5);
        lm_tensor_view x, wt;
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(xbuf), 2, 1, 14, 2, &x)); /* [2, 5, 7], stride 2 */
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &wt));      /* [7, 6] */
        lm_tensor *o = NULL;
        LT_CHECK_OK(lm_matmul(g_ctx, &x, &wt, &o));
        LT_CHECK(o && lm_tensor_dtype(o) == LM_F32 && lm_tensor_ndim(o) == 3 && lm_tensor_dim(o, 2) == 6);
        double *want = matmul_f64(&x, &wt, 3, os), *got = lt_view_to_f64(lm_tensor_as_view(o));
        lt_check_close("linear", got, want, 60, tol_nmse(LM_F32), tol_abs(LM_F32));
        free(want), free(got);
        lm_tensor_destroy(xbuf), lm_tensor_destroy(w), lm_tensor_destroy(o);
    }
}

static void test_matmul_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/matmul_attention.lmfx", &fx)) return;
    /* Fixture inputs are f32-exact, so f32 only sees the output rounding; bf16 and f16
     * also round both inputs (relative 2^-9 / 2^-12 each). */
    static const double nmse[] = {1e-12, 1e-4, 1e-6}, abs_tol[] = {1e-5, 0.1, 0.02};
    for (int i = 0; i < 3; i++) {
        lm_dtype dt = k_floats[i];
        lm_tensor *a = lt_fixture_tensor_to(lt_fixture_get(&fx, "mm_bcast_a"), dt);
        lm_tensor *b = lt_fixture_tensor_to(lt_fixture_get(&fx, "mm_bcast_b"), dt);
        const lt_fixture_tensor *want = lt_fixture_get(&fx, "mm_bcast_out");
        lm_tensor *o = lt_poisoned_tensor(dt, want->ndim, want->shape);
        LT_CHECK_OK(lm_matmul_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(o)));
        double *got = lt_view_to_f64(lm_tensor_as_view(o));
        lt_check_close("torch matmul batch broadcast", got, want->f64, want->numel, nmse[i], abs_tol[i]);
        free(got);
        lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(o);

        /* F.linear(x, w) = x @ w^T with w passed as a transposed view; x stays f32. */
        lm_tensor *x = lt_fixture_tensor_to(lt_fixture_get(&fx, "mm_linear_x"), LM_F32);
        lm_tensor *w = lt_fixture_tensor_to(lt_fixture_get(&fx, "mm_linear_w"), dt);
        want = lt_fixture_get(&fx, "mm_linear_out");
        lm_tensor_view wt;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &wt));
        o = lt_poisoned_tensor(LM_F32, want->ndim, want->shape);
        LT_CHECK_OK(lm_matmul_out(g_ctx, lm_tensor_as_view(x), &wt, lm_tensor_as_view(o)));
        got = lt_view_to_f64(lm_tensor_as_view(o));
        lt_check_close("torch linear", got, want->f64, want->numel, nmse[i], abs_tol[i]);
        free(got);
        lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(o);
    }
    lt_fixture_free(&fx);
}

static void test_matmul_allocating_form_broadcasts_batch(void) {
    lt_rng r = lt_rng_seed(13);
    int64_t sa[3] = {4, 2, 3}, sb[4] = {2, 1, 3, 5};
    lm_tensor *a = lt_random_tensor(&r, LM_BF16, 3, sa, 1), *b = lt_random_tensor(&r, LM_BF16, 4, sb, 1), *o = NULL;
    LT_CHECK_OK(lm_matmul(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), &o));
    LT_CHECK(o && lm_tensor_ndim(o) == 4 && lm_tensor_dim(o, 0) == 2 && lm_tensor_dim(o, 1) == 4 &&
             lm_tensor_dim(o, 2) == 2 && lm_tensor_dim(o, 3) == 5 && lm_tensor_dtype(o) == LM_BF16);
    int64_t os[4] = {2, 4, 2, 5};
    double *want = matmul_f64(lm_tensor_as_view(a), lm_tensor_as_view(b), 4, os), *got = lt_view_to_f64(lm_tensor_as_view(o));
    lt_check_close("allocating matmul", got, want, 80, tol_nmse(LM_BF16), tol_abs(LM_BF16));
    free(want), free(got);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(o);
}

static void test_matmul_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(14);
    int64_t s23[2] = {2, 3}, s34[2] = {3, 4}, s24[2] = {2, 4}, s3[1] = {3}, s2_23[3] = {2, 2, 3}, s3_34[3] = {3, 3, 4};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s23, 1), *b = lt_random_tensor(&r, LM_F32, 2, s34, 1);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, s24), *o2 = NULL;
    lm_tensor *ab = lt_random_tensor(&r, LM_BF16, 2, s23, 1), *bh = lt_random_tensor(&r, LM_F16, 2, s34, 1);
    lm_tensor *ai = lt_random_tensor(&r, LM_I32, 2, s23, 1), *v1 = lt_random_tensor(&r, LM_F32, 1, s3, 1);
    lm_tensor *a3 = lt_random_tensor(&r, LM_F32, 3, s2_23, 1), *b3 = lt_random_tensor(&r, LM_F32, 3, s3_34, 1);
    const lm_tensor_view *va = lm_tensor_as_view(a), *vb = lm_tensor_as_view(b), *vo = lm_tensor_as_view(o);
    /* K mismatch names both shapes */
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, va, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "[2, 3]") && strstr(lm_last_error(), "K = 3"));
    /* 1-D operands are not promoted */
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, lm_tensor_as_view(v1), vb, vo), LM_SHAPE_MISMATCH);
    /* batch dims 2 and 3 do not broadcast */
    LT_CHECK_STATUS(lm_matmul(g_ctx, lm_tensor_as_view(a3), lm_tensor_as_view(b3), &o2), LM_SHAPE_MISMATCH);
    LT_CHECK(o2 == NULL && strstr(lm_last_error(), "batch"));
    /* wrong out shape */
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, vb, va), LM_SHAPE_MISMATCH);
    /* dtypes: bf16 @ f16 and f32-out for bf16 inputs mismatch; integers unsupported */
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, lm_tensor_as_view(ab), lm_tensor_as_view(bh), vo), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, lm_tensor_as_view(bh), lm_tensor_as_view(bh)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, lm_tensor_as_view(ai), vb, vo), LM_UNSUPPORTED);
    lm_tensor *obf = lt_poisoned_tensor(LM_BF16, 2, s24);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, vb, lm_tensor_as_view(obf)), LM_DTYPE_MISMATCH);
    /* NULLs and foreign devices */
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, NULL, vb, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, vb, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_matmul(g_ctx, va, NULL, &o2), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vb;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, &dev, vo), LM_INVALID_ARGUMENT);
    /* out broadcast over rows would be written twice */
    int64_t s14[2] = {1, 4};
    lm_tensor *small = lt_poisoned_tensor(LM_F32, 2, s14);
    lm_tensor_view bc;
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(small), 2, s24, &bc));
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, vb, &bc), LM_INVALID_ARGUMENT);
    /* out sharing memory with an input: [3, 3] @ [3, 3] written into a */
    int64_t s33[2] = {3, 3};
    lm_tensor *sq = lt_random_tensor(&r, LM_F32, 2, s33, 1);
    const lm_tensor_view *vsq = lm_tensor_as_view(sq);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, vsq, vb, vsq), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, vsq, vsq, vsq), LM_INVALID_ARGUMENT);
    lm_tensor_view sqt;
    LT_CHECK_OK(lm_tensor_view_transpose(vsq, 0, 1, &sqt));
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, vsq, vsq, &sqt), LM_INVALID_ARGUMENT);
    /* no tuned CPU matmul exists yet */
    lm_ctx_set_impl(g_ctx, LM_IMPL_TUNED);
    LT_CHECK_STATUS(lm_matmul_out(g_ctx, va, vb, vo), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(o), lm_tensor_destroy(ab), lm_tensor_destroy(bh);
    lm_tensor_destroy(ai), lm_tensor_destroy(v1), lm_tensor_destroy(a3), lm_tensor_destroy(b3);
    lm_tensor_destroy(obf), lm_tensor_destroy(small), lm_tensor_destroy(sq);
}

static void test_matmul_allocating_form_leaks_nothing_when_allocation_fails(void) {
    lt_rng r = lt_rng_seed(15);
    int64_t s[2] = {4, 4};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s, 1);
    for (int k = 1; k <= 4; k++) {
        lm_tensor *o = NULL;
        lt_alloc_track(k);
        lm_status st = lm_matmul(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(a), &o);
        if (k <= lt_alloc_count()) {
            LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
            LT_CHECK(o == NULL);
        }
        lm_tensor_destroy(o);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor_destroy(a);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_matmul_matches_f64_with_broadcast_and_transposed_views);
    LT_RUN(test_matmul_k_zero_writes_zeros);
    LT_RUN(test_matmul_linear_weight_as_transposed_view_of_sliced_input);
    LT_RUN(test_matmul_matches_torch_fixture);
    LT_RUN(test_matmul_allocating_form_broadcasts_batch);
    LT_RUN(test_matmul_errors_name_the_problem);
    LT_RUN(test_matmul_allocating_form_leaks_nothing_when_allocation_fails);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
