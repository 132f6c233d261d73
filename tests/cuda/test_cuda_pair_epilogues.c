/* The decode GEMV's pair epilogues (ops/cuda/gemv_body.cuh) on CUDA.
 * lm_linear_swiglu_out (gate row i and up row i side by side, the warp stores
 * silu(gate) * up) against the CPU's composition (lm_linear_out, lm_swiglu_out) and the
 * GPU's two kernels (the GEMV into [M, 2I], then the packed SwiGLU): bf16, int8, fp8,
 * int4 (G 32, 128) weights, M = 1, 2, 5, 8, K = 256 and 2,048 (split K), RMSNorm input
 * (and one plain call, which runs the composition), with and without a bias; gates NMSE <= 1e-8 and max-abs <= 1e-4 of the
 * largest output against the CPU, and against the two GPU kernels NMSE <= 1e-12.
 * lm_linear_qkv_rope_store_out on CUDA (the attention front's
 * epilogue) against the CPU's composition (lm_linear_out, then
 * lm_qkv_rope_store_out, LM_IMPL_REF) on the same weights, and against the GPU's own
 * two-kernel path (lm_linear_out + lm_qkv_rope_store_out on the device):
 *  - bf16, int8, fp8 and int4 (G = 32, 128) weights quantized on the host by
 *    lm_quantize_*, from fresh random floats; the RMSNorm input form (the one the
 *    epilogues are built for; a plain one runs the composition);
 *  - M = 1, 2, 5, 8 rows (B rows of one token, and one row of several tokens);
 *  - K = 256 (whole rows per warp) and K = 2,048 (a row's K split over the block's
 *    warps: the shared-memory epilogue); Hq 4 over Hkv 2 (and 1) heads of 64 and 32
 *    (int8 / fp8 at one row also 32 over 8: 3,072 rows, the GEMV's 8-row warps);
 *  - with and without the bias; q in f32 and bf16;
 *  - slot caches ([B] slots) and paged ones ([B, NB] block tables, blocks of 16) at
 *    positions up to 45, the caches NaN-poisoned: exactly the tokens' rows change.
 * Gates: q NMSE <= 1e-8 and max-abs <= 1e-4 of the largest |q| (f32; bf16 q: its own
 * rounding, ct_nmse / 2^-7 relative), k and v within bf16's rounding of the reference
 * (2^-7 of the largest value, plus f32 summation order); the fused and two-kernel GPU
 * paths within NMSE 1e-12 (the fused epilogue adds the bias in one rounding with the
 * scale, the two-kernel path in two); the fusion rule (lm_linear_qkv_rope_fused) and the
 * operator's argument errors; every split of K over the block's warps, forced
 * (LOOM_CUDA_GEMV_KSPLIT = 1, 2, 4, 8); the front's cache place read after the
 * programmatic wait (LOOM_CUDA_GEMV_FRONT_EARLY=0). Whole decode steps through the fused
 * graph are checked against the CPU by test_cuda_step and test_cuda_model.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

enum { F_BF16, F_I8, F_F8, F_I4 };
static const char *const k_fmt[] = {"bf16", "int8", "fp8", "int4"};

typedef struct fcase {
    int fmt, group;
    int B, T; /* rows B * T <= 8 */
    int64_t K;
    int Hq, Hkv, hd;
    lm_linear_input in;
    int bias, q_bf16, paged;
} fcase;


/* Weights of format c->fmt from random floats w [N, K]: *wq (and *sc) on the host. */
static void make_weights(const fcase *c, lt_rng *r, int64_t N, lm_tensor **wq, lm_tensor **sc) {
    int64_t K = c->K, ws[2] = {N, K}, qs[2] = {N, c->fmt == F_I4 ? K / 2 : K}, ss[2] = {N, c->fmt == F_I4 ? K / c->group : 1};
    lm_tensor *w = lt_random_tensor(r, LM_F32, 2, ws, 1.0 / sqrt((double)K));
    *sc = NULL;
    if (c->fmt == F_BF16) {
        LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_BF16, 2, ws, wq));
        LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(*wq)));
        lm_tensor_destroy(w);
        return;
    }
    lm_dtype qd = c->fmt == F_I4 ? LM_U8 : c->fmt == F_F8 ? LM_F8_E4M3 : LM_I8;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), qd, 2, qs, wq));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, c->fmt == F_I4 ? 2 : 1, ss, sc));
    if (c->fmt == F_I4)
        LT_CHECK_OK(lm_quantize_int4_groups(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(*wq), lm_tensor_as_view(*sc),
                                            c->group));
    else if (c->fmt == F_F8)
        LT_CHECK_OK(lm_quantize_fp8_rows(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(*wq), lm_tensor_as_view(*sc)));
    else
        LT_CHECK_OK(lm_quantize_int8_rows(g_ref, lm_tensor_as_view(w), lm_tensor_as_view(*wq), lm_tensor_as_view(*sc)));
    lm_tensor_destroy(w);
}

static lm_tensor *i32_host(int nd, const int64_t *shape, const int32_t *v) {
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, nd, shape, v, &t));
    return t;
}

static void run_case(const fcase *c, uint64_t seed) {
    lt_rng r = lt_rng_seed(seed);
    const int64_t B = c->B, T = c->T, M = B * T, K = c->K, hd = c->hd, N = (c->Hq + 2 * c->Hkv) * hd;
    const int64_t P = c->paged ? 16 : 48, NB = c->paged ? 3 : 1, S = c->paged ? B * NB + 2 : B + 1;
    int64_t xs[2] = {M, K}, ks[1] = {K}, ns[1] = {N}, half = hd / 2, cs[4] = {S, c->Hkv, P, hd};
    int64_t q4[4] = {B, T, c->Hq, hd}, pt[2] = {B, T}, tb[2] = {B, NB};
    lm_tensor *wq = NULL, *sch = NULL;
    make_weights(c, &r, N, &wq, &sch);
    ct_pair w = ct_pair_of(wq), sc = sch ? ct_pair_of(sch) : (ct_pair){NULL, NULL};
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0), bias = ct_random(&r, LM_F32, 1, ns, 0.5);
    lm_tensor *nh = lt_random_tensor(&r, LM_F32, 1, ks, 0.5);
    for (int64_t k = 0; k < K; k++) ((float *)lm_tensor_data(nh))[k] += 1.0f;
    ct_pair nw = ct_pair_of(nh);
    lm_tensor *invh = lt_poisoned_tensor(LM_F32, 1, &half);
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, 10000.0, hd, lm_tensor_as_view(invh)));
    ct_pair inv = ct_pair_of(invh);
    /* positions: row b's tokens end at 45 - 7 b (T consecutive); tables: distinct blocks, reversed */
    int32_t pos[8], table[8 * 3];
    for (int64_t b = 0; b < B; b++) /* 45, 40, ..., 10 */
        for (int64_t t = 0; t < T; t++) pos[b * T + t] = (int32_t)(45 - 5 * b - (T - 1 - t));
    for (int64_t i = 0; i < B * NB; i++) table[i] = (int32_t)(S - 1 - i);
    ct_pair ph = ct_pair_of(i32_host(2, pt, pos)), th = ct_pair_of(i32_host(c->paged ? 2 : 1, tb, table));
    lm_dtype qdt = c->q_bf16 ? LM_BF16 : LM_F32;
    ct_pair kc = ct_poisoned(LM_BF16, 4, cs), vc = ct_poisoned(LM_BF16, 4, cs), q = ct_poisoned(qdt, 4, q4);
    ct_pair kc2 = ct_poisoned(LM_BF16, 4, cs), vc2 = ct_poisoned(LM_BF16, 4, cs), q2 = ct_poisoned(qdt, 4, q4);
    lm_tensor *kw = lt_poisoned_tensor(LM_BF16, 4, cs), *vw = lt_poisoned_tensor(LM_BF16, 4, cs);
    lm_tensor *qw = lt_poisoned_tensor(qdt, 4, q4);
    lm_linear_params lh = {.input = c->in, .norm_weight = lm_tensor_as_view(nw.h), .eps = 1e-6f,
                           .w_scales = sch ? lm_tensor_as_view(sch) : NULL, .w_bits = c->fmt == F_I4 ? 4 : 0,
                           .w_group = c->fmt == F_I4 ? c->group : 0};
    lm_linear_params ld = lh;
    ld.norm_weight = lm_tensor_as_view(nw.d), ld.w_scales = sch ? lm_tensor_as_view(sc.d) : NULL;
    lm_qkv_rope_params rh = {c->Hq, c->bias ? lm_tensor_as_view(bias.h) : NULL, NULL, NULL, 0.f,
                             lm_tensor_as_view(inv.h), 0.9f};
    lm_qkv_rope_params rd = rh;
    rd.bias = c->bias ? lm_tensor_as_view(bias.d) : NULL, rd.inv_freq = lm_tensor_as_view(inv.d);
    LT_CHECK_OK(lm_linear_qkv_rope_store_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(wq), &lh, &rh,
                                             lm_tensor_as_view(th.h), lm_tensor_as_view(ph.h), lm_tensor_as_view(kw),
                                             lm_tensor_as_view(vw), lm_tensor_as_view(qw)));
    LT_CHECK_OK(lm_linear_qkv_rope_store_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), &ld, &rd,
                                             lm_tensor_as_view(th.d), lm_tensor_as_view(ph.d), lm_tensor_as_view(kc.d),
                                             lm_tensor_as_view(vc.d), lm_tensor_as_view(q.d)));
    /* the GPU's two kernels: the projection into qkv, then the front */
    int64_t qkv2[2] = {M, N}, qkv3[3] = {B, T, N};
    lm_tensor *qkv = NULL;
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_F32, 2, qkv2, &qkv));
    lm_tensor_view qkv_v3;
    LT_CHECK_OK(lm_linear_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), NULL, &ld, lm_tensor_as_view(qkv)));
    LT_CHECK_OK(lm_tensor_view_reshape(lm_tensor_as_view(qkv), 3, qkv3, &qkv_v3));
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, &qkv_v3, &rd, lm_tensor_as_view(th.d), lm_tensor_as_view(ph.d),
                                      lm_tensor_as_view(kc2.d), lm_tensor_as_view(vc2.d), lm_tensor_as_view(q2.d)));
    char what[200];
    snprintf(what, sizeof what, "front %s%s M %lld (B %d T %d) K %lld Hq %d Hkv %d hd %d %s bias %d q %s %s",
             k_fmt[c->fmt], c->fmt == F_I4 ? (c->group == 32 ? " G32" : " G128") : "", (long long)M, c->B, c->T,
             (long long)K, c->Hq, c->Hkv, c->hd, c->in == LM_LINEAR_IN_RMSNORM ? "rmsnorm" : "plain", c->bias,
             lm_dtype_name(qdt), c->paged ? "paged" : "slots");
    double *wqv = lt_view_to_f64(lm_tensor_as_view(qw));
    double big = ct_max_abs(wqv, lm_tensor_numel(qw));
    free(wqv);
    ct_check(g_ctx, what, &q, lm_tensor_as_view(q.d), lm_tensor_as_view(qw), c->q_bf16 ? ct_nmse(LM_BF16) : 1e-8,
             (c->q_bf16 ? 1.0 / 128 : 1e-4) * big);
    /* caches: within bf16 rounding of the reference, NaN exactly where it is NaN */
    const ct_pair *got[2] = {&kc, &vc};
    lm_tensor *want[2] = {kw, vw};
    for (int k = 0; k < 2; k++) {
        double *g = ct_read(g_ctx, got[k], lm_tensor_as_view(got[k]->d)), *h = lt_view_to_f64(lm_tensor_as_view(want[k]));
        int64_t n = lm_tensor_numel(want[k]), nan_mismatch = 0, written = 0;
        double md = 0, top = ct_max_abs(h, n) /* NaN compares false */;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(g[i]) != isnan(h[i])) nan_mismatch++;
            else if (!isnan(h[i])) md = fmax(md, fabs(g[i] - h[i])), written++;
        }
        LT_CHECK_MSG(nan_mismatch == 0 && written == M * c->Hkv * hd && md <= top / 128,
                     "%s: %s cache: %lld entries differ in NaN-ness, %lld written (%lld expected), max diff %g of %g",
                     what, k ? "v" : "k", (long long)nan_mismatch, (long long)written, (long long)(M * c->Hkv * hd), md,
                     top);
        free(g), free(h);
    }
    /* fused against the two GPU kernels */
    const ct_pair *f[3] = {&q, &kc, &vc}, *u[3] = {&q2, &kc2, &vc2};
    for (int k = 0; k < 3; k++) {
        double *a = ct_read(g_ctx, f[k], lm_tensor_as_view(f[k]->d)), *b = ct_read(g_ctx, u[k], lm_tensor_as_view(u[k]->d));
        int64_t n = lm_tensor_numel(f[k]->h), bad = 0;
        double num = 0, den = 0;
        for (int64_t i = 0; i < n; i++) {
            if (isnan(a[i]) || isnan(b[i])) {
                bad += isnan(a[i]) != isnan(b[i]);
                continue;
            }
            num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
        }
        double nmse = den > 0 ? num / den : num;
        double gate = k == 0 && !c->q_bf16 ? 1e-12 : 1e-5; /* bf16 stores may round a last-bit tie apart */
        LT_CHECK_MSG(bad == 0 && nmse <= gate, "%s: fused vs two kernels, %s: NMSE %.2e, %lld NaN mismatches", what,
                     k == 0 ? "q" : k == 1 ? "k" : "v", nmse, (long long)bad);
        free(a), free(b);
    }
    lm_tensor_destroy(qkv), lm_tensor_destroy(kw), lm_tensor_destroy(vw), lm_tensor_destroy(qw);
    ct_pair_free(&w), ct_pair_free(&x), ct_pair_free(&bias), ct_pair_free(&nw), ct_pair_free(&inv);
    if (sch) ct_pair_free(&sc);
    ct_pair_free(&ph), ct_pair_free(&th), ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q);
    ct_pair_free(&kc2), ct_pair_free(&vc2), ct_pair_free(&q2);
}

static void test_formats_rows_and_caches(void) {
    static const int rows[4][2] = {{1, 1}, {2, 1}, {5, 1}, {1, 8}};
    uint64_t seed = 900;
    for (int f = F_BF16; f <= F_I4; f++)
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < 4; m++) {
                fcase c = {f, m % 2 ? 128 : 32, rows[m][0], rows[m][1], k ? 2048 : 256, 4, 2, 64,
                           LM_LINEAR_IN_RMSNORM, m != 1, m == 3, m % 2};
                run_case(&c, seed++);
            }
    /* eight rows, MQA with head dim 32, and a paged bf16 q over split K */
    fcase a = {F_BF16, 0, 8, 1, 256, 6, 1, 32, LM_LINEAR_IN_RMSNORM, 1, 0, 1};
    run_case(&a, seed++);
    fcase b = {F_I8, 0, 8, 1, 2048, 4, 2, 64, LM_LINEAR_IN_RMSNORM, 1, 1, 1};
    run_case(&b, seed++);
    /* int8 / fp8 at one row over 3,072 rows: the GEMV's 8-row warps (at least 16 rows an SM on
     * GPUs of up to 192 SMs; fewer rows run its 2-row warps, the cases above) */
    for (int f = F_I8; f <= F_F8; f++) {
        fcase w = {f, 0, 1, 1, 2048, 32, 8, 64, LM_LINEAR_IN_RMSNORM, 1, 0, 0};
        run_case(&w, seed++);
    }
}

static void run_swiglu(int fmt, int group, int M, int64_t K, int64_t I, lm_linear_input in, int with_bias,
                       uint64_t seed) {
    lt_rng r = lt_rng_seed(seed);
    fcase c = {fmt, group, M, 1, K, 0, 0, 0, in, with_bias, 0, 0};
    int64_t xs[2] = {M, K}, ks[1] = {K}, ns[1] = {2 * I}, os[2] = {M, I}, ys[2] = {M, 2 * I};
    lm_tensor *wq = NULL, *sch = NULL;
    make_weights(&c, &r, 2 * I, &wq, &sch);
    ct_pair w = ct_pair_of(wq), sc = sch ? ct_pair_of(sch) : (ct_pair){NULL, NULL};
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0), bias = ct_random(&r, LM_F32, 1, ns, 0.5);
    lm_tensor *nh = lt_random_tensor(&r, LM_F32, 1, ks, 0.5);
    for (int64_t k = 0; k < K; k++) ((float *)lm_tensor_data(nh))[k] += 1.0f;
    ct_pair nw = ct_pair_of(nh), o = ct_poisoned(LM_F32, 2, os), o2 = ct_poisoned(LM_F32, 2, os);
    lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, os), *y = NULL;
    lm_linear_params lh = {.input = in, .norm_weight = lm_tensor_as_view(nw.h), .eps = 1e-6f,
                           .w_scales = sch ? lm_tensor_as_view(sch) : NULL, .w_bits = fmt == F_I4 ? 4 : 0,
                           .w_group = fmt == F_I4 ? group : 0};
    lm_linear_params ld = lh;
    ld.norm_weight = lm_tensor_as_view(nw.d), ld.w_scales = sch ? lm_tensor_as_view(sc.d) : NULL;
    LT_CHECK_OK(lm_linear_swiglu_out(g_ref, lm_tensor_as_view(x.h), lm_tensor_as_view(wq),
                                     with_bias ? lm_tensor_as_view(bias.h) : NULL, &lh, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_linear_swiglu_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d),
                                     with_bias ? lm_tensor_as_view(bias.d) : NULL, &ld, lm_tensor_as_view(o.d)));
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_F32, 2, ys, &y));
    lm_tensor_view gate, up;
    LT_CHECK_OK(lm_linear_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d),
                              with_bias ? lm_tensor_as_view(bias.d) : NULL, &ld, lm_tensor_as_view(y)));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(y), 1, 0, I, 1, &gate));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(y), 1, I, 2 * I, 1, &up));
    LT_CHECK_OK(lm_swiglu_out(g_ctx, &gate, &up, lm_tensor_as_view(o2.d)));
    char what[160];
    snprintf(what, sizeof what, "linear_swiglu %s%s M %d K %lld I %lld %s bias %d", k_fmt[fmt],
             fmt == F_I4 ? (group == 32 ? " G32" : " G128") : "", M, (long long)K, (long long)I,
             in == LM_LINEAR_IN_RMSNORM ? "rmsnorm" : "plain", with_bias);
    double *wv = lt_view_to_f64(lm_tensor_as_view(want));
    double big = ct_max_abs(wv, M * I);
    free(wv);
    ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), 1e-8, 1e-4 * big);
    double *a = ct_read(g_ctx, &o, lm_tensor_as_view(o.d)), *b = ct_read(g_ctx, &o2, lm_tensor_as_view(o2.d));
    double num = 0, den = 0;
    for (int64_t i = 0; i < M * I; i++) num += (a[i] - b[i]) * (a[i] - b[i]), den += b[i] * b[i];
    LT_CHECK_MSG(den > 0 && num / den <= 1e-12, "%s: fused vs two kernels NMSE %.2e", what, num / den);
    free(a), free(b);
    lm_tensor_destroy(want), lm_tensor_destroy(y);
    ct_pair_free(&w), ct_pair_free(&x), ct_pair_free(&bias), ct_pair_free(&nw), ct_pair_free(&o), ct_pair_free(&o2);
    if (sch) ct_pair_free(&sc);
}

static void test_swiglu_epilogue(void) {
    static const int rows[4] = {1, 2, 5, 8};
    uint64_t seed = 700;
    for (int f = F_BF16; f <= F_I4; f++)
        for (int k = 0; k < 2; k++)
            for (int m = 0; m < 4; m++)
                run_swiglu(f, m % 2 ? 128 : 32, rows[m], k ? 2048 : 256, k ? 96 : 608, LM_LINEAR_IN_RMSNORM, m != 1,
                           seed++);
    /* int8 / fp8 at one row over 2 x 1,536 rows: the GEMV's 8-row warps (as in the front's test) */
    for (int f = F_I8; f <= F_F8; f++) run_swiglu(f, 0, 1, 2048, 1536, LM_LINEAR_IN_RMSNORM, 1, seed++);
    /* the plain input form is not fused: the composition runs it, same results */
    run_swiglu(F_BF16, 0, 2, 256, 608, LM_LINEAR_IN, 1, seed++);
}

/* Every split of a row's K over 1, 2, 4 or 8 warps (LOOM_CUDA_GEMV_KSPLIT; 2 and 4
 * put several row groups in a block, whose finished pairs the epilogue stores from
 * shared memory), one and two rows, both epilogues, each weight format. */
static void test_forced_splits(void) {
    static const char *const splits[4] = {"1", "2", "4", "8"};
    uint64_t seed = 1500;
    for (int v = 0; v < 4; v++) {
        setenv("LOOM_CUDA_GEMV_KSPLIT", splits[v], 1);
        for (int f = F_BF16; f <= F_I4; f++)
            for (int m = 1; m <= 2; m++) {
                fcase c = {f, 32, m, 1, 2048, 4, 2, 64, LM_LINEAR_IN_RMSNORM, m == 1, m == 2, 0};
                run_case(&c, seed++);
                run_swiglu(f, 128, m, 2048, 608, LM_LINEAR_IN_RMSNORM, m == 2, seed++);
            }
    }
    unsetenv("LOOM_CUDA_GEMV_KSPLIT");
}

/* The front epilogue with each storing lane's cache place (position, block, offset) read
 * after the programmatic wait (LOOM_CUDA_GEMV_FRONT_EARLY=0, the measurement form; the
 * cases above read it before): the same checks, one and two rows, slot and paged caches,
 * each weight format. */
static void test_front_place_late(void) {
    setenv("LOOM_CUDA_GEMV_FRONT_EARLY", "0", 1);
    uint64_t seed = 1700;
    for (int f = F_BF16; f <= F_I4; f++)
        for (int m = 1; m <= 2; m++) {
            fcase c = {f, 32, m, 1, 256, 4, 2, 64, LM_LINEAR_IN_RMSNORM, 1, m == 2, m == 1};
            run_case(&c, seed++);
        }
    unsetenv("LOOM_CUDA_GEMV_FRONT_EARLY");
}

static void test_errors(void) {
    lt_rng r = lt_rng_seed(5);
    int64_t xs[2] = {1, 64}, ws[2] = {256, 64}, cs[4] = {2, 1, 8, 32}, q4[4] = {1, 1, 6, 32}, one[2] = {1, 1}, h = 16;
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0), w = ct_random(&r, LM_BF16, 2, ws, 0.1);
    ct_pair kc = ct_poisoned(LM_BF16, 4, cs), vc = ct_poisoned(LM_BF16, 4, cs), q = ct_poisoned(LM_F32, 4, q4);
    ct_pair inv = ct_random(&r, LM_F32, 1, &h, 0.1);
    int32_t zero = 0;
    ct_pair pos = ct_pair_of(i32_host(2, one, &zero)), slot = ct_pair_of(i32_host(1, one, &zero));
    lm_linear_params lp = {.input = LM_LINEAR_IN};
    lm_qkv_rope_params rp = {6, NULL, NULL, NULL, 0.f, lm_tensor_as_view(inv.d), 1.f};
#define CALL(LP, RP)                                                                                                   \
    lm_linear_qkv_rope_store_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(w.d), LP, RP,                        \
                                 lm_tensor_as_view(slot.d), lm_tensor_as_view(pos.d), lm_tensor_as_view(kc.d),           \
                                 lm_tensor_as_view(vc.d), lm_tensor_as_view(q.d))
    LT_CHECK_OK(CALL(&lp, &rp)); /* (6 + 2) * 32 = 256 outputs */
    lm_linear_params acc = lp;
    acc.accumulate = 1;
    LT_CHECK_STATUS(CALL(&acc, &rp), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "accumulate") != NULL);
    int64_t w2[2] = {288, 64}; /* (7 + 2) * 32 outputs: q [1, 1, 6, 32] needs 256 */
    ct_pair wide = ct_random(&r, LM_BF16, 2, w2, 0.1);
    LT_CHECK_STATUS(lm_linear_qkv_rope_store_out(g_ctx, lm_tensor_as_view(x.d), lm_tensor_as_view(wide.d), &lp, &rp,
                                                 lm_tensor_as_view(slot.d), lm_tensor_as_view(pos.d),
                                                 lm_tensor_as_view(kc.d), lm_tensor_as_view(vc.d), lm_tensor_as_view(q.d)),
                    LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "outputs") != NULL);
    ct_pair_free(&wide);
    LT_CHECK_STATUS(CALL(NULL, &rp), LM_INVALID_ARGUMENT);
#undef CALL
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&inv);
    ct_pair_free(&pos), ct_pair_free(&slot);
}

static void test_fusion_rule(void) {
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16, 0) == 1);
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 8, 896, LM_F32, LM_U8, 0) == 1);
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 9, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16, 1) == 0);
    LT_CHECK(lm_linear_qkv_rope_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 1, 904, LM_F32, LM_U8, 0) == 0); /* K % 32 */
    LT_CHECK(lm_linear_qkv_rope_fused(lm_device_cpu(), LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16) == 1);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN_RMSNORM, 9, 896, LM_F32, LM_BF16) == 0);
    LT_CHECK(lm_linear_swiglu_fused(ct_gpu, LM_LINEAR_IN, 1, 896, LM_F32, LM_BF16) == 0);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_fusion_rule);
    LT_RUN(test_formats_rows_and_caches);
    LT_RUN(test_swiglu_epilogue);
    LT_RUN(test_forced_splits);
    LT_RUN(test_front_place_late);
    LT_RUN(test_errors);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
