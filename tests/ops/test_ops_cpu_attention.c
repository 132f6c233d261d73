/* Tests for the tuned CPU attention (ops/cpu/attention.c) through lm_attention_out with
 * contexts forcing LM_IMPL_TUNED, on every instruction-set path this CPU runs and with
 * 1 and 2 threads. Fresh random inputs are compared with a float64 loop and with the
 * reference level (LM_IMPL_REF): decode (Tq = 1, Tk = 1..3000, split keys), causal
 * prefill up to Tq = Tk = 1024, chunked prefill (Tq < Tk), GQA groups 1/2/4/7 and MQA,
 * head dims 32/64/72/128 and small odd ones, D != Dv, contiguous, permuted
 * [B, T, H, D] and KV-cache-slice views. Outputs are NaN-poisoned slices of wider
 * buffers (nothing outside the view may change); results must be bit-identical across
 * thread counts. Dispatch (fallback, forced tuned, forced ref), zero sizes and
 * workspace allocation failure are checked with exact statuses.
 * Fast precision (the thread's, as a fast model's forward sets it; AVX512_BF16 CPUs):
 * prefill's row-lane products on bf16 operands. Gates: per element against a float64
 * emulation whose q (times scale log2 e), k and v are rounded to bf16 as the kernels
 * round them, |y - emul| <= 2^-8 sum_j (p_j / l) |v_j| + 1e-5 (the probabilities' own
 * rounding, relative 2^-8 each, is the one step the emulation leaves out; f32 sums and
 * the exp2 polynomial are far below it); NMSE <= 1e-4 against exact float64; 1 vs 2
 * threads bit-identical; decode's key-lane rows bit-identical to exact mode.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "ops/cpu/isa.h"
#include "ops/cpu/precision.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Gate vs float64: q.k sums over D <= 128 terms and the online sums over up to 3000
 * keys are f32 (relative error ~1e-7 * sqrt(terms)) and the exp2 polynomial is within
 * 2e-9, so outputs carry relative errors ~1e-6 at worst: the worst case here measured
 * NMSE 5e-13, max-abs 1.2e-6. 1e-10 leaves a 200x margin while one wrong, missing or
 * extra key costs >= 1e-5. Outputs are convex combinations of |v| < ~5. */
#define NMSE_TOL 1e-10
#define ABS_TOL 1e-4

static lm_ctx *g_ref;       /* LM_IMPL_REF, 1 thread */
static lm_ctx *g_tuned[2];  /* LM_IMPL_TUNED with 1 and 2 threads */

enum { LAYOUT_CONTIGUOUS, LAYOUT_PERMUTED, LAYOUT_CACHE, LAYOUT_COUNT };

typedef struct attn_case {
    int64_t B, Hq, Hkv, Tq, Tk, D, Dv;
    int causal, layout;
} attn_case;

typedef struct operands {
    lm_tensor *bufs[4];     /* owned storage of q, k, v, out */
    lm_tensor_view q, k, v; /* [B, Hq, Tq, D], [B, Hkv, Tk, D], [B, Hkv, Tk, Dv] */
    lm_tensor_view out;     /* [B, Hq, Tq, Dv]; heads first of a wider buffer unless contiguous */
} operands;

static const int k_bthd[4] = {0, 2, 1, 3}; /* [B, T, H, D] <-> [B, H, T, D] */

/* A [B, T, H, D] buffer (H + extra heads) viewed as [B, H, T, D] over its first H heads. */
static lm_tensor *heads_view(lm_tensor *t, int64_t H, lm_tensor_view *out) {
    lm_tensor_view s;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(t), 2, 0, H, 1, &s));
    LT_CHECK_OK(lm_tensor_view_permute(&s, k_bthd, out));
    return t;
}

/* K or V as the [0, T) slice of a cache [B, H, T + 7, D] (the layout of nn/kv_cache);
 * the 7 positions past T are NaN, so a kernel that reads past the view's last key shows. */
static lm_tensor *cache_view(lt_rng *r, int64_t B, int64_t H, int64_t T, int64_t D, lm_tensor_view *out) {
    int64_t s[4] = {B, H, T + 7, D};
    lm_tensor *t = lt_random_tensor(r, LM_F32, 4, s, 1.0);
    float *p = lm_tensor_data(t);
    for (int64_t bh = 0; bh < B * H; bh++)
        for (int64_t i = T * D; i < (T + 7) * D; i++) p[bh * (T + 7) * D + i] = NAN;
    LT_CHECK_OK(lm_tensor_view_slice(lm_tensor_as_view(t), 2, 0, T, 1, out));
    return t;
}

static lm_tensor *operand(lt_rng *r, const attn_case *c, int which, lm_tensor_view *out) {
    int64_t H = which == 0 ? c->Hq : c->Hkv, T = which == 0 ? c->Tq : c->Tk, D = which == 2 ? c->Dv : c->D;
    if (c->layout == LAYOUT_CACHE && which > 0) return cache_view(r, c->B, H, T, D, out);
    if (c->layout == LAYOUT_CONTIGUOUS) {
        int64_t s[4] = {c->B, H, T, D};
        lm_tensor *t = lt_random_tensor(r, LM_F32, 4, s, 1.0);
        *out = *lm_tensor_as_view(t);
        return t;
    }
    int64_t s[4] = {c->B, T, H, D};
    return heads_view(lt_random_tensor(r, LM_F32, 4, s, 1.0), H, out);
}

static operands make_operands(lt_rng *r, const attn_case *c) {
    operands x;
    x.bufs[0] = operand(r, c, 0, &x.q);
    x.bufs[1] = operand(r, c, 1, &x.k);
    x.bufs[2] = operand(r, c, 2, &x.v);
    if (c->layout == LAYOUT_CONTIGUOUS) {
        int64_t s[4] = {c->B, c->Hq, c->Tq, c->Dv};
        x.bufs[3] = lt_poisoned_tensor(LM_F32, 4, s);
        x.out = *lm_tensor_as_view(x.bufs[3]);
    } else { /* one spare head per position must stay poisoned */
        int64_t s[4] = {c->B, c->Tq, c->Hq + 1, c->Dv};
        x.bufs[3] = heads_view(lt_poisoned_tensor(LM_F32, 4, s), c->Hq, &x.out);
    }
    return x;
}

static void free_operands(operands *x) {
    for (int i = 0; i < 4; i++) lm_tensor_destroy(x->bufs[i]);
}

/* Row-major [B, Hq, Tq, Dv] attention in double over the visible keys of each row. */
static double *attention_f64(const operands *x, double scale, int causal) {
    int64_t B = x->q.shape[0], Hq = x->q.shape[1], Tq = x->q.shape[2], D = x->q.shape[3];
    int64_t Hkv = x->k.shape[1], Tk = x->k.shape[2], Dv = x->v.shape[3];
    double *q = lt_view_to_f64(&x->q), *k = lt_view_to_f64(&x->k), *v = lt_view_to_f64(&x->v);
    double *out = calloc((size_t)(B * Hq * Tq * Dv + 1), sizeof(double));
    double *s = malloc(sizeof(double) * (size_t)(Tk + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const double *qi = q + ((b * Hq + h) * Tq + i) * D;
                int64_t g = b * Hkv + h / (Hq / Hkv); /* kv head, indexed: never expanded */
                const double *kh = k + g * Tk * D, *vh = v + g * Tk * Dv;
                int64_t n = causal ? i + Tk - Tq + 1 : Tk;
                double mx = -INFINITY, z = 0;
                for (int64_t j = 0; j < n; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kh[j * D + d];
                    s[j] = dot * scale;
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = 0; j < n; j++) z += s[j] = exp(s[j] - mx);
                double *o = out + ((b * Hq + h) * Tq + i) * Dv;
                for (int64_t j = 0; j < n; j++)
                    for (int64_t e = 0; e < Dv; e++) o[e] += s[j] / z * vh[j * Dv + e];
            }
    free(q), free(k), free(v), free(s);
    return out;
}

/* 1 if every element of the output buffer outside the view is still NaN. */
static int spare_heads_untouched(const operands *x, const attn_case *c) {
    if (c->layout == LAYOUT_CONTIGUOUS) return 1;
    const float *p = lm_tensor_data(x->bufs[3]);
    for (int64_t bt = 0; bt < c->B * c->Tq; bt++)
        for (int64_t e = 0; e < c->Dv; e++)
            if (!isnan(p[(bt * (c->Hq + 1) + c->Hq) * c->Dv + e])) return 0;
    return 1;
}

static void describe(char *buf, size_t n, const char *what, const attn_case *c, int isa, int threads) {
    snprintf(buf, n, "%s B%lld Hq%lld Hkv%lld Tq%lld Tk%lld D%lld Dv%lld causal%d layout%d %s %dt", what,
             (long long)c->B, (long long)c->Hq, (long long)c->Hkv, (long long)c->Tq, (long long)c->Tk,
             (long long)c->D, (long long)c->Dv, c->causal, c->layout, lm__cpu_isa_name((lm__cpu_isa)isa), threads);
}

/* Runs c on every ISA path with 1 and 2 threads against float64 and (with_ref) the
 * reference level; results of 1 and 2 threads must be bit-identical. */
static void check_case(lt_rng *r, const attn_case *c, int with_ref) {
    operands x = make_operands(r, c);
    float scale = (float)(1.0 / sqrt((double)(c->D ? c->D : 1)));
    int64_t n = c->B * c->Hq * c->Tq * c->Dv;
    double *want = attention_f64(&x, (double)scale, c->causal), *ref = NULL;
    char what[200];
    if (with_ref) {
        LT_CHECK_OK(lm_attention_out(g_ref, &x.q, &x.k, &x.v, scale, c->causal, &x.out));
        ref = lt_view_to_f64(&x.out);
        describe(what, sizeof what, "ref vs f64", c, 0, 1);
        lt_check_close(what, ref, want, n, NMSE_TOL, ABS_TOL);
    }
    for (int isa = 0; isa < LM__CPU_ISA_COUNT; isa++) {
        if (!lm__cpu_isa_supported((lm__cpu_isa)isa)) continue;
        LT_CHECK_OK(lm__cpu_set_isa_override(isa));
        double *first = NULL;
        for (int t = 0; t < 2; t++) {
            LT_CHECK_OK(lm_tensor_view_poison(NULL, &x.out));
            LT_CHECK_OK(lm_attention_out(g_tuned[t], &x.q, &x.k, &x.v, scale, c->causal, &x.out));
            double *got = lt_view_to_f64(&x.out);
            describe(what, sizeof what, "tuned vs f64", c, isa, t + 1);
            lt_check_close(what, got, want, n, NMSE_TOL, ABS_TOL);
            if (ref) {
                describe(what, sizeof what, "tuned vs ref", c, isa, t + 1);
                lt_check_close(what, got, ref, n, NMSE_TOL, ABS_TOL);
            }
            describe(what, sizeof what, "spare heads poisoned", c, isa, t + 1);
            LT_CHECK_MSG(spare_heads_untouched(&x, c), "%s", what);
            if (t == 0) first = got;
            else {
                describe(what, sizeof what, "1 vs 2 threads bitwise", c, isa, 2);
                LT_CHECK_MSG(memcmp(first, got, sizeof(double) * (size_t)n) == 0, "%s", what);
                free(got);
            }
        }
        free(first);
    }
    LT_CHECK_OK(lm__cpu_set_isa_override(LM__CPU_ISA_AUTO));
    free(want), free(ref);
    free_operands(&x);
}

static void test_random_shapes_match_f64_and_ref(void) {
    lt_rng r = lt_rng_seed(71);
    static const int64_t groups[] = {1, 2, 4, 7}, dims[] = {1, 3, 8, 16, 17, 32, 64, 72, 128};
    for (int trial = 0; trial < 24; trial++) {
        attn_case c;
        c.causal = (int)lt_rng_int(&r, 0, 1);
        c.layout = trial % LAYOUT_COUNT;
        c.B = lt_rng_int(&r, 1, 2);
        c.Hkv = lt_rng_int(&r, 1, 2);
        c.Hq = c.Hkv * groups[lt_rng_int(&r, 0, 3)];
        c.Tq = lt_rng_int(&r, 1, 24);
        c.Tk = c.causal ? c.Tq + lt_rng_int(&r, 0, 70) : lt_rng_int(&r, 1, 90);
        c.D = dims[lt_rng_int(&r, 0, 8)];
        c.Dv = lt_rng_int(&r, 0, 2) ? c.D : dims[lt_rng_int(&r, 0, 8)];
        check_case(&r, &c, 1);
    }
}

static void test_decode_one_query_over_1_to_3000_keys(void) {
    lt_rng r = lt_rng_seed(72);
    /* block (64) and split (256) boundaries, their neighbours, and long caches */
    static const int64_t tks[] = {1, 2, 3, 17, 63, 64, 65, 255, 256, 257, 511, 512, 513, 1000, 2049, 3000};
    /* Hq, Hkv, D: groups of 7, 8, 1, 4 and 2 cover both score layouts on every path */
    static const int64_t heads[][3] = {{14, 2, 64}, {8, 1, 128}, {4, 4, 32}, {32, 8, 72}, {16, 8, 128}};
    for (int i = 0; i < (int)(sizeof tks / sizeof tks[0]); i++) {
        const int64_t *h = heads[i % 5];
        attn_case c = {1, h[0], h[1], 1, tks[i], h[2], h[2], i % 3 != 2, LAYOUT_CACHE};
        check_case(&r, &c, tks[i] <= 513);
    }
}

static void test_causal_prefill_up_to_1024(void) {
    lt_rng r = lt_rng_seed(73);
    static const attn_case cases[] = {
        {1, 14, 2, 64, 64, 64, 64, 1, LAYOUT_PERMUTED},  {2, 4, 1, 65, 65, 128, 128, 1, LAYOUT_CONTIGUOUS},
        {1, 7, 1, 200, 200, 72, 72, 1, LAYOUT_CACHE},    {1, 7, 1, 512, 512, 64, 64, 1, LAYOUT_PERMUTED},
        {1, 2, 1, 1024, 1024, 32, 32, 1, LAYOUT_CACHE},  {1, 3, 3, 300, 300, 32, 32, 0, LAYOUT_PERMUTED},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) check_case(&r, &cases[i], cases[i].Tq <= 200);
}

static void test_chunked_prefill_sees_the_cached_prefix(void) {
    lt_rng r = lt_rng_seed(74);
    /* Tq < Tk causal: a few queries over a long cache (split keys with masked rows in
     * the last split; 3-4 rows take the key-lane layout), and medium chunks where
     * blocks straddle the diagonal. */
    static const attn_case cases[] = {
        {1, 14, 2, 5, 700, 64, 64, 1, LAYOUT_CACHE},    {1, 8, 1, 3, 257, 128, 128, 1, LAYOUT_CACHE},
        {1, 2, 2, 3, 300, 64, 64, 1, LAYOUT_CACHE},     {1, 4, 2, 2, 600, 128, 128, 1, LAYOUT_PERMUTED},
        {2, 8, 2, 37, 300, 64, 64, 1, LAYOUT_PERMUTED}, {1, 16, 16, 100, 1000, 32, 32, 1, LAYOUT_CACHE},
        {1, 7, 7, 9, 40, 72, 40, 1, LAYOUT_CONTIGUOUS},
    };
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) check_case(&r, &cases[i], cases[i].Tk <= 300);
}

/* attention_f64 with the scores in log2 units (q times qscale = scale log2 e, in f32 as
 * the kernel computes it), a window (> 0: query i sees keys j > i + Tk - Tq - window),
 * and (round) q * qscale, k and v rounded to bf16; conv[i] = sum_j (p_j / l) |v_j[e]| of
 * each output element. */
static double *attention_f64_bf16(const operands *x, float scale, int causal, int64_t window, int round,
                                  double **conv_out) {
    int64_t B = x->q.shape[0], Hq = x->q.shape[1], Tq = x->q.shape[2], D = x->q.shape[3];
    int64_t Hkv = x->k.shape[1], Tk = x->k.shape[2], Dv = x->v.shape[3];
    const float qscale = (float)((double)scale * 1.4426950408889634);
    double *q = lt_view_to_f64(&x->q), *k = lt_view_to_f64(&x->k), *v = lt_view_to_f64(&x->v);
    int64_t nq = B * Hq * Tq * D, nk = B * Hkv * Tk * D, nv = B * Hkv * Tk * Dv;
    for (int64_t i = 0; i < nq; i++) q[i] = round ? lm_bf16_to_f32(lm_f32_to_bf16((float)q[i] * qscale)) : q[i] * qscale;
    for (int64_t i = 0; i < nk && round; i++) k[i] = lm_bf16_to_f32(lm_f32_to_bf16((float)k[i]));
    for (int64_t i = 0; i < nv && round; i++) v[i] = lm_bf16_to_f32(lm_f32_to_bf16((float)v[i]));
    double *out = calloc((size_t)(B * Hq * Tq * Dv + 1), sizeof(double));
    double *conv = calloc((size_t)(B * Hq * Tq * Dv + 1), sizeof(double));
    double *s = malloc(sizeof(double) * (size_t)(Tk + 1));
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < Hq; h++)
            for (int64_t i = 0; i < Tq; i++) {
                const double *qi = q + ((b * Hq + h) * Tq + i) * D;
                int64_t g = b * Hkv + h / (Hq / Hkv);
                const double *kh = k + g * Tk * D, *vh = v + g * Tk * Dv;
                int64_t n = causal ? i + Tk - Tq + 1 : Tk, j0 = window > 0 ? LM_MAX(0, n - window) : 0;
                double mx = -INFINITY, z = 0;
                for (int64_t j = j0; j < n; j++) {
                    double dot = 0;
                    for (int64_t d = 0; d < D; d++) dot += qi[d] * kh[j * D + d];
                    s[j] = dot;
                    mx = fmax(mx, s[j]);
                }
                for (int64_t j = j0; j < n; j++) z += s[j] = exp2(s[j] - mx);
                double *o = out + ((b * Hq + h) * Tq + i) * Dv, *cv = conv + ((b * Hq + h) * Tq + i) * Dv;
                for (int64_t j = j0; j < n; j++)
                    for (int64_t e = 0; e < Dv; e++) o[e] += s[j] / z * vh[j * Dv + e], cv[e] += s[j] / z * fabs(vh[j * Dv + e]);
            }
    free(q), free(k), free(v), free(s);
    *conv_out = conv;
    return out;
}

/* One case at fast precision on the avx512 path, 1 and 2 threads (see the header). */
static double g_fast_worst_nmse;
static void check_fast_case(lt_rng *r, const attn_case *c, int64_t window) {
    operands x = make_operands(r, c);
    float scale = (float)(1.0 / sqrt((double)c->D));
    int64_t n = c->B * c->Hq * c->Tq * c->Dv;
    double *conv = NULL, *conv0 = NULL, *emul = attention_f64_bf16(&x, scale, c->causal, window, 1, &conv);
    double *want = attention_f64_bf16(&x, scale, c->causal, window, 0, &conv0);
    char what[200];
    LT_CHECK_OK(lm_tensor_view_poison(NULL, &x.out));
    LT_CHECK_OK(lm_attention_window_out(g_tuned[1], &x.q, &x.k, &x.v, scale, c->causal, window, &x.out));
    double *exact = lt_view_to_f64(&x.out), *first = NULL;
    lm_precision old = lm__cpu_precision_set(LM_PRECISION_FAST);
    for (int t = 0; t < 2; t++) {
        LT_CHECK_OK(lm_tensor_view_poison(NULL, &x.out));
        LT_CHECK_OK(lm_attention_window_out(g_tuned[t], &x.q, &x.k, &x.v, scale, c->causal, window, &x.out));
        double *got = lt_view_to_f64(&x.out);
        describe(what, sizeof what, window ? "fast, windowed" : "fast", c, LM__CPU_ISA_AVX512, t + 1);
        int bad = 0;
        for (int64_t i = 0; i < n && !bad; i++) {
            double tol = ldexp(1.0, -8) * conv[i] + 1e-5;
            if (!(fabs(got[i] - emul[i]) <= tol)) {
                LT_CHECK_MSG(0, "%s: element %lld = %.9g, bf16 emulation %.9g (bound %.3g)", what, (long long)i, got[i],
                             emul[i], tol);
                bad = 1;
            }
        }
        double sq = 0, ref = 0;
        for (int64_t i = 0; i < n; i++) sq += (got[i] - want[i]) * (got[i] - want[i]), ref += want[i] * want[i];
        double nmse = sq / (ref > 0 ? ref : 1);
        LT_CHECK_MSG(nmse <= 1e-4, "%s: NMSE %.3g against exact float64 > 1e-4", what, nmse);
        if (nmse > g_fast_worst_nmse) g_fast_worst_nmse = nmse;
        LT_CHECK_MSG(spare_heads_untouched(&x, c), "%s: spare heads written", what);
        if (t == 0) {
            first = got;
        } else {
            LT_CHECK_MSG(memcmp(first, got, sizeof(double) * (size_t)n) == 0, "%s: 1 vs 2 threads differ", what);
            /* decode's few rows (key lanes) stay f32; prefill's row lanes take bf16 */
            int keylanes = c->Tq * (c->Hq / c->Hkv) <= 7;
            int same = memcmp(exact, got, sizeof(double) * (size_t)n) == 0;
            LT_CHECK_MSG(keylanes ? same : !same, "%s: fast %s exact (%s lanes)", what, same ? "equals" : "differs from",
                         keylanes ? "key" : "row");
            free(got);
        }
    }
    lm__cpu_precision_set(old);
    free(first), free(exact), free(emul), free(conv), free(want), free(conv0);
    free_operands(&x);
}

static void test_fast_precision_row_lanes_on_bf16(void) {
    if (!lm__cpu_bf16dot_runs()) {
        printf("  (no AVX512_BF16 on the active path: fast attention is not tested here)\n");
        return;
    }
    lt_rng r = lt_rng_seed(75);
    static const attn_case cases[] = {
        /* prefill (row lanes): GQA 7, odd head dims and key counts, D != Dv, block edges,
         * non-causal, chunked prefill over a cache, all layouts */
        {1, 14, 2, 64, 64, 64, 64, 1, LAYOUT_PERMUTED},   {1, 7, 1, 200, 200, 72, 72, 1, LAYOUT_CACHE},
        {2, 4, 1, 65, 65, 128, 128, 1, LAYOUT_CONTIGUOUS}, {1, 8, 2, 33, 33, 17, 40, 1, LAYOUT_PERMUTED},
        {1, 3, 3, 30, 131, 3, 5, 0, LAYOUT_CONTIGUOUS},    {1, 16, 16, 100, 1000, 32, 32, 1, LAYOUT_CACHE},
        {2, 8, 2, 37, 300, 64, 64, 1, LAYOUT_PERMUTED},    {1, 7, 1, 512, 512, 64, 64, 1, LAYOUT_PERMUTED},
        {1, 7, 1, 45, 45, 64, 64, 1, LAYOUT_CACHE},        {1, 8, 2, 20, 333, 64, 48, 1, LAYOUT_CACHE},
        /* decode and 2-3 row chunks: key lanes, unchanged */
        {1, 14, 2, 1, 300, 64, 64, 1, LAYOUT_CACHE},       {1, 2, 2, 3, 300, 64, 64, 1, LAYOUT_CACHE},
    };
    g_fast_worst_nmse = 0;
    for (int i = 0; i < (int)(sizeof cases / sizeof cases[0]); i++) check_fast_case(&r, &cases[i], 0);
    /* sliding windows: one query position a task, 8-16 rows of row lanes, blocks that
     * start at odd keys (each task packs its own); and a window wider than the keys */
    static const attn_case windowed[] = {{1, 16, 2, 100, 100, 64, 64, 1, LAYOUT_PERMUTED},
                                         {1, 16, 1, 30, 200, 32, 48, 1, LAYOUT_CACHE}};
    check_fast_case(&r, &windowed[0], 37);
    check_fast_case(&r, &windowed[1], 77);
    check_fast_case(&r, &windowed[0], 500);
    printf("  fast: NMSE against exact float64 up to %.2e (gate 1e-4)\n", g_fast_worst_nmse);
}

/* Fast precision: values at positions that rows have not reached yet must not reach
 * their outputs, as in the f32 kernels. Causal Tq = Tk = 45, 7 query heads: row blocks of
 * 9 positions; the block of positions 18-26 sees keys 0-26.
 *  - Position 22 holds 3.4e38, finite in f32 but past bf16's range: rows 18-21 share
 *    its block without seeing it (p 0 must not meet an infinity), rows 22-26 see it
 *    (finite outputs, as in f32).
 *  - Position 27 holds NaN, the pair partner of key 26 that ends the block: p 0 must
 *    meet 0, never the next position's values. */
static void test_fast_attention_hides_future_values(void) {
    if (!lm__cpu_bf16dot_runs()) return;
    lt_rng r = lt_rng_seed(76);
    attn_case c = {1, 7, 1, 45, 45, 64, 64, 1, LAYOUT_CONTIGUOUS};
    operands x = make_operands(&r, &c);
    float *v = lm_tensor_data(x.bufs[2]);
    for (int64_t e = 0; e < c.Dv; e++) v[22 * c.Dv + e] = e % 2 ? 3.4e38f : -3.4e38f, v[27 * c.Dv + e] = NAN;
    lm_precision old = lm__cpu_precision_set(LM_PRECISION_FAST);
    for (int t = 0; t < 2; t++) {
        LT_CHECK_OK(lm_tensor_view_poison(NULL, &x.out));
        LT_CHECK_OK(lm_attention_out(g_tuned[t], &x.q, &x.k, &x.v, 0.125f, 1, &x.out));
        const float *o = lm_tensor_data(x.bufs[3]);
        int bad = 0;
        for (int64_t h = 0; h < c.Hq && !bad; h++)
            for (int64_t i = 0; i < 27 && !bad; i++)
                for (int64_t e = 0; e < c.Dv && !bad; e++)
                    if (!isfinite(o[(h * c.Tq + i) * c.Dv + e])) {
                        LT_CHECK_MSG(0, "%d threads: head %lld position %lld is %g (position 22 holds 3.4e38, 27 NaN)",
                                     t + 1, (long long)h, (long long)i, o[(h * c.Tq + i) * c.Dv + e]);
                        bad = 1;
                    }
    }
    lm__cpu_precision_set(old);
    free_operands(&x);
}

static void test_empty_sizes_write_zeros_or_nothing(void) {
    lt_rng r = lt_rng_seed(75);
    /* Tk = 0 without a mask: an empty softmax gives 0; B = 0 and Tq = 0 write nothing;
     * D = 0 makes every score 0, i.e. the mean of the values. */
    static const attn_case cases[] = {
        {1, 4, 2, 3, 0, 8, 8, 0, LAYOUT_PERMUTED}, {0, 4, 2, 3, 5, 8, 8, 1, LAYOUT_CONTIGUOUS},
        {1, 4, 2, 0, 5, 8, 8, 0, LAYOUT_CACHE},     {1, 4, 1, 3, 6, 0, 5, 1, LAYOUT_CONTIGUOUS},
    };
    for (int i = 0; i < 4; i++) check_case(&r, &cases[i], 1);
}

static void test_dispatch_falls_back_or_refuses_with_a_reason(void) {
    lt_rng r = lt_rng_seed(76);
    attn_case c = {1, 4, 2, 3, 5, 8, 8, 1, LAYOUT_PERMUTED};
    operands x = make_operands(&r, &c);
    lm_ctx *autoctx = NULL;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &autoctx));
    /* k with a non-unit last-dim stride: a [B, H, D, T] buffer transposed */
    int64_t s[4] = {1, 2, 8, 5};
    lm_tensor *kt = lt_random_tensor(&r, LM_F32, 4, s, 1.0);
    lm_tensor_view kv;
    LT_CHECK_OK(lm_tensor_view_transpose(lm_tensor_as_view(kt), 2, 3, &kv));
    LT_CHECK_STATUS(lm_attention_out(g_tuned[1], &x.q, &kv, &x.v, 0.5f, 1, &x.out), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "k has stride 5 along its last dim") != NULL);
    x.k = kv;
    double *want = attention_f64(&x, 0.5, 1);
    LT_CHECK_OK(lm_attention_out(autoctx, &x.q, &kv, &x.v, 0.5f, 1, &x.out)); /* auto: the reference runs */
    double *got = lt_view_to_f64(&x.out);
    lt_check_close("auto fallback on strided k", got, want, 4 * 3 * 8, NMSE_TOL, ABS_TOL);
    free(got), free(want);
    /* bf16 operands: the tuned level refuses, auto takes the reference */
    int64_t sq[4] = {1, 4, 3, 8}, sk[4] = {1, 2, 5, 8};
    lm_tensor *qb = lt_random_tensor(&r, LM_BF16, 4, sq, 1), *kb = lt_random_tensor(&r, LM_BF16, 4, sk, 1);
    lm_tensor *vb = lt_random_tensor(&r, LM_BF16, 4, sk, 1), *ob = lt_poisoned_tensor(LM_BF16, 4, sq);
    const lm_tensor_view *vq = lm_tensor_as_view(qb), *vk = lm_tensor_as_view(kb), *vv = lm_tensor_as_view(vb);
    LT_CHECK_STATUS(lm_attention_out(g_tuned[0], vq, vk, vv, 0.5f, 0, lm_tensor_as_view(ob)), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "q is bf16, not f32") != NULL);
    LT_CHECK_OK(lm_attention_out(autoctx, vq, vk, vv, 0.5f, 0, lm_tensor_as_view(ob)));
    /* Which level ran shows in the workspace error: the reference counts doubles. */
    operands y = make_operands(&r, &c);
    lm_ctx *const which[2] = {g_ref, autoctx};
    for (int i = 0; i < 2; i++) {
        lt_alloc_track(1);
        LT_CHECK_STATUS(lm_attention_out(which[i], &y.q, &y.k, &y.v, 0.5f, 1, &y.out), LM_OUT_OF_MEMORY);
        LT_CHECK(strstr(lm_last_error(), i == 0 ? "doubles" : "cpu attention workspace") != NULL);
        lt_alloc_untrack();
    }
    lm_tensor_destroy(kt), lm_tensor_destroy(qb), lm_tensor_destroy(kb), lm_tensor_destroy(vb), lm_tensor_destroy(ob);
    free_operands(&x), free_operands(&y);
    lm_ctx_destroy(autoctx);
}

static void test_one_workspace_allocation_and_no_leak_on_failure(void) {
    lt_rng r = lt_rng_seed(77);
    /* prefill (many units), decode with split keys (partials + merge counters) */
    static const attn_case cases[] = {{1, 14, 2, 40, 40, 64, 64, 1, LAYOUT_PERMUTED},
                                      {1, 14, 2, 1, 1000, 64, 64, 1, LAYOUT_CACHE}};
    for (int i = 0; i < 2; i++) {
        operands x = make_operands(&r, &cases[i]);
        for (int t = 0; t < 2; t++) {
            lt_alloc_track(1);
            LT_CHECK_STATUS(lm_attention_out(g_tuned[t], &x.q, &x.k, &x.v, 0.125f, 1, &x.out), LM_OUT_OF_MEMORY);
            LT_CHECK(strstr(lm_last_error(), "cpu attention workspace") != NULL);
            LT_CHECK(lt_alloc_live() == 0);
            lt_alloc_untrack();
            lt_alloc_track(0);
            LT_CHECK_OK(lm_attention_out(g_tuned[t], &x.q, &x.k, &x.v, 0.125f, 1, &x.out));
            LT_CHECK(lt_alloc_count() == 1 && lt_alloc_live() == 0);
            lt_alloc_untrack();
        }
        free_operands(&x);
    }
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ref));
    lm_ctx_set_impl(g_ref, LM_IMPL_REF);
    for (int t = 0; t < 2; t++) {
        LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), t + 1, &g_tuned[t]));
        lm_ctx_set_impl(g_tuned[t], LM_IMPL_TUNED);
    }
    LT_RUN(test_random_shapes_match_f64_and_ref);
    LT_RUN(test_decode_one_query_over_1_to_3000_keys);
    LT_RUN(test_causal_prefill_up_to_1024);
    LT_RUN(test_chunked_prefill_sees_the_cached_prefix);
    LT_RUN(test_fast_precision_row_lanes_on_bf16);
    LT_RUN(test_fast_attention_hides_future_values);
    LT_RUN(test_empty_sizes_write_zeros_or_nothing);
    LT_RUN(test_dispatch_falls_back_or_refuses_with_a_reason);
    LT_RUN(test_one_workspace_allocation_and_no_leak_on_failure);
    lm_ctx_destroy(g_ref);
    for (int t = 0; t < 2; t++) lm_ctx_destroy(g_tuned[t]);
    return lt_finish();
}
