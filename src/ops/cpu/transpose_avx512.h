/* ops/cpu/transpose_avx512.h — the 16 x 16 in-register transpose the AVX-512 GEMM
 * packers share (matmul_avx512.c for f32 panels, matmul_bf16dot_avx512.c for bf16
 * pair panels). Pure lane shuffles: bit patterns move unchanged, so it transposes
 * 16 x 16 blocks of any 32-bit elements (f32, or pairs of bf16 viewed as f32).
 * Include only from sources that compile AVX-512 functions (LM__HAVE_X86_KERNELS).
 */
#ifndef LOOM_OPS_CPU_TRANSPOSE_AVX512_H
#define LOOM_OPS_CPU_TRANSPOSE_AVX512_H

#include "ops/cpu/isa.h"

#include <immintrin.h>

/* In-place transpose of a 16 x 16 f32 block held in 16 registers: r[i][j] -> r[j][i]. */
static inline __attribute__((always_inline)) LM__TARGET_AVX512 void lm__transpose16_avx512(__m512 r[16]) {
    __m512 t[16], u[16];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++) { /* pairs of rows: 2 x 2 blocks inside each 128-bit lane */
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
#pragma GCC unroll 4
    for (int g = 0; g < 4; g++) { /* groups of 4 rows: u[4g + i] lane L = rows 4g..4g+3, column 4L + i */
        __m512d a = _mm512_castps_pd(t[4 * g]), b = _mm512_castps_pd(t[4 * g + 1]);
        __m512d c = _mm512_castps_pd(t[4 * g + 2]), d = _mm512_castps_pd(t[4 * g + 3]);
        u[4 * g + 0] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, c));
        u[4 * g + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, c));
        u[4 * g + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, d));
        u[4 * g + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, d));
    }
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) { /* gather lane L of the four groups: column 4L + i */
        __m512 lo01 = _mm512_shuffle_f32x4(u[i], u[4 + i], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 hi01 = _mm512_shuffle_f32x4(u[i], u[4 + i], _MM_SHUFFLE(3, 2, 3, 2));
        __m512 lo23 = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], _MM_SHUFFLE(1, 0, 1, 0));
        __m512 hi23 = _mm512_shuffle_f32x4(u[8 + i], u[12 + i], _MM_SHUFFLE(3, 2, 3, 2));
        r[i] = _mm512_shuffle_f32x4(lo01, lo23, _MM_SHUFFLE(2, 0, 2, 0));
        r[4 + i] = _mm512_shuffle_f32x4(lo01, lo23, _MM_SHUFFLE(3, 1, 3, 1));
        r[8 + i] = _mm512_shuffle_f32x4(hi01, hi23, _MM_SHUFFLE(2, 0, 2, 0));
        r[12 + i] = _mm512_shuffle_f32x4(hi01, hi23, _MM_SHUFFLE(3, 1, 3, 1));
    }
}

#endif
