/* CUDA backward and optimizer operators against the CPU reference, through the public
 * API (loom/ops_backward.h) on a CUDA context vs the same call on a CPU context forced
 * to LM_IMPL_REF, on the same rounded random inputs, into NaN-poisoned outputs:
 * sum of squares (mixed dtypes, an empty tensor, n = 0, bitwise repeatable), RMSNorm
 * and fused add + RMSNorm (the readable path: permuted inputs, strided dx, dweight
 * over more rows than one chunk; the tuned row-vector path: row-contiguous [rows, D]
 * with D = 64..4096 so teams of 1, 2, 4 and 8 warps and 1, 2 and 4 vectors per lane
 * occur, more rows than one grid pass, dx-only and dweight-only calls, dweight and dx
 * bitwise repeatable), SwiGLU, RoPE (both styles, explicit and implicit positions, dbias),
 * embedding with duplicate ids (i32/i64, unused rows 0, bitwise repeatable, bad id
 * leaves dtable untouched; contiguous rows on the vector kernel; the accumulating form
 * on both kernels, unused rows untouched), cross-entropy
 * (ignored rows, none counted, bad target),
 * fused linear + cross-entropy (loss, dx, dw in chunks of 4 rows and in one chunk;
 * strided x and dx, ignored rows, none counted, bad target leaves dx untouched; the
 * grads form, loss and gradients at dloss = 1 from one pass, the same cases;
 * bf16/f16 logits are rounded to that dtype, so those gates are the dtype's: NMSE
 * 1e-3 / 3e-5),
 * matmul, written and accumulated (the Linear case with a transposed weight gradient
 * and the batched case on the GEMM path, a broadcast case whose gradients sum over
 * batches, f32 x bf16),
 * attention (grouped heads, Tk > Tq, causal and not, more keys than one chunk), and
 * the tensor-core flash attention forward and backward, in their wgmma form (on an
 * sm_90 device) and their mma.sync form (LOOM_FLASH_WGMMA=0) (bf16, head dims 64 and
 * 128, [B, T, H, D] buffers viewed as [B, H, T, D], ragged tiles, 5 query tiles, Tk >
 * Tq, an odd number of grouped query rows, gradients in
 * bf16 and f32; gate NMSE 1e-4: probabilities and dS are rounded to bf16 before their
 * products, as in every bf16 flash kernel), also with its statistics kept
 * (lm_attention_lse_out: the log-sum-exp against a double computation, gate 1e-4
 * absolute; the backward from the saved out and lse; a window of 37 keys).
 * Gradients are checked in the operand's dtype and in f32.
 * Gates: ct_nmse/ct_abs of the OUTPUT dtype (cuda_test.h: f32 accumulation against the
 * reference's double, one rounding on store); sum of squares computes in double like
 * the reference: NMSE 1e-12. AdamW is tested in test_cuda_optim.c.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#include "loom/ops_backward.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else
#include "ops/cuda/cuda_backward.h"

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

/* The tuned path: row-contiguous [2, rows / 2, D] views on 16-byte boundaries. The
 * (dtype, D) pairs give teams of 1 (bf16 64, 512, 896), 2 (f32 896, bf16 1536), 4
 * (bf16 4096) and 8 (f32 4096) warps with 1, 2 or 4 vectors per lane (teams of one warp
 * run the staged form unless LOOM_CUDA_NORM_BWD_STAGED=0); 2500 rows of D 64 take two
 * passes of the grid. */
static void check_rmsnorm_backward_rows(void) {
    static const struct {
        lm_dtype dt;
        int64_t rows, D;
        int fused;
    } cs[] = {{LM_BF16, 2500, 64, 1},  {LM_BF16, 600, 512, 0},  {LM_BF16, 600, 896, 1}, {LM_F32, 300, 896, 1},
              {LM_F16, 300, 896, 0},   {LM_BF16, 200, 1536, 1}, {LM_BF16, 150, 4096, 1}, {LM_F32, 100, 4096, 0}};
    for (size_t c = 0; c < sizeof cs / sizeof cs[0]; c++) {
        lm_dtype dt = cs[c].dt, gts[2];
        int ng = grad_dtypes(dt, gts), fused = cs[c].fused;
        int64_t D = cs[c].D, shape[3] = {2, cs[c].rows / 2, cs[c].D};
        lt_rng r = lt_rng_seed(541 + (uint64_t)c);
        ct_pair x = ct_random(&r, dt, 3, shape, 2.0), w = ct_random(&r, dt, 1, &D, 1.0);
        ct_pair dy = ct_random(&r, dt, 3, shape, 1.0), dsum = ct_random(&r, dt, 3, shape, 0.5);
        for (int j = 0; j < ng; j++) {
            ct_pair dx = ct_poisoned(gts[j], 3, shape), dw = ct_poisoned(gts[j], 1, &D);
            lm_tensor *want = lt_poisoned_tensor(gts[j], 3, shape), *want_w = lt_poisoned_tensor(gts[j], 1, &D);
            if (fused) {
                LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ref, HV(x), HV(w), 1e-5f, HV(dy), HV(dsum),
                                                        lm_tensor_as_view(want), lm_tensor_as_view(want_w)));
                LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, DV(x), DV(w), 1e-5f, DV(dy), DV(dsum), DV(dx), DV(dw)));
            } else {
                LT_CHECK_OK(lm_rmsnorm_backward_out(g_ref, HV(x), HV(w), 1e-5f, HV(dy), lm_tensor_as_view(want),
                                                    lm_tensor_as_view(want_w)));
                LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, DV(x), DV(w), 1e-5f, DV(dy), DV(dx), DV(dw)));
            }
            char what[128];
            snprintf(what, sizeof what, "%s rows %lld D %lld dx %s -> %s", fused ? "add_rmsnorm" : "rmsnorm",
                     (long long)cs[c].rows, (long long)D, lm_dtype_name(dt), lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &dx, DV(dx), lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 10.0));
            snprintf(what, sizeof what, "%s rows %lld D %lld dweight %s -> %s", fused ? "add_rmsnorm" : "rmsnorm",
                     (long long)cs[c].rows, (long long)D, lm_dtype_name(dt), lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &dw, DV(dw), lm_tensor_as_view(want_w), ct_nmse(gts[j]),
                     ct_abs(gts[j], 4.0 * sqrt((double)cs[c].rows)));
            if (c == 0 || c == 2) { /* repeatable bits; dx alone and dweight alone give the same values */
                double *dx1 = ct_read(g_ctx, &dx, DV(dx)), *dw1 = ct_read(g_ctx, &dw, DV(dw));
                ct_pair dx2 = ct_poisoned(gts[j], 3, shape), dw2 = ct_poisoned(gts[j], 1, &D);
                const lm_tensor_view *ds = fused ? DV(dsum) : NULL;
                LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, DV(x), DV(w), 1e-5f, DV(dy), ds, DV(dx2), NULL));
                LT_CHECK_OK(lm_add_rmsnorm_backward_out(g_ctx, DV(x), DV(w), 1e-5f, DV(dy), ds, NULL, DV(dw2)));
                if (!fused) { /* dsum = NULL above is the plain RMSNorm backward */
                    ct_pair dw3 = ct_poisoned(gts[j], 1, &D);
                    LT_CHECK_OK(lm_rmsnorm_backward_out(g_ctx, DV(x), DV(w), 1e-5f, DV(dy), NULL, DV(dw3)));
                    double *dw3v = ct_read(g_ctx, &dw3, DV(dw3));
                    LT_CHECK_MSG(memcmp(dw1, dw3v, sizeof(double) * (size_t)D) == 0, "rmsnorm dweight-only differs");
                    free(dw3v), ct_pair_free(&dw3);
                }
                double *dx2v = ct_read(g_ctx, &dx2, DV(dx2)), *dw2v = ct_read(g_ctx, &dw2, DV(dw2));
                LT_CHECK_MSG(memcmp(dx1, dx2v, sizeof(double) * (size_t)(cs[c].rows * D)) == 0,
                             "%s: dx-only call differs from dx + dweight", what);
                LT_CHECK_MSG(memcmp(dw1, dw2v, sizeof(double) * (size_t)D) == 0,
                             "%s: dweight-only call differs from dx + dweight", what);
                free(dx1), free(dw1), free(dx2v), free(dw2v);
                ct_pair_free(&dx2), ct_pair_free(&dw2);
            }
            ct_pair_free(&dx), ct_pair_free(&dw);
            lm_tensor_destroy(want), lm_tensor_destroy(want_w);
        }
        ct_pair_free(&x), ct_pair_free(&w), ct_pair_free(&dy), ct_pair_free(&dsum);
    }
}

/* The staged form (teams of one warp: the next row copied into shared memory while the
 * current one is reduced) and the register form (LOOM_CUDA_NORM_BWD_STAGED=0), each
 * against the reference. */
static void test_rmsnorm_backward_rows(void) {
    check_rmsnorm_backward_rows();
    setenv("LOOM_CUDA_NORM_BWD_STAGED", "0", 1);
    check_rmsnorm_backward_rows();
    unsetenv("LOOM_CUDA_NORM_BWD_STAGED");
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
    /* contiguous bf16 everywhere: the 8-wide vector path, with and without dgate */
    lt_rng r = lt_rng_seed(539);
    int64_t shape[2] = {12, 64};
    ct_pair gate = ct_random(&r, LM_BF16, 2, shape, 3.0), up = ct_random(&r, LM_BF16, 2, shape, 1.0);
    ct_pair dy = ct_random(&r, LM_BF16, 2, shape, 1.0);
    for (int with_dg = 0; with_dg < 2; with_dg++) {
        ct_pair dg = ct_poisoned(LM_BF16, 2, shape), du = ct_poisoned(LM_BF16, 2, shape);
        lm_tensor *want_g = lt_poisoned_tensor(LM_BF16, 2, shape), *want_u = lt_poisoned_tensor(LM_BF16, 2, shape);
        LT_CHECK_OK(lm_swiglu_backward_out(g_ref, HV(gate), HV(up), HV(dy), lm_tensor_as_view(want_g),
                                           lm_tensor_as_view(want_u)));
        LT_CHECK_OK(lm_swiglu_backward_out(g_ctx, DV(gate), DV(up), DV(dy), with_dg ? DV(dg) : NULL, DV(du)));
        if (with_dg)
            ct_check(g_ctx, "swiglu dgate bf16 contiguous (vector path)", &dg, DV(dg), lm_tensor_as_view(want_g),
                     ct_nmse(LM_BF16), ct_abs(LM_BF16, 10.0));
        else
            LT_CHECK(all_nan(g_ctx, &dg));
        ct_check(g_ctx, "swiglu dup bf16 contiguous (vector path)", &du, DV(du), lm_tensor_as_view(want_u),
                 ct_nmse(LM_BF16), ct_abs(LM_BF16, 10.0));
        ct_pair_free(&dg), ct_pair_free(&du);
        lm_tensor_destroy(want_g), lm_tensor_destroy(want_u);
    }
    ct_pair_free(&gate), ct_pair_free(&up), ct_pair_free(&dy);
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
            /* contiguous dout and table rows: the 16-byte vector kernel, the same sums */
            ct_pair dyc = ct_pair_of(lt_poisoned_tensor(dt, 3, os)), tc = ct_poisoned(gts[j], 2, ts);
            LT_CHECK_OK(lm_tensor_view_copy(NULL, HV(dyc), &yh));
            LT_CHECK_OK(lm_tensor_view_copy(g_ctx, DV(dyc), &yd));
            LT_CHECK_OK(lm_embedding_backward_out(g_ctx, DV(id), DV(dyc), DV(tc)));
            snprintf(what, sizeof what, "embedding dtable %s -> %s (vector path)", lm_dtype_name(dt),
                     lm_dtype_name(gts[j]));
            ct_check(g_ctx, what, &tc, DV(tc), lm_tensor_as_view(want), ct_nmse(gts[j]), ct_abs(gts[j], 30.0));
            /* accumulating into a random table (rows > 2000 unused: left as they were), on
             * the readable kernel (reversed dout) and the vector kernel (contiguous dout) */
            for (int vec = 0; vec < 2; vec++) {
                lt_rng rt = lt_rng_seed(571 + (uint64_t)(4 * k + 2 * j + vec));
                ct_pair ta = ct_random(&rt, gts[j], 2, ts, 1.0);
                lm_tensor *wa = NULL;
                LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), gts[j], 2, ts, &wa));
                LT_CHECK_OK(lm_tensor_view_copy(NULL, lm_tensor_as_view(wa), HV(ta)));
                LT_CHECK_OK(lm_embedding_backward_acc_out(g_ref, HV(id), &yh, lm_tensor_as_view(wa)));
                LT_CHECK_OK(lm_embedding_backward_acc_out(g_ctx, DV(id), vec ? DV(dyc) : &yd, DV(ta)));
                snprintf(what, sizeof what, "embedding dtable += %s -> %s (%s)", lm_dtype_name(dt), lm_dtype_name(gts[j]),
                         vec ? "vector path" : "readable");
                ct_check(g_ctx, what, &ta, DV(ta), lm_tensor_as_view(wa), ct_nmse(gts[j]), ct_abs(gts[j], 30.0));
                double *got = ct_read(g_ctx, &ta, DV(ta)), *init = lt_view_to_f64(HV(ta));
                LT_CHECK_MSG(memcmp(got + 2001 * D, init + 2001 * D, sizeof(double) * (size_t)((V - 2001) * D)) == 0,
                             "%s: an unused row changed", what);
                free(got), free(init);
                ct_pair_free(&ta);
                lm_tensor_destroy(wa);
            }
            ct_pair_free(&dyc), ct_pair_free(&tc);
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

/* Gates of the fused linear + cross-entropy: its logits and dlogits are rounded to
 * the operands' dtype (bf16 keeps 8 bits), so errors follow that dtype, not f32. */
static double lce_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-10 : dt == LM_BF16 ? 1e-3 : 3e-5; }

/* The device loss against the reference's (NaN when no row is counted). */
static void lce_check_loss(const char *what, const ct_pair *loss, const lm_tensor *want, lm_dtype dt, int all_ignored) {
    if (all_ignored) {
        double *got = ct_read(g_ctx, loss, DV(*loss));
        LT_CHECK_MSG(isnan(got[0]), "%s: %g, expected NaN", what, got[0]);
        free(got);
    } else {
        /* logits are rounded to the operands' dtype before the softmax (as autocast does) */
        ct_check(g_ctx, what, loss, DV(*loss), lm_tensor_as_view(want), lce_nmse(dt),
                 dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 5e-2 : 5e-3);
    }
}

static void test_linear_cross_entropy(void) {
    int64_t N = 11, H = 24, V = 300, xs[2] = {N, H}, ws[2] = {V, H}, tn[1] = {N};
    int64_t tgt[11] = {3, -100, 299, 0, 150, -100, 7, 7, 123, 298, 1}, none[11], badt[11] = {3, 1, 2, 300};
    for (int i = 0; i < 11; i++) none[i] = -100;
    ct_pair dloss = scalar(1.7f), one = scalar(1.0f);
    for (int k = 0; k < 3; k++) {
        lm_dtype dt = ct_floats[k], gts[2];
        int ng = grad_dtypes(dt, gts);
        lt_rng r = lt_rng_seed(611 + (uint64_t)k);
        lm_tensor_view xh, xd;
        ct_pair x = ct_random_reversed(&r, dt, 2, xs, 1.0, &xh, &xd), w = ct_random(&r, dt, 2, ws, 1.0);
        for (int chunked = 0; chunked < 2; chunked++)
            for (int all_ignored = 0; all_ignored < 2; all_ignored++)
                for (int j = 0; j < ng; j++) {
                    lm__cuda_linear_ce_set_chunk_elems(chunked ? 4 * V : 0);
                    ct_pair t = index_tensor(j ? LM_I64 : LM_I32, 1, tn, all_ignored ? none : tgt);
                    ct_pair loss = ct_poisoned(LM_F32, 0, NULL);
                    lm_tensor *want_loss = lt_poisoned_tensor(LM_F32, 0, NULL);
                    LT_CHECK_OK(lm_linear_cross_entropy_out(g_ref, &xh, HV(w), HV(t), -100, lm_tensor_as_view(want_loss)));
                    LT_CHECK_OK(lm_linear_cross_entropy_out(g_ctx, &xd, DV(w), DV(t), -100, DV(loss)));
                    char what[96];
                    snprintf(what, sizeof what, "linear_cross_entropy loss%s%s %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt));
                    lce_check_loss(what, &loss, want_loss, dt, all_ignored);
                    lm_tensor_view dxh, dxd;
                    ct_pair dx = ct_poisoned_strided(gts[j], 2, xs, &dxh, &dxd), dw = ct_poisoned(gts[j], 2, ws);
                    lm_tensor *wdx = lt_poisoned_tensor(gts[j], 2, xs), *wdw = lt_poisoned_tensor(gts[j], 2, ws);
                    LT_CHECK_OK(lm_linear_cross_entropy_backward_out(g_ref, &xh, HV(w), HV(t), -100, HV(dloss),
                                                                     lm_tensor_as_view(wdx), lm_tensor_as_view(wdw)));
                    LT_CHECK_OK(lm_linear_cross_entropy_backward_out(g_ctx, &xd, DV(w), DV(t), -100, DV(dloss), &dxd,
                                                                     DV(dw)));
                    snprintf(what, sizeof what, "linear_cross_entropy dx%s%s %s -> %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt), lm_dtype_name(gts[j]));
                    ct_check(g_ctx, what, &dx, &dxd, lm_tensor_as_view(wdx), lce_nmse(dt), ct_abs(dt, 2.0));
                    snprintf(what, sizeof what, "linear_cross_entropy dw%s%s %s -> %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt), lm_dtype_name(gts[j]));
                    ct_check(g_ctx, what, &dw, DV(dw), lm_tensor_as_view(wdw), lce_nmse(dt), ct_abs(dt, 2.0));
                    /* the grads form: the loss and the gradients at dloss = 1 from one pass */
                    LT_CHECK_OK(lm_linear_cross_entropy_backward_out(g_ref, &xh, HV(w), HV(t), -100, HV(one),
                                                                     lm_tensor_as_view(wdx), lm_tensor_as_view(wdw)));
                    ct_pair l2 = ct_poisoned(LM_F32, 0, NULL), dw2 = ct_poisoned(gts[j], 2, ws);
                    lm_tensor_view dx2h, dx2d;
                    ct_pair dx2 = ct_poisoned_strided(gts[j], 2, xs, &dx2h, &dx2d);
                    LT_CHECK_OK(lm_linear_cross_entropy_grads_out(g_ctx, &xd, DV(w), DV(t), -100, DV(l2), &dx2d, DV(dw2)));
                    snprintf(what, sizeof what, "linear_cross_entropy grads: loss%s%s %s -> %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt), lm_dtype_name(gts[j]));
                    lce_check_loss(what, &l2, want_loss, dt, all_ignored);
                    snprintf(what, sizeof what, "linear_cross_entropy grads: dx%s%s %s -> %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt), lm_dtype_name(gts[j]));
                    ct_check(g_ctx, what, &dx2, &dx2d, lm_tensor_as_view(wdx), lce_nmse(dt), ct_abs(dt, 2.0));
                    snprintf(what, sizeof what, "linear_cross_entropy grads: dw%s%s %s -> %s", chunked ? " (chunked)" : "",
                             all_ignored ? " (none counted)" : "", lm_dtype_name(dt), lm_dtype_name(gts[j]));
                    ct_check(g_ctx, what, &dw2, DV(dw2), lm_tensor_as_view(wdw), lce_nmse(dt), ct_abs(dt, 2.0));
                    ct_pair_free(&l2), ct_pair_free(&dx2), ct_pair_free(&dw2);
                    ct_pair_free(&t), ct_pair_free(&loss), ct_pair_free(&dx), ct_pair_free(&dw);
                    lm_tensor_destroy(want_loss), lm_tensor_destroy(wdx), lm_tensor_destroy(wdw);
                }
        lm__cuda_linear_ce_set_chunk_elems(0);
        ct_pair t = index_tensor(LM_I64, 1, tn, badt);
        ct_pair dx = ct_poisoned(dt, 2, xs);
        LT_CHECK_STATUS(lm_linear_cross_entropy_backward_out(g_ctx, &xd, DV(w), DV(t), -100, DV(dloss), DV(dx), NULL),
                        LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "targets[3] = 300") != NULL, "message: %s", lm_last_error());
        LT_CHECK(all_nan(g_ctx, &dx));
        ct_pair l3 = ct_poisoned(LM_F32, 0, NULL);
        LT_CHECK_STATUS(lm_linear_cross_entropy_grads_out(g_ctx, &xd, DV(w), DV(t), -100, DV(l3), DV(dx), NULL),
                        LM_OUT_OF_RANGE);
        LT_CHECK_MSG(strstr(lm_last_error(), "targets[3] = 300") != NULL, "message: %s", lm_last_error());
        LT_CHECK(all_nan(g_ctx, &dx) && all_nan(g_ctx, &l3));
        ct_pair_free(&l3);
        ct_pair_free(&t), ct_pair_free(&dx), ct_pair_free(&x), ct_pair_free(&w);
    }
    ct_pair_free(&dloss), ct_pair_free(&one);
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
    /* the accumulating form adds the same gradients onto what the write left there
     * (cuBLASLt with beta = 1, or the readable kernel from the stored value) */
    lm_tensor *wa2 = NULL, *wb2 = NULL;
    LT_CHECK_OK(lm_matmul_backward_acc_out(g_ctx, ad, bd, dd, &gad, &gbd));
    LT_CHECK_OK(lm_add(g_ref, lm_tensor_as_view(wa), lm_tensor_as_view(wa), &wa2));
    LT_CHECK_OK(lm_add(g_ref, lm_tensor_as_view(wb), lm_tensor_as_view(wb), &wb2));
    snprintf(what, sizeof what, "matmul %s da += %s -> %s", name, lm_dtype_name(ah->dtype), lm_dtype_name(gdt));
    ct_check(g_ctx, what, &ga, &gad, lm_tensor_as_view(wa2), ct_nmse(gdt), ct_abs(gdt, 40.0));
    snprintf(what, sizeof what, "matmul %s db += %s -> %s", name, lm_dtype_name(ah->dtype), lm_dtype_name(gdt));
    ct_check(g_ctx, what, &gb, &gbd, lm_tensor_as_view(wb2), ct_nmse(gdt), ct_abs(gdt, 40.0));
    lm_tensor_destroy(wa2), lm_tensor_destroy(wb2);
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

/* [B, T, H, D] random bf16 viewed as [B, H, T, D] (host and device). */
static ct_pair bthd(lt_rng *r, int64_t B, int64_t T, int64_t H, int64_t D, double scale, lm_tensor_view *hv,
                    lm_tensor_view *dv) {
    int64_t s[4] = {B, T, H, D};
    ct_pair p = scale > 0 ? ct_random(r, LM_BF16, 4, s, scale) : ct_poisoned(LM_BF16, 4, s);
    LT_CHECK_OK(lm_tensor_view_transpose(HV(p), 1, 2, hv));
    *dv = ct_mirror(p.h, hv, p.d);
    return p;
}

/* lm_attention_lse_out and lm_attention_backward_lse_out against the reference: out,
 * lse (computed here in double from the bf16 values), and the gradients in bf16 and
 * f32 from the saved out and lse (no recomputed forward). */
static void check_flash_lse(const lm_tensor_view *qh, const lm_tensor_view *qd, const lm_tensor_view *kh,
                            const lm_tensor_view *kd, const lm_tensor_view *vh, const lm_tensor_view *vd,
                            const lm_tensor_view *dyh, const lm_tensor_view *dyd, float scale, int causal,
                            int64_t window) {
    int64_t B = qh->shape[0], Hq = qh->shape[1], Tq = qh->shape[2], D = qh->shape[3];
    int64_t Hkv = kh->shape[1], Tk = kh->shape[2];
    int64_t os[4] = {B, Hq, Tq, D}, ls[3] = {B, Hq, Tq};
    char what[128];
    ct_pair o = ct_poisoned(LM_BF16, 4, os), lse = ct_poisoned(LM_F32, 3, ls);
    LT_CHECK(lm_attention_lse_supported(g_ctx, qd, kd, vd, causal, DV(o)));
    LT_CHECK_OK(lm_attention_lse_out(g_ctx, qd, kd, vd, scale, causal, window, DV(o), DV(lse)));
    lm_tensor *wo = lt_poisoned_tensor(LM_BF16, 4, os), *wl = lt_poisoned_tensor(LM_F32, 3, ls);
    LT_CHECK_OK(lm_attention_window_out(g_ref, qh, kh, vh, scale, causal, window, lm_tensor_as_view(wo)));
    double *q = lt_view_to_f64(qh), *k = lt_view_to_f64(kh), *s = malloc(sizeof(double) * (size_t)Tk);
    float *want = lm_tensor_data(wl);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                int64_t g = h / (Hq / Hkv), last = causal ? i + Tk - Tq : Tk - 1;
                int64_t first = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
                double mx = -INFINITY, sum = 0;
                for (int64_t j = first; j <= last; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++)
                        dot += q[((b * Hq + h) * Tq + i) * D + d] * k[((b * Hkv + g) * Tk + j) * D + d];
                    s[j] = scale * dot;
                    mx = s[j] > mx ? s[j] : mx;
                }
                for (int64_t j = first; j <= last; j++) sum += exp(s[j] - mx);
                want[(b * Hq + h) * Tq + i] = (float)(last >= first ? mx + log(sum) : INFINITY);
            }
    free(q), free(k), free(s);
    snprintf(what, sizeof what, "flash attention_lse out D %lld Tq %lld Tk %lld causal %d window %lld wgmma %s",
             (long long)D, (long long)Tq, (long long)Tk, causal, (long long)window, getenv("LOOM_FLASH_WGMMA"));
    ct_check(g_ctx, what, &o, DV(o), lm_tensor_as_view(wo), 1e-4, ct_abs(LM_BF16, 2.0));
    snprintf(what, sizeof what, "flash attention_lse lse D %lld Tq %lld Tk %lld causal %d window %lld wgmma %s",
             (long long)D, (long long)Tq, (long long)Tk, causal, (long long)window, getenv("LOOM_FLASH_WGMMA"));
    ct_check(g_ctx, what, &lse, DV(lse), lm_tensor_as_view(wl), 1e-10, 1e-4);
    for (int f32 = 0; f32 < 2; f32++) {
        lm_dtype gt = f32 ? LM_F32 : LM_BF16;
        int64_t ksh[4] = {B, Hkv, Tk, D};
        ct_pair dq = ct_poisoned(gt, 4, os), dk = ct_poisoned(gt, 4, ksh), dv = ct_poisoned(gt, 4, ksh);
        lm_tensor *wq = lt_poisoned_tensor(gt, 4, os), *wk = lt_poisoned_tensor(gt, 4, ksh);
        lm_tensor *wv = lt_poisoned_tensor(gt, 4, ksh);
        LT_CHECK_OK(lm_attention_backward_window_out(g_ref, qh, kh, vh, dyh, scale, causal, window,
                                                     lm_tensor_as_view(wq), lm_tensor_as_view(wk),
                                                     lm_tensor_as_view(wv)));
        LT_CHECK_OK(lm_attention_backward_lse_out(g_ctx, qd, kd, vd, DV(o), DV(lse), dyd, scale, causal, window, DV(dq),
                                                  DV(dk), DV(dv)));
        const char *nm[3] = {"dq", "dk", "dv"};
        ct_pair *got[3] = {&dq, &dk, &dv};
        lm_tensor *ref[3] = {wq, wk, wv};
        for (int t = 0; t < 3; t++) {
            snprintf(what, sizeof what,
                     "flash attention_backward_lse %s D %lld Tq %lld Tk %lld causal %d window %lld -> %s", nm[t],
                     (long long)D, (long long)Tq, (long long)Tk, causal, (long long)window, lm_dtype_name(gt));
            ct_check(g_ctx, what, got[t], DV(*got[t]), lm_tensor_as_view(ref[t]), 1e-4, ct_abs(LM_BF16, 4.0));
        }
        ct_pair_free(&dq), ct_pair_free(&dk), ct_pair_free(&dv);
        lm_tensor_destroy(wq), lm_tensor_destroy(wk), lm_tensor_destroy(wv);
    }
    ct_pair_free(&o), ct_pair_free(&lse);
    lm_tensor_destroy(wo), lm_tensor_destroy(wl);
}

/* kern 0: the mma.sync forward (LOOM_FLASH_WGMMA=0); 1: the default (the wgmma forward
 * on an sm_90 device). */
static void flash_cases(int kern) {
    static const int64_t dims[2] = {64, 128};
    /* the fourth case: 1 x 33 x 3 query rows (odd), grouped 3:1, so the dK/dV partials of
     * the workspace follow an odd number of row statistics; the last: 5 query tiles and 3
     * key tiles of the wgmma forward (the last ones partial) */
    static const int64_t tqk[5][2] = {{100, 100}, {100, 130}, {64, 64}, {33, 33}, {300, 300}};
    ct_flash_form(kern);
    for (int di = 0; di < 2; di++)
        for (int ti = 0; ti < 5; ti++) {
            int64_t B = ti == 3 ? 1 : 2, Hq = ti == 3 ? 3 : 4, Hkv = ti == 3 ? 1 : 2, D = dims[di], Tq = tqk[ti][0],
                    Tk = tqk[ti][1];
            lt_rng r = lt_rng_seed(700 + (uint64_t)(di * 5 + ti));
            lm_tensor_view qh, qd, kh, kd, vh, vd, dyh, dyd;
            ct_pair q = bthd(&r, B, Tq, Hq, D, 1.0, &qh, &qd), k = bthd(&r, B, Tk, Hkv, D, 1.0, &kh, &kd);
            ct_pair v = bthd(&r, B, Tk, Hkv, D, 1.0, &vh, &vd), dy = bthd(&r, B, Tq, Hq, D, 1.0, &dyh, &dyd);
            float scale = 1.0f / sqrtf((float)D);
            for (int causal = 0; causal < 2; causal++) {
                LT_CHECK_MSG(lm__cuda_flash_attention_supports(&qd, &kd, &vd, causal, &dyd), "flash path not taken");
                char what[96];
                lm_tensor_view oh, od;
                ct_pair o = bthd(&r, B, Tq, Hq, D, 0, &oh, &od);
                int64_t os[4] = {B, Hq, Tq, D};
                lm_tensor *wo = lt_poisoned_tensor(LM_BF16, 4, os);
                LT_CHECK_OK(lm_attention_out(g_ref, &qh, &kh, &vh, scale, causal, lm_tensor_as_view(wo)));
                LT_CHECK_OK(lm_attention_out(g_ctx, &qd, &kd, &vd, scale, causal, &od));
                snprintf(what, sizeof what, "flash attention out D %lld Tq %lld Tk %lld causal %d wgmma %s",
                         (long long)D, (long long)Tq, (long long)Tk, causal, getenv("LOOM_FLASH_WGMMA"));
                ct_check(g_ctx, what, &o, &od, lm_tensor_as_view(wo), 1e-4, ct_abs(LM_BF16, 2.0));
                ct_pair_free(&o);
                lm_tensor_destroy(wo);
                for (int f32 = 0; f32 < 2; f32++) {
                    lm_dtype gt = f32 ? LM_F32 : LM_BF16;
                    int64_t qsh[4] = {B, Hq, Tq, D}, ksh[4] = {B, Hkv, Tk, D};
                    ct_pair dq = ct_poisoned(gt, 4, qsh), dk = ct_poisoned(gt, 4, ksh), dv = ct_poisoned(gt, 4, ksh);
                    lm_tensor *wq = lt_poisoned_tensor(gt, 4, qsh), *wk = lt_poisoned_tensor(gt, 4, ksh);
                    lm_tensor *wv = lt_poisoned_tensor(gt, 4, ksh);
                    LT_CHECK_OK(lm_attention_backward_out(g_ref, &qh, &kh, &vh, &dyh, scale, causal, lm_tensor_as_view(wq),
                                                          lm_tensor_as_view(wk), lm_tensor_as_view(wv)));
                    LT_CHECK_OK(lm_attention_backward_out(g_ctx, &qd, &kd, &vd, &dyd, scale, causal, DV(dq), DV(dk), DV(dv)));
                    const char *nm[3] = {"dq", "dk", "dv"};
                    ct_pair *got[3] = {&dq, &dk, &dv};
                    lm_tensor *want[3] = {wq, wk, wv};
                    for (int t = 0; t < 3; t++) {
                        snprintf(what, sizeof what, "flash attention %s D %lld Tq %lld Tk %lld causal %d -> %s", nm[t],
                                 (long long)D, (long long)Tq, (long long)Tk, causal, lm_dtype_name(gt));
                        ct_check(g_ctx, what, got[t], DV(*got[t]), lm_tensor_as_view(want[t]), 1e-4, ct_abs(LM_BF16, 4.0));
                    }
                    ct_pair_free(&dq), ct_pair_free(&dk), ct_pair_free(&dv);
                    lm_tensor_destroy(wq), lm_tensor_destroy(wk), lm_tensor_destroy(wv);
                }
                check_flash_lse(&qh, &qd, &kh, &kd, &vh, &vd, &dyh, &dyd, scale, causal, 0);
                if (causal) check_flash_lse(&qh, &qd, &kh, &kd, &vh, &vd, &dyh, &dyd, scale, causal, 37);
            }
            ct_pair_free(&q), ct_pair_free(&k), ct_pair_free(&v), ct_pair_free(&dy);
        }
    unsetenv("LOOM_FLASH_WGMMA");
}

static void test_flash_attention(void) {
    flash_cases(0);
    flash_cases(1);
}

int main(void) {
    g_ctx = ct_start();
    g_ref = ct_ref_ctx();
    LT_RUN(test_flash_attention);
    LT_RUN(test_sum_squares);
    LT_RUN(test_rmsnorm_backward);
    LT_RUN(test_rmsnorm_backward_rows);
    LT_RUN(test_swiglu_backward);
    LT_RUN(test_rope_backward);
    LT_RUN(test_embedding_backward);
    LT_RUN(test_cross_entropy_backward);
    LT_RUN(test_linear_cross_entropy);
    LT_RUN(test_matmul_backward);
    LT_RUN(test_attention_backward);
    lm_ctx_destroy(g_ref);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
