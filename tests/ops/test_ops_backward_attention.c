/* Tests for lm_attention_backward_out against float64 finite differences of
 * L = sum(attention(q, k, v) * dy): multi-head, grouped (GQA) and multi-query heads,
 * causal with Tk > Tq (a prefix already cached), Dv != D, q passed as a permuted
 * [B, T, H, D] buffer, bf16 operands with f32 gradients, and the error paths; the
 * attention with statistics (lm_attention_lse_out and its backward) refused on the
 * CPU after its argument checks (its results are tested in tests/cuda).
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx;

typedef struct attn_fd {
    double *q, *k, *v, *dy; /* row-major [B, H, T, D] logical layouts */
    int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
    int causal;
    double scale;
} attn_fd;

static double attn_loss(void *u) {
    attn_fd *f = u;
    double L = 0, p[64];
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t h = 0; h < f->Hq; h++) {
            int64_t g = h / (f->Hq / f->Hkv);
            for (int64_t i = 0; i < f->Tq; i++) {
                int64_t nk = f->causal ? i + f->Tk - f->Tq + 1 : f->Tk;
                const double *q = f->q + ((b * f->Hq + h) * f->Tq + i) * f->D;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = 0; j < nk; j++) {
                    const double *k = f->k + ((b * f->Hkv + g) * f->Tk + j) * f->D;
                    double s = 0;
                    for (int64_t d = 0; d < f->D; d++) s += q[d] * k[d];
                    p[j] = s * f->scale;
                    mx = p[j] > mx ? p[j] : mx;
                }
                for (int64_t j = 0; j < nk; j++) sum += (p[j] = exp(p[j] - mx));
                for (int64_t e = 0; e < f->Dv; e++) {
                    double o = 0;
                    for (int64_t j = 0; j < nk; j++) o += p[j] / sum * f->v[((b * f->Hkv + g) * f->Tk + j) * f->Dv + e];
                    L += o * f->dy[((b * f->Hq + h) * f->Tq + i) * f->Dv + e];
                }
            }
        }
    return L;
}

static void run_case(int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk, int causal, lm_dtype dt, lt_rng *r) {
    attn_fd f = {NULL, NULL, NULL, NULL, 2, Hq, Hkv, Tq, Tk, 4, 3, causal, (double)0.6f};
    int64_t qs_bthd[4] = {f.B, Tq, Hq, f.D}, ks[4] = {f.B, Hkv, Tk, f.D}, vs[4] = {f.B, Hkv, Tk, f.Dv};
    int64_t os[4] = {f.B, Hq, Tq, f.Dv};
    lm_tensor *qb = lt_random_tensor(r, dt, 4, qs_bthd, 1.0);
    lm_tensor_view qv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(qb), 1, 2, &qv)); /* [B, Hq, Tq, D] */
    f.q = lt_view_to_f64(&qv);
    lm_tensor *k = fd_random(r, dt, 4, ks, 1.0, &f.k), *v = fd_random(r, dt, 4, vs, 1.0, &f.v);
    lm_tensor *dy = fd_random(r, dt, 4, os, 1.0, &f.dy);
    int64_t nq = lm_tensor_view_numel(&qv), nk = lm_tensor_numel(k), nv = lm_tensor_numel(v);
    double *gq = malloc(sizeof(double) * (size_t)nq), *gk = malloc(sizeof(double) * (size_t)nk);
    double *gv = malloc(sizeof(double) * (size_t)nv);
    fd_gradient(attn_loss, &f, f.q, nq, gq);
    fd_gradient(attn_loss, &f, f.k, nk, gk);
    fd_gradient(attn_loss, &f, f.v, nv, gv);
    lm_tensor *dq = lt_poisoned_tensor(LM_F32, 4, qv.shape), *dk = lt_poisoned_tensor(LM_F32, 4, ks);
    lm_tensor *dv = lt_poisoned_tensor(LM_F32, 4, vs);
    LT_CHECK_OK(lm_attention_backward_out(g_ctx, &qv, lm_tensor_as_view(k), lm_tensor_as_view(v), lm_tensor_as_view(dy),
                                          (float)f.scale, causal, lm_tensor_as_view(dq), lm_tensor_as_view(dk),
                                          lm_tensor_as_view(dv)));
    /* scale is passed as f32 (0.6f); the differences use the same rounded value */
    fd_check("dq", lm_tensor_as_view(dq), gq, 1e-10, 1e-6);
    fd_check("dk", lm_tensor_as_view(dk), gk, 1e-10, 1e-6);
    fd_check("dv", lm_tensor_as_view(dv), gv, 1e-10, 1e-6);
    free(f.q), free(f.k), free(f.v), free(f.dy), free(gq), free(gk), free(gv);
    lm_tensor_destroy(qb), lm_tensor_destroy(k), lm_tensor_destroy(v), lm_tensor_destroy(dy);
    lm_tensor_destroy(dq), lm_tensor_destroy(dk), lm_tensor_destroy(dv);
}

static void test_attention_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(51);
    run_case(2, 2, 4, 4, 0, LM_F32, &r); /* MHA */
    run_case(4, 2, 3, 5, 1, LM_F32, &r); /* GQA, causal over a cached prefix */
    run_case(4, 1, 5, 5, 1, LM_F32, &r); /* MQA, causal training shape */
    run_case(2, 1, 3, 3, 1, LM_BF16, &r);
}

static void test_attention_backward_errors(void) {
    lt_rng r = lt_rng_seed(52);
    int64_t qs[4] = {1, 3, 2, 4}, ks[4] = {1, 2, 2, 4}, k1[4] = {1, 1, 1, 4};
    lm_tensor *q = lt_random_tensor(&r, LM_F32, 4, qs, 1), *k = lt_random_tensor(&r, LM_F32, 4, ks, 1);
    lm_tensor *kk = lt_random_tensor(&r, LM_F32, 4, k1, 1), *d = lt_random_tensor(&r, LM_F32, 4, qs, 1);
    const lm_tensor_view *vq = lm_tensor_as_view(q), *vk = lm_tensor_as_view(k), *vd = lm_tensor_as_view(d);
    LT_CHECK_STATUS(lm_attention_backward_out(g_ctx, vq, vk, vk, vd, 1.0f, 0, NULL, NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "multiple") != NULL);
    LT_CHECK_STATUS(lm_attention_backward_out(g_ctx, vq, lm_tensor_as_view(kk), lm_tensor_as_view(kk), vd, 1.0f, 1, NULL,
                                              NULL, NULL),
                    LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "causal") != NULL);
    lm_tensor *dq = lt_poisoned_tensor(LM_F32, 4, qs);
    LT_CHECK_STATUS(lm_attention_backward_out(g_ctx, vq, lm_tensor_as_view(kk), lm_tensor_as_view(kk), vd, 1.0f, 0, vd,
                                              NULL, NULL),
                    LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_attention_backward_out(g_ctx, vq, lm_tensor_as_view(kk), lm_tensor_as_view(kk), vd, 1.0f, 0,
                                          lm_tensor_as_view(dq), NULL, NULL));
    lm_tensor_destroy(q), lm_tensor_destroy(k), lm_tensor_destroy(kk), lm_tensor_destroy(d), lm_tensor_destroy(dq);
}

/* The attention with statistics runs only on the CUDA flash kernel: on the CPU it is
 * refused by name (nothing written), after the usual argument checks. */
static void test_attention_lse_refused_on_cpu(void) {
    lt_rng r = lt_rng_seed(53);
    int64_t qs[4] = {1, 2, 3, 4}, ls[3] = {1, 2, 3}, bad[3] = {1, 2, 4};
    lm_tensor *q = lt_random_tensor(&r, LM_F32, 4, qs, 1), *o = lt_poisoned_tensor(LM_F32, 4, qs);
    lm_tensor *lse = lt_poisoned_tensor(LM_F32, 3, ls), *lse_bad = lt_poisoned_tensor(LM_F32, 3, bad);
    lm_tensor *lse_i32 = lt_poisoned_tensor(LM_I32, 3, ls), *dq = lt_poisoned_tensor(LM_F32, 4, qs);
    const lm_tensor_view *vq = lm_tensor_as_view(q), *vo = lm_tensor_as_view(o), *vl = lm_tensor_as_view(lse);
    LT_CHECK(!lm_attention_lse_supported(g_ctx, vq, vq, vq, 1, vo));
    LT_CHECK(!lm_attention_lse_supported(NULL, vq, vq, vq, 1, vo));
    LT_CHECK_STATUS(lm_attention_lse_out(g_ctx, vq, vq, vq, 0.5f, 1, 0, vo, vl), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "attention_lse") && strstr(lm_last_error(), "CUDA flash"));
    LT_CHECK_STATUS(lm_attention_lse_out(g_ctx, vq, vq, vq, 0.5f, 1, 0, vo, lm_tensor_as_view(lse_bad)),
                    LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_attention_lse_out(g_ctx, vq, vq, vq, 0.5f, 1, 0, vo, lm_tensor_as_view(lse_i32)),
                    LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_attention_lse_out(g_ctx, vq, vq, vq, 0.5f, 0, 2, vo, vl), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "window") != NULL);
    LT_CHECK_STATUS(lm_attention_backward_lse_out(g_ctx, vq, vq, vq, vo, vl, vq, 0.5f, 1, 0, lm_tensor_as_view(dq),
                                                  NULL, NULL),
                    LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "attention_backward_lse") != NULL);
    LT_CHECK_STATUS(lm_attention_backward_lse_out(g_ctx, vq, vq, vq, vo, vl, vq, 0.5f, 1, 0, vo, NULL, NULL),
                    LM_INVALID_ARGUMENT); /* dq overlapping the saved out */
    float *ql = lm_tensor_data(lse);
    LT_CHECK(isnan(ql[0]) && isnan(ql[5])); /* poison untouched */
    lm_tensor_destroy(q), lm_tensor_destroy(o), lm_tensor_destroy(lse), lm_tensor_destroy(lse_bad);
    lm_tensor_destroy(lse_i32), lm_tensor_destroy(dq);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_attention_lse_refused_on_cpu);
    LT_RUN(test_attention_backward_matches_finite_differences);
    LT_RUN(test_attention_backward_errors);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
