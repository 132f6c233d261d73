/* Tests for add, mul, scale, cast, silu and swiglu against float64 re-derivations:
 * random shapes (size-1 and zero-size dims), broadcasting, non-contiguous inputs,
 * NaN-poisoned outputs, and every error path with its exact status.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
/* one rounding of the result to the dtype: relative error 2^-24 / 2^-9 / 2^-12 */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.1 : 0.01; }

static void random_shape(lt_rng *r, int *ndim, int64_t *shape) {
    *ndim = (int)lt_rng_int(r, 0, 4);
    for (int i = 0; i < *ndim; i++) shape[i] = lt_rng_int(r, 1, 6);
}

static void test_add_mul_match_f64_with_broadcast(void) {
    lt_rng r = lt_rng_seed(1);
    for (int trial = 0; trial < 60; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int nd;
        int64_t shape[LM_MAX_DIMS], bshape[LM_MAX_DIMS];
        random_shape(&r, &nd, shape);
        for (int i = 0; i < nd; i++) bshape[i] = lt_rng_int(&r, 0, 2) == 0 ? 1 : shape[i];
        lm_tensor *a = lt_random_tensor(&r, dt, nd, shape, 1.0), *b = lt_random_tensor(&r, dt, nd, bshape, 1.0);
        for (int op = 0; op < 2; op++) {
            lm_tensor *out = lt_poisoned_tensor(dt, nd, shape);
            const lm_tensor_view *va = lm_tensor_as_view(a), *vb = lm_tensor_as_view(b), *vo = lm_tensor_as_view(out);
            LT_CHECK_OK(op ? lm_mul_out(g_ctx, va, vb, vo) : lm_add_out(g_ctx, va, vb, vo));
            double *x = lt_view_to_f64(va), *o = lt_view_to_f64(vo);
            lm_tensor_view eb;
            LT_CHECK_OK(lm_tensor_view_expand(vb, nd, shape, &eb));
            double *y = lt_view_to_f64(&eb);
            int64_t n = lm_tensor_numel(out);
            double *want = malloc(sizeof(double) * (size_t)n);
            for (int64_t i = 0; i < n; i++) want[i] = op ? x[i] * y[i] : x[i] + y[i];
            lt_check_close(op ? "mul" : "add", o, want, n, tol_nmse(dt), tol_abs(dt) * 4);
            free(x), free(y), free(o), free(want);
            lm_tensor_destroy(out);
        }
        lm_tensor_destroy(a);
        lm_tensor_destroy(b);
    }
}

static void test_add_allocating_form_broadcasts_rank(void) {
    lt_rng r = lt_rng_seed(2);
    int64_t sa[3] = {2, 3, 4}, sb[1] = {4};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 3, sa, 1), *b = lt_random_tensor(&r, LM_F32, 1, sb, 1), *o = NULL;
    LT_CHECK_OK(lm_add(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), &o));
    LT_CHECK(o && lm_tensor_ndim(o) == 3 && lm_tensor_dim(o, 0) == 2 && lm_tensor_dim(o, 2) == 4);
    const float *pa = lm_tensor_data(a), *pb = lm_tensor_data(b), *po = lm_tensor_data(o);
    for (int i = 0; i < 24; i++) LT_CHECK(po[i] == pa[i] + pb[i % 4]);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(o);
}

static void test_unary_ops_on_transposed_views(void) {
    lt_rng r = lt_rng_seed(3);
    for (int trial = 0; trial < 30; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int64_t shape[2] = {lt_rng_int(&r, 1, 7), lt_rng_int(&r, 1, 7)};
        lm_tensor *x = lt_random_tensor(&r, dt, 2, shape, 2.0);
        lm_tensor_view xt;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(x), 0, 1, &xt));
        int64_t oshape[2] = {shape[1], shape[0]};
        double *xv = lt_view_to_f64(&xt);
        int64_t n = shape[0] * shape[1];
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int op = 0; op < 2; op++) {
            lm_tensor *o = lt_poisoned_tensor(dt, 2, oshape);
            if (op == 0) LT_CHECK_OK(lm_scale_out(g_ctx, &xt, -1.75f, lm_tensor_as_view(o)));
            else LT_CHECK_OK(lm_silu_out(g_ctx, &xt, lm_tensor_as_view(o)));
            for (int64_t i = 0; i < n; i++) want[i] = op == 0 ? xv[i] * -1.75 : xv[i] / (1 + exp(-xv[i]));
            double *got = lt_view_to_f64(lm_tensor_as_view(o));
            lt_check_close(op ? "silu" : "scale", got, want, n, tol_nmse(dt), tol_abs(dt) * 4);
            free(got);
            lm_tensor_destroy(o);
        }
        free(xv), free(want);
        lm_tensor_destroy(x);
    }
}

static void test_swiglu_matches_f64(void) {
    lt_rng r = lt_rng_seed(4);
    for (int trial = 0; trial < 12; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int64_t shape[3] = {lt_rng_int(&r, 1, 3), lt_rng_int(&r, 1, 5), lt_rng_int(&r, 1, 9)};
        lm_tensor *g = lt_random_tensor(&r, dt, 3, shape, 2.0), *u = lt_random_tensor(&r, dt, 3, shape, 1.0), *o = NULL;
        LT_CHECK_OK(lm_swiglu(g_ctx, lm_tensor_as_view(g), lm_tensor_as_view(u), &o));
        double *gv = lt_view_to_f64(lm_tensor_as_view(g)), *uv = lt_view_to_f64(lm_tensor_as_view(u));
        double *ov = lt_view_to_f64(lm_tensor_as_view(o));
        int64_t n = lm_tensor_numel(g);
        double *want = malloc(sizeof(double) * (size_t)n);
        for (int64_t i = 0; i < n; i++) want[i] = gv[i] / (1 + exp(-gv[i])) * uv[i];
        lt_check_close("swiglu", ov, want, n, tol_nmse(dt), tol_abs(dt) * 8);
        free(gv), free(uv), free(ov), free(want);
        lm_tensor_destroy(g), lm_tensor_destroy(u), lm_tensor_destroy(o);
    }
}

static void test_cast_rounds_to_nearest_even_and_checks_ranges(void) {
    float src[4] = {1.0f, 1.00390625f /* 1 + 2^-8: bf16 tie -> 1.0 */, 1.01171875f /* 1 + 3*2^-8 -> up */, -3.5f};
    int64_t shape[1] = {4};
    lm_tensor *x = NULL, *o = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, shape, src, &x));
    LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(x), LM_BF16, &o));
    const uint16_t *b = lm_tensor_data(o);
    LT_CHECK(b[0] == 0x3f80 && b[1] == 0x3f80 && b[2] == 0x3f82 && b[3] == 0xc060);
    lm_tensor_destroy(o);
    LT_CHECK_STATUS(lm_cast(g_ctx, lm_tensor_as_view(x), LM_I32, &o), LM_UNSUPPORTED);
    LT_CHECK(o == NULL);
    lm_tensor_destroy(x);
    int64_t big[2] = {5, 300};
    int64_t s2[1] = {2};
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, s2, big, &x));
    LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(x), LM_I32, &o));
    LT_CHECK(((int32_t *)lm_tensor_data(o))[1] == 300);
    lm_tensor_destroy(o);
    LT_CHECK_STATUS(lm_cast(g_ctx, lm_tensor_as_view(x), LM_U8, &o), LM_OUT_OF_RANGE);
    LT_CHECK(o == NULL);
    LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(x), LM_F16, &o));
    LT_CHECK(lm_f16_to_f32(((uint16_t *)lm_tensor_data(o))[1]) == 300.0f);
    lm_tensor_destroy(o);
    lm_tensor_destroy(x);
}

static void test_elementwise_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(5);
    int64_t s23[2] = {2, 3}, s32[2] = {3, 2};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s23, 1), *b = lt_random_tensor(&r, LM_F32, 2, s32, 1);
    lm_tensor *h = lt_random_tensor(&r, LM_F16, 2, s23, 1), *i = lt_random_tensor(&r, LM_I32, 2, s23, 1);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, s23), *o2 = NULL;
    const lm_tensor_view *va = lm_tensor_as_view(a), *vo = lm_tensor_as_view(o);
    LT_CHECK_STATUS(lm_add_out(g_ctx, va, lm_tensor_as_view(b), vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "[2, 3]") && strstr(lm_last_error(), "[3, 2]"));
    LT_CHECK_STATUS(lm_add_out(g_ctx, va, lm_tensor_as_view(h), vo), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_mul_out(g_ctx, lm_tensor_as_view(i), lm_tensor_as_view(i), vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_add_out(g_ctx, va, va, lm_tensor_as_view(b)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_add_out(g_ctx, NULL, va, vo), LM_INVALID_ARGUMENT);
    /* a broadcast (stride 0) output would be written twice */
    lm_tensor_view ov;
    int64_t one[2] = {1, 3};
    lm_tensor *small = lt_poisoned_tensor(LM_F32, 2, one);
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(small), 2, s23, &ov));
    LT_CHECK_STATUS(lm_add_out(g_ctx, va, va, &ov), LM_INVALID_ARGUMENT);
    /* operands on another device */
    lm_tensor_view dev = *va;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_add_out(g_ctx, &dev, va, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_add(g_ctx, va, lm_tensor_as_view(b), &o2), LM_SHAPE_MISMATCH);
    LT_CHECK(o2 == NULL);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(h), lm_tensor_destroy(i);
    lm_tensor_destroy(o), lm_tensor_destroy(small);
}

static void test_allocating_forms_leak_nothing_when_allocation_fails(void) {
    lt_rng r = lt_rng_seed(6);
    int64_t s[2] = {4, 5};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, s, 1);
    for (int k = 1; k <= 3; k++) {
        lm_tensor *o = NULL;
        lt_alloc_track(k);
        lm_status st = lm_add(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(a), &o);
        int64_t attempts = lt_alloc_count();
        if (k <= attempts) LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
        lm_tensor_destroy(o);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor_destroy(a);
}

/* The autograd's widened accumulation acc (f32) += x on the CPU: every x float dtype,
 * exact against acc + (double)x rounded once to f32; a transposed x; a bf16 acc takes
 * x rounded to bf16 first (cast + add, exactly); bad operands (an integer acc, another
 * shape, an x overlapping acc) are refused with acc untouched. */
static void test_accumulate_out_is_exact(void) {
    lt_rng r = lt_rng_seed(9);
    int64_t shape[2] = {5, 7};
    for (int i = 0; i < 3; i++) {
        lm_tensor *acc = lt_random_tensor(&r, LM_F32, 2, shape, 3.0), *x = lt_random_tensor(&r, k_floats[i], 2, shape, 2.0);
        double *a0 = lt_view_to_f64(lm_tensor_as_view(acc)), *x0 = lt_view_to_f64(lm_tensor_as_view(x));
        LT_CHECK_OK(lm__accumulate_out(g_ctx, lm_tensor_as_view(acc), lm_tensor_as_view(x)));
        const float *pa = lm_tensor_data(acc);
        for (int64_t k = 0; k < 35; k++) LT_CHECK(pa[k] == (float)(a0[k] + x0[k]));
        free(a0), free(x0);
        lm_tensor_destroy(x);
        /* x transposed into acc's shape [5, 7] from a [7, 5] tensor */
        int64_t tshape[2] = {7, 5};
        lm_tensor *xt = lt_random_tensor(&r, k_floats[i], 2, tshape, 2.0);
        lm_tensor_view xv;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(xt), 0, 1, &xv));
        a0 = lt_view_to_f64(lm_tensor_as_view(acc)), x0 = lt_view_to_f64(&xv);
        LT_CHECK_OK(lm__accumulate_out(g_ctx, lm_tensor_as_view(acc), &xv));
        for (int64_t k = 0; k < 35; k++) LT_CHECK(pa[k] == (float)(a0[k] + x0[k]));
        free(a0), free(x0);
        lm_tensor_destroy(xt), lm_tensor_destroy(acc);
    }
    int64_t other[2] = {7, 5};
    lm_tensor *acc = lt_random_tensor(&r, LM_F32, 2, shape, 1.0), *b16 = lt_random_tensor(&r, LM_BF16, 2, shape, 1.0);
    lm_tensor *xo = lt_random_tensor(&r, LM_BF16, 2, other, 1.0);
    { /* bf16 acc += f32 x: x rounded to bf16, then the bf16 add */
        lm_tensor *x32 = lt_random_tensor(&r, LM_F32, 2, shape, 1.0), *want = NULL, *x16 = NULL;
        LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(x32), LM_BF16, &x16));
        LT_CHECK_OK(lm_add(g_ctx, lm_tensor_as_view(b16), lm_tensor_as_view(x16), &want));
        LT_CHECK_OK(lm__accumulate_out(g_ctx, lm_tensor_as_view(b16), lm_tensor_as_view(x32)));
        LT_CHECK(memcmp(lm_tensor_data(b16), lm_tensor_data(want), 35 * 2) == 0);
        lm_tensor_destroy(x32), lm_tensor_destroy(x16), lm_tensor_destroy(want);
    }
    lm_tensor *i32 = NULL;
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_I32, 2, shape, &i32));
    double *before = lt_view_to_f64(lm_tensor_as_view(acc));
    LT_CHECK_STATUS(lm__accumulate_out(g_ctx, lm_tensor_as_view(i32), lm_tensor_as_view(b16)), LM_UNSUPPORTED);
    lm_tensor_destroy(i32);
    LT_CHECK_STATUS(lm__accumulate_out(g_ctx, lm_tensor_as_view(acc), lm_tensor_as_view(xo)), LM_SHAPE_MISMATCH);
    LT_CHECK_MSG(strstr(lm_last_error(), "accumulate") && strstr(lm_last_error(), "[7, 5]"), "message: %s",
                 lm_last_error());
    lm_tensor_view shifted; /* x overlapping acc one row down */
    int64_t rows4[2] = {4, 7};
    LT_CHECK_OK(lm_tensor_view_init(&shifted, (float *)lm_tensor_data(acc) + 7, LM_F32, lm_device_cpu(), 2, rows4, NULL));
    lm_tensor_view acc4;
    LT_CHECK_OK(lm_tensor_view_init(&acc4, lm_tensor_data(acc), LM_F32, lm_device_cpu(), 2, rows4, NULL));
    LT_CHECK_STATUS(lm__accumulate_out(g_ctx, &acc4, &shifted), LM_INVALID_ARGUMENT);
    double *after = lt_view_to_f64(lm_tensor_as_view(acc));
    LT_CHECK(memcmp(before, after, 35 * sizeof(double)) == 0);
    free(before), free(after);
    lm_tensor_destroy(acc), lm_tensor_destroy(b16), lm_tensor_destroy(xo);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_add_mul_match_f64_with_broadcast);
    LT_RUN(test_add_allocating_form_broadcasts_rank);
    LT_RUN(test_unary_ops_on_transposed_views);
    LT_RUN(test_swiglu_matches_f64);
    LT_RUN(test_cast_rounds_to_nearest_even_and_checks_ranges);
    LT_RUN(test_elementwise_errors_name_the_problem);
    LT_RUN(test_allocating_forms_leak_nothing_when_allocation_fails);
    LT_RUN(test_accumulate_out_is_exact);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
