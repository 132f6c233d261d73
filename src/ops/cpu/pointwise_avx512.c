/* ops/cpu/pointwise_avx512.c — AVX-512 kernels for the tuned pointwise operators
 * (zmm = 16 f32 or 8 f64 lanes; pointwise_kernels.h says what each computes). Every
 * loop step is masked, so tails need no scalar code and masked-out elements are never
 * touched (no faults past a row's end).
 *  exp (f32): x = k ln2 + r, k = round(x / ln2), ln2 split in two for Cody-Waite with
 *    FMAs; e^r by its degree-7 Taylor polynomial on |r| <= ln2/2 (truncation 5e-9,
 *    below f32's 6e-8 unit roundoff); 2^k applied by vscalefps, which rounds
 *    subnormal results and overflows to inf correctly. x is clamped to [-104, 89],
 *    outside which e^x is 0 / inf in f32; NaN propagates.
 *  sin/cos (f64, RoPE angles): a = q pi/2 + r, pi/2 in two parts with FMAs (r exact
 *    to ~1e-16 for |q| < 2^31); Taylor polynomials to r^13 / r^14 on |r| <= pi/4
 *    (truncation < 3e-14); the quadrant q swaps and negates.
 * Compiled with generic flags: every function carries LM__TARGET_AVX512.
 */
#include "ops/cpu/pointwise_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX512
#define KERNEL static LM__TARGET_AVX512
#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

INLINE __mmask16 mask16(int64_t n) { return n >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << n) - 1u); }
INLINE __mmask8 mask8(int64_t n) { return n >= 8 ? (__mmask8)0xff : (__mmask8)((1u << n) - 1u); }
INLINE __m512 ld(const float *p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
INLINE void st(float *p, __mmask16 m, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
INLINE __m512 c16(float v) { return _mm512_set1_ps(v); }
INLINE __m512d c8(double v) { return _mm512_set1_pd(v); }

INLINE __m512 exp16(__m512 x) {
    /* min/max return their second operand when either is NaN: NaN survives */
    x = _mm512_max_ps(c16(-104.0f), _mm512_min_ps(c16(89.0f), x));
    __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, c16(1.44269504f)), ROUND_NEAREST);
    __m512 r = _mm512_fnmadd_ps(k, c16(0.693147182464599609375f), x);
    r = _mm512_fnmadd_ps(k, c16(-1.9046542121259336e-9f), r);
    __m512 p = c16(1.0f / 5040);
    p = _mm512_fmadd_ps(p, r, c16(1.0f / 720));
    p = _mm512_fmadd_ps(p, r, c16(1.0f / 120));
    p = _mm512_fmadd_ps(p, r, c16(1.0f / 24));
    p = _mm512_fmadd_ps(p, r, c16(1.0f / 6));
    p = _mm512_fmadd_ps(p, r, c16(0.5f));
    p = _mm512_fmadd_ps(p, r, c16(1.0f));
    p = _mm512_fmadd_ps(p, r, c16(1.0f));
    return _mm512_scalef_ps(p, k);
}

INLINE __m512 silu16(__m512 x) {
    return _mm512_div_ps(x, _mm512_add_ps(c16(1.0f), exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
}

/* Flips the sign of the lanes in m. */
INLINE __m512d negate_where(__m512d v, __mmask8 m) {
    __m512i bits = _mm512_castpd_si512(v), sign = _mm512_set1_epi64((long long)0x8000000000000000ull);
    return _mm512_castsi512_pd(_mm512_mask_xor_epi64(bits, m, bits, sign));
}

INLINE void sincos8(__m512d a, __m512d *sn, __m512d *cs) {
    __m512d k = _mm512_roundscale_pd(_mm512_mul_pd(a, c8(0.6366197723675814)), ROUND_NEAREST);
    __m512d r = _mm512_fnmadd_pd(k, c8(1.5707963267948966), a);
    r = _mm512_fnmadd_pd(k, c8(6.123233995736766e-17), r);
    __m512d r2 = _mm512_mul_pd(r, r);
    __m512d ps = c8(1.0 / 6227020800.0);
    ps = _mm512_fmadd_pd(ps, r2, c8(-1.0 / 39916800.0));
    ps = _mm512_fmadd_pd(ps, r2, c8(1.0 / 362880.0));
    ps = _mm512_fmadd_pd(ps, r2, c8(-1.0 / 5040.0));
    ps = _mm512_fmadd_pd(ps, r2, c8(1.0 / 120.0));
    ps = _mm512_fmadd_pd(ps, r2, c8(-1.0 / 6.0));
    __m512d sv = _mm512_fmadd_pd(_mm512_mul_pd(ps, r2), r, r);
    __m512d pc = c8(-1.0 / 87178291200.0);
    pc = _mm512_fmadd_pd(pc, r2, c8(1.0 / 479001600.0));
    pc = _mm512_fmadd_pd(pc, r2, c8(-1.0 / 3628800.0));
    pc = _mm512_fmadd_pd(pc, r2, c8(1.0 / 40320.0));
    pc = _mm512_fmadd_pd(pc, r2, c8(-1.0 / 720.0));
    pc = _mm512_fmadd_pd(pc, r2, c8(1.0 / 24.0));
    pc = _mm512_fmadd_pd(pc, r2, c8(-0.5));
    __m512d cv = _mm512_fmadd_pd(pc, r2, c8(1.0));
    /* q = k mod 4: sin = (s, c, -s, -c)[q], cos = (c, -s, -c, s)[q] */
    __m512d q = _mm512_fnmadd_pd(c8(4.0), _mm512_roundscale_pd(_mm512_mul_pd(k, c8(0.25)), _MM_FROUND_TO_NEG_INF),
                                 k);
    __mmask8 q1 = _mm512_cmp_pd_mask(q, c8(1.0), _CMP_EQ_OQ), q2 = _mm512_cmp_pd_mask(q, c8(2.0), _CMP_EQ_OQ);
    __mmask8 q3 = _mm512_cmp_pd_mask(q, c8(3.0), _CMP_EQ_OQ);
    __mmask8 odd = (__mmask8)(q1 | q3);
    *sn = negate_where(_mm512_mask_blend_pd(odd, sv, cv), (__mmask8)(q2 | q3));
    *cs = negate_where(_mm512_mask_blend_pd(odd, cv, sv), (__mmask8)(q1 | q2));
}

KERNEL void add_v(const float *a, const float *b, int bstep, float *o, int64_t n) {
    if (bstep == 0) {
        __m512 bv = n > 0 ? c16(b[0]) : _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 m = mask16(n - j);
            st(o + j, m, _mm512_add_ps(ld(a + j, m), bv));
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, _mm512_add_ps(ld(a + j, m), ld(b + j, m)));
    }
}

KERNEL void mul_v(const float *a, const float *b, int bstep, float *o, int64_t n) {
    if (bstep == 0) {
        __m512 bv = n > 0 ? c16(b[0]) : _mm512_setzero_ps();
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 m = mask16(n - j);
            st(o + j, m, _mm512_mul_ps(ld(a + j, m), bv));
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, _mm512_mul_ps(ld(a + j, m), ld(b + j, m)));
    }
}

KERNEL void scale_v(const float *x, float s, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, _mm512_mul_ps(ld(x + j, m), c16(s)));
    }
}

KERNEL void silu_v(const float *x, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, silu16(ld(x + j, m)));
    }
}

KERNEL void swiglu_v(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, _mm512_mul_ps(silu16(ld(g + j, m)), ld(u + j, m)));
    }
}

KERNEL void widen_v(const void *x, lm_dtype dt, float *o, int64_t n) {
    if (dt == LM_F32) {
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 m = mask16(n - j);
            st(o + j, m, ld((const float *)x + j, m));
        }
        return;
    }
    const uint16_t *h = x;
    if (dt == LM_F16) {
        for (int64_t j = 0; j < n; j += 16) {
            __mmask16 m = mask16(n - j);
            st(o + j, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, h + j)));
        }
        return;
    }
    for (int64_t j = 0; j < n; j += 16) { /* bf16 is the top half of an f32 */
        __mmask16 m = mask16(n - j);
        __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, h + j));
        st(o + j, m, _mm512_castsi512_ps(_mm512_slli_epi32(w, 16)));
    }
}

/* Four accumulators (64 elements per step) hide the FMA latency. */
KERNEL float sumsq_v(const float *x, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 64 <= n; j += 64) {
        __m512 v0 = _mm512_loadu_ps(x + j), v1 = _mm512_loadu_ps(x + j + 16);
        __m512 v2 = _mm512_loadu_ps(x + j + 32), v3 = _mm512_loadu_ps(x + j + 48);
        s0 = _mm512_fmadd_ps(v0, v0, s0);
        s1 = _mm512_fmadd_ps(v1, v1, s1);
        s2 = _mm512_fmadd_ps(v2, v2, s2);
        s3 = _mm512_fmadd_ps(v3, v3, s3);
    }
    for (; j < n; j += 16) {
        __m512 v = ld(x + j, mask16(n - j));
        s0 = _mm512_fmadd_ps(v, v, s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(s0, s1), _mm512_add_ps(s2, s3)));
}

KERNEL float add_sumsq_v(const float *a, const float *b, float *s, int64_t n) {
    __m512 s0 = _mm512_setzero_ps(), s1 = s0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m512 v0 = _mm512_add_ps(_mm512_loadu_ps(a + j), _mm512_loadu_ps(b + j));
        __m512 v1 = _mm512_add_ps(_mm512_loadu_ps(a + j + 16), _mm512_loadu_ps(b + j + 16));
        _mm512_storeu_ps(s + j, v0);
        _mm512_storeu_ps(s + j + 16, v1);
        s0 = _mm512_fmadd_ps(v0, v0, s0);
        s1 = _mm512_fmadd_ps(v1, v1, s1);
    }
    for (; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512 v = _mm512_add_ps(ld(a + j, m), ld(b + j, m));
        st(s + j, m, v);
        s0 = _mm512_fmadd_ps(v, v, s0);
    }
    return _mm512_reduce_add_ps(_mm512_add_ps(s0, s1));
}

KERNEL void norm_apply_v(const float *x, float r, const float *w, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        st(o + j, m, _mm512_mul_ps(_mm512_mul_ps(ld(x + j, m), c16(r)), ld(w + j, m)));
    }
}

KERNEL void sincos_v(double pos, const float *inv, double af, float *c, float *s, int64_t n) {
    for (int64_t j = 0; j < n; j += 8) {
        __mmask8 m = mask8(n - j);
        __m512d a = _mm512_mul_pd(c8(pos), _mm512_cvtps_pd(_mm256_maskz_loadu_ps(m, inv + j)));
        __m512d sv, cv;
        sincos8(a, &sv, &cv);
        _mm256_mask_storeu_ps(c + j, m, _mm512_cvtpd_ps(_mm512_mul_pd(cv, c8(af))));
        _mm256_mask_storeu_ps(s + j, m, _mm512_cvtpd_ps(_mm512_mul_pd(sv, c8(af))));
    }
}

KERNEL void rotate_v(const float *xa, const float *xb, const float *ba, const float *bb, const float *c,
                     const float *s, float *oa, float *ob, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512 a = ld(xa + j, m), b = ld(xb + j, m);
        if (ba) {
            a = _mm512_add_ps(a, ld(ba + j, m));
            b = _mm512_add_ps(b, ld(bb + j, m));
        }
        __m512 cv = ld(c + j, m), sv = ld(s + j, m);
        st(oa + j, m, _mm512_fmsub_ps(a, cv, _mm512_mul_ps(b, sv)));
        st(ob + j, m, _mm512_fmadd_ps(b, cv, _mm512_mul_ps(a, sv)));
    }
}

KERNEL void rotate_pairs_v(const float *x, const float *bias, const float *c2, const float *s2, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512 v = ld(x + j, m);
        if (bias) v = _mm512_add_ps(v, ld(bias + j, m));
        __m512 w = _mm512_permute_ps(v, 0xB1); /* swap each pair: lanes (1, 0, 3, 2) */
        st(o + j, m, _mm512_fmadd_ps(v, ld(c2 + j, m), _mm512_mul_ps(w, ld(s2 + j, m))));
    }
}

KERNEL float max_scaled_v(const float *x, float sc, int64_t n) {
    __m512 mx = c16(-INFINITY);
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        mx = _mm512_mask_max_ps(mx, m, mx, _mm512_mul_ps(ld(x + j, m), c16(sc)));
    }
    return _mm512_reduce_max_ps(mx);
}

KERNEL float exp_sum_v(const float *x, float sc, float mx, float *o, int64_t n) {
    __m512 acc = _mm512_setzero_ps();
    for (int64_t j = 0; j < n; j += 16) {
        __mmask16 m = mask16(n - j);
        __m512 e = exp16(_mm512_fmsub_ps(ld(x + j, m), c16(sc), c16(mx)));
        st(o + j, m, e);
        acc = _mm512_mask_add_ps(acc, m, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

const lm__pw_kernels lm__pw_kernels_avx512 = {
    .add = add_v, .mul = mul_v, .scale = scale_v, .silu = silu_v, .swiglu = swiglu_v, .widen = widen_v,
    .sumsq = sumsq_v, .add_sumsq = add_sumsq_v, .norm_apply = norm_apply_v, .sincos = sincos_v,
    .rotate = rotate_v, .rotate_pairs = rotate_pairs_v, .max_scaled = max_scaled_v, .exp_sum = exp_sum_v,
};

#endif
