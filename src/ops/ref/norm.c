/* ops/ref/norm.c — readable reference for RMSNorm over the last dim:
 *   out[r, d] = x[r, d] / sqrt(mean_d(x[r, :]^2) + eps) * weight[d]
 * one row r at a time, sum of squares accumulated in double, each output rounded once.
 * A row is read completely before any of it is written, which is what makes an
 * output identical to its input view (in place) safe. O(numel). */
#include "ops/ref/norm.h"

/* Row geometry shared by the kernels: rows are the index space of the leading ndim-1
 * dims; element d of a row sits at row_base + d * stride[ndim-1]. */
typedef struct row_iter {
    int lead;                  /* number of leading (row) dims */
    int64_t idx[LM_MAX_DIMS];  /* current row index; idx[lead] stays 0 */
    int64_t d;                 /* row length D */
} row_iter;

static void row_iter_init(row_iter *it, const lm_tensor_view *x) {
    memset(it, 0, sizeof *it);
    it->lead = x->ndim - 1;
    it->d = x->shape[x->ndim - 1];
}

static int64_t last_stride(const lm_tensor_view *v) { return v->stride[v->ndim - 1]; }

/* 1 / sqrt(mean(v^2) + eps) for a row of n values read from base with step. */
static double inv_rms(const lm_tensor_view *v, int64_t base, int64_t n, double eps) {
    double ss = 0;
    for (int64_t i = 0; i < n; i++) {
        double a = lm__ld(v->dtype, v->data, base + i * last_stride(v));
        ss += a * a;
    }
    return 1.0 / sqrt(ss / (double)n + eps);
}

/* out row = src row * r * weight. */
static void scale_row(const lm_tensor_view *src, int64_t sbase, const lm_tensor_view *weight, double r,
                      const lm_tensor_view *out, int64_t obase, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double a = lm__ld(src->dtype, src->data, sbase + i * last_stride(src));
        double w = lm__ld(weight->dtype, weight->data, i * weight->stride[0]);
        lm__st(out->dtype, out->data, obase + i * last_stride(out), a * r * w);
    }
}

void lm__ref_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *weight, double eps, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    row_iter it;
    row_iter_init(&it, x);
    do {
        int64_t xb = lm__offset(x, it.idx), ob = lm__offset(out, it.idx);
        double r = inv_rms(x, xb, it.d, eps);
        scale_row(x, xb, weight, r, out, ob, it.d);
    } while (lm__nd_next(it.lead, x->shape, it.idx));
}

void lm__ref_add_rmsnorm(const lm_tensor_view *x, const lm_tensor_view *residual, const lm_tensor_view *weight,
                         double eps, const lm_tensor_view *sum_out, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(out) == 0) return;
    row_iter it;
    row_iter_init(&it, x);
    do {
        int64_t xb = lm__offset(x, it.idx), rb = lm__offset(residual, it.idx);
        int64_t sb = lm__offset(sum_out, it.idx), ob = lm__offset(out, it.idx);
        /* Element i of x and residual is read before sum_out[i] is written, so sum_out
         * may be either input's own view. */
        for (int64_t i = 0; i < it.d; i++) {
            double a = lm__ld(x->dtype, x->data, xb + i * last_stride(x));
            double b = lm__ld(residual->dtype, residual->data, rb + i * last_stride(residual));
            lm__st(sum_out->dtype, sum_out->data, sb + i * last_stride(sum_out), a + b);
        }
        /* Normalize the sum as stored (rounded to the dtype), as a model keeping its
         * residual stream in that dtype does. */
        double r = inv_rms(sum_out, sb, it.d, eps);
        scale_row(sum_out, sb, weight, r, out, ob, it.d);
    } while (lm__nd_next(it.lead, x->shape, it.idx));
}
