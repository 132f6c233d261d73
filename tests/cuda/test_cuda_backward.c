/* CUDA backward and optimizer operators against the CPU reference, through the public
 * API (loom/ops_backward.h) on a CUDA context vs the same call on a CPU context forced
 * to LM_IMPL_REF, on the same rounded random inputs, into NaN-poisoned outputs:
 * AdamW (three tensors: f32/bf16/f16 grads, a permuted parameter view), sum of
 * squares (mixed dtypes, an empty tensor, n = 0, bitwise repeatable), RMSNorm and
 * fused add + RMSNorm (permuted inputs, strided dx, dweight over more rows than one
 * chunk), SwiGLU, RoPE (both styles, explicit and implicit positions, dbias),
 * embedding with duplicate ids (i32/i64, unused rows 0, bitwise repeatable, bad id
 * leaves dtable untouched), cross-entropy (ignored rows, none counted, bad target),
 * matmul (the Linear case with a transposed weight gradient and the batched case on
 * the GEMM path, a broadcast case whose gradients sum over batches, f32 x bf16),
 * attention (grouped heads, Tk > Tq, causal and not, more keys than one chunk).
 * Gradients are checked in the operand's dtype and in f32.
 * Gates: ct_nmse/ct_abs of the OUTPUT dtype (cuda_test.h: f32 accumulation against the
 * reference's double, one rounding on store); AdamW and sum of squares compute in
 * double like the reference: NMSE 1e-12.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#include "loom/ops_backward.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#define HV(p) lm_tensor_as_view((p).h)
#define DV(p) lm_tensor_as_view((p).d)

static lm_ctx *g_ctx, *g_ref;

/* Gradient output dtypes to try for an operand of dtype dt: its own, and f32. */
static int grad_dtypes(lm_dtype dt, lm_dtype *out) {
    out[0] = dt;
    out[1] = LM_F32;
    return dt == LM_F32 ? 1 : 2;
}

static int all_nan(lm_ctx *g, const ct_pair *p) {
    double *got = ct_read(g, p, DV(*p));
    int64_t n = lm_tensor_numel(p->h), nan = 0;
    for (int64_t i = 0; i < n; i++) nan += isnan(got[i]);
    free(got);
    return nan == n;
}

/* A host f32 scalar holding v, and its device copy. */
static ct_pair scalar(float v) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 0, NULL, &h));
    *(float *)lm_tensor_data(h) = v;
    return ct_pair_of(h);
}

static ct_pair index_tensor(lm_dtype it, int nd, const int64_t *shape, const int64_t *vals) {
    lm_tensor *h = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), it, nd, shape, &h));
    int64_t n = lm_tensor_numel(h);
    for (int64_t i = 0; i < n; i++) {
        if (it == LM_I64) ((int64_t *)lm_tensor_data(h))[i] = vals[i];
        else ((int32_t *)lm_tensor_data(h))[i] = (int32_t)vals[i];
    }
    return ct_pair_of(h);
}

static void test_adamw(void) {
    lt_rng r = lt_rng_seed(501);
    int64_t s0[2] = {37, 50}, s1[1] = {129}, s2[2] = {8, 16};
    const int64_t *shapes[3] = {s0, s1, s2};
    int nds[3] = {2, 1, 2};
    lm_dtype gdt[3] = {LM_F32, LM_BF16, LM_F16};
    ct_pair p[3], g[3], m[3], v[3];
    lm_tensor_view ph[3], pd[3], gh[3], gd[3], mh[3], md[3], vh[3], vd[3];
    for (int i = 0; i < 3; i++) {
        if (i == 2) p[i] = ct_random_reversed(&r, LM_F32, 2, s2, 1.0, &ph[i], &pd[i]);
        else p[i] = ct_random(&r, LM_F32, nds[i], shapes[i], 1.0), ph[i] = *HV(p[i]), pd[i] = *DV(p[i]);
        g[i] = ct_random(&r, gdt[i], nds[i], shapes[i], 0.1);
        m[i] = ct_random(&r, LM_F32, nds[i], shapes[i], 0.01);
        lm_tensor *vt = lt_random_tensor(&r, LM_F32, nds[i], shapes[i], 0.01);
        float *vv = lm_tensor_data(vt);
        for (int64_t k = 0; k < lm_tensor_numel(vt); k++) vv[k] = vv[k] * vv[k]; /* second moments are >= 0 */
        v[i] = ct_pair_of(vt);
        gh[i] = *HV(g[i]), gd[i] = *DV(g[i]), mh[i] = *HV(m[i]), md[i] = *DV(m[i]), vh[i] = *HV(v[i]), vd[i] = *DV(v[i]);
    }
    float wd[3] = {0.1f, 0.0f, 0.01f};
    lm_adamw_hparams hp = {1e-3, 0.9, 0.999, 1e-8, 3, 0.5};
    LT_CHECK_OK(lm_adamw_update(g_ref, 3, ph, gh, mh, vh, wd, &hp));
    LT_CHECK_OK(lm_adamw_update(g_ctx, 3, pd, gd, md, vd, wd, &hp));
    for (int i = 0; i < 3; i++) {
        char what[64];
        snprintf(what, sizeof what, "adamw params[%d]", i);
        ct_check(g_ctx, what, &p[i], &pd[i], &ph[i], 1e-12, 1e-6);
        snprintf(what, sizeof what, "adamw m[%d]", i);
        ct_check(g_ctx, what, &m[i], &md[i], &mh[i], 1e-12, 1e-7);
        snprintf(what, sizeof what, "adamw v[%d]", i);
        ct_check(g_ctx, what, &v[i], &vd[i], &vh[i], 1e-12, 1e-9);
        ct_pair_free(&p[i]), ct_pair_free(&g[i]), ct_pair_free(&m[i]), ct_pair_free(&v[i]);
    }
}

static void test_sum_squares(void) {
    lt_rng r = lt_rng_seed(511);
    int64_t s0[2] = {1000, 37}, s1[3] = {3, 5, 7}, s3[1] = {300};
    lm_tensor_view h1, d1, h2, d2;
    ct_pair x0 = ct_random(&r, LM_F32, 2, s0, 1.0), x1 = ct_random_reversed(&r, LM_BF16, 3, s1, 2.0, &h1, &d1);
    ct_pair x3 = ct_random(&r, LM_F16, 1, s3, 3.0);
    LT_CHECK_OK(lm_tensor_view_slice(HV(x3), 0, 5, 5, 1, &h2)); /* empty */
    d2 = ct_mirror(x3.h, &h2, x3.d);
    lm_tensor_view hs[4] = {*HV(x0), h1, h2, *HV(x3)}, ds[4] = {*DV(x0), d1, d2, *DV(x3)};
    ct_pair want = scalar(NAN), got = scalar(NAN);
    LT_CHECK_OK(lm_sum_squares_out(g_ref, 4, hs, HV(want)));
    LT_CHECK_OK(lm_sum_squares_out(g_ctx, 4, ds, DV(got)));
    ct_check(g_ctx, "sum_squares", &got, DV(got), HV(want), 1e-12, 1e-6 * *(float *)lm_tensor_data(want.h));
    double *a = ct_read(g_ctx, &got, DV(got));
    LT_CHECK_OK(lm_sum_squares_out(g_ctx, 4, ds, DV(got)));
    double *b = ct_read(g_ctx, &got, DV(got));
    LT_CHECK_MSG(a[0] == b[0], "sum_squares repeat %.17g vs %.17g", a[0], b[0]);
    free(a), free(b);
    LT_CHECK_OK(lm_sum_squares_out(g_ctx, 0, NULL, DV(got)));
    double *z = ct_read(g_ctx, &got, DV(got));
    LT_CHECK_MSG(z[0] == 0.0, "sum_squares of no tensors = %g", z[0]);
    free(z);
    ct_pair_free(&x0), ct_pair_free(&x1), ct_pair_free(&x3), ct_pair_free(&want), ct_pair_free(&got);
}

static void test_rmsnorm_backward(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(521 + (uint64_t)k);
        int64_t shape[3] = {3, 50, 96}, D = 96; /* 150 rows: more than one dweight chunk */
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 3, shape, 2.0, &xh, &xd);
        ct_pair w = ct_random(&r, dt, 1, &D, 1.0), dy = ct_random(&r, dt, 3, shape, 1.0);
        ct_pair dsum = ct_random(&r, dt, 3, shape, 0.5);
        for (int fused = 0; fused < 2; fused++)
            for (int j = 0; j < ng; j++) {
                lm_tensor_view oh, od;
                ct_pair dx = ct_poisoned_strided(gts[j], 3, shape, &oh, &od), dw = ct_poisoned(gts[j], 1, &D);
                lm_tensor *want = lt_poisoned_tensor(gts[j], 3, shape), *want_w = lt_poisoned_tensor(gts[j], 1, &D);
                if (fused) {
                    LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ref, &xh, HV(w), 1e-5f, HV(dy), HV(dsum),
                                                            lm_tensor_as_view(want), lm_tensor_as_view(want_w)));
                    LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, &xd, DV(w), 1e-5f, DV(dy), DV(dsum), &od, DV(dw)));
                } else {
                    LT_CHECK_OK(lm_rmsnorm_backward_out(g_ref, &xh, HV(w), 1e-5f, HV(dy), lm_tensor_as_view(want),
                                                        lm_tensor_as_view(want_w)));
                    LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, &xd, DV(w), 1e-5f, DV(dy), &od, DV(dw)));
                }
                char what[96];
                snprintf(what, sizeof what, "%s dx %s -> %s", fused ? "add_rmsnorm" : "rmsnorm", lm_dtype_name(dt),
                         lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dx, &od, lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 10.0));
                snprintf(what, sizeof what, "%s dweight %s -> %s", fused ? "add_rmsnorm" : "rmsnorm",
                         lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dw, DV(dw), lm_tensor_as_view(want_w), ct_nmse(gts[j]), ct_abs(gts[j], 50.0));
                ct_pair_free(&dx), ct_pair_free(&dw);
                lm_tensor_destroy(want), lm_tensor_destroy(want_w);
            }
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&dy), ct_pair_free(&dsum);
    }
}

static void test_swiglu_backward(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(531 + (uint64_t)k);
        int64_t shape[3] = {6, 33, 40};
        lm_tensor_view gh, gd;
        ct_pair gate = ct_random_reversed(&r, dt, 3, shape, 3.0, &gh, &gd);
        ct_pair up = ct_random(&r, dt, 3, shape, 1.0), dy = ct_random(&r, dt, 3, shape, 1.0);
        for (int j = 0; j < ng; j++) {
            lm_tensor_view oh, od;
            ct_pair dg = ct_poisoned_strided(gts[j], 3, shape, &oh, &od), du = ct_poisoned(gts[j], 3, shape);
            lm_tensor *want_g = lt_poisoned_tensor(gts[j], 3, shape), *want_u = lt_poisoned_tensor(gts[j], 3, shape);
            LT_CHECK_OK(lm_swiglu_backward_out(g_ref, &gh, HV(up), HV(dy), lm_tensor_as_view(want_g),
                                               lm_tensor_as_view(want_u)));
            LT_CHECK_OK(lm_swiglu_backward_out(g_ctx, &gd, DV(up), DV(dy), &od, DV(du)));
            char what[64];
            snprintf(what, sizeof what, "swiglu dgate %s -> %s", lm_dtype_name(dt), lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &dg, &od, lm_tensor_as_view(want_g), ct_nmse(gts[j]), ct_abs(gts[j], 10.0));
            snprintf(what, sizeof what, "swiglu dup %s -> %s", lm_dtype_name(dt), lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &du, DV(du), lm_tensor_as_view(want_u), ct_nmse(gts[j]), ct_abs(gts[j], 10.0));
            ct_pair_free(&dg), ct_pair_free(&du);
            lm_tensor_destroy(want_g), lm_tensor_destroy(want_u);
        }
        ct_pair_free(&gate), ct_pair_free(&up), ct_pair_free(&dy);
    }
}

static void test_rope_backward(void) {
    int64_t D = 16, half = 8, shape[4] = {2, 9, 3, 16}, bshape[2] = {3, 16}, pshape[2] = {2, 9};
    lm_tensor *fh = NULL;
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 1, &half, &fh));
    for (int i = 0; i < half; i++) ((float *)lm_tensor_data(fh))[i] = (float)pow(10000.0, -2.0 * i / (double)D);
    ct_pair freq = ct_pair_of(fh);
    int64_t pos[18];
    for (int i = 0; i < 18; i++) pos[i] = 4000 + 37 * i;
    ct_pair positions = index_tensor(LM_I64, 2, pshape, pos);
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(541 + (uint64_t)k);
        lm_tensor_view yh, yd;
        ct_pair dy = ct_random_reversed(&r, dt, 4, shape, 1.0, &yh, &yd);
        for (int style = 0; style < 2; style++)
            for (int j = 0; j < ng; j++) {
                lm_rope_params ph = {0}, pd = {0};
                ph.style = pd.style = style ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF;
                ph.attn_factor = pd.attn_factor = 0.8f;
                ph.inv_freq = HV(freq), pd.inv_freq = DV(freq);
                if (style) ph.positions = HV(positions), pd.positions = DV(positions);
                else ph.pos_offset = pd.pos_offset = 123;
                lm_tensor_view oh, od;
                ct_pair dx = ct_poisoned_strided(gts[j], 4, shape, &oh, &od), db = ct_poisoned(gts[j], 2, bshape);
                lm_tensor *want = lt_poisoned_tensor(gts[j], 4, shape), *want_b = lt_poisoned_tensor(gts[j], 2, bshape);
                LT_CHECK_OK(lm_rope_backward_out(g_ref, &yh, &ph, lm_tensor_as_view(want), lm_tensor_as_view(want_b)));
                LT_CHECK_OK(lm_rope_backward_out(g_ctx, &yd, &pd, &od, DV(db)));
                char what[64];
                snprintf(what, sizeof what, "rope dx style %d %s -> %s", style, lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dx, &od, lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 3.0));
                snprintf(what, sizeof what, "rope dbias style %d %s -> %s", style, lm_dtype_name(dt),
                         lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &db, DV(db), lm_tensor_as_view(want_b), ct_nmse(gts[j]), ct_abs(gts[j], 10.0));
                ct_pair_free(&dx), ct_pair_free(&db);
                lm_tensor_destroy(want), lm_tensor_destroy(want_b);
            }
        ct_pair_free(&dy);
    }
    ct_pair_free(&freq), ct_pair_free(&positions);
}

static void test_embedding_backward(void) {
    int64_t V = 3000, D = 40, is[2] = {8, 512}, os[3] = {8, 512, 40}, ts[2] = {3000, 40};
    static int64_t ids[8 * 512];
    lt_rng ri = lt_rng_seed(551);
    for (int i = 0; i < 8 * 512; i++) ids[i] = i % 7 == 0 ? 5 : lt_rng_int(&ri, 0, 2000); /* rows > 2000 unused */
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(561 + (uint64_t)k);
        lm_tensor_view yh, yd;
        ct_pair dy = ct_random_reversed(&r, dt, 3, os, 1.0, &yh, &yd);
        for (int j = 0; j < ng; j++) {
            ct_pair id = index_tensor(j ? LM_I64 : LM_I32, 2, is, ids);
            lm_tensor_view oh, od;
            ct_pair dt_out = ct_poisoned_strided(gts[j], 2, ts, &oh, &od);
            lm_tensor *want = lt_poisoned_tensor(gts[j], 2, ts);
            LT_CHECK_OK(lm_embedding_backward_out(g_ref, HV(id), &yh, lm_tensor_as_view(want)));
            LT_CHECK_OK(lm_embedding_backward_out(g_ctx, DV(id), &yd, &od));
            char what[64];
            snprintf(what, sizeof what, "embedding dtable %s -> %s", lm_dtype_name(dt), lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &dt_out, &od, lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 30.0));
            double *a = ct_read(g_ctx, &dt_out, &od);
            LT_CHECK_OK(lm_embedding_backward_out(g_ctx, DV(id), &yd, &od));
            double *b = ct_read(g_ctx, &dt_out, &od);
            LT_CHECK_MSG(memcmp(a, b, sizeof(double) * (size_t)(V * D)) == 0, "embedding_backward is not repeatable");
            free(a), free(b);
            ct_pair_free(&id), ct_pair_free(&dt_out);
            lm_tensor_destroy(want);
        }
        ct_pair_free(&dy);
    }
    /* a bad id: LM_OUT_OF_RANGE naming it, nothing written */
    int64_t bs[1] = {6}, bad[6] = {0, 1, 2, 3000, 4, -1}, bos[2] = {6, 40};
    lt_rng r = lt_rng_seed(571);
    ct_pair id = index_tensor(LM_I64, 1, bs, bad), dy = ct_random(&r, LM_F32, 2, bos, 1.0);
    ct_pair out = ct_poisoned(LM_F32, 2, ts);
    LT_CHECK_STATUS(lm_embedding_backward_out(g_ctx, DV(id), DV(dy), DV(out)), LM_OUT_OF_RANGE);
    LT_CHECK_MSG(strstr(lm_last_error(), "id 3000 at position 3") != NULL, "message: %s", lm_last_error());
    LT_CHECK(all_nan(g_ctx, &out));
    ct_pair_free(&id), ct_pair_free(&dy), ct_pair_free(&out);
}

static void test_cross_entropy_backward(void) {
    int64_t shape[2] = {9, 1000}, tn[1] = {9};
    int64_t tgt[9] = {3, -100, 999, 0, 500, -100, 7, 7, 123}, none[9], badt[9] = {3, 1, 2, 1000, 4, 5, 6, 7, 8};
    for (int i = 0; i < 9; i++) none[i] = -100;
    ct_pair dloss = scalar(1.7f);
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(581 + (uint64_t)k);
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 2, shape, 3.0, &xh, &xd);
        for (int all_ignored = 0; all_ignored < 2; all_ignored++)
            for (int j = 0; j < ng; j++) {
                ct_pair t = index_tensor(j ? LM_I64 : LM_I32, 1, tn, all_ignored ? none : tgt);
                lm_tensor_view oh, od;
                ct_pair dx = ct_poisoned_strided(gts[j], 2, shape, &oh, &od);
                lm_tensor *want = lt_poisoned_tensor(gts[j], 2, shape);
                LT_CHECK_OK(lm_cross_entropy_backward_out(g_ref, &xh, HV(t), -100, HV(dloss), lm_tensor_as_view(want)));
                LT_CHECK_OK(lm_cross_entropy_backward_out(g_ctx, &xd, DV(t), -100, DV(dloss), &od));
                char what[80];
                snprintf(what, sizeof what, "cross_entropy dlogits%s %s -> %s", all_ignored ? " (none counted)" : "",
                         lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dx, &od, lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 1.0));
                ct_pair_free(&t), ct_pair_free(&dx);
                lm_tensor_destroy(want);
            }
        ct_pair t = index_tensor(LM_I64, 1, tn, badt);
        ct_pair dx = ct_poisoned(dt, 2, shape);
        LT_CHECK_STATUS(lm_cross_entropy_backward_out(g_ctx, &xd, DV(t), -100, DV(dloss), DV(dx)), LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "targets[3] = 1000") != NULL, "message: %s", lm_last_error());
        LT_CHECK(all_nan(g_ctx, &dx));
        ct_pair_free(&t), ct_pair_free(&dx), ct_pair_free(&x);
    }
    ct_pair_free(&dloss);
}

/* One matmul backward case: a, b, dout host/device views; gradients of dtype gdt
 * (da contiguous or strided, db contiguous or the transposed view of a [N, K] buffer). */
static void matmul_case(const char *name, const lm_tensor_view *ah, const lm_tensor_view *ad, const lm_tensor_view *bh,
                        const lm_tensor_view *bd, const lm_tensor_view *dh, const lm_tensor_view *dd, lm_dtype gdt,
                        int da_strided, int db_transposed) {
    lm_tensor_view gah, gad, gbh, gbd;
    ct_pair ga, gb;
    if (da_strided) ga = ct_poisoned_strided(gdt, ah->ndim, ah->shape, &gah, &gad);
    else ga = ct_poisoned(gdt, ah->ndim, ah->shape), gah = *HV(ga), gad = *DV(ga);
    if (db_transposed) {
        int64_t ts[2] = {bh->shape[1], bh->shape[0]};
        gb = ct_poisoned(gdt, 2, ts);
        LT_CHECK_OK(lm_tensor_view_transpose(HV(gb), 0, 1, &gbh));
        gbd = ct_mirror(gb.h, &gbh, gb.d);
    } else gb = ct_poisoned(gdt, bh->ndim, bh->shape), gbh = *HV(gb), gbd = *DV(gb);
    lm_tensor *wa = lt_poisoned_tensor(gdt, ah->ndim, ah->shape), *wb = lt_poisoned_tensor(gdt, bh->ndim, bh->shape);
    LT_CHECK_OK(lm_matmul_backward_out(g_ref, ah, bh, dh, lm_tensor_as_view(wa), lm_tensor_as_view(wb)));
    LT_CHECK_OK(lm_matmul_backward_out(g_ctx, ad, bd, dd, &gad, &gbd));
    char what[96];
    snprintf(what, sizeof what, "matmul %s da %s -> %s", name, lm_dtype_name(ah->dtype), lm_dtype_name(gdt));
    ct_check(g_ctx, what, &ga, &gad, lm_tensor_as_view(wa), ct_nmse(gdt), ct_abs(gdt, 20.0));
    snprintf(what, sizeof what, "matmul %s db %s -> %s", name, lm_dtype_name(ah->dtype), lm_dtype_name(gdt));
    ct_check(g_ctx, what, &gb, &gbd, lm_tensor_as_view(wb), ct_nmse(gdt), ct_abs(gdt, 20.0));
    ct_pair_free(&ga), ct_pair_free(&gb);
    lm_tensor_destroy(wa), lm_tensor_destroy(wb);
}

static void test_matmul_backward(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(591 + (uint64_t)k);
        /* Linear: a [2, 5, 24] @ W^T with W [16, 24]; db is W's gradient, transposed */
        int64_t as[3] = {2, 5, 24}, ws[2] = {16, 24}, ds[3] = {2, 5, 16};
        ct_pair a = ct_random(&r, dt, 3, as, 1.0), w = ct_random(&r, dt, 2, ws, 1.0), d = ct_random(&r, dt, 3, ds, 1.0);
        lm_tensor_view bh, bd;
        LT_CHECK_OK(lm_tensor_view_transpose(HV(w), 0, 1, &bh));
        bd = ct_mirror(w.h, &bh, w.d);
        for (int j = 0; j < ng; j++) matmul_case("linear", HV(a), DV(a), &bh, &bd, HV(d), DV(d), gts[j], 0, 1);
        /* broadcast: a [3, 1, 7, 9] (permuted) @ b [4, 9, 5] -> [3, 4, 7, 5]: both gradients sum */
        int64_t a4[4] = {3, 1, 7, 9}, b3[3] = {4, 9, 5}, d4[4] = {3, 4, 7, 5};
        lm_tensor_view ah, ad;
        ct_pair a2 = ct_random_reversed(&r, dt, 4, a4, 1.0, &ah, &ad), b2 = ct_random(&r, dt, 3, b3, 1.0);
        ct_pair d2 = ct_random(&r, dt, 4, d4, 1.0);
        for (int j = 0; j < ng; j++) matmul_case("broadcast", &ah, &ad, HV(b2), DV(b2), HV(d2), DV(d2), gts[j], 1, 0);
        /* batched, nothing broadcast: a [4, 7, 9] @ b [4, 9, 5] */
        int64_t a3[3] = {4, 7, 9}, d3[3] = {4, 7, 5};
        ct_pair a3p = ct_random(&r, dt, 3, a3, 1.0), d3p = ct_random(&r, dt, 3, d3, 1.0);
        for (int j = 0; j < ng; j++) matmul_case("batched", HV(a3p), DV(a3p), HV(b2), DV(b2), HV(d3p), DV(d3p), gts[j], 0, 0);
        ct_pair_free(&a), ct_pair_free(&w), ct_pair_free(&d), ct_pair_free(&a2), ct_pair_free(&b2), ct_pair_free(&d2);
        ct_pair_free(&a3p), ct_pair_free(&d3p);
    }
    /* mixed: a f32 [6, 9] @ b bf16 [9, 4] (gradients f32 and bf16) */
    lt_rng r = lt_rng_seed(599);
    int64_t as[2] = {6, 9}, bs[2] = {9, 4}, ds[2] = {6, 4};
    ct_pair a = ct_random(&r, LM_F32, 2, as, 1.0), b = ct_random(&r, LM_BF16, 2, bs, 1.0), d = ct_random(&r, LM_F32, 2, ds, 1.0);
    matmul_case("mixed", HV(a), DV(a), HV(b), DV(b), HV(d), DV(d), LM_F32, 0, 0);
    ct_pair_free(&a), ct_pair_free(&b), ct_pair_free(&d);
}

static void test_attention_backward(void) {
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(601 + (uint64_t)k);
        /* grouped heads (Hq 4, Hkv 2), Tk > Tq (a cached prefix), 150 keys: more than one chunk */
        int64_t qs[4] = {2, 4, 140, 32}, ks[4] = {2, 2, 150, 32}, vs[4] = {2, 2, 150, 24}, os[4] = {2, 4, 140, 24};
        lm_tensor_view qh, qd;
        ct_pair q = ct_random_reversed(&r, dt, 4, qs, 1.0, &qh, &qd);
        ct_pair kk = ct_random(&r, dt, 4, ks, 1.0), v = ct_random(&r, dt, 4, vs, 1.0), dy = ct_random(&r, dt, 4, os, 1.0);
        for (int causal = 0; causal < 2; causal++)
            for (int j = 0; j < ng; j++) {
                lm_tensor_view dqh, dqd;
                ct_pair dq = ct_poisoned_strided(gts[j], 4, qs, &dqh, &dqd);
                ct_pair dk = ct_poisoned(gts[j], 4, ks), dv = ct_poisoned(gts[j], 4, vs);
                lm_tensor *wq = lt_poisoned_tensor(gts[j], 4, qs), *wk = lt_poisoned_tensor(gts[j], 4, ks);
                lm_tensor *wv = lt_poisoned_tensor(gts[j], 4, vs);
                LT_CHECK_OK(lm_attention_backward_out(g_ref, &qh, HV(kk), HV(v), HV(dy), 0.2f, causal,
                                                      lm_tensor_as_view(wq), lm_tensor_as_view(wk), lm_tensor_as_view(wv)));
                LT_CHECK_OK(lm_attention_backward_out(g_ctx, &qd, DV(kk), DV(v), DV(dy), 0.2f, causal, &dqd, DV(dk), DV(dv)));
                char what[80];
                snprintf(what, sizeof what, "attention dq causal %d %s -> %s", causal, lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dq, &dqd, lm_tensor_as_view(wq), ct_nmse(gts[j]), ct_abs(gts[j], 5.0));
                snprintf(what, sizeof what, "attention dk causal %d %s -> %s", causal, lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dk, DV(dk), lm_tensor_as_view(wk), ct_nmse(gts[j]), ct_abs(gts[j], 5.0));
                snprintf(what, sizeof what, "attention dv causal %d %s -> %s", causal, lm_dtype_name(dt), lm_dtype_name(gts[j]));
                ct_check(g_ctx, what, &dv, DV(dv), lm_tensor_as_view(wv), ct_nmse(gts[j]), ct_abs(gts[j], 20.0));
                ct_pair_free(&dq), ct_pair_free(&dk), ct_pair_free(&dv);
                lm_tensor_destroy(wq), lm_tensor_destroy(wk), lm_tensor_destroy(wv);
            }
        ct_pair_free(&q), ct_pair_free(&kk), ct_pair_free(&v), ct_pair_free(&dy);
    }
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_adamw);
    LT_RUN(test_sum_squares);
    LT_RUN(test_rmsnorm_backward);
    LT_RUN(test_swiglu_backward);
    LT_RUN(test_rope_backward);
    LT_RUN(test_embedding_backward);
    LT_RUN(test_cross_entropy_backward);
    LT_RUN(test_matmul_backward);
    LT_RUN(test_attention_backward);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
