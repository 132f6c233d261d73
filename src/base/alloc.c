/* base/alloc.c — the host allocation hook.
 *
 * Every library-owned host allocation goes through lm__alloc/lm__free so tests can
 * inject failures. Alignment is a power of two >= sizeof(void*); the default hook
 * uses aligned_alloc with the size rounded up to the alignment.
 * Buffers of LM__HUGE_MIN and more (weight matrices quantized or copied at load, KV
 * caches, GEMM scratch) start on a 2 MiB boundary (posix_memalign: no rounding of the
 * size) and are offered to transparent huge pages: a model load writes every byte of
 * them once, and with 4 KiB pages that is one page fault per 4 KiB. Advice only (the
 * kernel's THP setting decides); the last partial 2 MiB of a buffer stays in small
 * pages, so no memory is added.
 */
#define _DEFAULT_SOURCE /* madvise */
#include "internal.h"

#include <string.h>
#include <sys/mman.h>

#define LM__HUGE_MIN ((size_t)4 << 20)
#define LM__HUGE_ALIGN ((size_t)2 << 20)

static void *default_alloc(void *user, size_t nbytes, size_t align) {
    (void)user;
#ifdef MADV_HUGEPAGE
    if (nbytes >= LM__HUGE_MIN && align <= LM__HUGE_ALIGN) {
        void *p = NULL;
        if (posix_memalign(&p, LM__HUGE_ALIGN, nbytes) != 0) return NULL;
        (void)madvise(p, nbytes / LM__HUGE_ALIGN * LM__HUGE_ALIGN, MADV_HUGEPAGE);
        return p;
    }
#endif
    size_t rounded = (nbytes + align - 1) / align * align;
    if (rounded < nbytes) return NULL;
    return aligned_alloc(align, rounded ? rounded : align);
}

static void default_free(void *user, void *ptr) {
    (void)user;
    free(ptr);
}

static lm_alloc_hooks g_hooks = {default_alloc, default_free, NULL};

void lm_set_alloc_hooks(const lm_alloc_hooks *hooks) {
    if (hooks && hooks->alloc && hooks->free) g_hooks = *hooks;
    else g_hooks = (lm_alloc_hooks){default_alloc, default_free, NULL};
}

void *lm__alloc(size_t nbytes, size_t align) {
    if (align < sizeof(void *)) align = sizeof(void *);
    LM_ASSERT((align & (align - 1)) == 0);
    void *p = g_hooks.alloc(g_hooks.user, nbytes, align);
    if (!p) lm__error(LM_OUT_OF_MEMORY, "host allocation of %zu bytes failed", nbytes);
    return p;
}

void *lm__calloc(size_t count, size_t size) {
    if (size && count > SIZE_MAX / size) {
        lm__error(LM_OUT_OF_MEMORY, "allocation of %zu x %zu bytes overflows", count, size);
        return NULL;
    }
    void *p = lm__alloc(count * size, 64);
    if (p) memset(p, 0, count * size);
    return p;
}

void lm__free(void *ptr) {
    if (ptr) g_hooks.free(g_hooks.user, ptr);
}

char *lm__strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = lm__alloc(n, 1);
    if (d) memcpy(d, s, n);
    return d;
}

void *lm_malloc(size_t nbytes) { return lm__alloc(nbytes, 64); }
void lm_free(void *ptr) { lm__free(ptr); }
