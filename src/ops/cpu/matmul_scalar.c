/* ops/cpu/matmul_scalar.c — portable C kernels for lm__cpu_linear: the fallback on
 * CPUs without AVX2/FMA/F16C and on non-x86 builds. Same structure as the vector
 * paths (gemv over W rows, packed panels + a 4 x 16 register tile for GEMM) so the
 * driver is shared; every dot product is a sequential f32 sum over k.
 */
#include "ops/cpu/matmul_kernels.h"

enum { GEMV_MR = 4, GEMV_NR = 4, MR = 4, NR = 16 };

static void gemv_scalar(const float *x, int64_t ldx, int mrows, const void *w, lm_dtype wdt, int64_t ldw,
                        int nrows, int64_t K, float *y, int64_t ldy) {
    float acc[GEMV_MR][GEMV_NR] = {{0}};
    for (int64_t k = 0; k < K; k++) {
        float wv[GEMV_NR];
        for (int r = 0; r < nrows; r++) wv[r] = lm__widen1(lm__w_at(w, wdt, ldw, r, 0), wdt, k);
        for (int m = 0; m < mrows; m++) {
            float xv = x[m * ldx + k];
            for (int r = 0; r < nrows; r++) acc[m][r] += xv * wv[r];
        }
    }
    for (int m = 0; m < mrows; m++)
        for (int r = 0; r < nrows; r++) y[m * ldy + r] = acc[m][r];
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

static void micro_scalar(int64_t kc, const float *a, int64_t lda, int mrows, const float *bp, float *c,
                         int64_t ldc, int ncols, int accumulate) {
    float acc[MR][NR] = {{0}};
    for (int64_t k = 0; k < kc; k++) {
        const float *b = bp + k * NR;
        for (int r = 0; r < mrows; r++) {
            float av = a[r * lda + k];
            for (int j = 0; j < NR; j++) acc[r][j] += av * b[j];
        }
    }
    for (int r = 0; r < mrows; r++)
        for (int j = 0; j < ncols; j++) c[r * ldc + j] = accumulate ? c[r * ldc + j] + acc[r][j] : acc[r][j];
}

const lm__linear_kernels lm__linear_kernels_scalar = {
    .mr = MR, .nr = NR, .kc = 256, .nc = 512,
    .gemv_mr = GEMV_MR, .gemv_nr = GEMV_NR, .gemv_max_m = GEMV_MR,
    .gemv = gemv_scalar, .pack = pack_scalar, .micro = micro_scalar,
};
