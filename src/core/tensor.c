/* core/tensor.c — Tensor: a view's metadata plus one Storage reference.
 *
 * Invariant: view.data == storage base + offset * dtype size, and every element the
 * view can address lies inside the storage (checked whenever a tensor is built).
 * Derived tensors (reshape, transpose, ...) take a new storage reference and never
 * copy elements.
 */
#include "base/internal.h"
#include "loom/tensor.h"

#include <math.h>
#include <string.h>

struct lm_tensor {
    lm_tensor_view view;
    lm_storage *storage; /* one reference owned by this tensor */
    int64_t offset;      /* elements from the storage start to element [0,...,0] */
};

static lm_status check_inside(const lm_storage *s, lm_dtype dt, const lm_tensor_view *v, int64_t offset) {
    int64_t extent = lm_tensor_view_extent(v);
    size_t es = lm_dtype_size(dt);
    if (offset < 0) return lm__error(LM_OUT_OF_RANGE, "negative storage offset %lld", (long long)offset);
    /* an empty view touches nothing, but its data pointer must still lie within (or
     * one past) the storage */
    uint64_t last = (uint64_t)offset + (uint64_t)extent; /* one past, in elements */
    if (last > lm_storage_nbytes(s) / es)
        return lm__error(LM_OUT_OF_RANGE, "view reaches element %llu but storage holds %zu elements of %s",
                         (unsigned long long)last, lm_storage_nbytes(s) / es, lm_dtype_name(dt));
    return LM_OK;
}

lm_status lm_tensor_from_storage(lm_storage *s, lm_dtype dtype, int ndim, const int64_t *shape,
                                 const int64_t *strides, int64_t offset, lm_tensor **out) {
    if (!out || !s) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_from_storage: NULL argument");
    *out = NULL;
    lm_tensor_view v;
    /* a placeholder pointer lets init validate before the offset is proven safe */
    LM_TRY(lm_tensor_view_init(&v, lm_storage_data(s) ? lm_storage_data(s) : (void *)s, dtype, lm_storage_device(s),
                               ndim, shape, strides));
    LM_TRY(check_inside(s, dtype, &v, offset));
    lm_tensor *t = lm__calloc(1, sizeof *t);
    if (!t) return LM_OUT_OF_MEMORY;
    v.data = lm_storage_data(s) ? (char *)lm_storage_data(s) + offset * (int64_t)lm_dtype_size(dtype) : NULL;
    t->view = v;
    t->storage = lm_storage_retain(s);
    t->offset = offset;
    *out = t;
    return LM_OK;
}

lm_status lm_tensor_create(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape, lm_tensor **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_create: out is NULL");
    *out = NULL;
    if (!lm_dtype_valid(dtype)) return lm__error(LM_INVALID_ARGUMENT, "invalid dtype %d", (int)dtype);
    lm_tensor_view probe;
    static char dummy;
    LM_TRY(lm_tensor_view_init(&probe, &dummy, dtype, device, ndim, shape, NULL));
    int64_t n = lm_tensor_view_numel(&probe);
    size_t es = lm_dtype_size(dtype);
    if ((uint64_t)n > SIZE_MAX / es) return lm__error(LM_OUT_OF_MEMORY, "tensor of %lld elements is too large", (long long)n);
    lm_storage *s = NULL;
    LM_TRY(lm_storage_create(device, (size_t)n * es, &s));
    lm_status st = lm_tensor_from_storage(s, dtype, ndim, shape, NULL, 0, out);
    lm_storage_release(s);
    return st;
}

lm_status lm_tensor_zeros(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape, lm_tensor **out) {
    LM_TRY(lm_tensor_create(device, dtype, ndim, shape, out));
    uint8_t zero = 0;
    lm_status st = lm_device_fill(device, lm_tensor_data(*out), lm_storage_nbytes((*out)->storage), &zero, 1);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

lm_status lm_tensor_from_host(lm_device device, lm_dtype dtype, int ndim, const int64_t *shape,
                              const void *host_data, lm_tensor **out) {
    LM_TRY(lm_tensor_create(device, dtype, ndim, shape, out));
    size_t nbytes = lm_storage_nbytes((*out)->storage);
    if (nbytes && !host_data) {
        lm_tensor_destroy(*out);
        *out = NULL;
        return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_from_host: NULL host data");
    }
    lm_status st = lm_device_copy(device, lm_tensor_data(*out), lm_device_cpu(), host_data, nbytes);
    if (st != LM_OK) {
        lm_tensor_destroy(*out);
        *out = NULL;
    }
    return st;
}

void lm_tensor_destroy(lm_tensor *t) {
    if (!t) return;
    lm_storage_release(t->storage);
    lm__free(t);
}

const lm_tensor_view *lm_tensor_as_view(const lm_tensor *t) { return &t->view; }
lm_storage *lm_tensor_storage(const lm_tensor *t) { return t->storage; }
int64_t lm_tensor_offset(const lm_tensor *t) { return t->offset; }
void *lm_tensor_data(const lm_tensor *t) { return t->view.data; }
int lm_tensor_ndim(const lm_tensor *t) { return t->view.ndim; }
int64_t lm_tensor_numel(const lm_tensor *t) { return lm_tensor_view_numel(&t->view); }
lm_dtype lm_tensor_dtype(const lm_tensor *t) { return t->view.dtype; }
lm_device lm_tensor_device(const lm_tensor *t) { return t->view.device; }

int64_t lm_tensor_dim(const lm_tensor *t, int i) {
    if (i < 0) i += t->view.ndim;
    return (i >= 0 && i < t->view.ndim) ? t->view.shape[i] : -1;
}

lm_status lm_tensor_from_view(const lm_tensor *t, const lm_tensor_view *v, lm_tensor **out) {
    if (!t || !v || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_from_view: NULL argument");
    *out = NULL;
    if (v->dtype != t->view.dtype || !lm_device_equal(v->device, t->view.device))
        return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_from_view: view dtype/device differ from the tensor's");
    const char *base = lm_storage_data(t->storage);
    size_t es = lm_dtype_size(v->dtype);
    int64_t offset = t->offset;
    if (v->data && base) {
        ptrdiff_t delta = (const char *)v->data - base;
        if (delta < 0 || delta % (ptrdiff_t)es)
            return lm__error(LM_OUT_OF_RANGE, "view does not start inside the tensor's storage");
        offset = (int64_t)(delta / (ptrdiff_t)es);
    }
    return lm_tensor_from_storage(t->storage, v->dtype, v->ndim, v->shape, v->stride, offset, out);
}

lm_status lm_tensor_reshape(const lm_tensor *t, int ndim, const int64_t *shape, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_reshape(&t->view, ndim, shape, &v));
    return lm_tensor_from_view(t, &v, out);
}

lm_status lm_tensor_transpose(const lm_tensor *t, int d0, int d1, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_transpose(&t->view, d0, d1, &v));
    return lm_tensor_from_view(t, &v, out);
}

lm_status lm_tensor_permute(const lm_tensor *t, const int *perm, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_permute(&t->view, perm, &v));
    return lm_tensor_from_view(t, &v, out);
}

lm_status lm_tensor_slice(const lm_tensor *t, int dim, int64_t start, int64_t stop, int64_t step, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_slice(&t->view, dim, start, stop, step, &v));
    return lm_tensor_from_view(t, &v, out);
}

lm_status lm_tensor_split_axis(const lm_tensor *t, int dim, int nfactors, const int64_t *factors, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_split_axis(&t->view, dim, nfactors, factors, &v));
    return lm_tensor_from_view(t, &v, out);
}

lm_status lm_tensor_merge_axes(const lm_tensor *t, int dim, int count, lm_tensor **out) {
    lm_tensor_view v;
    LM_TRY(lm_tensor_view_merge_axes(&t->view, dim, count, &v));
    return lm_tensor_from_view(t, &v, out);
}
