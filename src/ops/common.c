/* ops/common.c — argument validation and dispatch shared by all operators. */
#include "ops/internal.h"
#include "runtime/internal.h"

#include <stdio.h>

const char *lm__shape_str(const lm_tensor_view *v, char *buf, size_t size) {
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < v->ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)v->shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

lm_status lm__op_check_devices(lm_ctx *ctx, const char *op, int n, const lm_tensor_view *const *views,
                               const char *const *names) {
    lm_device dev = lm_ctx_device(ctx);
    for (int i = 0; i < n; i++) {
        if (!views[i]) return lm__error(LM_INVALID_ARGUMENT, "%s: %s is NULL", op, names[i]);
        if (!lm_dtype_valid(views[i]->dtype))
            return lm__error(LM_INVALID_ARGUMENT, "%s: %s has invalid dtype %d", op, names[i], (int)views[i]->dtype);
        if (!lm_device_equal(views[i]->device, dev)) {
            char a[32], b[32];
            return lm__error(LM_INVALID_ARGUMENT, "%s: %s is on %s but the context runs on %s", op, names[i],
                             lm_device_format(views[i]->device, a, sizeof a), lm_device_format(dev, b, sizeof b));
        }
    }
    return LM_OK;
}

lm_status lm__op_check_float(const char *op, const char *name, const lm_tensor_view *v) {
    if (!lm_dtype_is_float(v->dtype))
        return lm__error(LM_UNSUPPORTED, "%s: %s has dtype %s; expected f32, bf16 or f16", op, name, lm_dtype_name(v->dtype));
    return LM_OK;
}

lm_status lm__op_check_index(const char *op, const char *name, const lm_tensor_view *v) {
    if (v->dtype != LM_I32 && v->dtype != LM_I64)
        return lm__error(LM_UNSUPPORTED, "%s: %s has dtype %s; expected i32 or i64", op, name, lm_dtype_name(v->dtype));
    return LM_OK;
}

lm_status lm__op_check_dtype(const char *op, const char *name, const lm_tensor_view *v, lm_dtype want) {
    if (v->dtype != want)
        return lm__error(LM_DTYPE_MISMATCH, "%s: %s has dtype %s, expected %s", op, name, lm_dtype_name(v->dtype),
                         lm_dtype_name(want));
    return LM_OK;
}

lm_status lm__op_check_shape(const char *op, const char *name, const lm_tensor_view *v, int ndim,
                             const int64_t *shape) {
    int ok = v->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = shape[i] < 0 || v->shape[i] == shape[i];
    if (ok) return LM_OK;
    char have[128], want[128];
    size_t n = 0;
    n += (size_t)snprintf(want + n, sizeof want - n, "[");
    for (int i = 0; i < ndim && n < sizeof want; i++) {
        if (shape[i] < 0) n += (size_t)snprintf(want + n, sizeof want - n, i ? ", *" : "*");
        else n += (size_t)snprintf(want + n, sizeof want - n, i ? ", %lld" : "%lld", (long long)shape[i]);
    }
    if (n < sizeof want) snprintf(want + n, sizeof want - n, "]");
    return lm__error(LM_SHAPE_MISMATCH, "%s: %s has shape %s, expected %s", op, name,
                     lm__shape_str(v, have, sizeof have), want);
}

lm_status lm__op_check_same_shape(const char *op, const char *name, const lm_tensor_view *v,
                                  const lm_tensor_view *like) {
    return lm__op_check_shape(op, name, v, like->ndim, like->shape);
}

lm_status lm__op_check_out(const char *op, const char *name, const lm_tensor_view *out) {
    if (lm_tensor_view_overlaps_self(out))
        return lm__error(LM_INVALID_ARGUMENT, "%s: output %s overlaps itself (broadcast or overlapping strides)", op, name);
    return LM_OK;
}

lm_status lm__op_broadcast_shape(const char *op, const lm_tensor_view *a, const lm_tensor_view *b, int *ndim,
                                 int64_t *shape) {
    int n = LM_MAX(a->ndim, b->ndim);
    for (int i = 0; i < n; i++) {
        int ia = i - (n - a->ndim), ib = i - (n - b->ndim);
        int64_t da = ia >= 0 ? a->shape[ia] : 1, db = ib >= 0 ? b->shape[ib] : 1;
        if (da != db && da != 1 && db != 1) {
            char sa[128], sb[128];
            return lm__error(LM_SHAPE_MISMATCH, "%s: shapes %s and %s do not broadcast", op,
                             lm__shape_str(a, sa, sizeof sa), lm__shape_str(b, sb, sizeof sb));
        }
        shape[i] = da == 1 ? db : da;
    }
    *ndim = n;
    return LM_OK;
}

lm_status lm__op_level(lm_ctx *ctx, const char *op, int has_cpu, int has_cuda, lm__level *out) {
    lm_device dev = lm_ctx_device(ctx);
    lm_impl impl = lm_ctx_impl(ctx);
    /* The ref and cpu levels load and store through host pointers, so memory the host
     * cannot address has only its device's level. */
    if (!lm__device_host_addressable(dev)) {
        if (impl == LM_IMPL_REF) return lm__error(LM_UNSUPPORTED, "%s: the reference level runs on the CPU only", op);
        if (!has_cuda) return lm__error(LM_UNSUPPORTED, "%s: no CUDA implementation", op);
        *out = LM__LEVEL_CUDA;
        return LM_OK;
    }
    if (impl == LM_IMPL_TUNED && !has_cpu) return lm__error(LM_UNSUPPORTED, "%s: no tuned CPU implementation", op);
    *out = (impl != LM_IMPL_REF && has_cpu) ? LM__LEVEL_CPU : LM__LEVEL_REF;
    return LM_OK;
}

lm_status lm__op_alloc(lm_ctx *ctx, lm_dtype dt, int ndim, const int64_t *shape, lm_tensor **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "allocating operator: out is NULL");
    return lm_tensor_create(lm_ctx_device(ctx), dt, ndim, shape, out);
}

lm_status lm__op_finish(lm_status st, lm_tensor **t) {
    if (st != LM_OK && t && *t) {
        lm_tensor_destroy(*t);
        *t = NULL;
    }
    return st;
}

double lm__row_logsumexp(lm_dtype dt, const void *base, int64_t x0, int64_t step, int64_t n) {
    double mx = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        double v = lm__ld(dt, base, x0 + j * step);
        if (v > mx) mx = v;
    }
    if (isinf(mx)) return mx;
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) sum += exp(lm__ld(dt, base, x0 + j * step) - mx);
    return mx + log(sum);
}
