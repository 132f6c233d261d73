/* Tests for lm_argmax_out and lm_topk_out against a re-derivation written here (a
 * stable sort under the ops.h order: NaN largest, ties to the lower index) and PyTorch
 * fixtures: random shapes with many ties and some NaNs, zero-size leading dims, k = 0
 * and k = N, transposed inputs and outputs, all three float dtypes, i32/i64 indices,
 * poisoned outputs, every error path with its exact status, and top-k workspace
 * allocation failure without leaks.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};

typedef struct ranked {
    double v;
    int64_t i;
} ranked;

/* Total order: NaN first (by index), then larger values, then lower index. */
static int rank_cmp(const void *pa, const void *pb) {
    const ranked *a = pa, *b = pb;
    int na = isnan(a->v), nb = isnan(b->v);
    if (na != nb) return na ? -1 : 1;
    if (!na && a->v != b->v) return a->v > b->v ? -1 : 1;
    return a->i < b->i ? -1 : a->i > b->i;
}

/* Row r of x [rows, n] sorted by rank into out [n]. */
static void rank_row(const double *x, int64_t r, int64_t n, ranked *out) {
    for (int64_t j = 0; j < n; j++) out[j] = (ranked){x[r * n + j], j};
    qsort(out, (size_t)n, sizeof *out, rank_cmp);
}

/* Values on a coarse grid (many ties) with about 1 in 25 NaN, exact in every dtype,
 * stored with the last two dims swapped when transposed (then *v is the transpose). */
static lm_tensor *tie_heavy(lt_rng *r, lm_dtype dt, int nd, const int64_t *shape, int transposed, lm_tensor_view *v) {
    int64_t s[LM_MAX_DIMS];
    memcpy(s, shape, sizeof(int64_t) * (size_t)nd);
    if (transposed) s[nd - 2] = shape[nd - 1], s[nd - 1] = shape[nd - 2];
    lm_tensor *t = lt_random_tensor(r, LM_F32, nd, s, 1.0), *c = NULL;
    float *p = lm_tensor_data(t);
    for (int64_t i = 0; i < lm_tensor_numel(t); i++)
        p[i] = lt_rng_int(r, 0, 24) == 0 ? NAN : (float)lt_rng_int(r, -4, 4) * 0.5f;
    LT_CHECK_OK(lm_cast(g_ctx, lm_tensor_as_view(t), dt, &c));
    lm_tensor_destroy(t);
    *v = *lm_tensor_as_view(c);
    if (transposed) LT_CHECK_OK(lm_tensor_view_transpose(v, nd - 2, nd - 1, v));
    return c;
}

static void random_shape(lt_rng *r, int *nd, int64_t *shape) {
    *nd = (int)lt_rng_int(r, 1, 4);
    for (int i = 0; i < *nd; i++) shape[i] = lt_rng_int(r, 1, 6);
    if (*nd > 1 && lt_rng_int(r, 0, 10) == 0) shape[0] = 0;
}

static void test_argmax_matches_reference_with_ties_and_nans(void) {
    lt_rng r = lt_rng_seed(51);
    for (int trial = 0; trial < 90; trial++) {
        lm_dtype dt = k_floats[trial % 3], idt = trial % 2 ? LM_I32 : LM_I64;
        int nd;
        int64_t shape[LM_MAX_DIMS];
        random_shape(&r, &nd, shape);
        lm_tensor_view x;
        lm_tensor *xt = tie_heavy(&r, dt, nd, shape, nd >= 2 && lt_rng_int(&r, 0, 1), &x);
        lm_tensor *o = lt_poisoned_tensor(idt, nd - 1, shape);
        LT_CHECK_OK(lm_argmax_out(g_ctx, &x, lm_tensor_as_view(o)));
        int64_t n = shape[nd - 1], rows = lm_tensor_numel(o), bad = 0;
        double *xv = lt_view_to_f64(&x), *got = lt_view_to_f64(lm_tensor_as_view(o));
        ranked *row = malloc(sizeof(ranked) * (size_t)n);
        for (int64_t rr = 0; rr < rows; rr++) {
            rank_row(xv, rr, n, row);
            bad += got[rr] != (double)row[0].i;
        }
        LT_CHECK_MSG(bad == 0, "argmax trial %d (%s): %lld of %lld rows wrong", trial, lm_dtype_name(dt), (long long)bad,
                     (long long)rows);
        free(xv), free(got), free(row);
        lm_tensor_destroy(xt), lm_tensor_destroy(o);
    }
}

static void test_topk_matches_reference_with_ties_and_nans(void) {
    lt_rng r = lt_rng_seed(52);
    for (int trial = 0; trial < 90; trial++) {
        lm_dtype dt = k_floats[trial % 3], idt = trial % 2 ? LM_I64 : LM_I32;
        int nd;
        int64_t shape[LM_MAX_DIMS], oshape[LM_MAX_DIMS];
        random_shape(&r, &nd, shape);
        int64_t n = shape[nd - 1], k = lt_rng_int(&r, 0, n);
        memcpy(oshape, shape, sizeof oshape);
        oshape[nd - 1] = k;
        lm_tensor_view x, vals;
        lm_tensor *xt = tie_heavy(&r, dt, nd, shape, nd >= 2 && lt_rng_int(&r, 0, 1), &x);
        /* values written through a transposed view of a [..., k, rows] buffer when 2-d+ */
        int tv = nd >= 2 && lt_rng_int(&r, 0, 1);
        int64_t vs[LM_MAX_DIMS];
        memcpy(vs, oshape, sizeof vs);
        if (tv) vs[nd - 2] = oshape[nd - 1], vs[nd - 1] = oshape[nd - 2];
        lm_tensor *vt = lt_poisoned_tensor(dt, nd, vs), *it = lt_poisoned_tensor(idt, nd, oshape);
        vals = *lm_tensor_as_view(vt);
        if (tv) LT_CHECK_OK(lm_tensor_view_transpose(&vals, nd - 2, nd - 1, &vals));
        LT_CHECK_OK(lm_topk_out(g_ctx, &x, k, &vals, lm_tensor_as_view(it)));
        int64_t rows = n ? lm_tensor_view_numel(&x) / n : 0, bad = 0;
        double *xv = lt_view_to_f64(&x), *gv = lt_view_to_f64(&vals), *gi = lt_view_to_f64(lm_tensor_as_view(it));
        ranked *row = malloc(sizeof(ranked) * (size_t)(n + 1));
        for (int64_t rr = 0; rr < rows; rr++) {
            rank_row(xv, rr, n, row);
            for (int64_t j = 0; j < k; j++) {
                double v = gv[rr * k + j];
                int same_v = isnan(row[j].v) ? isnan(v) : v == row[j].v;
                bad += !same_v || gi[rr * k + j] != (double)row[j].i;
            }
        }
        LT_CHECK_MSG(bad == 0, "topk trial %d (%s, k %lld of %lld): %lld entries wrong", trial, lm_dtype_name(dt),
                     (long long)k, (long long)n, (long long)bad);
        free(xv), free(gv), free(gi), free(row);
        lm_tensor_destroy(xt), lm_tensor_destroy(vt), lm_tensor_destroy(it);
    }
}

static void test_select_nan_is_largest_and_ties_go_to_the_lower_index(void) {
    float src[6] = {1.0f, NAN, 3.0f, NAN, 3.0f, -INFINITY};
    int64_t s[1] = {6}, s3[1] = {3};
    lm_tensor *x = NULL, *am = lt_poisoned_tensor(LM_I64, 0, NULL);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 1, s, src, &x));
    LT_CHECK_OK(lm_argmax_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(am)));
    LT_CHECK(*(const int64_t *)lm_tensor_data(am) == 1);
    lm_tensor *v = lt_poisoned_tensor(LM_F32, 1, s3), *i = lt_poisoned_tensor(LM_I32, 1, s3);
    LT_CHECK_OK(lm_topk_out(g_ctx, lm_tensor_as_view(x), 3, lm_tensor_as_view(v), lm_tensor_as_view(i)));
    const float *pv = lm_tensor_data(v);
    const int32_t *pi = lm_tensor_data(i);
    LT_CHECK(isnan(pv[0]) && isnan(pv[1]) && pv[2] == 3.0f);
    LT_CHECK(pi[0] == 1 && pi[1] == 3 && pi[2] == 2);
    /* without NaNs: equal maxima resolve to the first; an all -inf row picks index 0 */
    float src2[6] = {2.0f, 5.0f, 5.0f, -INFINITY, -INFINITY, -INFINITY};
    int64_t s23[2] = {2, 3}, s2[1] = {2};
    lm_tensor *x2 = NULL, *am2 = lt_poisoned_tensor(LM_I32, 1, s2);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, s23, src2, &x2));
    LT_CHECK_OK(lm_argmax_out(g_ctx, lm_tensor_as_view(x2), lm_tensor_as_view(am2)));
    const int32_t *pa = lm_tensor_data(am2);
    LT_CHECK(pa[0] == 1 && pa[1] == 0);
    lm_tensor_destroy(x), lm_tensor_destroy(am), lm_tensor_destroy(v), lm_tensor_destroy(i);
    lm_tensor_destroy(x2), lm_tensor_destroy(am2);
}

static void test_select_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/matmul_attention.lmfx", &fx)) return;
    const lt_fixture_tensor *ax = lt_fixture_get(&fx, "argmax_x"), *aw = lt_fixture_get(&fx, "argmax_out");
    const lt_fixture_tensor *tx = lt_fixture_get(&fx, "topk_x"), *tv = lt_fixture_get(&fx, "topk_values");
    const lt_fixture_tensor *ti = lt_fixture_get(&fx, "topk_indices");
    for (int d = 0; d < 3 && ax && aw && tx && tv && ti; d++) {
        /* the fixture values (small integers, multiples of 0.25) are exact in every dtype */
        lm_tensor *x = lt_fixture_tensor_to(ax, k_floats[d]), *o = lt_poisoned_tensor(LM_I64, aw->ndim, aw->shape);
        LT_CHECK_OK(lm_argmax_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(o)));
        LT_CHECK(memcmp(lm_tensor_data(o), aw->i64, sizeof(int64_t) * (size_t)aw->numel) == 0);
        lm_tensor_destroy(x), lm_tensor_destroy(o);
        x = lt_fixture_tensor_to(tx, k_floats[d]);
        lm_tensor *v = lt_poisoned_tensor(k_floats[d], tv->ndim, tv->shape), *i = lt_poisoned_tensor(LM_I64, ti->ndim, ti->shape);
        LT_CHECK_OK(lm_topk_out(g_ctx, lm_tensor_as_view(x), ti->shape[1], lm_tensor_as_view(v), lm_tensor_as_view(i)));
        LT_CHECK(memcmp(lm_tensor_data(i), ti->i64, sizeof(int64_t) * (size_t)ti->numel) == 0);
        double *gv = lt_view_to_f64(lm_tensor_as_view(v));
        lt_check_close("torch topk values", gv, tv->f64, tv->numel, 0, 0);
        free(gv);
        lm_tensor_destroy(x), lm_tensor_destroy(v), lm_tensor_destroy(i);
    }
    lt_fixture_free(&fx);
}

static void test_select_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(53);
    int64_t s[2] = {2, 5}, s0[2] = {2, 0}, s2[1] = {2}, s3[1] = {3}, s23[2] = {2, 3}, s22[2] = {2, 2};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *x0 = lt_poisoned_tensor(LM_F32, 2, s0);
    lm_tensor *o = lt_poisoned_tensor(LM_I64, 1, s2), *o3 = lt_poisoned_tensor(LM_I64, 1, s3);
    lm_tensor *of = lt_poisoned_tensor(LM_F32, 1, s2), *ou = lt_poisoned_tensor(LM_U8, 1, s2);
    lm_tensor *v = lt_poisoned_tensor(LM_F32, 2, s23), *i = lt_poisoned_tensor(LM_I32, 2, s23);
    lm_tensor *vh = lt_poisoned_tensor(LM_F16, 2, s23), *v22 = lt_poisoned_tensor(LM_F32, 2, s22);
    lm_tensor *xi = lt_random_tensor(&r, LM_I32, 2, s, 1);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vo = lm_tensor_as_view(o);
    const lm_tensor_view *vv = lm_tensor_as_view(v), *vi = lm_tensor_as_view(i);
    /* argmax */
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, lm_tensor_as_view(x0), vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "[2, 0]") != NULL);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, lm_tensor_as_view(o3)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, lm_tensor_as_view(of)), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, lm_tensor_as_view(ou)), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, lm_tensor_as_view(xi), vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, NULL, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_view scalar;
    LT_CHECK_OK(lm_tensor_view_select(vo, 0, 0, &scalar));
    lm_tensor_view x_scalar;
    LT_CHECK_OK(lm_tensor_view_select(lm_tensor_as_view(of), 0, 0, &x_scalar));
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, &x_scalar, &scalar), LM_SHAPE_MISMATCH);
    lm_tensor_view inside; /* an i32 [2] output over x's own bytes */
    LT_CHECK_OK(lm_tensor_view_init(&inside, lm_tensor_data(x), LM_I32, lm_device_cpu(), 1, s2, NULL));
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, &inside), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vo;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_argmax_out(g_ctx, vx, &dev), LM_INVALID_ARGUMENT);
    /* topk: k outside [0, N] */
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 6, vv, vi), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "k = 6") != NULL);
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, -1, vv, vi), LM_OUT_OF_RANGE);
    /* output dtypes and shapes */
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 3, lm_tensor_as_view(vh), vi), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 3, vv, vv), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 2, vv, vi), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 2, lm_tensor_as_view(v22), vi), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "indices") != NULL);
    /* values and indices over the same bytes (f32 and i32 [2, 3]) */
    lm_tensor_view alias;
    LT_CHECK_OK(lm_tensor_view_init(&alias, lm_tensor_data(v), LM_I32, lm_device_cpu(), 2, s23, NULL));
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 3, vv, &alias), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 3, NULL, vi), LM_INVALID_ARGUMENT);
    lm_tensor_view bc;
    int64_t s13[2] = {1, 3};
    lm_tensor *small = lt_poisoned_tensor(LM_F32, 2, s13);
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(small), 2, s23, &bc));
    LT_CHECK_STATUS(lm_topk_out(g_ctx, vx, 3, &bc, vi), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(x), lm_tensor_destroy(x0), lm_tensor_destroy(o), lm_tensor_destroy(o3), lm_tensor_destroy(of);
    lm_tensor_destroy(ou), lm_tensor_destroy(v), lm_tensor_destroy(i), lm_tensor_destroy(vh), lm_tensor_destroy(v22);
    lm_tensor_destroy(xi), lm_tensor_destroy(small);
}

static void test_topk_workspace_allocation_failure_leaks_nothing(void) {
    lt_rng r = lt_rng_seed(54);
    int64_t s[2] = {3, 8}, sk[2] = {3, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_BF16, 2, s, 1);
    lm_tensor *v = lt_poisoned_tensor(LM_BF16, 2, sk), *i = lt_poisoned_tensor(LM_I64, 2, sk);
    for (int k = 1; k <= 3; k++) {
        lt_alloc_track(k);
        lm_status st = lm_topk_out(g_ctx, lm_tensor_as_view(x), 4, lm_tensor_as_view(v), lm_tensor_as_view(i));
        if (k <= lt_alloc_count()) LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
        else LT_CHECK_OK(st);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor *am = lt_poisoned_tensor(LM_I32, 1, s);
    lt_alloc_track(1); /* argmax needs no memory at all */
    LT_CHECK_OK(lm_argmax_out(g_ctx, lm_tensor_as_view(x), lm_tensor_as_view(am)));
    LT_CHECK(lt_alloc_count() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(x), lm_tensor_destroy(v), lm_tensor_destroy(i), lm_tensor_destroy(am);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_argmax_matches_reference_with_ties_and_nans);
    LT_RUN(test_topk_matches_reference_with_ties_and_nans);
    LT_RUN(test_select_nan_is_largest_and_ties_go_to_the_lower_index);
    LT_RUN(test_select_matches_torch_fixture);
    LT_RUN(test_select_errors_name_the_problem);
    LT_RUN(test_topk_workspace_allocation_failure_leaks_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
