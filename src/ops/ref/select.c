/* ops/ref/select.c — readable reference for argmax and top-k over the last dim.
 * Order used by both: a NaN ranks above every number (and equal to other NaNs);
 * equal elements rank by lower index first. argmax is one scan per row, O(N).
 * top-k keeps the best k indices seen so far, sorted, in a [k] workspace and inserts
 * each new element that beats the current k-th: O(N * k) worst case per row, close to
 * O(N) for random rows. Selected values are copied, so they are exact in x's dtype.
 */
#include "ops/ref/select.h"

/* 1 when value a ranks strictly above value b (NaN above numbers; ties never do). */
static int ranks_above(double a, double b) { return (isnan(a) && !isnan(b)) || a > b; }

void lm__ref_argmax(const lm_tensor_view *x, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    int last = x->ndim - 1;
    int64_t n = x->shape[last], xs = x->stride[last];
    int64_t idx[LM_MAX_DIMS] = {0}; /* over x's leading dims (= out's dims); idx[last] stays 0 */
    do {
        int64_t x0 = lm__offset(x, idx), best = 0;
        double best_v = lm__ld(x->dtype, x->data, x0);
        for (int64_t j = 1; j < n; j++) {
            double v = lm__ld(x->dtype, x->data, x0 + j * xs);
            if (ranks_above(v, best_v)) best = j, best_v = v;
        }
        lm__st_index(out->dtype, out->data, lm__offset(out, idx), best);
    } while (lm__nd_next(last, x->shape, idx));
}

/* Fills top[0..k) with the indices of the k highest-ranked elements of one row of n
 * elements at x0 + j * xs, best first; top_v holds their values. */
static void topk_row(const lm_tensor_view *x, int64_t x0, int64_t xs, int64_t n, int64_t k,
                     int64_t *top /* [k] */, double *top_v /* [k] */) {
    int64_t filled = 0;
    for (int64_t j = 0; j < n; j++) {
        double v = lm__ld(x->dtype, x->data, x0 + j * xs);
        if (filled == k && !ranks_above(v, top_v[k - 1])) continue;
        /* Shift worse entries down one slot (dropping the k-th when full); j goes after
         * every entry it does not rank above, so earlier equal elements stay first. */
        int64_t pos = filled < k ? filled++ : k - 1;
        while (pos > 0 && ranks_above(v, top_v[pos - 1])) {
            top[pos] = top[pos - 1];
            top_v[pos] = top_v[pos - 1];
            pos--;
        }
        top[pos] = j;
        top_v[pos] = v;
    }
}

lm_status lm__ref_topk(const lm_tensor_view *x, int64_t k, const lm_tensor_view *values, const lm_tensor_view *indices) {
    if (lm_tensor_view_numel(values) == 0) return LM_OK;
    int last = x->ndim - 1;
    int64_t n = x->shape[last];
    int64_t *top = lm__calloc((size_t)k, sizeof(int64_t));
    double *top_v = lm__calloc((size_t)k, sizeof(double));
    if (!top || !top_v) {
        lm__free(top);
        lm__free(top_v);
        return lm__error_context(LM_OUT_OF_MEMORY, "topk workspace for k = %lld", (long long)k);
    }
    int64_t idx[LM_MAX_DIMS] = {0}; /* over x's leading dims; idx[last] stays 0 */
    do {
        topk_row(x, lm__offset(x, idx), x->stride[last], n, k, top, top_v);
        int64_t v0 = lm__offset(values, idx), i0 = lm__offset(indices, idx);
        for (int64_t r = 0; r < k; r++) {
            lm__st(values->dtype, values->data, v0 + r * values->stride[last], top_v[r]);
            lm__st_index(indices->dtype, indices->data, i0 + r * indices->stride[last], top[r]);
        }
    } while (lm__nd_next(last, x->shape, idx));
    lm__free(top);
    lm__free(top_v);
    return LM_OK;
}
