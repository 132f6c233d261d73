/* ops/cpu/pointwise_scalar.c — portable kernels for the tuned pointwise operators
 * (pointwise_kernels.h): plain loops in f32 with libm expf, and cos/sin in double
 * for RoPE. They run on CPUs without AVX2 and are the baseline the vector tables are
 * tested against. Sums are kept in double (there are no lanes to spread them over).
 */
#include "ops/cpu/pointwise_kernels.h"

#include <math.h>

static void add_s(const float *a, const float *b, int bstep, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = a[j] + b[j * bstep];
}

static void mul_s(const float *a, const float *b, int bstep, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = a[j] * b[j * bstep];
}

static void scale_s(const float *x, float s, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = x[j] * s;
}

static float silu1(float x) { return x / (1.0f + expf(-x)); }

static void silu_s(const float *x, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = silu1(x[j]);
}

static void swiglu_s(const float *g, const float *u, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = silu1(g[j]) * u[j];
}

static void widen_s(const void *x, lm_dtype dt, float *o, int64_t n) {
    if (dt == LM_F32) {
        const float *f = x;
        for (int64_t j = 0; j < n; j++) o[j] = f[j];
        return;
    }
    const uint16_t *h = x;
    if (dt == LM_F16)
        for (int64_t j = 0; j < n; j++) o[j] = lm_f16_to_f32(h[j]);
    else
        for (int64_t j = 0; j < n; j++) o[j] = lm_bf16_to_f32(h[j]);
}

static float sumsq_s(const float *x, int64_t n) {
    double ss = 0;
    for (int64_t j = 0; j < n; j++) ss += (double)x[j] * x[j];
    return (float)ss;
}

static float add_sumsq_s(const float *a, const float *b, float *s, int64_t n) {
    double ss = 0;
    for (int64_t j = 0; j < n; j++) {
        float v = a[j] + b[j];
        s[j] = v;
        ss += (double)v * v;
    }
    return (float)ss;
}

static void norm_apply_s(const float *x, float r, const float *w, float *o, int64_t n) {
    for (int64_t j = 0; j < n; j++) o[j] = x[j] * r * w[j];
}

static void sincos_s(double pos, const float *inv, double af, float *c, float *s, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        double a = pos * inv[j];
        c[j] = (float)(cos(a) * af);
        s[j] = (float)(sin(a) * af);
    }
}

static void rotate_s(const float *xa, const float *xb, const float *ba, const float *bb, const float *c,
                     const float *s, float *oa, float *ob, int64_t n) {
    for (int64_t j = 0; j < n; j++) {
        float a = ba ? xa[j] + ba[j] : xa[j], b = bb ? xb[j] + bb[j] : xb[j];
        oa[j] = a * c[j] - b * s[j];
        ob[j] = b * c[j] + a * s[j];
    }
}

static void rotate_pairs_s(const float *x, const float *bias, const float *c2, const float *s2, float *o,
                           int64_t n) {
    for (int64_t j = 0; j < n; j += 2) {
        float a = bias ? x[j] + bias[j] : x[j], b = bias ? x[j + 1] + bias[j + 1] : x[j + 1];
        o[j] = a * c2[j] + b * s2[j];
        o[j + 1] = b * c2[j + 1] + a * s2[j + 1];
    }
}

static float max_scaled_s(const float *x, float sc, int64_t n) {
    float m = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        float v = x[j] * sc;
        if (v > m) m = v;
    }
    return m;
}

static float exp_sum_s(const float *x, float sc, float mx, float *o, int64_t n) {
    double sum = 0;
    for (int64_t j = 0; j < n; j++) {
        /* x * sc is exact in double, so the argument is rounded once */
        float e = expf((float)((double)x[j] * sc - mx));
        o[j] = e;
        sum += e;
    }
    return (float)sum;
}

const lm__pw_kernels lm__pw_kernels_scalar = {
    .add = add_s, .mul = mul_s, .scale = scale_s, .silu = silu_s, .swiglu = swiglu_s, .widen = widen_s,
    .sumsq = sumsq_s, .add_sumsq = add_sumsq_s, .norm_apply = norm_apply_s, .sincos = sincos_s,
    .rotate = rotate_s, .rotate_pairs = rotate_pairs_s, .max_scaled = max_scaled_s, .exp_sum = exp_sum_s,
};
