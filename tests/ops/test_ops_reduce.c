/* Tests for sum, max and concat against float64 / exact re-derivations: random
 * shapes (size-1 and zero-size dims), negative dims, transposed inputs, strided
 * outputs, all three float dtypes (and integer dtypes for concat), NaN propagation
 * in max, empty reductions, and every error path with its exact status.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
/* sum: one rounding of a double accumulation (rel 2^-24 / 2^-9 / 2^-12) */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.1 : 0.01; }

static void random_shape(lt_rng *r, int lo_nd, int *nd, int64_t *shape, int allow_zero) {
    *nd = (int)lt_rng_int(r, lo_nd, 4);
    for (int i = 0; i < *nd; i++) shape[i] = lt_rng_int(r, allow_zero && lt_rng_int(r, 0, 9) == 0 ? 0 : 1, 5);
}

/* A random tensor stored with its dims reversed; *v is the permuted view with
 * logical shape `shape`. */
static lm_tensor *random_reversed(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, lm_tensor_view *v) {
    int64_t rs[LM_MAX_DIMS];
    int perm[LM_MAX_DIMS];
    for (int i = 0; i < nd; i++) rs[i] = shape[nd - 1 - i], perm[i] = nd - 1 - i;
    lm_tensor *t = lt_random_tensor(r, dt, nd, rs, 1.0);
    LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(t), perm, v));
    return t;
}

/* Row-major flat index of idx in shape, skipping dimension `skip` (-1: none). */
static int64_t flat_index(int nd, const int64_t *shape, const int64_t *idx, int skip) {
    int64_t f = 0;
    for (int i = 0; i < nd; i++)
        if (i != skip) f = f * shape[i] + idx[i];
    return f;
}

static int next_index(int nd, const int64_t *shape, int64_t *idx) {
    for (int d = nd - 1; d >= 0; d--) {
        if (++idx[d] < shape[d]) return 1;
        idx[d] = 0;
    }
    return 0;
}

/* Reduces x (row-major values of shape) over dim into want (x's shape without dim). */
static void reduce_f64(int is_max, const double *x, int nd, const int64_t *shape, int dim, double *want,
                       int64_t nout) {
    for (int64_t i = 0; i < nout; i++) want[i] = is_max ? -INFINITY : 0;
    int64_t n = 1, idx[LM_MAX_DIMS] = {0};
    for (int i = 0; i < nd; i++) n *= shape[i];
    for (int64_t i = 0; i < n; i++, next_index(nd, shape, idx)) {
        int64_t o = flat_index(nd, shape, idx, dim);
        want[o] = is_max ? (x[i] > want[o] ? x[i] : want[o]) : want[o] + x[i];
    }
}

static void test_sum_and_max_match_f64_on_random_views(void) {
    lt_rng r = lt_rng_seed(41);
    for (int trial = 0; trial < 90; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int is_max = (trial / 3) % 2, nd;
        int64_t shape[LM_MAX_DIMS], oshape[LM_MAX_DIMS];
        random_shape(&r, 1, &nd, shape, !is_max);
        int dim = (int)lt_rng_int(&r, 0, nd - 1), pass_dim = trial % 4 == 0 ? dim - nd : dim;
        for (int i = 0, j = 0; i < nd; i++)
            if (i != dim) oshape[j++] = shape[i];
        lm_tensor_view xv, ov;
        lm_tensor *x = random_reversed(&r, dt, nd, shape, &xv);
        /* outputs with rank >= 1 are strided (every second element of the last dim) */
        int64_t wide[LM_MAX_DIMS];
        memcpy(wide, oshape, sizeof wide);
        if (nd > 1) wide[nd - 2] *= 2;
        lm_tensor *o = lt_poisoned_tensor(dt, nd - 1, wide);
        ov = *lm_tensor_as_view(o);
        if (nd > 1) LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o), nd - 2, 0, wide[nd - 2], 2, &ov));
        LT_CHECK_OK(is_max ? lm_max_out(g_ctx, &xv, pass_dim, &ov) : lm_sum_out(g_ctx, &xv, pass_dim, &ov));
        int64_t nout = lm_tensor_view_numel(&ov);
        double *xs = lt_view_to_f64(&xv), *got = lt_view_to_f64(&ov);
        double *want = malloc(sizeof(double) * (size_t)(nout ? nout : 1));
        reduce_f64(is_max, xs, nd, shape, dim, want, nout);
        if (is_max) lt_check_close("max", got, want, nout, 0, 0); /* picks an element: exact */
        else lt_check_close("sum", got, want, nout, tol_nmse(dt), tol_abs(dt) * 4);
        free(xs), free(got), free(want);
        lm_tensor_destroy(x), lm_tensor_destroy(o);
    }
}

static void test_sum_accumulates_in_double(void) {
    /* 1 + 2^-30 * 2^20 terms: an f32 accumulator would stay at 1.0 */
    int64_t n = (1 << 20) + 1, one = 1;
    lm_tensor *x = lt_poisoned_tensor(LM_F32, 1, &n), *o = lt_poisoned_tensor(LM_F32, 0, &one);
    float *xv = lm_tensor_data(x);
    xv[0] = 1.0f;
    for (int64_t i = 1; i < n; i++) xv[i] = 0x1p-30f;
    LT_CHECK_OK(lm_sum_out(g_ctx, lm_tensor_as_view(x), 0, lm_tensor_as_view(o)));
    LT_CHECK(*(float *)lm_tensor_data(o) == 1.0f + 0x1p-10f);
    lm_tensor_destroy(x), lm_tensor_destroy(o);
}

static void test_max_propagates_nan_and_handles_infinities(void) {
    int64_t s[2] = {4, 5}, four = 4;
    const float nan = NAN, inf = INFINITY;
    float h[20] = {nan, 1, 2, 3, 4,     /* NaN first */
                   1, 2, nan, 3, -inf,  /* NaN in the middle */
                   -inf, -inf, -inf, -inf, -inf, -1, 7, 2, inf, nan /* NaN after +inf */};
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = k_floats[k];
        lm_tensor *x = NULL, *xf = NULL, *o = lt_poisoned_tensor(dt, 1, &four);
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, s, h, &xf));
        LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(xf), dt, &x));
        LT_CHECK_OK(lm_max_out(g_ctx, lm_tensor_as_view(x), -1, lm_tensor_as_view(o)));
        double *got = lt_view_to_f64(lm_tensor_as_view(o));
        LT_CHECK(isnan(got[0]) && isnan(got[1]) && got[2] == -INFINITY && isnan(got[3]));
        free(got);
        lm_tensor_destroy(x), lm_tensor_destroy(xf), lm_tensor_destroy(o);
    }
}

static void test_empty_reductions(void) {
    int64_t s[3] = {2, 0, 3}, os[2] = {2, 3}, e[2] = {2, 0};
    lm_tensor *x = lt_poisoned_tensor(LM_BF16, 3, s), *o = lt_poisoned_tensor(LM_BF16, 2, os);
    LT_CHECK_OK(lm_sum_out(g_ctx, lm_tensor_as_view(x), 1, lm_tensor_as_view(o)));
    const uint16_t *ov = lm_tensor_data(o);
    for (int i = 0; i < 6; i++) LT_CHECK(ov[i] == 0); /* +0.0 */
    LT_CHECK_STATUS(lm_max_out(g_ctx, lm_tensor_as_view(x), 1, lm_tensor_as_view(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "size 0"));
    /* a zero-size dim that is not reduced just gives an empty output */
    lm_tensor *oe = lt_poisoned_tensor(LM_BF16, 2, e);
    LT_CHECK_OK(lm_max_out(g_ctx, lm_tensor_as_view(x), 2, lm_tensor_as_view(oe)));
    LT_CHECK_OK(lm_sum_out(g_ctx, lm_tensor_as_view(x), -1, lm_tensor_as_view(oe)));
    lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(oe);
}

/* want = inputs joined along dim, from row-major copies of each input. */
static double *concat_f64(int n, const lm_tensor_view *const *in, int dim, const lm_tensor_view *out) {
    int64_t total = lm_tensor_view_numel(out), idx[LM_MAX_DIMS] = {0}, sub[LM_MAX_DIMS];
    double *want = malloc(sizeof(double) * (size_t)(total ? total : 1));
    double *vals[8];
    for (int k = 0; k < n; k++) vals[k] = lt_view_to_f64(in[k]);
    for (int64_t i = 0; i < total; i++, next_index(out->ndim, out->shape, idx)) {
        int k = 0;
        memcpy(sub, idx, sizeof sub);
        while (sub[dim] >= in[k]->shape[dim]) sub[dim] -= in[k++]->shape[dim];
        want[i] = vals[k][flat_index(out->ndim, in[k]->shape, sub, -1)];
    }
    for (int k = 0; k < n; k++) free(vals[k]);
    return want;
}

static void test_concat_matches_on_random_views_and_dtypes(void) {
    lt_rng r = lt_rng_seed(42);
    const lm_dtype dts[] = {LM_F32, LM_BF16, LM_F16, LM_I32, LM_I64, LM_U8};
    for (int trial = 0; trial < 60; trial++) {
        lm_dtype dt = dts[trial % 6];
        int nd, n = (int)lt_rng_int(&r, 1, 4);
        int64_t shape[LM_MAX_DIMS], oshape[LM_MAX_DIMS];
        random_shape(&r, 1, &nd, shape, 1);
        int dim = (int)lt_rng_int(&r, 0, nd - 1);
        memcpy(oshape, shape, sizeof oshape);
        oshape[dim] = 0;
        lm_tensor *ts[4];
        lm_tensor_view vs[4];
        const lm_tensor_view *ins[4];
        for (int k = 0; k < n; k++) {
            shape[dim] = lt_rng_int(&r, 0, 4);
            oshape[dim] += shape[dim];
            ts[k] = random_reversed(&r, dt, nd, shape, &vs[k]);
            ins[k] = &vs[k];
        }
        int64_t wide[LM_MAX_DIMS];
        memcpy(wide, oshape, sizeof wide);
        wide[nd - 1] *= 2;
        lm_tensor *o = lt_poisoned_tensor(dt, nd, wide);
        lm_tensor_view ov;
        ov = *lm_tensor_as_view(o);
        if (wide[nd - 1] > 0) LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o), nd - 1, 1, wide[nd - 1], 2, &ov));
        LT_CHECK_OK(lm_concat_out(g_ctx, n, ins, trial % 3 == 0 ? dim - nd : dim, &ov));
        double *got = lt_view_to_f64(&ov), *want = concat_f64(n, ins, dim, &ov);
        lt_check_close("concat", got, want, lm_tensor_view_numel(&ov), 0, 0); /* a copy is exact */
        free(got), free(want);
        for (int k = 0; k < n; k++) lm_tensor_destroy(ts[k]);
        lm_tensor_destroy(o);
    }
}

static void test_concat_keeps_large_i64_exact(void) {
    int64_t one = 1, two = 2, a = INT64_MAX - 1, b[1] = {(int64_t)1 << 60 | 1};
    lm_tensor *ta = NULL, *tb = NULL, *o = lt_poisoned_tensor(LM_I64, 1, &two);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &one, &a, &ta));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &one, b, &tb));
    const lm_tensor_view *ins[2] = {lm_tensor_as_view(ta), lm_tensor_as_view(tb)};
    LT_CHECK_OK(lm_concat_out(g_ctx, 2, ins, 0, lm_tensor_as_view(o)));
    const int64_t *ov = lm_tensor_data(o);
    LT_CHECK(ov[0] == a && ov[1] == b[0]);
    lm_tensor_destroy(ta), lm_tensor_destroy(tb), lm_tensor_destroy(o);
}

static void test_reduce_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(43);
    int64_t s[2] = {3, 4}, three = 3, four = 4, s34b[2] = {3, 5}, s24[2] = {2, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *o3 = lt_poisoned_tensor(LM_F32, 1, &three);
    lm_tensor *o4 = lt_poisoned_tensor(LM_F32, 1, &four), *oh = lt_poisoned_tensor(LM_F16, 1, &three);
    lm_tensor *xi = lt_random_tensor(&r, LM_I32, 2, s, 1), *xb = lt_random_tensor(&r, LM_F32, 2, s34b, 1);
    lm_tensor *xh = lt_random_tensor(&r, LM_F16, 2, s, 1), *x24 = lt_random_tensor(&r, LM_F32, 2, s24, 1);
    lm_tensor *x1 = lt_random_tensor(&r, LM_F32, 1, &four, 1);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *v3 = lm_tensor_as_view(o3), *v4 = lm_tensor_as_view(o4);
    LT_CHECK_OK(lm_sum_out(g_ctx, vx, 1, v3));
    LT_CHECK_OK(lm_max_out(g_ctx, vx, -2, v4));
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 2, v3), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "dim 2"));
    LT_CHECK_STATUS(lm_max_out(g_ctx, vx, -3, v3), LM_OUT_OF_RANGE);
    lm_tensor_view sc;
    LT_CHECK_OK(lm_tensor_view_select(v3, 0, 0, &sc));
    LT_CHECK_STATUS(lm_sum_out(g_ctx, &sc, 0, &sc), LM_OUT_OF_RANGE); /* a scalar has no dim */
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 0, v3), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 1, lm_tensor_as_view(oh)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_max_out(g_ctx, lm_tensor_as_view(xi), 1, v3), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_sum_out(g_ctx, NULL, 1, v3), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 1, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_view col, bcast;
    LT_CHECK_OK(lm_tensor_view_select(vx, 1, 0, &col)); /* x's first column: same address as x */
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 1, &col), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "overlaps"));
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(x1), 2, (const int64_t[2]){3, 4}, &bcast));
    LT_CHECK_OK(lm_tensor_view_select(&bcast, 1, 0, &col)); /* stride 0: writes one element 3 times */
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 1, &col), LM_INVALID_ARGUMENT);
    lm_ctx_set_impl(g_ctx, LM_IMPL_TUNED);
    LT_CHECK_STATUS(lm_sum_out(g_ctx, vx, 1, v3), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    /* concat */
    int64_t s64[2] = {6, 4}, s55[2] = {5, 5};
    lm_tensor *c = lt_poisoned_tensor(LM_F32, 2, s64), *cb = lt_poisoned_tensor(LM_F32, 2, s55);
    lm_tensor *ch = lt_poisoned_tensor(LM_F16, 2, s64);
    const lm_tensor_view *vc = lm_tensor_as_view(c);
    const lm_tensor_view *ranks[2] = {vx, lm_tensor_as_view(x1)};
    const lm_tensor_view *good[2] = {vx, lm_tensor_as_view(x24)};
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, good, 0, lm_tensor_as_view(cb)), LM_SHAPE_MISMATCH);
    int64_t s54[2] = {5, 4};
    lm_tensor *c54 = lt_poisoned_tensor(LM_F32, 2, s54);
    LT_CHECK_OK(lm_concat_out(g_ctx, 2, good, 0, lm_tensor_as_view(c54)));
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 0, good, 0, vc), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, NULL, 0, vc), LM_INVALID_ARGUMENT);
    const lm_tensor_view *with_null[2] = {vx, NULL};
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, with_null, 0, vc), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "inputs[1]"));
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, ranks, 0, vc), LM_SHAPE_MISMATCH); /* rank 2 vs 1 */
    const lm_tensor_view *mixed[2] = {vx, lm_tensor_as_view(xh)};
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, mixed, 0, vc), LM_DTYPE_MISMATCH);
    const lm_tensor_view *wrong[2] = {vx, lm_tensor_as_view(xb)};
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, wrong, 0, vc), LM_SHAPE_MISMATCH); /* dim 1: 4 vs 5 */
    LT_CHECK(strstr(lm_last_error(), "inputs[1]"));
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, good, 2, vc), LM_OUT_OF_RANGE);
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, good, 0, lm_tensor_as_view(ch)), LM_DTYPE_MISMATCH);
    /* an input that is part of out (rows 3..5, both contiguous) */
    lm_tensor_view xv6;
    LT_CHECK_OK(lm_tensor_view_slice(vc, 0, 3, 6, 1, &xv6)); /* rows 3..5 of out, contiguous */
    const lm_tensor_view *tail[2] = {vx, &xv6};
    LT_CHECK_STATUS(lm_concat_out(g_ctx, 2, tail, 0, vc), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "inputs[1]"));
    lm_tensor_destroy(x), lm_tensor_destroy(o3), lm_tensor_destroy(o4), lm_tensor_destroy(oh), lm_tensor_destroy(xi);
    lm_tensor_destroy(xb), lm_tensor_destroy(xh), lm_tensor_destroy(x24), lm_tensor_destroy(x1);
    lm_tensor_destroy(c), lm_tensor_destroy(cb), lm_tensor_destroy(ch), lm_tensor_destroy(c54);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_sum_and_max_match_f64_on_random_views);
    LT_RUN(test_sum_accumulates_in_double);
    LT_RUN(test_max_propagates_nan_and_handles_infinities);
    LT_RUN(test_empty_reductions);
    LT_RUN(test_concat_matches_on_random_views_and_dtypes);
    LT_RUN(test_concat_keeps_large_i64_exact);
    LT_RUN(test_reduce_errors_name_the_problem);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
