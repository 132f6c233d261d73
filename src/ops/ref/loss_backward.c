/* ops/ref/loss_backward.c — readable references for the cross-entropy gradient and the
 * fused output projection + cross-entropy.
 * Cross-entropy: with p = softmax(row) and c = dloss / counted,
 *   dlogits[r, j] = c * (p_j - [j == target_r])   (0 on ignored rows).
 * Fused: one row at a time, z = w x_r (V dot products over H) lives in a [V] double
 * workspace, never as an [N, V] matrix. The loss is mean(logsumexp(z) - z_target);
 * the backward recomputes z, forms dz = c (softmax(z) - onehot) and adds
 *   dx[r, :] = sum_v dz_v w[v, :],   dw[v, :] += dz_v x[r, :]
 * with dw summed over rows in a [V, H] double workspace, rounded once at the end.
 * O(N V H) time. Softmax subtracts the row max (no overflow); everything in double.
 */
#include "ops/ref/loss_backward.h"

/* logsumexp of n values. */
static double logsumexp(const double *z, int64_t n) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t j = 0; j < n; j++) mx = z[j] > mx ? z[j] : mx;
    if (isinf(mx)) return mx;
    for (int64_t j = 0; j < n; j++) sum += exp(z[j] - mx);
    return mx + log(sum);
}

void lm__ref_cross_entropy_backward(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                    double scale, const lm_tensor_view *dlogits) {
    int64_t N = logits->shape[0], V = logits->shape[1];
    for (int64_t r = 0; r < N; r++) {
        int64_t t = lm__index_at(targets, r), x0 = r * logits->stride[0], o0 = r * dlogits->stride[0];
        double lse = t == ignore_index ? 0.0 : lm__row_logsumexp(logits->dtype, logits->data, x0, logits->stride[1], V);
        for (int64_t j = 0; j < V; j++) {
            double g = 0.0;
            if (t != ignore_index) { /* an infinite logsumexp makes the row NaN, as softmax does */
                double p = isinf(lse) ? NAN : exp(lm__ld(logits->dtype, logits->data, x0 + j * logits->stride[1]) - lse);
                g = scale * (p - (j == t ? 1.0 : 0.0));
            }
            lm__st(dlogits->dtype, dlogits->data, o0 + j * dlogits->stride[1], g);
        }
    }
}

/* z[v] = x[r, :] . w[v, :] for every v. */
static void row_logits(const lm_tensor_view *x, const lm_tensor_view *w, int64_t r, double *z) {
    int64_t V = w->shape[0], H = w->shape[1];
    for (int64_t v = 0; v < V; v++) {
        double acc = 0.0;
        for (int64_t h = 0; h < H; h++)
            acc += lm__ld(x->dtype, x->data, r * x->stride[0] + h * x->stride[1]) *
                   lm__ld(w->dtype, w->data, v * w->stride[0] + h * w->stride[1]);
        z[v] = acc;
    }
}

lm_status lm__ref_linear_cross_entropy(const lm_tensor_view *x, const lm_tensor_view *w, const lm_tensor_view *targets,
                                       int64_t ignore_index, int64_t counted, const lm_tensor_view *loss) {
    int64_t N = x->shape[0], V = w->shape[0];
    double *z = lm__calloc((size_t)V + 1, sizeof *z), total = 0.0;
    if (!z) return lm__error_context(LM_OUT_OF_MEMORY, "linear_cross_entropy row of %lld logits", (long long)V);
    for (int64_t r = 0; r < N; r++) {
        int64_t t = lm__index_at(targets, r);
        if (t == ignore_index) continue;
        row_logits(x, w, r, z);
        total += logsumexp(z, V) - z[t];
    }
    lm__st(LM_F32, loss->data, 0, counted ? total / (double)counted : NAN);
    lm__free(z);
    return LM_OK;
}

lm_status lm__ref_linear_cross_entropy_backward(const lm_tensor_view *x, const lm_tensor_view *w,
                                                const lm_tensor_view *targets, int64_t ignore_index, int64_t counted,
                                                double dloss, const lm_tensor_view *dx, const lm_tensor_view *dw) {
    int64_t N = x->shape[0], V = w->shape[0], H = w->shape[1];
    double c = counted ? dloss / (double)counted : 0.0;
    double *z = lm__calloc((size_t)(V + H + (dw ? V * H : 0) + 1), sizeof *z);
    if (!z) return lm__error_context(LM_OUT_OF_MEMORY, "linear_cross_entropy_backward workspace");
    double *gx = z + V, *gw = dw ? gx + H : NULL; /* gx [H], gw [V, H] */
    for (int64_t r = 0; r < N; r++) {
        int64_t t = lm__index_at(targets, r);
        for (int64_t h = 0; h < H; h++) gx[h] = 0.0;
        if (t != ignore_index) {
            row_logits(x, w, r, z);
            double lse = logsumexp(z, V);
            for (int64_t v = 0; v < V; v++) {
                double dz = c * (exp(z[v] - lse) - (v == t ? 1.0 : 0.0));
                for (int64_t h = 0; h < H; h++) {
                    gx[h] += dz * lm__ld(w->dtype, w->data, v * w->stride[0] + h * w->stride[1]);
                    if (gw) gw[v * H + h] += dz * lm__ld(x->dtype, x->data, r * x->stride[0] + h * x->stride[1]);
                }
            }
        }
        for (int64_t h = 0; dx && h < H; h++) lm__st(dx->dtype, dx->data, r * dx->stride[0] + h * dx->stride[1], gx[h]);
    }
    for (int64_t v = 0; gw && v < V; v++)
        for (int64_t h = 0; h < H; h++) lm__st(dw->dtype, dw->data, v * dw->stride[0] + h * dw->stride[1], gw[v * H + h]);
    lm__free(z);
    return LM_OK;
}
