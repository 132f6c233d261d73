/* ops/cpu/matmul_avx2.c — AVX2 + FMA + F16C kernels for lm__cpu_linear (ymm = 8 f32
 * lanes, 16 registers).
 *
 * bf16 widens by zero-extension and a 16-bit shift, f16 with vcvtph2ps, int8 by
 * vpmovsxbd + vcvtdq2ps; all exact (int8 row scales as in matmul_avx512.c); int4
 * rows unpack by nibble shifts against an even/odd-split x (the GEMM packs them with
 * the portable loop).
 * AVX2 has no 16-bit masked loads, so K tails go through a zero-padded 8-lane
 * buffer (once per row, outside the main loop).
 *  gemv:  one W row at a time against up to 4 x rows, 2-4 accumulators per x row.
 *  GEMM:  6 x 16 tile = 12 ymm accumulators; per k: 2 panel loads, 6 broadcasts,
 *         12 FMAs. Panels are packed with 8 x 8 in-register transposes.
 * Compiled with generic flags: each function carries LM__TARGET_AVX2.
 */
#include "ops/cpu/matmul_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX2

enum { GEMV_MR = 4, MR = 6, NR = 16 };

/* 8 weights at element k of row p, widened to f32. */
INLINE __m256 load_w8(const void *p, int64_t k, lm_dtype dt) {
    if (dt == LM_F32) return _mm256_loadu_ps((const float *)p + k);
    if (dt == LM_I8)
        return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)((const int8_t *)p + k))));
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + k));
    if (dt == LM_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* n < 8 weights at element k of row p, zero-padded to 8 lanes. */
INLINE __m256 load_w8_tail(const void *p, int64_t k, int64_t n, lm_dtype dt) {
    float buf[8] = {0};
    for (int64_t i = 0; i < n; i++) buf[i] = lm__widen1(p, dt, k + i);
    return _mm256_loadu_ps(buf);
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* y[m * ldy] = dot(x row m, W row wr) for m < MRX (a compile-time constant after
 * inlining, as is DT; int8 rows finish through ep's row r). The W row is streamed
 * front to back and prefetched ahead (see matmul_avx512.c); KU accumulators per x row
 * cover the FMA latency; the K tail (< 8) is one padded step. */
INLINE void gemv_row(const float *x, int64_t ldx, const int MRX, const void *wr, const lm_dtype DT, int64_t K,
                     float *y, int64_t ldy, const lm__i8_epilogue *ep, int64_t r) {
    const int KU = MRX == 1 ? 4 : 2;
    __m256 acc[GEMV_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) acc[m][u] = _mm256_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 8 * KU <= K; k += 8 * KU) {
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) {
            const int es = (int)lm__w_size(DT);
            if (u * 8 * es % 64 == 0) lm__prefetch_bytes(wr, (k + 8 * u) * es); /* once per cache line */
            __m256 wv = load_w8(wr, k + 8 * u, DT);
#pragma GCC unroll 4
            for (int m = 0; m < MRX; m++)
                acc[m][u] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k + 8 * u), wv, acc[m][u]);
        }
    }
    for (; k + 8 <= K; k += 8) {
        __m256 wv = load_w8(wr, k, DT);
#pragma GCC unroll 4
        for (int m = 0; m < MRX; m++) acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k), wv, acc[m][0]);
    }
    if (k < K) {
        __m256 wv = load_w8_tail(wr, k, K - k, DT);
#pragma GCC unroll 4
        for (int m = 0; m < MRX; m++)
            acc[m][0] = _mm256_fmadd_ps(load_w8_tail(x + m * ldx, k, K - k, LM_F32), wv, acc[m][0]);
    }
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        __m256 sum = acc[m][0];
#pragma GCC unroll 4
        for (int u = 1; u < KU; u++) sum = _mm256_add_ps(sum, acc[m][u]);
        float v = hsum8(sum);
        y[m * ldy] = DT == LM_I8 ? lm__i8_finish(ep, r, v, y + m * ldy) : v;
    }
}

INLINE void gemv_rows(const float *x, int64_t ldx, int64_t M, const void *w, const lm_dtype DT, int64_t ldw,
                      int64_t nrows, int64_t K, float *y, int64_t ldy, const lm__i8_epilogue *ep) {
    for (int64_t r = 0; r < nrows; r++) {
        const void *wr = lm__w_at(w, DT, ldw, r, 0);
        /* x rows in groups of GEMV_MR; the W row stays in L1/L2 between groups. */
        for (int64_t m = 0; m < M; m += GEMV_MR) {
            const float *xm = x + m * ldx;
            float *ym = y + m * ldy + r;
            switch (M - m) {
            case 1: gemv_row(xm, ldx, 1, wr, DT, K, ym, ldy, ep, r); break;
            case 2: gemv_row(xm, ldx, 2, wr, DT, K, ym, ldy, ep, r); break;
            case 3: gemv_row(xm, ldx, 3, wr, DT, K, ym, ldy, ep, r); break;
            default: gemv_row(xm, ldx, 4, wr, DT, K, ym, ldy, ep, r); break;
            }
        }
    }
}

LM__TARGET_AVX2 static void gemv_avx2(const float *x, int64_t ldx, int64_t M, const void *w, lm_dtype wdt,
                                      int64_t ldw, int64_t nrows, int64_t K, float *y, int64_t ldy) {
    if (wdt == LM_F32) gemv_rows(x, ldx, M, w, LM_F32, ldw, nrows, K, y, ldy, NULL);
    else if (wdt == LM_BF16) gemv_rows(x, ldx, M, w, LM_BF16, ldw, nrows, K, y, ldy, NULL);
    else gemv_rows(x, ldx, M, w, LM_F16, ldw, nrows, K, y, ldy, NULL);
}

LM__TARGET_AVX2 static void gemv_i8_avx2(const float *x, int64_t ldx, int64_t M, const int8_t *q, int64_t ldq,
                                         const lm__i8_epilogue *ep, int64_t nrows, int64_t K, float *y, int64_t ldy) {
    gemv_rows(x, ldx, M, q, LM_I8, ldq, nrows, K, y, ldy, ep);
}

/* As gemv_i4_row in matmul_avx512.c with 8-lane vectors and x split in blocks of 16
 * (8 even k, then 8 odd k): per 16 k one 8-byte read zero-extended to 8 dwords, the
 * low and high nibbles sign-extended by shifts (AVX2's vpermps has only 8 entries),
 * converted and scaled, two FMA chains per x row. */
INLINE void gemv_i4_row_t(const float *x, int64_t ldx, const int MRX, const lm__i4_weights *W, const int SB,
                          int64_t r, int64_t K, float *y, int64_t ldy) {
    const uint8_t *qr = W->q + r * W->ldq;
    const void *sc = lm__i4_srow(W, r);
    const int64_t G = W->group;
    __m256 acc[GEMV_MR][2];
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t k0 = 0, g = 0; k0 < K; k0 += G, g++) { /* g = k0 / G without a division */
        __m256 s = _mm256_set1_ps(lm__i4_sc(sc, SB, g));
        for (int64_t k = k0; k < k0 + G; k += 16) {
            if ((k & 127) == 0) lm__prefetch_bytes(qr, k / 2);
            __m256i v = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(qr + k / 2)));
            __m256 w0 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 28), 28));
            __m256 w1 = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_slli_epi32(v, 24), 28));
            w0 = _mm256_mul_ps(w0, s), w1 = _mm256_mul_ps(w1, s);
#pragma GCC unroll 4
            for (int m = 0; m < MRX; m++) {
                acc[m][0] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k), w0, acc[m][0]);
                acc[m][1] = _mm256_fmadd_ps(_mm256_loadu_ps(x + m * ldx + k + 8), w1, acc[m][1]);
            }
        }
    }
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++)
        y[m * ldy] = lm__i4_finish(W, r, hsum8(_mm256_add_ps(acc[m][0], acc[m][1])), y + m * ldy);
}

/* gemv_i4_row_t with the row's scales' dtype (f32, or bf16 when W->scales16) a constant. */
INLINE void gemv_i4_row(const float *x, int64_t ldx, const int MRX, const lm__i4_weights *W, int64_t r, int64_t K,
                        float *y, int64_t ldy) {
    if (W->scales16) gemv_i4_row_t(x, ldx, MRX, W, 1, r, K, y, ldy);
    else gemv_i4_row_t(x, ldx, MRX, W, 0, r, K, y, ldy);
}

LM__TARGET_AVX2 static void gemv_i4_avx2(const float *x, int64_t ldx, int64_t M, const lm__i4_weights *W,
                                         int64_t nrows, int64_t K, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t m = 0; m < M; m += GEMV_MR) {
            const float *xm = x + m * ldx;
            float *ym = y + m * ldy + r;
            switch (M - m) {
            case 1: gemv_i4_row(xm, ldx, 1, W, r, K, ym, ldy); break;
            case 2: gemv_i4_row(xm, ldx, 2, W, r, K, ym, ldy); break;
            case 3: gemv_i4_row(xm, ldx, 3, W, r, K, ym, ldy); break;
            default: gemv_i4_row(xm, ldx, 4, W, r, K, ym, ldy); break;
            }
        }
}

static void pack_i4_avx2(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kc, float *dst) {
    lm__pack_i4_generic(W, NR, ncols, k0, kc, dst);
}

/* In-place transpose of an 8 x 8 f32 block held in 8 registers: r[i][j] -> r[j][i]. */
INLINE void transpose8(__m256 r[8]) {
    __m256 t[8], s[8];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 2
    for (int g = 0; g < 2; g++) { /* s[4g + i] lane L = rows 4g..4g+3, column 4L + i */
        s[4 * g + 0] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * g + 1] = _mm256_shuffle_ps(t[4 * g], t[4 * g + 2], _MM_SHUFFLE(3, 2, 3, 2));
        s[4 * g + 2] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(1, 0, 1, 0));
        s[4 * g + 3] = _mm256_shuffle_ps(t[4 * g + 1], t[4 * g + 3], _MM_SHUFFLE(3, 2, 3, 2));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(s[i], s[4 + i], 0x31);
    }
}

/* 8 rows x kn (<= 8) k of W (rows >= ncols read as 0) transposed into kn panel rows;
 * rows are prefetched ahead as in matmul_avx512.c; int8 rows are multiplied by their
 * scale sc[j] (sc is NULL for float weights). */
INLINE void pack_block(const void *w, const lm_dtype DT, int64_t ldw, const float *sc, int ncols, int64_t k, int64_t kn,
                       float *dst) {
    __m256 r[8];
#pragma GCC unroll 8
    for (int j = 0; j < 8; j++) {
        if (j >= ncols) {
            r[j] = _mm256_setzero_ps();
            continue;
        }
        const void *row = lm__w_at(w, DT, ldw, j, 0);
        lm__prefetch_ahead(row, DT, k);
        r[j] = kn == 8 ? load_w8(row, k, DT) : load_w8_tail(row, k, kn, DT);
        if (DT == LM_I8) r[j] = _mm256_mul_ps(r[j], _mm256_set1_ps(sc[j]));
    }
    transpose8(r);
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        if (i < kn) _mm256_storeu_ps(dst + (k + i) * NR, r[i]);
}

INLINE void pack_panel(const void *w, const lm_dtype DT, int64_t ldw, const float *sc, int ncols, int64_t kc,
                       float *dst) {
    for (int j = 0; j < NR; j += 8) { /* row j exists only when j < ncols */
        const void *wj = j < ncols ? lm__w_at(w, DT, ldw, j, 0) : w;
        const float *sj = DT == LM_I8 && j < ncols ? sc + j : sc;
        for (int64_t k = 0; k < kc; k += 8)
            pack_block(wj, DT, ldw, sj, ncols - j, k, kc - k < 8 ? kc - k : 8, dst + j);
    }
}

LM__TARGET_AVX2 static void pack_avx2(const void *w, lm_dtype wdt, int64_t ldw, int ncols, int64_t kc, float *dst) {
    if (wdt == LM_F32) pack_panel(w, LM_F32, ldw, NULL, ncols, kc, dst);
    else if (wdt == LM_BF16) pack_panel(w, LM_BF16, ldw, NULL, ncols, kc, dst);
    else pack_panel(w, LM_F16, ldw, NULL, ncols, kc, dst);
}

LM__TARGET_AVX2 static void pack_i8_avx2(const int8_t *q, int64_t ldq, const float *scales, int ncols, int64_t kc,
                                         float *dst) {
    pack_panel(q, LM_I8, ldq, scales, ncols, kc, dst);
}

/* Lane i of the result is all-ones when i < n: the mask for vmaskmovps. */
INLINE __m256i lane_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

LM__TARGET_AVX2 static void micro_avx2(int64_t kc, const float *a, int64_t lda, int mrows, const float *bp,
                                       float *c, int64_t ldc, int ncols, int accumulate) {
    const float *ar[MR];
    __m256 acc[MR][2];
    /* Rows past mrows repeat the last row: in-bounds reads, results never stored. */
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (r < mrows ? r : mrows - 1) * lda;
        acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m256 b0 = _mm256_loadu_ps(bp + k * NR), b1 = _mm256_loadu_ps(bp + k * NR + 8);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m256 av = _mm256_broadcast_ss(ar[r] + k);
            acc[r][0] = _mm256_fmadd_ps(av, b0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(av, b1, acc[r][1]);
        }
    }
    __m256i m0 = lane_mask(ncols), m1 = lane_mask(ncols - 8);
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= mrows) break;
        float *cp = c + r * ldc;
        __m256 v0 = acc[r][0], v1 = acc[r][1];
        if (accumulate) v0 = _mm256_add_ps(v0, _mm256_maskload_ps(cp, m0));
        _mm256_maskstore_ps(cp, m0, v0);
        if (ncols <= 8) continue; /* columns 8.. are past ncols: not even addressed */
        if (accumulate) v1 = _mm256_add_ps(v1, _mm256_maskload_ps(cp + 8, m1));
        _mm256_maskstore_ps(cp + 8, m1, v1);
    }
}

const lm__linear_kernels lm__linear_kernels_avx2 = {
    .mr = MR, .nr = NR, .kc = 256, .nc = 512,
    .gemv_max_m_f32 = 6, .gemv_max_m_16 = 6,
    .gemv = gemv_avx2, .pack = pack_avx2, .micro = micro_avx2,
    .gemv_i8 = gemv_i8_avx2, .pack_i8 = pack_i8_avx2,
    .gemv_i4 = gemv_i4_avx2, .pack_i4 = pack_i4_avx2, .i4_split = 8,
};

#endif
