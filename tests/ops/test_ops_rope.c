/* Tests for rope and rope_inv_freq: PyTorch float64 fixtures (transformers'
 * rotate_half math and Meta's complex form, tests/data/ops/norm_rope.lmfx) in all
 * three float dtypes, float64 re-derivations on random shapes with permuted inputs,
 * strided outputs, size-1 and zero-size dims, every position source (offset, [T],
 * [B, T], i32/i64, broadcast), bias and attn_factor; in place; the style identity
 * (interleaved == split-half on permuted dims); and every error path.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const lm_dtype k_floats[] = {LM_F32, LM_BF16, LM_F16};
static const char *k_fixture = "tests/data/ops/norm_rope.lmfx";

/* Re-derivation from stored inputs: only the final rounding differs (rel 2^-24 /
 * 2^-9 / 2^-12). */
static double tol_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 2e-5 : 3e-7; }
static double tol_abs(lm_dtype dt) { return dt == LM_F32 ? 1e-5 : dt == LM_BF16 ? 0.1 : 0.01; }
/* Against float64 fixtures x and bias are rounded too (three roundings). */
static double fx_nmse(lm_dtype dt) { return dt == LM_F32 ? 1e-12 : dt == LM_BF16 ? 1e-4 : 3e-6; }

/* Reference: x [B, T, H, D] row-major, bias [H, D] or NULL, inv [D/2], pos [B*T]. */
static void rope_f64(const double *x, const double *bias, const double *inv, const int64_t *pos, double af,
                     int interleaved, const int64_t *s, double *out) {
    int64_t half = s[3] / 2;
    for (int64_t bt = 0; bt < s[0] * s[1]; bt++)
        for (int64_t h = 0; h < s[2]; h++) {
            const double *xr = x + (bt * s[2] + h) * s[3];
            double *orow = out + (bt * s[2] + h) * s[3];
            for (int64_t i = 0; i < half; i++) {
                int64_t ia = interleaved ? 2 * i : i, ib = interleaved ? 2 * i + 1 : i + half;
                double a = xr[ia] + (bias ? bias[h * s[3] + ia] : 0), b = xr[ib] + (bias ? bias[h * s[3] + ib] : 0);
                double ang = (double)pos[bt] * inv[i], c = cos(ang) * af, sn = sin(ang) * af;
                orow[ia] = a * c - b * sn;
                orow[ib] = b * c + a * sn;
            }
        }
}

static lm_tensor *inv_freq_tensor(double theta, int64_t d) {
    int64_t half = d / 2;
    lm_tensor *t = lt_poisoned_tensor(LM_F32, 1, &half);
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ctx, theta, d, lm_tensor_as_view(t)));
    return t;
}

static void test_inv_freq_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load(k_fixture, &fx)) return;
    const struct { double theta; int64_t d; const char *name; } cases[] = {
        {10000.0, 8, "inv_freq.10000.8"},
        {1000000.0, 128, "inv_freq.1000000.128"},
        {500000.0, 64, "inv_freq.500000.64"}};
    for (int c = 0; c < 3; c++) {
        lm_tensor *t = inv_freq_tensor(cases[c].theta, cases[c].d);
        double *got = lt_view_to_f64(lm_tensor_as_view(t));
        /* one rounding of a value <= 1 to f32 */
        lt_check_close(cases[c].name, got, lt_fixture_get(&fx, cases[c].name)->f64, cases[c].d / 2, 1e-14, 6e-8);
        LT_CHECK(got[0] == 1.0);
        free(got);
        lm_tensor_destroy(t);
    }
    lt_fixture_free(&fx);
}

/* One fixture case in dtype dt; positions are passed as i32 when as_i32. */
static void run_fixture_case(const lt_fixture *fx, const char *c, int interleaved, int has_pos, int has_bias,
                             lm_dtype dt, int as_i32) {
    char name[96];
    snprintf(name, sizeof name, "%s.x", c);
    const lt_fixture_tensor *fxx = lt_fixture_get(fx, name);
    lm_tensor *x = lt_fixture_tensor_to(fxx, dt), *pos = NULL, *bias = NULL;
    snprintf(name, sizeof name, "%s.inv_freq", c);
    lm_tensor *inv = lt_fixture_tensor_to(lt_fixture_get(fx, name), LM_F32);
    lm_rope_params p = {interleaved ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 0,
                        NULL};
    snprintf(name, sizeof name, "%s.attn_factor", c);
    p.attn_factor = (float)lt_fixture_get(fx, name)->f64[0];
    snprintf(name, sizeof name, "%s.pos_offset", c);
    p.pos_offset = lt_fixture_get(fx, name)->i64[0];
    if (has_pos) {
        snprintf(name, sizeof name, "%s.positions", c);
        pos = lt_fixture_tensor_to(lt_fixture_get(fx, name), as_i32 ? LM_I32 : LM_I64);
        p.positions = lm_tensor_as_view(pos);
    }
    if (has_bias) {
        snprintf(name, sizeof name, "%s.bias", c);
        bias = lt_fixture_tensor_to(lt_fixture_get(fx, name), dt);
        p.bias = lm_tensor_as_view(bias);
    }
    lm_tensor *o = lt_poisoned_tensor(dt, 4, fxx->shape);
    LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o)));
    snprintf(name, sizeof name, "%s.out [%s]", c, lm_dtype_name(dt));
    double *got = lt_view_to_f64(lm_tensor_as_view(o));
    char oname[96];
    snprintf(oname, sizeof oname, "%s.out", c);
    lt_check_close(name, got, lt_fixture_get(fx, oname)->f64, fxx->numel, fx_nmse(dt), 4 * tol_abs(dt));
    free(got);
    lm_tensor_destroy(x), lm_tensor_destroy(inv), lm_tensor_destroy(pos), lm_tensor_destroy(bias), lm_tensor_destroy(o);
}

static void test_rope_matches_torch_fixture(void) {
    lt_fixture fx;
    if (!lt_fixture_load(k_fixture, &fx)) return;
    for (int k = 0; k < 3; k++) {
        run_fixture_case(&fx, "rope_split_offset", 0, 0, 0, k_floats[k], 0);
        run_fixture_case(&fx, "rope_split_bt", 0, 1, 1, k_floats[k], k == 1);
        run_fixture_case(&fx, "rope_inter_t", 1, 1, 1, k_floats[k], k == 2);
        run_fixture_case(&fx, "rope_inter_offset", 1, 0, 0, k_floats[k], 0);
    }
    lt_fixture_free(&fx);
}

/* Position mode for the random test: 0 offset, 1 [T] i32, 2 [B, T] i64, 3 [T] broadcast to [B, T]. */
static lm_tensor *make_positions(lt_rng *r, int mode, const int64_t *s, int64_t offset, int64_t *pos,
                                 lm_tensor_view *view) {
    int64_t nb = s[0], nt = s[1];
    if (mode == 0) {
        for (int64_t i = 0; i < nb * nt; i++) pos[i] = offset + i % nt;
        return NULL;
    }
    int64_t shape[2] = {mode == 2 ? nb : 1, nt};
    int64_t n = shape[0] * shape[1];
    int64_t *host = malloc(sizeof(int64_t) * (size_t)(n ? n : 1));
    for (int64_t i = 0; i < n; i++) host[i] = lt_rng_int(r, -5, 40000);
    for (int64_t i = 0; i < nb * nt; i++) pos[i] = host[mode == 2 ? i : i % nt];
    lm_tensor *t = NULL;
    if (mode == 1) {
        int32_t *h32 = malloc(sizeof(int32_t) * (size_t)(n ? n : 1));
        for (int64_t i = 0; i < n; i++) h32[i] = (int32_t)host[i];
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, 1, &nt, h32, &t));
        free(h32);
        *view = *lm_tensor_as_view(t);
    } else {
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 2, shape, host, &t));
        int64_t bt[2] = {nb, nt};
        LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(t), 2, bt, view));
    }
    free(host);
    return t;
}

static void test_rope_random_views_match_f64(void) {
    lt_rng r = lt_rng_seed(21);
    for (int trial = 0; trial < 72; trial++) {
        lm_dtype dt = k_floats[trial % 3];
        int interleaved = (trial / 3) % 2, mode = (trial / 6) % 4, with_bias = (trial / 24) % 2;
        int64_t s[4] = {lt_rng_int(&r, 1, 3), lt_rng_int(&r, 1, 6), lt_rng_int(&r, 1, 4), 2 * lt_rng_int(&r, 1, 12)};
        int64_t n = s[0] * s[1] * s[2] * s[3], offset = lt_rng_int(&r, 0, 3000);
        /* x stored as [B, H, T, D] and permuted to [B, T, H, D] */
        int64_t stored[4] = {s[0], s[2], s[1], s[3]};
        int perm[4] = {0, 2, 1, 3};
        lm_tensor *x = lt_random_tensor(&r, dt, 4, stored, 1.5);
        lm_tensor_view xv, ov, pv;
        LT_CHECK_OK(lm_tensor_view_permute(lm_tensor_as_view(x), perm, &xv));
        int64_t wide[4] = {s[0], s[1], s[2], 2 * s[3]};
        lm_tensor *o = lt_poisoned_tensor(dt, 4, wide);
        LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(o), 3, 1, wide[3], 2, &ov));
        int64_t hd[2] = {s[2], s[3]};
        lm_tensor *bias = with_bias ? lt_random_tensor(&r, dt, 2, hd, 0.5) : NULL;
        lm_tensor *inv = inv_freq_tensor(trial % 2 ? 10000.0 : 1e6, s[3]);
        int64_t *pos = malloc(sizeof(int64_t) * (size_t)(s[0] * s[1]));
        lm_tensor *pt = make_positions(&r, mode, s, offset, pos, &pv);
        float af = trial % 5 == 0 ? 1.0f : (float)(0.5 + lt_rng_uniform(&r));
        lm_rope_params p = {interleaved ? LM_ROPE_INTERLEAVED : LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), af,
                            mode ? &pv : NULL, offset, bias ? lm_tensor_as_view(bias) : NULL};
        LT_CHECK_OK(lm_rope_out(g_ctx, &xv, &p, &ov));
        double *xs = lt_view_to_f64(&xv), *is = lt_view_to_f64(lm_tensor_as_view(inv)), *got = lt_view_to_f64(&ov);
        double *bs = bias ? lt_view_to_f64(lm_tensor_as_view(bias)) : NULL;
        double *want = malloc(sizeof(double) * (size_t)n);
        rope_f64(xs, bs, is, pos, af, interleaved, s, want);
        lt_check_close(interleaved ? "rope interleaved" : "rope split-half", got, want, n, tol_nmse(dt), tol_abs(dt));
        free(xs), free(is), free(got), free(bs), free(want), free(pos);
        lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(bias), lm_tensor_destroy(inv);
        lm_tensor_destroy(pt);
    }
}

static void test_rope_in_place_and_position_sources_agree(void) {
    lt_rng r = lt_rng_seed(22);
    int64_t s[4] = {2, 5, 3, 10}, n = 300, t5 = 5, t25[2] = {2, 5};
    for (int k = 0; k < 6; k++) {
        lm_dtype dt = k_floats[k % 3];
        size_t bytes = (size_t)n * lm_dtype_size(dt);
        lm_tensor *x = lt_random_tensor(&r, dt, 4, s, 1.0), *inv = inv_freq_tensor(10000.0, 10);
        lm_tensor *o1 = lt_poisoned_tensor(dt, 4, s), *o2 = lt_poisoned_tensor(dt, 4, s);
        lm_tensor *o3 = lt_poisoned_tensor(dt, 4, s);
        lm_rope_params p = {k < 3 ? LM_ROPE_SPLIT_HALF : LM_ROPE_INTERLEAVED, lm_tensor_as_view(inv), 1.0f, NULL, 17,
                            NULL};
        LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o1)));
        /* explicit [T] positions 17..21 (pos_offset then ignored) give the same bits */
        int64_t ph[5] = {17, 18, 19, 20, 21}, ph2[10] = {17, 18, 19, 20, 21, 17, 18, 19, 20, 21};
        lm_tensor *pt = NULL, *pbt = NULL;
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 1, &t5, ph, &pt));
        p.positions = lm_tensor_as_view(pt);
        p.pos_offset = -999;
        LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o2)));
        LT_CHECK(memcmp(lm_tensor_data(o1), lm_tensor_data(o2), bytes) == 0);
        LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I64, 2, t25, ph2, &pbt));
        p.positions = lm_tensor_as_view(pbt);
        LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o3)));
        LT_CHECK(memcmp(lm_tensor_data(o1), lm_tensor_data(o3), bytes) == 0);
        /* in place: out is x's own view */
        LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(x)));
        LT_CHECK(memcmp(lm_tensor_data(o1), lm_tensor_data(x), bytes) == 0);
        lm_tensor_destroy(x), lm_tensor_destroy(inv), lm_tensor_destroy(o1), lm_tensor_destroy(o2);
        lm_tensor_destroy(o3), lm_tensor_destroy(pt), lm_tensor_destroy(pbt);
    }
}

static void test_interleaved_is_split_half_on_permuted_dims(void) {
    lt_rng r = lt_rng_seed(23);
    int64_t s[4] = {1, 4, 2, 8}, n = 64;
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 4, s, 1.0), *xp = lt_poisoned_tensor(LM_F32, 4, s);
    lm_tensor *oi = lt_poisoned_tensor(LM_F32, 4, s), *os = lt_poisoned_tensor(LM_F32, 4, s);
    lm_tensor *inv = inv_freq_tensor(100.0, 8);
    const float *xv = lm_tensor_data(x);
    float *xpv = lm_tensor_data(xp);
    /* split-half position j holds interleaved element perm[j] = (0, 2, 4, 6, 1, 3, 5, 7) */
    const int perm[8] = {0, 2, 4, 6, 1, 3, 5, 7};
    for (int64_t i = 0; i < n; i++) xpv[i] = xv[i / 8 * 8 + perm[i % 8]];
    lm_rope_params p = {LM_ROPE_INTERLEAVED, lm_tensor_as_view(inv), 1.25f, NULL, 3, NULL};
    LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(oi)));
    p.style = LM_ROPE_SPLIT_HALF;
    LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(xp), &p, lm_tensor_as_view(os)));
    const float *a = lm_tensor_data(oi), *b = lm_tensor_data(os);
    for (int64_t i = 0; i < n; i++) LT_CHECK(b[i] == a[i / 8 * 8 + perm[i % 8]]);
    lm_tensor_destroy(x), lm_tensor_destroy(xp), lm_tensor_destroy(oi), lm_tensor_destroy(os), lm_tensor_destroy(inv);
}

static void test_rope_zero_size_and_no_allocation(void) {
    lt_rng r = lt_rng_seed(24);
    const int64_t shapes[4][4] = {{0, 3, 2, 4}, {2, 0, 2, 4}, {2, 3, 0, 4}, {2, 3, 2, 0}};
    for (int c = 0; c < 4; c++) {
        int64_t half = shapes[c][3] / 2;
        lm_tensor *x = lt_poisoned_tensor(LM_BF16, 4, shapes[c]), *o = lt_poisoned_tensor(LM_BF16, 4, shapes[c]);
        lm_tensor *inv = lt_random_tensor(&r, LM_F32, 1, &half, 1);
        lm_rope_params p = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 0, NULL};
        LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o)));
        lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(inv);
    }
    /* the operator never allocates host memory */
    int64_t s[4] = {1, 2, 2, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 4, s, 1), *o = lt_poisoned_tensor(LM_F32, 4, s);
    lm_tensor *inv = inv_freq_tensor(10000.0, 4);
    lm_rope_params p = {LM_ROPE_INTERLEAVED, lm_tensor_as_view(inv), 1.0f, NULL, 0, NULL};
    lt_alloc_track(0);
    LT_CHECK_OK(lm_rope_out(g_ctx, lm_tensor_as_view(x), &p, lm_tensor_as_view(o)));
    LT_CHECK_OK(lm_rope_inv_freq_out(g_ctx, 10000.0, 4, lm_tensor_as_view(inv)));
    LT_CHECK(lt_alloc_count() == 0);
    lt_alloc_untrack();
    lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(inv);
}

static void test_rope_errors_name_the_problem(void) {
    lt_rng r = lt_rng_seed(25);
    int64_t s[4] = {2, 3, 3, 4}, s_odd[4] = {2, 3, 3, 5}, s3[3] = {2, 3, 4}, two = 2, three = 3, t3 = 3, t4 = 4;
    int64_t hd[2] = {3, 4}, hd_bad[2] = {2, 4}, bt_bad[2] = {3, 3}, pos3d[3] = {1, 2, 3};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 4, s, 1), *o = lt_poisoned_tensor(LM_F32, 4, s);
    lm_tensor *xo = lt_random_tensor(&r, LM_F32, 4, s_odd, 1), *x3 = lt_random_tensor(&r, LM_F32, 3, s3, 1);
    lm_tensor *oh = lt_poisoned_tensor(LM_F16, 4, s), *inv = inv_freq_tensor(10000.0, 4);
    lm_tensor *inv3 = lt_random_tensor(&r, LM_F32, 1, &three, 1), *invb = lt_random_tensor(&r, LM_BF16, 1, &two, 1);
    lm_tensor *pf = lt_random_tensor(&r, LM_F32, 1, &t3, 1), *p4 = lt_random_tensor(&r, LM_I64, 1, &t4, 1);
    lm_tensor *pbad = lt_random_tensor(&r, LM_I32, 2, bt_bad, 1), *p3d = lt_random_tensor(&r, LM_I32, 3, pos3d, 1);
    lm_tensor *bias = lt_random_tensor(&r, LM_F32, 2, hd, 1), *biasb = lt_random_tensor(&r, LM_F32, 2, hd_bad, 1);
    lm_tensor *biash = lt_random_tensor(&r, LM_F16, 2, hd, 1);
    const lm_tensor_view *vx = lm_tensor_as_view(x), *vo = lm_tensor_as_view(o);
    lm_rope_params good = {LM_ROPE_SPLIT_HALF, lm_tensor_as_view(inv), 1.0f, NULL, 0, NULL}, p = good;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, NULL, vo), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, NULL, &p, vo), LM_INVALID_ARGUMENT);
    p.inv_freq = NULL;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "inv_freq"));
    p = good, p.style = (lm_rope_style)7;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_INVALID_ARGUMENT);
    p = good;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, lm_tensor_as_view(xo), &p, lm_tensor_as_view(xo)), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "even"));
    LT_CHECK_STATUS(lm_rope_out(g_ctx, lm_tensor_as_view(x3), &p, lm_tensor_as_view(x3)), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, lm_tensor_as_view(oh)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, lm_tensor_as_view(xo)), LM_SHAPE_MISMATCH);
    p.inv_freq = lm_tensor_as_view(inv3);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_SHAPE_MISMATCH);
    p.inv_freq = lm_tensor_as_view(invb);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_DTYPE_MISMATCH);
    p = good, p.positions = lm_tensor_as_view(pf);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_UNSUPPORTED);
    p.positions = lm_tensor_as_view(p4);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "positions"));
    p.positions = lm_tensor_as_view(pbad);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_SHAPE_MISMATCH);
    p.positions = lm_tensor_as_view(p3d);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_SHAPE_MISMATCH);
    p = good, p.bias = lm_tensor_as_view(biasb);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "bias"));
    p.bias = lm_tensor_as_view(biash);
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, vo), LM_DTYPE_MISMATCH);
    p.bias = lm_tensor_as_view(bias);
    LT_CHECK_OK(lm_rope_out(g_ctx, vx, &p, vo));
    /* outputs: broadcast, same memory as x in another layout (T and H swapped), and
     * memory shared with inv_freq */
    p = good;
    lm_tensor_view ov, sw, on_inv;
    int64_t one[4] = {2, 3, 1, 4};
    lm_tensor *small = lt_poisoned_tensor(LM_F32, 4, one);
    LT_CHECK_OK(lm_tensor_view_expand(lm_tensor_as_view(small), 4, s, &ov));
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, &ov), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_tensor_view_transpose(vx, 1, 2, &sw));
    LT_CHECK_STATUS(lm_rope_out(g_ctx, vx, &p, &sw), LM_INVALID_ARGUMENT);
    int64_t four = 4, tiny[4] = {1, 1, 1, 4};
    lm_tensor *buf = lt_random_tensor(&r, LM_F32, 1, &four, 1), *xt = lt_random_tensor(&r, LM_F32, 4, tiny, 1);
    lm_tensor_view inv_head;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(buf), 0, 0, 2, 1, &inv_head));
    LT_CHECK_OK(lm_tensor_view_init(&on_inv, lm_tensor_data(buf), LM_F32, lm_device_cpu(), 4, tiny, NULL));
    p.inv_freq = &inv_head;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, lm_tensor_as_view(xt), &p, &on_inv), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "inv_freq"));
    lm_tensor_view dev = *vx;
    dev.device = lm_device_cuda(0);
    p = good;
    LT_CHECK_STATUS(lm_rope_out(g_ctx, &dev, &p, vo), LM_INVALID_ARGUMENT);
    lm_ctx_set_impl(g_ctx, LM_IMPL_TUNED); /* the tuned level takes f32 only */
    LT_CHECK_STATUS(lm_rope_out(g_ctx, lm_tensor_as_view(oh), &p, lm_tensor_as_view(oh)), LM_UNSUPPORTED);
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    /* inv_freq table */
    const lm_tensor_view *vi = lm_tensor_as_view(inv);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 0.0, 4, vi), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, NAN, 4, vi), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 1e4, 3, vi), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 1e4, 0, vi), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 1e4, 6, vi), LM_SHAPE_MISMATCH);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 1e4, 4, lm_tensor_as_view(invb)), LM_DTYPE_MISMATCH);
    LT_CHECK_STATUS(lm_rope_inv_freq_out(g_ctx, 1e4, 4, NULL), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(x), lm_tensor_destroy(o), lm_tensor_destroy(xo), lm_tensor_destroy(x3), lm_tensor_destroy(oh);
    lm_tensor_destroy(inv), lm_tensor_destroy(inv3), lm_tensor_destroy(invb), lm_tensor_destroy(pf);
    lm_tensor_destroy(p4), lm_tensor_destroy(pbad), lm_tensor_destroy(p3d), lm_tensor_destroy(bias);
    lm_tensor_destroy(biasb), lm_tensor_destroy(biash), lm_tensor_destroy(small), lm_tensor_destroy(xt);
    lm_tensor_destroy(buf);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    LT_RUN(test_inv_freq_matches_torch_fixture);
    LT_RUN(test_rope_matches_torch_fixture);
    LT_RUN(test_rope_random_views_match_f64);
    LT_RUN(test_rope_in_place_and_position_sources_agree);
    LT_RUN(test_interleaved_is_split_half_on_permuted_dims);
    LT_RUN(test_rope_zero_size_and_no_allocation);
    LT_RUN(test_rope_errors_name_the_problem);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
