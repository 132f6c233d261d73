/* ops/cpu/matmul_i8dot_avx2_body.h — the gemv and GEMM of one AVX2-path
 * lm__i8dot_kernels set, included by matmul_i8dot_avx2.c once per set with SFX (the
 * set's name), TARGET_SET (its target attribute), GMR (its tile rows) and, for the
 * AVX-VNNI set, LM__I8DOT_VNNI defined. No include guard: each inclusion defines that
 * set's functions. */

#define I8_CAT2(a, b) a##_##b
#define I8_CAT(a, b) I8_CAT2(a, b)
#define I8_FN(name) I8_CAT(name, SFX)
#define I8_INLINE static inline __attribute__((always_inline)) TARGET_SET

/* acc + the 8 int32 lanes' sums of 4 products w * x each (x signed, |x| <= 127). */
I8_INLINE __m256i I8_FN(dot)(__m256i acc, __m256i aw, __m256i w, __m256i x) {
    const __m256i sx = _mm256_sign_epi8(x, w);
#ifdef LM__I8DOT_VNNI
    return _mm256_dpbusd_avx_epi32(acc, aw, sx);
#else
    return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1)));
#endif
}

/* One block's products for MRX x rows (from xm, rb bytes apart): acc[m] += (xq[m] . w) *
 * d[m][b] (times the lanes' group scales ws when grouped). */
I8_INLINE void I8_FN(block)(const uint8_t *xm, size_t rb, int64_t nb, const int MRX, int64_t b, __m256i w0, __m256i w1,
                            __m256 ws, const int grouped, __m256 *acc) {
    const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
    for (int m = 0; m < MRX; m++) {
        const uint8_t *base = xm + (size_t)m * rb;
        const __m256i x0 = _mm256_load_si256((const __m256i *)(base + b * QB));
        const __m256i x1 = _mm256_load_si256((const __m256i *)(base + b * QB + 32));
        __m256i s = I8_FN(dot)(_mm256_setzero_si256(), a0, w0, x0);
        s = I8_FN(dot)(s, a1, w1, x1);
        const __m256 dm = _mm256_set1_ps(((const float *)(base + nb * QB))[b]);
        acc[m] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), grouped ? _mm256_mul_ps(ws, dm) : dm, acc[m]);
    }
}

/* W row r (int8 row wr, or int4 row r of W4) against MRX x rows: y[m * ldy] = the
 * row's epilogue of sum_b d[m][b] * (xq[m] . w)[b]. Even blocks go to one accumulator,
 * odd ones to another. */
I8_INLINE void I8_FN(row)(const uint8_t *xm, size_t rb, int64_t nb, const int MRX, const int8_t *wr,
                          const lm__i4_weights *W4, const int G, const int SB, int64_t r, int64_t K,
                          const lm__i8_epilogue *ep, float *y, int64_t ldy) {
    __m256 acc0[GEMV_MR], acc1[GEMV_MR];
    for (int m = 0; m < MRX; m++) acc0[m] = acc1[m] = _mm256_setzero_ps();
    const int64_t full = K / QB;
    const uint8_t *qr = W4 ? W4->q + r * W4->ldq : NULL;
    const void *sc = W4 ? lm__i4_srow(W4, r) : NULL;
    __m256i w0, w1;
    __m256 ws = _mm256_setzero_ps();
    int64_t b = 0;
    for (; b < nb; b++) {
        if (W4) i4_block(qr, sc, SB, G, b, full, &w0, &w1, &ws);
        else i8_block(wr, K, b, full, &w0, &w1);
        if (b & 1) I8_FN(block)(xm, rb, nb, MRX, b, w0, w1, ws, W4 != NULL, acc1);
        else I8_FN(block)(xm, rb, nb, MRX, b, w0, w1, ws, W4 != NULL, acc0);
    }
    for (int m = 0; m < MRX; m++) {
        const float s = hsum2(acc0[m], acc1[m]);
        if (W4) {
            const float v = s + (W4->bias ? W4->bias[r] : 0.0f);
            y[m * ldy] = W4->accumulate ? y[m * ldy] + v : v;
        } else {
            y[m * ldy] = lm__i8_finish(ep, r, s, y + m * ldy);
        }
    }
}

/* Every W row of the call against every x row: x rows in chunks of MC, within a chunk
 * each W row against GEMV_MR x rows at a time (the row stays in L1, the chunk's bytes
 * in L2). int8 rows (q8) or int4 rows (W4, group G). */
I8_INLINE void I8_FN(rows_g)(const void *xprep, int64_t M, int64_t K, const int8_t *q8, int64_t ldq,
                             const lm__i8_epilogue *ep, const lm__i4_weights *W4, const int G, const int SB,
                             int64_t nrows, float *y, int64_t ldy) {
    const int64_t nb = nblocks(K);
    const size_t rb = row_bytes(K);
    for (int64_t c = 0; c < M; c += MC)
        for (int64_t r = 0; r < nrows; r++)
            for (int64_t m = c; m < LM_MIN(M, c + MC); m += GEMV_MR) {
                const uint8_t *xm = (const uint8_t *)xprep + (size_t)m * rb;
                const int8_t *wr = q8 ? q8 + r * ldq : NULL;
                float *ym = y + m * ldy + r;
                switch (LM_MIN(GEMV_MR, M - m)) {
                case 1: I8_FN(row)(xm, rb, nb, 1, wr, W4, G, SB, r, K, ep, ym, ldy); break;
                case 2: I8_FN(row)(xm, rb, nb, 2, wr, W4, G, SB, r, K, ep, ym, ldy); break;
                case 3: I8_FN(row)(xm, rb, nb, 3, wr, W4, G, SB, r, K, ep, ym, ldy); break;
                default: I8_FN(row)(xm, rb, nb, 4, wr, W4, G, SB, r, K, ep, ym, ldy); break;
                }
            }
}

TARGET_SET static void I8_FN(gemv_i8)(const void *xprep, int64_t M, int64_t K, const int8_t *q, int64_t ldq,
                                      const lm__i8_epilogue *ep, int64_t nrows, float *y, int64_t ldy) {
    I8_FN(rows_g)(xprep, M, K, q, ldq, ep, NULL, 0, 0, nrows, y, ldy);
}

TARGET_SET static void I8_FN(gemv_i4)(const void *xprep, int64_t M, int64_t K, const lm__i4_weights *W, int64_t nrows,
                                      float *y, int64_t ldy) {
    /* the group and the scales' dtype (bf16 when W->scales16) constants in each copy */
#define I4(G, SB) I8_FN(rows_g)(xprep, M, K, NULL, 0, NULL, W, G, SB, nrows, y, ldy)
    const int sb = W->scales16 != NULL;
    if (W->group == 32) sb ? I4(32, 1) : I4(32, 0);
    else if (W->group == 64) sb ? I4(64, 1) : I4(64, 0);
    else sb ? I4(128, 1) : I4(128, 0);
#undef I4
}

#ifdef LM__I8DOT_VNNI
#define I8_CW 1   /* strips with starting values; panels biased to unsigned */
#define I8_BIAS8 128
#define I8_BIAS4 8
#else
#define I8_CW 0
#define I8_BIAS8 0
#define I8_BIAS4 0
#endif

static size_t I8_FN(gemm_x_bytes)(int64_t M, int64_t K, int unit) {
    return (size_t)((M + GMR - 1) / GMR) * strip_bytes(K, unit, GMR, I8_CW);
}

TARGET_SET static void I8_FN(gemm_prep_x)(const float *x, int64_t ldx, int64_t M, int64_t K, int unit, int bias,
                                          void *dst, int64_t s0, int64_t s1) {
    prep_strips(x, ldx, M, K, unit, bias, dst, s0, s1, GMR, I8_CW);
}

TARGET_SET static void I8_FN(pack_i8)(const int8_t *q, int64_t ldq, int ncols, int64_t kl, uint8_t *dst) {
    pack_i8_g(q, ldq, ncols, kl, dst, I8_BIAS8);
}

TARGET_SET static void I8_FN(pack_i4)(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kl, int unit,
                                      uint8_t *dst, float *gs) {
    pack_i4_g(W, ncols, k0, kl, unit, dst, gs, I8_BIAS4);
}

/* One GEMM tile: MRX x rows (a strip from m0) against one panel over the K block's nu
 * units: per unit the int32 sums s (from the rows' starting values with biased weights),
 * then one conversion and FMA by d (and the group scales) into acc. */
I8_INLINE void I8_FN(micro_tile)(const lm__i8dot_tile *t, const int MRX, const int U) {
    const int64_t nb = nblocks(t->K);
    const uint8_t *st = (const uint8_t *)t->xprep + (size_t)(t->m0 / GMR) * strip_bytes(t->K, U, GMR, I8_CW);
    const float *d = (const float *)(st + nb * QB * GMR);
    const int32_t *cw = (const int32_t *)(st + nb * QB * GMR + pad64(nb * GMR * 4));
    const int64_t u0 = t->k0 / U;
    __m256 acc[GMR][2];
    for (int m = 0; m < MRX; m++) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t u = 0; u < t->nu; u++) {
        __m256i s[GMR][2];
        for (int m = 0; m < MRX; m++)
            s[m][0] = s[m][1] = I8_CW ? _mm256_set1_epi32(cw[(u0 + u) * GMR + m]) : _mm256_setzero_si256();
        const uint8_t *pu = t->bp + (size_t)u * (U / 4) * (NR * 4), *xu = st + (t->k0 + u * U) * GMR;
        for (int i = 0; i < U / 4; i++) {
            const __m256i w0 = _mm256_loadu_si256((const __m256i *)(pu + i * (NR * 4)));
            const __m256i w1 = _mm256_loadu_si256((const __m256i *)(pu + i * (NR * 4) + 32));
#ifndef LM__I8DOT_VNNI
            const __m256i a0 = _mm256_abs_epi8(w0), a1 = _mm256_abs_epi8(w1);
#endif
            for (int m = 0; m < MRX; m++) {
                int32_t xv;
                memcpy(&xv, xu + (i * GMR + m) * 4, 4);
                const __m256i xb = _mm256_set1_epi32(xv);
#ifdef LM__I8DOT_VNNI
                s[m][0] = _mm256_dpbusd_avx_epi32(s[m][0], w0, xb);
                s[m][1] = _mm256_dpbusd_avx_epi32(s[m][1], w1, xb);
#else
                s[m][0] = I8_FN(dot)(s[m][0], a0, w0, xb);
                s[m][1] = I8_FN(dot)(s[m][1], a1, w1, xb);
#endif
            }
        }
        const int64_t b = (t->k0 + u * U) / QB;
        __m256 g0 = _mm256_set1_ps(1.0f), g1 = g0;
        if (t->gs) g0 = _mm256_loadu_ps(t->gs + u * NR), g1 = _mm256_loadu_ps(t->gs + u * NR + 8);
        for (int m = 0; m < MRX; m++) {
            const __m256 dm = _mm256_set1_ps(d[b * GMR + m]);
            acc[m][0] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][0]), t->gs ? _mm256_mul_ps(g0, dm) : dm, acc[m][0]);
            acc[m][1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[m][1]), t->gs ? _mm256_mul_ps(g1, dm) : dm, acc[m][1]);
        }
    }
    for (int m = 0; m < MRX; m++) {
        float y[NR];
        _mm256_storeu_ps(y, acc[m][0]);
        _mm256_storeu_ps(y + 8, acc[m][1]);
        float *cp = t->c + m * t->ldc;
        for (int j = 0; j < t->ncols; j++) {
            const float v = t->cs ? y[j] * t->cs[j] : y[j];
            cp[j] = t->accumulate ? cp[j] + v : v;
        }
    }
}

TARGET_SET static void I8_FN(micro)(const lm__i8dot_tile *t) {
#define I8_TILE(U)                                                                                                 \
    switch (t->mrows) {                                                                                            \
    case 1: I8_FN(micro_tile)(t, 1, U); break;                                                                     \
    case 2: I8_FN(micro_tile)(t, 2, U); break;                                                                     \
    case 3: I8_FN(micro_tile)(t, 3, U); break;                                                                     \
    case 4: I8_FN(micro_tile)(t, GMR > 4 ? 4 : GMR, U); break;                                                     \
    case 5: I8_FN(micro_tile)(t, GMR > 5 ? 5 : GMR, U); break;                                                     \
    default: I8_FN(micro_tile)(t, GMR, U); break;                                                                  \
    }
    if (t->unit == 32) {
        I8_TILE(32)
    } else {
        I8_TILE(64)
    }
#undef I8_TILE
}

const lm__i8dot_kernels I8_CAT(lm__i8dot_kernels, SFX) = {
    .x_bytes = x_bytes_avx2,
    .prep_x = prep_x_i8,
    .gemv = I8_FN(gemv_i8),
    .prep_x_i4 = prep_x_i4,
    .gemv_i4 = I8_FN(gemv_i4),
    /* kc 512 x nc 256: 128 KiB of panels, in the L2 of the smaller AVX2 cores too */
    .gemm_mr = GMR,
    .gemm_nr = NR,
    .gemm_kc = 512,
    .gemm_nc = 256,
    .gemm_x_bytes = I8_FN(gemm_x_bytes),
    .gemm_prep_x = I8_FN(gemm_prep_x),
    .pack_i8 = I8_FN(pack_i8),
    .pack_i4 = I8_FN(pack_i4),
    .micro = I8_FN(micro),
};

#undef I8_CW
#undef I8_BIAS8
#undef I8_BIAS4
#undef I8_CAT2
#undef I8_CAT
#undef I8_FN
#undef I8_INLINE
