/* ops/cpu/attention_avx2.c — AVX2+FMA kernels for lm__cpu_attention (ymm = 8 lanes).
 *
 * Same structure as the AVX-512 path within 16 registers:
 *  row-lane scores: tiles of NV ymm of rows (up to 32) by JB keys with NV * JB <= 12
 *          accumulators; an overlapping last tile covers key counts off the JB grid.
 *  row-lane softmax: per 8 rows, a masked max pass and an exp2 pass (exponent built
 *          by an integer shift; 2^n for n <= -127 is exactly 0).
 *  key-lane scores (<= 4 rows): per row and 8 keys, 8 dot-product accumulators (q
 *          chunk of up to 4 ymm in registers), then an 8-way transpose-and-add.
 *  pv:     tiles of up to 4 rows by 16 Dv columns; tails below 8 columns (and D
 *          tails in the dot products) use masked loads, which never touch masked-out
 *          memory.
 * Compiled with generic flags: each function carries LM__TARGET_AVX2.
 */
#include "ops/cpu/attention_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX2

enum { LANES = 8, ROWS_MAX = 32, KL_ROWS_MAX = 4, BK = 64, PV_RB = 4, PV_EV = 2, KL_NV = 4 };

/* 2^x for x in [-inf, 127]: x = n + f with |f| <= 1/2; n is clamped to -127, whose
 * exponent field 0 turns the result into 0. NaN propagates through the polynomial. */
INLINE __m256 exp2_ps(__m256 x) {
    x = _mm256_min_ps(_mm256_set1_ps(127.0f), _mm256_max_ps(_mm256_set1_ps(-127.0f), x));
    __m256 n = _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 f = _mm256_sub_ps(x, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(LM__EXP2_C6), f, _mm256_set1_ps(LM__EXP2_C5));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(LM__EXP2_C4));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(LM__EXP2_C3));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(LM__EXP2_C2));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(LM__EXP2_C1));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(1.0f));
    __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

INLINE void score_tile(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, const int NV,
                       const int JB, float *st) {
    __m256 acc[8][4];
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) acc[j][u] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m256 qv[4];
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) qv[u] = _mm256_load_ps(qt + d * rp + 8 * u);
#pragma GCC unroll 8
        for (int j = 0; j < JB; j++) {
            __m256 kv = _mm256_broadcast_ss(k + j * ldk + d);
#pragma GCC unroll 4
            for (int u = 0; u < NV; u++) acc[j][u] = _mm256_fmadd_ps(qv[u], kv, acc[j][u]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) _mm256_store_ps(st + j * rp + 8 * u, acc[j][u]);
}

INLINE void score_strip(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, int64_t nk,
                        const int NV, float *st) {
    const int JB = NV == 4 ? 3 : NV == 3 ? 4 : NV == 2 ? 6 : 8;
    if (nk < JB) {
        for (int64_t j = 0; j < nk; j++) score_tile(qt, rp, D, k + j * ldk, ldk, NV, 1, st + j * rp);
        return;
    }
    int64_t j = 0;
    for (; j + JB <= nk; j += JB) score_tile(qt, rp, D, k + j * ldk, ldk, NV, JB, st + j * rp);
    if (j < nk) score_tile(qt, rp, D, k + (nk - JB) * ldk, ldk, NV, JB, st + (nk - JB) * rp);
}

LM__TARGET_AVX2 static void scores_rl_avx2(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk,
                                           int64_t nk, float *st) {
    for (int64_t r = 0; r < rp; r += 32) {
        switch (LM_MIN(4, (rp - r) / 8)) {
        case 1: score_strip(qt + r, rp, D, k, ldk, nk, 1, st + r); break;
        case 2: score_strip(qt + r, rp, D, k, ldk, nk, 2, st + r); break;
        case 3: score_strip(qt + r, rp, D, k, ldk, nk, 3, st + r); break;
        default: score_strip(qt + r, rp, D, k, ldk, nk, 4, st + r); break;
        }
    }
}

LM__TARGET_AVX2 static void softmax_rl_avx2(float *st, int64_t rp, int64_t nk, const int32_t *last, float *m, float *l,
                                            float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t c = 0; c < rp; c += 8) {
        __m256i lastv = last ? _mm256_loadu_si256((const __m256i *)(last + c)) : _mm256_set1_epi32(INT32_MAX);
        __m256 mx0 = ninf, mx1 = ninf;
        for (int64_t j = 0; j < nk; j++) {
            __m256 vis = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lastv, _mm256_set1_epi32((int)j - 1)));
            __m256 s = _mm256_blendv_ps(ninf, _mm256_load_ps(st + j * rp + c), vis);
            if (j & 1) mx1 = _mm256_max_ps(mx1, s);
            else mx0 = _mm256_max_ps(mx0, s);
        }
        __m256 mo = _mm256_load_ps(m + c);
        __m256 mn = _mm256_max_ps(mo, _mm256_max_ps(mx0, mx1));
        /* rows with nothing visible yet shift by 0: every p and alpha below is 0 */
        __m256 ms = _mm256_blendv_ps(mn, _mm256_setzero_ps(), _mm256_cmp_ps(mn, ninf, _CMP_EQ_OQ));
        __m256 a = exp2_ps(_mm256_sub_ps(mo, ms));
        __m256 sum0 = _mm256_setzero_ps(), sum1 = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j++) {
            __m256 vis = _mm256_castsi256_ps(_mm256_cmpgt_epi32(lastv, _mm256_set1_epi32((int)j - 1)));
            float *sp = st + j * rp + c;
            __m256 p = _mm256_and_ps(vis, exp2_ps(_mm256_sub_ps(_mm256_load_ps(sp), ms)));
            _mm256_store_ps(sp, p);
            if (j & 1) sum1 = _mm256_add_ps(sum1, p);
            else sum0 = _mm256_add_ps(sum0, p);
        }
        _mm256_store_ps(l + c, _mm256_fmadd_ps(_mm256_load_ps(l + c), a, _mm256_add_ps(sum0, sum1)));
        _mm256_store_ps(m + c, mn);
        _mm256_store_ps(alpha + c, a);
    }
}

/* Lanes where the lane index is below n (all for n >= 8, none for n <= 0). */
INLINE __m256i lanes_below(int64_t n) {
    int c = (int)LM_MAX(0, LM_MIN(8, n));
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(c), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INLINE float hmax8(__m256 x) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

INLINE float hadd8(__m256 x) {
    __m128 h = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    h = _mm_add_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

/* Lane j of the result = the sum of the 8 lanes of a[j] (interleave-and-add within
 * 128-bit lanes, then across them). */
INLINE __m256 hsum8(const __m256 a[8]) {
    __m256 b[4], c[2];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        b[i] = _mm256_add_ps(_mm256_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm256_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++) {
        __m256d x = _mm256_castps_pd(b[2 * i]), y = _mm256_castps_pd(b[2 * i + 1]);
        c[i] = _mm256_add_ps(_mm256_castpd_ps(_mm256_unpacklo_pd(x, y)), _mm256_castpd_ps(_mm256_unpackhi_pd(x, y)));
    }
    return _mm256_add_ps(_mm256_permute2f128_ps(c[0], c[1], 0x20), _mm256_permute2f128_ps(c[0], c[1], 0x31));
}

/* acc[jj] += q[0 .. len) * key jj lane-wise for 8 keys, len <= 8 NV, the last ymm
 * masked by tail; keys past n repeat key n - 1 (in bounds, never stored). */
INLINE void dot8_chunk(const float *q, const float *k, int64_t ldk, int64_t n, const int NV, __m256i tail,
                       __m256 acc[8]) {
    __m256 qv[KL_NV];
#pragma GCC unroll 4
    for (int u = 0; u < NV; u++) qv[u] = u == NV - 1 ? _mm256_maskload_ps(q + 8 * u, tail) : _mm256_loadu_ps(q + 8 * u);
#pragma GCC unroll 8
    for (int jj = 0; jj < 8; jj++) {
        const float *kr = k + (jj < n ? jj : n - 1) * ldk;
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) {
            __m256 kv = u == NV - 1 ? _mm256_maskload_ps(kr + 8 * u, tail) : _mm256_loadu_ps(kr + 8 * u);
            acc[jj] = _mm256_fmadd_ps(qv[u], kv, acc[jj]);
        }
    }
}

LM__TARGET_AVX2 static void scores_kl_avx2(const float *q, int64_t ldq, int64_t rows, int64_t D, const float *k,
                                           int64_t ldk, int64_t nk, float *s, int64_t lds) {
    for (int64_t j0 = 0; j0 < nk; j0 += 8) {
        int64_t n = LM_MIN(8, nk - j0);
        const float *kj = k + j0 * ldk;
        for (int64_t r = 0; r < rows; r++) {
            __m256 acc[8];
#pragma GCC unroll 8
            for (int jj = 0; jj < 8; jj++) acc[jj] = _mm256_setzero_ps();
            for (int64_t d = 0; d < D; d += 8 * KL_NV) {
                int64_t len = LM_MIN(8 * KL_NV, D - d);
                __m256i tail = lanes_below(len - (len - 1) / 8 * 8);
                const float *qd = q + r * ldq + d, *kd = kj + d;
                switch ((len + 7) / 8) {
                case 1: dot8_chunk(qd, kd, ldk, n, 1, tail, acc); break;
                case 2: dot8_chunk(qd, kd, ldk, n, 2, tail, acc); break;
                case 3: dot8_chunk(qd, kd, ldk, n, 3, tail, acc); break;
                default: dot8_chunk(qd, kd, ldk, n, 4, tail, acc); break;
                }
            }
            _mm256_maskstore_ps(s + r * lds + j0, lanes_below(n), hsum8(acc));
        }
    }
}

LM__TARGET_AVX2 static void softmax_kl_avx2(float *s, int64_t lds, int64_t rows, int64_t nk, const int32_t *last,
                                            float *m, float *l, float *alpha) {
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        int64_t n = last ? LM_MAX(0, LM_MIN(nk, (int64_t)last[r] + 1)) : nk; /* visible keys j < n */
        __m256 mx = ninf;
        for (int64_t j = 0; j < n; j += 8) {
            __m256i vis = lanes_below(n - j);
            mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, _mm256_maskload_ps(sr + j, vis), _mm256_castsi256_ps(vis)));
        }
        float mn = fmaxf(m[r], hmax8(mx));
        float ms = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: every p and alpha is 0 */
        __m256 msv = _mm256_set1_ps(ms), sum = _mm256_setzero_ps();
        for (int64_t j = 0; j < nk; j += 8) {
            __m256i in = lanes_below(nk - j), vis = lanes_below(n - j);
            __m256 p = exp2_ps(_mm256_sub_ps(_mm256_maskload_ps(sr + j, in), msv));
            p = _mm256_and_ps(_mm256_castsi256_ps(vis), p);
            _mm256_maskstore_ps(sr + j, in, p);
            sum = _mm256_add_ps(sum, p);
        }
        float a = _mm256_cvtss_f32(exp2_ps(_mm256_set1_ps(m[r] - ms)));
        l[r] = l[r] * a + hadd8(sum);
        m[r] = mn;
        alpha[r] = a;
    }
}

/* acc rows [0, RB) x columns [0, 8 EV); MASKED (EV = 1 only): columns where mk is set. */
INLINE void pv_tile(const float *pt, int64_t prs, int64_t pjs, const int RB, int64_t nk, const float *v, int64_t ldv,
                    const int EV, const int MASKED, __m256i mk, const float *alpha, float *acc, int64_t lda) {
    __m256 a[PV_RB][PV_EV];
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++) {
        __m256 al = _mm256_set1_ps(alpha[r]);
#pragma GCC unroll 2
        for (int u = 0; u < EV; u++) {
            const float *ap = acc + r * lda + 8 * u;
            a[r][u] = _mm256_mul_ps(MASKED ? _mm256_maskload_ps(ap, mk) : _mm256_loadu_ps(ap), al);
        }
    }
    for (int64_t j = 0; j < nk; j++) {
        __m256 vv[PV_EV];
#pragma GCC unroll 2
        for (int u = 0; u < EV; u++) {
            const float *vp = v + j * ldv + 8 * u;
            vv[u] = MASKED ? _mm256_maskload_ps(vp, mk) : _mm256_loadu_ps(vp);
        }
#pragma GCC unroll 4
        for (int r = 0; r < RB; r++) {
            __m256 p = _mm256_broadcast_ss(pt + r * prs + j * pjs);
#pragma GCC unroll 2
            for (int u = 0; u < EV; u++) a[r][u] = _mm256_fmadd_ps(vv[u], p, a[r][u]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 2
        for (int u = 0; u < EV; u++) {
            float *ap = acc + r * lda + 8 * u;
            if (MASKED) _mm256_maskstore_ps(ap, mk, a[r][u]);
            else _mm256_storeu_ps(ap, a[r][u]);
        }
}

INLINE void pv_rows(const float *pt, int64_t prs, int64_t pjs, const int RB, int64_t nk, const float *v, int64_t ldv,
                    int64_t Dv, const float *alpha, float *acc, int64_t lda) {
    const __m256i none = _mm256_setzero_si256();
    int64_t e = 0;
    for (; e + 16 <= Dv; e += 16) pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 2, 0, none, alpha, acc + e, lda);
    if (e + 8 <= Dv) {
        pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 1, 0, none, alpha, acc + e, lda);
        e += 8;
    }
    if (e < Dv) {
        __m256i mk = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(Dv - e)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 1, 1, mk, alpha, acc + e, lda);
    }
}

LM__TARGET_AVX2 static void pv_avx2(const float *pt, int64_t prs, int64_t pjs, int64_t rows, int64_t nk,
                                    const float *v, int64_t ldv, int64_t Dv, const float *alpha, float *acc,
                                    int64_t lda) {
    int64_t groups = (rows + PV_RB - 1) / PV_RB;
    for (int64_t gi = 0, r = 0; gi < groups; gi++) {
        int64_t rb = (rows - r) / (groups - gi) + ((rows - r) % (groups - gi) != 0);
        const float *p = pt + r * prs;
        float *a = acc + r * lda;
        switch (rb) {
        case 1: pv_rows(p, prs, pjs, 1, nk, v, ldv, Dv, alpha + r, a, lda); break;
        case 2: pv_rows(p, prs, pjs, 2, nk, v, ldv, Dv, alpha + r, a, lda); break;
        case 3: pv_rows(p, prs, pjs, 3, nk, v, ldv, Dv, alpha + r, a, lda); break;
        default: pv_rows(p, prs, pjs, 4, nk, v, ldv, Dv, alpha + r, a, lda); break;
        }
        r += rb;
    }
}

const lm__attn_kernels lm__attn_kernels_avx2 = {
    .lanes = LANES, .rows_max = ROWS_MAX, .kl_rows_max = KL_ROWS_MAX, .bk = BK,
    .scores_rl = scores_rl_avx2, .softmax_rl = softmax_rl_avx2,
    .scores_kl = scores_kl_avx2, .softmax_kl = softmax_kl_avx2, .pv = pv_avx2,
};

#endif
