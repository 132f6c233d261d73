/* CUDA matrix products against the CPU reference matmul:
 *  - the readable kernel per float dtype with batch broadcasting (a 2-d b expanded
 *    over [2, 3] batches with stride 0), a permuted a, a strided output, and the mixed
 *    forms (f32 a with bf16/f16 b);
 *  - the cuBLASLt path per dtype: row-major a with a transposed weight view (the
 *    Linear layout), one batch dim, and LM_UNSUPPORTED (nothing queued) for layouts it
 *    does not take;
 *  - linear_lt (bf16 x with a row stride > K, bf16 w, f32 bias epilogue, strided f32
 *    out) and linear_gemv for M = 1, 3, 8 rows (K = 256 and 2,056: inputs staged in
 *    shared memory; K = 7,208 at M = 8: read per use) with each fused input (plain, RMSNorm,
 *    SwiGLU), bias, and accumulation into the output, against reference compositions;
 *    one-row calls with more row groups than warps, each warp's second group prefetched
 *    or not (LOOM_CUDA_GEMV_PF2); one- and two-row calls with a row's K split over 1, 2,
 *    4 or 8 warps (LOOM_CUDA_GEMV_KSPLIT) and by both rules.
 * cuBLASLt runs with f32 compute (no TF32), so f32 keeps the f32 gate. GEMV inputs are
 * f32 and weights bf16 (exact in f32): only f32 summation order and the fast
 * exp/rsqrt differ, NMSE 1e-9.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;
static const lm__cuda_blas *g_blas;

static void check_readable(lm_dtype adt, lm_dtype bdt) {
    lt_rng r = lt_rng_seed(101);
    int64_t ashape[4] = {2, 3, 33, 40}, bshape[2] = {40, 17}, oshape[4] = {2, 3, 33, 17}, bx[4] = {2, 3, 40, 17};
    lm_tensor_view ah, ad, bd, eb, oh, od;
    ct_pair a = ct_random_reversed(&r, adt, 4, ashape, 1.0, &ah, &ad);
    ct_pair b = ct_random(&r, bdt, 2, bshape, 1.0);
    ct_pair o = ct_poisoned_strided(adt, 4, oshape, &oh, &od);
    lm_tensor *want = lt_poisoned_tensor(adt, 4, oshape);
    LT_CHECK_OK(lm_matmul_out(g_ref, &ah, lm_tensor_as_view(b.h), lm_tensor_as_view(want)));
    bd = *lm_tensor_as_view(b.d);
    LT_CHECK_OK(lm_tensor_view_expand(&bd, 4, bx, &eb));
    LT_CHECK_OK(lm__cuda_matmul(&ad, &eb, &od, ct_stream(g_ctx)));
    char what[64];
    snprintf(what, sizeof what, "matmul %s x %s", lm_dtype_name(adt), lm_dtype_name(bdt));
    ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(want), ct_nmse(adt), ct_abs(adt, 20.0));
    ct_pair_free(&a), ct_pair_free(&b), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

static void test_readable_matmul(void) {
    for (int k = 0; k < 3; k++) check_readable(ct_floats[k], ct_floats[k]);
    check_readable(LM_F32, LM_BF16);
    check_readable(LM_F32, LM_F16);
}

static void test_cublaslt_matmul(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(111 + (uint64_t)k);
        /* a [64, 96] @ W^T with W [80, 96] */
        int64_t as[2] = {64, 96}, ws[2] = {80, 96}, os[2] = {64, 80};
        ct_pair a = ct_random(&r, dt, 2, as, 1.0), w = ct_random(&r, dt, 2, ws, 1.0);
        lm_tensor_view wth, wtd;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w.h), 0, 1, &wth));
        wtd = ct_mirror(w.h, &wth, w.d);
        ct_pair o = ct_poisoned(dt, 2, os);
        lm_tensor *want = lt_poisoned_tensor(dt, 2, os);
        LT_CHECK_OK(lm_matmul_out(g_ref, lm_tensor_as_view(a.h), &wth, lm_tensor_as_view(want)));
        LT_CHECK_OK(lm__cuda_matmul_lt(g_blas, lm_tensor_as_view(a.d), &wtd, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
        char what[64];
        snprintf(what, sizeof what, "matmul_lt %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 30.0));
        /* one batch dim: [3, 20, 32] @ [3, 32, 24] */
        int64_t bas[3] = {3, 20, 32}, bbs[3] = {3, 32, 24}, bos[3] = {3, 20, 24};
        ct_pair ba = ct_random(&r, dt, 3, bas, 1.0), bb = ct_random(&r, dt, 3, bbs, 1.0), bo = ct_poisoned(dt, 3, bos);
        lm_tensor *bwant = lt_poisoned_tensor(dt, 3, bos);
        LT_CHECK_OK(lm_matmul_out(g_ref, lm_tensor_as_view(ba.h), lm_tensor_as_view(bb.h), lm_tensor_as_view(bwant)));
        LT_CHECK_OK(lm__cuda_matmul_lt(g_blas, lm_tensor_as_view(ba.d), lm_tensor_as_view(bb.d), lm_tensor_as_view(bo.d),
                                      ct_stream(g_ctx)));
        snprintf(what, sizeof what, "matmul_lt batched %s", lm_dtype_name(dt));
        ct_check(g_ctx, what, &bo, lm_tensor_as_view(bo.d), lm_tensor_as_view(bwant), ct_nmse(dt), ct_abs(dt, 20.0));
        ct_pair_free(&a), ct_pair_free(&w), ct_pair_free(&o), ct_pair_free(&ba), ct_pair_free(&bb), ct_pair_free(&bo);
        lm_tensor_destroy(want), lm_tensor_destroy(bwant);
    }
    /* mixed dtypes and unit-stride-free layouts are declined */
    lt_rng r = lt_rng_seed(119);
    int64_t s[2] = {8, 8}, s3[3] = {2, 8, 8};
    ct_pair a = ct_random(&r, LM_F32, 2, s, 1.0), b = ct_random(&r, LM_BF16, 2, s, 1.0), o = ct_poisoned(LM_F32, 2, s);
    LT_CHECK_STATUS(lm__cuda_matmul_lt(g_blas, lm_tensor_as_view(a.d), lm_tensor_as_view(b.d), lm_tensor_as_view(o.d),
                                      ct_stream(g_ctx)),
                    LM_UNSUPPORTED);
    ct_pair big = ct_random(&r, LM_F32, 3, s3, 1.0);
    lm_tensor_view every2;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(big.d), 0, 0, 2, 2, &every2)); /* [1, 8, 8] */
    LT_CHECK_OK(lm_tensor_view_select(&every2, 0, 0, &every2));
    LT_CHECK_OK(lm_tensor_view_slice(&every2, 1, 0, 8, 2, &every2)); /* [8, 4]: stride 2 in the last dim */
    int64_t s4[2] = {8, 4};
    ct_pair o4 = ct_poisoned(LM_F32, 2, s4);
    ct_pair w8 = ct_random(&r, LM_F32, 2, s, 1.0);
    LT_CHECK_STATUS(lm__cuda_matmul_lt(g_blas, lm_tensor_as_view(w8.d), &every2, lm_tensor_as_view(o4.d), ct_stream(g_ctx)),
                    LM_UNSUPPORTED);
    ct_pair_free(&a), ct_pair_free(&b), ct_pair_free(&o), ct_pair_free(&big), ct_pair_free(&o4), ct_pair_free(&w8);
}

/* f32 copy of a host tensor. */
static lm_tensor *f32(const lm_tensor_view *v) {
    lm_tensor *o = NULL;
    LT_CHECK_OK(lm_cast(g_ref, v, LM_F32, &o));
    return o;
}

static void test_linear_lt_bias_strided(void) {
    lt_rng r = lt_rng_seed(121);
    int64_t M = 37, K = 64, N = 96, ldx = 80, ldo = 100;
    int64_t xs[2] = {M, ldx}, ws[2] = {N, K}, os[2] = {M, ldo};
    ct_pair x = ct_random(&r, LM_BF16, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 1.0);
    ct_pair bias = ct_random(&r, LM_F32, 1, &N, 1.0), o = ct_poisoned(LM_F32, 2, os);
    lm_tensor_view xv, wt, ov_h, ov_d;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(x.h), 1, 0, K, 1, &xv));
    lm_tensor *x32 = f32(&xv), *w32 = f32(lm_tensor_as_view(w.h));
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w32), 0, 1, &wt));
    int64_t mn[2] = {M, N};
    lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, mn);
    LT_CHECK_OK(lm_matmul_out(g_ref, lm_tensor_as_view(x32), &wt, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_add_out(g_ref, lm_tensor_as_view(want), lm_tensor_as_view(bias.h), lm_tensor_as_view(want)));
    LT_CHECK_OK(lm__cuda_linear_lt(g_blas, lm_tensor_data(x.d), ldx, lm_tensor_data(w.d), lm_tensor_data(bias.d),
                                  lm_tensor_data(o.d), 0, ldo, M, N, K, 0, ct_stream(g_ctx)));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o.h), 1, 0, N, 1, &ov_h));
    ov_d = ct_mirror(o.h, &ov_h, o.d);
    ct_check(g_ctx, "linear_lt", &o, &ov_d, lm_tensor_as_view(want), 1e-9, 1e-3);
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&bias), ct_pair_free(&o);
    lm_tensor_destroy(x32), lm_tensor_destroy(w32), lm_tensor_destroy(want);
}

static void check_gemv_n(lm__cuda_gemv_in in, int M, int64_t N, int64_t K, int accumulate) {
    lt_rng r = lt_rng_seed(131 + (uint64_t)(M * 3 + in) + (uint64_t)K + (uint64_t)N);
    int64_t xw = in == LM__CUDA_GEMV_SWIGLU ? 2 * K : K;
    int64_t xs[2] = {M, xw}, ws[2] = {N, K}, os[2] = {M, N}, mk[2] = {M, K};
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.5), w = ct_random(&r, LM_BF16, 2, ws, 1.0);
    ct_pair nw = ct_random(&r, LM_F32, 1, &K, 1.0), bias = ct_random(&r, LM_F32, 1, &N, 1.0);
    ct_pair o = ct_random(&r, LM_F32, 2, os, 1.0); /* prior contents (accumulate) */
    lm_tensor *in32 = lt_poisoned_tensor(LM_F32, 2, mk), *w32 = f32(lm_tensor_as_view(w.h));
    lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, os);
    float eps = 1e-5f;
    if (in == LM__CUDA_GEMV_PLAIN) LT_CHECK_OK(lm_tensor_view_copy(NULL, lm_tensor_as_view(in32), lm_tensor_as_view(x.h)));
    else if (in == LM__CUDA_GEMV_RMSNORM)
        LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(nw.h), eps, lm_tensor_as_view(in32)));
    else {
        lm_tensor_view g, u;
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(x.h), 1, 0, K, 1, &g));
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(x.h), 1, K, 2 * K, 1, &u));
        LT_CHECK_OK(lm_swiglu_out(g_ref, &g, &u, lm_tensor_as_view(in32)));
    }
    lm_tensor_view wt;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w32), 0, 1, &wt));
    LT_CHECK_OK(lm_matmul_out(g_ref, lm_tensor_as_view(in32), &wt, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_add_out(g_ref, lm_tensor_as_view(want), lm_tensor_as_view(bias.h), lm_tensor_as_view(want)));
    if (accumulate) LT_CHECK_OK(lm_add_out(g_ref, lm_tensor_as_view(want), lm_tensor_as_view(o.h), lm_tensor_as_view(want)));
    else LT_CHECK_OK(lm_tensor_view_poison(NULL, lm_tensor_as_view(o.d)));
    lm__cuda_gemv_params p;
    memset(&p, 0, sizeof p);
    p.in = in, p.wf = LM__CUDA_GEMV_BF16, p.x = lm_tensor_data(x.d), p.ldx = xw, p.norm_w = lm_tensor_data(nw.d);
    p.eps = eps, p.w = lm_tensor_data(w.d), p.ldw = K * 2, p.bias = lm_tensor_data(bias.d), p.out = lm_tensor_data(o.d);
    p.ldo = N, p.accumulate = accumulate, p.M = M, p.N = N, p.K = K;
    LT_CHECK_OK(lm__cuda_linear_gemv(&p, ct_stream(g_ctx)));
    char what[128];
    const char *pf2 = getenv("LOOM_CUDA_GEMV_PF2");
    const char *ks = getenv("LOOM_CUDA_GEMV_KSPLIT");
    snprintf(what, sizeof what, "linear_gemv in %d M %d N %lld K %lld accumulate %d pf2 %s ksplit %s", (int)in, M,
             (long long)N, (long long)K, accumulate, pf2 ? pf2 : "auto", ks ? ks : "auto");
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 1e-9, 2e-3);
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&nw), ct_pair_free(&bias), ct_pair_free(&o);
    lm_tensor_destroy(in32), lm_tensor_destroy(w32), lm_tensor_destroy(want);
}

static void check_gemv(lm__cuda_gemv_in in, int M, int64_t K, int accumulate) {
    check_gemv_n(in, M, 201, K, accumulate);
}

static void test_linear_gemv_fused_inputs(void) {
    const int ms[3] = {1, 3, 8};
    for (int i = 0; i < 3; i++) {
        check_gemv(LM__CUDA_GEMV_PLAIN, ms[i], 256, i == 1);
        check_gemv(LM__CUDA_GEMV_RMSNORM, ms[i], 256, 0);
        check_gemv(LM__CUDA_GEMV_SWIGLU, ms[i], 256, 1);
    }
    /* K = 2,056 (not a multiple of 32 floats: the staged rows are padded): in(x) staged
     * in shared memory (M = 8: 66 KiB, past the default 48 KiB); K = 7,208 at M = 8 (231
     * KiB, past an H200's opt-in limit): read from global memory per use */
    for (int i = 0; i < 3; i++) {
        check_gemv(LM__CUDA_GEMV_RMSNORM, ms[i], 2056, 1);
        check_gemv(LM__CUDA_GEMV_SWIGLU, ms[i], 2056, 0);
    }
    check_gemv(LM__CUDA_GEMV_RMSNORM, 8, 7208, 0);
    check_gemv(LM__CUDA_GEMV_SWIGLU, 8, 7208, 1);
    /* one row, more row groups than the grid has warps (40,003 rows of 256; 1,201 rows of
     * 2,056, split-K: more groups than blocks): each warp's second group prefetched before
     * the wait (PF2), or not, or as the launcher picks */
    static const char *const pf2[3] = {"1", "0", NULL};
    for (int v = 0; v < 3; v++) {
        if (pf2[v]) setenv("LOOM_CUDA_GEMV_PF2", pf2[v], 1);
        else unsetenv("LOOM_CUDA_GEMV_PF2");
        for (int in = 0; in < 3; in++) {
            check_gemv_n((lm__cuda_gemv_in)in, 1, 40003, 256, in == 1);
            check_gemv_n((lm__cuda_gemv_in)in, 1, 1201, 2056, in == 2);
        }
    }
    unsetenv("LOOM_CUDA_GEMV_PF2");
    /* one and two rows with a row's K split over 1, 2, 4 or 8 warps (forced; 2 and 4
     * combine several row groups in one block), the two-way rule and the rounds rule:
     * odd N (the last group short), K of one warp batch or many */
    static const char *const splits[6] = {"1", "2", "4", "8", "old", NULL};
    for (int v = 0; v < 6; v++) {
        if (splits[v]) setenv("LOOM_CUDA_GEMV_KSPLIT", splits[v], 1);
        else unsetenv("LOOM_CUDA_GEMV_KSPLIT");
        for (int m = 1; m <= 2; m++)
            for (int in = 0; in < 3; in++) {
                check_gemv_n((lm__cuda_gemv_in)in, m, 201, 2056, in == 1);
                check_gemv_n((lm__cuda_gemv_in)in, m, 2049, 2048, in == 2);
                check_gemv_n((lm__cuda_gemv_in)in, m, 5003, 256, in == 0);
            }
    }
    unsetenv("LOOM_CUDA_GEMV_KSPLIT");
    lm__cuda_gemv_params bad;
    memset(&bad, 0, sizeof bad);
    bad.ldx = 12, bad.ldw = 24, bad.ldo = 4, bad.M = 9, bad.N = 4, bad.K = 12;
    LT_CHECK_STATUS(lm__cuda_linear_gemv(&bad, ct_stream(g_ctx)), LM_UNSUPPORTED); /* M = 9 > 8 */
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_CHECK_OK(lm__ctx_cuda_blas(g_ctx, &g_blas));
    LT_RUN(test_readable_matmul);
    LT_RUN(test_cublaslt_matmul);
    LT_RUN(test_linear_lt_bias_strided);
    LT_RUN(test_linear_gemv_fused_inputs);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
