/* Tests for lm_tensor_wrap, the zero-copy tensor over caller memory (issue 17 item 3):
 * the caller's release runs exactly once, when the last tensor goes (derived views
 * and contiguous() of a contiguous view included), and never when the call fails
 * (bad arguments, every allocation failing in turn); operators (matmul, add with a
 * broadcast input, rmsnorm, softmax, cast) read and write strided caller memory with
 * the results they give on owned tensors and leave the padding between rows alone;
 * every bad argument gives its documented status; empty and scalar tensors; a CUDA
 * device: refused without CUDA or a GPU, otherwise an add through wrapped device memory.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

typedef struct release_probe {
    int calls;
    void *data;
} release_probe;

static void on_release(void *user, void *data) {
    release_probe *p = user;
    p->calls++;
    p->data = data;
}

/* ---- lifetime ------------------------------------------------------------------------ */
static void test_release_runs_once_after_the_last_view(void) {
    float buf[24];
    for (int i = 0; i < 24; i++) buf[i] = (float)i;
    release_probe probe = {0, NULL};
    int64_t shape[2] = {4, 6};
    lm_tensor *t = NULL, *tt = NULL, *sl = NULL, *c = NULL, *r = NULL;
    LT_CHECK_OK(lm_tensor_wrap(lm_device_cpu(), buf, LM_F32, 2, shape, NULL, on_release, &probe, &t));
    LT_CHECK(t && lm_tensor_data(t) == buf && lm_tensor_numel(t) == 24 && lm_tensor_offset(t) == 0);
    LT_CHECK(lm_storage_data(lm_tensor_storage(t)) == buf && lm_storage_nbytes(lm_tensor_storage(t)) == sizeof buf);
    LT_CHECK_OK(lm_tensor_transpose(t, 0, 1, &tt));
    LT_CHECK_OK(lm_tensor_slice(t, 1, 1, 6, 2, &sl));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, t, &c)); /* contiguous: shares the memory */
    int64_t flat[1] = {24};
    LT_CHECK_OK(lm_tensor_reshape(c, 1, flat, &r));
    LT_CHECK(lm_tensor_data(c) == buf && lm_tensor_data(r) == buf && lm_tensor_data(sl) == buf + 1);
    lm_tensor_destroy(t);
    lm_tensor_destroy(c);
    lm_tensor_destroy(r);
    lm_tensor_destroy(tt);
    LT_CHECK(probe.calls == 0);
    LT_CHECK(((float *)lm_tensor_data(sl))[lm_tensor_as_view(sl)->stride[0] * 3 + 2 * 2] == 23.0f);
    lm_tensor_destroy(sl);
    LT_CHECK(probe.calls == 1 && probe.data == buf);

    /* release NULL: memory that outlives the tensor */
    LT_CHECK_OK(lm_tensor_wrap(lm_device_cpu(), buf, LM_F32, 2, shape, NULL, NULL, NULL, &t));
    lm_tensor_destroy(t);
}

static void test_empty_and_scalar_tensors(void) {
    release_probe probe = {0, NULL};
    int64_t s0[2] = {3, 0};
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_wrap(lm_device_cpu(), NULL, LM_BF16, 2, s0, NULL, on_release, &probe, &t));
    LT_CHECK(t && lm_tensor_numel(t) == 0 && lm_tensor_data(t) == NULL);
    lm_tensor_destroy(t);
    LT_CHECK(probe.calls == 1 && probe.data == NULL); /* the caller's state is released too */
    int64_t x = 42;
    LT_CHECK_OK(lm_tensor_wrap(lm_device_cpu(), &x, LM_I64, 0, NULL, NULL, on_release, &probe, &t));
    LT_CHECK(t && lm_tensor_ndim(t) == 0 && lm_tensor_numel(t) == 1 && *(int64_t *)lm_tensor_data(t) == 42);
    lm_tensor_destroy(t);
    LT_CHECK(probe.calls == 2 && probe.data == &x);
}

static void test_failed_wrap_never_releases_and_leaks_nothing(void) {
    float buf[8];
    release_probe probe = {0, NULL};
    int64_t shape[2] = {2, 4};
    for (int k = 1; k <= 4; k++) {
        lm_tensor *t = NULL;
        lt_alloc_track(k);
        lm_status st = lm_tensor_wrap(lm_device_cpu(), buf, LM_F32, 2, shape, NULL, on_release, &probe, &t);
        int64_t attempts = lt_alloc_count();
        if (st == LM_OK) {
            LT_CHECK_MSG(attempts < k, "allocation %d failed but the call succeeded", k);
            lm_tensor_destroy(t);
            LT_CHECK(probe.calls == 1);
            probe.calls = 0;
        } else {
            LT_CHECK_MSG(st == LM_OUT_OF_MEMORY, "fail_at %d: %s", k, lm_status_name(st));
            LT_CHECK_MSG(t == NULL && probe.calls == 0, "fail_at %d: out set or release called (%d)", k, probe.calls);
        }
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
}

/* ---- bad arguments ----------------------------------------------------------------------- */
static void expect_error(lm_status want, lm_device d, void *data, lm_dtype dt, int ndim, const int64_t *shape,
                         const int64_t *strides, const char *needle) {
    release_probe probe = {0, NULL};
    lm_tensor *t = (lm_tensor *)&probe; /* must be reset to NULL */
    lm_status st = lm_tensor_wrap(d, data, dt, ndim, shape, strides, on_release, &probe, &t);
    LT_CHECK_MSG(st == want, "expected %s for '%s', got %s (%s)", lm_status_name(want), needle, lm_status_name(st),
                 lm_last_error());
    LT_CHECK_MSG(strstr(lm_last_error(), needle) != NULL, "message '%s' does not mention '%s'", lm_last_error(), needle);
    LT_CHECK(t == NULL && probe.calls == 0);
}

static void test_bad_arguments_give_documented_errors(void) {
    float buf[16];
    int64_t shape[2] = {2, 4}, neg_dim[2] = {2, -4}, neg_stride[2] = {-4, 1}, big[2] = {INT64_MAX / 2, 4};
    int64_t huge_stride[2] = {INT64_MAX / 2, 1}, s34[2] = {3, 4};
    lm_device cpu = lm_device_cpu();
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, (lm_dtype)LM_DTYPE_COUNT, 2, shape, NULL, "dtype");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, (lm_dtype)-1, 2, shape, NULL, "dtype");
    expect_error(LM_INVALID_ARGUMENT, (lm_device){(lm_device_type)7, 0}, buf, LM_F32, 2, shape, NULL, "device type");
    expect_error(LM_DEVICE_ERROR, (lm_device){LM_DEVICE_CPU, 1}, buf, LM_F32, 2, shape, NULL, "cpu:1");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, LM_F32, LM_MAX_DIMS + 1, shape, NULL, "ndim");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, LM_F32, -1, shape, NULL, "ndim");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, LM_F32, 2, neg_dim, NULL, "negative");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, LM_F32, 2, shape, neg_stride, "negative");
    expect_error(LM_INVALID_ARGUMENT, cpu, NULL, LM_F32, 2, shape, NULL, "NULL data");
    expect_error(LM_INVALID_ARGUMENT, cpu, (char *)buf + 2, LM_F32, 2, shape, NULL, "aligned");
    expect_error(LM_OUT_OF_RANGE, cpu, buf, LM_F32, 2, s34, huge_stride, "2^63");
    expect_error(LM_OUT_OF_RANGE, cpu, buf, LM_F32, 2, shape, huge_stride, "address space");
    expect_error(LM_INVALID_ARGUMENT, cpu, buf, LM_U8, 2, big, NULL, "overflows");
    LT_CHECK_STATUS(lm_tensor_wrap(cpu, buf, LM_F32, 2, shape, NULL, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    /* an element-size-aligned odd address is fine for a 1-byte dtype */
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_wrap(cpu, (char *)buf + 1, LM_U8, 2, shape, NULL, NULL, NULL, &t));
    lm_tensor_destroy(t);
}

/* ---- operators through wrapped strided memory -------------------------------------------------- */
#define PAD_VALUE 12345.0f

/* Compares a wrapped CPU view with an owned tensor element by element (exact for
 * results the same code computed; tol covers different implementation levels). */
static void check_same(const char *what, const lm_tensor_view *got, const lm_tensor *want, double tol) {
    double *g = lt_view_to_f64(got), *w = lt_view_to_f64(lm_tensor_as_view(want));
    lt_check_close(what, g, w, lm_tensor_numel(want), tol, tol > 0 ? 1e-5 : 0);
    free(g);
    free(w);
}

/* The padding between rows of a [rows, cols] buffer with row stride ld kept its value. */
static int padding_intact(const float *buf, int64_t rows, int64_t cols, int64_t ld) {
    for (int64_t i = 0; i < rows; i++)
        for (int64_t j = cols; j < ld; j++)
            if (buf[i * ld + j] != PAD_VALUE) return 0;
    return 1;
}

/* Caller buffers: a [M, K] with row stride K + 3; w [N, K] used transposed as b [K, N]
 * (strides {1, K}); out [M, N] with row stride N + 2; bias [N] broadcast over rows
 * (stride {0, 1}). */
static void test_operators_read_and_write_caller_memory(void) {
    enum { M = 5, K = 7, N = 6, LDA = K + 3, LDO = N + 2 };
    static float a_buf[M * LDA], r_buf[M * LDA], w_buf[N * K], o_buf[M * LDO], bias_buf[N], x_buf[M * LDA], nw_buf[K];
    lt_rng rng = lt_rng_seed(17);
    for (int i = 0; i < M * LDA; i++) a_buf[i] = (float)lt_rng_normal(&rng), x_buf[i] = (float)lt_rng_normal(&rng);
    for (int i = 0; i < N * K; i++) w_buf[i] = (float)lt_rng_normal(&rng);
    for (int i = 0; i < N; i++) bias_buf[i] = (float)lt_rng_normal(&rng);
    for (int i = 0; i < K; i++) nw_buf[i] = 1.0f + 0.1f * (float)lt_rng_normal(&rng);
    lm_device cpu = lm_device_cpu();
    int64_t sa[2] = {M, K}, sta[2] = {LDA, 1}, sb[2] = {K, N}, stb[2] = {1, K}, so[2] = {M, N}, sto[2] = {LDO, 1};
    int64_t sbias[2] = {M, N}, stbias[2] = {0, 1}, sk[1] = {K};
    lm_tensor *a = NULL, *b = NULL, *o = NULL, *bias = NULL, *x = NULL, *nw = NULL;
    LT_CHECK_OK(lm_tensor_wrap(cpu, a_buf, LM_F32, 2, sa, sta, NULL, NULL, &a));
    LT_CHECK_OK(lm_tensor_wrap(cpu, w_buf, LM_F32, 2, sb, stb, NULL, NULL, &b));
    LT_CHECK_OK(lm_tensor_wrap(cpu, o_buf, LM_F32, 2, so, sto, NULL, NULL, &o));
    LT_CHECK_OK(lm_tensor_wrap(cpu, bias_buf, LM_F32, 2, sbias, stbias, NULL, NULL, &bias));
    LT_CHECK_OK(lm_tensor_wrap(cpu, x_buf, LM_F32, 2, sa, sta, NULL, NULL, &x));
    LT_CHECK_OK(lm_tensor_wrap(cpu, nw_buf, LM_F32, 1, sk, NULL, NULL, NULL, &nw));
    if (!a || !b || !o || !bias || !x || !nw) goto done;
    /* owned, contiguous copies of the same inputs */
    lm_tensor *ca = NULL, *cb = NULL, *cbias = NULL, *cx = NULL, *cnw = NULL;
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, a, &ca));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, b, &cb));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, bias, &cbias));
    LT_CHECK_OK(lm_tensor_contiguous(g_ctx, x, &cx));
    LT_CHECK_OK(lm_tensor_to_device(g_ctx, nw, cpu, &cnw));
    LT_CHECK(lm_tensor_data(ca) != a_buf && lm_tensor_data(cb) != w_buf);
    const lm_impl impls[2] = {LM_IMPL_REF, LM_IMPL_AUTO};
    for (int k = 0; k < 2; k++) {
        lm_ctx_set_impl(g_ctx, impls[k]);
        const lm_tensor_view *ov = lm_tensor_as_view(o);
        lm_tensor *want = NULL;
        /* matmul */
        for (int i = 0; i < M * LDO; i++) o_buf[i] = PAD_VALUE;
        LT_CHECK_OK(lm_tensor_view_poison(g_ctx, ov));
        LT_CHECK_OK(lm_matmul_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), ov));
        LT_CHECK_OK(lm_matmul(g_ctx, lm_tensor_as_view(ca), lm_tensor_as_view(cb), &want));
        if (want) check_same("matmul", ov, want, 1e-12);
        LT_CHECK(padding_intact(o_buf, M, N, LDO));
        lm_tensor_destroy(want), want = NULL;
        /* add with a broadcast (stride 0) caller input, in place over the caller output */
        lm_tensor *prod = NULL;
        LT_CHECK_OK(lm_tensor_contiguous(g_ctx, o, &prod));
        LT_CHECK_OK(lm_add_out(g_ctx, ov, lm_tensor_as_view(bias), ov));
        if (prod) LT_CHECK_OK(lm_add(g_ctx, lm_tensor_as_view(prod), lm_tensor_as_view(cbias), &want));
        if (want) check_same("add", ov, want, 0);
        LT_CHECK(padding_intact(o_buf, M, N, LDO));
        lm_tensor_destroy(want), want = NULL;
        lm_tensor_destroy(prod);
        /* rmsnorm and softmax from padded caller rows into other padded caller rows */
        lm_tensor *ra = NULL;
        int64_t ra_shape[2] = {M, K};
        LT_CHECK_OK(lm_tensor_wrap(cpu, r_buf, LM_F32, 2, ra_shape, sta, NULL, NULL, &ra));
        for (int i = 0; i < M * LDA; i++) r_buf[i] = PAD_VALUE;
        LT_CHECK_OK(lm_tensor_view_poison(g_ctx, lm_tensor_as_view(ra)));
        LT_CHECK_OK(lm_rmsnorm_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(nw), 1e-5f, lm_tensor_as_view(ra)));
        LT_CHECK_OK(lm_rmsnorm(g_ctx, lm_tensor_as_view(cx), lm_tensor_as_view(cnw), 1e-5f, &want));
        if (want) check_same("rmsnorm", lm_tensor_as_view(ra), want, 1e-12);
        lm_tensor_destroy(want), want = NULL;
        LT_CHECK_OK(lm_tensor_view_poison(g_ctx, lm_tensor_as_view(ra)));
        LT_CHECK_OK(lm_softmax_out(g_ctx, lm_tensor_as_view(x), 0.5f, 0, lm_tensor_as_view(ra)));
        LT_CHECK_OK(lm_softmax(g_ctx, lm_tensor_as_view(cx), 0.5f, 0, &want));
        if (want) check_same("softmax", lm_tensor_as_view(ra), want, 1e-12);
        lm_tensor_destroy(want), want = NULL;
        LT_CHECK(padding_intact(r_buf, M, K, LDA));
        /* cast from wrapped strided f32 into a wrapped bf16 caller buffer */
        uint16_t h_buf[M * K];
        lm_tensor *h = NULL;
        LT_CHECK_OK(lm_tensor_wrap(cpu, h_buf, LM_BF16, 2, ra_shape, NULL, NULL, NULL, &h));
        LT_CHECK_OK(lm_tensor_view_poison(g_ctx, lm_tensor_as_view(h)));
        LT_CHECK_OK(lm_cast_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(h)));
        LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(cx), LM_BF16, &want));
        if (want) LT_CHECK(memcmp(h_buf, lm_tensor_data(want), sizeof h_buf) == 0);
        lm_tensor_destroy(want);
        lm_tensor_destroy(h);
        lm_tensor_destroy(ra);
    }
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    /* a broadcast view may be read but never written */
    LT_CHECK_STATUS(lm_add_out(g_ctx, lm_tensor_as_view(bias), lm_tensor_as_view(bias), lm_tensor_as_view(bias)),
                    LM_INVALID_ARGUMENT);
    lm_tensor_destroy(ca);
    lm_tensor_destroy(cb);
    lm_tensor_destroy(cbias);
    lm_tensor_destroy(cx);
    lm_tensor_destroy(cnw);
done:
    lm_tensor_destroy(a);
    lm_tensor_destroy(b);
    lm_tensor_destroy(o);
    lm_tensor_destroy(bias);
    lm_tensor_destroy(x);
    lm_tensor_destroy(nw);
}

/* ---- CUDA --------------------------------------------------------------------------------------- */
static void device_free_release(void *user, void *data) {
    release_probe *p = user;
    p->calls++;
    lm_device_free(lm_device_cuda(0), data);
}

static void test_cuda_memory(void) {
    int64_t shape[2] = {3, 5};
    float dummy[15];
    lm_tensor *t = NULL;
    if (lm_cuda_device_count() == 0) {
        lm_status want = lm_cuda_compiled() ? LM_DEVICE_ERROR : LM_UNSUPPORTED;
        LT_CHECK_STATUS(lm_tensor_wrap(lm_device_cuda(0), dummy, LM_F32, 2, shape, NULL, NULL, NULL, &t), want);
        LT_CHECK(t == NULL && strstr(lm_last_error(), "cuda:0") != NULL);
        return;
    }
    lm_ctx *ctx = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cuda(0), 1, &ctx));
    float host[15], back[15];
    for (int i = 0; i < 15; i++) host[i] = (float)i - 3.0f;
    void *dx = NULL;
    release_probe probe = {0, NULL};
    LT_CHECK_OK(lm_device_alloc(lm_device_cuda(0), sizeof host, &dx));
    LT_CHECK_OK(lm_device_copy(lm_device_cuda(0), dx, lm_device_cpu(), host, sizeof host));
    LT_CHECK_OK(lm_tensor_wrap(lm_device_cuda(0), dx, LM_F32, 2, shape, NULL, device_free_release, &probe, &t));
    if (t && ctx) {
        LT_CHECK(lm_tensor_data(t) == dx);
        LT_CHECK_OK(lm_add_out(ctx, lm_tensor_as_view(t), lm_tensor_as_view(t), lm_tensor_as_view(t)));
        LT_CHECK_OK(lm_ctx_synchronize(ctx));
        LT_CHECK_OK(lm_device_copy(lm_device_cpu(), back, lm_device_cuda(0), dx, sizeof back));
        for (int i = 0; i < 15; i++) LT_CHECK(back[i] == 2.0f * host[i]);
    }
    lm_tensor_destroy(t);
    LT_CHECK(probe.calls == 1);
    lm_ctx_destroy(ctx);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 2, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_release_runs_once_after_the_last_view);
    LT_RUN(test_empty_and_scalar_tensors);
    LT_RUN(test_failed_wrap_never_releases_and_leaks_nothing);
    LT_RUN(test_bad_arguments_give_documented_errors);
    LT_RUN(test_operators_read_and_write_caller_memory);
    LT_RUN(test_cuda_memory);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
