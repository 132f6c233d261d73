/* ops/cpu/attention_scalar.c — portable C kernels for lm__cpu_attention: the fallback
 * on CPUs without AVX2/FMA and on non-x86 builds. Both score layouts of the vector
 * paths exist (the softmax differs only in strides here) so the driver is shared and
 * every layout is exercised on every path; exp2f from libm does the exponentials.
 * Every sum is a sequential f32 sum.
 */
#include "ops/cpu/attention_kernels.h"

#include <math.h>

enum { LANES = 4, ROWS_MAX = 32, KL_ROWS_MAX = 3, BK = 64 };

/* Row lanes: d outer and r inner, so the inner loop runs over contiguous qt and st
 * (the compiler may vectorize it). */
static void scores_rl_scalar(const float *qt, int64_t rp, int64_t D, const float *k, int64_t ldk, int64_t nk,
                             float *st) {
    for (int64_t j = 0; j < nk; j++) {
        float *s = st + j * rp;
        for (int64_t r = 0; r < rp; r++) s[r] = 0.0f;
        for (int64_t d = 0; d < D; d++) {
            const float *q = qt + d * rp;
            float kv = k[j * ldk + d];
            for (int64_t r = 0; r < rp; r++) s[r] += q[r] * kv;
        }
    }
}

/* Key lanes: one sequential dot product per (row, key). */
static void scores_kl_scalar(const float *q, int64_t ldq, int64_t rows, int64_t D, const float *k, int64_t ldk,
                             int64_t nk, float *s, int64_t lds) {
    for (int64_t r = 0; r < rows; r++)
        for (int64_t j = 0; j < nk; j++) {
            float acc = 0.0f;
            for (int64_t d = 0; d < D; d++) acc += q[r * ldq + d] * k[j * ldk + d];
            s[r * lds + j] = acc;
        }
}

/* The online-softmax step (attention_kernels.h) on s[r * rs + j * js]. */
static void softmax(float *s, int64_t rs, int64_t js, int64_t rows, int64_t nk, const int32_t *last, float *m,
                    float *l, float *alpha) {
    for (int64_t r = 0; r < rows; r++) {
        float *sr = s + r * rs;
        int64_t n = last ? LM_MAX(0, LM_MIN(nk, (int64_t)last[r] + 1)) : nk; /* visible keys j < n */
        float mx = -INFINITY;
        for (int64_t j = 0; j < n; j++) mx = fmaxf(mx, sr[j * js]);
        float mn = fmaxf(m[r], mx);
        float ms = mn == -INFINITY ? 0.0f : mn; /* nothing visible yet: every p is 0 */
        float sum = 0.0f;
        for (int64_t j = 0; j < nk; j++) {
            float p = j < n ? exp2f(sr[j * js] - ms) : 0.0f;
            sr[j * js] = p;
            sum += p;
        }
        alpha[r] = exp2f(m[r] - ms);
        l[r] = l[r] * alpha[r] + sum;
        m[r] = mn;
    }
}

static void softmax_rl_scalar(float *st, int64_t rp, int64_t nk, const int32_t *last, float *m, float *l,
                              float *alpha) {
    softmax(st, 1, rp, rp, nk, last, m, l, alpha);
}

static void softmax_kl_scalar(float *s, int64_t lds, int64_t rows, int64_t nk, const int32_t *last, float *m,
                              float *l, float *alpha) {
    softmax(s, lds, 1, rows, nk, last, m, l, alpha);
}

static void pv_scalar(const float *p, int64_t prs, int64_t pjs, int64_t rows, int64_t nk, const float *v,
                      int64_t ldv, int64_t Dv, const float *alpha, float *acc, int64_t lda) {
    for (int64_t r = 0; r < rows; r++) {
        float *a = acc + r * lda;
        for (int64_t e = 0; e < Dv; e++) a[e] *= alpha[r];
        for (int64_t j = 0; j < nk; j++) {
            float pj = p[r * prs + j * pjs];
            const float *vj = v + j * ldv;
            for (int64_t e = 0; e < Dv; e++) a[e] += pj * vj[e];
        }
    }
}

const lm__attn_kernels lm__attn_kernels_scalar = {
    .lanes = LANES, .rows_max = ROWS_MAX, .kl_rows_max = KL_ROWS_MAX, .bk = BK,
    .scores_rl = scores_rl_scalar, .softmax_rl = softmax_rl_scalar,
    .scores_kl = scores_kl_scalar, .softmax_kl = softmax_kl_scalar, .pv = pv_scalar,
};
