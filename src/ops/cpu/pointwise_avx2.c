/* ops/cpu/pointwise_avx2.c — AVX2 + FMA kernels for the tuned pointwise operators
 * (ymm = 8 f32 or 4 f64 lanes; pointwise_kernels.h says what each computes).
 * Whole vectors run unmasked; the last partial vector of f32 data uses vmaskmov,
 * which never touches masked-out elements, and 16-bit inputs go through a small
 * zero-padded copy. Each kernel is written once as an always-inlined step with a
 * compile-time `full` flag, so the masked branch vanishes from the main loop.
 *  exp (f32): as in the AVX-512 file (Cody-Waite reduction, degree-7 Taylor, inputs
 *    clamped to [-104, 89]); 2^k is applied as 2^(k/2) * 2^(k - k/2), two normal
 *    powers of two, so subnormal results are rounded once and overflow gives inf.
 *  sin/cos (f64): the same two-part pi/2 reduction and Taylor polynomials.
 * Compiled with generic flags: every function carries LM__TARGET_AVX2.
 */
#include "ops/cpu/pointwise_kernels.h"

#ifdef LM__HAVE_X86_KERNELS
#include <immintrin.h>
#include <math.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline)) LM__TARGET_AVX2
#define KERNEL static LM__TARGET_AVX2
#define ROUND_NEAREST (_MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)

INLINE __m256 c8(float v) { return _mm256_set1_ps(v); }
INLINE __m256d c4(double v) { return _mm256_set1_pd(v); }
/* All-ones in lanes j < n (n <= 8). */
INLINE __m256i mask_n(int64_t n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32((int)n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}
INLINE __m256 ld(const float *p, __m256i m, int full) { return full ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, m); }
INLINE void st(float *p, __m256i m, int full, __m256 v) {
    if (full) _mm256_storeu_ps(p, v);
    else _mm256_maskstore_ps(p, m, v);
}
INLINE float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}
INLINE float hmax(__m256 v) {
    __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_max_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_max_ss(s, _mm_shuffle_ps(s, s, 1)));
}

/* 2^k for integer lanes -126 <= k <= 127: the biased exponent field alone. */
INLINE __m256 pow2i(__m256i k) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(k, _mm256_set1_epi32(127)), 23));
}

INLINE __m256 exp8(__m256 x) {
    x = _mm256_max_ps(c8(-104.0f), _mm256_min_ps(c8(89.0f), x)); /* NaN survives (second operand) */
    __m256 k = _mm256_round_ps(_mm256_mul_ps(x, c8(1.44269504f)), ROUND_NEAREST);
    __m256 r = _mm256_fnmadd_ps(k, c8(0.693147182464599609375f), x);
    r = _mm256_fnmadd_ps(k, c8(-1.9046542121259336e-9f), r);
    __m256 p = c8(1.0f / 5040);
    p = _mm256_fmadd_ps(p, r, c8(1.0f / 720));
    p = _mm256_fmadd_ps(p, r, c8(1.0f / 120));
    p = _mm256_fmadd_ps(p, r, c8(1.0f / 24));
    p = _mm256_fmadd_ps(p, r, c8(1.0f / 6));
    p = _mm256_fmadd_ps(p, r, c8(0.5f));
    p = _mm256_fmadd_ps(p, r, c8(1.0f));
    p = _mm256_fmadd_ps(p, r, c8(1.0f));
    __m256i ki = _mm256_cvtps_epi32(k), k1 = _mm256_srai_epi32(ki, 1);
    return _mm256_mul_ps(_mm256_mul_ps(p, pow2i(k1)), pow2i(_mm256_sub_epi32(ki, k1)));
}

INLINE __m256 silu8(__m256 x) {
    return _mm256_div_ps(x, _mm256_add_ps(c8(1.0f), exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
}

INLINE void sincos4(__m256d a, __m256d *sn, __m256d *cs) {
    __m256d k = _mm256_round_pd(_mm256_mul_pd(a, c4(0.6366197723675814)), ROUND_NEAREST);
    __m256d r = _mm256_fnmadd_pd(k, c4(1.5707963267948966), a);
    r = _mm256_fnmadd_pd(k, c4(6.123233995736766e-17), r);
    __m256d r2 = _mm256_mul_pd(r, r);
    __m256d ps = c4(1.0 / 6227020800.0);
    ps = _mm256_fmadd_pd(ps, r2, c4(-1.0 / 39916800.0));
    ps = _mm256_fmadd_pd(ps, r2, c4(1.0 / 362880.0));
    ps = _mm256_fmadd_pd(ps, r2, c4(-1.0 / 5040.0));
    ps = _mm256_fmadd_pd(ps, r2, c4(1.0 / 120.0));
    ps = _mm256_fmadd_pd(ps, r2, c4(-1.0 / 6.0));
    __m256d sv = _mm256_fmadd_pd(_mm256_mul_pd(ps, r2), r, r);
    __m256d pc = c4(-1.0 / 87178291200.0);
    pc = _mm256_fmadd_pd(pc, r2, c4(1.0 / 479001600.0));
    pc = _mm256_fmadd_pd(pc, r2, c4(-1.0 / 3628800.0));
    pc = _mm256_fmadd_pd(pc, r2, c4(1.0 / 40320.0));
    pc = _mm256_fmadd_pd(pc, r2, c4(-1.0 / 720.0));
    pc = _mm256_fmadd_pd(pc, r2, c4(1.0 / 24.0));
    pc = _mm256_fmadd_pd(pc, r2, c4(-0.5));
    __m256d cv = _mm256_fmadd_pd(pc, r2, c4(1.0));
    /* q = k mod 4: sin = (s, c, -s, -c)[q], cos = (c, -s, -c, s)[q] */
    __m256d q = _mm256_fnmadd_pd(c4(4.0), _mm256_floor_pd(_mm256_mul_pd(k, c4(0.25))), k);
    __m256d q1 = _mm256_cmp_pd(q, c4(1.0), _CMP_EQ_OQ), q2 = _mm256_cmp_pd(q, c4(2.0), _CMP_EQ_OQ);
    __m256d q3 = _mm256_cmp_pd(q, c4(3.0), _CMP_EQ_OQ), sign = c4(-0.0);
    __m256d odd = _mm256_or_pd(q1, q3);
    *sn = _mm256_xor_pd(_mm256_blendv_pd(sv, cv, odd), _mm256_and_pd(_mm256_or_pd(q2, q3), sign));
    *cs = _mm256_xor_pd(_mm256_blendv_pd(cv, sv, odd), _mm256_and_pd(_mm256_or_pd(q1, q2), sign));
}

/* Runs STEP(j, m, full) over a row of n elements: whole vectors, then one masked. */
#define ROW_LOOP(n, STEP)                                  \
    do {                                                   \
        int64_t j_ = 0;                                    \
        __m256i all_ = _mm256_set1_epi32(-1);              \
        for (; j_ + 8 <= (n); j_ += 8) STEP(j_, all_, 1);  \
        if (j_ < (n)) STEP(j_, mask_n((n) - j_), 0);       \
    } while (0)

INLINE void add_step(const float *a, const float *b, int bstep, float *o, __m256i m, int full) {
    __m256 bv = bstep ? ld(b, m, full) : c8(b[0]);
    st(o, m, full, _mm256_add_ps(ld(a, m, full), bv));
}
KERNEL void add_v(const float *a, const float *b, int bstep, float *o, int64_t n) {
#define STEP(j, m, f) add_step(a + j, b + (bstep ? j : 0), bstep, o + j, m, f)
    ROW_LOOP(n, STEP);
#undef STEP
}

INLINE void mul_step(const float *a, const float *b, int bstep, float *o, __m256i m, int full) {
    __m256 bv = bstep ? ld(b, m, full) : c8(b[0]);
    st(o, m, full, _mm256_mul_ps(ld(a, m, full), bv));
}
KERNEL void mul_v(const float *a, const float *b, int bstep, float *o, int64_t n) {
#define STEP(j, m, f) mul_step(a + j, b + (bstep ? j : 0), bstep, o + j, m, f)
    ROW_LOOP(n, STEP);
#undef STEP
}

KERNEL void scale_v(const float *x, float s, float *o, int64_t n) {
#define STEP(j, m, f) st(o + j, m, f, _mm256_mul_ps(ld(x + j, m, f), c8(s)))
    ROW_LOOP(n, STEP);
#undef STEP
}

KERNEL void silu_v(const float *x, float *o, int64_t n) {
#define STEP(j, m, f) st(o + j, m, f, silu8(ld(x + j, m, f)))
    ROW_LOOP(n, STEP);
#undef STEP
}

KERNEL void swiglu_v(const float *g, const float *u, float *o, int64_t n) {
#define STEP(j, m, f) st(o + j, m, f, _mm256_mul_ps(silu8(ld(g + j, m, f)), ld(u + j, m, f)))
    ROW_LOOP(n, STEP);
#undef STEP
}

/* 8 halves at h widened to f32 (F16C for f16, a 16-bit shift for bf16). */
INLINE __m256 widen8(const uint16_t *h, lm_dtype dt) {
    __m128i v = _mm_loadu_si128((const __m128i *)h);
    if (dt == LM_F16) return _mm256_cvtph_ps(v);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(v), 16));
}
KERNEL void widen_v(const void *x, lm_dtype dt, float *o, int64_t n) {
    if (dt == LM_F32) {
        const float *f = x;
#define STEP(j, m, full) st(o + j, m, full, ld(f + j, m, full))
        ROW_LOOP(n, STEP);
#undef STEP
        return;
    }
    const uint16_t *h = x;
    int64_t j = 0;
    for (; j + 8 <= n; j += 8) _mm256_storeu_ps(o + j, widen8(h + j, dt));
    if (j < n) {
        uint16_t tail[8] = {0};
        memcpy(tail, h + j, (size_t)(n - j) * sizeof(uint16_t));
        _mm256_maskstore_ps(o + j, mask_n(n - j), widen8(tail, dt));
    }
}

KERNEL float sumsq_v(const float *x, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    int64_t j = 0;
    for (; j + 32 <= n; j += 32) {
        __m256 v0 = _mm256_loadu_ps(x + j), v1 = _mm256_loadu_ps(x + j + 8);
        __m256 v2 = _mm256_loadu_ps(x + j + 16), v3 = _mm256_loadu_ps(x + j + 24);
        s0 = _mm256_fmadd_ps(v0, v0, s0);
        s1 = _mm256_fmadd_ps(v1, v1, s1);
        s2 = _mm256_fmadd_ps(v2, v2, s2);
        s3 = _mm256_fmadd_ps(v3, v3, s3);
    }
#define STEP(j, m, f)                     \
    do {                                  \
        __m256 v_ = ld(x + j, m, f);      \
        s0 = _mm256_fmadd_ps(v_, v_, s0); \
    } while (0)
    for (; j + 8 <= n; j += 8) STEP(j, _mm256_set1_epi32(-1), 1);
    if (j < n) STEP(j, mask_n(n - j), 0);
#undef STEP
    return hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
}

KERNEL float add_sumsq_v(const float *a, const float *b, float *s, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = s0;
    int64_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m256 v0 = _mm256_add_ps(_mm256_loadu_ps(a + j), _mm256_loadu_ps(b + j));
        __m256 v1 = _mm256_add_ps(_mm256_loadu_ps(a + j + 8), _mm256_loadu_ps(b + j + 8));
        _mm256_storeu_ps(s + j, v0);
        _mm256_storeu_ps(s + j + 8, v1);
        s0 = _mm256_fmadd_ps(v0, v0, s0);
        s1 = _mm256_fmadd_ps(v1, v1, s1);
    }
#define STEP(j, m, f)                                             \
    do {                                                          \
        __m256 v_ = _mm256_add_ps(ld(a + j, m, f), ld(b + j, m, f)); \
        st(s + j, m, f, v_);                                      \
        s0 = _mm256_fmadd_ps(v_, v_, s0);                         \
    } while (0)
    for (; j + 8 <= n; j += 8) STEP(j, _mm256_set1_epi32(-1), 1);
    if (j < n) STEP(j, mask_n(n - j), 0); /* masked lanes load 0 and add nothing */
#undef STEP
    return hsum(_mm256_add_ps(s0, s1));
}

KERNEL void norm_apply_v(const float *x, float r, const float *w, float *o, int64_t n) {
#define STEP(j, m, f) st(o + j, m, f, _mm256_mul_ps(_mm256_mul_ps(ld(x + j, m, f), c8(r)), ld(w + j, m, f)))
    ROW_LOOP(n, STEP);
#undef STEP
}

KERNEL void sincos_v(double pos, const float *inv, double af, float *c, float *s, int64_t n) {
    for (int64_t j = 0; j < n; j += 4) {
        __m128i m = _mm256_castsi256_si128(mask_n(LM_MIN(n - j, 4)));
        __m256d a = _mm256_mul_pd(c4(pos), _mm256_cvtps_pd(_mm_maskload_ps(inv + j, m)));
        __m256d sv, cv;
        sincos4(a, &sv, &cv);
        _mm_maskstore_ps(c + j, m, _mm256_cvtpd_ps(_mm256_mul_pd(cv, c4(af))));
        _mm_maskstore_ps(s + j, m, _mm256_cvtpd_ps(_mm256_mul_pd(sv, c4(af))));
    }
}

INLINE void rotate_step(const float *xa, const float *xb, const float *ba, const float *bb, const float *c,
                        const float *s, float *oa, float *ob, __m256i m, int full) {
    __m256 a = ld(xa, m, full), b = ld(xb, m, full);
    if (ba) {
        a = _mm256_add_ps(a, ld(ba, m, full));
        b = _mm256_add_ps(b, ld(bb, m, full));
    }
    __m256 cv = ld(c, m, full), sv = ld(s, m, full);
    st(oa, m, full, _mm256_fmsub_ps(a, cv, _mm256_mul_ps(b, sv)));
    st(ob, m, full, _mm256_fmadd_ps(b, cv, _mm256_mul_ps(a, sv)));
}
KERNEL void rotate_v(const float *xa, const float *xb, const float *ba, const float *bb, const float *c,
                     const float *s, float *oa, float *ob, int64_t n) {
#define STEP(j, m, f) \
    rotate_step(xa + j, xb + j, ba ? ba + j : NULL, bb ? bb + j : NULL, c + j, s + j, oa + j, ob + j, m, f)
    ROW_LOOP(n, STEP);
#undef STEP
}

INLINE void rotate_pairs_step(const float *x, const float *bias, const float *c2, const float *s2, float *o,
                              __m256i m, int full) {
    __m256 v = ld(x, m, full);
    if (bias) v = _mm256_add_ps(v, ld(bias, m, full));
    __m256 w = _mm256_permute_ps(v, 0xB1); /* swap each pair: lanes (1, 0, 3, 2) */
    st(o, m, full, _mm256_fmadd_ps(v, ld(c2, m, full), _mm256_mul_ps(w, ld(s2, m, full))));
}
KERNEL void rotate_pairs_v(const float *x, const float *bias, const float *c2, const float *s2, float *o, int64_t n) {
#define STEP(j, m, f) rotate_pairs_step(x + j, bias ? bias + j : NULL, c2 + j, s2 + j, o + j, m, f)
    ROW_LOOP(n, STEP);
#undef STEP
}

KERNEL float max_scaled_v(const float *x, float sc, int64_t n) {
    __m256 mx = c8(-INFINITY);
/* masked-out lanes count as -inf */
#define STEP(j, m, f)                                                                               \
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(c8(-INFINITY), _mm256_mul_ps(ld(x + j, m, f), c8(sc)), \
                                            _mm256_castsi256_ps(m)))
    ROW_LOOP(n, STEP);
#undef STEP
    return hmax(mx);
}

KERNEL float exp_sum_v(const float *x, float sc, float mx, float *o, int64_t n) {
    __m256 acc = _mm256_setzero_ps();
#define STEP(j, m, f)                                                                  \
    do {                                                                               \
        __m256 e_ = exp8(_mm256_fmsub_ps(ld(x + j, m, f), c8(sc), c8(mx)));            \
        st(o + j, m, f, e_);                                                           \
        acc = _mm256_add_ps(acc, _mm256_and_ps(e_, _mm256_castsi256_ps(m)));           \
    } while (0)
    ROW_LOOP(n, STEP);
#undef STEP
    return hsum(acc);
}

const lm__pw_kernels lm__pw_kernels_avx2 = {
    .add = add_v, .mul = mul_v, .scale = scale_v, .silu = silu_v, .swiglu = swiglu_v, .widen = widen_v,
    .sumsq = sumsq_v, .add_sumsq = add_sumsq_v, .norm_apply = norm_apply_v, .sincos = sincos_v,
    .rotate = rotate_v, .rotate_pairs = rotate_pairs_v, .max_scaled = max_scaled_v, .exp_sum = exp_sum_v,
};

#endif
