/* ops/cpu/pointwise_kernels.h — the per-instruction-set row kernels behind the tuned
 * pointwise operators (elementwise, cast, RMSNorm, RoPE, softmax).
 *
 * Every kernel works on one row of n f32 values with unit steps (unless a parameter
 * says otherwise) and does f32 math; n may be any size, tails are masked or scalar.
 * Outputs may be the very same memory as an input of the same index (in place): each
 * element, or each vector of elements, is loaded before it is stored. Three tables
 * exist: scalar (portable C, libm expf/sin/cos), AVX2 and AVX-512 (vector exp and
 * double-precision sin/cos of their own, accurate to about one f32 ulp and 1e-14).
 */
#ifndef LOOM_OPS_CPU_POINTWISE_KERNELS_H
#define LOOM_OPS_CPU_POINTWISE_KERNELS_H

#include "ops/cpu/isa.h"
#include "loom/tensor.h"

typedef struct lm__pw_kernels {
    /* o[j] = a[j] + b[j * bstep], bstep 0 (b broadcast) or 1; mul likewise. */
    void (*add)(const float *a, const float *b, int bstep, float *o, int64_t n);
    void (*mul)(const float *a, const float *b, int bstep, float *o, int64_t n);
    /* o[j] = x[j] * s */
    void (*scale)(const float *x, float s, float *o, int64_t n);
    /* o[j] = x[j] / (1 + exp(-x[j])) */
    void (*silu)(const float *x, float *o, int64_t n);
    /* o[j] = silu(g[j]) * u[j] */
    void (*swiglu)(const float *g, const float *u, float *o, int64_t n);
    /* o[j] = f32(x[j]) for x of dtype dt (f32, bf16 or f16); exact. */
    void (*widen)(const void *x, lm_dtype dt, float *o, int64_t n);
    /* sum_j x[j]^2 */
    float (*sumsq)(const float *x, int64_t n);
    /* s[j] = a[j] + b[j]; returns sum_j s[j]^2 (of the stored, rounded s) */
    float (*add_sumsq)(const float *a, const float *b, float *s, int64_t n);
    /* o[j] = (x[j] * r) * w[j], the Hugging Face RMSNorm order */
    void (*norm_apply)(const float *x, float r, const float *w, float *o, int64_t n);
    /* angle_j = pos * inv[j] in double; c[j] = f32(cos(angle_j) * af), s[j] likewise */
    void (*sincos)(double pos, const float *inv, double af, float *c, float *s, int64_t n);
    /* Rotates pairs (xa[j] (+ ba[j]), xb[j] (+ bb[j])) by (c[j], s[j]):
     *   oa[j] = a*c - b*s,  ob[j] = b*c + a*s.  ba and bb are both NULL or both set. */
    void (*rotate)(const float *xa, const float *xb, const float *ba, const float *bb, const float *c,
                   const float *s, float *oa, float *ob, int64_t n);
    /* Interleaved pairs v = x (+ bias, NULL for none), n even, with c2[2i] = c2[2i+1] =
     * c[i], s2[2i] = -s[i], s2[2i+1] = s[i]:  o[j] = v[j] * c2[j] + v[j ^ 1] * s2[j],
     * which rounds exactly as rotate's a*c - b*s and b*c + a*s do. */
    void (*rotate_pairs)(const float *x, const float *bias, const float *c2, const float *s2, float *o, int64_t n);
    /* max_j f32(x[j] * sc); -inf for n == 0 */
    float (*max_scaled)(const float *x, float sc, int64_t n);
    /* o[j] = exp(x[j] * sc - mx) (one rounding of the argument); returns sum_j o[j] */
    float (*exp_sum)(const float *x, float sc, float mx, float *o, int64_t n);
} lm__pw_kernels;

extern const lm__pw_kernels lm__pw_kernels_scalar;
#ifdef LM__HAVE_X86_KERNELS
extern const lm__pw_kernels lm__pw_kernels_avx2;
extern const lm__pw_kernels lm__pw_kernels_avx512;
#endif

/* The table for the active ISA (ops/cpu/isa.h); read once per operator call. */
static inline const lm__pw_kernels *lm__pw_kernels_active(void) {
#ifdef LM__HAVE_X86_KERNELS
    lm__cpu_isa isa = lm__cpu_isa_active();
    if (isa == LM__CPU_ISA_AVX512) return &lm__pw_kernels_avx512;
    if (isa == LM__CPU_ISA_AVX2) return &lm__pw_kernels_avx2;
#endif
    return &lm__pw_kernels_scalar;
}

#endif
