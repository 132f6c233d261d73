/* core/tensor_wrap.c — lm_tensor_wrap: a tensor over memory the caller owns (a NumPy
 * array, a PyTorch tensor received through DLPack, a buffer of another C library).
 *
 * Invariants: every argument is validated before anything is allocated; on success
 * release(user, data) runs exactly once, when the last tensor sharing the wrapped
 * storage goes (derived views hold references too); on failure it is never called, so
 * the caller still owns the memory. The release is routed through a small record whose
 * `armed` flag lets a late failure (out of memory building the tensor) drop the storage
 * without invoking the caller's function.
 */
#include "base/internal.h"
#include "loom/tensor.h"
#include "runtime/internal.h"

#include <stdint.h>

typedef struct wrap_release {
    lm_release_fn fn; /* the caller's function; may be NULL */
    void *user;
    int armed; /* 0 while lm_tensor_wrap can still fail */
} wrap_release;

static void wrap_release_run(void *user, void *data) {
    wrap_release *r = user;
    if (r->armed && r->fn) r->fn(r->user, data);
    lm__free(r);
}

lm_status lm_tensor_wrap(lm_device device, void *data, lm_dtype dtype, int ndim, const int64_t *shape,
                         const int64_t *strides, lm_release_fn release, void *user, lm_tensor **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_wrap: out is NULL");
    *out = NULL;
    if (!lm_dtype_valid(dtype)) return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_wrap: invalid dtype %d", (int)dtype);
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(device, &be)); /* unknown type, a build without it, a missing ordinal */
    lm_tensor_view v; /* checks ndim, dims >= 0, strides >= 0, NULL data with elements, int64 overflow */
    LM_TRY(lm_tensor_view_init(&v, data, dtype, device, ndim, shape, strides));
    size_t es = lm_dtype_size(dtype);
    if ((uintptr_t)data % es)
        return lm__error(LM_INVALID_ARGUMENT, "lm_tensor_wrap: data %p is not aligned to its %s element size (%zu bytes)",
                         data, lm_dtype_name(dtype), es);
    int64_t extent = lm_tensor_view_extent(&v); /* elements from [0,...,0] to the last, plus one */
    if ((uint64_t)extent > SIZE_MAX / es)
        return lm__error(LM_OUT_OF_RANGE, "lm_tensor_wrap: a view of %lld %s elements exceeds the address space",
                         (long long)extent, lm_dtype_name(dtype));

    wrap_release *r = lm__calloc(1, sizeof *r);
    if (!r) return LM_OUT_OF_MEMORY;
    r->fn = release;
    r->user = user;
    lm_storage *s = NULL;
    lm_status st = lm_storage_wrap(device, data, (size_t)extent * es, wrap_release_run, r, &s);
    if (st != LM_OK) {
        lm__free(r);
        return st;
    }
    st = lm_tensor_from_storage(s, dtype, ndim, shape, strides, 0, out);
    if (st == LM_OK) r->armed = 1;
    lm_storage_release(s); /* the tensor holds its own reference; on failure this frees r */
    return st;
}
