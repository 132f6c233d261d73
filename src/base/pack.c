/* base/pack.c — placing buffers with known lifetimes into one address range.
 *
 * Each interval is a buffer of `size` bytes live over steps [first, last]. Buffers
 * are placed largest first (then earliest), each at the lowest aligned offset that
 * overlaps no already placed buffer whose lifetime overlaps its own. Greedy by size
 * is not optimal but is within a few percent on layer-shaped programs; O(n^2 log n).
 * The live bound (the peak over steps of the summed live sizes) is the least any
 * placement can use, so peak / live says how much the greedy choice costs. Used by
 * the tile compiler (per-tile SRAM) and by the executors' activation arena.
 */
#include "base/internal.h"

#include <string.h>

static int cmp_size(const void *a, const void *b) {
    const lm__interval *x = a, *y = b;
    if (x->size != y->size) return x->size > y->size ? -1 : 1;
    if (x->first != y->first) return x->first < y->first ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

static int cmp_offset(const void *a, const void *b) {
    const lm__interval *const *x = a, *const *y = b;
    return ((*x)->offset > (*y)->offset) - ((*x)->offset < (*y)->offset);
}

static int64_t round_up(int64_t v, int64_t align) { return (v + align - 1) / align * align; }

static lm_status live_bound(const lm__interval *iv, int64_t n, int64_t nsteps, int64_t *live) {
    int64_t *delta = lm__calloc((size_t)nsteps + 2, sizeof *delta);
    if (!delta) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        delta[iv[i].first] += iv[i].size;
        delta[iv[i].last + 1] -= iv[i].size;
    }
    int64_t cur = 0, best = 0;
    for (int64_t s = 0; s <= nsteps; s++) {
        cur += delta[s];
        best = LM_MAX(best, cur);
    }
    lm__free(delta);
    *live = best;
    return LM_OK;
}

lm_status lm__pack_intervals(lm__interval *iv, int64_t n, int64_t align, int64_t nsteps, int64_t *peak,
                             int64_t *live) {
    *peak = 0;
    if (live) *live = 0;
    if (n == 0) return LM_OK;
    for (int64_t i = 0; i < n; i++)
        if (iv[i].first < 0 || iv[i].last < iv[i].first || iv[i].last > nsteps || iv[i].size < 0)
            return lm__error(LM_INTERNAL, "pack: interval %lld lives [%lld, %lld] outside [0, %lld]", (long long)iv[i].id,
                             (long long)iv[i].first, (long long)iv[i].last, (long long)nsteps);
    if (n > 1) qsort(iv, (size_t)n, sizeof *iv, cmp_size);
    lm__interval **conflicts = lm__alloc(sizeof *conflicts * (size_t)n, 16);
    if (!conflicts) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < n; i++) {
        int64_t k = 0;
        for (int64_t j = 0; j < i; j++)
            if (iv[j].first <= iv[i].last && iv[i].first <= iv[j].last) conflicts[k++] = &iv[j];
        if (k > 1) qsort(conflicts, (size_t)k, sizeof *conflicts, cmp_offset);
        int64_t off = 0;
        for (int64_t j = 0; j < k; j++) {
            if (conflicts[j]->offset >= off + iv[i].size) break;
            off = LM_MAX(off, round_up(conflicts[j]->offset + conflicts[j]->size, align));
        }
        iv[i].offset = off;
        *peak = LM_MAX(*peak, off + iv[i].size);
    }
    lm__free(conflicts);
    return live ? live_bound(iv, n, nsteps, live) : LM_OK;
}
