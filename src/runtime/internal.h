/* runtime/internal.h — device back ends behind lm_device_* (never installed). */
#ifndef LOOM_RUNTIME_INTERNAL_H
#define LOOM_RUNTIME_INTERNAL_H

#include "base/internal.h"
#include "loom/runtime.h"

#ifdef LOOM_HAVE_CUDA
/* runtime/device_cuda.c */
lm_status lm__cuda_alloc(int index, size_t nbytes, void **out);
void lm__cuda_free(int index, void *ptr);
/* kind: 0 h2d, 1 d2h, 2 d2d; synchronous */
lm_status lm__cuda_copy(int kind, int index, void *dst, const void *src, size_t nbytes);
lm_status lm__cuda_fill(int index, void *dst, size_t nbytes, const void *pattern, size_t psize);
int lm__cuda_count(void);
lm_status lm__cuda_stream_create(int index, void **stream);
void lm__cuda_stream_destroy(void *stream);
lm_status lm__cuda_stream_sync(void *stream);
#endif

#endif
