/* CUDA attention against the CPU reference attention:
 *  - the readable kernel per float dtype: GQA, causal and not, windows, Dv != D,
 *    q/k/v/out as permuted views of [B, T, H, D] buffers, and 2500 keys (three
 *    online-softmax chunks);
 *  - lm_attention_cache_out over a bf16 cache (the model step): the split-K rows kernel
 *    for decode (groups of 1, 4 and 7 query heads, head dims 12, 16, 64, contexts from
 *    3 keys to 2000 keys, one split up to eight splits of 256 keys combined by the last
 *    block, f32 and bf16 q and out, windows), run twice to prove the split counters
 *    are left at zero (what graph replay relies on) and that a kernel gives the same
 *    bits every run (its partial sums meet in a fixed order); the tensor-core flash kernel for
 *    prefill, each case in its wgmma form (on an sm_90 device) and its mma.sync form
 *    (head dims 64 and 128, two rows with different cached prefixes, partial query
 *    tiles, windows, cache positions past the written range poisoned with NaN: they
 *    must never leak into the output); a row naming a slot outside the cache.
 * The reference runs in f32 on the same bf16-rounded q/K/V. Gates: the rows kernel
 * keeps probabilities in f32 (NMSE 1e-9 for f32 out); the flash kernel rounds P to
 * bf16 for the P V product (relative 2^-9 per weight, NMSE ~1e-6): NMSE 2e-5 / max-abs
 * 0.03.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_ref;

/* [B, T, H, D] random buffer viewed [B, H, T, D]. */
static ct_pair bthd(lt_rng *r, lm_dtype dt, int64_t B, int64_t T, int64_t H, int64_t D, lm_tensor_view *hv,
                    lm_tensor_view *dv) {
    int64_t s[4] = {B, T, H, D};
    ct_pair p = ct_random(r, dt, 4, s, 1.0);
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(p.h), 1, 2, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

static void check_readable(lm_dtype dt, int causal, int64_t Tq, int64_t Tk, int64_t Hq, int64_t Hkv) {
    lt_rng r = lt_rng_seed(71 + (uint64_t)Tk);
    int64_t B = 2, D = 16, Dv = 12;
    lm_tensor_view qh, qd, kh, kd, vh, vd;
    ct_pair q = bthd(&r, dt, B, Tq, Hq, D, &qh, &qd), k = bthd(&r, dt, B, Tk, Hkv, D, &kh, &kd);
    ct_pair v = bthd(&r, dt, B, Tk, Hkv, Dv, &vh, &vd);
    int64_t os[4] = {B, Tq, Hq, Dv};
    ct_pair o = ct_poisoned(dt, 4, os);
    lm_tensor_view oh, od;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(o.h), 1, 2, &oh));
    od = ct_mirror(o.h, &oh, o.d);
    lm_tensor *want = lt_poisoned_tensor(dt, 4, os);
    lm_tensor_view wv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(want), 1, 2, &wv));
    float scale = 0.25f;
    int64_t window = causal && Tk > 4 ? 4 : 0;
    LT_CHECK_OK(lm_attention_window_out(g_ref, &qh, &kh, &vh, scale, causal, window, &wv));
    LT_CHECK_OK(lm__cuda_attention(&qd, &kd, &vd, scale, causal, window, &od, ct_stream(g_ctx)));
    char what[96];
    snprintf(what, sizeof what, "attention %s causal %d window %lld Tq %lld Tk %lld", lm_dtype_name(dt), causal,
             (long long)window, (long long)Tq, (long long)Tk);
    ct_check(g_ctx, what, &o, &od, &wv, ct_nmse(dt), ct_abs(dt, 2.0));
    ct_pair_free(&q), ct_pair_free(&k), ct_pair_free(&v), ct_pair_free(&o);
    lm_tensor_destroy(want);
}

static void test_readable_attention(void) {
    for (int kx = 0; kx < 3; kx++) {
        check_readable(ct_floats[kx], 1, 5, 9, 4, 2);
        check_readable(ct_floats[kx], 0, 7, 3, 6, 3);
    }
    check_readable(LM_F32, 1, 3, 2500, 2, 1);
    check_readable(LM_BF16, 0, 2, 2500, 4, 4);
}

/* A bf16 cache [slots, Hkv, max_t, hd]: random below valid[slot] positions, NaN above. */
static ct_pair make_cache(lt_rng *r, int slots, int Hkv, int64_t max_t, int64_t hd, const int64_t *valid) {
    int64_t s[4] = {slots, Hkv, max_t, hd};
    lm_tensor *h = lt_random_tensor(r, LM_BF16, 4, s, 1.0);
    uint16_t *p = lm_tensor_data(h);
    for (int sl = 0; sl < slots; sl++)
        for (int kh = 0; kh < Hkv; kh++)
            for (int64_t t = valid[sl]; t < max_t; t++)
                for (int64_t d = 0; d < hd; d++) p[(((int64_t)sl * Hkv + kh) * max_t + t) * hd + d] = 0x7fc0;
    return ct_pair_of(h);
}

static lm_tensor *to_f32(const lm_tensor *t) {
    lm_tensor *o = NULL;
    LT_CHECK_OK(lm_cast(g_ref, lm_tensor_as_view(t), LM_F32, &o));
    return o;
}

/* lm_attention_cache_out on the GPU against the CPU reference on the same bf16-rounded
 * caches (widened to f32 there): B rows of T tokens at per-row starts and slots. */
typedef struct cache_case {
    int B, Hq, Hkv;
    int64_t T, hd, max_t, window;
    const int64_t *start; /* [B] */
    const int *slot;      /* [B] */
    lm_dtype q_dt, out_dt;
    int workspace; /* pass the split-K workspace */
} cache_case;

static void check_cache_attention(const cache_case *c) {
    lt_rng r = lt_rng_seed(81 + (uint64_t)(c->hd + c->max_t + c->T));
    const int slots = 3;
    int64_t valid[3] = {0, 0, 0};
    for (int b = 0; b < c->B; b++) valid[c->slot[b]] = c->start[b] + c->T; /* what exists after this step */
    ct_pair kc = make_cache(&r, slots, c->Hkv, c->max_t, c->hd, valid);
    ct_pair vc = make_cache(&r, slots, c->Hkv, c->max_t, c->hd, valid);
    int64_t qs[4] = {c->B, c->T, c->Hq, c->hd}, bs[1] = {c->B}, ps[2] = {c->B, c->T};
    ct_pair q = ct_random(&r, c->q_dt, 4, qs, 1.0);
    int32_t pos[512], sl[8];
    for (int b = 0; b < c->B; b++) {
        sl[b] = c->slot[b];
        for (int64_t t = 0; t < c->T; t++) pos[b * c->T + t] = (int32_t)(c->start[b] + t);
    }
    lm_tensor *posh = NULL, *sloth = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, ps, pos, &posh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, bs, sl, &sloth));
    ct_pair po = ct_pair_of(posh), so = ct_pair_of(sloth);
    int64_t wsn = (int64_t)lm_attention_cache_workspace_bytes(ct_gpu, c->B * c->T, c->Hq, c->hd, c->max_t);
    lm_tensor *ws = NULL;
    if (c->workspace && wsn) LT_CHECK_OK(lm_tensor_zeros(ct_gpu, LM_U8, 1, &wsn, &ws));
    lm_kv_attention_params p = {1.0f / sqrtf((float)c->hd), c->window, ws ? lm_tensor_as_view(ws) : NULL};
    lm_kv_attention_params pr = {p.scale, p.window, NULL};
    lm_tensor *q32 = to_f32(q.h), *k32 = to_f32(kc.h), *v32 = to_f32(vc.h), *want32 = lt_poisoned_tensor(LM_F32, 4, qs);
    LT_CHECK_OK(lm_attention_cache_out(g_ref, lm_tensor_as_view(q32), lm_tensor_as_view(k32), lm_tensor_as_view(v32),
                                       lm_tensor_as_view(sloth), lm_tensor_as_view(posh), &pr,
                                       lm_tensor_as_view(want32)));
    lm_tensor *want = lt_poisoned_tensor(c->out_dt, 4, qs);
    LT_CHECK_OK(lm_cast_out(g_ref, lm_tensor_as_view(want32), lm_tensor_as_view(want)));
    ct_pair o = ct_poisoned(c->out_dt, 4, qs);
    int flash = c->T > 1 && c->q_dt == LM_BF16 && (c->hd == 64 || c->hd == 128);
    static const char *const kernels[4] = {"head", "early", "group", "mma"};
    const int64_t n = lm_tensor_view_numel(lm_tensor_as_view(o.d));
    double *first = NULL; /* the first of a kernel's two runs: the second must give the same bits */
    for (int rep = 0; rep < 8; rep++) { /* twice per kernel: the split counters must be back at zero */
        const char *kernel = kernels[rep / 2];
        setenv("LOOM_CUDA_ATTN_ROWS", kernel, 1);
        /* flash: the wgmma forward (on an sm_90 device) in runs 0-3, the mma.sync one in 4-7 */
        ct_flash_form(rep < 4);
        LT_CHECK_OK(lm_tensor_view_poison(NULL, lm_tensor_as_view(o.d)));
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, lm_tensor_as_view(q.d), lm_tensor_as_view(kc.d),
                                           lm_tensor_as_view(vc.d), lm_tensor_as_view(so.d), lm_tensor_as_view(po.d),
                                           &p, lm_tensor_as_view(o.d)));
        char what[192];
        snprintf(what, sizeof what,
                 "attention_cache %s B %d T %lld G %d hd %lld max_t %lld window %lld q %s out %s ws %d run %d",
                 flash ? (rep < 4 ? "flash (wgmma)" : "flash (mma.sync)") : kernel, c->B, (long long)c->T,
                 c->Hq / c->Hkv, (long long)c->hd, (long long)c->max_t, (long long)c->window,
                 lm_dtype_name(c->q_dt), lm_dtype_name(c->out_dt), ws != NULL, rep);
        /* rows keep probabilities in f32; flash rounds P to bf16 for P V (NMSE ~1e-6) */
        double nmse = flash ? (c->out_dt == LM_BF16 ? 5e-5 : 2e-5) : c->out_dt == LM_BF16 ? ct_nmse(LM_BF16) : 1e-9;
        ct_check(g_ctx, what, &o, lm_tensor_as_view(o.d), lm_tensor_as_view(want), nmse,
                 flash ? 0.03 : ct_abs(c->out_dt, 1.0));
        double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
        if (rep % 2 == 0) {
            free(first);
            first = got;
        } else {
            LT_CHECK_MSG(memcmp(first, got, sizeof(double) * (size_t)n) == 0, "%s: not the bits of the first run", what);
            free(got);
        }
    }
    free(first);
    unsetenv("LOOM_CUDA_ATTN_ROWS");
    unsetenv("LOOM_FLASH_WGMMA");
    lm_tensor_destroy(ws), lm_tensor_destroy(q32), lm_tensor_destroy(k32), lm_tensor_destroy(v32);
    lm_tensor_destroy(want32), lm_tensor_destroy(want);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&po), ct_pair_free(&so), ct_pair_free(&o);
}

/* Decode rows (T = 1) at different positions and slots: one split up to 32 splits
 * combined by the last block (with the workspace), groups of 1, 3, 4, 7, 8 and 16, head
 * dims 12, 16, 32, 64 and 128, f32 and bf16 q and out, windows. Each case runs the
 * per-head kernel, its early-V form (head dims 8..256, powers of two), (for groups
 * 2..8) the grouped kernel and (head dims 64 and 128, groups up to 16) the tensor-core
 * kernel (LOOM_CUDA_ATTN_ROWS). */
static void test_cache_attention_decode(void) {
    const int64_t st_a[3] = {0, 300, 63};
    const int sl_a[3] = {0, 1, 2};
    cache_case a = {3, 14, 2, 1, 64, 512, 0, st_a, sl_a, LM_F32, LM_F32, 1}; /* Qwen2.5-0.5B: group 7 */
    check_cache_attention(&a);
    a.q_dt = a.out_dt = LM_BF16;
    check_cache_attention(&a);
    a.workspace = 0; /* one split per token */
    check_cache_attention(&a);
    a.window = 40;
    check_cache_attention(&a);
    const int64_t st_b[2] = {1999, 700};
    const int sl_b[2] = {2, 0};
    cache_case b = {2, 8, 2, 1, 16, 2048, 0, st_b, sl_b, LM_F32, LM_F32, 1};
    check_cache_attention(&b);
    b.window = 513; /* the window crosses split boundaries */
    check_cache_attention(&b);
    const int64_t st_c[2] = {9, 2};
    const int sl_c[2] = {1, 0};
    cache_case c = {2, 4, 4, 1, 12, 40, 3, st_c, sl_c, LM_F32, LM_BF16, 1};
    check_cache_attention(&c);
    /* a long row: 32 splits of 512 keys, group 7 */
    const int64_t st_d[1] = {16000};
    const int sl_d[1] = {1};
    cache_case d = {1, 14, 2, 1, 64, 16384, 0, st_d, sl_d, LM_BF16, LM_BF16, 1};
    check_cache_attention(&d);
    d.window = 4000;
    check_cache_attention(&d);
    /* groups of 3 (the default model), 8 with head dim 128 (the largest grouped one) and
     * 16 (the per-head kernel) */
    const int64_t st_e[3] = {1500, 20, 700};
    const int sl_e[3] = {0, 1, 2};
    cache_case e = {3, 6, 2, 1, 64, 2048, 0, st_e, sl_e, LM_F32, LM_F32, 1};
    check_cache_attention(&e);
    cache_case f = {3, 16, 2, 1, 128, 2048, 0, st_e, sl_e, LM_BF16, LM_F32, 1};
    check_cache_attention(&f);
    f.workspace = 0;
    check_cache_attention(&f);
    cache_case g = {3, 16, 1, 1, 32, 2048, 0, st_e, sl_e, LM_F32, LM_BF16, 1};
    check_cache_attention(&g);
    /* a group of 16 (every row of the tensor-core kernel's tile), head dims 64 and 128;
     * a group of 1 and a window inside one split */
    cache_case h = {3, 16, 1, 1, 64, 2048, 0, st_e, sl_e, LM_F32, LM_F32, 1};
    check_cache_attention(&h);
    h.hd = 128, h.q_dt = LM_BF16;
    check_cache_attention(&h);
    cache_case i = {3, 4, 4, 1, 64, 2048, 100, st_e, sl_e, LM_F32, LM_BF16, 1};
    check_cache_attention(&i);
}

/* Prefill rows (T > 1): the flash kernel for bf16 q with head dims 64 and 128 (two rows
 * with different cached prefixes, partial query tiles, positions past the written
 * range poisoned), windows shorter than the prompt, longer rows (5 query tiles; up to 8
 * key tiles behind a cached prefix), and the rows kernels for an f32 q (head dims 16 and
 * 64). */
static void test_cache_attention_prefill(void) {
    const int64_t st[2] = {0, 100};
    const int sl[2] = {2, 0};
    cache_case a = {2, 4, 2, 70, 64, 256, 0, st, sl, LM_BF16, LM_F32, 1};
    check_cache_attention(&a);
    a.out_dt = LM_BF16;
    check_cache_attention(&a);
    a.window = 17;
    check_cache_attention(&a);
    cache_case b = {2, 2, 2, 70, 128, 256, 0, st, sl, LM_BF16, LM_F32, 1};
    check_cache_attention(&b);
    b.window = 90;
    check_cache_attention(&b);
    cache_case c = {2, 14, 2, 70, 64, 256, 0, st, sl, LM_BF16, LM_BF16, 1};
    check_cache_attention(&c);
    cache_case d = {2, 4, 2, 9, 16, 256, 5, st, sl, LM_F32, LM_F32, 1}; /* rows kernel */
    check_cache_attention(&d);
    d.hd = 64, d.window = 0; /* f32 q at head dim 64: the rows kernels, the tensor-core one among them */
    check_cache_attention(&d);
    const int64_t st_e[1] = {0};
    const int sl_e[1] = {1};
    cache_case e = {1, 14, 2, 300, 64, 512, 0, st_e, sl_e, LM_BF16, LM_BF16, 1}; /* 5 query tiles, group 7 */
    check_cache_attention(&e);
    const int64_t st_f[2] = {0, 250};
    const int sl_f[2] = {0, 2};
    cache_case f = {2, 4, 1, 200, 128, 512, 0, st_f, sl_f, LM_BF16, LM_F32, 1}; /* row 1: 8 key tiles */
    check_cache_attention(&f);
    f.window = 150;
    check_cache_attention(&f);
}

/* A row naming a slot outside the cache writes NaN and leaves the other rows right;
 * nothing is read or written outside the cache (device indices are not checked). */
static void test_cache_attention_bad_row(void) {
    lt_rng r = lt_rng_seed(5);
    int64_t cs[4] = {2, 2, 32, 64}, qs[4] = {2, 1, 4, 64}, bs[1] = {2}, ps[2] = {2, 1};
    ct_pair kc = ct_random(&r, LM_BF16, 4, cs, 1.0), vc = ct_random(&r, LM_BF16, 4, cs, 1.0);
    ct_pair q = ct_random(&r, LM_F32, 4, qs, 1.0), o = ct_poisoned(LM_F32, 4, qs);
    int32_t sl[2] = {1, 7}, pos[2] = {3, 3};
    lm_tensor *sh = NULL, *ph = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, bs, sl, &sh));
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 2, ps, pos, &ph));
    ct_pair so = ct_pair_of(sh), po = ct_pair_of(ph);
    lm_kv_attention_params p = {0.125f, 0, NULL};
    LT_CHECK_OK(lm_attention_cache_out(g_ctx, lm_tensor_as_view(q.d), lm_tensor_as_view(kc.d), lm_tensor_as_view(vc.d),
                                       lm_tensor_as_view(so.d), lm_tensor_as_view(po.d), &p, lm_tensor_as_view(o.d)));
    double *got = ct_read(g_ctx, &o, lm_tensor_as_view(o.d));
    int row0_finite = 1, row1_nan = 1;
    for (int i = 0; got && i < 4 * 64; i++) row0_finite &= isfinite(got[i]), row1_nan &= isnan(got[4 * 64 + i]);
    LT_CHECK_MSG(row0_finite && row1_nan, "bad slot: row 0 finite %d, row 1 NaN %d", row0_finite, row1_nan);
    free(got);
    ct_pair_free(&kc), ct_pair_free(&vc), ct_pair_free(&q), ct_pair_free(&o), ct_pair_free(&so), ct_pair_free(&po);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_readable_attention);
    LT_RUN(test_cache_attention_decode);
    LT_RUN(test_cache_attention_prefill);
    LT_RUN(test_cache_attention_bad_row);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
