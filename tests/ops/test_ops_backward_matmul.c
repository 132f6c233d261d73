/* Tests for lm_matmul_backward_out against float64 finite differences of
 * L = sum((a @ b) * w): plain 2-d, batched a with a shared b (the Linear case, taken
 * by the composed level), a broadcast a, b as the transposed view of a row-major
 * weight, bf16 operands with f32 gradients; the composed and reference levels must
 * both pass; poisoned outputs; NULL gradients; every error path with its status.
 * lm_matmul_backward_acc_out: on the CPU exactly the start value plus what
 * lm_matmul_backward_out writes, at both levels, and the same argument checks.
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx, *g_ref;

/* Shapes of one case: a [batch_a..., M, K], b [batch_b..., K, N] (right-aligned). */
typedef struct mm_case {
    int na, nb;
    int64_t as[4], bs[4];
    int b_transposed; /* b is given as the transposed view of a row-major [N, K] */
} mm_case;

typedef struct mm_fd {
    const mm_case *c;
    double *a, *b, *w; /* a, b row-major in their logical shapes; w [out shape] */
    int nd;
    int64_t os[4]; /* out shape */
} mm_fd;

/* Row-major batch slot of out batch index ob (nbat dims) in a view of shape s (n dims). */
static int64_t slot(const int64_t *s, int n, const int64_t *ob, int nbat) {
    int64_t r = 0;
    for (int i = 0; i < n - 2; i++) r = r * s[i] + (s[i] == 1 ? 0 : ob[i + nbat - (n - 2)]);
    return r;
}

static double mm_loss(void *u) {
    mm_fd *f = u;
    const mm_case *c = f->c;
    int nbat = f->nd - 2;
    int64_t M = c->as[c->na - 2], K = c->as[c->na - 1], N = c->bs[c->nb - 1], ob[4] = {0}, batches = 1;
    for (int i = 0; i < nbat; i++) batches *= f->os[i];
    double L = 0;
    for (int64_t bi = 0; bi < batches; bi++) {
        int64_t rem = bi;
        for (int i = nbat - 1; i >= 0; i--) ob[i] = rem % f->os[i], rem /= f->os[i];
        const double *a = f->a + slot(c->as, c->na, ob, nbat) * M * K, *b = f->b + slot(c->bs, c->nb, ob, nbat) * K * N;
        for (int64_t m = 0; m < M; m++)
            for (int64_t n = 0; n < N; n++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += a[m * K + k] * b[k * N + n];
                L += acc * f->w[(bi * M + m) * N + n];
            }
    }
    return L;
}

static void run_case(const mm_case *c, lm_dtype dt, lm_dtype gdt, lt_rng *r) {
    mm_fd f = {c, NULL, NULL, NULL, 0, {0}};
    int nbat = (c->na > c->nb ? c->na : c->nb) - 2;
    for (int i = 0; i < nbat; i++) {
        int ia = i - (nbat - (c->na - 2)), ib = i - (nbat - (c->nb - 2));
        int64_t da = ia >= 0 ? c->as[ia] : 1, db = ib >= 0 ? c->bs[ib] : 1;
        f.os[i] = da == 1 ? db : da;
    }
    f.nd = nbat + 2;
    f.os[nbat] = c->as[c->na - 2];
    f.os[nbat + 1] = c->bs[c->nb - 1];
    lm_tensor *a = fd_random(r, dt, c->na, c->as, 1.0, &f.a), *w = fd_random(r, dt, f.nd, f.os, 1.0, &f.w);
    lm_tensor *braw;
    lm_tensor_view bv;
    if (c->b_transposed) { /* store W [N, K] row-major; b is its transpose */
        int64_t ws[2] = {c->bs[1], c->bs[0]};
        braw = lt_random_tensor(r, dt, 2, ws, 1.0);
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(braw), 0, 1, &bv));
    } else {
        braw = lt_random_tensor(r, dt, c->nb, c->bs, 1.0);
        bv = *lm_tensor_as_view(braw);
    }
    f.b = lt_view_to_f64(&bv);
    int64_t na = lm_tensor_numel(a), nbn = lm_tensor_view_numel(&bv);
    double *ga = malloc(sizeof(double) * (size_t)na), *gb = malloc(sizeof(double) * (size_t)nbn);
    fd_gradient(mm_loss, &f, f.a, na, ga);
    fd_gradient(mm_loss, &f, f.b, nbn, gb);
    double nmse = gdt == LM_F32 ? 1e-10 : 1e-6, rel = gdt == LM_F32 ? 1e-6 : 2e-3;
    for (int level = 0; level < 2; level++) {
        lm_tensor *da = lt_poisoned_tensor(gdt, c->na, c->as), *db = lt_poisoned_tensor(gdt, c->nb, c->bs);
        LT_CHECK_OK(lm_matmul_backward_out(level ? g_ref : g_ctx, lm_tensor_as_view(a), &bv, lm_tensor_as_view(w),
                                           lm_tensor_as_view(da), lm_tensor_as_view(db)));
        fd_check(level ? "da (ref)" : "da", lm_tensor_as_view(da), ga, nmse, rel);
        fd_check(level ? "db (ref)" : "db", lm_tensor_as_view(db), gb, nmse, rel);
        lm_tensor_destroy(da);
        lm_tensor_destroy(db);
    }
    free(f.a), free(f.b), free(f.w), free(ga), free(gb);
    lm_tensor_destroy(a), lm_tensor_destroy(braw), lm_tensor_destroy(w);
}

static void test_matmul_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(11);
    const mm_case cases[] = {
        {2, 2, {5, 7}, {7, 3}, 0},          /* plain */
        {4, 2, {2, 3, 4, 6}, {6, 5}, 0},    /* Linear over [2, 3] batch rows: composed level */
        {4, 2, {2, 3, 4, 6}, {6, 5}, 1},    /* ... with b = W^T view */
        {3, 3, {1, 3, 4}, {3, 4, 2}, 0},    /* a broadcast over b's batch */
        {3, 4, {2, 3, 4}, {3, 1, 4, 5}, 0}, /* both broadcast, b with an extra dim */
        {2, 2, {1, 1}, {1, 1}, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], LM_F32, LM_F32, &r);
    run_case(&cases[1], LM_BF16, LM_F32, &r); /* bf16 compute, f32 gradients */
    run_case(&cases[3], LM_F16, LM_F16, &r);
}

static void test_matmul_backward_skips_null_and_empty(void) {
    lt_rng r = lt_rng_seed(12);
    int64_t as[2] = {3, 0}, bs[2] = {0, 4}, os[2] = {3, 4};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, as, 1), *b = lt_random_tensor(&r, LM_F32, 2, bs, 1);
    lm_tensor *d = lt_random_tensor(&r, LM_F32, 2, os, 1);
    LT_CHECK_OK(lm_matmul_backward_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(d), NULL, NULL));
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(d);
    /* K = 0: the gradients of the empty operands are empty; M > 0 rows of dout are read */
    int64_t as2[2] = {2, 3}, bs2[2] = {3, 0}, os2[2] = {2, 0};
    a = lt_random_tensor(&r, LM_F32, 2, as2, 1), b = lt_random_tensor(&r, LM_F32, 2, bs2, 1);
    d = lt_random_tensor(&r, LM_F32, 2, os2, 1);
    lm_tensor *da = lt_poisoned_tensor(LM_F32, 2, as2);
    LT_CHECK_OK(lm_matmul_backward_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(d),
                                       lm_tensor_as_view(da), NULL));
    const float *p = lm_tensor_data(da);
    for (int i = 0; i < 6; i++) LT_CHECK(p[i] == 0.0f); /* the empty sum, not poison */
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(d), lm_tensor_destroy(da);
}

static void test_matmul_backward_errors(void) {
    lt_rng r = lt_rng_seed(13);
    int64_t as[2] = {3, 4}, bs[2] = {4, 5}, os[2] = {3, 5}, bad[2] = {3, 6};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 2, as, 1), *b = lt_random_tensor(&r, LM_F32, 2, bs, 1);
    lm_tensor *d = lt_random_tensor(&r, LM_F32, 2, os, 1), *dbad = lt_random_tensor(&r, LM_F32, 2, bad, 1);
    lm_tensor *h = lt_poisoned_tensor(LM_F16, 2, as), *ga = lt_poisoned_tensor(LM_F32, 2, as);
    const lm_tensor_view *va = lm_tensor_as_view(a), *vb = lm_tensor_as_view(b), *vd = lm_tensor_as_view(d);
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ctx, va, vb, lm_tensor_as_view(dbad), lm_tensor_as_view(ga), NULL),
                    LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "dout") != NULL);
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ctx, va, vb, vd, lm_tensor_as_view(h), NULL), LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "da") != NULL);
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ctx, va, vb, vd, va, NULL), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ctx, va, vb, vd, NULL, lm_tensor_as_view(ga)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ctx, NULL, vb, vd, NULL, NULL), LM_INVALID_ARGUMENT);
    lm_ctx_set_impl(g_ref, LM_IMPL_TUNED);
    lm_tensor *hb = lt_random_tensor(&r, LM_BF16, 2, bs, 1); /* bf16 b: not composed */
    LT_CHECK_STATUS(lm_matmul_backward_out(g_ref, va, lm_tensor_as_view(hb), vd, lm_tensor_as_view(ga), NULL), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(d), lm_tensor_destroy(dbad);
    lm_tensor_destroy(h), lm_tensor_destroy(ga), lm_tensor_destroy(hb);
}

static void test_matmul_backward_allocation_failures_leak_nothing(void) {
    lt_rng r = lt_rng_seed(14);
    int64_t as[3] = {2, 3, 4}, bs[2] = {4, 5}, os[3] = {2, 3, 5}, ws[2] = {5, 4};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 3, as, 1), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1);
    lm_tensor *d = lt_random_tensor(&r, LM_F32, 3, os, 1);
    lm_tensor *ga = lt_poisoned_tensor(LM_F32, 3, as), *gb = lt_poisoned_tensor(LM_F32, 2, bs);
    lm_tensor_view bt;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &bt));
    for (int ctx_i = 0; ctx_i < 2; ctx_i++) {
        int succeeded = 0;
        for (int64_t k = 1; k < 40 && !succeeded; k++) {
            lt_alloc_track(k);
            lm_status st = lm_matmul_backward_out(ctx_i ? g_ref : g_ctx, lm_tensor_as_view(a), &bt, lm_tensor_as_view(d),
                                                  lm_tensor_as_view(ga), lm_tensor_as_view(gb));
            int64_t live = lt_alloc_live();
            lt_alloc_untrack();
            LT_CHECK(st == LM_OK || st == LM_OUT_OF_MEMORY);
            LT_CHECK_MSG(live == 0, "%lld allocations leaked after failing allocation %lld", (long long)live, (long long)k);
            succeeded = st == LM_OK;
        }
        LT_CHECK(succeeded);
    }
    lm_tensor_destroy(a), lm_tensor_destroy(w), lm_tensor_destroy(d), lm_tensor_destroy(ga), lm_tensor_destroy(gb);
}

static size_t nbytes(const lm_tensor *t) { return (size_t)lm_tensor_numel(t) * lm_dtype_size(lm_tensor_dtype(t)); }

/* g0 + the written gradient, compared bit for bit (the CPU adds through a scratch). */
static void acc_case(lm_ctx *ctx, const lm_tensor_view *a, const lm_tensor_view *b, const lm_tensor_view *d, lm_dtype gdt,
                     lt_rng *r) {
    lm_tensor *wa = lt_poisoned_tensor(gdt, a->ndim, a->shape), *wb = lt_poisoned_tensor(gdt, b->ndim, b->shape);
    lm_tensor *ga = lt_random_tensor(r, gdt, a->ndim, a->shape, 1), *gb = lt_random_tensor(r, gdt, b->ndim, b->shape, 1);
    lm_tensor *ea = NULL, *eb = NULL;
    LT_CHECK_OK(lm_matmul_backward_out(ctx, a, b, d, lm_tensor_as_view(wa), lm_tensor_as_view(wb)));
    LT_CHECK_OK(lm_add(ctx, lm_tensor_as_view(ga), lm_tensor_as_view(wa), &ea));
    LT_CHECK_OK(lm_add(ctx, lm_tensor_as_view(gb), lm_tensor_as_view(wb), &eb));
    LT_CHECK_OK(lm_matmul_backward_acc_out(ctx, a, b, d, lm_tensor_as_view(ga), lm_tensor_as_view(gb)));
    LT_CHECK(memcmp(lm_tensor_data(ga), lm_tensor_data(ea), nbytes(ea)) == 0);
    LT_CHECK(memcmp(lm_tensor_data(gb), lm_tensor_data(eb), nbytes(eb)) == 0);
    /* db alone, into the transposed view of a row-major buffer (the training tape's form) */
    if (b->stride[0] == 1) {
        lm_tensor *g2 = lt_random_tensor(r, gdt, 2, (int64_t[]){b->shape[1], b->shape[0]}, 1), *e2 = NULL;
        lm_tensor_view g2t;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(g2), 0, 1, &g2t));
        lm_tensor *c2 = NULL;
        LT_CHECK_OK(lm_tensor_contiguous(ctx, g2, &c2));
        lm_tensor_view wbt;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(wb), 0, 1, &wbt));
        LT_CHECK_OK(lm_add(ctx, lm_tensor_as_view(c2), &wbt, &e2));
        LT_CHECK_OK(lm_matmul_backward_acc_out(ctx, a, b, d, NULL, &g2t));
        LT_CHECK(memcmp(lm_tensor_data(g2), lm_tensor_data(e2), nbytes(e2)) == 0);
        lm_tensor_destroy(g2), lm_tensor_destroy(e2), lm_tensor_destroy(c2);
    }
    lm_tensor_destroy(wa), lm_tensor_destroy(wb), lm_tensor_destroy(ga), lm_tensor_destroy(gb);
    lm_tensor_destroy(ea), lm_tensor_destroy(eb);
}

static void test_matmul_backward_acc_adds_the_gradient(void) {
    lt_rng r = lt_rng_seed(15);
    int64_t as[3] = {2, 3, 6}, ws[2] = {5, 6}, os[3] = {2, 3, 5};
    const lm_dtype dts[2] = {LM_F32, LM_BF16};
    for (int i = 0; i < 2; i++) {
        lm_tensor *a = lt_random_tensor(&r, dts[i], 3, as, 1), *w = lt_random_tensor(&r, dts[i], 2, ws, 1);
        lm_tensor *d = lt_random_tensor(&r, dts[i], 3, os, 1);
        lm_tensor_view bt;
        LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(w), 0, 1, &bt));
        for (int level = 0; level < 2; level++) acc_case(level ? g_ref : g_ctx, lm_tensor_as_view(a), &bt, lm_tensor_as_view(d), LM_F32, &r);
        lm_tensor_destroy(a), lm_tensor_destroy(w), lm_tensor_destroy(d);
    }
    /* the argument checks are the write form's */
    int64_t bs[2] = {6, 5};
    lm_tensor *a = lt_random_tensor(&r, LM_F32, 3, as, 1), *b = lt_random_tensor(&r, LM_F32, 2, bs, 1);
    lm_tensor *d = lt_random_tensor(&r, LM_F32, 3, os, 1), *h = lt_poisoned_tensor(LM_F16, 2, bs);
    LT_CHECK_STATUS(lm_matmul_backward_acc_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(d), NULL,
                                               lm_tensor_as_view(h)),
                    LM_DTYPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "matmul_backward_acc") != NULL);
    LT_CHECK_STATUS(lm_matmul_backward_acc_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), lm_tensor_as_view(d), NULL,
                                               lm_tensor_as_view(b)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_matmul_backward_acc_out(g_ctx, lm_tensor_as_view(a), lm_tensor_as_view(b), NULL, NULL, NULL),
                    LM_INVALID_ARGUMENT);
    lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(d), lm_tensor_destroy(h);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 2, &g_ctx) != LM_OK || lm_ctx_create(lm_device_cpu(), 1, &g_ref) != LM_OK) return 1;
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    LT_RUN(test_matmul_backward_matches_finite_differences);
    LT_RUN(test_matmul_backward_skips_null_and_empty);
    LT_RUN(test_matmul_backward_errors);
    LT_RUN(test_matmul_backward_allocation_failures_leak_nothing);
    LT_RUN(test_matmul_backward_acc_adds_the_gradient);
    lm_ctx_destroy(g_ctx);
    lm_ctx_destroy(g_ref);
    return lt_finish();
}
