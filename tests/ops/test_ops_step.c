/* The model-step operators on the CPU: KV store, attention over a KV cache (with and
 * without a sliding window), the fused QKV + RoPE + KV write (alone and with its
 * projection), the fused Linear (and the gate|up projection with its SwiGLU), and
 * token selection. Each against an independent computation written here in double
 * (or against the composition of the basic operators it fuses), on fresh random
 * inputs with poisoned outputs; plus the errors that name bad slots, positions and
 * parameters.
 * Tolerances: f32 results vs double: NMSE 1e-12, max-abs 1e-5 (values O(1)).
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

#define V(t) lm_tensor_as_view(t)

static lm_tensor *i32(int ndim, const int64_t *shape, const int32_t *vals) {
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_I32, ndim, shape, vals, &t));
    return t;
}

/* Softmax-weighted sum over keys [j0, j1) of a [S, Hkv, P, D] cache pair, in double. */
static void attend(const double *kc, const double *vc, const double *qrow, int64_t s, int64_t g, int64_t Hkv, int64_t P,
                   int64_t D, int64_t j0, int64_t j1, double scale, double *out) {
    double mx = -INFINITY, *w = malloc(sizeof(double) * (size_t)(j1 - j0)), sum = 0;
    for (int64_t j = j0; j < j1; j++) {
        double dot = 0;
        for (int64_t d = 0; d < D; d++) dot += qrow[d] * kc[((s * Hkv + g) * P + j) * D + d];
        w[j - j0] = dot * scale;
        mx = fmax(mx, w[j - j0]);
    }
    for (int64_t j = j0; j < j1; j++) sum += (w[j - j0] = exp(w[j - j0] - mx));
    for (int64_t d = 0; d < D; d++) {
        double a = 0;
        for (int64_t j = j0; j < j1; j++) a += w[j - j0] * vc[((s * Hkv + g) * P + j) * D + d];
        out[d] = a / sum;
    }
    free(w);
}

/* attention_cache over random caches: tuned level and reference, with windows 0, 3
 * and one longer than the keys, against attend(). B = 2 rows at different positions. */
static void test_attention_cache_matches_double(void) {
    lt_rng r = lt_rng_seed(11);
    const int64_t S = 3, Hkv = 2, Hq = 6, P = 40, D = 16, B = 2, T = 5;
    int64_t cs[4] = {S, Hkv, P, D}, qs[4] = {B, T, Hq, D}, bs[1] = {B}, ps[2] = {B, T};
    lm_tensor *kc = lt_random_tensor(&r, LM_F32, 4, cs, 1.0), *vc = lt_random_tensor(&r, LM_F32, 4, cs, 1.0);
    lm_tensor *q = lt_random_tensor(&r, LM_F32, 4, qs, 1.0);
    int32_t slots[2] = {2, 0}, pos[10] = {7, 8, 9, 10, 11, 30, 31, 32, 33, 34};
    lm_tensor *sl = i32(1, bs, slots), *po = i32(2, ps, pos);
    double *k64 = lt_view_to_f64(V(kc)), *v64 = lt_view_to_f64(V(vc)), *q64 = lt_view_to_f64(V(q));
    const int64_t windows[3] = {0, 3, 1000};
    for (int w = 0; w < 3; w++)
        for (int impl = 0; impl < 2; impl++) {
            lm_ctx_set_impl(g_ctx, impl ? LM_IMPL_REF : LM_IMPL_TUNED);
            lm_tensor *out = lt_poisoned_tensor(LM_F32, 4, qs);
            lm_kv_attention_params p = {0.25f, windows[w], NULL};
            LT_CHECK_OK(lm_attention_cache_out(g_ctx, V(q), V(kc), V(vc), V(sl), V(po), &p, V(out)));
            double *want = malloc(sizeof(double) * (size_t)(B * T * Hq * D));
            for (int64_t b = 0; b < B; b++)
                for (int64_t t = 0; t < T; t++)
                    for (int64_t h = 0; h < Hq; h++) {
                        int64_t pp = pos[b * T + t], j0 = windows[w] && pp - windows[w] + 1 > 0 ? pp - windows[w] + 1 : 0;
                        attend(k64, v64, q64 + ((b * T + t) * Hq + h) * D, slots[b], h / (Hq / Hkv), Hkv, P, D, j0,
                               pp + 1, 0.25, want + ((b * T + t) * Hq + h) * D);
                    }
            double *got = lt_view_to_f64(V(out));
            char what[64];
            snprintf(what, sizeof what, "attention_cache window %lld %s", (long long)windows[w], impl ? "ref" : "tuned");
            lt_check_close(what, got, want, B * T * Hq * D, 1e-12, 1e-5);
            free(got), free(want);
            lm_tensor_destroy(out);
        }
    lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
    free(k64), free(v64), free(q64);
    lm_tensor_destroy(kc), lm_tensor_destroy(vc), lm_tensor_destroy(q), lm_tensor_destroy(sl), lm_tensor_destroy(po);
}

/* kv_store rounds into a bf16 cache at (slot, position) and touches nothing else. */
static void test_kv_store_writes_only_its_rows(void) {
    lt_rng r = lt_rng_seed(12);
    const int64_t S = 3, H = 2, P = 8, D = 4, B = 2, T = 2;
    int64_t cs[4] = {S, H, P, D}, xs[4] = {B, T, H, D}, bs[1] = {B}, ps[2] = {B, T};
    lm_tensor *cache = lt_random_tensor(&r, LM_BF16, 4, cs, 1.0), *x = lt_random_tensor(&r, LM_F32, 4, xs, 1.0);
    int32_t slots[2] = {1, 2}, pos[4] = {3, 4, 0, 1};
    lm_tensor *sl = i32(1, bs, slots), *po = i32(2, ps, pos);
    double *before = lt_view_to_f64(V(cache)), *x64 = lt_view_to_f64(V(x));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(cache), V(x), V(sl), V(po)));
    double *after = lt_view_to_f64(V(cache));
    for (int64_t b = 0; b < B; b++)
        for (int64_t t = 0; t < T; t++)
            for (int64_t h = 0; h < H; h++)
                for (int64_t d = 0; d < D; d++) {
                    int64_t c = ((slots[b] * H + h) * P + pos[b * T + t]) * D + d;
                    before[c] = lm_bf16_to_f32(lm_f32_to_bf16((float)x64[((b * T + t) * H + h) * D + d]));
                }
    int same = 1;
    for (int64_t i = 0; i < S * H * P * D; i++) same &= after[i] == before[i];
    LT_CHECK_MSG(same, "kv_store: the cache differs from the expected rounded rows");
    /* errors name the row and leave the cache untouched */
    int32_t bad_slot[2] = {1, 5}, dup[2] = {1, 1}, gap[4] = {3, 5, 0, 1}, past[4] = {7, 8, 0, 1};
    lm_tensor *t1 = i32(1, bs, bad_slot), *t2 = i32(1, bs, dup), *t3 = i32(2, ps, gap), *t4 = i32(2, ps, past);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(cache), V(x), V(t1), V(po)), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "slot 5") != NULL);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(cache), V(x), V(t2), V(po)), LM_INVALID_ARGUMENT);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(cache), V(x), V(sl), V(t3)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "consecutive") != NULL);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(cache), V(x), V(sl), V(t4)), LM_OUT_OF_RANGE);
    double *again = lt_view_to_f64(V(cache));
    LT_CHECK(memcmp(again, after, sizeof(double) * (size_t)(S * H * P * D)) == 0);
    free(before), free(after), free(again), free(x64);
    lm_tensor *all[] = {cache, x, sl, po, t1, t2, t3, t4};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

/* A paged cache (blocks of P positions, block tables [B, NB]) gives exactly what the
 * contiguous cache (one slot of NB * P positions per row) gives, for kv_store,
 * attention_cache (with and without a window) and qkv_rope_store: rows whose tables are
 * permutations of pool blocks, one row sharing another's first block read-only (a
 * common prefix); blocks no table names stay untouched; a block out of the pool, a
 * position past the table and a block written by two rows are refused naming them. */
static void test_paged_cache_equals_contiguous(void) {
    lt_rng r = lt_rng_seed(17);
    enum { B = 3, T = 2, Hq = 4, Hkv = 2, D = 8, P = 4, NB = 4, S = 14, PC = NB * P };
    int64_t pool[4] = {S, Hkv, P, D}, flat[4] = {B, Hkv, PC, D}, xs[4] = {B, T, Hkv, D}, qs[4] = {B, T, Hq, D};
    int64_t ts[2] = {B, NB}, bs[1] = {B}, ps[2] = {B, T};
    /* row 0: blocks 3 9 1 12; row 1 shares block 3 (its positions 0..3), then 5 0 7; row 2: 11 2 6 8 */
    int32_t table[B * NB] = {3, 9, 1, 12, 3, 5, 0, 7, 11, 2, 6, 8}, slots[B] = {0, 1, 2};
    int32_t pos[B * T] = {5, 6, 9, 10, 14, 15};
    lm_tensor *tb = i32(2, ts, table), *sl = i32(1, bs, slots), *po = i32(2, ps, pos);
    lm_tensor *kc = lt_random_tensor(&r, LM_F32, 4, flat, 1.0), *vc = lt_random_tensor(&r, LM_F32, 4, flat, 1.0);
    float *k = lm_tensor_data(kc), *v = lm_tensor_data(vc);
    for (int h = 0; h < Hkv; h++) /* row 1's first block is row 0's */
        for (int j = 0; j < P; j++)
            for (int d = 0; d < D; d++) {
                k[((1 * Hkv + h) * PC + j) * D + d] = k[((0 * Hkv + h) * PC + j) * D + d];
                v[((1 * Hkv + h) * PC + j) * D + d] = v[((0 * Hkv + h) * PC + j) * D + d];
            }
    lm_tensor *kp = lt_random_tensor(&r, LM_F32, 4, pool, 1.0), *vp = lt_random_tensor(&r, LM_F32, 4, pool, 1.0);
    float *kpd = lm_tensor_data(kp), *vpd = lm_tensor_data(vp);
    for (int b = 0; b < B; b++) /* scatter the contiguous rows into their blocks */
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j < PC; j++)
                for (int d = 0; d < D; d++) {
                    int64_t blk = table[b * NB + j / P];
                    kpd[((blk * Hkv + h) * P + j % P) * D + d] = k[((b * Hkv + h) * PC + j) * D + d];
                    vpd[((blk * Hkv + h) * P + j % P) * D + d] = v[((b * Hkv + h) * PC + j) * D + d];
                }
    double *unnamed_before = lt_view_to_f64(V(kp)); /* blocks 4, 10, 13 belong to no row */
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 4, xs, 1.0), *xv = lt_random_tensor(&r, LM_F32, 4, xs, 1.0);
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(kc), V(x), V(sl), V(po)));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(vc), V(xv), V(sl), V(po)));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(kp), V(x), V(tb), V(po)));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(vp), V(xv), V(tb), V(po)));
    int same = 1;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < Hkv; h++)
            for (int j = 0; j <= pos[b * T + T - 1]; j++)
                for (int d = 0; d < D; d++) {
                    int64_t blk = table[b * NB + j / P];
                    same &= kpd[((blk * Hkv + h) * P + j % P) * D + d] == k[((b * Hkv + h) * PC + j) * D + d];
                    same &= vpd[((blk * Hkv + h) * P + j % P) * D + d] == v[((b * Hkv + h) * PC + j) * D + d];
                }
    LT_CHECK_MSG(same, "kv_store: the paged rows differ from the contiguous rows");
    static const int unnamed[3] = {4, 10, 13};
    for (int u = 0; u < 3; u++)
        for (int64_t i = 0; i < Hkv * P * D; i++)
            same &= kpd[unnamed[u] * Hkv * P * D + i] == (float)unnamed_before[unnamed[u] * Hkv * P * D + i];
    LT_CHECK_MSG(same, "kv_store: a block no table names changed");
    /* attention over both layouts, without and with a window */
    lm_tensor *q = lt_random_tensor(&r, LM_F32, 4, qs, 1.0);
    for (int64_t window = 0; window <= 5; window += 5) {
        lm_tensor *o1 = lt_poisoned_tensor(LM_F32, 4, qs), *o2 = lt_poisoned_tensor(LM_F32, 4, qs);
        lm_kv_attention_params ap = {0.35f, window, NULL};
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, V(q), V(kc), V(vc), V(sl), V(po), &ap, V(o1)));
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, V(q), V(kp), V(vp), V(tb), V(po), &ap, V(o2)));
        double *a = lt_view_to_f64(V(o1)), *b2 = lt_view_to_f64(V(o2));
        lt_check_close(window ? "paged attention, window 5" : "paged attention", b2, a, B * T * Hq * D, 1e-12, 1e-6);
        lm_ctx_set_impl(g_ctx, LM_IMPL_REF); /* the reference level too */
        LT_CHECK_OK(lm_attention_cache_out(g_ctx, V(q), V(kp), V(vp), V(tb), V(po), &ap, V(o2)));
        lm_ctx_set_impl(g_ctx, LM_IMPL_AUTO);
        double *c = lt_view_to_f64(V(o2));
        lt_check_close("paged attention, reference level", c, a, B * T * Hq * D, 1e-10, 1e-5);
        free(a), free(b2), free(c);
        lm_tensor_destroy(o1), lm_tensor_destroy(o2);
    }
    /* refusals */
    int32_t bad_block[B * NB] = {3, 9, 1, 12, 3, 5, 14, 7, 11, 2, 6, 8}; /* row 1 entry 2: block 14 of 14 */
    int32_t shared_read[B * NB] = {3, 9, 1, 12, 3, 5, 0, 7, 3, 2, 6, 8}; /* all three rows read block 3: fine */
    int32_t double_write[B * NB] = {3, 9, 1, 12, 3, 5, 9, 7, 11, 2, 6, 8}; /* rows 0 and 1 both write block 9 */
    int32_t past[B * T] = {5, 6, 9, 10, 15, 16};
    lm_tensor *t1 = i32(2, ts, bad_block), *t2 = i32(2, ts, shared_read), *t3 = i32(2, ts, double_write);
    lm_tensor *p4 = i32(2, ps, past);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(kp), V(x), V(t1), V(po)), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "block 14") != NULL);
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(kp), V(x), V(t2), V(po)));
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(kp), V(x), V(t3), V(po)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "both write block 9") != NULL);
    LT_CHECK_STATUS(lm_kv_store_out(g_ctx, V(kp), V(x), V(tb), V(p4)), LM_OUT_OF_RANGE);
    /* qkv_rope_store: the same q, and the stored rows land in their blocks */
    const int64_t W = (Hq + 2 * Hkv) * D;
    int64_t ws3[3] = {B, T, W}, fs[1] = {D / 2};
    lm_tensor *qkv = lt_random_tensor(&r, LM_F32, 3, ws3, 1.0), *inv = lt_random_tensor(&r, LM_F32, 1, fs, 0.5);
    lm_tensor *q1 = lt_poisoned_tensor(LM_F32, 4, qs), *q2 = lt_poisoned_tensor(LM_F32, 4, qs);
    lm_qkv_rope_params rp = {Hq, NULL, NULL, NULL, 1e-6f, V(inv), 1.0f};
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, V(qkv), &rp, V(sl), V(po), V(kc), V(vc), V(q1)));
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, V(qkv), &rp, V(tb), V(po), V(kp), V(vp), V(q2)));
    double *a = lt_view_to_f64(V(q1)), *b2 = lt_view_to_f64(V(q2));
    lt_check_close("paged qkv_rope_store q", b2, a, B * T * Hq * D, 0, 0);
    same = 1;
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < Hkv; h++)
                for (int d = 0; d < D; d++) {
                    int j = pos[b * T + t];
                    int64_t blk = table[b * NB + j / P];
                    same &= kpd[((blk * Hkv + h) * P + j % P) * D + d] == k[((b * Hkv + h) * PC + j) * D + d];
                    same &= vpd[((blk * Hkv + h) * P + j % P) * D + d] == v[((b * Hkv + h) * PC + j) * D + d];
                }
    LT_CHECK_MSG(same, "qkv_rope_store: the paged rows differ from the contiguous rows");
    free(a), free(b2), free(unnamed_before);
    lm_tensor *all[] = {tb, sl, po, kc, vc, kp, vp, x, xv, q, t1, t2, t3, p4, qkv, inv, q1, q2};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

/* qkv_rope_store equals slice -> bias -> rmsnorm -> rope -> kv_store through the
 * public operators, for q, the k cache and the v cache. */
static void test_qkv_rope_store_equals_its_composition(void) {
    lt_rng r = lt_rng_seed(13);
    const int64_t S = 2, Hq = 4, Hkv = 2, P = 12, D = 8, B = 2, T = 3, W = (Hq + 2 * Hkv) * D;
    int64_t cs[4] = {S, Hkv, P, D}, xs[3] = {B, T, W}, qs[4] = {B, T, Hq, D}, bs[1] = {B}, ps[2] = {B, T};
    int64_t ws[1] = {W}, ds[1] = {D}, fs[1] = {D / 2};
    lm_tensor *qkv = lt_random_tensor(&r, LM_F32, 3, xs, 1.0), *bias = lt_random_tensor(&r, LM_F32, 1, ws, 0.3);
    lm_tensor *qn = lt_random_tensor(&r, LM_F32, 1, ds, 1.0), *kn = lt_random_tensor(&r, LM_F32, 1, ds, 1.0);
    lm_tensor *inv = lt_random_tensor(&r, LM_F32, 1, fs, 0.5);
    int32_t slots[2] = {1, 0}, pos[6] = {2, 3, 4, 9, 10, 11};
    lm_tensor *sl = i32(1, bs, slots), *po = i32(2, ps, pos);
    lm_tensor *kc = NULL, *vc = NULL, *kc2 = NULL, *vc2 = NULL, *q = lt_poisoned_tensor(LM_F32, 4, qs);
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &kc));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &vc));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &kc2));
    LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &vc2));
    lm_qkv_rope_params p = {Hq, V(bias), V(qn), V(kn), 1e-5f, V(inv), 1.25f};
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, V(qkv), &p, V(sl), V(po), V(kc), V(vc), V(q)));
    /* the composition */
    lm_tensor *x = NULL;
    LT_CHECK_OK(lm_add(g_ctx, V(qkv), V(bias), &x));
    lm_tensor_view h4, part[3];
    int64_t h4s[4] = {B, T, Hq + 2 * Hkv, D};
    LT_CHECK_OK(lm_tensor_view_reshape(V(x), 4, h4s, &h4));
    LT_CHECK_OK(lm_tensor_view_slice(&h4, 2, 0, Hq, 1, &part[0]));
    LT_CHECK_OK(lm_tensor_view_slice(&h4, 2, Hq, Hq + Hkv, 1, &part[1]));
    LT_CHECK_OK(lm_tensor_view_slice(&h4, 2, Hq + Hkv, Hq + 2 * Hkv, 1, &part[2]));
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, &part[0], V(qn), 1e-5f, &part[0]));
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, &part[1], V(kn), 1e-5f, &part[1]));
    lm_rope_params rp = {LM_ROPE_SPLIT_HALF, V(inv), 1.25f, V(po), 0, NULL};
    LT_CHECK_OK(lm_rope_out(g_ctx, &part[0], &rp, &part[0]));
    LT_CHECK_OK(lm_rope_out(g_ctx, &part[1], &rp, &part[1]));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(kc2), &part[1], V(sl), V(po)));
    LT_CHECK_OK(lm_kv_store_out(g_ctx, V(vc2), &part[2], V(sl), V(po)));
    double *gq = lt_view_to_f64(V(q)), *wq = lt_view_to_f64(&part[0]);
    double *gk = lt_view_to_f64(V(kc)), *wk = lt_view_to_f64(V(kc2)), *gv = lt_view_to_f64(V(vc)), *wv = lt_view_to_f64(V(vc2));
    lt_check_close("qkv_rope_store q", gq, wq, B * T * Hq * D, 1e-12, 1e-5);
    lt_check_close("qkv_rope_store k cache", gk, wk, S * Hkv * P * D, 1e-12, 1e-5);
    lt_check_close("qkv_rope_store v cache", gv, wv, S * Hkv * P * D, 1e-12, 1e-5);
    free(gq), free(wq), free(gk), free(wk), free(gv), free(wv);
    lm_qkv_rope_params half = p;
    half.k_norm = NULL;
    LT_CHECK_STATUS(lm_qkv_rope_store_out(g_ctx, V(qkv), &half, V(sl), V(po), V(kc), V(vc), V(q)), LM_INVALID_ARGUMENT);
    lm_tensor *all[] = {qkv, bias, qn, kn, inv, sl, po, kc, vc, kc2, vc2, q, x};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

/* linear_qkv_rope_store equals lm_linear_out (no bias) into qkv, then qkv_rope_store
 * with the bias, to the bit (its CPU level is that composition: this checks which
 * argument goes where); and its argument errors. */
static void test_linear_qkv_rope_store_equals_its_parts(void) {
    lt_rng r = lt_rng_seed(15);
    const int64_t S = 3, Hq = 4, Hkv = 2, P = 16, D = 8, B = 2, T = 2, K = 24, W = (Hq + 2 * Hkv) * D;
    int64_t cs[4] = {S, Hkv, P, D}, xs[2] = {B * T, K}, wsh[2] = {W, K}, qs[4] = {B, T, Hq, D}, bs[1] = {B};
    int64_t ps[2] = {B, T}, ws[1] = {W}, ks[1] = {K}, fs[1] = {D / 2}, q2[2] = {B * T, W}, q3[3] = {B, T, W};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *w = lt_random_tensor(&r, LM_BF16, 2, wsh, 0.3);
    lm_tensor *bias = lt_random_tensor(&r, LM_F32, 1, ws, 0.3), *nw = lt_random_tensor(&r, LM_F32, 1, ks, 1.0);
    lm_tensor *inv = lt_random_tensor(&r, LM_F32, 1, fs, 0.5), *qkv = lt_poisoned_tensor(LM_F32, 2, q2);
    int32_t slots[2] = {2, 0}, pos[4] = {5, 6, 13, 14};
    lm_tensor *sl = i32(1, bs, slots), *po = i32(2, ps, pos);
    lm_tensor *kc = lt_poisoned_tensor(LM_F32, 4, cs), *vc = lt_poisoned_tensor(LM_F32, 4, cs);
    lm_tensor *kc2 = lt_poisoned_tensor(LM_F32, 4, cs), *vc2 = lt_poisoned_tensor(LM_F32, 4, cs);
    lm_tensor *q = lt_poisoned_tensor(LM_F32, 4, qs), *qw = lt_poisoned_tensor(LM_F32, 4, qs);
    lm_linear_params lp = {.input = LM_LINEAR_IN_RMSNORM, .norm_weight = V(nw), .eps = 1e-6f};
    lm_qkv_rope_params rp = {Hq, V(bias), NULL, NULL, 0.f, V(inv), 1.1f};
    LT_CHECK_OK(lm_linear_qkv_rope_store_out(g_ctx, V(x), V(w), &lp, &rp, V(sl), V(po), V(kc), V(vc), V(q)));
    lm_tensor_view v3;
    LT_CHECK_OK(lm_linear_out(g_ctx, V(x), V(w), NULL, &lp, V(qkv)));
    LT_CHECK_OK(lm_tensor_view_reshape(V(qkv), 3, q3, &v3));
    LT_CHECK_OK(lm_qkv_rope_store_out(g_ctx, &v3, &rp, V(sl), V(po), V(kc2), V(vc2), V(qw)));
    const lm_tensor *got[3] = {q, kc, vc}, *want[3] = {qw, kc2, vc2};
    for (int i = 0; i < 3; i++) {
        double *a = lt_view_to_f64(V(got[i])), *b = lt_view_to_f64(V(want[i]));
        int64_t n = lm_tensor_numel(got[i]), differ = 0;
        for (int64_t j = 0; j < n; j++) differ += !(a[j] == b[j] || (isnan(a[j]) && isnan(b[j])));
        LT_CHECK_MSG(differ == 0, "linear_qkv_rope_store %s: %lld of %lld values differ from the parts'",
                     i == 0 ? "q" : i == 1 ? "k cache" : "v cache", (long long)differ, (long long)n);
        free(a), free(b);
    }
    lm_linear_params acc = lp;
    acc.accumulate = 1;
    LT_CHECK_STATUS(lm_linear_qkv_rope_store_out(g_ctx, V(x), V(w), &acc, &rp, V(sl), V(po), V(kc), V(vc), V(q)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "accumulate") != NULL);
    lm_qkv_rope_params five = rp;
    five.q_heads = 6; /* (6 + 4) * 8 = 80 outputs, w has 64 */
    five.bias = NULL;
    LT_CHECK_STATUS(lm_linear_qkv_rope_store_out(g_ctx, V(x), V(w), &lp, &five, V(sl), V(po), V(kc), V(vc), V(q)),
                    LM_SHAPE_MISMATCH);
    lm_tensor_view xk; /* the k cache over x's storage: written while x is read */
    int64_t xk4[4] = {2, Hkv, 3, D}; /* all of x's 96 floats */
    LT_CHECK_OK(lm_tensor_view_init(&xk, lm_tensor_data(x), LM_F32, lm_device_cpu(), 4, xk4, NULL));
    int32_t own[2] = {0, 1}, p0[4] = {0, 1, 0, 1};
    lm_tensor *sl0 = i32(1, bs, own), *po0 = i32(2, ps, p0);
    lm_tensor_view xv = xk;
    xv.data = (float *)lm_tensor_data(vc); /* a v cache of the same shape elsewhere */
    LT_CHECK_STATUS(lm_linear_qkv_rope_store_out(g_ctx, V(x), V(w), &lp, &rp, V(sl0), V(po0), &xk, &xv, V(q)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "k_cache") != NULL, "error: %s", lm_last_error());
    lm_tensor_destroy(sl0), lm_tensor_destroy(po0);
    LT_CHECK_STATUS(lm_linear_qkv_rope_store_out(g_ctx, V(x), V(w), NULL, &rp, V(sl), V(po), V(kc), V(vc), V(q)),
                    LM_INVALID_ARGUMENT);
    LT_CHECK(lm_linear_qkv_rope_fused(lm_device_cpu(), LM_LINEAR_IN_RMSNORM, 1, K, LM_F32, LM_BF16, 0) == 0);
    lm_tensor *all[] = {x, w, bias, nw, inv, qkv, sl, po, kc, vc, kc2, vc2, q, qw};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

/* linear_swiglu equals lm_linear_out into [M, 2I], then lm_swiglu_out of its halves, to
 * the bit, for both input forms with a bias, into f32 and bf16; and its errors. */
static void test_linear_swiglu_equals_its_parts(void) {
    lt_rng r = lt_rng_seed(16);
    const int64_t M = 3, K = 16, I = 10;
    int64_t xs[2] = {M, K}, ws[2] = {2 * I, K}, bs[1] = {2 * I}, ks[1] = {K}, ys[2] = {M, 2 * I}, os[2] = {M, I};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *w = lt_random_tensor(&r, LM_BF16, 2, ws, 0.3);
    lm_tensor *b = lt_random_tensor(&r, LM_F32, 1, bs, 0.3), *nw = lt_random_tensor(&r, LM_F32, 1, ks, 1.0);
    lm_tensor *y = lt_poisoned_tensor(LM_F32, 2, ys);
    for (int form = 0; form < 2; form++)
        for (int bf = 0; bf < 2; bf++) {
            lm_dtype odt = bf ? LM_BF16 : LM_F32;
            lm_tensor *out = lt_poisoned_tensor(odt, 2, os), *want = lt_poisoned_tensor(odt, 2, os);
            lm_linear_params p = {.input = form ? LM_LINEAR_IN_RMSNORM : LM_LINEAR_IN, .norm_weight = V(nw), .eps = 1e-6f};
            LT_CHECK_OK(lm_linear_swiglu_out(g_ctx, V(x), V(w), V(b), &p, V(out)));
            LT_CHECK_OK(lm_linear_out(g_ctx, V(x), V(w), V(b), &p, V(y)));
            lm_tensor_view gate, up;
            LT_CHECK_OK(lm_tensor_view_slice(V(y), 1, 0, I, 1, &gate));
            LT_CHECK_OK(lm_tensor_view_slice(V(y), 1, I, 2 * I, 1, &up));
            LT_CHECK_OK(lm_swiglu_out(g_ctx, &gate, &up, V(want)));
            double *a = lt_view_to_f64(V(out)), *e = lt_view_to_f64(V(want));
            int64_t differ = 0;
            for (int64_t i = 0; i < M * I; i++) differ += a[i] != e[i];
            LT_CHECK_MSG(differ == 0, "linear_swiglu form %d into %s: %lld values differ from the parts'", form,
                         lm_dtype_name(odt), (long long)differ);
            free(a), free(e);
            lm_tensor_destroy(out), lm_tensor_destroy(want);
        }
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, os);
    lm_linear_params acc = {.input = LM_LINEAR_IN, .accumulate = 1};
    LT_CHECK_STATUS(lm_linear_swiglu_out(g_ctx, V(x), V(w), NULL, &acc, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "accumulate") != NULL);
    lm_linear_params plain = {.input = LM_LINEAR_IN};
    LT_CHECK_STATUS(lm_linear_swiglu_out(g_ctx, V(x), V(w), NULL, &plain, V(y)), LM_SHAPE_MISMATCH); /* [M, 2I] out */
    int64_t w3[2] = {2 * I + 1, K};
    lm_tensor *odd = lt_random_tensor(&r, LM_BF16, 2, w3, 0.3);
    LT_CHECK_STATUS(lm_linear_swiglu_out(g_ctx, V(x), V(odd), NULL, &plain, V(o)), LM_SHAPE_MISMATCH);
    LT_CHECK(strstr(lm_last_error(), "even") != NULL);
    LT_CHECK(lm_linear_swiglu_fused(lm_device_cpu(), LM_LINEAR_IN_RMSNORM, 1, K, LM_F32, LM_BF16) == 0);
    lm_tensor *all[] = {x, w, b, nw, y, o, odd};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
}

/* The fused Linear for each input form, with and without bias and accumulate,
 * against the composition rmsnorm/swiglu -> matmul (transposed weight) -> add. */
static void test_linear_equals_its_composition(void) {
    lt_rng r = lt_rng_seed(14);
    const int64_t M = 3, K = 16, N = 10;
    for (int form = 0; form < 3; form++)
        for (int acc = 0; acc < 2; acc++) {
            int64_t xs[2] = {M, form == LM_LINEAR_IN_SWIGLU ? 2 * K : K}, ws[2] = {N, K}, os[2] = {M, N};
            int64_t bs[1] = {N}, ks[1] = {K}, is[2] = {M, K};
            lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *w = lt_random_tensor(&r, LM_BF16, 2, ws, 0.3);
            lm_tensor *b = lt_random_tensor(&r, LM_F32, 1, bs, 0.3), *nw = lt_random_tensor(&r, LM_F32, 1, ks, 1.0);
            lm_tensor *out = lt_random_tensor(&r, LM_F32, 2, os, 1.0), *in = NULL, *mm = NULL, *want = NULL;
            double *res = lt_view_to_f64(V(out));
            lm_linear_params p = {.input = (lm_linear_input)form, .norm_weight = V(nw), .eps = 1e-6f, .accumulate = acc};
            LT_CHECK_OK(lm_linear_out(g_ctx, V(x), V(w), V(b), &p, V(out)));
            LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_F32, 2, is, &in));
            if (form == LM_LINEAR_IN) LT_CHECK_OK(lm_tensor_view_copy(g_ctx, V(in), V(x)));
            if (form == LM_LINEAR_IN_RMSNORM) LT_CHECK_OK(lm_rmsnorm_out(g_ctx, V(x), V(nw), 1e-6f, V(in)));
            if (form == LM_LINEAR_IN_SWIGLU) {
                lm_tensor_view g, u;
                LT_CHECK_OK(lm_tensor_view_slice(V(x), 1, 0, K, 1, &g));
                LT_CHECK_OK(lm_tensor_view_slice(V(x), 1, K, 2 * K, 1, &u));
                LT_CHECK_OK(lm_swiglu_out(g_ctx, &g, &u, V(in)));
            }
            lm_tensor_view wt;
            LT_CHECK_OK(lm_tensor_view_transpose(V(w), 0, 1, &wt));
            LT_CHECK_OK(lm_matmul(g_ctx, V(in), &wt, &mm));
            LT_CHECK_OK(lm_add(g_ctx, V(mm), V(b), &want));
            double *got = lt_view_to_f64(V(out)), *w64 = lt_view_to_f64(V(want));
            for (int64_t i = 0; acc && i < M * N; i++) w64[i] += res[i];
            char what[48];
            snprintf(what, sizeof what, "linear form %d accumulate %d", form, acc);
            lt_check_close(what, got, w64, M * N, 1e-12, 1e-5);
            free(got), free(w64), free(res);
            lm_tensor *all[] = {x, w, b, nw, out, in, mm, want};
            for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) lm_tensor_destroy(all[i]);
        }
    int64_t xs[2] = {2, 8}, ws[2] = {4, 6}, os[2] = {2, 4};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1.0), *w = lt_random_tensor(&r, LM_F32, 2, ws, 1.0);
    lm_tensor *o = lt_poisoned_tensor(LM_F32, 2, os);
    LT_CHECK_STATUS(lm_linear_out(g_ctx, V(x), V(w), NULL, NULL, V(o)), LM_SHAPE_MISMATCH);
    int64_t w8[2] = {4, 8};
    lm_tensor *wk = lt_random_tensor(&r, LM_F32, 2, w8, 1.0);
    lm_linear_params nonorm = {.input = LM_LINEAR_IN_RMSNORM, .eps = 1e-6f};
    LT_CHECK_STATUS(lm_linear_out(g_ctx, V(x), V(wk), NULL, &nonorm, V(o)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "norm weight") != NULL);
    lm_tensor_destroy(x), lm_tensor_destroy(w), lm_tensor_destroy(wk), lm_tensor_destroy(o);
}

static lm_tensor *params_tensor(const lm_sample_params *p) {
    int64_t n = LM_SAMPLE_PARAMS_BYTES;
    lm_tensor *t = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, &n, p, &t));
    return t;
}

/* Greedy is the argmax; a draw repeats for the same (seed, draw, row); top-k 1 leaves
 * the argmax; top-p and min-p keep exactly their sets; draws over a small vocabulary
 * follow the softmax (each frequency within 5 standard errors over 4000 draws). */
static void test_sample_rules(void) {
    const int64_t R = 1, Vn = 5;
    int64_t ls[2] = {R, Vn}, is[1] = {R};
    float logits[5] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
    lm_tensor *lg = NULL, *ids = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_F32, 2, ls, logits, &lg));
    LT_CHECK_OK(lm_tensor_create(lm_device_cpu(), LM_I32, 1, is, &ids));
    lm_sample_params p = {.greedy = 1, .temperature = 1.0f, .top_p = 1.0f};
    lm_tensor *pt = params_tensor(&p);
    LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)));
    LT_CHECK(((int32_t *)lm_tensor_data(ids))[0] == 1); /* ties: the lower id */
    lm_tensor_destroy(pt);
    int counts[5] = {0};
    double z = 0, prob[5];
    for (int j = 0; j < 5; j++) z += exp(logits[j]);
    for (int j = 0; j < 5; j++) prob[j] = exp(logits[j]) / z;
    for (uint64_t d = 0; d < 4000; d++) {
        lm_sample_params s = {.temperature = 1.0f, .top_p = 1.0f, .seed = 7, .draw = d};
        pt = params_tensor(&s);
        LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)));
        int32_t id = ((int32_t *)lm_tensor_data(ids))[0];
        LT_CHECK_MSG(id >= 0 && id < 5, "draw %llu: id %d outside the vocabulary", (unsigned long long)d, id);
        if (id >= 0 && id < 5) counts[id]++;
        if (d == 3) { /* the same draw again */
            LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)));
            LT_CHECK(((int32_t *)lm_tensor_data(ids))[0] == id);
        }
        lm_tensor_destroy(pt);
    }
    for (int j = 0; j < 5; j++) {
        double se = sqrt(prob[j] * (1 - prob[j]) / 4000.0), f = counts[j] / 4000.0;
        LT_CHECK_MSG(fabs(f - prob[j]) <= 5 * se, "token %d drawn %.4f of the time, softmax %.4f", j, f, prob[j]);
    }
    lm_sample_params k1 = {.temperature = 0.7f, .top_k = 1, .top_p = 1.0f, .seed = 3};
    pt = params_tensor(&k1);
    LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)));
    LT_CHECK(((int32_t *)lm_tensor_data(ids))[0] == 1);
    lm_tensor_destroy(pt);
    /* top-p 0.7 keeps the rank prefix {1, 3} (0.379 + 0.379 >= 0.7); min-p 0.3 keeps
     * p >= 0.3 p_max: {1, 3, 4} (token 4 at 0.368 p_max, token 0 at 0.223). Every draw
     * stays in the kept set, and each member of it is drawn. */
    const struct {
        float top_p, min_p;
        unsigned kept; /* bit j: token j may be drawn */
    } cut[2] = {{0.7f, 0.0f, (1u << 1) | (1u << 3)}, {1.0f, 0.3f, (1u << 1) | (1u << 3) | (1u << 4)}};
    for (int c = 0; c < 2; c++) {
        unsigned seen = 0;
        for (uint64_t d = 0; d < 300; d++) {
            lm_sample_params s = {.temperature = 1.0f, .top_p = cut[c].top_p, .min_p = cut[c].min_p, .seed = 11, .draw = d};
            pt = params_tensor(&s);
            LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)));
            int32_t id = ((int32_t *)lm_tensor_data(ids))[0];
            if (id >= 0 && id < 5) seen |= 1u << id;
            else LT_CHECK_MSG(0, "id %d outside the vocabulary", id);
            lm_tensor_destroy(pt);
        }
        LT_CHECK_MSG(seen == cut[c].kept, "top_p %g min_p %g: drew the set %#x, expected %#x", cut[c].top_p,
                     cut[c].min_p, seen, cut[c].kept);
    }
    lm_sample_params bad = {.temperature = -1.0f, .top_p = 1.0f};
    pt = params_tensor(&bad);
    LT_CHECK_STATUS(lm_sample_out(g_ctx, V(lg), V(pt), NULL, V(ids)), LM_INVALID_ARGUMENT);
    lm_tensor_destroy(pt);
    lm_tensor_destroy(lg), lm_tensor_destroy(ids);
}

/* One record per row: the same record repeated equals the single record; with
 * LM_SAMPLE_OWN_STREAM a row's token does not depend on its place (permuting the rows
 * and their records permutes the ids); a record count other than 1 or R, and unknown
 * flags, are refused. */
static void test_sample_per_row_records(void) {
    lt_rng g = lt_rng_seed(5);
    enum { R = 6, VN = 50 };
    int64_t ls[2] = {R, VN}, is[1] = {R}, pb[1] = {R * LM_SAMPLE_PARAMS_BYTES};
    lm_tensor *lg = lt_random_tensor(&g, LM_F32, 2, ls, 2.0), *perm_lg = lt_random_tensor(&g, LM_F32, 2, ls, 1.0);
    lm_tensor *ids = lt_poisoned_tensor(LM_I32, 1, is), *ids2 = lt_poisoned_tensor(LM_I32, 1, is);
    lm_sample_params one = {.temperature = 0.9f, .top_k = 20, .top_p = 0.95f, .seed = 77, .draw = 4}, rec[R];
    for (int i = 0; i < R; i++) rec[i] = one;
    lm_tensor *pt1 = params_tensor(&one), *ptr = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, pb, rec, &ptr));
    LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(pt1), NULL, V(ids)));
    LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(ptr), NULL, V(ids2)));
    LT_CHECK(memcmp(lm_tensor_data(ids), lm_tensor_data(ids2), sizeof(int32_t) * R) == 0);
    lm_tensor_destroy(ptr);
    /* own streams, different settings per row; then the rows reversed */
    for (int i = 0; i < R; i++) {
        rec[i] = (lm_sample_params){.greedy = i == 0, .temperature = 0.5f + 0.2f * (float)i, .top_k = i == 1 ? 1 : 0,
                                    .top_p = 1.0f, .flags = LM_SAMPLE_OWN_STREAM, .seed = 100 + (uint64_t)i, .draw = (uint64_t)i};
    }
    lm_sample_params rev[R];
    float *a = lm_tensor_data(lg), *b = lm_tensor_data(perm_lg);
    for (int i = 0; i < R; i++) rev[i] = rec[R - 1 - i], memcpy(b + i * VN, a + (R - 1 - i) * VN, sizeof(float) * VN);
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, pb, rec, &ptr));
    lm_tensor *ptv = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, pb, rev, &ptv));
    LT_CHECK_OK(lm_sample_out(g_ctx, V(lg), V(ptr), NULL, V(ids)));
    LT_CHECK_OK(lm_sample_out(g_ctx, V(perm_lg), V(ptv), NULL, V(ids2)));
    const int32_t *x = lm_tensor_data(ids), *y = lm_tensor_data(ids2);
    for (int i = 0; i < R; i++) LT_CHECK_MSG(x[i] == y[R - 1 - i], "row %d: %d, reversed %d", i, x[i], y[R - 1 - i]);
    int32_t amax0 = 0, amax1 = 0;
    for (int j = 1; j < VN; j++) amax0 = a[j] > a[amax0] ? j : amax0, amax1 = a[VN + j] > a[VN + amax1] ? j : amax1;
    LT_CHECK(x[0] == amax0 && x[1] == amax1); /* greedy, and top_k 1 */
    /* 2 records for 6 rows; unknown flags */
    int64_t two[1] = {2 * LM_SAMPLE_PARAMS_BYTES};
    lm_tensor *pt2 = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, two, rec, &pt2));
    LT_CHECK_STATUS(lm_sample_out(g_ctx, V(lg), V(pt2), NULL, V(ids)), LM_SHAPE_MISMATCH);
    rec[3].flags = 6;
    lm_tensor *ptb = NULL;
    LT_CHECK_OK(lm_tensor_from_host(lm_device_cpu(), LM_U8, 1, pb, rec, &ptb));
    LT_CHECK_STATUS(lm_sample_out(g_ctx, V(lg), V(ptb), NULL, V(ids)), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "row 3") != NULL);
    lm_tensor_destroy(pt1), lm_tensor_destroy(ptr), lm_tensor_destroy(ptv), lm_tensor_destroy(pt2), lm_tensor_destroy(ptb);
    lm_tensor_destroy(lg), lm_tensor_destroy(perm_lg), lm_tensor_destroy(ids), lm_tensor_destroy(ids2);
}

/* The mixed forms the GPU step uses (f32 rows normalized into bf16, SwiGLU into
 * bf16, bf16 rows widened into f32) equal the f32 form rounded once: within half a
 * bf16 ulp of the f32 result plus its own f32 rounding (|d| <= 2^-8 |y| + 1e-6). */
static void test_mixed_dtype_forms_round_once(void) {
    lt_rng r = lt_rng_seed(41);
    int64_t xs[2] = {5, 24}, ws[1] = {24};
    lm_tensor *x = lt_random_tensor(&r, LM_F32, 2, xs, 1), *res = lt_random_tensor(&r, LM_F32, 2, xs, 1);
    lm_tensor *w = lt_random_tensor(&r, LM_F32, 1, ws, 1), *up = lt_random_tensor(&r, LM_F32, 2, xs, 1);
    lm_tensor *f = lt_poisoned_tensor(LM_F32, 2, xs), *b = lt_poisoned_tensor(LM_BF16, 2, xs);
    lm_tensor *sum1 = lt_poisoned_tensor(LM_F32, 2, xs), *sum2 = lt_poisoned_tensor(LM_F32, 2, xs);
    for (int form = 0; form < 3; form++) {
        if (form == 0) {
            LT_CHECK_OK(lm_rmsnorm_out(g_ctx, V(x), V(w), 1e-5f, V(f)));
            LT_CHECK_OK(lm_rmsnorm_out(g_ctx, V(x), V(w), 1e-5f, V(b)));
        } else if (form == 1) {
            LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, V(x), V(res), V(w), 1e-5f, V(sum1), V(f)));
            LT_CHECK_OK(lm_add_rmsnorm_out(g_ctx, V(x), V(res), V(w), 1e-5f, V(sum2), V(b)));
            LT_CHECK(memcmp(lm_tensor_data(sum1), lm_tensor_data(sum2), sizeof(float) * 120) == 0);
        } else {
            LT_CHECK_OK(lm_swiglu_out(g_ctx, V(x), V(up), V(f)));
            LT_CHECK_OK(lm_swiglu_out(g_ctx, V(x), V(up), V(b)));
        }
        for (int64_t i = 0; i < 120; i++) {
            float y = ((const float *)lm_tensor_data(f))[i], z = lm_bf16_to_f32(((const uint16_t *)lm_tensor_data(b))[i]);
            LT_CHECK_MSG(fabsf(z - y) <= 0x1p-8f * fabsf(y) + 1e-6f, "form %d element %lld: bf16 %g, f32 %g", form,
                         (long long)i, z, y);
        }
    }
    /* in place is only for one dtype: out over x's memory in bf16 is refused */
    lm_tensor_view xb = *V(x);
    xb.dtype = LM_BF16;
    LT_CHECK_STATUS(lm_rmsnorm_out(g_ctx, V(x), V(w), 1e-5f, &xb), LM_INVALID_ARGUMENT);
    /* an integer out is refused by name */
    int64_t is[2] = {5, 24};
    lm_tensor *oi = lt_poisoned_tensor(LM_I32, 2, is);
    LT_CHECK(lm_rmsnorm_out(g_ctx, V(x), V(w), 1e-5f, V(oi)) != LM_OK && strstr(lm_last_error(), "out"));
    LT_CHECK(lm_swiglu_out(g_ctx, V(x), V(up), V(oi)) != LM_OK && strstr(lm_last_error(), "out"));
    lm_tensor *all[] = {x, res, w, up, f, b, sum1, sum2, oi};
    for (int i = 0; i < 9; i++) lm_tensor_destroy(all[i]);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_attention_cache_matches_double);
    LT_RUN(test_kv_store_writes_only_its_rows);
    LT_RUN(test_qkv_rope_store_equals_its_composition);
    LT_RUN(test_paged_cache_equals_contiguous);
    LT_RUN(test_linear_equals_its_composition);
    LT_RUN(test_linear_qkv_rope_store_equals_its_parts);
    LT_RUN(test_linear_swiglu_equals_its_parts);
    LT_RUN(test_sample_rules);
    LT_RUN(test_sample_per_row_records);
    LT_RUN(test_mixed_dtype_forms_round_once);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
