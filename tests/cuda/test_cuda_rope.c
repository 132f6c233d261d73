/* CUDA RoPE kernels against the CPU reference: the readable rope per float dtype and
 * both pair styles, with [B, T] positions reaching 1e5 (and negative ones), a bias,
 * attn_factor, a permuted input into a strided output, and in place; token tiles of
 * many tokens and of one (more tiles than blocks), forward and gradient; the inverse
 * frequency table; and the forward pass's fused qkv_rope_store (bias, optional per-head
 * q/k RMSNorm, RoPE, q to its buffer in f32 or bf16, k and v into a NaN-poisoned bf16
 * cache at each token's slot and position) against the reference composition
 * add -> rmsnorm -> rope -> cast. Cache entries no token owns must stay NaN.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

static lm_tensor *inv_freq_host(double theta, int64_t hd) {
    int64_t half = hd / 2;
    lm_tensor *t = lt_poisoned_tensor(LM_F32, 1, &half);
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, theta, hd, lm_tensor_as_view(t)));
    return t;
}

static void check_rope(lm_dtype dt, lm_rope_style style, int in_place) {
    lt_rng r = lt_rng_seed(51 + (uint64_t)style);
    int64_t shape[4] = {2, 5, 3, 16}, bs[2] = {3, 16}, ps[2] = {2, 5};
    lm_tensor_view xh, xd, oh, od;
    ct_pair x = in_place ? ct_random(&r, dt, 4, shape, 1.0) : ct_random_reversed(&r, dt, 4, shape, 1.0, &xh, &xd);
    if (in_place) xh = *lm_tensor_as_view(x.h), xd = *lm_tensor_as_view(x.d);
    ct_pair bias = ct_random(&r, dt, 2, bs, 0.5);
    lm_tensor *posh = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I64, 2, ps, &posh));
    int64_t *pv = lm_tensor_data(posh);
    for (int i = 0; i < 10; i++) pv[i] = i < 5 ? 3 * i - 2 : 100000 + 7 * i;
    ct_pair pos = ct_pair_of(posh);
    ct_pair inv = ct_pair_of(inv_freq_host(10000.0, 16));
    lm_rope_params ph = {style, lm_tensor_as_view(inv.h), 0.9f, lm_tensor_as_view(pos.h), 0, lm_tensor_as_view(bias.h)};
    lm_rope_params pd = {style, lm_tensor_as_view(inv.d), 0.9f, lm_tensor_as_view(pos.d), 0, lm_tensor_as_view(bias.d)};
    lm_tensor *want = lt_poisoned_tensor(dt, 4, shape);
    LT_CHECK_OK(lm_rope_out(g_ref, &xh, &ph, lm_tensor_as_view(want)));
    ct_pair o = {NULL, NULL};
    if (in_place) od = xd;
    else o = ct_poisoned_strided(dt, 4, shape, &oh, &od);
    LT_CHECK_OK(lm__cuda_rope(&xd, &pd, &od, ct_stream(g_ctx)));
    char what[64];
    snprintf(what, sizeof what, "rope %s style %d%s", lm_dtype_name(dt), (int)style, in_place ? " in place" : "");
    ct_check(g_ctx, what, in_place ? &x : &o, &od, lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 4.0));
    ct_pair_free(&x), ct_pair_free(&bias), ct_pair_free(&pos), ct_pair_free(&inv);
    if (!in_place) ct_pair_free(&o);
    lm_tensor_destroy(want);
}

static void test_rope_styles_positions_bias(void) {
    for (int k = 0; k < 3; k++) {
        check_rope(ct_floats[k], LM_ROPE_SPLIT_HALF, 0);
        check_rope(ct_floats[k], LM_ROPE_INTERLEAVED, 0);
        check_rope(ct_floats[k], LM_ROPE_SPLIT_HALF, 1);
    }
}

/* Token tiles: many tokens per block (H 2, D 64, 3000 tokens, the last tile partial)
 * and one or two per block (H 32, D 128, 2200 tokens: with one, more tiles than
 * blocks, so the grid strides), forward and the input gradient, bf16 and f32; the
 * split-half style takes the 16-byte vector kernel, the interleaved one the scalar. */
static void test_rope_token_tiles(void) {
    static const struct { int64_t B, T, H, D; } cases[] = {{3, 1000, 2, 64}, {2, 1100, 32, 128}};
    for (int c = 0; c < 2; c++)
        for (int k = 0; k < 4; k++) {
            lm_dtype dt = k & 1 ? LM_F32 : LM_BF16;
            lm_rope_style style = k & 2 ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF;
            lt_rng r = lt_rng_seed(61 + (uint64_t)(4 * c + k));
            int64_t shape[4] = {cases[c].B, cases[c].T, cases[c].H, cases[c].D};
            ct_pair x = ct_random(&r, dt, 4, shape, 1.0), o = ct_poisoned(dt, 4, shape), g = ct_poisoned(dt, 4, shape);
            ct_pair inv = ct_pair_of(inv_freq_host(1000000.0, cases[c].D));
            lm_rope_params ph = {style, lm_tensor_as_view(inv.h), 1.0f, NULL, 17, NULL};
            lm_rope_params pd = {style, lm_tensor_as_view(inv.d), 1.0f, NULL, 17, NULL};
            lm_tensor *want = lt_poisoned_tensor(dt, 4, shape);
            LT_CHECK_OK(lm_rope_out(g_ref, lm_tensor_as_view(x.h), &ph, lm_tensor_as_view(want)));
            LT_CHECK_OK(lm__cuda_rope(lm_tensor_as_view(x.d), &pd, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
            char what[80];
            snprintf(what, sizeof what, "rope tiles %s style %d H %lld D %lld", lm_dtype_name(dt), (int)style,
                     (long long)shape[2], (long long)shape[3]);
            ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 4.0));
            LT_CHECK_OK(lm_rope_backward_out(g_ref, lm_tensor_as_view(x.h), &ph, lm_tensor_as_view(want), NULL));
            LT_CHECK_OK(lm_rope_backward_out(g_ctx, lm_tensor_as_view(x.d), &pd, lm_tensor_as_view(g.d), NULL));
            snprintf(what, sizeof what, "rope backward tiles %s style %d H %lld D %lld", lm_dtype_name(dt), (int)style,
                     (long long)shape[2], (long long)shape[3]);
            ct_check(g_ctx, what, &g, lm_tensor_as_view(g.d), lm_tensor_as_view(want), ct_nmse(dt), ct_abs(dt, 4.0));
            ct_pair_free(&x), ct_pair_free(&o), ct_pair_free(&g), ct_pair_free(&inv);
            lm_tensor_destroy(want);
        }
}

static void test_inv_freq(void) {
    int64_t half = 64;
    lm_tensor *want = inv_freq_host(500000.0, 128);
    ct_pair o = ct_poisoned(LM_F32, 1, &half);
    LT_CHECK_OK(lm__cuda_rope_inv_freq(500000.0, 128, lm_tensor_as_view(o.d), ct_stream(g_ctx)));
    ct_check(g_ctx, "rope_inv_freq", &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 1e-13, 1e-7);
    ct_pair_free(&o);
    lm_tensor_destroy(want);
}

/* Reference for one part (q, k or v) of the fused projection: columns
 * [c0, c0 + heads * hd) of qkv (+ bias), per-head rmsnorm (norm != NULL), rope
 * (rope != 0) at positions pos [1, ntok]; result f32 [1, ntok, heads, hd]. */
static lm_tensor *ref_part(const lm_tensor *qkv, const lm_tensor *bias, int64_t c0, int64_t heads, int64_t hd,
                           const lm_tensor *norm, int rope, const lm_tensor *inv, const lm_tensor *pos, float eps) {
    int64_t ntok = lm_tensor_dim(qkv, 0), shape2[2] = {ntok, heads * hd}, shape4[4] = {1, ntok, heads, hd};
    lm_tensor_view part, bpart, v4;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(qkv), 1, c0, c0 + heads * hd, 1, &part));
    lm_tensor *t = lt_poisoned_tensor(LM_F32, 2, shape2);
    if (bias) {
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(bias), 0, c0, c0 + heads * hd, 1, &bpart));
        LT_CHECK_OK(lm_add_out(g_ref, &part, &bpart, lm_tensor_as_view(t)));
    } else {
        LT_CHECK_OK(lm_tensor_view_copy(NULL, lm_tensor_as_view(t), &part));
    }
    LT_CHECK_OK(lm_tensor_view_reshape(lm_tensor_as_view(t), 4, shape4, &v4));
    if (norm) LT_CHECK_OK(lm_rmsnorm_out(g_ref, &v4, lm_tensor_as_view(norm), eps, &v4));
    lm_rope_params p = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 0.8f, lm_tensor_as_view(pos), 0, NULL};
    if (rope) LT_CHECK_OK(lm_rope_out(g_ref, &v4, &p, &v4));
    return t;
}

static void check_qkv_rope(int64_t hd, int qk_norm, int with_bias, int q_bf16) {
    lt_rng r = lt_rng_seed(61 + (uint64_t)hd);
    const int Hq = 4, Hkv = 2, slots = 3, ntok = 6;
    const int64_t max_t = 40, width = (Hq + 2 * Hkv) * hd;
    int32_t tpos[6] = {0, 1, 2, 37, 5, 39}, tslot[6] = {2, 2, 2, 0, 1, 1};
    int64_t qshape[2] = {ntok, width}, cshape[4] = {slots, Hkv, max_t, hd}, one = hd, nt[2] = {1, ntok};
    ct_pair qkv = ct_random(&r, LM_F32, 2, qshape, 1.5);
    ct_pair bias = ct_random(&r, LM_F32, 1, &qshape[1], 0.3);
    ct_pair qn = ct_random(&r, LM_F32, 1, &one, 1.0), kn = ct_random(&r, LM_F32, 1, &one, 1.0);
    ct_pair inv = ct_pair_of(inv_freq_host(1000000.0, hd));
    lm_tensor *posh = NULL, *sloth = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, nt, tpos, &posh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &nt[1], tslot, &sloth));
    ct_pair pos = ct_pair_of(posh), slot = ct_pair_of(sloth);
    ct_pair kc = ct_poisoned(LM_BF16, 4, cshape), vc = ct_poisoned(LM_BF16, 4, cshape);
    int64_t q4[3] = {ntok, Hq, hd};
    ct_pair q = ct_poisoned(q_bf16 ? LM_BF16 : LM_F32, 3, q4);
    float eps = 1e-6f;
    /* six rows of one token each, every row its own slot */
    lm__cuda_qkv_params p = {lm_tensor_data(qkv.d), with_bias ? lm_tensor_data(bias.d) : NULL,
                             qk_norm ? lm_tensor_data(qn.d) : NULL, qk_norm ? lm_tensor_data(kn.d) : NULL, eps,
                             lm_tensor_data(inv.d), 0.8f, lm_tensor_data(pos.d), lm_tensor_data(slot.d), ntok, 1, Hq,
                             q_bf16, lm_tensor_data(q.d), 0};
    lm__cuda_kv kv = {lm_tensor_data(kc.d), lm_tensor_data(vc.d), slots, max_t, 1, Hkv, (int)hd}; /* [B] slots: nb 1 */
    LT_CHECK_OK(lm__cuda_qkv_rope_store(&p, &kv, ct_stream(g_ctx)));
    const lm_tensor *b = with_bias ? bias.h : NULL;
    lm_tensor *rq = ref_part(qkv.h, b, 0, Hq, hd, qk_norm ? qn.h : NULL, 1, inv.h, pos.h, eps);
    lm_tensor *rk = ref_part(qkv.h, b, Hq * hd, Hkv, hd, qk_norm ? kn.h : NULL, 1, inv.h, pos.h, eps);
    lm_tensor *rv = ref_part(qkv.h, b, (Hq + Hkv) * hd, Hkv, hd, NULL, 0, inv.h, pos.h, eps);
    char what[96];
    snprintf(what, sizeof what, "qkv_rope_store q (hd %lld, norm %d, bias %d, %s)", (long long)hd, qk_norm, with_bias,
             q_bf16 ? "bf16" : "f32");
    lm_tensor *want_q = lt_poisoned_tensor(q_bf16 ? LM_BF16 : LM_F32, 3, q4);
    lm_tensor_view rq3;
    LT_CHECK_OK(lm_tensor_view_reshape(lm_tensor_as_view(rq), 3, q4, &rq3));
    LT_CHECK_OK(lm_cast_out(g_ref, &rq3, lm_tensor_as_view(want_q)));
    lm_dtype qdt = q_bf16 ? LM_BF16 : LM_F32;
    ct_check(g_ctx, what, &q, lm_tensor_as_view(q.d), lm_tensor_as_view(want_q), ct_nmse(qdt), ct_abs(qdt, 8.0));
    /* the cache: each token's k and v rows at (slot, head, pos); nothing else written */
    double *kgot = ct_read(g_ctx, &kc, lm_tensor_as_view(kc.d)), *vgot = ct_read(g_ctx, &vc, lm_tensor_as_view(vc.d));
    double *kw = lt_view_to_f64(lm_tensor_as_view(rk)), *vw = lt_view_to_f64(lm_tensor_as_view(rv));
    int64_t written = 0, nan_left = 0, total = slots * Hkv * max_t * hd;
    double kmax = 0, vmax = 0;
    for (int t = 0; t < ntok; t++)
        for (int h = 0; h < Hkv; h++)
            for (int64_t d = 0; d < hd; d++) {
                int64_t at = (((int64_t)tslot[t] * Hkv + h) * max_t + tpos[t]) * hd + d, src = ((int64_t)t * Hkv + h) * hd + d;
                kmax = fmax(kmax, fabs(kgot[at] - kw[src])) + (isnan(kgot[at]) ? INFINITY : 0);
                vmax = fmax(vmax, fabs(vgot[at] - vw[src])) + (isnan(vgot[at]) ? INFINITY : 0);
                written++;
            }
    for (int64_t i = 0; i < total; i++) nan_left += isnan(kgot[i]) && isnan(vgot[i]);
    LT_CHECK_MSG(kmax <= ct_abs(LM_BF16, 8.0) && vmax <= ct_abs(LM_BF16, 4.0), "%s: cache k max diff %g, v %g", what,
                 kmax, vmax);
    LT_CHECK_MSG(nan_left == total - written, "%s: %lld cache entries changed, %lld expected", what,
                 (long long)(total - nan_left), (long long)written);
    free(kgot), free(vgot), free(kw), free(vw);
    lm_tensor_destroy(rq), lm_tensor_destroy(rk), lm_tensor_destroy(rv), lm_tensor_destroy(want_q);
    ct_pair_free(&qkv), ct_pair_free(&bias), ct_pair_free(&qn), ct_pair_free(&kn), ct_pair_free(&inv);
    ct_pair_free(&pos), ct_pair_free(&slot), ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q);
}

static void test_qkv_rope_store_matches_reference(void) {
    check_qkv_rope(16, 0, 1, 0);
    check_qkv_rope(16, 1, 0, 1);
    check_qkv_rope(64, 0, 1, 1);
    check_qkv_rope(128, 1, 1, 0);
    check_qkv_rope(12, 0, 1, 0);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_rope_styles_positions_bias);
    LT_RUN(test_rope_token_tiles);
    LT_RUN(test_inv_freq);
    LT_RUN(test_qkv_rope_store_matches_reference);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
