/* base/internal.h — helpers shared inside the library (never installed).
 *
 * lm__error() records the thread-local detail and returns the status so call sites
 * read `return lm__error(LM_SHAPE_MISMATCH, "...", ...)`. LM_ASSERT is for broken
 * internal invariants only, never for bad input. LM_TRY propagates a failure.
 */
#ifndef LOOM_BASE_INTERNAL_H
#define LOOM_BASE_INTERNAL_H

#include "loom/base.h"

#include <stdio.h>
#include <stdlib.h>

#if defined(__GNUC__)
#define LM__PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define LM__PRINTF(a, b)
#endif

/* Records "detail" for lm_last_error() and returns status. */
lm_status lm__error(lm_status status, const char *fmt, ...) LM__PRINTF(2, 3);
/* Prefixes the current detail with "context: " (for errors passing up a layer). */
lm_status lm__error_context(lm_status status, const char *fmt, ...) LM__PRINTF(2, 3);
void lm__log(lm_log_level level, const char *fmt, ...) LM__PRINTF(2, 3);

/* Aligned allocation through the hook; records LM_OUT_OF_MEMORY detail on failure. */
void *lm__alloc(size_t nbytes, size_t align);
void *lm__calloc(size_t count, size_t size); /* 64-byte aligned, zeroed, overflow-checked */
void lm__free(void *ptr);
char *lm__strdup(const char *s);

/* Growable arrays (base/array.c): ensures *buf holds at least need elements of elem
 * bytes, doubling the capacity (amortized O(1) appends) and keeping the contents.
 * LM__PUSH appends val to arr[n] (capacity cap), evaluating to LM_OK or
 * LM_OUT_OF_MEMORY. Memory comes from lm__alloc, so injected failures reach here. */
lm_status lm__reserve(void **buf, int64_t *cap, int64_t need, size_t elem);
#define LM__PUSH(arr, n, cap, val)                                                                              \
    (lm__reserve((void **)&(arr), &(cap), (int64_t)(n) + 1, sizeof *(arr)) == LM_OK ? ((arr)[(n)++] = (val), LM_OK) \
                                                                                     : LM_OUT_OF_MEMORY)

/* Seconds on the monotonic clock (base/clock.c): differences time intervals. */
double lm__now_seconds(void);

void lm__assert_fail(const char *expr, const char *file, int line);
#define LM_ASSERT(e) ((e) ? (void)0 : lm__assert_fail(#e, __FILE__, __LINE__))

#define LM_TRY(expr)                   \
    do {                               \
        lm_status lm__s = (expr);      \
        if (lm__s != LM_OK) return lm__s; \
    } while (0)

#define LM_MIN(a, b) ((a) < (b) ? (a) : (b))
#define LM_MAX(a, b) ((a) > (b) ? (a) : (b))

#endif
