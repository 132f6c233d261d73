/* ops/cpu/matmul_scalar.c — portable C kernels for lm__cpu_linear: the fallback on
 * CPUs without AVX2/FMA/F16C and on non-x86 builds. Same structure as the vector
 * paths (gemv over W rows, packed panels + an 8 x 8 register tile for GEMM) so the
 * driver is shared; every dot product is a sequential f32 sum over k. int8 weights
 * go through the same loops (lm__widen1 widens them; the scale comes after the sum
 * in gemv, into the panel in pack); int4 weights are dequantized per element.
 */
#include "ops/cpu/matmul_kernels.h"

enum { GEMV_MR = 4, MR = 8, NR = 8 };

/* One W row at a time against up to GEMV_MR x rows: the row is widened once per k. */
static void gemv_scalar(const float *x, int64_t ldx, int64_t M, const void *w, lm_dtype wdt, int64_t ldw,
                        int64_t nrows, int64_t K, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++) {
        const void *wr = lm__w_at(w, wdt, ldw, r, 0);
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_MR) {
            int mr = (int)(M - m0 < GEMV_MR ? M - m0 : GEMV_MR);
            const float *xm = x + m0 * ldx;
            float acc[GEMV_MR] = {0};
            for (int64_t k = 0; k < K; k++) {
                float wv = lm__widen1(wr, wdt, k);
                for (int m = 0; m < mr; m++) acc[m] += xm[m * ldx + k] * wv;
            }
            for (int m = 0; m < mr; m++) y[(m0 + m) * ldy + r] = acc[m];
        }
    }
}

static void gemv_i8_scalar(const float *x, int64_t ldx, int64_t M, const int8_t *q, int64_t ldq,
                           const lm__i8_epilogue *ep, int64_t nrows, int64_t K, float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++) {
        const int8_t *qr = q + r * ldq;
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_MR) {
            int mr = (int)(M - m0 < GEMV_MR ? M - m0 : GEMV_MR);
            const float *xm = x + m0 * ldx;
            float acc[GEMV_MR] = {0};
            for (int64_t k = 0; k < K; k++) {
                float wv = (float)qr[k];
                for (int m = 0; m < mr; m++) acc[m] += xm[m * ldx + k] * wv;
            }
            for (int m = 0; m < mr; m++) {
                float *yp = y + (m0 + m) * ldy + r;
                *yp = lm__i8_finish(ep, r, acc[m], yp);
            }
        }
    }
}

/* int4: each weight dequantized (q * its group's scale) once per k, then as above. */
static void gemv_i4_scalar(const float *x, int64_t ldx, int64_t M, const lm__i4_weights *W, int64_t nrows, int64_t K,
                           float *y, int64_t ldy) {
    for (int64_t r = 0; r < nrows; r++) {
        const uint8_t *qr = W->q + r * W->ldq;
        const void *sc = lm__i4_srow(W, r);
        const int sb = W->scales16 != NULL;
        for (int64_t m0 = 0; m0 < M; m0 += GEMV_MR) {
            int mr = (int)(M - m0 < GEMV_MR ? M - m0 : GEMV_MR);
            const float *xm = x + m0 * ldx;
            float acc[GEMV_MR] = {0};
            for (int64_t k0 = 0, g = 0; k0 < K; k0 += W->group, g++)
                for (int64_t k = k0; k < k0 + W->group; k++) {
                    float wv = (float)lm__i4_get(qr, k) * lm__i4_sc(sc, sb, g);
                    for (int m = 0; m < mr; m++) acc[m] += xm[m * ldx + k] * wv;
                }
            for (int m = 0; m < mr; m++) {
                float *yp = y + (m0 + m) * ldy + r;
                *yp = lm__i4_finish(W, r, acc[m], yp);
            }
        }
    }
}

static void pack_i4_scalar(const lm__i4_weights *W, int ncols, int64_t k0, int64_t kc, float *dst) {
    lm__pack_i4_generic(W, NR, ncols, k0, kc, dst);
}

static void pack_scalar(const void *w, lm_dtype wdt, int64_t ldw, int ncols, int64_t kc, float *dst) {
    for (int j = 0; j < NR; j++) {
        if (j >= ncols) {
            for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = 0.0f;
            continue;
        }
        const void *row = lm__w_at(w, wdt, ldw, j, 0);
        for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = lm__widen1(row, wdt, k);
    }
}

/* Fixed MR x NR loops (rows past mrows repeat the last row and are dropped) so the
 * compiler can keep the tile in registers and vectorize across j with whatever the
 * generic target offers; each element is still a sequential sum over k. */
static void pack_i8_scalar(const int8_t *q, int64_t ldq, const float *scales, int ncols, int64_t kc, float *dst) {
    for (int j = 0; j < NR; j++)
        for (int64_t k = 0; k < kc; k++) dst[k * NR + j] = j < ncols ? (float)q[j * ldq + k] * scales[j] : 0.0f;
}

static void micro_scalar(int64_t kc, const float *a, int64_t lda, int mrows, const float *bp, float *c,
                         int64_t ldc, int ncols, int accumulate) {
    const float *ar[MR];
    float acc[MR][NR] = {{0}};
    for (int r = 0; r < MR; r++) ar[r] = a + (r < mrows ? r : mrows - 1) * lda;
    for (int64_t k = 0; k < kc; k++) {
        const float *b = bp + k * NR;
        for (int r = 0; r < MR; r++) {
            float av = ar[r][k];
            for (int j = 0; j < NR; j++) acc[r][j] += av * b[j];
        }
    }
    for (int r = 0; r < mrows; r++)
        for (int j = 0; j < ncols; j++) c[r * ldc + j] = accumulate ? c[r * ldc + j] + acc[r][j] : acc[r][j];
}

const lm__linear_kernels lm__linear_kernels_scalar = {
    .mr = MR, .nr = NR, .kc = 256, .nc = 512,
    .gemv_max_m_f32 = GEMV_MR, .gemv_max_m_16 = GEMV_MR,
    .gemv = gemv_scalar, .pack = pack_scalar, .micro = micro_scalar,
    .gemv_i8 = gemv_i8_scalar, .pack_i8 = pack_i8_scalar,
    .gemv_i4 = gemv_i4_scalar, .pack_i4 = pack_i4_scalar,
};
