/* Tests for the autograd tape's semantics: the first gradient contribution is adopted
 * and later ones summed into a fresh tensor unless the accumulated storage has a
 * single owner (an in-place sum would corrupt a gradient shared by an add's two
 * inputs); views (slices, transpose, reshape) and a leaf read twice (tied
 * embeddings) accumulate exactly; hooks fire once per leaf, after its last
 * contribution; bound caller buffers are written or added into (a Linear weight's
 * only gradient by its GEMM, in the buffer's f32); leaves the root does
 * not depend on; no_grad records nothing and allocates exactly what plain operator
 * calls allocate; misuse fails with clear statuses; allocation failures leak nothing.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/autograd.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

#define V(t) lm_tensor_as_view(t)

static lm_ag_var *leaf(lm_ag *ag, lm_tensor *t, int rg) {
    lm_ag_var *v = NULL;
    LT_CHECK_OK(lm_ag_leaf(ag, t, rg, &v));
    return v;
}

/* sum(c * x) as a scalar variable. */
static lm_ag_var *dot(lm_ag *ag, lm_ag_var *c, lm_ag_var *x) {
    lm_ag_var *m = NULL, *s = NULL;
    LT_CHECK_OK(lm_ag_mul(ag, c, x, &m));
    LT_CHECK_OK(lm_ag_sum(ag, m, &s));
    return s;
}

static int equal_f32(const lm_tensor *t, const float *want, int64_t n) {
    if (!t || lm_tensor_numel(t) != n) return 0;
    double *g = lt_view_to_f64(V(t));
    int ok = 1;
    for (int64_t i = 0; i < n; i++) ok &= g[i] == (double)want[i];
    free(g);
    return ok;
}

static void test_first_adopted_later_summed_fresh_unless_single_owner(void) {
    lt_rng r = lt_rng_seed(1);
    int64_t s[2] = {3, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *y = lt_random_tensor(&r, LM_F32, 2, s, 1);
    lm_tensor *c1 = lt_random_tensor(&r, LM_F32, 2, s, 1), *c2 = lt_random_tensor(&r, LM_F32, 2, s, 1);
    float want_x[12];
    const float *p1 = lm_tensor_data(c1), *p2 = lm_tensor_data(c2);
    for (int i = 0; i < 12; i++) want_x[i] = p1[i] + p2[i];
    for (int order = 0; order < 2; order++) {
        lm_ag *ag = NULL;
        LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
        lm_ag_var *vx = leaf(ag, x, 1), *vy = leaf(ag, y, 1), *k1 = leaf(ag, c1, 0), *k2 = leaf(ag, c2, 0);
        lm_ag_var *z = NULL, *a = NULL, *b = NULL, *L = NULL;
        if (order == 1) b = dot(ag, k2, vx); /* recorded first: its contribution to x arrives last */
        LT_CHECK_OK(lm_ag_add(ag, vx, vy, &z)); /* x and y receive one shared gradient tensor */
        a = dot(ag, k1, z);
        if (order == 0) b = dot(ag, k2, vx);
        LT_CHECK_OK(lm_ag_add(ag, a, b, &L));
        LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
        LT_CHECK(equal_f32(lm_ag_grad(vy), p1, 12)); /* untouched by x's accumulation */
        LT_CHECK(equal_f32(lm_ag_grad(vx), want_x, 12));
        lm_ag_stats st = lm_ag_get_stats(ag);
        /* order 0: x first gets c2 * 1 (a fresh product: single owner -> in place);
         * order 1: x first adopts the gradient shared with y -> a fresh sum */
        LT_CHECK_MSG(order == 0 ? (st.inplace_sums == 1 && st.fresh_sums == 0) : (st.inplace_sums == 0 && st.fresh_sums == 1),
                     "order %d: %lld in place, %lld fresh", order, (long long)st.inplace_sums, (long long)st.fresh_sums);
        LT_CHECK(lm_ag_grad(k1) == NULL && lm_ag_grad(z) == NULL); /* constants and non-leaves keep none */
        lm_ag_destroy(ag);
    }
    lm_tensor_destroy(x), lm_tensor_destroy(y), lm_tensor_destroy(c1), lm_tensor_destroy(c2);
}

static void test_views_accumulate_into_their_base(void) {
    lt_rng r = lt_rng_seed(2);
    int64_t s[2] = {4, 6}, s14[2] = {4, 4}, st[2] = {6, 4}, flat = 24;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1);
    lm_tensor *c1 = lt_random_tensor(&r, LM_F32, 2, s14, 1), *c2 = lt_random_tensor(&r, LM_F32, 2, s14, 1);
    lm_tensor *c3 = lt_random_tensor(&r, LM_F32, 2, st, 1), *c4 = lt_random_tensor(&r, LM_F32, 1, &flat, 1);
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    lm_ag_var *vx = leaf(ag, x, 1), *a, *b, *t, *rs, *L1, *L2, *L;
    LT_CHECK_OK(lm_ag_slice(ag, vx, 1, 0, 4, 1, &a));
    LT_CHECK_OK(lm_ag_slice(ag, vx, 1, 2, 6, 1, &b)); /* overlaps a on columns 2, 3 */
    LT_CHECK_OK(lm_ag_transpose(ag, vx, 0, 1, &t));
    LT_CHECK_OK(lm_ag_reshape(ag, vx, 1, &flat, &rs));
    LT_CHECK_OK(lm_ag_add(ag, dot(ag, leaf(ag, c1, 0), a), dot(ag, leaf(ag, c2, 0), b), &L1));
    LT_CHECK_OK(lm_ag_add(ag, dot(ag, leaf(ag, c3, 0), t), dot(ag, leaf(ag, c4, 0), rs), &L2));
    LT_CHECK_OK(lm_ag_add(ag, L1, L2, &L));
    LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
    const float *p1 = lm_tensor_data(c1), *p2 = lm_tensor_data(c2), *p3 = lm_tensor_data(c3), *p4 = lm_tensor_data(c4);
    double want[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 6; j++) {
            double w = p3[j * 4 + i] + p4[i * 6 + j];
            if (j < 4) w += p1[i * 4 + j];
            if (j >= 2) w += p2[i * 4 + j - 2];
            want[i * 6 + j] = w;
        }
    double *got = lt_view_to_f64(V(lm_ag_grad(vx)));
    lt_check_close("grad of the base", got, want, 24, 1e-13, 1e-6);
    free(got);
    lm_ag_destroy(ag);
    lm_tensor_destroy(x), lm_tensor_destroy(c1), lm_tensor_destroy(c2), lm_tensor_destroy(c3), lm_tensor_destroy(c4);
}

/* ---- hooks ---------------------------------------------------------------------------------- */
typedef struct hook_log {
    int calls[4];
    int order[8], n;
    double *final[4]; /* the gradient seen by the hook */
    lm_ag_var *leaves[4];
} hook_log;

static lm_status record_hook(void *user, lm_ag_var *v, const lm_tensor_view *grad) {
    hook_log *h = user;
    for (int i = 0; i < 4; i++)
        if (h->leaves[i] == v) {
            h->calls[i]++;
            h->order[h->n++] = i;
            free(h->final[i]);
            h->final[i] = grad ? lt_view_to_f64(grad) : NULL;
        }
    return LM_OK;
}

/* Tiny language-model head: ids -> embedding(table) -> rmsnorm(w) -> fused LCE with
 * the same table as the output projection (tied). */
static lm_ag_var *tied_model(lm_ag *ag, lm_ag_var *table, lm_ag_var *nw, const lm_tensor *ids, const lm_tensor *tg) {
    lm_ag_var *e = NULL, *h = NULL, *L = NULL;
    LT_CHECK_OK(lm_ag_embedding(ag, table, V(ids), &e));
    LT_CHECK_OK(lm_ag_rmsnorm(ag, e, nw, 1e-6f, &h));
    LT_CHECK_OK(lm_ag_linear_cross_entropy(ag, h, table, V(tg), -100, &L));
    return L;
}

static void test_tied_leaf_sums_both_uses_and_hooks_fire_once_after_the_last(void) {
    lt_rng r = lt_rng_seed(3);
    int64_t ts[2] = {11, 8}, d = 8, n = 6;
    int32_t ids[6] = {1, 4, 4, 9, 0, 4}, tgt[6] = {4, 4, 9, 0, 10, 2};
    lm_tensor *table = lt_random_tensor(&r, LM_F32, 2, ts, 1), *nw = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    lm_tensor *idt = NULL, *tt = NULL, *unused = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n, ids, &idt));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n, tgt, &tt));
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    hook_log h = {{0}, {0}, 0, {NULL}, {NULL}};
    lm_ag_var *vt = leaf(ag, table, 1), *vn = leaf(ag, nw, 1), *vu = leaf(ag, unused, 1);
    h.leaves[0] = vt, h.leaves[1] = vn, h.leaves[2] = vu;
    for (int i = 0; i < 3; i++) LT_CHECK_OK(lm_ag_set_hook(h.leaves[i], record_hook, &h));
    lm_ag_var *L = tied_model(ag, vt, vn, idt, tt);
    LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
    LT_CHECK(h.calls[0] == 1 && h.calls[1] == 1 && h.calls[2] == 1);
    /* the norm weight's last contribution comes before the table's embedding one;
     * the unused leaf is finalized at the end with no gradient */
    LT_CHECK(h.n == 3 && h.order[0] == 1 && h.order[1] == 0 && h.order[2] == 2 && h.final[2] == NULL);
    /* the table's gradient is the sum of both uses, each computed on its own */
    lm_ag_var *e = NULL, *hh = NULL, *L2 = NULL;
    lm_ag *a1 = NULL, *a2 = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &a1));
    LT_CHECK_OK(lm_ag_create(g_ctx, &a2));
    lm_ag_var *t1 = leaf(a1, table, 1), *t1c = leaf(a1, table, 0), *n1 = leaf(a1, nw, 0);
    LT_CHECK_OK(lm_ag_embedding(a1, t1, V(idt), &e)); /* embedding use only */
    LT_CHECK_OK(lm_ag_rmsnorm(a1, e, n1, 1e-6f, &hh));
    LT_CHECK_OK(lm_ag_linear_cross_entropy(a1, hh, t1c, V(tt), -100, &L2));
    LT_CHECK_OK(lm_ag_backward(a1, L2, 1.0f));
    lm_ag_var *t2 = leaf(a2, table, 1), *t2c = leaf(a2, table, 0), *n2 = leaf(a2, nw, 0);
    LT_CHECK_OK(lm_ag_embedding(a2, t2c, V(idt), &e)); /* projection use only */
    LT_CHECK_OK(lm_ag_rmsnorm(a2, e, n2, 1e-6f, &hh));
    LT_CHECK_OK(lm_ag_linear_cross_entropy(a2, hh, t2, V(tt), -100, &L2));
    LT_CHECK_OK(lm_ag_backward(a2, L2, 1.0f));
    double *g1 = lt_view_to_f64(V(lm_ag_grad(t1))), *g2 = lt_view_to_f64(V(lm_ag_grad(t2))), want[88];
    for (int i = 0; i < 88; i++) want[i] = g1[i] + g2[i];
    lt_check_close("tied table gradient", h.final[0], want, 88, 1e-13, 1e-6);
    double *fin = lt_view_to_f64(V(lm_ag_grad(vt)));
    lt_check_close("hook saw the final gradient", h.final[0], fin, 88, 0, 0);
    free(g1), free(g2), free(fin);
    for (int i = 0; i < 3; i++) free(h.final[i]);
    lm_ag_destroy(ag), lm_ag_destroy(a1), lm_ag_destroy(a2);
    lm_tensor_destroy(table), lm_tensor_destroy(nw), lm_tensor_destroy(idt), lm_tensor_destroy(tt), lm_tensor_destroy(unused);
}

static void test_bound_buffers_are_written_or_accumulated(void) {
    lt_rng r = lt_rng_seed(4);
    int64_t s[2] = {2, 5};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, s, 1), *c = lt_random_tensor(&r, LM_F32, 2, s, 1);
    lm_tensor *buf = lt_poisoned_tensor(LM_F32, 2, s), *acc = NULL, *zero = lt_poisoned_tensor(LM_F32, 2, s);
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, s, &acc));
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    for (int pass = 0; pass < 2; pass++) {
        lm_ag_var *vx = leaf(ag, x, 1), *vu = leaf(ag, x, 1), *vx2 = leaf(ag, x, 1);
        LT_CHECK_OK(lm_ag_bind_grad(vx, V(buf), 0));
        LT_CHECK_OK(lm_ag_bind_grad(vx2, V(acc), 1));
        LT_CHECK_OK(lm_ag_bind_grad(vu, V(zero), 0)); /* never read by the loss */
        lm_ag_var *L = NULL;
        LT_CHECK_OK(lm_ag_add(ag, dot(ag, leaf(ag, c, 0), vx), dot(ag, leaf(ag, c, 0), vx2), &L));
        LT_CHECK_OK(lm_ag_backward(ag, L, 2.0f));
        LT_CHECK(lm_ag_grad(vx) == NULL && lm_ag_grad(vx2) == NULL);
        lm_ag_reset(ag);
    }
    const float *pc = lm_tensor_data(c), *pb = lm_tensor_data(buf), *pa = lm_tensor_data(acc), *pz = lm_tensor_data(zero);
    for (int i = 0; i < 10; i++) {
        LT_CHECK(pb[i] == 2.0f * pc[i]);        /* written (the seed scales it) */
        LT_CHECK(pa[i] == 4.0f * pc[i]);        /* two passes added */
        LT_CHECK(pz[i] == 0.0f);                /* unreached: zeros, not poison */
    }
    lm_ag_destroy(ag);
    lm_tensor_destroy(x), lm_tensor_destroy(c), lm_tensor_destroy(buf), lm_tensor_destroy(acc), lm_tensor_destroy(zero);
}

/* A Linear weight's only contribution goes into its bound buffer by the GEMM itself:
 * a bf16 weight with an f32 buffer gets f32 sums (no bf16 rounding of the gradient),
 * written or added; a weight read by two Linears takes the summed path, and so does
 * their input x (the second GEMM adds into the first's dx). Expected values in
 * double: dW[n, k] = uses * sum_r c[r, n] x[r, k], dx[r, k] = 2 sum_n c[r, n] W[n, k]. */
static void test_linear_weight_gradient_goes_straight_into_its_buffer(void) {
    lt_rng r = lt_rng_seed(6);
    int64_t xs[2] = {7, 6}, ws[2] = {4, 6}, ys[2] = {7, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_BF16, 2, xs, 1), *w = lt_random_tensor(&r, LM_BF16, 2, ws, 1);
    lm_tensor *c = lt_random_tensor(&r, LM_BF16, 2, ys, 1);
    double *px = lt_view_to_f64(V(x)), *pc = lt_view_to_f64(V(c)), want[24];
    for (int n = 0; n < 4; n++)
        for (int k = 0; k < 6; k++) {
            want[n * 6 + k] = 0;
            for (int i = 0; i < 7; i++) want[n * 6 + k] += pc[i * 4 + n] * px[i * 6 + k];
        }
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    for (int mode = 0; mode < 3; mode++) { /* written; added onto 1.0; read twice, added */
        lm_tensor *buf = mode == 0 ? lt_poisoned_tensor(LM_F32, 2, ws) : NULL;
        if (mode) {
            float ones[24];
            for (int i = 0; i < 24; i++) ones[i] = 1.0f;
            LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, ws, ones, &buf));
        }
        lm_ag_var *vw = leaf(ag, w, 1), *vx = leaf(ag, x, mode == 2), *y = NULL, *L = NULL;
        LT_CHECK_OK(lm_ag_bind_grad(vw, V(buf), mode > 0));
        LT_CHECK_OK(lm_ag_linear(ag, vx, vw, NULL, &y));
        L = dot(ag, leaf(ag, c, 0), y);
        if (mode == 2) {
            lm_ag_var *y2 = NULL, *L2 = NULL;
            LT_CHECK_OK(lm_ag_linear(ag, vx, vw, NULL, &y2));
            LT_CHECK_OK(lm_ag_add(ag, L, dot(ag, leaf(ag, c, 0), y2), &L2));
            L = L2;
        }
        LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
        LT_CHECK(lm_ag_grad(vw) == NULL);
        const float *pb = lm_tensor_data(buf);
        double worst = 0, uses = mode == 2 ? 2 : 1, base = mode ? 1 : 0;
        for (int i = 0; i < 24; i++) {
            double e = fabs(pb[i] - (base + uses * want[i])) / (fabs(want[i]) + 1);
            worst = e > worst ? e : worst;
        }
        /* f32 sums of exact bf16 products (mode 2 sums two bf16 gradients: bf16 rounding) */
        LT_CHECK_MSG(worst < (mode == 2 ? 1e-2 : 1e-5), "mode %d: worst relative error %g", mode, worst);
        if (mode == 2) { /* x read twice: the second GEMM adds into the first's dx (bf16) */
            double *gx = lt_view_to_f64(V(lm_ag_grad(vx))), *pw = lt_view_to_f64(V(w)), wx = 0;
            for (int i = 0; i < 7; i++)
                for (int k = 0; k < 6; k++) {
                    double e = 0;
                    for (int n = 0; n < 4; n++) e += 2 * pc[i * 4 + n] * pw[n * 6 + k];
                    e = fabs(gx[i * 6 + k] - e) / (fabs(e) + 1);
                    wx = e > wx ? e : wx;
                }
            LT_CHECK_MSG(wx < 1e-2, "dx: worst relative error %g", wx);
            free(gx), free(pw);
        }
        lm_ag_reset(ag);
        lm_tensor_destroy(buf);
    }
    lm_ag_destroy(ag);
    free(px), free(pc);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(c);
}

/* Attention over [B, H, T, D] views of [B, T, H, D] buffers (the training graph's
 * form): its output and its input gradients keep that storage order, so viewed back
 * as [B, T, H, D] they are contiguous (no copy before the next reshape), and the
 * values equal those of the same attention on contiguous [B, H, T, D] copies. */
static void test_attention_keeps_the_token_major_storage_order(void) {
    lt_rng r = lt_rng_seed(7);
    int64_t s[4] = {2, 5, 3, 4}; /* B, T, H, D */
    lm_tensor *buf[3], *cont[3], *dy = lt_random_tensor(&r, LM_F32, 4, (int64_t[]){2, 3, 5, 4}, 1);
    for (int i = 0; i < 3; i++) {
        buf[i] = lt_random_tensor(&r, LM_F32, 4, s, 1);
        lm_tensor *t = NULL;
        LT_CHECK_OK(lm_tensor_transpose(buf[i], 1, 2, &t));
        LT_CHECK_OK(lm_tensor_contiguous(g_ctx, t, &cont[i]));
        lm_tensor_destroy(t);
    }
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    double *got[2][4] = {{NULL}};
    for (int pass = 0; pass < 2; pass++) { /* 0: token-major buffers viewed; 1: contiguous [B, H, T, D] */
        lm_ag_var *lv[3], *in[3], *a = NULL, *L = NULL;
        for (int i = 0; i < 3; i++) {
            lv[i] = leaf(ag, pass ? cont[i] : buf[i], 1);
            if (pass) in[i] = lv[i];
            else LT_CHECK_OK(lm_ag_transpose(ag, lv[i], 1, 2, &in[i]));
        }
        LT_CHECK_OK(lm_ag_attention(ag, in[0], in[1], in[2], 0.5f, 1, &a));
        const lm_tensor_view *av = V(lm_ag_value(a));
        if (pass == 0) /* [B, H, T, D] over a [B, T, H, D] buffer */
            LT_CHECK(av->stride[3] == 1 && av->stride[1] == 4 && av->stride[2] == 12 && av->stride[0] == 60);
        L = dot(ag, leaf(ag, dy, 0), a);
        LT_CHECK_OK(lm_ag_backward(ag, L, 1.0f));
        got[pass][3] = lt_view_to_f64(av);
        for (int i = 0; i < 3; i++) {
            const lm_tensor *g = lm_ag_grad(lv[i]);
            LT_CHECK(g != NULL);
            if (!g) continue;
            lm_tensor_view gv = *V(g);
            if (pass == 0) LT_CHECK(lm_tensor_view_is_contiguous(&gv));
            else { /* compare in [B, T, H, D] order */
                lm_tensor_view t;
                LT_CHECK_OK(lm_tensor_view_transpose(&gv, 1, 2, &t));
                gv = t;
            }
            got[pass][i] = lt_view_to_f64(&gv);
        }
        lm_ag_reset(ag);
    }
    for (int i = 0; i < 4; i++) {
        int64_t n = 2 * 5 * 3 * 4;
        double worst = 0;
        for (int64_t j = 0; j < n && got[0][i] && got[1][i]; j++) {
            double e = fabs(got[0][i][j] - got[1][i][j]);
            worst = e > worst ? e : worst;
        }
        LT_CHECK_MSG(worst < 1e-5, "tensor %d: max |difference| %g", i, worst);
        free(got[0][i]), free(got[1][i]);
    }
    lm_ag_destroy(ag);
    for (int i = 0; i < 3; i++) lm_tensor_destroy(buf[i]), lm_tensor_destroy(cont[i]);
    lm_tensor_destroy(dy);
}

/* linear(+bias) -> rmsnorm -> swiglu(h, h) -> sum-free chain, under a given mode. */
static void chain(lm_ag *ag, lm_ag_var *x, lm_ag_var *w, lm_ag_var *b, lm_ag_var *nw) {
    lm_ag_var *y = NULL, *n = NULL, *s = NULL;
    LT_CHECK_OK(lm_ag_linear(ag, x, w, b, &y));
    LT_CHECK_OK(lm_ag_rmsnorm(ag, y, nw, 1e-6f, &n));
    LT_CHECK_OK(lm_ag_swiglu(ag, n, y, &s));
}

static void plain_chain(const lm_tensor *x, const lm_tensor *w, const lm_tensor *b, const lm_tensor *nw) {
    lm_tensor *y = NULL, *n = NULL, *s = NULL;
    lm_tensor_view wt;
    LT_CHECK_OK(lm_tensor_view_transpose(V(w), 0, 1, &wt));
    LT_CHECK_OK(lm_matmul(g_ctx, V(x), &wt, &y));
    LT_CHECK_OK(lm_add_out(g_ctx, V(y), V(b), V(y)));
    LT_CHECK_OK(lm_rmsnorm(g_ctx, V(y), V(nw), 1e-6f, &n));
    LT_CHECK_OK(lm_swiglu(g_ctx, V(n), V(y), &s));
    lm_tensor_destroy(y), lm_tensor_destroy(n), lm_tensor_destroy(s);
}

static void test_no_grad_records_nothing_and_allocates_like_plain_ops(void) {
    lt_rng r = lt_rng_seed(5);
    int64_t xs[2] = {3, 4}, ws[2] = {6, 4}, n6 = 6;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1);
    lm_tensor *b = lt_random_tensor(&r, LM_F32, 1, &n6, 1), *nw = lt_random_tensor(&r, LM_F32, 1, &n6, 1);
    lm_ag *ag = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    lm_ag_var *vx = leaf(ag, x, 1), *vw = leaf(ag, w, 1), *vb = leaf(ag, b, 1), *vn = leaf(ag, nw, 1);
    chain(ag, vx, vw, vb, vn); /* recording: nodes exist */
    LT_CHECK(lm_ag_get_stats(ag).nodes == 3);
    lm_ag_set_grad_enabled(ag, 0);
    int64_t before = lm_ag_get_stats(ag).nodes;
    lt_alloc_track(0);
    chain(ag, vx, vw, vb, vn);
    int64_t with_tape = lt_alloc_count();
    lt_alloc_untrack();
    LT_CHECK(lm_ag_get_stats(ag).nodes == before);
    lt_alloc_track(0);
    plain_chain(x, w, b, nw);
    int64_t plain = lt_alloc_count();
    lt_alloc_untrack();
    LT_CHECK_MSG(with_tape == plain, "no_grad chain made %lld allocations, plain operators %lld", (long long)with_tape,
                 (long long)plain);
    lm_ag_set_grad_enabled(ag, 1);
    LT_CHECK(lm_ag_grad_enabled(ag) == 1);
    lm_ag_destroy(ag);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(b), lm_tensor_destroy(nw);
}

static lm_status failing_hook(void *user, lm_ag_var *v, const lm_tensor_view *g) {
    (void)user, (void)v, (void)g;
    return LM_DEVICE_ERROR;
}

static void test_misuse_fails_clearly(void) {
    lt_rng r = lt_rng_seed(6);
    int64_t s[1] = {3};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 1, s, 1), *ids = lt_random_tensor(&r, LM_I32, 1, s, 1);
    lm_ag *ag = NULL, *other = NULL;
    LT_CHECK_OK(lm_ag_create(g_ctx, &ag));
    LT_CHECK_OK(lm_ag_create(g_ctx, &other));
    lm_ag_var *vx = leaf(ag, x, 1), *vc = leaf(ag, x, 0), *vo = leaf(other, x, 1), *y = NULL, *L = NULL;
    lm_ag_var *bad = NULL;
    LT_CHECK_STATUS(lm_ag_leaf(ag, ids, 1, &bad), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_ag_add(ag, vx, vo, &y), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "another tape") != NULL);
    LT_CHECK_OK(lm_ag_add(ag, vx, vx, &y));
    LT_CHECK_STATUS(lm_ag_backward(ag, y, 1.0f), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_ag_bind_grad(vc, V(x), 0), LM_INVALID_ARGUMENT);
    lm_ag_var *cs = NULL;
    LT_CHECK_OK(lm_ag_sum(ag, vc, &cs));
    LT_CHECK_STATUS(lm_ag_backward(ag, cs, 1.0f), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "does not require") != NULL);
    LT_CHECK_OK(lm_ag_sum(ag, y, &L));
    LT_CHECK_OK(lm_ag_set_hook(vx, failing_hook, NULL));
    LT_CHECK_STATUS(lm_ag_backward(ag, L, 1.0f), LM_DEVICE_ERROR);
    LT_CHECK_STATUS(lm_ag_backward(ag, L, 1.0f), LM_INVALID_ARGUMENT); /* once per graph */
    lm_ag_reset(ag);
    vx = leaf(ag, x, 1);
    LT_CHECK_OK(lm_ag_sum(ag, vx, &L));
    LT_CHECK_OK(lm_ag_backward(ag, L, 3.0f));
    const float *g = lm_tensor_data(lm_ag_grad(vx));
    LT_CHECK(g[0] == 3.0f && g[1] == 3.0f && g[2] == 3.0f);
    lm_ag_destroy(ag), lm_ag_destroy(other);
    lm_tensor_destroy(x), lm_tensor_destroy(ids);
}

static void test_allocation_failures_leak_nothing(void) {
    lt_rng r = lt_rng_seed(7);
    int64_t ts[2] = {11, 8}, d = 8, n = 6;
    int32_t ids[6] = {1, 4, 4, 9, 0, 4}, tgt[6] = {4, 4, 9, 0, 10, 2};
    lm_tensor *table = lt_random_tensor(&r, LM_F32, 2, ts, 1), *nw = lt_random_tensor(&r, LM_F32, 1, &d, 1);
    lm_tensor *idt = NULL, *tt = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n, ids, &idt));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &n, tgt, &tt));
    int succeeded = 0;
    for (int64_t k = 1; k < 400 && !succeeded; k++) {
        lt_alloc_track(k);
        lm_ag *ag = NULL;
        lm_status st = lm_ag_create(g_ctx, &ag);
        lm_ag_var *vt = NULL, *vn = NULL, *e = NULL, *h = NULL, *L = NULL;
        if (st == LM_OK) st = lm_ag_leaf(ag, table, 1, &vt);
        if (st == LM_OK) st = lm_ag_leaf(ag, nw, 1, &vn);
        if (st == LM_OK) st = lm_ag_embedding(ag, vt, V(idt), &e);
        if (st == LM_OK) st = lm_ag_rmsnorm(ag, e, vn, 1e-6f, &h);
        if (st == LM_OK) st = lm_ag_linear_cross_entropy(ag, h, vt, V(tt), -100, &L);
        if (st == LM_OK) st = lm_ag_backward(ag, L, 1.0f);
        lm_ag_destroy(ag);
        int64_t live = lt_alloc_live();
        lt_alloc_untrack();
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "failure %lld gave %s", (long long)k, lm_status_name(st));
        LT_CHECK_MSG(live == 0, "%lld allocations leaked when allocation %lld failed", (long long)live, (long long)k);
        succeeded = st == LM_OK;
    }
    LT_CHECK(succeeded);
    lm_tensor_destroy(table), lm_tensor_destroy(nw), lm_tensor_destroy(idt), lm_tensor_destroy(tt);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 1, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_first_adopted_later_summed_fresh_unless_single_owner);
    LT_RUN(test_views_accumulate_into_their_base);
    LT_RUN(test_tied_leaf_sums_both_uses_and_hooks_fire_once_after_the_last);
    LT_RUN(test_bound_buffers_are_written_or_accumulated);
    LT_RUN(test_linear_weight_gradient_goes_straight_into_its_buffer);
    LT_RUN(test_attention_keeps_the_token_major_storage_order);
    LT_RUN(test_no_grad_records_nothing_and_allocates_like_plain_ops);
    LT_RUN(test_misuse_fails_clearly);
    LT_RUN(test_allocation_failures_leak_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
