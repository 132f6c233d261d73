/* Tests for lm_embedding_backward_out: the gradient of L = sum(table[ids] * dy) by
 * float64 finite differences, with duplicate ids (rows add), unused rows (exactly 0),
 * 2-d i64 ids, a transposed dout, bf16 dout with an f32 table gradient; an id out of
 * range fails naming it and writes nothing; the error paths. The accumulating form
 * adds into the rows of the ids only (unused rows are never read).
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx;

typedef struct emb_fd {
    double *table, *dy;
    const int64_t *ids;
    int64_t n, D;
} emb_fd;

static double emb_loss(void *u) {
    emb_fd *f = u;
    double L = 0;
    for (int64_t p = 0; p < f->n; p++)
        for (int64_t d = 0; d < f->D; d++) L += f->table[f->ids[p] * f->D + d] * f->dy[p * f->D + d];
    return L;
}

static void test_embedding_backward_sums_duplicates(void) {
    lt_rng r = lt_rng_seed(61);
    int64_t V = 7, D = 5, ids[6] = {3, 1, 3, 3, 0, 1}, ishape[2] = {2, 3}, tshape[2] = {V, D};
    for (int variant = 0; variant < 2; variant++) {
        lm_dtype dt = variant ? LM_BF16 : LM_F32;
        lm_tensor *idt = NULL, *table = lt_random_tensor(&r, LM_F32, 2, tshape, 1.0);
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 2, ishape, ids, &idt));
        /* dout [2, 3, D] given as the transposed view of a [2, D, 3] buffer */
        int64_t st[3] = {2, D, 3};
        lm_tensor *dys = lt_random_tensor(&r, dt, 3, st, 1.0);
        lm_tensor_view dyv;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(dys), 1, 2, &dyv));
        emb_fd f = {lt_view_to_f64(lm_tensor_as_view(table)), lt_view_to_f64(&dyv), ids, 6, D};
        double *g = malloc(sizeof(double) * (size_t)(V * D));
        fd_gradient(emb_loss, &f, f.table, V * D, g);
        lm_tensor *dt_out = lt_poisoned_tensor(LM_F32, 2, tshape);
        LT_CHECK_OK(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(idt), &dyv, lm_tensor_as_view(dt_out)));
        fd_check("dtable", lm_tensor_as_view(dt_out), g, 1e-12, 1e-6);
        const float *o = lm_tensor_data(dt_out);
        for (int64_t d = 0; d < D; d++) LT_CHECK(o[2 * D + d] == 0.0f && o[6 * D + d] == 0.0f); /* unused rows */
        free(f.table), free(f.dy), free(g);
        lm_tensor_destroy(idt), lm_tensor_destroy(table), lm_tensor_destroy(dys), lm_tensor_destroy(dt_out);
    }
}

/* lm_embedding_backward_acc_out: used rows become old + the written form's row (the sum
 * formed first, added in double, rounded once), unused rows keep their bits (NaN stays
 * NaN: never read), for an f32 and a bf16 table; a bad id writes nothing. */
static void test_embedding_backward_accumulates_used_rows_only(void) {
    lt_rng r = lt_rng_seed(63);
    int64_t V = 7, D = 5, ids[6] = {3, 1, 3, 3, 0, 1}, n = 6, tshape[2] = {V, D}, dshape[2] = {6, D};
    lm_tensor *idt = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &n, ids, &idt));
    for (int variant = 0; variant < 2; variant++) {
        lm_dtype tdt = variant ? LM_BF16 : LM_F32;
        lm_tensor *dy = lt_random_tensor(&r, tdt, 2, dshape, 1.0), *old = lt_random_tensor(&r, tdt, 2, tshape, 1.0);
        lm_tensor *sum = lt_poisoned_tensor(tdt, 2, tshape), *acc = NULL;
        for (int64_t d = 0; d < D; d++) /* unused rows 2 and 6: NaN, so a read of them would show */
            for (int64_t v = 2; v <= 6; v += 4) {
                if (variant) ((uint16_t *)lm_tensor_data(old))[v * D + d] = 0x7FC0;
                else ((float *)lm_tensor_data(old))[v * D + d] = NAN;
            }
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), tdt, 2, tshape, &acc));
        LT_CHECK_OK(lm_tensor_view_copy(g_ctx, lm_tensor_as_view(acc), lm_tensor_as_view(old)));
        double *o64 = lt_view_to_f64(lm_tensor_as_view(old));
        lm_tensor_view av = *lm_tensor_as_view(acc);
        LT_CHECK_OK(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(idt), lm_tensor_as_view(dy), lm_tensor_as_view(sum)));
        LT_CHECK_OK(lm_embedding_backward_acc_out(g_ctx, lm_tensor_as_view(idt), lm_tensor_as_view(dy), &av));
        double *s64 = lt_view_to_f64(lm_tensor_as_view(sum)), *a64 = lt_view_to_f64(&av);
        for (int64_t v = 0; v < V; v++)
            for (int64_t d = 0; d < D; d++) {
                int64_t i = v * D + d;
                if (v == 2 || v == 6) LT_CHECK(isnan(a64[i]));
                else LT_CHECK_MSG(fabs(a64[i] - (o64[i] + s64[i])) <= (variant ? 1e-2 : 1e-6) * (1 + fabs(a64[i])),
                                  "row %lld col %lld: %g vs %g + %g", (long long)v, (long long)d, a64[i], o64[i], s64[i]);
            }
        free(o64), free(s64), free(a64);
        lm_tensor_destroy(dy), lm_tensor_destroy(old), lm_tensor_destroy(sum), lm_tensor_destroy(acc);
    }
    int32_t bad[2] = {0, 7};
    int64_t two = 2, b2[2] = {2, D};
    lm_tensor *bid = NULL, *dy = lt_random_tensor(&r, LM_F32, 2, b2, 1.0), *dt = lt_poisoned_tensor(LM_F32, 2, tshape);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &two, bad, &bid));
    LT_CHECK_STATUS(lm_embedding_backward_acc_out(g_ctx, lm_tensor_as_view(bid), lm_tensor_as_view(dy), lm_tensor_as_view(dt)),
                    LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "position 1") != NULL);
    const float *o = lm_tensor_data(dt);
    for (int i = 0; i < V * D; i++) LT_CHECK(isnan(o[i])); /* nothing written */
    lm_tensor_destroy(bid), lm_tensor_destroy(dy), lm_tensor_destroy(dt), lm_tensor_destroy(idt);
}

static void test_embedding_backward_rejects_bad_ids(void) {
    lt_rng r = lt_rng_seed(62);
    int32_t ids[3] = {0, 9, 1};
    int64_t n = 3, ds[2] = {3, 4}, ts[2] = {5, 4}, bad[2] = {5, 3};
    lm_tensor *idt = NULL, *dy = lt_random_tensor(&r, LM_F32, 2, ds, 1), *dt = lt_poisoned_tensor(LM_F32, 2, ts);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n, ids, &idt));
    LT_CHECK_STATUS(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(idt), lm_tensor_as_view(dy), lm_tensor_as_view(dt)),
                    LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "9") && strstr(lm_last_error(), "position 1"));
    const float *o = lm_tensor_data(dt);
    for (int i = 0; i < 20; i++) LT_CHECK(isnan(o[i])); /* nothing written */
    lm_tensor *dtb = lt_poisoned_tensor(LM_F32, 2, bad), *dth = lt_poisoned_tensor(LM_F16, 2, ts);
    LT_CHECK_STATUS(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(idt), lm_tensor_as_view(dy), lm_tensor_as_view(dtb)),
                    LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(idt), lm_tensor_as_view(dy), lm_tensor_as_view(dth)),
                    LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_embedding_backward_out(g_ctx, lm_tensor_as_view(dy), lm_tensor_as_view(dy), lm_tensor_as_view(dt)),
                    LM_UNSUPPORTED);
    lm_tensor_destroy(idt), lm_tensor_destroy(dy), lm_tensor_destroy(dt), lm_tensor_destroy(dtb), lm_tensor_destroy(dth);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_embedding_backward_sums_duplicates);
    LT_RUN(test_embedding_backward_rejects_bad_ids);
    LT_RUN(test_embedding_backward_accumulates_used_rows_only);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
