/* CUDA embedding, softmax, reductions, concat and cross-entropy against the CPU
 * reference, per float dtype: embedding with i32/i64 ids of rank 2 into a strided
 * output (exact) and the bad-id error (reference message, output untouched);
 * softmax causal and not, in place and on permuted input; sum and max over every dim
 * (and 1100-row sums on the chunked path, strided and row-major)
 * (max with a NaN that must stick); concat along a middle dim for a float and an
 * integer dtype (exact); cross-entropy with ignored rows, all rows ignored (NaN), and
 * a bad target; the widening embedding of the model step (bf16 rows -> f32, exact).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

static ct_pair ids_tensor(lm_dtype it, int nd, const int64_t *shape, const int64_t *vals) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), it, nd, shape, &h));
    int64_t n = lm_tensor_numel(h);
    for (int64_t i = 0; i < n; i++) {
        if (it == LM_I64) ((int64_t *)lm_tensor_data(h))[i] = vals[i];
        else ((int32_t *)lm_tensor_data(h))[i] = (int32_t)vals[i];
    }
    return ct_pair_of(h);
}

static void test_embedding(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(161);
        int64_t ts[2] = {50, 24}, is[2] = {3, 4}, os[3] = {3, 4, 24};
        int64_t vals[12] = {0, 49, 3, 3, 17, 22, 8, 1, 49, 0, 30, 12};
        ct_pair table = ct_random(&r, dt, 2, ts, 1.0);
        for (int i64 = 0; i64 < 2; i64++) {
            ct_pair ids = ids_tensor(i64 ? LM_I64 : LM_I32, 2, is, vals);
            lm_tensor_view oh, od;
            ct_pair o = ct_poisoned_strided(dt, 3, os, &oh, &od);
            lm_tensor *want = lt_poisoned_tensor(dt, 3, os);
            LT_CHECK_OK(lm_embedding_out(g_ref, lm_tensor_as_view(table.h), lm_tensor_as_view(ids.h), lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_embedding(lm_tensor_as_view(table.d), lm_tensor_as_view(ids.d), &od, ct_stream(g_ctx)));
            ct_check(g_ctx, "embedding", &o, &od, lm_tensor_as_view(want), 0.0, 0.0);
            ct_pair_free(&ids), ct_pair_free(&o);
            lm_tensor_destroy(want);
        }
        int64_t bad[12] = {0, 1, 2, 3, 4, 50, 6, 7, 8, -1, 10, 11}; /* [1, 1] = 50 comes first */
        ct_pair ids = ids_tensor(LM_I64, 2, is, bad);
        ct_pair o = ct_poisoned(dt, 3, os);
        LT_CHECK_STATUS(lm__cuda_embedding(lm_tensor_as_view(table.d), lm_tensor_as_view(ids.d), lm_tensor_as_view(o.d),
                                          ct_stream(g_ctx)),
                        LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "ids[1, 1] = 50") != NULL, "message: %s", lm_last_error());
        double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
        int nan = 0;
        for (int i = 0; i < 3 * 4 * 24; i++) nan += isnan(got[i]);
        LT_CHECK(nan == 3 * 4 * 24);
        free(got);
        ct_pair_free(&ids), ct_pair_free(&o), ct_pair_free(&table);
    }
}

static void test_softmax(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(171);
        int64_t s[3] = {3, 6, 700};
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 3, s, 3.0, &xh, &xd);
        for (int causal = 0; causal < 2; causal++) {
            ct_pair o = ct_poisoned(dt, 3, s);
            lm_tensor *want = lt_poisoned_tensor(dt, 3, s);
            LT_CHECK_OK(lm_softmax_out(g_ref, &xh, 0.7f, causal, lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_softmax(&xd, 0.7f, causal, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
            char what[64];
            snprintf(what, sizeof what, "softmax %s causal %d", lm_dtype_name(dt), causal);
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 1.0));
            ct_pair_free(&o);
            lm_tensor_destroy(want);
        }
        ct_pair c = ct_random(&r, dt, 3, s, 3.0);
        lm_tensor *want = lt_poisoned_tensor(dt, 3, s);
        LT_CHECK_OK(lm_softmax_out(g_ref, lm_tensor_as_view(c.h), 1.0f, 1, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_softmax(lm_tensor_as_view(c.d), 1.0f, 1, lm_tensor_as_view(c.d), ct_stream(g_ctx)));
        ct_check(g_ctx, "softmax in place", &c, lm_tensor_as_view(c.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 1.0));
        ct_pair_free(&x), ct_pair_free(&c);
        lm_tensor_destroy(want);
    }
}

static void test_sum_max_concat(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(181);
        int64_t s[3] = {4, 33, 10};
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 3, s, 1.0, &xh, &xd);
        for (int dim = 0; dim < 3; dim++)
            for (int is_max = 0; is_max < 2; is_max++) {
                int64_t os[2];
                for (int i = 0, j = 0; i < 3; i++)
                    if (i != dim) os[j++] = s[i];
                ct_pair o = ct_poisoned(dt, 2, os);
                lm_tensor *want = lt_poisoned_tensor(dt, 2, os);
                LT_CHECK_OK((is_max ? lm_max_out : lm_sum_out)(g_ref, &xh, dim, lm_tensor_as_view(want)));
                LT_CHECK_OK((is_max ? lm__cuda_max : lm__cuda_sum)(&xd, dim, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
                char what[64];
                snprintf(what, sizeof what, "%s %s dim %d", is_max ? "max" : "sum", lm_dtype_name(dt), dim);
                ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 8.0));
                ct_pair_free(&o);
                lm_tensor_destroy(want);
            }
        ct_pair_free(&x);
    }
    /* a long sum over few outputs (a bias gradient) takes the chunked two-pass path */
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(183);
        int64_t s[2] = {1100, 24}, n = 24;
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 2, s, 1.0, &xh, &xd), o = ct_poisoned(dt, 1, &n);
        lm_tensor *want = lt_poisoned_tensor(dt, 1, &n);
        LT_CHECK_OK(lm_sum_out(g_ref, &xh, 0, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_sum(&xd, 0, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "sum %s over 1100 rows (chunked)", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 40.0));
        ct_pair_free(&x), ct_pair_free(&o);
        lm_tensor_destroy(want);
    }
    /* a row-major [rows, count] matrix summed over its rows takes the column-vector path:
     * [1100, 24] over dim 0 and [1, 1100, 48] over dim 1 (a leading size-1 dim) */
    for (int k = 0; k < 3; k++)
        for (int c = 0; c < 2; c++) {
            lm_dtype dt = ct_floats[k];
            lt_rng r = lt_rng_seed(184 + (uint64_t)(2 * k + c));
            int64_t s2[2] = {1100, 24}, s3[3] = {1, 1100, 48}, n = 24, os[2] = {1, 48};
            ct_pair x = c ? ct_random(&r, dt, 3, s3, 1.0) : ct_random(&r, dt, 2, s2, 1.0);
            ct_pair o = c ? ct_poisoned(dt, 2, os) : ct_poisoned(dt, 1, &n);
            lm_tensor *want = c ? lt_poisoned_tensor(dt, 2, os) : lt_poisoned_tensor(dt, 1, &n);
            LT_CHECK_OK(lm_sum_out(g_ref, lm_tensor_as_view(x.h), c, lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_sum(lm_tensor_as_view(x.d), c, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
            char what[64];
            snprintf(what, sizeof what, "sum %s over 1100 rows (columns, dim %d)", lm_dtype_name(dt), c);
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 40.0));
            ct_pair_free(&x), ct_pair_free(&o);
            lm_tensor_destroy(want);
        }
    /* a NaN sticks in max */
    int64_t s2[2] = {3, 9}, three = 3;
    lt_rng r = lt_rng_seed(182);
    lm_tensor *h = lt_random_tensor(&r, LM_F32, 2, s2, 1.0);
    ((float *)lm_tensor_data(h))[1 * 9 + 4] = NAN;
    ct_pair x = ct_pair_of(h), o = ct_poisoned(LM_F32, 1, &three);
    LT_CHECK_OK(lm__cuda_max(lm_tensor_as_view(x.d), 1, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
    double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
    LT_CHECK(!isnan(got[0]) && isnan(got[1]) && !isnan(got[2]));
    free(got);
    ct_pair_free(&x), ct_pair_free(&o);
    /* concat of three inputs along dim 1, float and integer */
    const lm_dtype cdt[2] = {LM_BF16, LM_I64};
    for (int c = 0; c < 2; c++) {
        int64_t a[3] = {2, 3, 5}, b[3] = {2, 1, 5}, d[3] = {2, 4, 5}, os[3] = {2, 8, 5};
        ct_pair pa, pb, pd;
        if (cdt[c] == LM_I64) {
            int64_t vals[40];
            for (int i = 0; i < 40; i++) vals[i] = 1000 * c + 7 * i - 50;
            pa = ids_tensor(LM_I64, 3, a, vals), pb = ids_tensor(LM_I64, 3, b, vals + 30);
            pd = ids_tensor(LM_I64, 3, d, vals);
        } else {
            pa = ct_random(&r, cdt[c], 3, a, 1.0), pb = ct_random(&r, cdt[c], 3, b, 1.0), pd = ct_random(&r, cdt[c], 3, d, 1.0);
        }
        const lm_tensor_view *hin[3] = {lm_tensor_as_view(pa.h), lm_tensor_as_view(pb.h), lm_tensor_as_view(pd.h)};
        const lm_tensor_view *din[3] = {lm_tensor_as_view(pa.d), lm_tensor_as_view(pb.d), lm_tensor_as_view(pd.d)};
        ct_pair o3 = ct_poisoned(cdt[c], 3, os);
        lm_tensor *want = lt_poisoned_tensor(cdt[c], 3, os);
        LT_CHECK_OK(lm_concat_out(g_ref, 3, hin, 1, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_concat(3, din, 1, lm_tensor_as_view(o3.d), ct_stream(g_ctx)));
        ct_check(g_ctx, "concat", &o3, lm_tensor_as_view(o3.d), lm_tensor_as_view(want), 0.0, 0.0);
        ct_pair_free(&pa), ct_pair_free(&pb), ct_pair_free(&pd), ct_pair_free(&o3);
        lm_tensor_destroy(want);
    }
}

static void test_cross_entropy(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(191);
        int64_t s[2] = {6, 300}, n = 6;
        lm_tensor_view lh, ld;
        ct_pair logits = ct_random_reversed(&r, dt, 2, s, 3.0, &lh, &ld);
        int64_t t[6] = {5, -100, 299, 0, -100, 17}, all_ignored[6] = {-100, -100, -100, -100, -100, -100};
        ct_pair tg = ids_tensor(LM_I64, 1, &n, t), ti = ids_tensor(LM_I32, 1, &n, all_ignored);
        ct_pair o = ct_poisoned(LM_F32, 0, NULL);
        lm_tensor *want = lt_poisoned_tensor(LM_F32, 0, NULL);
        LT_CHECK_OK(lm_cross_entropy_out(g_ref, &lh, lm_tensor_as_view(tg.h), -100, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_cross_entropy(&ld, lm_tensor_as_view(tg.d), -100, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "cross_entropy %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 1e-12, 1e-5);
        LT_CHECK_OK(lm__cuda_cross_entropy(&ld, lm_tensor_as_view(ti.d), -100, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
        LT_CHECK_MSG(isnan(got[0]), "every row ignored gives NaN, got %g", got[0]);
        free(got);
        int64_t bad[6] = {5, -100, 300, 0, -100, 17};
        ct_pair tb = ids_tensor(LM_I64, 1, &n, bad);
        LT_CHECK_STATUS(lm__cuda_cross_entropy(&ld, lm_tensor_as_view(tb.d), -100, lm_tensor_as_view(o.d), ct_stream(g_ctx)),
                        LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "targets[2] = 300") != NULL, "message: %s", lm_last_error());
        ct_pair_free(&logits), ct_pair_free(&tg), ct_pair_free(&ti), ct_pair_free(&tb), ct_pair_free(&o);
        lm_tensor_destroy(want);
    }
}

/* The widening embedding (bf16 table into f32 rows, exact) through lm_embedding_out,
 * and a bad id still refused by name before anything runs. */
static void test_embedding_widen(void) {
    lt_rng r = lt_rng_seed(201);
    int64_t ts[2] = {100, 64}, n = 5, os[2] = {5, 64};
    int64_t vals[5] = {99, 0, 42, 42, 7};
    ct_pair table = ct_random(&r, LM_BF16, 2, ts, 1.0), ids = ids_tensor(LM_I32, 1, &n, vals);
    ct_pair o = ct_poisoned(LM_F32, 2, os);
    lm_tensor *want = lt_poisoned_tensor(LM_BF16, 2, os), *want32 = NULL;
    LT_CHECK_OK(lm_embedding_out(g_ref, lm_tensor_as_view(table.h), lm_tensor_as_view(ids.h), lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_cast(g_ref, lm_tensor_as_view(want), LM_F32, &want32));
    LT_CHECK_OK(lm_embedding_out(g_ctx, lm_tensor_as_view(table.d), lm_tensor_as_view(ids.d), lm_tensor_as_view(o.d)));
    ct_check(g_ctx, "embedding bf16 -> f32", &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want32), 0.0, 0.0);
    int64_t bad_vals[5] = {99, 0, 100, 42, 7};
    ct_pair bad = ids_tensor(LM_I32, 1, &n, bad_vals);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, lm_tensor_as_view(table.d), lm_tensor_as_view(bad.d), lm_tensor_as_view(o.d)),
                    LM_OUT_OF_RANGE);
    ct_pair_free(&bad);
    ct_pair_free(&table), ct_pair_free(&ids), ct_pair_free(&o);
    lm_tensor_destroy(want), lm_tensor_destroy(want32);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_embedding);
    LT_RUN(test_softmax);
    LT_RUN(test_sum_max_concat);
    LT_RUN(test_cross_entropy);
    LT_RUN(test_embedding_widen);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
