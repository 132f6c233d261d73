/* CUDA selection kernels: argmax and top-k against the CPU reference (per float
 * dtype, i32 and i64 indices, permuted inputs, planted ties and NaNs, which rank
 * highest), exact; and the device sampler sample: greedy equals argmax, top-k 1
 * equals argmax, every draw under top-k / top-p / min-p lies in the set lm_sampler's
 * rules keep (computed here on the host by sorting), and with top-k 3 the empirical
 * frequencies of 3000 draws per row match the renormalized softmax within 0.04.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

/* Rows of x (a host tensor [rows, n] of dt) with ties and NaNs planted. */
static void plant(lm_tensor *x, int nan) {
    int64_t rows = lm_tensor_dim(x, 0), n = lm_tensor_dim(x, 1);
    lm_tensor_view v = *lm_tensor_as_view(x);
    double *vals = lt_view_to_f64(&v);
    for (int64_t r = 0; r < rows; r++) {
        vals[r * n + 7] = vals[r * n + 40] = 9.0; /* a tie at the top: 7 wins */
        vals[r * n + 3] = vals[r * n + 11] = 8.5;
        if (nan && r == 1) vals[r * n + 20] = NAN;
    }
    lm_tensor *t = NULL;
    lm_dtype dt = lm_tensor_dtype(x);
    float *f = malloc(sizeof(float) * (size_t)(rows * n));
    for (int64_t i = 0; i < rows * n; i++) f[i] = (float)vals[i];
    int64_t s[2] = {rows, n};
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, s, f, &t));
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(t), lm_tensor_as_view(x)));
    (void)dt;
    lm_tensor_destroy(t);
    free(f);
    free(vals);
}

static void test_argmax_topk_exact(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k];
        lt_rng r = lt_rng_seed(141 + (uint64_t)k);
        int64_t s[2] = {5, 300};
        lm_tensor *xh = lt_random_tensor(&r, dt, 2, s, 2.0);
        plant(xh, 1);
        ct_pair x = ct_pair_of(xh);
        for (int idx64 = 0; idx64 < 2; idx64++) {
            lm_dtype it = idx64 ? LM_I64 : LM_I32;
            ct_pair o = ct_poisoned(it, 1, s);
            lm_tensor *want = lt_poisoned_tensor(it, 1, s);
            LT_CHECK_OK(lm_argmax_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_argmax(lm_tensor_as_view(x.d), lm_tensor_as_view(o.d), ct_stream(g_ctx)));
            char what[64];
            snprintf(what, sizeof what, "argmax %s %s", lm_dtype_name(dt), lm_dtype_name(it));
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 0.0, 0.0);
            ct_pair_free(&o);
            lm_tensor_destroy(want);
        }
        const int64_t ks[3] = {1, 7, 300};
        for (int i = 0; i < 3; i++) {
            int64_t vs[2] = {5, ks[i]};
            ct_pair vals = ct_poisoned(dt, 2, vs), idx = ct_poisoned(LM_I64, 2, vs);
            lm_tensor *wv = lt_poisoned_tensor(dt, 2, vs), *wi = lt_poisoned_tensor(LM_I64, 2, vs);
            LT_CHECK_OK(lm_topk_out(g_ref, lm_tensor_as_view(x.h), ks[i], lm_tensor_as_view(wv), lm_tensor_as_view(wi)));
            LT_CHECK_OK(lm__cuda_topk(lm_tensor_as_view(x.d), ks[i], lm_tensor_as_view(vals.d), lm_tensor_as_view(idx.d),
                                     ct_stream(g_ctx)));
            char what[64];
            snprintf(what, sizeof what, "topk %s k %lld", lm_dtype_name(dt), (long long)ks[i]);
            double *gv = ct_read(g_ctx, &vals, lm_tensor_as_view(vals.d)), *rv = lt_view_to_f64(lm_tensor_as_view(wv));
            int same = 1;
            for (int64_t j = 0; j < 5 * ks[i]; j++) same &= (gv[j] == rv[j]) || (isnan(gv[j]) && isnan(rv[j]));
            LT_CHECK_MSG(same, "%s: values differ", what);
            ct_check(g_ctx, what, &idx, lm_tensor_as_view(idx.d), lm_tensor_as_view(wi), 0.0, 0.0);
            free(gv), free(rv);
            ct_pair_free(&vals), ct_pair_free(&idx);
            lm_tensor_destroy(wv), lm_tensor_destroy(wi);
        }
        ct_pair_free(&x);
    }
}

typedef struct cand {
    float v;
    int id;
} cand;

static int cand_cmp(const void *a, const void *b) {
    const cand *x = a, *y = b;
    if (x->v != y->v) return x->v > y->v ? -1 : 1;
    return x->id - y->id;
}

/* keep[V]: 1 for the tokens lm_sampler's rules keep for this row. */
static void kept_set(const float *row, int V, const lm__cuda_sample_params *p, unsigned char *keep) {
    if (V < 1) return;
    cand *c = malloc(sizeof(cand) * (size_t)V);
    for (int i = 0; i < V; i++) c[i] = (cand){row[i] / p->temperature, i};
    qsort(c, (size_t)V, sizeof *c, cand_cmp);
    int n = p->top_k > 0 && p->top_k < V ? p->top_k : V;
    double mx = c[0].v, total = 0, cum = 0;
    for (int i = 0; i < n; i++) total += exp((double)c[i].v - mx);
    if (p->top_p < 1)
        for (int i = 0; i < n; i++) {
            cum += exp((double)c[i].v - mx) / total;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    if (p->min_p > 0) {
        int k = 1;
        while (k < n && exp((double)c[k].v - mx) >= p->min_p) k++;
        n = k;
    }
    memset(keep, 0, (size_t)V);
    for (int i = 0; i < n; i++) keep[c[i].id] = 1;
    free(c);
}

typedef struct sampler_fixture {
    ct_pair logits;            /* f32 [rows, V] */
    void *params;              /* device lm__cuda_sample_params */
    void *work;                /* device scratch of the sampler */
    ct_pair out;               /* i32 [rows] */
    int rows, V;
} sampler_fixture;

/* Draws one token per row with parameters p and draw counter `draw`. */
static void draw_rows(sampler_fixture *f, lm__cuda_sample_params p, uint64_t draw, int32_t *ids) {
    p.draw = draw;
    LT_CHECK_OK(lm_device_copy(ct_gpu, f->params, lm_device_cpu(), &p, sizeof p));
    LT_CHECK_OK(lm__cuda_sample(lm_tensor_data(f->logits.d), f->rows, f->V, f->V, f->params, 0, lm_tensor_data(f->out.d),
                                  f->work, ct_stream(g_ctx)));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_device_copy(lm_device_cpu(), ids, ct_gpu, lm_tensor_data(f->out.d), sizeof(int32_t) * (size_t)f->rows));
}

static void test_sample_rules(void) {
    lt_rng r = lt_rng_seed(151);
    sampler_fixture f = {{0}, NULL, NULL, {0}, 3, 1000};
    int64_t s[2] = {f.rows, f.V}, nr = f.rows;
    f.logits = ct_random(&r, LM_F32, 2, s, 2.0);
    f.out = ct_poisoned(LM_I32, 1, &nr);
    LT_CHECK_OK(lm_device_alloc(ct_gpu, sizeof(lm__cuda_sample_params), &f.params));
    LT_CHECK_OK(lm_device_alloc(ct_gpu, lm__cuda_sample_workspace(f.rows), &f.work));
    const float *lg = lm_tensor_data(f.logits.h);
    int32_t ids[3], want[3];
    for (int row = 0; row < f.rows; row++) {
        int best = 0;
        for (int i = 1; i < f.V; i++) best = lg[row * f.V + i] > lg[row * f.V + best] ? i : best;
        want[row] = best;
    }
    lm__cuda_sample_params greedy = {1, 1.0f, 0, 1.0f, 0.0f, 0, 7, 0}, k1 = {0, 0.7f, 1, 1.0f, 0.0f, 0, 7, 0};
    draw_rows(&f, greedy, 0, ids);
    LT_CHECK(ids[0] == want[0] && ids[1] == want[1] && ids[2] == want[2]);
    draw_rows(&f, k1, 3, ids);
    LT_CHECK(ids[0] == want[0] && ids[1] == want[1] && ids[2] == want[2]);
    const lm__cuda_sample_params rules[4] = {{0, 1.0f, 5, 1.0f, 0.0f, 0, 9, 0},
                                            {0, 0.8f, 0, 0.5f, 0.0f, 0, 9, 0},
                                            {0, 1.3f, 40, 0.9f, 0.0f, 0, 9, 0},
                                            {0, 1.0f, 0, 1.0f, 0.2f, 0, 9, 0}};
    unsigned char *keep = malloc((size_t)f.V);
    for (int k = 0; k < 4; k++) {
        int outside = 0;
        for (uint64_t d = 0; d < 200; d++) {
            draw_rows(&f, rules[k], d, ids);
            for (int row = 0; row < f.rows; row++) {
                kept_set(lg + row * f.V, f.V, &rules[k], keep);
                outside += ids[row] < 0 || ids[row] >= f.V || !keep[ids[row]];
            }
        }
        LT_CHECK_MSG(outside == 0, "sample rule set %d: %d draws outside the kept set", k, outside);
    }
    /* frequencies under top-k 3 */
    lm__cuda_sample_params k3 = {0, 1.0f, 3, 1.0f, 0.0f, 0, 11, 0};
    double counts[3][1000] = {{0}};
    const int draws = 3000;
    for (int d = 0; d < draws; d++) {
        draw_rows(&f, k3, (uint64_t)d, ids);
        for (int row = 0; row < f.rows; row++) counts[row][ids[row]] += 1.0 / draws;
    }
    for (int row = 0; row < f.rows; row++) {
        kept_set(lg + row * f.V, f.V, &k3, keep);
        double mx = -INFINITY, z = 0, worst = 0;
        for (int i = 0; i < f.V; i++)
            if (keep[i]) mx = fmax(mx, lg[row * f.V + i]);
        for (int i = 0; i < f.V; i++)
            if (keep[i]) z += exp(lg[row * f.V + i] - mx);
        for (int i = 0; i < f.V; i++) {
            double pw = keep[i] ? exp(lg[row * f.V + i] - mx) / z : 0.0;
            worst = fmax(worst, fabs(pw - counts[row][i]));
        }
        LT_CHECK_MSG(worst < 0.04, "sample row %d: frequency off by %.3f", row, worst);
    }
    free(keep);
    lm_device_free(ct_gpu, f.params);
    lm_device_free(ct_gpu, f.work);
    ct_pair_free(&f.logits), ct_pair_free(&f.out);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_argmax_topk_exact);
    LT_RUN(test_sample_rules);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
