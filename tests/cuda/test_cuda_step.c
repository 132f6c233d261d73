/* The model step's operators on CUDA through their public entry points (the calls the
 * executor makes), against the CPU reference on the same inputs:
 *  - lm_linear_out: every input form (plain, RMSNorm, SwiGLU) with and without the
 *    bias and the residual accumulate, 1, 3 and 8 rows of f32 over bf16 weights (the
 *    fused GEMV), 40 rows of bf16 x bf16 (cuBLASLt), row-strided x and out, and forms
 *    no fused kernel takes (f32 weights, 40 f32 rows, f16) which run the composition;
 *    every form lm_linear_supported admits also runs inside a capture (where the
 *    composition would refuse to allocate) and replays to the same result;
 *  - lm_qkv_rope_store_out with bias and q/k norms into bf16 caches, f32 and bf16 q;
 *  - lm_kv_store_out between every float dtype pair, and a row naming a slot outside
 *    the cache writes nothing;
 *  - lm_sample_out: greedy equals the CPU argmax; top_k = 1 sampling equals greedy;
 *    a missing workspace is refused by name;
 *  - the mixed forms of rmsnorm, add_rmsnorm, swiglu (f32 into bf16) and embedding
 *    (bf16 rows into f32), and a mixed form without a kernel refused by name.
 * Gates: GEMV/GEMM accumulate in f32 where the reference uses double: NMSE 1e-9 and
 * max-abs 1e-4 of the output scale for f32 outputs; bf16 outputs ct_nmse(bf16) and
 * one bf16 ulp (ct_abs).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

#define HV(p) lm_tensor_as_view((p).h)
#define DV(p) lm_tensor_as_view((p).d)

static ct_pair ints(int nd, const int64_t *shape, const int32_t *v) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, nd, shape, v, &h));
    return ct_pair_of(h);
}

/* ---- linear ---------------------------------------------------------------------------------- */
typedef struct lin_case {
    lm_linear_input in;
    int64_t M, N, K;
    lm_dtype x_dt, w_dt;
    int bias, acc, strided; /* strided: x and out are rows of wider buffers */
} lin_case;

static void check_linear(const lin_case *c) {
    lt_rng r = lt_rng_seed(11 + (uint64_t)(c->M * 7 + c->K + c->in * 3 + c->acc));
    int64_t kx = c->in == LM_LINEAR_IN_SWIGLU ? 2 * c->K : c->K, pad = c->strided ? 24 : 0;
    int64_t xs[2] = {c->M, kx + pad}, ws[2] = {c->N, c->K}, os[2] = {c->M, c->N + pad}, bs[1] = {c->N}, ns[1] = {c->K};
    ct_pair x = ct_random(&r, c->x_dt, 2, xs, 1.0), w = ct_random(&r, c->w_dt, 2, ws, 0.2);
    ct_pair b = ct_random(&r, LM_F32, 1, bs, 0.5), nw = ct_random(&r, LM_F32, 1, ns, 1.0);
    ct_pair o = ct_random(&r, LM_F32, 2, os, 1.0); /* the residual when accumulating */
    lm_tensor *want = NULL;
    LT_CHECK_OK(lm_tensor_to_device(NULL, o.h, lm_device_cpu(), &want));
    lm_tensor_view xh, oh, wh;
    LT_CHECK_OK(lm_tensor_view_slice(HV(x), 1, 0, kx, 1, &xh));
    LT_CHECK_OK(lm_tensor_view_slice(HV(o), 1, 0, c->N, 1, &oh));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(want), 1, 0, c->N, 1, &wh));
    lm_tensor_view xd = ct_mirror(x.h, &xh, x.d), od = ct_mirror(o.h, &oh, o.d);
    if (!c->acc) LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o))); /* the whole parent: NaN wherever unwritten */
    lm_linear_params ph = {c->in, c->in == LM_LINEAR_IN_RMSNORM ? HV(nw) : NULL, 1e-5f, c->acc};
    lm_linear_params pd = {c->in, c->in == LM_LINEAR_IN_RMSNORM ? DV(nw) : NULL, 1e-5f, c->acc};
    LT_CHECK_OK(lm_linear_out(g_ref, &xh, HV(w), c->bias ? HV(b) : NULL, &ph, &wh));
    int fused = lm_linear_supported(ct_gpu, c->in, c->acc, c->M, c->K, c->x_dt, c->w_dt);
    LT_CHECK_OK(lm_linear_out(g_ctx, &xd, DV(w), c->bias ? DV(b) : NULL, &pd, &od));
    char what[160];
    snprintf(what, sizeof what, "linear form %d M %lld N %lld K %lld x %s w %s bias %d acc %d strided %d (%s)",
             (int)c->in, (long long)c->M, (long long)c->N, (long long)c->K, lm_dtype_name(c->x_dt),
             lm_dtype_name(c->w_dt), c->bias, c->acc, c->strided, fused ? "fused" : "composition");
    double scale = 0;
    double *ref = lt_view_to_f64(&wh);
    for (int64_t i = 0; ref && i < c->M * c->N; i++) scale = fmax(scale, fabs(ref[i]));
    free(ref);
    ct_check(g_ctx, what, &o, &od, &wh, 1e-9, 1e-4 * scale);
    /* the columns beyond N of a strided out are untouched: still the residual's values
     * when accumulating, still NaN otherwise */
    if (c->strided) {
        lm_tensor_view rest_d, rest_h;
        LT_CHECK_OK(lm_tensor_view_slice(DV(o), 1, c->N, c->N + pad, 1, &rest_d));
        LT_CHECK_OK(lm_tensor_view_slice(HV(o), 1, c->N, c->N + pad, 1, &rest_h));
        if (c->acc) {
            ct_check(g_ctx, "linear: out's other columns", &o, &rest_d, &rest_h, 0, 0);
        } else {
            double *rest = ct_read(g_ctx, &o, &rest_d);
            int all_nan = 1;
            for (int64_t i = 0; rest && i < c->M * pad; i++) all_nan &= isnan(rest[i]) != 0;
            LT_CHECK_MSG(all_nan, "%s: wrote outside out's columns", what);
            free(rest);
        }
    }
    /* a form lm_linear_supported admits runs one fused kernel without scratch: it can
     * be captured (the composition would refuse to allocate there) and replays to the
     * same result, on a fresh copy of the residual */
    if (fused) {
        ct_pair o2 = {NULL, NULL};
        LT_CHECK_OK(lm_tensor_to_device(NULL, o.h, ct_gpu, &o2.d));
        LT_CHECK_OK(lm_tensor_to_device(NULL, o.h, lm_device_cpu(), &o2.h));
        lm_tensor_view od2 = ct_mirror(o.h, &oh, o2.d);
        if (!c->acc) LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o2)));
        lm_device_graph *graph = NULL;
        LT_CHECK_OK(lm_ctx_capture_begin(g_ctx));
        lm_status st = lm_linear_out(g_ctx, &xd, DV(w), c->bias ? DV(b) : NULL, &pd, &od2);
        LT_CHECK_OK(lm_ctx_capture_end(g_ctx, &graph));
        LT_CHECK_MSG(st == LM_OK, "%s: not capturable (%s)", what, lm_last_error());
        if (graph) LT_CHECK_OK(lm_device_graph_launch(graph, g_ctx));
        char cw[200];
        snprintf(cw, sizeof cw, "%s, captured", what);
        ct_check(g_ctx, cw, &o2, &od2, &wh, 1e-9, 1e-4 * scale);
        lm_device_graph_destroy(graph);
        ct_pair_free(&o2);
    }
    lm_tensor_destroy(want);
    ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&b), ct_pair_free(&nw), ct_pair_free(&o);
}

static void test_linear_forms(void) {
    const int64_t rows[3] = {1, 3, 8};
    for (int in = 0; in < 3; in++)
        for (int m = 0; m < 3; m++)
            for (int v = 0; v < 2; v++) {
                lin_case c = {(lm_linear_input)in, rows[m], 72, 96, LM_F32, LM_BF16, v, v ^ (m == 1), m == 2};
                LT_CHECK_MSG(lm_linear_supported(ct_gpu, c.in, c.acc, c.M, c.K, c.x_dt, c.w_dt), "GEMV form %d M %lld", in,
                             (long long)c.M);
                check_linear(&c);
            }
    lin_case gemm = {LM_LINEAR_IN, 40, 72, 96, LM_BF16, LM_BF16, 1, 0, 1};
    LT_CHECK(lm_linear_supported(ct_gpu, gemm.in, gemm.acc, gemm.M, gemm.K, gemm.x_dt, gemm.w_dt));
    check_linear(&gemm);
    gemm.bias = 0;
    check_linear(&gemm);
    /* no fused kernel: the composition (and lm_linear_supported says so) */
    lin_case other[4] = {{LM_LINEAR_IN_RMSNORM, 40, 72, 96, LM_F32, LM_BF16, 1, 1, 0},
                         {LM_LINEAR_IN_SWIGLU, 2, 40, 36, LM_F32, LM_F32, 0, 1, 1},
                         {LM_LINEAR_IN, 5, 24, 20, LM_F16, LM_F16, 1, 0, 0},
                         {LM_LINEAR_IN, 40, 72, 96, LM_F32, LM_BF16, 0, 0, 0}};
    for (int i = 0; i < 4; i++) {
        LT_CHECK_MSG(!lm_linear_supported(ct_gpu, other[i].in, other[i].acc, other[i].M, other[i].K, other[i].x_dt,
                                         other[i].w_dt),
                     "case %d claims a fused kernel", i);
        check_linear(&other[i]);
    }
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 96, LM_F32, LM_BF16));
}

/* ---- the fused QKV front and the KV store ----------------------------------------------------- */
static void check_qkv(lm_dtype q_dt, int64_t T, int norms) {
    lt_rng r = lt_rng_seed(23 + (uint64_t)T);
    const int64_t B = 2, Hq = 4, Hkv = 2, D = 16, S = 3, P = 32, nq = (Hq + 2 * Hkv) * D;
    int64_t xs[3] = {B, T, nq}, cs[4] = {S, Hkv, P, D}, qs[4] = {B, T, Hq, D}, fs[1] = {D / 2}, ds[1] = {D};
    int64_t bs[1] = {nq}, ss[1] = {B}, ps[2] = {B, T};
    ct_pair qkv = ct_random(&r, LM_F32, 3, xs, 1.0), bias = ct_random(&r, LM_F32, 1, bs, 0.5);
    ct_pair qn = ct_random(&r, LM_F32, 1, ds, 1.0), kn = ct_random(&r, LM_F32, 1, ds, 1.0);
    ct_pair kc = ct_random(&r, LM_BF16, 4, cs, 1.0), vc = ct_random(&r, LM_BF16, 4, cs, 1.0);
    ct_pair q = ct_poisoned(q_dt, 4, qs);
    lm_tensor *inv = NULL, *invd = NULL, *kw = NULL, *vw = NULL, *qw = lt_poisoned_tensor(q_dt, 4, qs);
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, fs, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, 10000.0, D, lm_tensor_as_view(inv)));
    invd = ct_upload(inv);
    LT_CHECK_OK(lm_tensor_to_device(NULL, kc.h, lm_device_cpu(), &kw));
    LT_CHECK_OK(lm_tensor_to_device(NULL, vc.h, lm_device_cpu(), &vw));
    int32_t sl[2] = {2, 0}, pos[2 * 8];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) pos[b * T + t] = (int32_t)(b * 11 + 3 + t);
    ct_pair so = ints(1, ss, sl), po = ints(2, ps, pos);
    lm_qkv_rope_params ph = {Hq, HV(bias), norms ? HV(qn) : NULL, norms ? HV(kn) : NULL, 1e-6f, NULL, 1.0f};
    ph.inv_freq = lm_tensor_as_view(inv);
    lm_qkv_rope_params pd = {Hq, DV(bias), norms ? DV(qn) : NULL, norms ? DV(kn) : NULL, 1e-6f, NULL, 1.0f};
    pd.inv_freq = lm_tensor_as_view(invd);
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ref, HV(qkv), &ph, HV(so), HV(po), lm_tensor_as_view(kw),
                                      lm_tensor_as_view(vw), lm_tensor_as_view(qw)));
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, DV(qkv), &pd, DV(so), DV(po), DV(kc), DV(vc), DV(q)));
    char what[96];
    snprintf(what, sizeof what, "qkv_rope_store q %s T %lld norms %d: q", lm_dtype_name(q_dt), (long long)T, norms);
    ct_check(g_ctx, what, &q, DV(q), lm_tensor_as_view(qw), q_dt == LM_F32 ? 1e-10 : ct_nmse(q_dt), ct_abs(q_dt, 4.0));
    ct_check(g_ctx, "qkv_rope_store: k cache", &kc, DV(kc), lm_tensor_as_view(kw), ct_nmse(LM_BF16), ct_abs(LM_BF16, 4.0));
    ct_check(g_ctx, "qkv_rope_store: v cache", &vc, DV(vc), lm_tensor_as_view(vw), ct_nmse(LM_BF16), ct_abs(LM_BF16, 4.0));
    lm_tensor_destroy(inv), lm_tensor_destroy(invd), lm_tensor_destroy(kw), lm_tensor_destroy(vw), lm_tensor_destroy(qw);
    ct_pair_free(&qkv), ct_pair_free(&bias), ct_pair_free(&qn), ct_pair_free(&kn), ct_pair_free(&kc);
    ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&so), ct_pair_free(&po);
}

static void test_qkv_rope_store(void) {
    check_qkv(LM_F32, 1, 0);
    check_qkv(LM_BF16, 1, 1);
    check_qkv(LM_F32, 7, 1);
    check_qkv(LM_BF16, 5, 0);
}

static void test_kv_store_dtypes_and_bad_row(void) {
    lt_rng r = lt_rng_seed(31);
    const int64_t B = 2, T = 3, H = 2, D = 8;
    int64_t xs[4] = {B, T, H, D}, cs[4] = {3, H, 16, D}, ss[1] = {B}, ps[2] = {B, T};
    int32_t sl[2] = {1, 2}, pos[6] = {4, 5, 6, 0, 1, 2};
    ct_pair so = ints(1, ss, sl), po = ints(2, ps, pos);
    for (int a = 0; a < 3; a++)
        for (int c = 0; c < 3; c++) {
            ct_pair x = ct_random(&r, ct_floats[a], 4, xs, 1.0), cache = ct_random(&r, ct_floats[c], 4, cs, 1.0);
            lm_tensor *want = NULL;
            LT_CHECK_OK(lm_tensor_to_device(NULL, cache.h, lm_device_cpu(), &want));
            LT_CHECK_OK(lm_kv_store_out(g_ref, lm_tensor_as_view(want), HV(x), HV(so), HV(po)));
            LT_CHECK_OK(lm_kv_store_out(g_ctx, DV(cache), DV(x), DV(so), DV(po)));
            char what[64];
            snprintf(what, sizeof what, "kv_store %s into %s", lm_dtype_name(ct_floats[a]), lm_dtype_name(ct_floats[c]));
            ct_check(g_ctx, what, &cache, DV(cache), lm_tensor_as_view(want), 0, 0); /* one rounding: exact */
            ct_pair_free(&x), ct_pair_free(&cache);
            lm_tensor_destroy(want);
        }
    /* a device row naming slot 9 of 3 is skipped; the other row is stored */
    int32_t bad[2] = {9, 0};
    ct_pair sb = ints(1, ss, bad);
    ct_pair x = ct_random(&r, LM_F32, 4, xs, 1.0), cache = ct_random(&r, LM_F32, 4, cs, 1.0);
    lm_tensor *want = NULL;
    LT_CHECK_OK(lm_tensor_to_device(NULL, cache.h, lm_device_cpu(), &want));
    lm_tensor_view x1h, x1d, s1h, p1h;
    LT_CHECK_OK(lm_tensor_view_slice(HV(x), 0, 1, 2, 1, &x1h));
    LT_CHECK_OK(lm_tensor_view_slice(HV(sb), 0, 1, 2, 1, &s1h));
    LT_CHECK_OK(lm_tensor_view_slice(HV(po), 0, 1, 2, 1, &p1h));
    LT_CHECK_OK(lm_kv_store_out(g_ref, lm_tensor_as_view(want), &x1h, &s1h, &p1h));
    x1d = *DV(x);
    LT_CHECK_OK(lm_kv_store_out(g_ctx, DV(cache), &x1d, DV(sb), DV(po)));
    ct_check(g_ctx, "kv_store: a bad slot writes nothing", &cache, DV(cache), lm_tensor_as_view(want), 0, 0);
    lm_tensor_destroy(want);
    ct_pair_free(&x), ct_pair_free(&cache), ct_pair_free(&sb), ct_pair_free(&so), ct_pair_free(&po);
}

/* ---- token selection --------------------------------------------------------------------------- */
static void test_sample_public(void) {
    lt_rng r = lt_rng_seed(47);
    const int64_t R = 5, V = 3000;
    int64_t ls[2] = {R, V}, is[1] = {R}, pb = LM_SAMPLE_PARAMS_BYTES;
    ct_pair logits = ct_random(&r, LM_F32, 2, ls, 3.0);
    int64_t wn = (int64_t)lm_sample_workspace_bytes(ct_gpu, R);
    LT_CHECK(wn > 0 && lm_sample_workspace_bytes(lm_device_cpu(), R) == 0);
    lm_tensor *work = NULL;
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_U8, 1, &wn, &work));
    lm_sample_params sp;
    memset(&sp, 0, sizeof sp);
    sp.greedy = 1, sp.temperature = 1.0f, sp.top_p = 1.0f, sp.seed = 5;
    for (int mode = 0; mode < 2; mode++) {
        if (mode == 1) sp.greedy = 0, sp.top_k = 1, sp.draw = 3; /* one survivor: the argmax */
        lm_tensor *ph = NULL;
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, &pb, &sp, &ph));
        ct_pair params = ct_pair_of(ph), ids = ct_poisoned(LM_I32, 1, is);
        lm_tensor *want = lt_poisoned_tensor(LM_I32, 1, is);
        LT_CHECK_OK(lm_argmax_out(g_ref, HV(logits), lm_tensor_as_view(want)));
        LT_CHECK_OK(lm_sample_out(g_ctx, DV(logits), DV(params), lm_tensor_as_view(work), DV(ids)));
        ct_check(g_ctx, mode ? "sample top_k 1" : "sample greedy", &ids, DV(ids), lm_tensor_as_view(want), 0, 0);
        if (mode == 0) {
            LT_CHECK_STATUS(lm_sample_out(g_ctx, DV(logits), DV(params), NULL, DV(ids)), LM_INVALID_ARGUMENT);
            LT_CHECK(strstr(lm_last_error(), "workspace"));
        }
        lm_tensor_destroy(want);
        ct_pair_free(&params), ct_pair_free(&ids);
    }
    /* one record per row, own streams, temperature draws (no top-p: no float-atomic
     * boundary): the rows reversed with their records give the ids reversed, and the
     * greedy and top_k-1 rows equal the argmax */
    lm_sample_params rec[R], rev[R];
    for (int i = 0; i < (int)R; i++)
        rec[i] = (lm_sample_params){.greedy = i == 0, .temperature = 0.6f + 0.1f * (float)i, .top_k = i == 1 ? 1 : 0,
                                    .top_p = 1.0f, .flags = LM_SAMPLE_OWN_STREAM, .seed = 9 + (uint64_t)i, .draw = 2};
    for (int i = 0; i < (int)R; i++) rev[i] = rec[R - 1 - i];
    int64_t pr = R * LM_SAMPLE_PARAMS_BYTES;
    lm_tensor *rh = NULL, *vh = NULL, *lh = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, &pr, rec, &rh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, &pr, rev, &vh));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 2, ls, &lh));
    const float *src = lm_tensor_data(logits.h);
    for (int i = 0; i < (int)R; i++) memcpy((float *)lm_tensor_data(lh) + i * V, src + (R - 1 - i) * V, sizeof(float) * V);
    ct_pair prec = ct_pair_of(rh), prev = ct_pair_of(vh), lrev = ct_pair_of(lh);
    ct_pair a = ct_poisoned(LM_I32, 1, is), b = ct_poisoned(LM_I32, 1, is);
    LT_CHECK_OK(lm_sample_out(g_ctx, DV(logits), DV(prec), lm_tensor_as_view(work), DV(a)));
    LT_CHECK_OK(lm_sample_out(g_ctx, DV(lrev), DV(prev), lm_tensor_as_view(work), DV(b)));
    int32_t ha[R], hb[R];
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, DV(a), ha));
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, DV(b), hb));
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    for (int i = 0; i < (int)R; i++) LT_CHECK_MSG(ha[i] == hb[R - 1 - i], "per-row sample: row %d %d, reversed %d", i, ha[i], hb[R - 1 - i]);
    lm_tensor *want = lt_poisoned_tensor(LM_I32, 1, is);
    LT_CHECK_OK(lm_argmax_out(g_ref, HV(logits), lm_tensor_as_view(want)));
    LT_CHECK(ha[0] == ((int32_t *)lm_tensor_data(want))[0] && ha[1] == ((int32_t *)lm_tensor_data(want))[1]);
    lm_tensor_destroy(want);
    ct_pair_free(&prec), ct_pair_free(&prev), ct_pair_free(&lrev), ct_pair_free(&a), ct_pair_free(&b);
    lm_tensor_destroy(work);
    ct_pair_free(&logits);
}

/* ---- the mixed forms of the basic operators ---------------------------------------------------- */
static void test_mixed_forms(void) {
    lt_rng r = lt_rng_seed(53);
    const int64_t M = 6, D = 136;
    int64_t xs[2] = {M, D}, ws[1] = {D}, gs[2] = {M, 2 * D};
    ct_pair x = ct_random(&r, LM_F32, 2, xs, 1.0), res = ct_random(&r, LM_F32, 2, xs, 1.0);
    ct_pair w = ct_random(&r, LM_F32, 1, ws, 1.0), gu = ct_random(&r, LM_F32, 2, gs, 1.0);
    ct_pair o = ct_poisoned(LM_BF16, 2, xs);
    lm_tensor *want = lt_poisoned_tensor(LM_BF16, 2, xs), *rw = NULL;
    LT_CHECK_OK(lm_rmsnorm_out(g_ref, HV(x), HV(w), 1e-6f, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, DV(x), DV(w), 1e-6f, DV(o)));
    ct_check(g_ctx, "rmsnorm f32 into bf16", &o, DV(o), lm_tensor_as_view(want), ct_nmse(LM_BF16), ct_abs(LM_BF16, 4.0));
    /* rows at a stride (each sequence's last position before the output projection) */
    lm_tensor_view xs_h, xs_d;
    LT_CHECK_OK(lm_tensor_view_slice(HV(gu), 1, D, 2 * D, 1, &xs_h));
    xs_d = ct_mirror(gu.h, &xs_h, gu.d);
    LT_CHECK_OK(lm_rmsnorm_out(g_ref, &xs_h, HV(w), 1e-6f, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o)));
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, &xs_d, DV(w), 1e-6f, DV(o)));
    ct_check(g_ctx, "rmsnorm strided f32 rows into bf16", &o, DV(o), lm_tensor_as_view(want), ct_nmse(LM_BF16),
             ct_abs(LM_BF16, 4.0));
    /* add_rmsnorm: the residual stream updated in place, its normalized rows into bf16 */
    LT_CHECK_OK(lm_tensor_to_device(NULL, res.h, lm_device_cpu(), &rw));
    LT_CHECK_OK(lm_add_rmsnorm_out(g_ref, HV(x), lm_tensor_as_view(rw), HV(w), 1e-6f, lm_tensor_as_view(rw),
                                   lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o)));
    LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, DV(x), DV(res), DV(w), 1e-6f, DV(res), DV(o)));
    ct_check(g_ctx, "add_rmsnorm into bf16: out", &o, DV(o), lm_tensor_as_view(want), ct_nmse(LM_BF16),
             ct_abs(LM_BF16, 4.0));
    ct_check(g_ctx, "add_rmsnorm into bf16: sum", &res, DV(res), lm_tensor_as_view(rw), 1e-14, 1e-6);
    /* swiglu over the packed halves of one gate|up block */
    lm_tensor_view gh, uh, gd, ud;
    LT_CHECK_OK(lm_tensor_view_slice(HV(gu), 1, 0, D, 1, &gh));
    LT_CHECK_OK(lm_tensor_view_slice(HV(gu), 1, D, 2 * D, 1, &uh));
    gd = ct_mirror(gu.h, &gh, gu.d), ud = ct_mirror(gu.h, &uh, gu.d);
    LT_CHECK_OK(lm_swiglu_out(g_ref, &gh, &uh, lm_tensor_as_view(want)));
    LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o)));
    LT_CHECK_OK(lm_swiglu_out(g_ctx, &gd, &ud, DV(o)));
    ct_check(g_ctx, "swiglu packed f32 into bf16", &o, DV(o), lm_tensor_as_view(want), ct_nmse(LM_BF16),
             ct_abs(LM_BF16, 4.0));
    /* a mixed form without a kernel (separate gate and up tensors) is refused by name */
    LT_CHECK_STATUS(lm_swiglu_out(g_ctx, DV(x), DV(res), DV(o)), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "swiglu"));
    /* embedding: bf16 rows widened into f32 */
    int64_t ts[2] = {50, D}, is[1] = {4}, es[2] = {4, D};
    int32_t idv[4] = {7, 0, 49, 7};
    ct_pair table = ct_random(&r, LM_BF16, 2, ts, 1.0), ids = ints(1, is, idv), e = ct_poisoned(LM_F32, 2, es);
    lm_tensor *ew = lt_poisoned_tensor(LM_F32, 2, es);
    LT_CHECK_OK(lm_embedding_out(g_ref, HV(table), HV(ids), lm_tensor_as_view(ew)));
    LT_CHECK_OK(lm_embedding_out(g_ctx, DV(table), DV(ids), DV(e)));
    ct_check(g_ctx, "embedding bf16 into f32", &e, DV(e), lm_tensor_as_view(ew), 0, 0);
    lm_tensor_destroy(want), lm_tensor_destroy(rw), lm_tensor_destroy(ew);
    ct_pair_free(&x), ct_pair_free(&res), ct_pair_free(&w), ct_pair_free(&gu), ct_pair_free(&o);
    ct_pair_free(&table), ct_pair_free(&ids), ct_pair_free(&e);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_linear_forms);
    LT_RUN(test_qkv_rope_store);
    LT_RUN(test_kv_store_dtypes_and_bad_row);
    LT_RUN(test_sample_public);
    LT_RUN(test_mixed_forms);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
