/* ops/ref/rope_backward.c — readable reference for the RoPE gradient. The forward maps
 * each pair (a, b) of a head to (a c - b s, b c + a s) with c = f cos(angle) and
 * s = f sin(angle) (f = attn_factor); the transposed map is
 *   da = dy_a c + dy_b s,    db = -dy_a s + dy_b c.
 * The bias is added before rotating, so dbias[h, :] = sum over (b, t) of dx[b, t, h, :].
 * Pairs, positions and angles are found exactly as in ops/ref/rope.c. O(B*T*H*D),
 * an [H*D] double workspace when dbias is asked for.
 */
#include "ops/ref/rope_backward.h"

static int64_t position_of(const lm_rope_params *p, int64_t b, int64_t t) {
    const lm_tensor_view *pos = p->positions;
    if (!pos) return p->pos_offset + t;
    int64_t off = pos->ndim == 1 ? t * pos->stride[0] : b * pos->stride[0] + t * pos->stride[1];
    return lm__ld_index(pos->dtype, pos->data, off);
}

lm_status lm__ref_rope_backward(const lm_tensor_view *dout, const lm_rope_params *p, const lm_tensor_view *dx,
                                const lm_tensor_view *dbias) {
    int64_t nb = dout->shape[0], nt = dout->shape[1], nh = dout->shape[2], half = dout->shape[3] / 2;
    double *acc = NULL; /* [H, D] sum of dx for dbias */
    if (dbias && !(acc = lm__calloc((size_t)(nh * 2 * half) + 1, sizeof *acc)))
        return lm__error_context(LM_OUT_OF_MEMORY, "rope_backward workspace");
    for (int64_t b = 0; b < nb; b++)
        for (int64_t t = 0; t < nt; t++) {
            double pos = (double)position_of(p, b, t);
            for (int64_t i = 0; i < half; i++) {
                double angle = pos * lm__ld(LM_F32, p->inv_freq->data, i * p->inv_freq->stride[0]);
                double c = cos(angle) * p->attn_factor, s = sin(angle) * p->attn_factor;
                int64_t ia = p->style == LM_ROPE_INTERLEAVED ? 2 * i : i;
                int64_t ib = p->style == LM_ROPE_INTERLEAVED ? 2 * i + 1 : i + half;
                for (int64_t h = 0; h < nh; h++) {
                    int64_t yb = b * dout->stride[0] + t * dout->stride[1] + h * dout->stride[2];
                    double ya = lm__ld(dout->dtype, dout->data, yb + ia * dout->stride[3]);
                    double yv = lm__ld(dout->dtype, dout->data, yb + ib * dout->stride[3]);
                    double ga = ya * c + yv * s, gb = -ya * s + yv * c;
                    if (dx) {
                        int64_t xb = b * dx->stride[0] + t * dx->stride[1] + h * dx->stride[2];
                        lm__st(dx->dtype, dx->data, xb + ia * dx->stride[3], ga);
                        lm__st(dx->dtype, dx->data, xb + ib * dx->stride[3], gb);
                    }
                    if (acc) {
                        acc[h * 2 * half + ia] += ga;
                        acc[h * 2 * half + ib] += gb;
                    }
                }
            }
        }
    for (int64_t h = 0; acc && h < nh; h++)
        for (int64_t k = 0; k < 2 * half; k++)
            lm__st(dbias->dtype, dbias->data, h * dbias->stride[0] + k * dbias->stride[1], acc[h * 2 * half + k]);
    lm__free(acc);
    return LM_OK;
}
