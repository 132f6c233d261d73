/* The public operator API on a CUDA context: each lm_*_out call made with a cuda
 * context must route to the CUDA implementation and agree with the same call on a
 * CPU reference context (gates as in cuda_test.h), and a host operand on a cuda
 * context is refused. Complements the launcher-level tests, which call the CUDA
 * kernels directly.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifdef LOOM_HAVE_CUDA
static lm_ctx *g_gpu, *g_ref;

/* Runs a two-input f32 op on both contexts and compares outputs. */
typedef lm_status (*binary_fn)(lm_ctx *, const lm_tensor_view *, const lm_tensor_view *, const lm_tensor_view *);

static void check_binary(const char *what, binary_fn fn, int nd, const int64_t *sa, const int64_t *sb,
                         const int64_t *so, double scale) {
    lt_rng r = lt_rng_seed(11);
    ct_pair a = ct_random(&r, LM_F32, nd, sa, 1.0), b = ct_random(&r, LM_F32, nd, sb, 1.0);
    ct_pair o = ct_poisoned(LM_F32, nd, so);
    lm_tensor *want = lt_poisoned_tensor(LM_F32, nd, so);
    LT_CHECK_OK(fn(g_ref, lm_tensor_as_view(a.h), lm_tensor_as_view(b.h), lm_tensor_as_view(want)));
    LT_CHECK_OK(fn(g_gpu, lm_tensor_as_view(a.d), lm_tensor_as_view(b.d), lm_tensor_as_view(o.d)));
    ct_check(g_gpu, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_F32), ct_abs(LM_F32, scale));
    ct_pair_free(&a), ct_pair_free(&b), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

static void test_binary_and_matmul_route_to_cuda(void) {
    int64_t s[2] = {33, 70}, bias[2] = {1, 70};
    check_binary("add", lm_add_out, 2, s, bias, s, 4);
    check_binary("mul", lm_mul_out, 2, s, s, s, 4);
    int64_t sa[2] = {17, 96}, sb[2] = {96, 40}, so[2] = {17, 40};
    check_binary("matmul", lm_matmul_out, 2, sa, sb, so, 30);
}

static void test_norm_softmax_attention_route_to_cuda(void) {
    lt_rng r = lt_rng_seed(12);
    int64_t xs[2] = {9, 64}, ws[1] = {64};
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0), w = ct_random(&r, LM_F32, 1, ws, 1.0), o = ct_poisoned(LM_F32, 2, xs);
    lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, xs);
    LT_CHECK_OK(lm_rmsnorm_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(w.h), 1e-6f, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_rmsnorm_out(g_gpu, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), 1e-6f, lm_tensor_as_view(o.d)));
    ct_check(g_gpu, "rmsnorm", &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_F32), ct_abs(LM_F32, 4));
    LT_CHECK_OK(lm_softmax_out(g_ref, lm_tensor_as_view(x.h), 0.5f, 0, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_softmax_out(g_gpu, lm_tensor_as_view(x.d), 0.5f, 0, lm_tensor_as_view(o.d)));
    ct_check(g_gpu, "softmax", &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(LM_F32), ct_abs(LM_F32, 1));
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&o);
    lm_tensor_destroy(want);
    int64_t qs[4] = {1, 4, 6, 32}, ks[4] = {1, 2, 10, 32};
    ct_pair q = ct_random(&r, LM_F32, 4, qs, 1.0), k = ct_random(&r, LM_F32, 4, ks, 1.0), v = ct_random(&r, LM_F32, 4, ks, 1.0);
    ct_pair ao = ct_poisoned(LM_F32, 4, qs);
    lm_tensor *awant = lt_poisoned_tensor(LM_F32, 4, qs);
    LT_CHECK_OK(lm_attention_out(g_ref, lm_tensor_as_view(q.h), lm_tensor_as_view(k.h), lm_tensor_as_view(v.h), 0.125f, 1,
                                 lm_tensor_as_view(awant)));
    LT_CHECK_OK(lm_attention_out(g_gpu, lm_tensor_as_view(q.d), lm_tensor_as_view(k.d), lm_tensor_as_view(v.d), 0.125f, 1,
                                 lm_tensor_as_view(ao.d)));
    ct_check(g_gpu, "attention", &ao, lm_tensor_as_view(ao.d), lm_tensor_as_view(awant), ct_nmse(LM_F32), ct_abs(LM_F32, 2));
    ct_pair_free(&q), ct_pair_free(&k), ct_pair_free(&v), ct_pair_free(&ao);
    lm_tensor_destroy(awant);
}

static void test_host_operand_on_cuda_context_is_refused(void) {
    lt_rng r = lt_rng_seed(13);
    int64_t s[1] = {8};
    ct_pair a = ct_random(&r, LM_F32, 1, s, 1.0);
    LT_CHECK_STATUS(lm_add_out(g_gpu, lm_tensor_as_view(a.h), lm_tensor_as_view(a.d), lm_tensor_as_view(a.d)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "cuda:0") != NULL);
    ct_pair_free(&a);
}
#endif

int main(void) {
#ifndef LOOM_HAVE_CUDA
    lt_skip("built without CUDA");
#else
    if (lm_cuda_device_count() == 0) lt_skip("no CUDA device");
    LT_CHECK_OK(lm_ctx_create(ct_gpu, 1, &g_gpu));
    g_ref = ct_ref_ctx();
    LT_RUN(test_binary_and_matmul_route_to_cuda);
    LT_RUN(test_norm_softmax_attention_route_to_cuda);
    LT_RUN(test_host_operand_on_cuda_context_is_refused);
    lm_ctx_destroy(g_gpu);
    lm_ctx_destroy(g_ref);
#endif
    return lt_finish();
}
