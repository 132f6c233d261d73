/* core/copy.c — element copies between views: strided in host memory and within one
 * device, contiguous across devices; contiguous() and to_device() are built on them.
 *
 * Views the host addresses (lm_device_caps.host_addressable) are copied by the host
 * (lm__host_copy_strided). Within one other device, when ctx runs on that device, the
 * copy is queued on ctx's stream (ordered with ctx's operators, no waiting):
 * contiguous views through lm_ctx_copy, strided ones through the backend's strided
 * copy. Without such a context a contiguous copy is the synchronous lm_device_copy
 * and a strided one is refused. Cost: O(numel) element moves.
 */
#include "base/internal.h"
#include "loom/tensor.h"
#include "runtime/internal.h"

#include <math.h>
#include <string.h>

_Static_assert(LM_MAX_DIMS <= LM__COPY_MAX_DIMS, "the runtime's strided copies walk at most LM__COPY_MAX_DIMS dims");

static int same_shape(const lm_tensor_view *a, const lm_tensor_view *b) {
    if (a->ndim != b->ndim) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i]) return 0;
    return 1;
}

lm_status lm_tensor_view_copy(lm_ctx *ctx, const lm_tensor_view *dst, const lm_tensor_view *src) {
    if (!dst || !src) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_view_copy: NULL view");
    if (dst->dtype != src->dtype)
        return lm__error(LM_DTYPE_MISMATCH, "copy: destination is %s, source is %s (use lm_cast_out to convert)",
                         lm_dtype_name(dst->dtype), lm_dtype_name(src->dtype));
    if (!same_shape(dst, src)) return lm__error(LM_SHAPE_MISMATCH, "copy: destination and source shapes differ");
    if (lm_tensor_view_overlaps_self(dst)) return lm__error(LM_INVALID_ARGUMENT, "copy: destination view overlaps itself");
    int64_t n = lm_tensor_view_numel(dst);
    if (n == 0) return LM_OK;
    size_t es = lm_dtype_size(dst->dtype);
    if (lm__device_host_addressable(dst->device) && lm__device_host_addressable(src->device)) {
        lm__host_copy_strided(dst->ndim, dst->shape, dst->data, dst->stride, src->data, src->stride, es);
        return LM_OK;
    }
    int contiguous = lm_tensor_view_is_contiguous(dst) && lm_tensor_view_is_contiguous(src);
    if (ctx && lm_device_equal(dst->device, src->device) && lm_device_equal(lm_ctx_device(ctx), dst->device)) {
        if (contiguous) return lm_ctx_copy(ctx, dst->device, dst->data, src->device, src->data, (size_t)n * es);
        return lm__ctx_copy_strided(ctx, dst->ndim, dst->shape, dst->data, dst->stride, src->data, src->stride, es);
    }
    if (!contiguous) {
        char d[32], s[32];
        lm_device_format(dst->device, d, sizeof d);
        lm_device_format(src->device, s, sizeof s);
        if (lm_device_equal(dst->device, src->device))
            return lm__error(LM_UNSUPPORTED, "copy: strided views on %s need a context of that device (or make them "
                                             "contiguous)", d);
        return lm__error(LM_UNSUPPORTED, "copy: strided views from %s to %s (make them contiguous first)", s, d);
    }
    return lm_device_copy(dst->device, dst->data, src->device, src->data, (size_t)n * es);
}

lm_status lm_tensor_view_read(lm_ctx *ctx, const lm_tensor_view *src, void *host_dst) {
    lm_tensor_view d;
    LM_TRY(lm_tensor_view_init(&d, host_dst, src->dtype, lm_device_cpu(), src->ndim, src->shape, NULL));
    if (!lm__device_host_addressable(src->device) && !lm_tensor_view_is_contiguous(src))
        return lm__error(LM_UNSUPPORTED, "read: a strided device view must be made contiguous first");
    return lm_tensor_view_copy(ctx, &d, src);
}

lm_status lm_tensor_view_write(lm_ctx *ctx, const lm_tensor_view *dst, const void *host_src) {
    lm_tensor_view s;
    LM_TRY(lm_tensor_view_init(&s, (void *)host_src, dst->dtype, lm_device_cpu(), dst->ndim, dst->shape, NULL));
    return lm_tensor_view_copy(ctx, dst, &s);
}

lm_status lm_tensor_view_poison(lm_ctx *ctx, const lm_tensor_view *v) {
    (void)ctx;
    if (lm_tensor_view_numel(v) == 0) return LM_OK;
    if (!lm_tensor_view_is_contiguous(v) && !lm__device_host_addressable(v->device))
        return lm__error(LM_UNSUPPORTED, "poison: strided device view");
    uint32_t f32_nan = 0x7fc00000u;
    uint16_t half_nan = v->dtype == LM_BF16 ? 0x7fc0u : 0x7e00u;
    uint8_t byte = 0xA5;
    const void *pat = &byte;
    size_t psize = 1;
    if (v->dtype == LM_F32) pat = &f32_nan, psize = 4;
    else if (v->dtype == LM_BF16 || v->dtype == LM_F16) pat = &half_nan, psize = 2;
    if (lm_tensor_view_is_contiguous(v))
        return lm_device_fill(v->device, v->data, (size_t)lm_tensor_view_numel(v) * lm_dtype_size(v->dtype), pat, psize);
    /* strided host view: fill a contiguous scratch and copy it in */
    lm_tensor *tmp = NULL;
    LM_TRY(lm_tensor_create(lm_device_cpu(), v->dtype, v->ndim, v->shape, &tmp));
    lm_status st = lm_tensor_view_poison(ctx, lm_tensor_as_view(tmp));
    if (st == LM_OK) st = lm_tensor_view_copy(ctx, v, lm_tensor_as_view(tmp));
    lm_tensor_destroy(tmp);
    return st;
}

lm_status lm_tensor_contiguous(lm_ctx *ctx, const lm_tensor *t, lm_tensor **out) {
    if (!t || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_contiguous: NULL argument");
    *out = NULL;
    const lm_tensor_view *v = lm_tensor_as_view(t);
    if (lm_tensor_view_is_contiguous(v)) return lm_tensor_from_view(t, v, out);
    LM_TRY(lm_tensor_create(v->device, v->dtype, v->ndim, v->shape, out));
    lm_status st = lm_tensor_view_copy(ctx, lm_tensor_as_view(*out), v);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

lm_status lm_tensor_to_device(lm_ctx *ctx, const lm_tensor *t, lm_device device, lm_tensor **out) {
    if (!t || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_to_device: NULL argument");
    *out = NULL;
    lm_tensor *src = NULL;
    LM_TRY(lm_tensor_contiguous(ctx, t, &src)); /* strided sources are packed on their own device */
    const lm_tensor_view *v = lm_tensor_as_view(src);
    lm_status st = lm_tensor_create(device, v->dtype, v->ndim, v->shape, out);
    if (st == LM_OK) st = lm_tensor_view_copy(ctx, lm_tensor_as_view(*out), v);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    lm_tensor_destroy(src);
    return st;
}
