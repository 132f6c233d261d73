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

/* Buffers with lifetimes packed into one address range (base/pack.c). */
typedef struct lm__interval {
    int64_t first, last; /* live over steps [first, last] (inclusive) */
    int64_t size;        /* bytes */
    int64_t offset;      /* out: bytes from the start of the range */
    int64_t id;          /* the caller's tag (intervals are reordered) */
} lm__interval;
/* Gives every interval an offset (a multiple of align) such that no two intervals
 * live at the same step overlap in memory; sorts iv. *peak = the range's size; *live
 * (may be NULL) = the largest sum of sizes live at one step, the least any placement
 * needs. Steps are in [0, nsteps]. */
lm_status lm__pack_intervals(lm__interval *iv, int64_t n, int64_t align, int64_t nsteps, int64_t *peak,
                             int64_t *live);

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

/* base/html_nav.c: the zoom/pan JavaScript the timeline pages share, spliced where a
 * page template holds lm__html_nav_marker (the pointer, compared by address). */
extern const char lm__html_nav_marker[];
extern const char *const lm__html_nav_js[];

#endif
