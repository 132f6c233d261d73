/* core/storage.c — reference-counted host or device allocations.
 *
 * The count is atomic so tensors sharing a storage may be released from different
 * threads. A storage either owns its memory (freed on the device it came from) or
 * wraps external memory with a caller-supplied release function.
 */
#include "base/internal.h"
#include "loom/tensor.h"

#include <stdatomic.h>

struct lm_storage {
    atomic_int refcount;
    lm_device device;
    void *data; /* [nbytes] on device */
    size_t nbytes;
    int owned;              /* 1: free with lm_device_free */
    lm_release_fn release;  /* external memory only */
    void *release_user;
};

lm_status lm_storage_create(lm_device device, size_t nbytes, lm_storage **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_storage_create: out is NULL");
    *out = NULL;
    lm_storage *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    lm_status st = lm_device_alloc(device, nbytes, &s->data);
    if (st != LM_OK) {
        lm__free(s);
        return st;
    }
    atomic_init(&s->refcount, 1);
    s->device = device;
    s->nbytes = nbytes;
    s->owned = 1;
    *out = s;
    return LM_OK;
}

lm_status lm_storage_wrap(lm_device device, void *data, size_t nbytes, lm_release_fn release, void *user,
                          lm_storage **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_storage_wrap: out is NULL");
    *out = NULL;
    if (!data && nbytes) return lm__error(LM_INVALID_ARGUMENT, "lm_storage_wrap: NULL data with %zu bytes", nbytes);
    lm_storage *s = lm__calloc(1, sizeof *s);
    if (!s) return LM_OUT_OF_MEMORY;
    atomic_init(&s->refcount, 1);
    s->device = device;
    s->data = data;
    s->nbytes = nbytes;
    s->release = release;
    s->release_user = user;
    *out = s;
    return LM_OK;
}

lm_storage *lm_storage_retain(lm_storage *s) {
    if (s) atomic_fetch_add(&s->refcount, 1);
    return s;
}

void lm_storage_release(lm_storage *s) {
    if (!s || atomic_fetch_sub(&s->refcount, 1) != 1) return;
    if (s->owned) lm_device_free(s->device, s->data);
    else if (s->release) s->release(s->release_user, s->data);
    lm__free(s);
}

void *lm_storage_data(const lm_storage *s) { return s->data; }
size_t lm_storage_nbytes(const lm_storage *s) { return s->nbytes; }
lm_device lm_storage_device(const lm_storage *s) { return s->device; }
int lm_storage_refcount(const lm_storage *s) { return atomic_load(&((lm_storage *)s)->refcount); }
