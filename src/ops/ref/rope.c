/* ops/ref/rope.c — readable reference for rotary position embedding.
 * Frequency i (i < D/2) rotates one pair of elements of every head by the angle
 * pos * inv_freq[i], with cos and sin computed in double and scaled by attn_factor:
 *   (a, b) -> (a*cos - b*sin, b*cos + a*sin)
 * The pair is (i, i + D/2) in split-half style (Hugging Face rotate_half) and
 * (2i, 2i + 1) in interleaved style. Both pair members are read (plus bias) before
 * either is written, so out may be x's own view. O(B*T*H*D). */
#include "ops/ref/rope.h"

/* Element offsets (within a head) of the two members of pair i. */
static void pair_index(lm_rope_style style, int64_t half, int64_t i, int64_t *ia, int64_t *ib) {
    if (style == LM_ROPE_INTERLEAVED) {
        *ia = 2 * i;
        *ib = 2 * i + 1;
    } else {
        *ia = i;
        *ib = i + half;
    }
}

/* Position of token (b, t): from the positions view ([T] shared by all rows, or
 * [B, T]) or pos_offset + t. */
static int64_t token_position(const lm_rope_params *p, int64_t b, int64_t t) {
    const lm_tensor_view *pos = p->positions;
    if (!pos) return p->pos_offset + t;
    int64_t off = pos->ndim == 1 ? t * pos->stride[0] : b * pos->stride[0] + t * pos->stride[1];
    return lm__ld_index(pos->dtype, pos->data, off);
}

/* x[b, t, h, k] (+ bias[h, k]) in double. */
static double load_biased(const lm_tensor_view *x, const lm_tensor_view *bias, int64_t base, int64_t h, int64_t k) {
    double v = lm__ld(x->dtype, x->data, base + k * x->stride[3]);
    if (bias) v += lm__ld(bias->dtype, bias->data, h * bias->stride[0] + k * bias->stride[1]);
    return v;
}

void lm__ref_rope(const lm_tensor_view *x, const lm_rope_params *p, const lm_tensor_view *out) {
    int64_t nb = x->shape[0], nt = x->shape[1], nh = x->shape[2], half = x->shape[3] / 2;
    const lm_tensor_view *inv = p->inv_freq;
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++) {
            double pos = (double)token_position(p, b, t);
            for (int64_t i = 0; i < half; i++) {
                double angle = pos * lm__ld(LM_F32, inv->data, i * inv->stride[0]);
                double c = cos(angle) * p->attn_factor, s = sin(angle) * p->attn_factor;
                int64_t ia, ib;
                pair_index(p->style, half, i, &ia, &ib);
                for (int64_t h = 0; h < nh; h++) {
                    int64_t xb = b * x->stride[0] + t * x->stride[1] + h * x->stride[2];
                    int64_t ob = b * out->stride[0] + t * out->stride[1] + h * out->stride[2];
                    double va = load_biased(x, p->bias, xb, h, ia), vb = load_biased(x, p->bias, xb, h, ib);
                    lm__st(out->dtype, out->data, ob + ia * out->stride[3], va * c - vb * s);
                    lm__st(out->dtype, out->data, ob + ib * out->stride[3], vb * c + va * s);
                }
            }
        }
}

void lm__ref_rope_inv_freq(double theta, int64_t head_dim, const lm_tensor_view *out) {
    for (int64_t i = 0; i < head_dim / 2; i++)
        lm__st(LM_F32, out->data, i * out->stride[0], pow(theta, -2.0 * (double)i / (double)head_dim));
}
