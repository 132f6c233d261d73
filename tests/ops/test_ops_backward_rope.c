/* Tests for lm_rope_backward_out against float64 finite differences of
 * L = sum(rope(x + bias) * dy): split-half and interleaved pairs, per-row positions
 * and a position offset, attn_factor != 1, the bias gradient, a permuted dout view,
 * and the error paths.
 * LM_TEST_LABELS: unit
 */
#include "backward_fd.h"
#include "loom/ops_backward.h"

#include <string.h>

static lm_ctx *g_ctx;

typedef struct rope_fd {
    double *x, *bias, *dy, *inv; /* x, dy [B, T, H, D]; bias [H, D]; inv [D/2] */
    const int32_t *pos;          /* [B, T] or NULL (offset + t) */
    int64_t B, T, H, D, offset;
    int interleaved;
    double factor;
} rope_fd;

static double rope_loss(void *u) {
    rope_fd *f = u;
    int64_t half = f->D / 2;
    double L = 0;
    for (int64_t b = 0; b < f->B; b++)
        for (int64_t t = 0; t < f->T; t++) {
            double p = f->pos ? f->pos[b * f->T + t] : (double)(f->offset + t);
            for (int64_t h = 0; h < f->H; h++)
                for (int64_t i = 0; i < half; i++) {
                    int64_t ia = f->interleaved ? 2 * i : i, ib = f->interleaved ? 2 * i + 1 : i + half;
                    int64_t base = ((b * f->T + t) * f->H + h) * f->D;
                    double a = f->x[base + ia] + f->bias[h * f->D + ia], c = f->x[base + ib] + f->bias[h * f->D + ib];
                    double cs = cos(p * f->inv[i]) * f->factor, sn = sin(p * f->inv[i]) * f->factor;
                    L += (a * cs - c * sn) * f->dy[base + ia] + (c * cs + a * sn) * f->dy[base + ib];
                }
        }
    return L;
}

static void run_case(int interleaved, int with_positions, double factor, lt_rng *r) {
    rope_fd f = {0};
    f.B = 2, f.T = 3, f.H = 2, f.D = 6, f.offset = 5, f.interleaved = interleaved, f.factor = factor;
    int64_t s[4] = {f.B, f.T, f.H, f.D}, hd[2] = {f.H, f.D}, half = f.D / 2, bt[2] = {f.B, f.T};
    lm_tensor *x = fd_random(r, LM_F32, 4, s, 1.0, &f.x), *bias = fd_random(r, LM_F32, 2, hd, 0.5, &f.bias);
    /* dy as a permuted view: stored [B, H, T, D], seen [B, T, H, D] */
    int64_t sp[4] = {f.B, f.H, f.T, f.D};
    lm_tensor *dys = lt_random_tensor(r, LM_F32, 4, sp, 1.0);
    lm_tensor_view dyv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(dys), 1, 2, &dyv));
    f.dy = lt_view_to_f64(&dyv);
    lm_tensor *inv = NULL, *pos = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ctx, 100.0, f.D, lm_tensor_as_view(inv)));
    f.inv = lt_view_to_f64(lm_tensor_as_view(inv));
    int32_t pv[6] = {0, 7, 3, 11, 2, 2};
    if (with_positions) {
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, bt, pv, &pos));
        f.pos = pv;
    }
    int64_t n = f.B * f.T * f.H * f.D;
    double *gx = malloc(sizeof(double) * (size_t)n), *gb = malloc(sizeof(double) * (size_t)(f.H * f.D));
    fd_gradient(rope_loss, &f, f.x, n, gx);
    fd_gradient(rope_loss, &f, f.bias, f.H * f.D, gb);
    lm_rope_params p = {interleaved ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), (float)factor,
                        pos ? lm_tensor_as_view(pos) : NULL, f.offset, lm_tensor_as_view(bias)};
    /* the forward agrees with the double re-derivation at the unperturbed point */
    lm_tensor *out = lt_poisoned_tensor(LM_F32, 4, s);
    LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(out)));
    double *o = lt_view_to_f64(lm_tensor_as_view(out)), L = 0;
    for (int64_t i = 0; i < n; i++) L += o[i] * f.dy[i];
    LT_CHECK_MSG(fabs(L - rope_loss(&f)) < 1e-5 * (1 + fabs(L)), "forward %g vs re-derivation %g", L, rope_loss(&f));
    lm_tensor *dx = lt_poisoned_tensor(LM_F32, 4, s), *db = lt_poisoned_tensor(LM_F32, 2, hd);
    LT_CHECK_OK(lm_rope_backward_out(g_ctx, &dyv, &p, lm_tensor_as_view(dx), lm_tensor_as_view(db)));
    fd_check("dx", lm_tensor_as_view(dx), gx, 1e-10, 1e-6);
    fd_check("dbias", lm_tensor_as_view(db), gb, 1e-10, 1e-6);
    free(f.x), free(f.bias), free(f.dy), free(f.inv), free(gx), free(gb), free(o);
    lm_tensor_destroy(x), lm_tensor_destroy(bias), lm_tensor_destroy(dys), lm_tensor_destroy(inv);
    lm_tensor_destroy(pos), lm_tensor_destroy(out), lm_tensor_destroy(dx), lm_tensor_destroy(db);
}

static void test_rope_backward_matches_finite_differences(void) {
    lt_rng r = lt_rng_seed(41);
    run_case(0, 1, 1.0, &r);
    run_case(1, 0, 1.0, &r);
    run_case(0, 0, 0.7, &r);
    run_case(1, 1, 1.3, &r);
}

static void test_rope_backward_errors(void) {
    lt_rng r = lt_rng_seed(42);
    int64_t s[4] = {1, 2, 2, 4}, odd[4] = {1, 2, 2, 5}, half = 2, three = 3;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 4, s, 1), *xo = lt_random_tensor(&r, LM_F32, 4, odd, 1);
    lm_tensor *inv = lt_random_tensor(&r, LM_F32, 1, &half, 1), *inv3 = lt_random_tensor(&r, LM_F32, 1, &three, 1);
    lm_rope_params p = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 0, NULL};
    const lm_tensor_view *vx = lm_tensor_as_view(x);
    LT_CHECK_STATUS(lm_rope_backward_out(g_ctx, lm_tensor_as_view(xo), &p, NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_rope_backward_out(g_ctx, vx, NULL, NULL, NULL), LM_INVALID_ARGUMENT);
    p.inv_freq = lm_tensor_as_view(inv3);
    LT_CHECK_STATUS(lm_rope_backward_out(g_ctx, vx, &p, NULL, NULL), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "inv_freq") != NULL);
    p.inv_freq = lm_tensor_as_view(inv);
    LT_CHECK_STATUS(lm_rope_backward_out(g_ctx, vx, &p, vx, NULL), LM_INVALID_ARGUMENT);
    lm_tensor *bad_bias = lt_poisoned_tensor(LM_F32, 2, s);
    LT_CHECK_STATUS(lm_rope_backward_out(g_ctx, vx, &p, NULL, lm_tensor_as_view(bad_bias)), LM_SHAPE_MISMATCH);
    lm_tensor_destroy(x), lm_tensor_destroy(xo), lm_tensor_destroy(inv), lm_tensor_destroy(inv3), lm_tensor_destroy(bad_bias);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_rope_backward_matches_finite_differences);
    LT_RUN(test_rope_backward_errors);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
