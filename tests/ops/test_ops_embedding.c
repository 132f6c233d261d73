/* Tests for embedding: the PyTorch fixture (torch.nn.functional.embedding,
 * tests/data/ops/norm_rope.lmfx) in all three float dtypes, exact row copies on
 * random shapes (ids of rank 0..3, zero-size dims, i32/i64, transposed table and ids,
 * strided outputs), out-of-range ids (status, message naming position, value and
 * vocab size, output untouched), every other error path, and the allocating form
 * under allocation failure.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};

/* A row-major host copy of ids as int64 (any index dtype, any strides). */
static int64_t *ids_to_i64(const lm_tensor_view *ids) {
    double *d = lt_view_to_f64(ids); /* exact for the |id| < 2^53 used here */
    int64_t n = lm_tensor_view_numel(ids);
    int64_t *out = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) out[i] = (int64_t)d[i];
    free(d);
    return out;
}

/* want[p, :] = table[ids[p], :] from row-major copies; table is [V, D]. */
static double *gather_f64(const lm_tensor_view *table, const lm_tensor_view *ids) {
    double *t = lt_view_to_f64(table);
    int64_t *id = ids_to_i64(ids), n = lm_tensor_view_numel(ids), d = table->shape[1];
    double *want = malloc(sizeof(double) * (size_t)(n * d > 0 ? n * d : 1));
    for (int64_t p = 0; p < n; p++)
        for (int64_t k = 0; k < d; k++) want[p * d + k] = t[id[p] * d + k];
    free(t), free(id);
    return want;
}

static void test_embedding_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/norm_rope.lmfx", &fx)) return;
    const lt_fixture_tensor *fo = lt_fixture_get(&fx, "embedding.out");
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = k_floats[k];
        lm_tensor *table = lt_fixture_tensor_to(lt_fixture_get(&fx, "embedding.table"), dt);
        lm_tensor *ids = lt_fixture_tensor_to(lt_fixture_get(&fx, "embedding.ids"), k == 1 ? LM_I32 : LM_I64);
        lm_tensor *o = NULL;
        LT_CHECK_OK(lm_embedding(g_ctx, lm_tensor_as_view(table), lm_tensor_as_view(ids), &o));
        LT_CHECK(o && lm_tensor_ndim(o) == 3 && lm_tensor_dim(o, 0) == 2 && lm_tensor_dim(o, 1) == 5 &&
                 lm_tensor_dim(o, 2) == 6 && lm_tensor_dtype(o) == dt);
        double *got = lt_view_to_f64(lm_tensor_as_view(o));
        /* a copy: only the rounding of the fixture table to dt (rel 2^-24/2^-9/2^-12) */
        lt_check_close("embedding fixture", got, fo->f64, fo->numel, dt == LM_F32 ? 1e-13 : 1e-5, 0.02);
        free(got);
        lm_tensor_destroy(table), lm_tensor_destroy(ids), lm_tensor_destroy(o);
    }
    lt_fixture_free(&fx);
}

static void test_embedding_random_views_copy_rows_exactly(void) {
    lt_rng r = lt_rng_seed(31);
    for (int trial = 0; trial < 48; trial++) {
        lm_dtype dt = k_floats[trial % 3], it = (trial / 3) % 2 ? LM_I32 : LM_I64;
        int64_t v = lt_rng_int(&r, 1, 20), d = lt_rng_int(&r, trial % 7 == 0 ? 0 : 1, 9);
        int nd = (int)lt_rng_int(&r, 0, 3);
        int64_t ishape[3], rev[3], oshape[4];
        for (int i = 0; i < nd; i++) ishape[i] = lt_rng_int(&r, trial % 11 == 0 ? 0 : 1, 4);
        for (int i = 0; i < nd; i++) rev[i] = ishape[nd - 1 - i], oshape[i] = ishape[i];
        oshape[nd] = d;
        /* table stored [D, V] and transposed; ids stored with reversed dims and permuted */
        int64_t tshape[2] = {d, v};
        lm_tensor *ts = lt_random_tensor(&r, dt, 2, tshape, 1.0);
        lm_tensor *is = lt_poisoned_tensor(it, nd, rev);
        int64_t n = lm_tensor_numel(is);
        for (int64_t i = 0; i < n; i++) {
            int64_t id = lt_rng_int(&r, 0, v - 1);
            if (it == LM_I32) ((int32_t *)lm_tensor_data(is))[i] = (int32_t)id;
            else ((int64_t *)lm_tensor_data(is))[i] = id;
        }
        lm_tensor_view tv, iv, ov;
        int perm[3] = {nd - 1, nd - 2, nd - 3};
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(ts), 0, 1, &tv));
        LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(is), perm, &iv));
        int64_t wide[4];
        memcpy(wide, oshape, sizeof wide);
        wide[nd] = 2 * d;
        lm_tensor *o = lt_poisoned_tensor(dt, nd + 1, wide);
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o), nd, 0, 2 * d, 2, &ov));
        LT_CHECK_OK(lm_embedding_out(g_ctx, &tv, &iv, &ov));
        double *got = lt_view_to_f64(&ov), *want = gather_f64(&tv, &iv);
        lt_check_close("embedding random", got, want, n * d, 0, 0); /* a copy is exact */
        free(got), free(want);
        lm_tensor_destroy(ts), lm_tensor_destroy(is), lm_tensor_destroy(o);
    }
}

static void test_out_of_range_id_names_position_value_and_vocab(void) {
    lt_rng r = lt_rng_seed(32);
    int64_t tshape[2] = {7, 3}, ishape[2] = {2, 4}, oshape[3] = {2, 4, 3};
    lm_tensor *table = lt_random_tensor(&r, LM_F32, 2, tshape, 1), *o = lt_poisoned_tensor(LM_F32, 3, oshape);
    const int64_t bad[3] = {7, -1, 1000000007};
    for (int c = 0; c < 3; c++) {
        int32_t h32[8] = {0, 1, 2, 3, 4, 5, 6, 0};
        int64_t h64[8] = {0, 1, 2, 3, 4, 5, 6, 0};
        h32[6] = (int32_t)bad[c], h64[6] = bad[c]; /* position [1, 2] */
        lm_tensor *ids = NULL;
        if (c == 1) LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, ishape, h32, &ids));
        else LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 2, ishape, h64, &ids));
        LT_CHECK_STATUS(lm_embedding_out(g_ctx, lm_tensor_as_view(table), lm_tensor_as_view(ids), lm_tensor_as_view(o)),
                        LM_OUT_OF_RANGE);
        char value[32];
        snprintf(value, sizeof value, "%lld", (long long)bad[c]);
        const char *e = lm_last_error();
        LT_CHECK_MSG(strstr(e, "[1, 2]") && strstr(e, value) && strstr(e, "vocab size 7"), "message: %s", e);
        lm_tensor *a = NULL;
        LT_CHECK_STATUS(lm_embedding(g_ctx, lm_tensor_as_view(table), lm_tensor_as_view(ids), &a), LM_OUT_OF_RANGE);
        LT_CHECK(a == NULL);
        lm_tensor_destroy(ids);
    }
    /* ids are validated before anything is written */
    const float *ov = lm_tensor_data(o);
    for (int i = 0; i < 24; i++) LT_CHECK(isnan(ov[i]));
    lm_tensor_destroy(table), lm_tensor_destroy(o);
}

static void test_embedding_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(33);
    int64_t tshape[2] = {5, 4}, ishape[1] = {3}, oshape[2] = {3, 4}, bad_o[2] = {3, 5}, v5 = 5;
    int64_t ones[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    lm_tensor *table = lt_random_tensor(&r, LM_BF16, 2, tshape, 1), *ti = lt_random_tensor(&r, LM_I32, 2, tshape, 1);
    lm_tensor *t1 = lt_random_tensor(&r, LM_BF16, 1, &v5, 1), *ids = lt_poisoned_tensor(LM_I64, 1, ishape);
    lm_tensor *idf = lt_random_tensor(&r, LM_F32, 1, ishape, 1), *id8 = lt_poisoned_tensor(LM_I32, 8, ones);
    lm_tensor *o = lt_poisoned_tensor(LM_BF16, 2, oshape), *of = lt_poisoned_tensor(LM_F32, 2, oshape);
    lm_tensor *ob = lt_poisoned_tensor(LM_BF16, 2, bad_o);
    memset(lm_tensor_data(ids), 0, 3 * sizeof(int64_t));
    memset(lm_tensor_data(id8), 0, sizeof(int32_t));
    const lm_tensor_view *vt = lm_tensor_as_view(table), *vi = lm_tensor_as_view(ids), *vo = lm_tensor_as_view(o);
    LT_CHECK_OK(lm_embedding_out(g_ctx, vt, vi, vo));
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, NULL, vi, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, NULL, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, vi, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, lm_tensor_as_view(ti), vi, vo), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, lm_tensor_as_view(idf), vo), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "ids"));
    /* 16-bit rows widened into f32 are exact; an integer out is refused by name */
    LT_CHECK_OK(lm_embedding_out(g_ctx, vt, vi, lm_tensor_as_view(of)));
    for (int64_t i = 0; i < oshape[0] * oshape[1]; i++)
        LT_CHECK(((const float *)lm_tensor_data(of))[i] == lm_bf16_to_f32(((const uint16_t *)lm_tensor_data(o))[i]));
    lm_tensor *oi = lt_poisoned_tensor(LM_I32, 2, oshape); /* the right shape, an integer dtype */
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, vi, lm_tensor_as_view(oi)), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "out") && strstr(lm_last_error(), "i32"));
    lm_tensor_destroy(oi);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, vi, lm_tensor_as_view(ob)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, lm_tensor_as_view(t1), vi, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "table"));
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, lm_tensor_as_view(id8), vo), LM_SHAPE_MISMATCH);
    /* an output on top of the table (same address, other layout) and a broadcast output */
    lm_tensor_view on_table, bcast;
    LT_CHECK_OK(lm_tensor_view_init(&on_table, lm_tensor_data(table), LM_BF16, lm_device_cpu(), 2, oshape, NULL));
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, vi, &on_table), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "table"));
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(t1), 2, (const int64_t[2]){3, 5}, &bcast));
    lm_tensor_view bcast4;
    LT_CHECK_OK(lm_tensor_view_slice(&bcast, 1, 0, 4, 1, &bcast4));
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, vi, &bcast4), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = *vi;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, vt, &dev, vo), LM_INVALID_ARGUMENT);
    lm_tensor_view t_half, o_half; /* every second column: rows of stride 2, which the tuned level rejects */
    LT_CHECK_OK(lm_tensor_view_slice(vt, 1, 0, 4, 2, &t_half));
    LT_CHECK_OK(lm_tensor_view_slice(vo, 1, 0, 4, 2, &o_half));
    lm_ctx_set_impl(g_ctx, LM_IMPL_TUNED);
    LT_CHECK_STATUS(lm_embedding_out(g_ctx, &t_half, vi, &o_half), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    lm_tensor *a = NULL;
    LT_CHECK_STATUS(lm_embedding(g_ctx, vt, NULL, &a), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_embedding(g_ctx, lm_tensor_as_view(ti), vi, &a), LM_UNSUPPORTED);
    LT_CHECK(a == NULL);
    lm_tensor_destroy(table), lm_tensor_destroy(ti), lm_tensor_destroy(t1), lm_tensor_destroy(ids);
    lm_tensor_destroy(idf), lm_tensor_destroy(id8), lm_tensor_destroy(o), lm_tensor_destroy(of), lm_tensor_destroy(ob);
}

static void test_embedding_allocation_failure_leaks_nothing(void) {
    lt_rng r = lt_rng_seed(34);
    int64_t tshape[2] = {9, 5}, ishape[2] = {2, 3};
    int64_t h[6] = {8, 0, 4, 4, 1, 2};
    lm_tensor *table = lt_random_tensor(&r, LM_F16, 2, tshape, 1), *ids = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 2, ishape, h, &ids));
    for (int k = 1; k <= 3; k++) {
        lm_tensor *o = NULL;
        lt_alloc_track(k);
        lm_status st = lm_embedding(g_ctx, lm_tensor_as_view(table), lm_tensor_as_view(ids), &o);
        if (k <= lt_alloc_count()) {
            LT_CHECK_STATUS(st, LM_OUT_OF_MEMORY);
            LT_CHECK(o == NULL);
        }
        lm_tensor_destroy(o);
        LT_CHECK_MSG(lt_alloc_live() == 0, "fail_at %d: %lld allocations leaked", k, (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_tensor_destroy(table), lm_tensor_destroy(ids);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_embedding_matches_torch_fixture);
    LT_RUN(test_embedding_random_views_copy_rows_exactly);
    LT_RUN(test_out_of_range_id_names_position_value_and_vocab);
    LT_RUN(test_embedding_errors_name_the_problem);
    LT_RUN(test_embedding_allocation_failure_leaks_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
