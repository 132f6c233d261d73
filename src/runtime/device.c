/* runtime/device.c — the device-neutral memory API (allocation, copies, fills, pinned
 * host memory, capabilities, allocator statistics) over the backend table.
 *
 * Every entry point looks the device's backend up by type and checks the ordinal
 * (lm__device_backend_of) before calling it, so a request for a device type the build
 * lacks fails with LM_UNSUPPORTED and says so, with no #ifdef here: the registry below
 * holds whatever lm__device_backend_cuda() answers (NULL without CUDA).
 */
#include "runtime/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Indexed by lm_device_type: the registration and how messages name the type. */
static const lm__device_backend *(*const k_registry[])(void) = {
    [LM_DEVICE_CPU] = lm__device_backend_cpu,
    [LM_DEVICE_CUDA] = lm__device_backend_cuda,
};
static const char *const k_labels[] = {[LM_DEVICE_CPU] = "CPU", [LM_DEVICE_CUDA] = "CUDA"};
static const char *const k_names[] = {[LM_DEVICE_CPU] = "cpu", [LM_DEVICE_CUDA] = "cuda"};
#define LM__NTYPES ((int)(sizeof k_registry / sizeof k_registry[0]))

static int known_type(lm_device_type t) { return (int)t >= 0 && (int)t < LM__NTYPES; }

const lm__device_backend *lm__device_backend_get(lm_device_type type) {
    return known_type(type) ? k_registry[type]() : NULL;
}

lm_status lm__device_backend_of(lm_device d, const lm__device_backend **out) {
    *out = NULL;
    if (!known_type(d.type)) return lm__error(LM_INVALID_ARGUMENT, "unknown device type %d", (int)d.type);
    const lm__device_backend *be = k_registry[d.type]();
    if (!be)
        return lm__error(LM_UNSUPPORTED, "%s:%d requested but loom was built without %s", k_names[d.type], d.index,
                         k_labels[d.type]);
    int n = be->count();
    if (d.index < 0 || d.index >= n)
        return lm__error(LM_DEVICE_ERROR, "%s:%d requested but %d %s device(s) are available", be->name, d.index, n,
                         be->label);
    *out = be;
    return LM_OK;
}

int lm__device_host_addressable(lm_device d) {
    const lm__device_backend *be = lm__device_backend_get(d.type);
    return be && be->host_addressable;
}

lm_status lm_device_parse(const char *text, lm_device *out) {
    if (!text || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_device_parse: NULL argument");
    if (strcmp(text, "cpu") == 0) {
        *out = lm_device_cpu();
        return LM_OK;
    }
    if (strcmp(text, "cuda") == 0) {
        *out = lm_device_cuda(0);
        return LM_OK;
    }
    if (strncmp(text, "cuda:", 5) == 0 && text[5] >= '0' && text[5] <= '9') {
        char *end;
        long idx = strtol(text + 5, &end, 10);
        if (*end == '\0' && idx < 1024) {
            *out = lm_device_cuda((int)idx);
            return LM_OK;
        }
    }
    return lm__error(LM_INVALID_ARGUMENT, "unknown device '%s' (expected cpu, cuda or cuda:N)", text);
}

const char *lm_device_format(lm_device d, char *buf, size_t bufsize) {
    if (d.type == LM_DEVICE_CPU) snprintf(buf, bufsize, "cpu");
    else if (known_type(d.type)) snprintf(buf, bufsize, "%s:%d", k_names[d.type], d.index);
    else snprintf(buf, bufsize, "device%d:%d", (int)d.type, d.index);
    return buf;
}

int lm_cuda_compiled(void) { return lm__device_backend_cuda() != NULL; }

int lm_cuda_device_count(void) {
    const lm__device_backend *be = lm__device_backend_cuda();
    return be ? be->count() : 0;
}

lm_status lm_device_caps_get(lm_device d, lm_device_caps *out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_device_caps_get: out is NULL");
    memset(out, 0, sizeof *out);
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    out->host_addressable = be->host_addressable;
    out->async = be->async;
    out->graph_capture = be->graph_capture;
    return be->caps(d.index, out);
}

/* Device memory, or with host = 1 the host memory d transfers with. */
static lm_status alloc_for(lm_device d, int host, size_t nbytes, void **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "%s: out is NULL", host ? "lm_host_alloc" : "lm_device_alloc");
    *out = NULL;
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return (host ? be->host_alloc : be->alloc)(d.index, nbytes, out);
}

static void free_for(lm_device d, int host, void *ptr) {
    const lm__device_backend *be = lm__device_backend_get(d.type);
    if (ptr && be) (host ? be->host_free : be->free)(d.index, ptr);
}

lm_status lm_device_alloc(lm_device d, size_t nbytes, void **out) { return alloc_for(d, 0, nbytes, out); }
void lm_device_free(lm_device d, void *ptr) { free_for(d, 0, ptr); }
lm_status lm_host_alloc(lm_device d, size_t nbytes, void **out) { return alloc_for(d, 1, nbytes, out); }
void lm_host_free(lm_device d, void *ptr) { free_for(d, 1, ptr); }

lm_status lm_device_copy(lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes) {
    if (nbytes == 0) return LM_OK;
    if (!dst || !src) return lm__error(LM_INVALID_ARGUMENT, "lm_device_copy: NULL pointer for %zu bytes", nbytes);
    const lm__device_backend *bd, *bs;
    LM_TRY(lm__device_backend_of(dst_dev, &bd));
    LM_TRY(lm__device_backend_of(src_dev, &bs));
    /* The device side does the copy; device to device goes to the destination's. */
    if (bs->host_addressable && bd->host_addressable)
        return bd->copy(LM__COPY_HOST_TO_HOST, dst_dev.index, dst, src, nbytes);
    if (bs->host_addressable) return bd->copy(LM__COPY_HOST_TO_DEVICE, dst_dev.index, dst, src, nbytes);
    if (bd->host_addressable) return bs->copy(LM__COPY_DEVICE_TO_HOST, src_dev.index, dst, src, nbytes);
    return bd->copy(LM__COPY_DEVICE_TO_DEVICE, dst_dev.index, dst, src, nbytes);
}

lm_status lm_device_synchronize(lm_device d) {
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return be->synchronize ? be->synchronize(d.index) : LM_OK;
}

lm_status lm_device_fill(lm_device d, void *dst, size_t nbytes, const void *pattern, size_t psize) {
    if (psize != 1 && psize != 2 && psize != 4)
        return lm__error(LM_INVALID_ARGUMENT, "fill pattern must be 1, 2 or 4 bytes, got %zu", psize);
    if (nbytes % psize) return lm__error(LM_INVALID_ARGUMENT, "fill of %zu bytes is not a multiple of %zu", nbytes, psize);
    if (nbytes == 0) return LM_OK;
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return be->fill(d.index, dst, nbytes, pattern, psize);
}

/* ---- memory statistics (the caching allocator's; other backends answer LM_UNSUPPORTED) ---- */
lm_status lm_device_memory_stats_get(lm_device d, lm_device_memory_stats *out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_device_memory_stats_get: out is NULL");
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return be->memory_stats(d.index, out);
}

lm_status lm_device_memory_reset_peak(lm_device d) {
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return be->memory_reset_peak(d.index);
}

lm_status lm_device_empty_cache(lm_device d) {
    const lm__device_backend *be;
    LM_TRY(lm__device_backend_of(d, &be));
    return be->empty_cache(d.index);
}
