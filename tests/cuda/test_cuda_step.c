/* The model step's operators on CUDA through their public entry points (the calls the
 * executor makes), against the CPU reference on the same inputs:
 *  - lm_linear_out: every input form (plain, RMSNorm, SwiGLU) with and without the
 *    bias and the residual accumulate, 1, 3 and 8 rows of f32 over bf16 weights (the
 *    fused GEMV), 40 rows of bf16 x bf16 (cuBLASLt) into f32 or bf16 (and 333 rows into
 *    bf16, with a bias: the composition), row-strided x and out, and forms
 *    no fused kernel takes (f32 weights, 40 f32 rows, f16) which run the composition;
 *    lm_linear_supported admits the GEMV's forms for 1 row only among these (graphs
 *    take the GEMM from 3 rows); every form that runs one kernel (those it admits, and
 *    the GEMV up to 8 rows) also runs inside a capture (where the composition would
 *    refuse to allocate) and replays to the same result;
 *  - lm_qkv_rope_store_out with bias and q/k norms into bf16 caches, f32 and bf16 q,
 *    head dims 16-512, both of its kernels and the token-major one's head groupings;
 *  - lm_kv_store_out between every float dtype pair, and a row naming a slot outside
 *    the cache writes nothing;
 *  - paged caches (slots [B, NB] block tables over a pool of S blocks of P positions):
 *    kv_store, qkv_rope_store and attention_cache (split-K decode with and without the
 *    workspace, a bad split combined with a good one; flash prefill with blocks of 16
 *    and 32 positions, several per 64-key tile, and of 80, tiles straddling blocks)
 *    equal the same calls on the contiguous form (slots [B], P' = NB * P)
 *    gathered from / scattered back to the pool on the host; tables are random
 *    permutations of the pool, two rows share a first block they only read, entries
 *    past a row's last position hold values outside the pool (never read), and a row
 *    with an out-of-range block stores nothing, gets a NaN q and NaN attention while
 *    the other rows are unchanged. The contiguous attention is also checked against
 *    the CPU reference, and the [B, 1] form of kv_store equals the [B] form;
 *  - the decode front and attention queued back to back for 12 steps, with and without
 *    the attention's early keys (older keys read before its programmatic wait): the
 *    same bits, NaN-free over caches that are NaN from each row's start on, the last
 *    step against the CPU reference;
 *  - lm_sample_out: greedy equals the CPU argmax; top_k = 1 sampling equals greedy;
 *    a missing workspace is refused by name;
 *  - the mixed forms of rmsnorm, add_rmsnorm, swiglu (f32 into bf16) and embedding
 *    (bf16 rows into f32), and a mixed form without a kernel refused by name.
 * Gates: GEMV/GEMM accumulate in f32 where the reference uses double: NMSE 1e-9 and
 * max-abs 1e-4 of the output scale for f32 outputs; bf16 outputs ct_nmse(bf16) and
 * one bf16 ulp (ct_abs). Paged against contiguous: stores and q exact (one kernel,
 * the same arithmetic); attention within test_cuda_attention's gates (split-K: f32
 * out NMSE 1e-9, bf16 out ct_nmse; flash: NMSE 2e-5 / 5e-5, max-abs 0.03).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"
#include "ops/internal.h"

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
    lm_dtype o_dt;          /* out's dtype (LM_F32 = 0 unless set) */
} lin_case;

static void check_linear(const lin_case *c) {
    lt_rng r = lt_rng_seed(11 + (uint64_t)(c->M * 7 + c->K + c->in * 3 + c->acc));
    int64_t kx = c->in == LM_LINEAR_IN_SWIGLU ? 2 * c->K : c->K, pad = c->strided ? 24 : 0;
    int64_t xs[2] = {c->M, kx + pad}, ws[2] = {c->N, c->K}, os[2] = {c->M, c->N + pad}, bs[1] = {c->N}, ns[1] = {c->K};
    ct_pair x = ct_random(&r, c->x_dt, 2, xs, 1.0), w = ct_random(&r, c->w_dt, 2, ws, 0.2);
    ct_pair b = ct_random(&r, LM_F32, 1, bs, 0.5), nw = ct_random(&r, LM_F32, 1, ns, 1.0);
    ct_pair o = ct_random(&r, c->o_dt, 2, os, 1.0); /* the residual when accumulating */
    lm_tensor *want = NULL;
    LT_CHECK_OK(lm_tensor_to_device(NULL, o.h, lm_device_cpu(), &want));
    lm_tensor_view xh, oh, wh;
    LT_CHECK_OK(lm_tensor_view_slice(HV(x), 1, 0, kx, 1, &xh));
    LT_CHECK_OK(lm_tensor_view_slice(HV(o), 1, 0, c->N, 1, &oh));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(want), 1, 0, c->N, 1, &wh));
    lm_tensor_view xd = ct_mirror(x.h, &xh, x.d), od = ct_mirror(o.h, &oh, o.d);
    if (!c->acc) LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o))); /* the whole parent: NaN wherever unwritten */
    lm_linear_params ph = {.input = c->in, .norm_weight = c->in == LM_LINEAR_IN_RMSNORM ? HV(nw) : NULL, .eps = 1e-5f,
                           .accumulate = c->acc};
    lm_linear_params pd = {.input = c->in, .norm_weight = c->in == LM_LINEAR_IN_RMSNORM ? DV(nw) : NULL, .eps = 1e-5f,
                           .accumulate = c->acc};
    LT_CHECK_OK(lm_linear_out(g_ref, &xh, HV(w), c->bias ? HV(b) : NULL, &ph, &wh));
    /* one kernel: the kernels' rule (which lm_linear_out follows: the GEMV's f32 x over
     * bf16 up to 8 rows, although graphs take the GEMM from 3 rows), of which what
     * lm_linear_supported admits for graphs is a part */
    int fused = lm__linear_fused_rule(c->in, c->acc, c->M, c->K, c->x_dt, c->w_dt);
    LT_CHECK_MSG(fused || !lm_linear_supported(ct_gpu, c->in, c->acc, c->M, c->K, c->x_dt, c->w_dt),
                 "lm_linear_supported admits a form the kernels' rule does not");
    if (c->o_dt == LM_BF16 && (c->bias || c->acc)) fused = 0; /* a bf16 product takes neither in its kernel */
    LT_CHECK_OK(lm_linear_out(g_ctx, &xd, DV(w), c->bias ? DV(b) : NULL, &pd, &od));
    char what[160];
    snprintf(what, sizeof what, "linear form %d M %lld N %lld K %lld x %s w %s out %s bias %d acc %d strided %d (%s)",
             (int)c->in, (long long)c->M, (long long)c->N, (long long)c->K, lm_dtype_name(c->x_dt),
             lm_dtype_name(c->w_dt), lm_dtype_name(c->o_dt), c->bias, c->acc, c->strided,
             fused ? "fused" : "composition");
    double scale = 0;
    double *ref = lt_view_to_f64(&wh);
    for (int64_t i = 0; ref && i < c->M * c->N; i++) scale = fmax(scale, fabs(ref[i]));
    free(ref);
    /* a bf16 out: both sides round their f32 sum once, so at most one ulp apart */
    double tol_n = c->o_dt == LM_F32 ? 1e-9 : ct_nmse(c->o_dt);
    double tol_a = c->o_dt == LM_F32 ? 1e-4 * scale : ct_abs(c->o_dt, scale);
    ct_check(g_ctx, what, &o, &od, &wh, tol_n, tol_a);
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
        ct_check(g_ctx, cw, &o2, &od2, &wh, tol_n, tol_a);
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
                lin_case c = {(lm_linear_input)in, rows[m], 72, 96, LM_F32, LM_BF16, v, v ^ (m == 1), m == 2, LM_F32};
                /* graphs give the GEMV up to 2 rows of f32 x over bf16 (the GEMM from 3) */
                LT_CHECK_MSG(lm_linear_supported(ct_gpu, c.in, c.acc, c.M, c.K, c.x_dt, c.w_dt) == (c.M <= 2),
                             "GEMV form %d M %lld", in, (long long)c.M);
                check_linear(&c);
            }
    lin_case gemm = {LM_LINEAR_IN, 40, 72, 96, LM_BF16, LM_BF16, 1, 0, 1, LM_F32};
    LT_CHECK(lm_linear_supported(ct_gpu, gemm.in, gemm.acc, gemm.M, gemm.K, gemm.x_dt, gemm.w_dt));
    check_linear(&gemm);
    gemm.bias = 0;
    check_linear(&gemm);
    /* bf16 out (graphs store a prefill's gate|up product so): cuBLASLt rounds once; with
     * a bias or accumulate no kernel takes it, and the composition runs it */
    gemm.o_dt = LM_BF16;
    LT_CHECK(lm__linear_low_out(ct_gpu, gemm.M, gemm.K, gemm.x_dt, gemm.w_dt) == 1);
    LT_CHECK(lm__linear_low_out(ct_gpu, 2, gemm.K, gemm.x_dt, gemm.w_dt) == 0); /* the GEMV's rows */
    LT_CHECK(lm__linear_low_out(lm_device_cpu(), gemm.M, gemm.K, gemm.x_dt, gemm.w_dt) == 0);
    check_linear(&gemm);
    gemm.strided = 0, gemm.M = 333, gemm.N = 200, gemm.K = 264;
    check_linear(&gemm);
    gemm.bias = 1;
    check_linear(&gemm);
    /* no fused kernel: the composition (and lm_linear_supported says so) */
    lin_case other[4] = {{LM_LINEAR_IN_RMSNORM, 40, 72, 96, LM_F32, LM_BF16, 1, 1, 0, LM_F32},
                         {LM_LINEAR_IN_SWIGLU, 2, 40, 36, LM_F32, LM_F32, 0, 1, 1, LM_F32},
                         {LM_LINEAR_IN, 5, 24, 20, LM_F16, LM_F16, 1, 0, 0, LM_F32},
                         {LM_LINEAR_IN, 40, 72, 96, LM_F32, LM_BF16, 0, 0, 0, LM_F32}};
    for (int i = 0; i < 4; i++) {
        LT_CHECK_MSG(!lm_linear_supported(ct_gpu, other[i].in, other[i].acc, other[i].M, other[i].K, other[i].x_dt,
                                         other[i].w_dt),
                     "case %d claims a fused kernel", i);
        check_linear(&other[i]);
    }
    LT_CHECK(!lm_linear_supported(lm_device_cpu(), LM_LINEAR_IN, 0, 1, 96, LM_F32, LM_BF16));
}

/* ---- the fused QKV front and the KV store ----------------------------------------------------- */
/* One front call: B = 2 rows of T tokens (positions 3.. and 14..), Hq / Hkv heads of
 * head dim D, q of q_dt, with or without the q/k norms; group: LOOM_CUDA_FRONT_GROUP
 * (heads a warp of the token-major kernel takes; NULL: chosen by the launcher);
 * tokens: LOOM_CUDA_FRONT_TOKENS ("0": the per-(token, head) kernel). */
typedef struct qkv_case {
    lm_dtype q_dt;
    int64_t T, Hq, Hkv, D;
    int norms;
    const char *group, *tokens;
} qkv_case;

static void check_qkv(const qkv_case *c) {
    lt_rng r = lt_rng_seed(23 + (uint64_t)(c->T + c->D + c->Hq));
    const int64_t B = 2, T = c->T, Hq = c->Hq, Hkv = c->Hkv, D = c->D, S = 3, P = 32, nq = (Hq + 2 * Hkv) * D;
    int64_t xs[3] = {B, T, nq}, cs[4] = {S, Hkv, P, D}, qs[4] = {B, T, Hq, D}, fs[1] = {D / 2}, ds[1] = {D};
    int64_t bs[1] = {nq}, ss[1] = {B}, ps[2] = {B, T};
    LT_CHECK(T <= 16); /* positions up to 14 + 15 < P */
    ct_pair qkv = ct_random(&r, LM_F32, 3, xs, 1.0), bias = ct_random(&r, LM_F32, 1, bs, 0.5);
    ct_pair qn = ct_random(&r, LM_F32, 1, ds, 1.0), kn = ct_random(&r, LM_F32, 1, ds, 1.0);
    ct_pair kc = ct_random(&r, LM_BF16, 4, cs, 1.0), vc = ct_random(&r, LM_BF16, 4, cs, 1.0);
    ct_pair q = ct_poisoned(c->q_dt, 4, qs);
    lm_tensor *inv = NULL, *invd = NULL, *kw = NULL, *vw = NULL, *qw = lt_poisoned_tensor(c->q_dt, 4, qs);
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, fs, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, 10000.0, D, lm_tensor_as_view(inv)));
    invd = ct_upload(inv);
    LT_CHECK_OK(lm_tensor_to_device(NULL, kc.h, lm_device_cpu(), &kw));
    LT_CHECK_OK(lm_tensor_to_device(NULL, vc.h, lm_device_cpu(), &vw));
    int32_t sl[2] = {2, 0}, pos[2 * 16];
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) pos[b * T + t] = (int32_t)(b * 11 + 3 + t);
    ct_pair so = ints(1, ss, sl), po = ints(2, ps, pos);
    lm_qkv_rope_params ph = {Hq, HV(bias), c->norms ? HV(qn) : NULL, c->norms ? HV(kn) : NULL, 1e-6f, NULL, 1.0f};
    ph.inv_freq = lm_tensor_as_view(inv);
    lm_qkv_rope_params pd = {Hq, DV(bias), c->norms ? DV(qn) : NULL, c->norms ? DV(kn) : NULL, 1e-6f, NULL, 1.0f};
    pd.inv_freq = lm_tensor_as_view(invd);
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ref, HV(qkv), &ph, HV(so), HV(po), lm_tensor_as_view(kw),
                                      lm_tensor_as_view(vw), lm_tensor_as_view(qw)));
    if (c->group) setenv("LOOM_CUDA_FRONT_GROUP", c->group, 1);
    if (c->tokens) setenv("LOOM_CUDA_FRONT_TOKENS", c->tokens, 1);
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, DV(qkv), &pd, DV(so), DV(po), DV(kc), DV(vc), DV(q)));
    unsetenv("LOOM_CUDA_FRONT_GROUP"), unsetenv("LOOM_CUDA_FRONT_TOKENS");
    char what[160];
    int n = snprintf(what, sizeof what, "qkv_rope_store q %s T %lld Hq %lld Hkv %lld D %lld norms %d group %s tokens %s",
                     lm_dtype_name(c->q_dt), (long long)T, (long long)Hq, (long long)Hkv, (long long)D, c->norms,
                     c->group ? c->group : "auto", c->tokens ? c->tokens : "on");
    snprintf(what + n, sizeof what - (size_t)n, ": q");
    ct_check(g_ctx, what, &q, DV(q), lm_tensor_as_view(qw), c->q_dt == LM_F32 ? 1e-10 : ct_nmse(c->q_dt),
             ct_abs(c->q_dt, 4.0));
    snprintf(what + n, sizeof what - (size_t)n, ": k cache");
    ct_check(g_ctx, what, &kc, DV(kc), lm_tensor_as_view(kw), ct_nmse(LM_BF16), ct_abs(LM_BF16, 4.0));
    snprintf(what + n, sizeof what - (size_t)n, ": v cache");
    ct_check(g_ctx, what, &vc, DV(vc), lm_tensor_as_view(vw), ct_nmse(LM_BF16), ct_abs(LM_BF16, 4.0));
    lm_tensor_destroy(inv), lm_tensor_destroy(invd), lm_tensor_destroy(kw), lm_tensor_destroy(vw), lm_tensor_destroy(qw);
    ct_pair_free(&qkv), ct_pair_free(&bias), ct_pair_free(&qn), ct_pair_free(&kn), ct_pair_free(&kc);
    ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&so), ct_pair_free(&po);
}

/* Both kernels; the token-major one at every pair count (head dims 16-256, 80: a
 * partial second pair), with one head a warp, chunks of 4 heads cut short, and every
 * head of a token in one warp; head dim 512 takes the per-head kernel. */
static void test_qkv_rope_store(void) {
    static const qkv_case cases[] = {
        {LM_F32, 1, 4, 2, 16, 0, NULL, NULL},  {LM_BF16, 1, 4, 2, 16, 1, NULL, NULL},
        {LM_F32, 7, 4, 2, 16, 1, NULL, NULL},  {LM_BF16, 5, 4, 2, 16, 0, NULL, NULL},
        {LM_F32, 7, 4, 2, 16, 1, NULL, "0"},   {LM_BF16, 5, 14, 2, 64, 0, NULL, NULL},
        {LM_BF16, 5, 14, 2, 64, 0, "1", NULL}, {LM_F32, 5, 14, 2, 64, 1, "5", NULL},
        {LM_BF16, 6, 14, 2, 64, 1, "18", NULL}, {LM_F32, 3, 14, 2, 64, 1, "7", "0"},
        {LM_F32, 3, 4, 2, 80, 1, "3", NULL},   {LM_BF16, 4, 8, 2, 128, 1, "6", NULL},
        {LM_F32, 16, 8, 2, 128, 0, NULL, NULL}, {LM_F32, 3, 4, 1, 256, 1, "2", NULL},
        {LM_BF16, 2, 2, 1, 256, 0, "4", NULL}, {LM_F32, 2, 2, 1, 512, 1, NULL, NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) check_qkv(&cases[i]);
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

/* ---- paged caches: the block-table forms against the contiguous form -------------------------- */
#define PG_ROWS 4
#define PG_MAX_NB 16

/* B rows of NB table entries over a pool of S blocks of P positions. Entries holding
 * positions up to a row's last one are distinct blocks of a random permutation of the
 * pool, except that row 1's first entry is row 0's (both rows' tokens of the step lie
 * past it: a shared prefix they only read); entries past the last position hold
 * values outside the pool (-1 or S + e: never read); bad_row >= 0 gets an entry out
 * of the pool at bad_entry. */
typedef struct paged {
    int64_t B, NB, P, S;
    int64_t last[PG_ROWS]; /* each row's last position after this step */
    int32_t tab[PG_ROWS * PG_MAX_NB];
} paged;

static void paged_init(paged *g, lt_rng *r, int64_t B, int64_t NB, int64_t P, int64_t S, const int64_t *last,
                       int bad_row, int64_t bad_entry) {
    LT_CHECK(B >= 2 && B <= PG_ROWS && NB <= PG_MAX_NB && S <= 256);
    g->B = B, g->NB = NB, g->P = P, g->S = S;
    int32_t perm[256];
    for (int64_t i = 0; i < S; i++) perm[i] = (int32_t)i;
    for (int64_t i = S - 1; i > 0; i--) { /* Fisher-Yates */
        int64_t j = lt_rng_int(r, 0, i);
        int32_t t = perm[i];
        perm[i] = perm[j], perm[j] = t;
    }
    int64_t k = 0;
    for (int64_t b = 0; b < B; b++) {
        g->last[b] = last[b];
        LT_CHECK(last[b] < NB * P);
        for (int64_t e = 0; e < NB; e++)
            g->tab[b * NB + e] = e <= last[b] / P ? perm[k++] : e % 2 ? -1 : (int32_t)(S + e);
    }
    LT_CHECK(k <= S);
    g->tab[NB] = g->tab[0];
    if (bad_row >= 0) g->tab[bad_row * NB + bad_entry] = (int32_t)(S + 1000);
}

/* Entry e of row b names a pool block and holds positions up to the row's last. */
static int paged_entry_ok(const paged *g, int64_t b, int64_t e) {
    int32_t blk = g->tab[b * g->NB + e];
    return e <= g->last[b] / g->P && blk >= 0 && blk < g->S;
}

/* Host copies between a pool [S, H, P, D] and the contiguous form [B, H, NB * P, D]
 * (row b in slot b), over every entry paged_entry_ok admits: gather (pool into
 * contiguous) or scatter (contiguous back into the pool). Same dtype on both sides. */
static void paged_copy(const paged *g, lm_tensor *pool, lm_tensor *contig, int scatter) {
    const lm_tensor_view *pv = lm_tensor_as_view(pool);
    int64_t H = pv->shape[1], D = pv->shape[3], P = g->P, NB = g->NB;
    size_t row = (size_t)D * lm_dtype_size(pv->dtype);
    char *pp = lm_tensor_data(pool), *cp = lm_tensor_data(contig);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t e = 0; e < NB; e++) {
            if (!paged_entry_ok(g, b, e)) continue;
            int64_t blk = g->tab[b * NB + e];
            for (int64_t h = 0; h < H; h++)
                for (int64_t o = 0; o < P; o++) {
                    char *a = pp + (size_t)((blk * H + h) * P + o) * row;
                    char *c = cp + (size_t)((b * H + h) * NB * P + e * P + o) * row;
                    if (scatter) memcpy(a, c, row);
                    else memcpy(c, a, row);
                }
        }
}

/* The contiguous form of a host pool: NaN (r NULL) or random where no admitted entry
 * lands, gathered elsewhere. */
static lm_tensor *paged_gather(const paged *g, lm_tensor *pool, lt_rng *r) {
    const lm_tensor_view *pv = lm_tensor_as_view(pool);
    int64_t cs[4] = {g->B, pv->shape[1], g->NB * g->P, pv->shape[3]};
    lm_tensor *c = r ? lt_random_tensor(r, pv->dtype, 4, cs, 1.0) : lt_poisoned_tensor(pv->dtype, 4, cs);
    paged_copy(g, pool, c, 0);
    return c;
}

/* A host copy of device tensor d (after the context's work). */
static lm_tensor *download(lm_tensor *d) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_tensor_to_device(NULL, d, lm_device_cpu(), &h));
    return h;
}

/* want = the pool after the contiguous call: the pool before it, with the device
 * contiguous result scattered back over the admitted entries. */
static lm_tensor *paged_expected(const paged *g, lm_tensor *pool_before, lm_tensor *contig_d) {
    lm_tensor *want = NULL, *back = download(contig_d);
    LT_CHECK_OK(lm_tensor_to_device(NULL, pool_before, lm_device_cpu(), &want));
    paged_copy(g, want, back, 1);
    lm_tensor_destroy(back);
    return want;
}

/* 1 when every element of rows [b0, b1) of device tensor p.d [B, ...] is NaN. */
static int rows_all_nan(const ct_pair *p, int64_t b0, int64_t b1) {
    lm_tensor_view v;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(p->d), 0, b0, b1, 1, &v));
    double *got = ct_read(g_ctx, p, &v);
    int all = 1;
    for (int64_t i = 0; got && i < lm_tensor_view_numel(&v); i++) all &= isnan(got[i]) != 0;
    free(got);
    return all;
}

/* Rows [0, nrows) of device tensor dp.d against rows [0, nrows) of host tensor want. */
static void check_rows(const char *what, const ct_pair *dp, lm_tensor *want, int64_t nrows, double nmse,
                       double abs_tol) {
    lm_tensor_view dv, wv;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(dp->d), 0, 0, nrows, 1, &dv));
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(want), 0, 0, nrows, 1, &wv));
    ct_check(g_ctx, what, dp, &dv, &wv, nmse, abs_tol);
}

/* Positions [B, T]: row b at start[b] .. start[b] + T - 1. */
static ct_pair positions_of(int64_t B, int64_t T, const int64_t *start) {
    int32_t pos[PG_ROWS * 64];
    LT_CHECK(B <= PG_ROWS && T <= 64);
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++) pos[b * T + t] = (int32_t)(start[b] + t);
    int64_t ps[2] = {B, T};
    return ints(2, ps, pos);
}

/* kv_store through a table [B, NB] viewed out of a wider [B, NB + 3] tensor (strided
 * rows): rows 0 and 1 share their first block and store past it, row 1 straddles two
 * blocks, row 2 fills the last entry, row 3's entry is outside the pool (it stores
 * nothing). Also the [B, 1] form of the contiguous call equals its [B] form. */
static void test_kv_store_paged(void) {
    lt_rng r = lt_rng_seed(61);
    const int64_t B = 4, T = 5, H = 2, D = 8, P = 16, NB = 6, S = 40;
    const int64_t start[4] = {P + 3, 3 * P - 2, 5 * P + 10, P + 1};
    int64_t last[4], xs[4] = {B, T, H, D}, ps[4] = {S, H, P, D}, ts[2] = {B, NB + 3}, ss[1] = {B};
    for (int b = 0; b < 4; b++) last[b] = start[b] + T - 1;
    paged g;
    paged_init(&g, &r, B, NB, P, S, last, 3, start[3] / P);
    int32_t wide[PG_ROWS * (PG_MAX_NB + 3)], ident[PG_ROWS] = {0, 1, 2, 3};
    for (int64_t b = 0; b < B; b++)
        for (int64_t e = 0; e < NB + 3; e++) wide[b * (NB + 3) + e] = e < NB ? g.tab[b * NB + e] : 12345;
    ct_pair tw = ints(2, ts, wide), so = ints(1, ss, ident), po = positions_of(B, T, start);
    lm_tensor_view tab_h, tab_d, s1_d;
    LT_CHECK_OK(lm_tensor_view_slice(HV(tw), 1, 0, NB, 1, &tab_h));
    tab_d = ct_mirror(tw.h, &tab_h, tw.d);
    int64_t b1[2] = {B, 1};
    LT_CHECK_OK(lm_tensor_view_split_axis(DV(so), 0, 2, b1, &s1_d));
    const lm_dtype pairs[2][2] = {{LM_F32, LM_BF16}, {LM_BF16, LM_F32}};
    for (int k = 0; k < 2; k++) {
        ct_pair x = ct_random(&r, pairs[k][0], 4, xs, 1.0), pool = ct_random(&r, pairs[k][1], 4, ps, 1.0);
        lm_tensor *cont = paged_gather(&g, pool.h, &r); /* finite everywhere: compared whole below */
        ct_pair c1 = ct_pair_of(cont), c2 = {NULL, NULL};
        LT_CHECK_OK(lm_tensor_to_device(NULL, c1.h, lm_device_cpu(), &c2.h));
        c2.d = ct_upload(c2.h);
        LT_CHECK_OK(lm_kv_store_out(g_ctx, DV(pool), DV(x), &tab_d, DV(po)));
        LT_CHECK_OK(lm_kv_store_out(g_ctx, DV(c1), DV(x), DV(so), DV(po)));
        LT_CHECK_OK(lm_kv_store_out(g_ctx, DV(c2), DV(x), &s1_d, DV(po)));
        lm_tensor *want = paged_expected(&g, pool.h, c1.d), *want1 = download(c1.d);
        char what[96];
        snprintf(what, sizeof what, "kv_store paged %s into %s (row 3 out of the pool)", lm_dtype_name(pairs[k][0]),
                 lm_dtype_name(pairs[k][1]));
        ct_check(g_ctx, what, &pool, DV(pool), lm_tensor_as_view(want), 0, 0);
        ct_check(g_ctx, "kv_store: slots [B, 1] = slots [B]", &c2, DV(c2), lm_tensor_as_view(want1), 0, 0);
        lm_tensor_destroy(want), lm_tensor_destroy(want1);
        ct_pair_free(&x), ct_pair_free(&pool), ct_pair_free(&c1), ct_pair_free(&c2);
    }
    ct_pair_free(&tw), ct_pair_free(&so), ct_pair_free(&po);
}

/* qkv_rope_store into paged bf16 caches (f32 and bf16 q, bias and q/k norms), rows as
 * in test_kv_store_paged: q and both pools equal the contiguous call's (scattered
 * back); row 3's q is NaN and it stores nothing. group: LOOM_CUDA_FRONT_GROUP for both
 * calls (NULL: the launcher's choice). */
static void check_qkv_paged(lm_dtype q_dt, const char *group) {
    lt_rng r = lt_rng_seed(67 + (uint64_t)q_dt);
    const int64_t B = 4, T = 5, Hq = 4, Hkv = 2, D = 16, P = 16, NB = 6, S = 40, nq = (Hq + 2 * Hkv) * D;
    const int64_t start[4] = {P + 3, 3 * P - 2, 5 * P + 10, P + 1};
    int64_t last[4], xs[3] = {B, T, nq}, ps[4] = {S, Hkv, P, D}, qs[4] = {B, T, Hq, D}, fs[1] = {D / 2};
    int64_t ds[1] = {D}, bs[1] = {nq}, ts[2] = {B, NB}, ss[1] = {B};
    for (int b = 0; b < 4; b++) last[b] = start[b] + T - 1;
    paged g;
    paged_init(&g, &r, B, NB, P, S, last, 3, start[3] / P);
    int32_t ident[PG_ROWS] = {0, 1, 2, 3};
    ct_pair tab = ints(2, ts, g.tab), so = ints(1, ss, ident), po = positions_of(B, T, start);
    ct_pair qkv = ct_random(&r, LM_F32, 3, xs, 1.0), bias = ct_random(&r, LM_F32, 1, bs, 0.5);
    ct_pair qn = ct_random(&r, LM_F32, 1, ds, 1.0), kn = ct_random(&r, LM_F32, 1, ds, 1.0);
    ct_pair kp = ct_random(&r, LM_BF16, 4, ps, 1.0), vp = ct_random(&r, LM_BF16, 4, ps, 1.0);
    ct_pair kc = ct_pair_of(paged_gather(&g, kp.h, NULL)), vc = ct_pair_of(paged_gather(&g, vp.h, NULL));
    ct_pair q1 = ct_poisoned(q_dt, 4, qs), q2 = ct_poisoned(q_dt, 4, qs);
    lm_tensor *inv = NULL, *invd = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, fs, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, 10000.0, D, lm_tensor_as_view(inv)));
    invd = ct_upload(inv);
    lm_qkv_rope_params pd = {Hq, DV(bias), DV(qn), DV(kn), 1e-6f, NULL, 1.0f};
    pd.inv_freq = lm_tensor_as_view(invd);
    if (group) setenv("LOOM_CUDA_FRONT_GROUP", group, 1);
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, DV(qkv), &pd, DV(tab), DV(po), DV(kp), DV(vp), DV(q1)));
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, DV(qkv), &pd, DV(so), DV(po), DV(kc), DV(vc), DV(q2)));
    unsetenv("LOOM_CUDA_FRONT_GROUP");
    lm_tensor *kw = paged_expected(&g, kp.h, kc.d), *vw = paged_expected(&g, vp.h, vc.d), *qw = download(q2.d);
    char what[96];
    snprintf(what, sizeof what, "qkv_rope_store paged q %s group %s: q of the good rows", lm_dtype_name(q_dt),
             group ? group : "auto");
    check_rows(what, &q1, qw, 3, 0, 0);
    LT_CHECK_MSG(rows_all_nan(&q1, 3, 4), "qkv_rope_store paged: a row out of the pool must get a NaN q");
    ct_check(g_ctx, "qkv_rope_store paged: k pool", &kp, DV(kp), lm_tensor_as_view(kw), 0, 0);
    ct_check(g_ctx, "qkv_rope_store paged: v pool", &vp, DV(vp), lm_tensor_as_view(vw), 0, 0);
    lm_tensor_destroy(inv), lm_tensor_destroy(invd), lm_tensor_destroy(kw), lm_tensor_destroy(vw);
    lm_tensor_destroy(qw);
    ct_pair_free(&tab), ct_pair_free(&so), ct_pair_free(&po), ct_pair_free(&qkv), ct_pair_free(&bias);
    ct_pair_free(&qn), ct_pair_free(&kn), ct_pair_free(&kp), ct_pair_free(&vp), ct_pair_free(&kc), ct_pair_free(&vc);
    ct_pair_free(&q1), ct_pair_free(&q2);
}

static void test_qkv_rope_store_paged(void) {
    check_qkv_paged(LM_F32, NULL);
    check_qkv_paged(LM_BF16, NULL);
    check_qkv_paged(LM_BF16, "3"); /* a bad token's warp covering q, k and v heads */
    check_qkv_paged(LM_F32, "8");
}

/* attention_cache over paged bf16 caches: 4 rows of T tokens, row 0 filling its whole
 * table (the last token at NB * P - 1), row 1 sharing row 0's first block, row 2 a
 * fresh prompt from position 0, row 3 with the entry of its first position outside the
 * pool, 40 positions short of a full table (with two splits, the second split of its
 * decode token is the bad one). Pool positions no row holds are NaN (never read). */
typedef struct paged_attn_case {
    int64_t T, Hq, Hkv, D, P, NB, window;
    lm_dtype q_dt, out_dt;
    int workspace;
} paged_attn_case;

static lm_tensor *widened(const lm_tensor *t) {
    lm_tensor *o = NULL;
    LT_CHECK_OK(lm_cast(g_ref, lm_tensor_as_view(t), LM_F32, &o));
    return o;
}

/* A random bf16 pool [S, Hkv, P, D] whose positions no row of g holds are NaN. */
static ct_pair paged_pool(lt_rng *r, const paged *g, int64_t Hkv, int64_t D) {
    int64_t ps[4] = {g->S, Hkv, g->P, D};
    lm_tensor *h = lt_random_tensor(r, LM_BF16, 4, ps, 1.0);
    uint16_t *p = lm_tensor_data(h);
    unsigned char held[256 * 128];
    LT_CHECK(g->S * g->P <= (int64_t)sizeof held);
    memset(held, 0, sizeof held);
    for (int64_t b = 0; b < g->B; b++)
        for (int64_t e = 0; e < g->NB; e++)
            for (int64_t o = 0; paged_entry_ok(g, b, e) && o < g->P && e * g->P + o <= g->last[b]; o++)
                held[g->tab[b * g->NB + e] * g->P + o] = 1;
    for (int64_t s = 0; s < g->S; s++)
        for (int64_t kh = 0; kh < Hkv; kh++)
            for (int64_t o = 0; o < g->P; o++)
                for (int64_t d = 0; !held[s * g->P + o] && d < D; d++) p[((s * Hkv + kh) * g->P + o) * D + d] = 0x7fc0;
    return ct_pair_of(h);
}

static void check_attention_paged(const paged_attn_case *c) {
    lt_rng r = lt_rng_seed(73 + (uint64_t)(c->P * 3 + c->T + c->D));
    const int64_t B = 4, T = c->T, P = c->P, NB = c->NB, S = B * NB + 8, cap = NB * P;
    const int64_t start[4] = {cap - T, P + 7, 0, cap - T - 40};
    int64_t last[4], qs[4] = {B, T, c->Hq, c->D}, ts[2] = {B, NB}, ss[1] = {B};
    for (int b = 0; b < 4; b++) last[b] = start[b] + T - 1;
    LT_CHECK(start[0] >= P); /* rows 0 and 1 only read their shared first block */
    paged g;
    paged_init(&g, &r, B, NB, P, S, last, 3, start[3] / P);
    int32_t ident[PG_ROWS] = {0, 1, 2, 3};
    ct_pair tab = ints(2, ts, g.tab), so = ints(1, ss, ident), po = positions_of(B, T, start);
    ct_pair kp = paged_pool(&r, &g, c->Hkv, c->D), vp = paged_pool(&r, &g, c->Hkv, c->D);
    ct_pair kc = ct_pair_of(paged_gather(&g, kp.h, NULL)), vc = ct_pair_of(paged_gather(&g, vp.h, NULL));
    ct_pair q = ct_random(&r, c->q_dt, 4, qs, 1.0);
    ct_pair o1 = ct_poisoned(c->out_dt, 4, qs), o2 = ct_poisoned(c->out_dt, 4, qs);
    int64_t wsn = (int64_t)lm_attention_cache_workspace_bytes(ct_gpu, B * T, c->Hq, c->D, cap);
    lm_tensor *ws = NULL;
    if (c->workspace && wsn) LT_CHECK_OK(lm_tensor_zeros(ct_gpu, LM_U8, 1, &wsn, &ws));
    lm_kv_attention_params p = {1.0f / sqrtf((float)c->D), c->window, ws ? lm_tensor_as_view(ws) : NULL};
    lm_kv_attention_params pr = {p.scale, p.window, NULL};
    int flash = T > 1 && c->q_dt == LM_BF16 && (c->D == 64 || c->D == 128);
    double nmse = flash ? (c->out_dt == LM_BF16 ? 5e-5 : 2e-5) : c->out_dt == LM_BF16 ? ct_nmse(LM_BF16) : 1e-9;
    double abs_tol = flash ? 0.03 : ct_abs(c->out_dt, 1.0);
    char what[192];
    int n = snprintf(what, sizeof what, "attention_cache paged %s T %lld G %lld D %lld P %lld NB %lld window %lld q %s "
                     "out %s ws %d", flash ? "flash" : "rows", (long long)T, (long long)(c->Hq / c->Hkv),
                     (long long)c->D, (long long)P, (long long)NB, (long long)c->window, lm_dtype_name(c->q_dt),
                     lm_dtype_name(c->out_dt), ws != NULL);
    /* the contiguous form against the CPU reference (rows 0..2; row 3's keys are NaN there) */
    LT_CHECK_OK(lm_attention_cache_out(g_ctx, DV(q), DV(kc), DV(vc), DV(so), DV(po), &p, DV(o2)));
    lm_tensor *q32 = widened(q.h), *k32 = widened(kc.h), *v32 = widened(vc.h), *w32 = lt_poisoned_tensor(LM_F32, 4, qs);
    lm_tensor *want = lt_poisoned_tensor(c->out_dt, 4, qs);
    LT_CHECK_OK(lm_attention_cache_out(g_ref, lm_tensor_as_view(q32), lm_tensor_as_view(k32), lm_tensor_as_view(v32),
                                       HV(so), HV(po), &pr, lm_tensor_as_view(w32)));
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(w32), lm_tensor_as_view(want)));
    snprintf(what + n, sizeof what - (size_t)n, ": contiguous vs reference");
    check_rows(what, &o2, want, 3, nmse, abs_tol);
    lm_tensor *cont = download(o2.d);
    for (int rep = 0; rep < 2; rep++) { /* twice: the split counters are back at zero */
        LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(o1)));
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, DV(q), DV(kp), DV(vp), DV(tab), DV(po), &p, DV(o1)));
        snprintf(what + n, sizeof what - (size_t)n, ": paged vs contiguous, run %d", rep);
        check_rows(what, &o1, cont, 3, nmse, abs_tol);
        LT_CHECK_MSG(rows_all_nan(&o1, 3, 4), "%s: the row with a block out of the pool is not NaN", what);
    }
    lm_tensor_destroy(ws), lm_tensor_destroy(q32), lm_tensor_destroy(k32), lm_tensor_destroy(v32);
    lm_tensor_destroy(w32), lm_tensor_destroy(want), lm_tensor_destroy(cont);
    ct_pair_free(&tab), ct_pair_free(&so), ct_pair_free(&po), ct_pair_free(&kp), ct_pair_free(&vp);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&o1), ct_pair_free(&o2);
}

/* Decode (T = 1, the split-K rows kernel, per head and grouped: rows of 384 and 400
 * positions are two splits with the workspace, one without), then prefill (T = 40, the flash kernel:
 * blocks of 16 and 32 positions inside a 64-key tile, blocks of 80 straddling tiles),
 * windows included. */
static void test_attention_cache_paged(void) {
    paged_attn_case dec[4] = {{1, 8, 2, 64, 32, 12, 0, LM_F32, LM_F32, 1},
                              {1, 8, 2, 64, 32, 12, 0, LM_BF16, LM_BF16, 0},
                              {1, 4, 4, 16, 80, 5, 100, LM_F32, LM_F32, 1},
                              {1, 14, 2, 64, 16, 8, 0, LM_BF16, LM_F32, 1}};
    static const char *const kernels[4] = {"head", "early", "group", "mma"};
    for (int k = 0; k < 4; k++) { /* the per-head kernel, its early-V form, the grouped one (groups 4 and 7), the tensor-core one */
        setenv("LOOM_CUDA_ATTN_ROWS", kernels[k], 1);
        for (int i = 0; i < 4; i++) check_attention_paged(&dec[i]);
    }
    unsetenv("LOOM_CUDA_ATTN_ROWS");
    paged_attn_case pre[4] = {{40, 4, 2, 64, 32, 12, 0, LM_BF16, LM_F32, 1},
                              {40, 4, 2, 64, 16, 8, 0, LM_BF16, LM_BF16, 1},
                              {40, 4, 2, 128, 80, 5, 50, LM_BF16, LM_BF16, 1},
                              {40, 2, 2, 64, 80, 5, 0, LM_BF16, LM_F32, 1}};
    for (int i = 0; i < 4; i++) check_attention_paged(&pre[i]);
}

/* The decode front and attention back to back, as a step runs them: per step the front
 * stores each row's newest key and q, and the attention, launched right behind it, may
 * read the older keys before it waits for the front (the tensor-core kernel's early
 * keys). B = 4 slot rows of a cache of 8,192 positions, Hq 14 / Hkv 2, D 64 (Qwen2.5's
 * groups; 16 splits, so the long rows give a warp 2-4 tiles, the last holding the
 * newest key); every position from a row's start on is NaN before the chain, so an
 * attention that read its newest key before the front stored it turns NaN. CHAIN_STEPS
 * steps are queued with no wait between them, once with the early keys and once with
 * LOOM_CUDA_ATTN_EARLY_KEYS=0: every step's output and the caches must be the same
 * bits and NaN-free, and the last step equals the CPU reference over the final caches
 * (the split-K gate: NMSE 1e-9, one f32 ulp of the scale). */
#define CHAIN_STEPS 12
static void chain_run(const char *early, ct_pair *kc, ct_pair *vc, const ct_pair *qkv, const lm_qkv_rope_params *pd,
                      const ct_pair *so, const ct_pair *po, ct_pair *q, lm_tensor *ws, ct_pair *out) {
    LT_CHECK_OK(lm_tensor_view_write(NULL, DV(*kc), lm_tensor_data(kc->h)));
    LT_CHECK_OK(lm_tensor_view_write(NULL, DV(*vc), lm_tensor_data(vc->h)));
    for (int st = 0; st < CHAIN_STEPS; st++) LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(out[st])));
    LT_CHECK_OK(lm_tensor_view_poison(NULL, DV(*q)));
    lm_kv_attention_params p = {0.125f, 0, lm_tensor_as_view(ws)};
    if (early) setenv("LOOM_CUDA_ATTN_EARLY_KEYS", early, 1);
    for (int st = 0; st < CHAIN_STEPS; st++) { /* queued back to back */
        LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, DV(qkv[st]), pd, DV(*so), DV(po[st]), DV(*kc), DV(*vc), DV(*q)));
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, DV(*q), DV(*kc), DV(*vc), DV(*so), DV(po[st]), &p, DV(out[st])));
    }
    unsetenv("LOOM_CUDA_ATTN_EARLY_KEYS");
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
}

static int same_bits(lm_tensor *a, lm_tensor *b) {
    size_t n = (size_t)lm_tensor_numel(a) * lm_dtype_size(lm_tensor_dtype(a));
    return lm_tensor_numel(a) == lm_tensor_numel(b) && !memcmp(lm_tensor_data(a), lm_tensor_data(b), n);
}

static void test_front_then_attention(void) {
    lt_rng r = lt_rng_seed(91);
    const int64_t B = 4, Hq = 14, Hkv = 2, D = 64, P = 8192, nq = (Hq + 2 * Hkv) * D;
    const int64_t start[4] = {8000, 4100, 300, 2500};
    int64_t xs[3] = {B, 1, nq}, cs[4] = {B, Hkv, P, D}, qs[4] = {B, 1, Hq, D}, fs[1] = {D / 2}, ss[1] = {B};
    ct_pair kc = ct_random(&r, LM_BF16, 4, cs, 1.0), vc = ct_random(&r, LM_BF16, 4, cs, 1.0);
    ct_pair *caches[2] = {&kc, &vc};
    for (int c = 0; c < 2; c++) { /* NaN from each row's start on */
        uint16_t *h = lm_tensor_data(caches[c]->h);
        for (int64_t b = 0; b < B; b++)
            for (int64_t kh = 0; kh < Hkv; kh++)
                for (int64_t t = start[b]; t < P; t++)
                    for (int64_t d = 0; d < D; d++) h[((b * Hkv + kh) * P + t) * D + d] = 0x7fc0;
    }
    int32_t sl[4] = {0, 1, 2, 3};
    ct_pair so = ints(1, ss, sl), qkv[CHAIN_STEPS], po[CHAIN_STEPS], o1[CHAIN_STEPS], o0[CHAIN_STEPS];
    for (int st = 0; st < CHAIN_STEPS; st++) {
        int64_t at[4];
        for (int b = 0; b < 4; b++) at[b] = start[b] + st;
        qkv[st] = ct_random(&r, LM_F32, 3, xs, 1.0);
        po[st] = positions_of(B, 1, at);
        o1[st] = ct_poisoned(LM_F32, 4, qs), o0[st] = ct_poisoned(LM_F32, 4, qs);
    }
    ct_pair q = ct_poisoned(LM_BF16, 4, qs);
    lm_tensor *inv = NULL, *invd = NULL, *ws = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, fs, &inv));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ref, 1000000.0, D, lm_tensor_as_view(inv)));
    invd = ct_upload(inv);
    lm_qkv_rope_params pd = {Hq, NULL, NULL, NULL, 1e-6f, NULL, 1.0f};
    pd.inv_freq = lm_tensor_as_view(invd);
    int64_t wsn = (int64_t)lm_attention_cache_workspace_bytes(ct_gpu, B, Hq, D, P);
    LT_CHECK(wsn > 0);
    LT_CHECK_OK(lm_tensor_zeros(ct_gpu, LM_U8, 1, &wsn, &ws));
    chain_run(NULL, &kc, &vc, qkv, &pd, &so, po, &q, ws, o1);
    lm_tensor *k1 = download(kc.d), *v1 = download(vc.d), *q1 = download(q.d);
    chain_run("0", &kc, &vc, qkv, &pd, &so, po, &q, ws, o0);
    lm_tensor *k0 = download(kc.d), *v0 = download(vc.d);
    LT_CHECK_MSG(same_bits(k1, k0) && same_bits(v1, v0), "front + attention chain: caches differ with early keys");
    for (int st = 0; st < CHAIN_STEPS; st++) {
        lm_tensor *a = download(o1[st].d), *b = download(o0[st].d);
        const float *f = lm_tensor_data(a);
        int nan = 0;
        for (int64_t i = 0; i < lm_tensor_numel(a); i++) nan |= isnan(f[i]) != 0;
        LT_CHECK_MSG(!nan, "front + attention chain, step %d: NaN in the output with early keys", st);
        LT_CHECK_MSG(same_bits(a, b), "front + attention chain, step %d: early keys change the output", st);
        lm_tensor_destroy(a), lm_tensor_destroy(b);
    }
    /* the last step against the CPU over the final caches and q */
    lm_tensor *kw = widened(k1), *vw = widened(v1), *qw = widened(q1), *want = lt_poisoned_tensor(LM_F32, 4, qs);
    lm_kv_attention_params pr = {0.125f, 0, NULL};
    LT_CHECK_OK(lm_attention_cache_out(g_ref, lm_tensor_as_view(qw), lm_tensor_as_view(kw), lm_tensor_as_view(vw),
                                       HV(so), HV(po[CHAIN_STEPS - 1]), &pr, lm_tensor_as_view(want)));
    check_rows("front + attention chain: last step vs reference", &o1[CHAIN_STEPS - 1], want, B, 1e-9,
               ct_abs(LM_F32, 1.0));
    lm_tensor_destroy(k1), lm_tensor_destroy(v1), lm_tensor_destroy(q1), lm_tensor_destroy(k0);
    lm_tensor_destroy(v0), lm_tensor_destroy(kw), lm_tensor_destroy(vw), lm_tensor_destroy(qw);
    lm_tensor_destroy(want), lm_tensor_destroy(inv), lm_tensor_destroy(invd), lm_tensor_destroy(ws);
    for (int st = 0; st < CHAIN_STEPS; st++)
        ct_pair_free(&qkv[st]), ct_pair_free(&po[st]), ct_pair_free(&o1[st]), ct_pair_free(&o0[st]);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&so), ct_pair_free(&q);
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
    LT_RUN(test_kv_store_paged);
    LT_RUN(test_qkv_rope_store_paged);
    LT_RUN(test_front_then_attention);
    LT_RUN(test_attention_cache_paged);
    LT_RUN(test_sample_public);
    LT_RUN(test_mixed_forms);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
