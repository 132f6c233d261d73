/* ops/cpu/attention_avx512.c — AVX-512 kernels for lm__cpu_attention (zmm = 16 lanes).
 *
 * Row lanes (prefill):
 *  scores: tiles of up to 4 zmm of rows (64) by JB keys (6 keys at 64 rows, else 8):
 *          per d, NV loads of qt, JB embedded-broadcast K elements, NV * JB FMAs.
 *          A key count that is not a multiple of JB ends with one overlapping tile
 *          (recomputing a few keys gives the same values).
 *  softmax: per 16 rows, a masked max pass and an exp2 pass over the block.
 * Key lanes (decode, <= 7 rows; measured: 1.4-3x faster than row lanes for 1-7 rows):
 *  scores: per row and 16 keys, 16 dot-product accumulators (q chunk of up to 8 zmm
 *          held in registers), then one 16-way transpose-and-add reduction.
 *  softmax: per row, over 16 keys per zmm with lane masks for the causal limit.
 * pv: tiles of up to 6 rows by 4 zmm of Dv, acc held in registers across the block;
 *     the last zmm of a row is masked so Dv needs no padding.
 * Fast precision (lm__attn_fast_kernels, below): the row-lane scores and pv on bf16
 * pairs with VDPBF16PS.
 * Compiled with generic flags: each function carries LM__TARGET_AVX512 (the fast ones
 * LM__TARGET_AVX512BF16 and run only where lm__cpu_bf16dot_runs).
 */
#include "ops/cpu/attention_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX512

enum { LANES = 16, ROWS_MAX = 64, KL_ROWS_MAX = 7, BK = 64, PV_RB = 6, PV_EV = 4, KL_NV = 8 };

/* The first n lanes (none for n <= 0). */
INLINE __mmask16 tail_mask(int64_t n) {
    return n >= 16 ? (__mmask16)0xffff : n <= 0 ? (__mmask16)0 : (__mmask16)((1u << n) - 1u);
}

/* 2^x for x <= 0 (larger x is fine up to 127): x = n + f with |f| <= 1/2, 2^f by
 * the shared polynomial, then scalef by 2^n (which underflows cleanly to 0). */
INLINE __m512 exp2_ps(__m512 x) {
    x = _mm512_max_ps(_mm512_set1_ps(-160.0f), x); /* NaN stays NaN: max returns its second operand */
    __m512 n = _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 f = _mm512_sub_ps(x, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(LM__EXP2_C6), f, _mm512_set1_ps(LM__EXP2_C5));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM__EXP2_C4));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM__EXP2_C3));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM__EXP2_C2));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(LM__EXP2_C1));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* st[j][0 .. 16 NV) for j < JB: NV and JB are constants after inlining. */
INLINE void score_tile(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, const int NV,
                       const int JB, float *st) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) acc[j][u] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d++) {
        __m512 qv[4];
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) qv[u] = _mm512_load_ps(qt + d * rp + 16 * u);
#pragma GCC unroll 8
        for (int j = 0; j < JB; j++) {
            __m512 kv = _mm512_set1_ps(k[j * ldk + d]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; u++) acc[j][u] = _mm512_fmadd_ps(qv[u], kv, acc[j][u]);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) _mm512_store_ps(st + j * rp + 16 * u, acc[j][u]);
}

INLINE void score_strip(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, int64_t nk,
                        const int NV, float *st) {
    const int JB = NV == 4 ? 6 : 8;
    if (nk < JB) {
        for (int64_t j = 0; j < nk; j++) score_tile(qt, rp, D, k + j * ldk, ldk, NV, 1, st + j * rp);
        return;
    }
    int64_t j = 0;
    for (; j + JB <= nk; j += JB) score_tile(qt, rp, D, k + j * ldk, ldk, NV, JB, st + j * rp);
    if (j < nk) score_tile(qt, rp, D, k + (nk - JB) * ldk, ldk, NV, JB, st + (nk - JB) * rp);
}

LM__TARGET_AVX512 static void scores_rl_avx512(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk,
                                               int64_t nk, float *st) {
    for (int64_t r = 0; r < rp; r += 64) {
        switch (LM_MIN(4, (rp - r) / 16)) {
        case 1: score_strip(qt + r, rp, D, k, ldk, nk, 1, st + r); break;
        case 2: score_strip(qt + r, rp, D, k, ldk, nk, 2, st + r); break;
        case 3: score_strip(qt + r, rp, D, k, ldk, nk, 3, st + r); break;
        default: score_strip(qt + r, rp, D, k, ldk, nk, 4, st + r); break;
        }
    }
}

LM__TARGET_AVX512 static void softmax_rl_avx512(float *st, int64_t rp, int64_t nk, const int32_t *last, float *m,
                                                float *l, float *alpha) {
    const __m512 ninf = _mm512_set1_ps(-INFINITY);
    for (int64_t c = 0; c < rp; c += 16) {
        __m512i lastv = last ? _mm512_loadu_si512(last + c) : _mm512_set1_epi32(INT32_MAX);
        /* two running maxima halve the dependency chain */
        __m512 mx0 = ninf, mx1 = ninf;
        int64_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            __mmask16 v0 = _mm512_cmpge_epi32_mask(lastv, _mm512_set1_epi32((int)j));
            __mmask16 v1 = _mm512_cmpge_epi32_mask(lastv, _mm512_set1_epi32((int)j + 1));
            mx0 = _mm512_mask_max_ps(mx0, v0, mx0, _mm512_load_ps(st + j * rp + c));
            mx1 = _mm512_mask_max_ps(mx1, v1, mx1, _mm512_load_ps(st + (j + 1) * rp + c));
        }
        if (j < nk) {
            __mmask16 v0 = _mm512_cmpge_epi32_mask(lastv, _mm512_set1_epi32((int)j));
            mx0 = _mm512_mask_max_ps(mx0, v0, mx0, _mm512_load_ps(st + j * rp + c));
        }
        __m512 mo = _mm512_load_ps(m + c);
        __m512 mn = _mm512_max_ps(mo, _mm512_max_ps(mx0, mx1));
        /* rows with nothing visible yet shift by 0: every p and alpha below is 0 */
        __m512 ms = _mm512_mask_blend_ps(_mm512_cmp_ps_mask(mn, ninf, _CMP_EQ_OQ), mn, _mm512_setzero_ps());
        __m512 a = exp2_ps(_mm512_sub_ps(mo, ms));
        __m512 sum0 = _mm512_setzero_ps(), sum1 = _mm512_setzero_ps();
        for (j = 0; j < nk; j++) {
            __mmask16 vis = _mm512_cmpge_epi32_mask(lastv, _mm512_set1_epi32((int)j));
            float *sp = st + j * rp + c;
            __m512 p = _mm512_maskz_mov_ps(vis, exp2_ps(_mm512_sub_ps(_mm512_load_ps(sp), ms)));
            _mm512_store_ps(sp, p);
            if (j & 1) sum1 = _mm512_add_ps(sum1, p);
            else sum0 = _mm512_add_ps(sum0, p);
        }
        _mm512_store_ps(l + c, _mm512_fmadd_ps(_mm512_load_ps(l + c), a, _mm512_add_ps(sum0, sum1)));
        _mm512_store_ps(m + c, mn);
        _mm512_store_ps(alpha + c, a);
    }
}

/* Lane j of the result = the sum of the 16 lanes of a[j]: pairs of vectors are
 * interleaved and added (16 -> 8 -> 4 within 128-bit lanes), then the 128-bit lanes
 * are transposed and added. 45 shuffles and adds for 16 sums. */
INLINE __m512 hsum16(const __m512 a[16]) {
    __m512 b[8], c[4];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) /* per 128-bit lane: a[2i], a[2i+1], a[2i], a[2i+1] partials */
        b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* per 128-bit lane: partials of a[4i .. 4i+3] */
        __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
        c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
    }
    __m512 e01 = _mm512_add_ps(_mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(c[0], c[1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 e23 = _mm512_add_ps(_mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(1, 0, 1, 0)),
                               _mm512_shuffle_f32x4(c[2], c[3], _MM_SHUFFLE(3, 2, 3, 2)));
    return _mm512_add_ps(_mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(e01, e23, _MM_SHUFFLE(3, 1, 3, 1)));
}

/* acc[jj] += q[0 .. len) * key jj [0 .. len) lane-wise for 16 keys, len <= 16 NV; the
 * q chunk stays in NV registers. Keys past n repeat key n - 1 (in bounds, never stored). */
INLINE void dot16_chunk(const float *q, const float *k, int64_t ldk, int64_t n, const int NV, __mmask16 tail,
                        __m512 acc[16]) {
    __m512 qv[KL_NV];
    __mmask16 mk[KL_NV];
#pragma GCC unroll 8
    for (int u = 0; u < NV; u++) {
        mk[u] = u == NV - 1 ? tail : (__mmask16)0xffff;
        qv[u] = _mm512_maskz_loadu_ps(mk[u], q + 16 * u);
    }
#pragma GCC unroll 16
    for (int jj = 0; jj < 16; jj++) {
        const float *kr = k + (jj < n ? jj : n - 1) * ldk;
#pragma GCC unroll 8
        for (int u = 0; u < NV; u++)
            acc[jj] = _mm512_fmadd_ps(qv[u], _mm512_maskz_loadu_ps(mk[u], kr + 16 * u), acc[jj]);
    }
}

LM__TARGET_AVX512 static void scores_kl_avx512(const float *q, int64_t ldq, int64_t rows, int64_t D, const float *k,
                                               int64_t ldk, int64_t nk, float *s, int64_t lds) {
    for (int64_t j0 = 0; j0 < nk; j0 += 16) {
        int64_t n = LM_MIN(16, nk - j0);
        const float *kj = k + j0 * ldk;
        for (int64_t r = 0; r < rows; r++) {
            __m512 acc[16];
#pragma GCC unroll 16
            for (int jj = 0; jj < 16; jj++) acc[jj] = _mm512_setzero_ps();
            for (int64_t d = 0; d < D; d += 16 * KL_NV) {
                int64_t len = LM_MIN(16 * KL_NV, D - d);
                __mmask16 tail = tail_mask(len - (len - 1) / 16 * 16);
                const float *qd = q + r * ldq + d, *kd = kj + d;
                switch ((len + 15) / 16) {
                case 1: dot16_chunk(qd, kd, ldk, n, 1, tail, acc); break;
                case 2: dot16_chunk(qd, kd, ldk, n, 2, tail, acc); break;
                case 3: dot16_chunk(qd, kd, ldk, n, 3, tail, acc); break;
                case 4: dot16_chunk(qd, kd, ldk, n, 4, tail, acc); break;
                case 5: dot16_chunk(qd, kd, ldk, n, 5, tail, acc); break;
                case 6: dot16_chunk(qd, kd, ldk, n, 6, tail, acc); break;
                case 7: dot16_chunk(qd, kd, ldk, n, 7, tail, acc); break;
                default: dot16_chunk(qd, kd, ldk, n, 8, tail, acc); break;
                }
            }
            _mm512_mask_storeu_ps(s + r * lds + j0, tail_mask(n), hsum16(acc));
        }
    }
}

LM__TARGET_AVX512 static void softmax_kl_avx512(float *s, int64_t lds, int64_t rows, int64_t nk, const int32_t *last,
                                                float *m, float *l, float *alpha) {
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * lds;
        int64_t n = last ? LM_MAX(0, LM_MIN(nk, (int64_t)last[r] + 1)) : nk; /* visible keys j < n */
        __m512 mx = _mm512_set1_ps(-INFINITY);
        for (int64_t j = 0; j < n; j += 16) mx = _mm512_mask_max_ps(mx, tail_mask(n - j), mx, _mm512_loadu_ps(sr + j));
        float mn = fmaxf(m[r], _mm512_reduce_max_ps(mx));
        float ms = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: every p and alpha is 0 */
        __m512 msv = _mm512_set1_ps(ms), sum = _mm512_setzero_ps();
        for (int64_t j = 0; j < nk; j += 16) {
            __mmask16 in = tail_mask(nk - j);
            __m512 x = _mm512_sub_ps(_mm512_maskz_loadu_ps(in, sr + j), msv);
            __m512 p = _mm512_maskz_mov_ps(tail_mask(n - j), exp2_ps(x));
            _mm512_mask_storeu_ps(sr + j, in, p);
            sum = _mm512_add_ps(sum, p);
        }
        float a = _mm512_cvtss_f32(exp2_ps(_mm512_set1_ps(m[r] - ms)));
        l[r] = l[r] * a + _mm512_reduce_add_ps(sum);
        m[r] = mn;
        alpha[r] = a;
    }
}

/* A pv tile's accumulators: masks mk (the last zmm of a row by tail), a = alpha * acc. */
INLINE void pv_tile_load(const int RB, const int EV, __mmask16 tail, const float *alpha, const float *acc, int64_t lda,
                         __mmask16 mk[PV_EV], __m512 a[PV_RB][PV_EV]) {
#pragma GCC unroll 4
    for (int u = 0; u < EV; u++) mk[u] = u == EV - 1 ? tail : (__mmask16)0xffff;
#pragma GCC unroll 6
    for (int r = 0; r < RB; r++) {
        __m512 al = _mm512_set1_ps(alpha[r]);
#pragma GCC unroll 4
        for (int u = 0; u < EV; u++) a[r][u] = _mm512_mul_ps(_mm512_maskz_loadu_ps(mk[u], acc + r * lda + 16 * u), al);
    }
}

INLINE void pv_tile_store(const int RB, const int EV, const __mmask16 mk[PV_EV], __m512 a[PV_RB][PV_EV], float *acc,
                          int64_t lda) {
#pragma GCC unroll 6
    for (int r = 0; r < RB; r++)
#pragma GCC unroll 4
        for (int u = 0; u < EV; u++) _mm512_mask_storeu_ps(acc + r * lda + 16 * u, mk[u], a[r][u]);
}

/* Rows [0, rows) in even groups of <= PV_RB (7 rows as 4 + 3, not 6 + 1; V is re-read per
 * group): CALL(RB, r) for each group of RB rows from row r. */
#define PV_GROUPS(rows, CALL)                                                                                      \
    do {                                                                                                           \
        int64_t groups_ = ((rows) + PV_RB - 1) / PV_RB;                                                            \
        for (int64_t gi_ = 0, r = 0; gi_ < groups_; gi_++) {                                                       \
            int64_t rb_ = ((rows) - r) / (groups_ - gi_) + (((rows) - r) % (groups_ - gi_) != 0);                  \
            switch (rb_) {                                                                                         \
            case 1: CALL(1, r); break;                                                                             \
            case 2: CALL(2, r); break;                                                                             \
            case 3: CALL(3, r); break;                                                                             \
            case 4: CALL(4, r); break;                                                                             \
            case 5: CALL(5, r); break;                                                                             \
            default: CALL(6, r); break;                                                                            \
            }                                                                                                      \
            r += rb_;                                                                                              \
        }                                                                                                          \
    } while (0)

/* acc rows [0, RB) x Dv columns [0, 16 EV), the last zmm masked by tail. */
INLINE void pv_tile(const float *pt, int64_t prs, int64_t pjs, const int RB, int64_t nk, const float *v, int64_t ldv,
                    const int EV, __mmask16 tail, const float *alpha, float *acc, int64_t lda) {
    __m512 a[PV_RB][PV_EV];
    __mmask16 mk[PV_EV];
    pv_tile_load(RB, EV, tail, alpha, acc, lda, mk, a);
    for (int64_t j = 0; j < nk; j++) {
        __m512 vv[PV_EV];
#pragma GCC unroll 4
        for (int u = 0; u < EV; u++) vv[u] = _mm512_maskz_loadu_ps(mk[u], v + j * ldv + 16 * u);
#pragma GCC unroll 6
        for (int r = 0; r < RB; r++) {
            __m512 p = _mm512_set1_ps(pt[r * prs + j * pjs]);
#pragma GCC unroll 4
            for (int u = 0; u < EV; u++) a[r][u] = _mm512_fmadd_ps(vv[u], p, a[r][u]);
        }
    }
    pv_tile_store(RB, EV, mk, a, acc, lda);
}

/* RB rows over all of Dv in strips of up to 4 zmm. */
INLINE void pv_rows(const float *pt, int64_t prs, int64_t pjs, const int RB, int64_t nk, const float *v, int64_t ldv,
                    int64_t Dv, const float *alpha, float *acc, int64_t lda) {
    for (int64_t e = 0; e < Dv; e += 16 * PV_EV) {
        int64_t n = LM_MIN(16 * PV_EV, Dv - e);
        __mmask16 tail = tail_mask(n - (n - 1) / 16 * 16);
        switch ((n + 15) / 16) {
        case 1: pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 1, tail, alpha, acc + e, lda); break;
        case 2: pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 2, tail, alpha, acc + e, lda); break;
        case 3: pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 3, tail, alpha, acc + e, lda); break;
        default: pv_tile(pt, prs, pjs, RB, nk, v + e, ldv, 4, tail, alpha, acc + e, lda); break;
        }
    }
}

LM__TARGET_AVX512 static void pv_avx512(const float *pt, int64_t prs, int64_t pjs, int64_t rows, int64_t nk,
                                        const float *v, int64_t ldv, int64_t Dv, const float *alpha, float *acc,
                                        int64_t lda) {
#define PV_F32(RB, r) pv_rows(pt + (r) * prs, prs, pjs, RB, nk, v, ldv, Dv, alpha + (r), acc + (r) * lda, lda)
    PV_GROUPS(rows, PV_F32);
#undef PV_F32
}

const lm__attn_kernels lm__attn_kernels_avx512 = {
    .lanes = LANES, .rows_max = ROWS_MAX, .kl_rows_max = KL_ROWS_MAX, .bk = BK,
    .scores_rl = scores_rl_avx512, .softmax_rl = softmax_rl_avx512,
    .scores_kl = scores_kl_avx512, .softmax_kl = softmax_kl_avx512, .pv = pv_avx512,
};

/* ---- fast precision: row lanes on bf16 operands (lm__attn_fast_kernels) ----------------
 * The row-lane loops above with VDPBF16PS: each instruction adds the exact products of
 * two bf16 pairs into each f32 lane, so the scores take D / 2 steps (q pairs per row
 * lane, a key's pair broadcast) and the PV product nk / 2 (a row's pair of
 * probabilities broadcast against 16 columns' pairs of values). Operands are rounded to
 * bf16 (nearest even; denormals as zero, as every AVX512_BF16 conversion does); sums
 * stay f32; the softmax in between is the exact one. */
#define INLINE_BF static inline __attribute__((always_inline)) LM__TARGET_AVX512BF16

/* x with its finite values past bf16's largest (3.3895e38) set to it (sign kept): they
 * would round to infinity, and a probability of 0 against an infinite value is NaN where
 * the f32 kernels give 0 (a masked key, in the block of a row that cannot see it). Inf and
 * NaN stay as they are. */
INLINE_BF __m512 bf16_range(__m512 x) {
    const __m512 top = _mm512_set1_ps(3.38953139e38f);
    const __m512 a = _mm512_abs_ps(x);
    const __mmask16 big =
        _mm512_cmp_ps_mask(a, top, _CMP_GT_OQ) & _mm512_cmp_ps_mask(a, _mm512_set1_ps(INFINITY), _CMP_NEQ_OQ);
    const __m512i sign = _mm512_andnot_si512(_mm512_castps_si512(a), _mm512_castps_si512(x));
    return _mm512_mask_blend_ps(big, x, _mm512_castsi512_ps(_mm512_or_si512(sign, _mm512_castps_si512(top))));
}

/* 16 pairs: lane i = bf16(a[i]) | bf16(b[i]) << 16. */
INLINE_BF __m512i pair16(__m512 a, __m512 b) {
    __m512i lo = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(a));
    __m512i hi = _mm512_cvtepu16_epi32((__m256i)_mm512_cvtneps_pbh(b));
    return _mm512_or_si512(lo, _mm512_slli_epi32(hi, 16));
}

/* One query row as a column of qt2: qt2[i * rp] = pair(qscale q[2i], qscale q[2i + 1]),
 * i < D2 = ceil(D / 2) (0 past D). */
LM__TARGET_AVX512BF16 static void pack_q_bf16(const float *q, int64_t D, float qscale, uint32_t *qt2, int64_t rp) {
    const __m512 qs = _mm512_set1_ps(qscale);
    const int64_t D2 = (D + 1) / 2;
    for (int64_t d = 0; d < D; d += 32) {
        uint32_t t[16] __attribute__((aligned(64)));
        __m512 lo = bf16_range(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(D - d), q + d), qs));
        __m512 hi = bf16_range(_mm512_mul_ps(_mm512_maskz_loadu_ps(tail_mask(D - d - 16), q + d + 16), qs));
        _mm512_store_si512((void *)t, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        for (int64_t i = 0; i < 16 && d / 2 + i < D2; i++) qt2[(d / 2 + i) * rp] = t[i];
    }
}

/* k2[j * D2 + i] = pair(k[j][2i], k[j][2i + 1]) for j < nk, i < D2 = ceil(D / 2) (0 past D). */
LM__TARGET_AVX512BF16 static void pack_k_bf16(const float *k, int64_t ldk, int64_t nk, int64_t D, uint32_t *k2) {
    const int64_t D2 = (D + 1) / 2;
    for (int64_t j = 0; j < nk; j++)
        for (int64_t d = 0; d < D; d += 32) {
            __m512 lo = bf16_range(_mm512_maskz_loadu_ps(tail_mask(D - d), k + j * ldk + d));
            __m512 hi = bf16_range(_mm512_maskz_loadu_ps(tail_mask(D - d - 16), k + j * ldk + d + 16));
            _mm512_mask_storeu_epi32(k2 + j * D2 + d / 2, tail_mask(D2 - d / 2), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
        }
}

/* st[j][0 .. 16 NV) for j < JB from D2 pair steps. */
INLINE_BF void score_tile_bf16(const uint32_t *qt2, int64_t rp, int64_t D2, const uint32_t *k2, const int NV,
                               const int JB, float *st) {
    __m512 acc[8][4];
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) acc[j][u] = _mm512_setzero_ps();
    for (int64_t i = 0; i < D2; i++) {
        __m512bh qv[4];
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) qv[u] = (__m512bh)_mm512_load_si512((const void *)(qt2 + i * rp + 16 * u));
#pragma GCC unroll 8
        for (int j = 0; j < JB; j++) {
            __m512bh kv = (__m512bh)_mm512_set1_epi32((int)k2[j * D2 + i]);
#pragma GCC unroll 4
            for (int u = 0; u < NV; u++) acc[j][u] = _mm512_dpbf16_ps(acc[j][u], qv[u], kv);
        }
    }
#pragma GCC unroll 8
    for (int j = 0; j < JB; j++)
#pragma GCC unroll 4
        for (int u = 0; u < NV; u++) _mm512_store_ps(st + j * rp + 16 * u, acc[j][u]);
}

INLINE_BF void score_strip_bf16(const uint32_t *qt2, int64_t rp, int64_t D2, const uint32_t *k2, int64_t nk,
                                const int NV, float *st) {
    const int JB = NV == 4 ? 6 : 8;
    if (nk < JB) {
        for (int64_t j = 0; j < nk; j++) score_tile_bf16(qt2, rp, D2, k2 + j * D2, NV, 1, st + j * rp);
        return;
    }
    int64_t j = 0;
    for (; j + JB <= nk; j += JB) score_tile_bf16(qt2, rp, D2, k2 + j * D2, NV, JB, st + j * rp);
    if (j < nk) score_tile_bf16(qt2, rp, D2, k2 + (nk - JB) * D2, NV, JB, st + (nk - JB) * rp);
}

LM__TARGET_AVX512BF16 static void scores_bf16(const uint32_t *qt2, int64_t rp, int64_t D2, const uint32_t *k2,
                                              int64_t nk, float *st) {
    for (int64_t r = 0; r < rp; r += 64) {
        switch (LM_MIN(4, (rp - r) / 16)) {
        case 1: score_strip_bf16(qt2 + r, rp, D2, k2, nk, 1, st + r); break;
        case 2: score_strip_bf16(qt2 + r, rp, D2, k2, nk, 2, st + r); break;
        case 3: score_strip_bf16(qt2 + r, rp, D2, k2, nk, 3, st + r); break;
        default: score_strip_bf16(qt2 + r, rp, D2, k2, nk, 4, st + r); break;
        }
    }
}

/* v2[i * Dv + e] = pair(v[2i][e], v[2i + 1][e]) for i < ceil(nk / 2) (key nk, past the
 * block, as 0). */
LM__TARGET_AVX512BF16 static void pack_v_bf16(const float *v, int64_t ldv, int64_t nk, int64_t Dv, uint32_t *v2) {
    for (int64_t j = 0; j < nk; j += 2)
        for (int64_t e = 0; e < Dv; e += 16) {
            __mmask16 mk = tail_mask(Dv - e);
            __m512 a = bf16_range(_mm512_maskz_loadu_ps(mk, v + j * ldv + e));
            __m512 b = j + 1 < nk ? bf16_range(_mm512_maskz_loadu_ps(mk, v + (j + 1) * ldv + e)) : _mm512_setzero_ps();
            _mm512_mask_storeu_epi32(v2 + j / 2 * Dv + e, mk, pair16(a, b));
        }
}

/* p2[i * rp + r] = pair(st[2i][r], st[2i + 1][r]) for i < ceil(nk / 2), r < rp (key nk as 0). */
LM__TARGET_AVX512BF16 static void pack_p_bf16(const float *st, int64_t rp, int64_t nk, uint32_t *p2) {
    for (int64_t j = 0; j < nk; j += 2)
        for (int64_t r = 0; r < rp; r += 16) {
            __m512 a = _mm512_load_ps(st + j * rp + r);
            __m512 b = j + 1 < nk ? _mm512_load_ps(st + (j + 1) * rp + r) : _mm512_setzero_ps();
            _mm512_store_si512((void *)(p2 + j / 2 * rp + r), pair16(a, b));
        }
}

/* acc rows [0, RB) x Dv columns [0, 16 EV) over n2 key pairs. */
INLINE_BF void pv_tile_bf16(const uint32_t *p2, int64_t rp, const int RB, int64_t n2, const uint32_t *v2, int64_t Dv,
                            const int EV, __mmask16 tail, const float *alpha, float *acc, int64_t lda) {
    __m512 a[PV_RB][PV_EV];
    __mmask16 mk[PV_EV];
    pv_tile_load(RB, EV, tail, alpha, acc, lda, mk, a);
    for (int64_t i = 0; i < n2; i++) {
        __m512bh vv[PV_EV];
#pragma GCC unroll 4
        for (int u = 0; u < EV; u++) vv[u] = (__m512bh)_mm512_maskz_loadu_epi32(mk[u], v2 + i * Dv + 16 * u);
#pragma GCC unroll 6
        for (int r = 0; r < RB; r++) {
            __m512bh p = (__m512bh)_mm512_set1_epi32((int)p2[i * rp + r]);
#pragma GCC unroll 4
            for (int u = 0; u < EV; u++) a[r][u] = _mm512_dpbf16_ps(a[r][u], vv[u], p);
        }
    }
    pv_tile_store(RB, EV, mk, a, acc, lda);
}

INLINE_BF void pv_rows_bf16(const uint32_t *p2, int64_t rp, const int RB, int64_t n2, const uint32_t *v2, int64_t Dv,
                            const float *alpha, float *acc, int64_t lda) {
    for (int64_t e = 0; e < Dv; e += 16 * PV_EV) {
        int64_t n = LM_MIN(16 * PV_EV, Dv - e);
        __mmask16 tail = tail_mask(n - (n - 1) / 16 * 16);
        switch ((n + 15) / 16) {
        case 1: pv_tile_bf16(p2, rp, RB, n2, v2 + e, Dv, 1, tail, alpha, acc + e, lda); break;
        case 2: pv_tile_bf16(p2, rp, RB, n2, v2 + e, Dv, 2, tail, alpha, acc + e, lda); break;
        case 3: pv_tile_bf16(p2, rp, RB, n2, v2 + e, Dv, 3, tail, alpha, acc + e, lda); break;
        default: pv_tile_bf16(p2, rp, RB, n2, v2 + e, Dv, 4, tail, alpha, acc + e, lda); break;
        }
    }
}

/* acc[r] = alpha[r] acc[r] + sum over the n2 pairs of p2 (row r) times v2, r < rows. */
LM__TARGET_AVX512BF16 static void pv_bf16(const uint32_t *p2, int64_t rp, int64_t rows, int64_t n2, const uint32_t *v2,
                                          int64_t Dv, const float *alpha, float *acc, int64_t lda) {
#define PV_BF16(RB, r) pv_rows_bf16(p2 + (r), rp, RB, n2, v2, Dv, alpha + (r), acc + (r) * lda, lda)
    PV_GROUPS(rows, PV_BF16);
#undef PV_BF16
}

const lm__attn_fast_kernels lm__attn_fast_kernels_avx512bf16 = {
    .pack_q = pack_q_bf16, .pack_k = pack_k_bf16, .scores = scores_bf16, .pack_v = pack_v_bf16, .pack_p = pack_p_bf16, .pv = pv_bf16,
};

#endif
