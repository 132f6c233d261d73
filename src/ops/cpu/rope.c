/* ops/cpu/rope.c — tuned rotary position embedding: for token (b, t) at position p
 * and i < D/2, one pair of every head turns by p * inv_freq[i]:
 *   (a, b) -> (a*c - b*s, b*c + a*s),  c = cos(angle) * attn_factor, s likewise,
 * the pair being (i, i + D/2) in split-half style (Hugging Face rotate_half) and
 * (2i, 2i + 1) interleaved. Per token, cos/sin are computed once for all heads, in
 * double (vector sin/cos, ops/cpu/pointwise_kernels.h) and rounded to f32, then each
 * head is rotated in f32: within NMSE ~1e-14 of the reference, and both styles round
 * identically. Each pair is loaded before it is stored, so out may be x's own view.
 * O(B*T*(H*D + D/2 sin/cos)).
 */
#include "ops/cpu/pointwise.h"

#include "ops/cpu/pointwise_kernels.h"
#include "ops/cpu/rows.h"

/* Frequencies per sin/cos batch: the c/s tables (and their interleaved forms, 6 KB in
 * all) stay on the stack. */
#define BLOCK 256

typedef struct rope_job {
    const lm__pw_kernels *k;
    const lm_rope_params *p;
    const float *x;    /* [B, T, H, D] element strides xs, unit step in D */
    float *out;        /* [B, T, H, D] strides os, unit step in D */
    const float *inv;  /* [D/2] unit step */
    const float *bias; /* [H, D] rows bias_ld apart, unit step; NULL for none */
    int64_t xs[3], os[3], bias_ld;
    int64_t T, H, half;
} rope_job;

/* Position of token (b, t), as the reference reads it. */
static int64_t position(const lm_rope_params *p, int64_t b, int64_t t) {
    const lm_tensor_view *pos = p->positions;
    if (!pos) return p->pos_offset + t;
    int64_t off = pos->ndim == 1 ? t * pos->stride[0] : b * pos->stride[0] + t * pos->stride[1];
    return lm__ld_index(pos->dtype, pos->data, off);
}

/* The interleaved kernel's tables (pointwise_kernels.h, rotate_pairs). */
static void pair_tables(const float *c, const float *s, int64_t len, float *c2, float *s2) {
    for (int64_t i = 0; i < len; i++) {
        c2[2 * i] = c2[2 * i + 1] = c[i];
        s2[2 * i] = -s[i];
        s2[2 * i + 1] = s[i];
    }
}

static void rope_range(void *arg, int64_t begin, int64_t end) {
    const rope_job *j = arg;
    float c[BLOCK], s[BLOCK], c2[2 * BLOCK], s2[2 * BLOCK];
    int interleaved = j->p->style == LM_ROPE_INTERLEAVED;
    for (int64_t u = begin; u < end; u++) {
        int64_t b = u / j->T, t = u - b * j->T;
        double pos = (double)position(j->p, b, t);
        const float *xt = j->x + b * j->xs[0] + t * j->xs[1];
        float *ot = j->out + b * j->os[0] + t * j->os[1];
        for (int64_t i0 = 0; i0 < j->half; i0 += BLOCK) {
            int64_t len = LM_MIN(BLOCK, j->half - i0);
            j->k->sincos(pos, j->inv + i0, j->p->attn_factor, c, s, len);
            if (interleaved) {
                pair_tables(c, s, len, c2, s2);
                for (int64_t h = 0; h < j->H; h++) {
                    const float *bias = j->bias ? j->bias + h * j->bias_ld + 2 * i0 : NULL;
                    j->k->rotate_pairs(xt + h * j->xs[2] + 2 * i0, bias, c2, s2, ot + h * j->os[2] + 2 * i0, 2 * len);
                }
                continue;
            }
            for (int64_t h = 0; h < j->H; h++) {
                const float *xa = xt + h * j->xs[2] + i0, *ba = j->bias ? j->bias + h * j->bias_ld + i0 : NULL;
                float *oa = ot + h * j->os[2] + i0;
                j->k->rotate(xa, xa + j->half, ba, ba ? ba + j->half : NULL, c, s, oa, oa + j->half, len);
            }
        }
    }
}

int lm__cpu_rope_supported(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out) {
    if (x->dtype != LM_F32 || out->dtype != LM_F32) return 0;
    int64_t half = x->shape[3] / 2;
    if (half == 0) return 1;
    if (x->stride[3] != 1 || out->stride[3] != 1) return 0;
    if (half > 1 && p->inv_freq->stride[0] != 1) return 0;
    return !p->bias || p->bias->stride[1] == 1;
}

void lm__cpu_rope(lm_threadpool *pool, const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(x) == 0) return;
    rope_job j = {.k = lm__pw_kernels_active(), .p = p, .x = x->data, .out = out->data, .inv = p->inv_freq->data,
                  .bias = p->bias ? p->bias->data : NULL, .bias_ld = p->bias ? p->bias->stride[0] : 0,
                  .T = x->shape[1], .H = x->shape[2], .half = x->shape[3] / 2};
    for (int d = 0; d < 3; d++) {
        j.xs[d] = x->stride[d];
        j.os[d] = out->stride[d];
    }
    /* a token's sin/cos cost about as much as rotating 16 elements per frequency */
    int64_t token_cost = j.H * x->shape[3] + 16 * j.half;
    lm__cpu_parallel(pool, x->shape[0] * j.T, token_cost, rope_range, &j);
}
