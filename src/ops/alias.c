/* ops/alias.c — output/input aliasing checks shared by the operators (see alias.h for
 * what is detected and why the rest is left to the caller). O(ndim) per pair. */
#include "ops/alias.h"

int lm__view_identical(const lm_tensor_view *a, const lm_tensor_view *b) {
    if (a->data != b->data || a->dtype != b->dtype || a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || (a->shape[i] > 1 && a->stride[i] != b->stride[i])) return 0;
    return 1;
}

/* Byte range [lo, hi) spanned by a non-empty view. */
static void byte_range(const lm_tensor_view *v, uintptr_t *lo, uintptr_t *hi) {
    size_t es = lm_dtype_size(v->dtype);
    *lo = (uintptr_t)v->data;
    *hi = *lo + (uintptr_t)lm_tensor_view_extent(v) * es;
}

lm_status lm__op_check_alias(const char *op, const char *out_name, const lm_tensor_view *out, const char *in_name,
                             const lm_tensor_view *in, int allow_identical) {
    if (lm_tensor_view_numel(out) == 0 || lm_tensor_view_numel(in) == 0) return LM_OK;
    if (lm__view_identical(out, in)) {
        if (allow_identical) return LM_OK;
        return lm__error(LM_INVALID_ARGUMENT, "%s: output %s is the same memory as input %s; this operand cannot be "
                                              "updated in place", op, out_name, in_name);
    }
    int clash = out->data == in->data;
    if (!clash && lm_tensor_view_is_contiguous(out) && lm_tensor_view_is_contiguous(in)) {
        uintptr_t olo, ohi, ilo, ihi;
        byte_range(out, &olo, &ohi);
        byte_range(in, &ilo, &ihi);
        clash = olo < ihi && ilo < ohi;
    }
    if (clash)
        return lm__error(LM_INVALID_ARGUMENT, "%s: output %s partially overlaps input %s", op, out_name, in_name);
    return LM_OK;
}
