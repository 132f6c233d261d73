/* ops/ref/loss.c — readable reference for mean cross-entropy over rows of logits.
 * loss = mean over rows r with targets[r] != ignore_index of
 * logsumexp(logits[r, :]) - logits[r, targets[r]], all in double, with the row max
 * subtracted inside logsumexp so large logits never overflow. No counted row gives
 * 0/0 = NaN (as PyTorch). Every target is checked before out is written.
 * O(N * V) time, no workspace.
 */
#include "ops/ref/loss.h"

lm_status lm__ref_cross_entropy(const lm_tensor_view *logits, const lm_tensor_view *targets, int64_t ignore_index,
                                const lm_tensor_view *out) {
    int64_t N = logits->shape[0], V = logits->shape[1];
    double total = 0.0;
    int64_t counted = 0;
    for (int64_t r = 0; r < N; r++) {
        int64_t t = lm__index_at(targets, r);
        if (t == ignore_index) continue;
        if (t < 0 || t >= V)
            return lm__error(LM_OUT_OF_RANGE,
                             "cross_entropy: targets[%lld] = %lld is outside [0, %lld) and is not ignore_index %lld",
                             (long long)r, (long long)t, (long long)V, (long long)ignore_index);
        int64_t x0 = r * logits->stride[0], xs = logits->stride[1];
        total += lm__row_logsumexp(logits->dtype, logits->data, x0, xs, V) - lm__ld(logits->dtype, logits->data, x0 + t * xs);
        counted++;
    }
    lm__st(LM_F32, out->data, 0, counted ? total / (double)counted : NAN);
    return LM_OK;
}
