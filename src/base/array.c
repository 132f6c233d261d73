/* base/array.c — the one growable-array helper (lm__reserve / LM__PUSH).
 *
 * Capacity doubles from 16 until it covers the request, so n appends cost O(n)
 * element copies in all. Contents are kept; on failure *buf and *cap are unchanged.
 */
#include "base/internal.h"

#include <string.h>

lm_status lm__reserve(void **buf, int64_t *cap, int64_t need, size_t elem) {
    if (need <= *cap) return LM_OK;
    int64_t ncap = *cap > 0 ? *cap : 16;
    while (ncap < need) {
        if (ncap > INT64_MAX / 2) return lm__error(LM_OUT_OF_MEMORY, "array of %lld elements", (long long)need);
        ncap *= 2;
    }
    if ((uint64_t)ncap > SIZE_MAX / elem) return lm__error(LM_OUT_OF_MEMORY, "array of %lld x %zu bytes", (long long)ncap, elem);
    void *p = lm__alloc((size_t)ncap * elem, 16);
    if (!p) return LM_OUT_OF_MEMORY;
    if (*buf && *cap > 0) memcpy(p, *buf, (size_t)*cap * elem);
    lm__free(*buf);
    *buf = p;
    *cap = ncap;
    return LM_OK;
}
