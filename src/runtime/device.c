/* runtime/device.c — the device-neutral memory API: allocation, copies and fills
 * routed to the host allocator or the CUDA back end. Without CUDA in the build, any
 * CUDA device request fails with LM_UNSUPPORTED and a message saying so.
 */
#include "runtime/internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
    else snprintf(buf, bufsize, "cuda:%d", d.index);
    return buf;
}

int lm_cuda_compiled(void) {
#ifdef LOOM_HAVE_CUDA
    return 1;
#else
    return 0;
#endif
}

int lm_cuda_device_count(void) {
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_count();
#else
    return 0;
#endif
}

static lm_status check_device(lm_device d) {
    if (d.type == LM_DEVICE_CPU) return LM_OK;
    if (d.type != LM_DEVICE_CUDA) return lm__error(LM_INVALID_ARGUMENT, "unknown device type %d", (int)d.type);
#ifdef LOOM_HAVE_CUDA
    int n = lm__cuda_count();
    if (d.index < 0 || d.index >= n)
        return lm__error(LM_DEVICE_ERROR, "cuda:%d requested but %d CUDA device(s) are available", d.index, n);
    return LM_OK;
#else
    return lm__error(LM_UNSUPPORTED, "cuda:%d requested but loom was built without CUDA", d.index);
#endif
}

lm_status lm_device_alloc(lm_device d, size_t nbytes, void **out) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_device_alloc: out is NULL");
    *out = NULL;
    LM_TRY(check_device(d));
    if (d.type == LM_DEVICE_CPU) {
        *out = lm__alloc(nbytes, 64);
        return *out ? LM_OK : LM_OUT_OF_MEMORY;
    }
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_alloc(d.index, nbytes, out);
#else
    return LM_UNSUPPORTED;
#endif
}

void lm_device_free(lm_device d, void *ptr) {
    if (!ptr) return;
    if (d.type == LM_DEVICE_CPU) {
        lm__free(ptr);
        return;
    }
#ifdef LOOM_HAVE_CUDA
    lm__cuda_free(d.index, ptr);
#endif
}

lm_status lm_device_copy(lm_device dst_dev, void *dst, lm_device src_dev, const void *src, size_t nbytes) {
    if (nbytes == 0) return LM_OK;
    if (!dst || !src) return lm__error(LM_INVALID_ARGUMENT, "lm_device_copy: NULL pointer for %zu bytes", nbytes);
    LM_TRY(check_device(dst_dev));
    LM_TRY(check_device(src_dev));
    if (dst_dev.type == LM_DEVICE_CPU && src_dev.type == LM_DEVICE_CPU) {
        memmove(dst, src, nbytes);
        return LM_OK;
    }
#ifdef LOOM_HAVE_CUDA
    int kind = src_dev.type == LM_DEVICE_CPU ? 0 : dst_dev.type == LM_DEVICE_CPU ? 1 : 2;
    int index = kind == 1 ? src_dev.index : dst_dev.index;
    return lm__cuda_copy(kind, index, dst, src, nbytes);
#else
    return LM_UNSUPPORTED;
#endif
}

lm_status lm_device_fill(lm_device d, void *dst, size_t nbytes, const void *pattern, size_t psize) {
    if (psize != 1 && psize != 2 && psize != 4)
        return lm__error(LM_INVALID_ARGUMENT, "fill pattern must be 1, 2 or 4 bytes, got %zu", psize);
    if (nbytes % psize) return lm__error(LM_INVALID_ARGUMENT, "fill of %zu bytes is not a multiple of %zu", nbytes, psize);
    if (nbytes == 0) return LM_OK;
    LM_TRY(check_device(d));
    if (d.type == LM_DEVICE_CPU) {
        char *p = dst;
        if (psize == 1) memset(p, *(const uint8_t *)pattern, nbytes);
        else
            for (size_t i = 0; i < nbytes; i += psize) memcpy(p + i, pattern, psize);
        return LM_OK;
    }
#ifdef LOOM_HAVE_CUDA
    return lm__cuda_fill(d.index, dst, nbytes, pattern, psize);
#else
    return LM_UNSUPPORTED;
#endif
}
