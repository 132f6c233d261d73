/* ops/cpu/matmul_avx512.c — AVX-512 kernels for lm__cpu_linear (zmm = 16 f32 lanes).
 *
 * Weights are widened in registers: bf16 by zero-extending to 32 bits and shifting
 * left 16 (bf16 is the top half of an f32), f16 with vcvtph2ps, int8 by sign-extending
 * to 32 bits (vpmovsxbd) and vcvtdq2ps; all exact. K tails use masked loads, which
 * never touch (or fault on) masked-out elements. int8 rows carry one f32 scale: the
 * gemv multiplies the finished dot product by it, the packer each widened weight.
 * int4 rows (two nibbles a byte): the gemv looks each nibble up in a per-group table
 * of q * scale (vpermps) against an even/odd-split x; the packer unpacks with a
 * doubling byte shuffle and per-lane shifts (load_q4_16) and scales.
 *  gemv:  one W row at a time against up to 4 x rows, 2-4 zmm accumulators per
 *         x row, reduced horizontally at the end of the row.
 *  GEMM:  6 x 64 tile = 24 zmm accumulators; per k: 4 panel loads, 6 broadcasts,
 *         24 FMAs. Panels are packed with 16 x 16 in-register transposes.
 * Compiled with generic flags: each function carries LM__TARGET_AVX512.
 */
#include "ops/cpu/matmul_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>

#include "ops/cpu/transpose_avx512.h"

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX512

enum { GEMV_MR = 4, MR = 6, NR = 64 };

/* 16 weights at element k of row p, widened to f32; lanes outside mask read as 0. */
INLINE __m512 load_w16(const void *p, int64_t k, lm_dtype dt, __mmask16 mask) {
    if (dt == LM_F32) return _mm512_maskz_loadu_ps(mask, (const float *)p + k);
    if (dt == LM_I8) /* vpmovsxbd + vcvtdq2ps */
        return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask, (const int8_t *)p + k)));
    __m256i h = _mm256_maskz_loadu_epi16(mask, (const uint16_t *)p + k);
    if (dt == LM_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

INLINE __mmask16 tail_mask(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }

/* acc[m][u] += x row m (16 values at k + 16u) * W row (16 values at k + 16u), u < KU. */
INLINE void gemv_step(const float *const *xr, const int MRX, const void *wr, const lm_dtype DT, const int KU,
                      int64_t k, __mmask16 mask, __m512 acc[GEMV_MR][4]) {
#pragma GCC unroll 4
    for (int u = 0; u < KU; u++) {
        const int es = (int)lm__w_size(DT);
        if (KU > 1 && u * 16 * es % 64 == 0) lm__prefetch_bytes(wr, (k + 16 * u) * es); /* once per cache line */
        __m512 wv = load_w16(wr, k + 16 * u, DT, mask);
#pragma GCC unroll 4
        for (int m = 0; m < MRX; m++)
            acc[m][u] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, xr[m] + k + 16 * u), wv, acc[m][u]);
    }
}

/* y[m * ldy] = dot(x row m, W row wr) for m < MRX (a compile-time constant after
 * inlining, as is DT; int8 rows finish through ep's row r). One W row is streamed
 * front to back: a single sequential stream per thread is what the hardware
 * prefetchers sustain best (interleaving several rows measured ~30% slower), helped
 * by a software prefetch of every line 4 KB ahead. KU independent accumulators per x
 * row cover the FMA latency. */
INLINE void gemv_row(const float *x, int64_t ldx, const int MRX, const void *wr, const lm_dtype DT, int64_t K,
                     float *y, int64_t ldy, const lm__i8_epilogue *ep, int64_t r) {
    const int KU = MRX == 1 ? 4 : 2;
    const float *xr[GEMV_MR];
    __m512 acc[GEMV_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        xr[m] = x + m * ldx;
#pragma GCC unroll 4
        for (int u = 0; u < KU; u++) acc[m][u] = _mm512_setzero_ps();
    }
    int64_t k = 0;
    for (; k + 16 * KU <= K; k += 16 * KU) gemv_step(xr, MRX, wr, DT, KU, k, (__mmask16)0xffff, acc);
    for (; k < K; k += 16) gemv_step(xr, MRX, wr, DT, 1, k, tail_mask(K - k), acc);
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        __m512 sum = acc[m][0];
#pragma GCC unroll 4
        for (int u = 1; u < KU; u++) sum = _mm512_add_ps(sum, acc[m][u]);
        float v = _mm512_reduce_add_ps(sum);
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

LM__TARGET_AVX512 static void gemv_avx512(const float *x, int64_t ldx, int64_t M, const void *w, lm_dtype wdt,
                                          int64_t ldw, int64_t nrows, int64_t K, float *y, int64_t ldy) {
    if (wdt == LM_F32) gemv_rows(x, ldx, M, w, LM_F32, ldw, nrows, K, y, ldy, NULL);
    else if (wdt == LM_BF16) gemv_rows(x, ldx, M, w, LM_BF16, ldw, nrows, K, y, ldy, NULL);
    else gemv_rows(x, ldx, M, w, LM_F16, ldw, nrows, K, y, ldy, NULL);
}

LM__TARGET_AVX512 static void gemv_i8_avx512(const float *x, int64_t ldx, int64_t M, const int8_t *q, int64_t ldq,
                                             const lm__i8_epilogue *ep, int64_t nrows, int64_t K, float *y,
                                             int64_t ldy) {
    gemv_rows(x, ldx, M, q, LM_I8, ldq, nrows, K, y, ldy, ep);
}

/* 16 int4 weights k .. k + 15 (k a multiple of 16) of row q, widened exactly: each of
 * 8 bytes doubled (vpunpcklbw), zero-extended to 16 dwords, then shifted so lane 2i
 * keeps the low nibble and lane 2i + 1 the high one in bits 28..31 and shifted back
 * arithmetically (the sign extension of 4 bits). */
INLINE __m512 load_q4_16(const uint8_t *q, int64_t k) {
    __m128i b = _mm_loadl_epi64((const __m128i *)(q + k / 2));
    __m512i v = _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(b, b));
    v = _mm512_srai_epi32(_mm512_sllv_epi32(v, _mm512_set1_epi64((int64_t)24 << 32 | 28)), 28);
    return _mm512_cvtepi32_ps(v);
}

/* y[m * ldy] = W's epilogue(dot(x row m, W row r)) for m < MRX, x split in blocks of
 * 32 (16 even k, then 16 odd k; see split_x in matmul.c). Per group the
 * 16 possible weights q * scale form a table (one multiply per block); per 32 k one 16-byte read
 * is zero-extended to 16 dwords and looked up twice with vpermps, which reads only the
 * low 4 bits of each index: the low nibbles (even k) directly, the high ones (odd k)
 * after a shift by 4. Four FMA chains per x row (two blocks per step: with one pair
 * the FMA latency bound the loop, measured ~1.5x slower); the row is streamed front to
 * back with a prefetch per cache line (128 weights). Each weight is q * scale rounded
 * once, as the GEMM packs it. */
/* One block of 32 k at k (x split) against the table of its group, into acc[m][0..1]. */
INLINE void gemv_i4_block(const float *x, int64_t ldx, const int MRX, const uint8_t *qr, int64_t k, __m512 tbl,
                          __m512 acc[GEMV_MR][4], const int A) {
    if ((k & 127) == 0) lm__prefetch_bytes(qr, k / 2);
    __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(qr + k / 2)));
    __m512 w0 = _mm512_permutexvar_ps(v, tbl), w1 = _mm512_permutexvar_ps(_mm512_srli_epi32(v, 4), tbl);
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        acc[m][A] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k), w0, acc[m][A]);
        acc[m][A + 1] = _mm512_fmadd_ps(_mm512_loadu_ps(x + m * ldx + k + 16), w1, acc[m][A + 1]);
    }
}

/* Scale g of a row's group scales in every lane: f32, or (SB) bf16 broadcast as 16-bit
 * words and shifted into the top halves of the lanes (two vector ops, no scalar steps). */
INLINE __m512 bcast_scale(const void *sc, const int SB, int64_t g) {
    if (SB) return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_set1_epi16(((const short *)sc)[g]), 16));
    return _mm512_set1_ps(((const float *)sc)[g]);
}

INLINE void gemv_i4_row_t(const float *x, int64_t ldx, const int MRX, const lm__i4_weights *W, const int SB,
                          int64_t r, int64_t K, float *y, int64_t ldy) {
    const uint8_t *qr = W->q + r * W->ldq;
    const void *sc = lm__i4_srow(W, r);
    const int gs = W->group == 32 ? 5 : W->group == 64 ? 6 : 7; /* k >> gs = its group */
    const __m512 lut = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, -8, -7, -6, -5, -4, -3, -2, -1); /* nibble -> q */
    __m512 acc[GEMV_MR][4];
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) acc[m][0] = acc[m][1] = acc[m][2] = acc[m][3] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 64 <= K; k += 64) { /* two blocks, four FMA chains per x row */
        gemv_i4_block(x, ldx, MRX, qr, k, _mm512_mul_ps(lut, bcast_scale(sc, SB, k >> gs)), acc, 0);
        gemv_i4_block(x, ldx, MRX, qr, k + 32, _mm512_mul_ps(lut, bcast_scale(sc, SB, (k + 32) >> gs)), acc, 2);
    }
    if (k < K) gemv_i4_block(x, ldx, MRX, qr, k, _mm512_mul_ps(lut, bcast_scale(sc, SB, k >> gs)), acc, 0);
#pragma GCC unroll 4
    for (int m = 0; m < MRX; m++) {
        __m512 sum = _mm512_add_ps(_mm512_add_ps(acc[m][0], acc[m][1]), _mm512_add_ps(acc[m][2], acc[m][3]));
        y[m * ldy] = lm__i4_finish(W, r, _mm512_reduce_add_ps(sum), y + m * ldy);
    }
}

/* gemv_i4_row_t with the row's scales' dtype (f32, or bf16 when W->scales16) a constant. */
INLINE void gemv_i4_row(const float *x, int64_t ldx, const int MRX, const lm__i4_weights *W, int64_t r, int64_t K,
                        float *y, int64_t ldy) {
    if (W->scales16) gemv_i4_row_t(x, ldx, MRX, W, 1, r, K, y, ldy);
    else gemv_i4_row_t(x, ldx, MRX, W, 0, r, K, y, ldy);
}

LM__TARGET_AVX512 static void gemv_i4_avx512(const float *x, int64_t ldx, int64_t M, const lm__i4_weights *W,
                                             int64_t nrows, int64_t K, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++)
        for (int64_t m = 0; m < M; m += GEMV_MR) { /* the W row stays in L1/L2 between groups of x rows */
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

/* 16 rows x 16 k of W (rows >= ncols read as 0) transposed into 16 panel rows;
 * int8 rows are multiplied by their scale sc[j] (sc is NULL for float weights).
 * The 16 row streams advance only 32-64 bytes per block, too slowly for the hardware
 * prefetchers: prefetching each row ahead measured 1.5-4x faster packing from L3/DRAM. */
INLINE void pack_block(const void *w, const lm_dtype DT, int64_t ldw, const float *sc, int ncols, int64_t k, int64_t kn,
                       float *dst) {
    __m512 r[16];
    __mmask16 mask = tail_mask(kn);
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        if (j < ncols) {
            const void *row = lm__w_at(w, DT, ldw, j, 0);
            lm__prefetch_ahead(row, DT, k);
            r[j] = load_w16(row, k, DT, mask);
            if (DT == LM_I8) r[j] = _mm512_mul_ps(r[j], _mm512_set1_ps(sc[j]));
        } else r[j] = _mm512_setzero_ps();
    }
    lm__transpose16_avx512(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++)
        if (i < kn) _mm512_storeu_ps(dst + (k + i) * NR, r[i]);
}

INLINE void pack_panel(const void *w, const lm_dtype DT, int64_t ldw, const float *sc, int ncols, int64_t kc,
                       float *dst) {
    for (int j = 0; j < NR; j += 16) { /* row j exists only when j < ncols */
        const void *wj = j < ncols ? lm__w_at(w, DT, ldw, j, 0) : w;
        const float *sj = DT == LM_I8 && j < ncols ? sc + j : sc;
        for (int64_t k = 0; k < kc; k += 16)
            pack_block(wj, DT, ldw, sj, ncols - j, k, kc - k < 16 ? kc - k : 16, dst + j);
    }
}

LM__TARGET_AVX512 static void pack_avx512(const void *w, lm_dtype wdt, int64_t ldw, int ncols, int64_t kc,
                                          float *dst) {
    if (wdt == LM_F32) pack_panel(w, LM_F32, ldw, NULL, ncols, kc, dst);
    else if (wdt == LM_BF16) pack_panel(w, LM_BF16, ldw, NULL, ncols, kc, dst);
    else pack_panel(w, LM_F16, ldw, NULL, ncols, kc, dst);
}

LM__TARGET_AVX512 static void pack_i8_avx512(const int8_t *q, int64_t ldq, const float *scales, int ncols, int64_t kc,
                                             float *dst) {
    pack_panel(q, LM_I8, ldq, scales, ncols, kc, dst);
}

/* int4 panels: rows j0 .. j0 + 15 x 16 k unpacked and scaled in registers, then
 * transposed as pack_block does (the 16 k of a block lie in one group). */
INLINE void pack_block_i4(const lm__i4_weights *W, int j0, int ncols, int64_t k, float *dst) {
    __m512 r[16];
#pragma GCC unroll 16
    for (int j = 0; j < 16; j++) {
        if (j0 + j < ncols) {
            const uint8_t *row = W->q + (j0 + j) * W->ldq;
            lm__prefetch_ahead(row, LM_U8, k / 2);
            r[j] = _mm512_mul_ps(load_q4_16(row, k), _mm512_set1_ps(lm__i4_scale(W, j0 + j, k / W->group)));
        } else r[j] = _mm512_setzero_ps();
    }
    lm__transpose16_avx512(r);
#pragma GCC unroll 16
    for (int i = 0; i < 16; i++) _mm512_storeu_ps(dst + i * NR, r[i]);
}

LM__TARGET_AVX512 static void pack_i4_avx512(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kc, float *dst) {
    for (int j = 0; j < NR; j += 16)
        for (int64_t k = 0; k < kc; k += 16) pack_block_i4(W, j, ncols, k0 + k, dst + k * NR + j);
}

LM__TARGET_AVX512 static void micro_avx512(int64_t kc, const float *a, int64_t lda, int mrows, const float *bp,
                                           float *c, int64_t ldc, int ncols, int accumulate) {
    const float *ar[MR];
    __m512 acc[MR][NR / 16];
    /* Rows past mrows repeat the last row: in-bounds reads, results never stored. */
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        ar[r] = a + (r < mrows ? r : mrows - 1) * lda;
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) acc[r][j] = _mm512_setzero_ps();
    }
    for (int64_t k = 0; k < kc; k++) {
        __m512 b[NR / 16];
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) b[j] = _mm512_loadu_ps(bp + k * NR + 16 * j);
#pragma GCC unroll 8
        for (int r = 0; r < MR; r++) {
            __m512 av = _mm512_set1_ps(ar[r][k]);
#pragma GCC unroll 4
            for (int j = 0; j < NR / 16; j++) acc[r][j] = _mm512_fmadd_ps(av, b[j], acc[r][j]);
        }
    }
    __mmask16 mask[NR / 16];
#pragma GCC unroll 4
    for (int j = 0; j < NR / 16; j++) mask[j] = ncols > 16 * j ? tail_mask(ncols - 16 * j) : 0;
#pragma GCC unroll 8
    for (int r = 0; r < MR; r++) {
        if (r >= mrows) break;
#pragma GCC unroll 4
        for (int j = 0; j < NR / 16; j++) {
            if (!mask[j]) continue; /* columns 16j.. are past ncols: not even addressed */
            float *cp = c + r * ldc + 16 * j;
            __m512 v = acc[r][j];
            if (accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask[j], cp));
            _mm512_mask_storeu_ps(cp, mask[j], v);
        }
    }
}

const lm__linear_kernels lm__linear_kernels_avx512 = {
    .mr = MR, .nr = NR, .kc = 256, .nc = 512,
    .gemv_max_m_f32 = 6, .gemv_max_m_16 = 8,
    .gemv = gemv_avx512, .pack = pack_avx512, .micro = micro_avx512,
    .gemv_i8 = gemv_i8_avx512, .pack_i8 = pack_i8_avx512,
    .gemv_i4 = gemv_i4_avx512, .pack_i4 = pack_i4_avx512, .i4_split = 16,
};

#endif
