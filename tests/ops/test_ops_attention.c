/* Tests for lm_attention_out against a float64 re-derivation (which expands the kv
 * heads), PyTorch fixtures (GQA ratios 1/2/4 and MQA, causal and not, Tq < Tk), and
 * loom's own matmul + softmax + matmul composition on the same views. q/k/v are
 * contiguous [B, H, T, D] tensors, permuted views of [B, T, H, D] buffers, or slices
 * of one packed [B, T, Hq + 2 Hkv, D] qkv buffer; outputs are NaN-poisoned; every
 * error path is checked with its exact status, including workspace allocation failure.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
/* Each output is a convex combination of V rows computed in double and rounded once
 * (relative 2^-24 / 2^-9 / 2^-12); |v| < ~5 bounds the absolute error. */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.05 : 5e-3; }

typedef struct qkv {
    lm_tensor *bufs[3];           /* owned storage (unused entries NULL) */
    lm_tensor_view q, k, v;       /* [B, Hq, Tq, D], [B, Hkv, Tk, D], [B, Hkv, Tk, Dv] */
} qkv;

enum { LAYOUT_CONTIGUOUS, LAYOUT_PERMUTED, LAYOUT_PACKED };

/* [B, T, H, D] buffer viewed as [B, H, T, D]. */
static lm_tensor *permuted(lt_rng *r, lm_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D, lm_tensor_view *v) {
    int64_t s[4] = {B, T, H, D};
    static const int perm[4] = {0, 2, 1, 3};
    lm_tensor *t = lt_random_tensor(r, dt, 4, s, 1.0);
    LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(t), perm, v));
    return t;
}

static qkv make_qkv(lt_rng *r, lm_dtype dt, int layout, int64_t B, int64_t Hq, int64_t Hkv, int64_t Tq, int64_t Tk,
                    int64_t D, int64_t Dv) {
    qkv x;
    memset(&x, 0, sizeof x);
    if (layout == LAYOUT_PACKED && Tq == Tk && D == Dv) {
        /* one fused projection output [B, T, Hq + 2 Hkv, D], sliced per operand */
        lm_tensor_view all;
        x.bufs[0] = permuted(r, dt, B, Tq, Hq + 2 * Hkv, D, &all);
        LT_CHECK_OK(lm_tensor_view_slice(&all, 1, 0, Hq, 1, &x.q));
        LT_CHECK_OK(lm_tensor_view_slice(&all, 1, Hq, Hq + Hkv, 1, &x.k));
        LT_CHECK_OK(lm_tensor_view_slice(&all, 1, Hq + Hkv, Hq + 2 * Hkv, 1, &x.v));
    } else if (layout != LAYOUT_CONTIGUOUS) {
        x.bufs[0] = permuted(r, dt, B, Tq, Hq, D, &x.q);
        x.bufs[1] = permuted(r, dt, B, Tk, Hkv, D, &x.k);
        x.bufs[2] = permuted(r, dt, B, Tk, Hkv, Dv, &x.v);
    } else {
        int64_t sq[4] = {B, Hq, Tq, D}, sk[4] = {B, Hkv, Tk, D}, sv[4] = {B, Hkv, Tk, Dv};
        x.bufs[0] = lt_random_tensor(r, dt, 4, sq, 1.0);
        x.bufs[1] = lt_random_tensor(r, dt, 4, sk, 1.0);
        x.bufs[2] = lt_random_tensor(r, dt, 4, sv, 1.0);
        x.q = *lm_tensor_as_view(x.bufs[0]), x.k = *lm_tensor_as_view(x.bufs[1]), x.v = *lm_tensor_as_view(x.bufs[2]);
    }
    return x;
}

static void free_qkv(qkv *x) {
    for (int i = 0; i < 3; i++) lm_tensor_destroy(x->bufs[i]);
}

/* Row-major [B, Hq, Tq, Dv] attention in double: kv heads expanded by index
 * (h * Hkv / Hq), masked scores set to -inf, then a plain softmax and weighted sum. */
static double *attention_f64(const qkv *x, double scale, int causal) {
    int64_t B = x->q.shape[0], Hq = x->q.shape[1], Tq = x->q.shape[2], D = x->q.shape[3];
    int64_t Hkv = x->k.shape[1], Tk = x->k.shape[2], Dv = x->v.shape[3];
    double *q = lt_view_to_f64(&x->q), *k = lt_view_to_f64(&x->k), *v = lt_view_to_f64(&x->v);
    double *out = calloc((size_t)(B * Hq * Tq * Dv + 1), sizeof(double));
    double *s = malloc(sizeof(double) * (size_t)(Tk + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++) {
            int64_t g = h * Hkv / Hq;
            for (int64_t i = 0; i < Tq; i++) {
                double mx = -INFINITY, z = 0;
                for (int64_t j = 0; j < Tk; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += q[((b * Hq + h) * Tq + i) * D + d] * k[((b * Hkv + g) * Tk + j) * D + d];
                    s[j] = causal && j > i + Tk - Tq ? -INFINITY : dot * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < Tk; j++) z += s[j] = exp(s[j] - mx);
                for (int64_t e = 0; e < Dv; e++) {
                    double acc = 0;
                    for (int64_t j = 0; j < Tk; j++) acc += s[j] / z * v[((b * Hkv + g) * Tk + j) * Dv + e];
                    out[((b * Hq + h) * Tq + i) * Dv + e] = acc;
                }
            }
        }
    free(q), free(k), free(v), free(s);
    return out;
}

static lm_tensor *poisoned_out(lm_dtype dt, const qkv *x) {
    int64_t s[4] = {x->q.shape[0], x->q.shape[1], x->q.shape[2], x->v.shape[3]};
    return lt_poisoned_tensor(dt, 4, s);
}

static void test_attention_matches_f64_gqa_mqa_any_layout(void) {
    lt_rng r = lt_rng_seed(31);
    static const int64_t groups[] = {1, 2, 4};
    for (int trial = 0; trial < 90; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int causal = (int)lt_rng_int(&r, 0, 1), layout = (int)lt_rng_int(&r, 0, 2);
        int64_t B = lt_rng_int(&r, 0, 15) == 0 ? 0 : lt_rng_int(&r, 1, 2);
        int64_t Hkv = lt_rng_int(&r, 1, 3), Hq = Hkv * groups[lt_rng_int(&r, 0, 2)];
        int64_t Tq = lt_rng_int(&r, 1, 5), Tk = causal ? Tq + lt_rng_int(&r, 0, 3) : lt_rng_int(&r, 1, 6);
        if (layout == LAYOUT_PACKED) Tk = Tq;
        int64_t D = lt_rng_int(&r, 1, 8), Dv = layout == LAYOUT_PACKED ? D : lt_rng_int(&r, 1, 8);
        double scale = 1.0 / sqrt((double)D);
        qkv x = make_qkv(&r, dt, layout, B, Hq, Hkv, Tq, Tk, D, Dv);
        lm_tensor *o = poisoned_out(dt, &x);
        LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, (float)scale, causal, lm_tensor_as_view(o)));
        double *want = attention_f64(&x, (double)(float)scale, causal), *got = lt_view_to_f64(lm_tensor_as_view(o));
        char what[96];
        snprintf(what, sizeof what, "attention trial %d (%s, Hq %lld, Hkv %lld, causal %d, layout %d)", trial,
                 lm_dtype_name(dt), (long long)Hq, (long long)Hkv, causal, layout);
        lt_check_close(what, got, want, lm_tensor_numel(o), tol_nmse(dt), tol_abs(dt));
        free(want), free(got);
        lm_tensor_destroy(o);
        free_qkv(&x);
    }
}

static void test_attention_decode_row_sees_every_key_and_empty_keys_give_zeros(void) {
    lt_rng r = lt_rng_seed(32);
    qkv x = make_qkv(&r, LM_F32, LAYOUT_PERMUTED, 2, 4, 2, 1, 6, 8, 8);
    lm_tensor *oc = poisoned_out(LM_F32, &x), *on = poisoned_out(LM_F32, &x);
    LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 0.3f, 1, lm_tensor_as_view(oc)));
    LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 0.3f, 0, lm_tensor_as_view(on)));
    LT_CHECK(memcmp(lm_tensor_data(oc), lm_tensor_data(on), sizeof(float) * 64) == 0);
    lm_tensor_destroy(oc), lm_tensor_destroy(on);
    free_qkv(&x);
    /* Tk = 0 without a mask: an empty softmax, like matmul over an empty K, gives 0 */
    x = make_qkv(&r, LM_BF16, LAYOUT_CONTIGUOUS, 1, 2, 1, 3, 0, 4, 5);
    lm_tensor *o = poisoned_out(LM_BF16, &x);
    LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 0.5f, 0, lm_tensor_as_view(o)));
    const uint16_t *p = lm_tensor_data(o);
    for (int i = 0; i < 30; i++) LT_CHECK(p[i] == 0);
    lm_tensor_destroy(o);
    free_qkv(&x);
}

static void test_attention_matches_torch_fixture(void) {
    static const char *const cases[] = {"att_mha_causal", "att_gqa2_causal", "att_gqa4_plain", "att_mqa_causal",
                                        "att_mqa_plain"};
    /* f32 inputs are exact; bf16/f16 round q, k, v (relative 2^-9 / 2^-12 each). */
    static const double nmse[] = {1e-12, 1e-4, 1e-6}, abs_tol[] = {1e-5, 0.05, 5e-3};
    static const int perm[4] = {0, 2, 1, 3};
    lt_fixture fx;
    if (!lt_fixture_load("tests/data/ops/matmul_attention.lmfx", &fx)) return;
    for (int c = 0; c < 5; c++)
        for (int i = 0; i < 3; i++) {
            char name[64];
            lm_tensor *t[3];
            lm_tensor_view v[3];
            for (int j = 0; j < 3; j++) {
                snprintf(name, sizeof name, "%s_%c", cases[c], "qkv"[j]);
                t[j] = lt_fixture_tensor_to(lt_fixture_get(&fx, name), k_floats[i]);
                LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(t[j]), perm, &v[j])); /* [B, T, H, D] -> [B, H, T, D] */
            }
            snprintf(name, sizeof name, "%s_scale", cases[c]);
            double scale = lt_fixture_get(&fx, name)->f64[0];
            snprintf(name, sizeof name, "%s_causal", cases[c]);
            int causal = (int)lt_fixture_get(&fx, name)->i64[0];
            snprintf(name, sizeof name, "%s_out", cases[c]);
            const lt_fixture_tensor *want = lt_fixture_get(&fx, name);
            lm_tensor *o = lt_poisoned_tensor(k_floats[i], want->ndim, want->shape);
            LT_CHECK_OK(lm_attention_out(g_ctx, &v[0], &v[1], &v[2], (float)scale, causal, lm_tensor_as_view(o)));
            double *got = lt_view_to_f64(lm_tensor_as_view(o));
            snprintf(name, sizeof name, "torch %s %s", cases[c], lm_dtype_name(k_floats[i]));
            lt_check_close(name, got, want->f64, want->numel, nmse[i], abs_tol[i]);
            free(got);
            lm_tensor_destroy(o);
            for (int j = 0; j < 3; j++) lm_tensor_destroy(t[j]);
        }
    lt_fixture_free(&fx);
}

/* out [B, Hkv, G, Tq, Dv] = softmax(q k^T) v built from loom's matmul and softmax:
 * q is split to [B, Hkv, G, Tq, D] and k^T, v get a size-1 group axis that the batch
 * broadcast of matmul spreads over the G query heads (no K/V copies). */
static lm_tensor *composed_attention(const qkv *x, float scale, int causal) {
    int64_t Hkv = x->k.shape[1], G = x->q.shape[1] / Hkv, qf[2] = {Hkv, G}, kf[2] = {Hkv, 1};
    lm_tensor_view qg, kt, kg, vg;
    LT_CHECK_OK(lm_tensor_view_split_axis(&x->q, 1, 2, qf, &qg));
    LT_CHECK_OK(lm_tensor_view_transpose(&x->k, 2, 3, &kt));
    LT_CHECK_OK(lm_tensor_view_split_axis(&kt, 1, 2, kf, &kg));
    LT_CHECK_OK(lm_tensor_view_split_axis(&x->v, 1, 2, kf, &vg));
    lm_tensor *scores = NULL, *probs = NULL, *out = NULL;
    LT_CHECK_OK(lm_matmul(g_ctx, &qg, &kg, &scores));
    LT_CHECK_OK(lm_softmax(g_ctx, lm_tensor_as_view(scores), scale, causal, &probs));
    LT_CHECK_OK(lm_matmul(g_ctx, lm_tensor_as_view(probs), &vg, &out));
    lm_tensor_destroy(scores), lm_tensor_destroy(probs);
    return out;
}

static void test_attention_equals_matmul_softmax_matmul(void) {
    lt_rng r = lt_rng_seed(33);
    static const int64_t shapes[][7] = {
        /* B, Hq, Hkv, Tq, Tk, D, Dv */
        {2, 4, 4, 3, 3, 8, 8}, {1, 4, 2, 2, 5, 6, 4}, {2, 8, 2, 4, 4, 4, 4}, {1, 3, 1, 1, 7, 8, 8}, {2, 6, 1, 5, 6, 5, 3},
    };
    for (int c = 0; c < 5; c++)
        for (int causal = 0; causal < 2; causal++) {
            const int64_t *s = shapes[c];
            qkv x = make_qkv(&r, LM_F32, LAYOUT_PERMUTED, s[0], s[1], s[2], s[3], s[4], s[5], s[6]);
            float scale = (float)(1.0 / sqrt((double)s[5]));
            lm_tensor *o = poisoned_out(LM_F32, &x), *ref = composed_attention(&x, scale, causal);
            LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, scale, causal, lm_tensor_as_view(o)));
            LT_CHECK(ref && lm_tensor_numel(ref) == lm_tensor_numel(o));
            if (ref && lm_tensor_numel(ref) == lm_tensor_numel(o)) {
                /* [B, Hkv, G, Tq, Dv] and [B, Hq, Tq, Dv] agree in row-major order (h = kvh * G + g).
                 * The composition rounds scores and probabilities to f32: NMSE ~1e-13. */
                double *got = lt_view_to_f64(lm_tensor_as_view(o)), *want = lt_view_to_f64(lm_tensor_as_view(ref));
                lt_check_close("attention vs composed ops", got, want, lm_tensor_numel(o), 1e-10, 1e-5);
                free(got), free(want);
            }
            lm_tensor_destroy(o), lm_tensor_destroy(ref);
            free_qkv(&x);
        }
}

static void test_attention_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(34);
    qkv x = make_qkv(&r, LM_F32, LAYOUT_CONTIGUOUS, 2, 4, 2, 3, 5, 4, 6);
    lm_tensor *o = poisoned_out(LM_F32, &x);
    const lm_tensor_view *vo = lm_tensor_as_view(o);
    lm_tensor_view bad;
    /* q must be 4-d */
    LT_CHECK_OK(lm_tensor_view_select(&x.q, 0, 0, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &bad, &x.k, &x.v, 1.0f, 0, vo), LM_SHAPE_MISMATCH);
    /* batch, head dim, key count, value dim and out shape must agree */
    LT_CHECK_OK(lm_tensor_view_slice(&x.k, 0, 0, 1, 1, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &bad, &x.v, 1.0f, 0, vo), LM_SHAPE_MISMATCH);
    LT_CHECK_OK(lm_tensor_view_slice(&x.k, 3, 0, 3, 1, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &bad, &x.v, 1.0f, 0, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "k [B, Hkv, Tk, D]") != NULL);
    LT_CHECK_OK(lm_tensor_view_slice(&x.v, 2, 0, 4, 1, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, &bad, 1.0f, 0, vo), LM_SHAPE_MISMATCH);
    LT_CHECK_OK(lm_tensor_view_slice(vo, 3, 0, 5, 1, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 1.0f, 0, &bad), LM_SHAPE_MISMATCH);
    /* 3 query heads cannot share 2 kv heads */
    lm_tensor_view q3;
    LT_CHECK_OK(lm_tensor_view_slice(&x.q, 1, 0, 3, 1, &q3));
    LT_CHECK_OK(lm_tensor_view_slice(vo, 1, 0, 3, 1, &bad));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &q3, &x.k, &x.v, 1.0f, 0, &bad), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "Hq = 3") && strstr(lm_last_error(), "Hkv = 2"));
    /* causal with fewer keys than queries */
    lm_tensor_view k2, v2;
    LT_CHECK_OK(lm_tensor_view_slice(&x.k, 2, 0, 2, 1, &k2));
    LT_CHECK_OK(lm_tensor_view_slice(&x.v, 2, 0, 2, 1, &v2));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &k2, &v2, 1.0f, 1, vo), LM_SHAPE_MISMATCH);
    LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &k2, &v2, 1.0f, 0, vo));
    /* dtypes */
    int64_t sk[4] = {2, 2, 5, 4};
    lm_tensor *kh = lt_random_tensor(&r, LM_F16, 4, sk, 1), *ki = lt_random_tensor(&r, LM_I32, 4, sk, 1);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, lm_tensor_as_view(kh), &x.v, 1.0f, 0, vo), LM_DTYPE_MISMATCH);
    lm_tensor_view qi = *lm_tensor_as_view(ki);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &qi, &x.k, &x.v, 1.0f, 0, vo), LM_UNSUPPORTED);
    /* NULLs, devices, aliasing */
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, NULL, 1.0f, 0, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 1.0f, 0, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_view dev = x.k;
    dev.device = lm_device_cuda(0);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &dev, &x.v, 1.0f, 0, vo), LM_INVALID_ARGUMENT);
    lm_tensor_view qs;
    LT_CHECK_OK(lm_tensor_view_slice(&x.v, 1, 0, 2, 1, &qs)); /* a [2, 2, 5, 6] view of v */
    int64_t so[4] = {2, 2, 5, 6};
    lm_tensor *kk = lt_random_tensor(&r, LM_F32, 4, so, 1);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, lm_tensor_as_view(kk), lm_tensor_as_view(kk), &x.v, 1.0f, 0, &qs),
                    LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "out") && strstr(lm_last_error(), "v"));
    lm_tensor_view bc;
    int64_t one[4] = {2, 4, 1, 6}, full[4] = {2, 4, 3, 6};
    lm_tensor *small = lt_poisoned_tensor(LM_F32, 4, one);
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(small), 4, full, &bc));
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 1.0f, 0, &bc), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(o), lm_tensor_destroy(kh), lm_tensor_destroy(ki), lm_tensor_destroy(kk), lm_tensor_destroy(small);
    free_qkv(&x);
}

static void test_attention_workspace_allocation_failure_leaks_nothing(void) {
    lt_rng r = lt_rng_seed(35);
    qkv x = make_qkv(&r, LM_F32, LAYOUT_PERMUTED, 1, 2, 1, 2, 3, 4, 4);
    lm_tensor *o = poisoned_out(LM_F32, &x);
    lt_alloc_track(1);
    LT_CHECK_STATUS(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 0.5f, 1, lm_tensor_as_view(o)), LM_OUT_OF_MEMORY);
    LT_CHECK(strstr(lm_last_error(), "attention workspace") != NULL);
    LT_CHECK(lt_alloc_live() == 0);
    lt_alloc_untrack();
    lt_alloc_track(0);
    LT_CHECK_OK(lm_attention_out(g_ctx, &x.q, &x.k, &x.v, 0.5f, 1, lm_tensor_as_view(o)));
    LT_CHECK(lt_alloc_count() == 1 && lt_alloc_live() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(o);
    free_qkv(&x);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_attention_matches_f64_gqa_mqa_any_layout);
    LT_RUN(test_attention_decode_row_sees_every_key_and_empty_keys_give_zeros);
    LT_RUN(test_attention_matches_torch_fixture);
    LT_RUN(test_attention_equals_matmul_softmax_matmul);
    LT_RUN(test_attention_errors_name_the_problem);
    LT_RUN(test_attention_workspace_allocation_failure_leaks_nothing);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
