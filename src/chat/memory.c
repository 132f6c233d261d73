/* chat/memory.c — the chat templates' arenas, render-time allocation and output sinks.
 *
 * An arena hands out 16-byte aligned blocks from chunks of at least 64 KiB taken from
 * the allocation hook, and frees them all at once. Growing the newest block happens in
 * place when its chunk has room, so a sink that is appended to while nothing else is
 * allocated costs amortized O(1) per byte and no copies. A render's arena has a limit
 * (LM_CHAT_LIMIT_MEMORY_BYTES); strings have another (LM_CHAT_LIMIT_STRING_BYTES).
 */
#include "chat/internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

enum { CHUNK_BYTES = 64 * 1024, ALIGN = 16 };

struct lm__chat_chunk {
    lm__chat_chunk *next;
    size_t size; /* usable bytes after the header */
};

#define CHUNK_HEADER ((sizeof(lm__chat_chunk) + ALIGN - 1) / ALIGN * ALIGN)

void *lm__chat_alloc(lm__chat_arena *a, size_t n) {
    n = (n + ALIGN - 1) / ALIGN * ALIGN;
    if (n == 0) n = ALIGN;
    if (a->cur && (size_t)(a->end - a->cur) >= n) {
        void *p = a->cur;
        a->cur += n;
        return p;
    }
    size_t size = n > CHUNK_BYTES / 2 ? n : CHUNK_BYTES;
    if (size > SIZE_MAX - CHUNK_HEADER) return NULL;
    if (a->limit && (a->total + size + CHUNK_HEADER > a->limit)) return NULL;
    lm__chat_chunk *c = lm__alloc(CHUNK_HEADER + size, ALIGN);
    if (!c) return NULL;
    a->total += CHUNK_HEADER + size;
    c->size = size;
    char *base = (char *)c + CHUNK_HEADER;
    if (size == n && a->head) { /* a big block: keep the current chunk for small ones */
        c->next = a->head->next;
        a->head->next = c;
        return base;
    }
    c->next = a->head;
    a->head = c;
    a->cur = base + n;
    a->end = base + size;
    return base;
}

void *lm__chat_grow(lm__chat_arena *a, void *p, size_t old, size_t n) {
    size_t old_r = (old + ALIGN - 1) / ALIGN * ALIGN;
    if (p && (char *)p + old_r == a->cur) { /* the newest block: extend in place */
        size_t extra = (n + ALIGN - 1) / ALIGN * ALIGN;
        if (extra <= old_r) return p;
        if ((size_t)(a->end - (char *)p) >= extra) {
            a->cur = (char *)p + extra;
            return p;
        }
    }
    if (n <= old && p) return p;
    void *q = lm__chat_alloc(a, n);
    if (q && p && old) memcpy(q, p, LM_MIN(old, n));
    return q;
}

void lm__chat_arena_free(lm__chat_arena *a) {
    lm__chat_chunk *c = a->head;
    while (c) {
        lm__chat_chunk *next = c->next;
        lm__free(c);
        c = next;
    }
    memset(a, 0, sizeof *a);
}

/* ---- render-time helpers --------------------------------------------------------------- */
int lm__crt_fail(lm__crt *c, const lm__cnode *at, lm_status s, const char *fmt, ...) {
    if (c->status != LM_OK) return -1;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->msg, sizeof c->msg, fmt, ap);
    va_end(ap);
    c->status = s;
    c->line = at ? at->line : 0;
    c->col = at ? at->col : 0;
    return -1;
}

/* Names why an arena allocation of n bytes failed: the memory limit or the hook. */
static void alloc_failed(lm__crt *c, const lm__cnode *at, size_t n) {
    size_t chunk = LM_MAX(n, (size_t)CHUNK_BYTES) + CHUNK_HEADER;
    if (c->arena.limit && (chunk > c->arena.limit || c->arena.total > c->arena.limit - chunk))
        lm__crt_fail(c, at, LM_OUT_OF_RANGE, "the render needs more than %zu bytes of memory (LM_CHAT_LIMIT_MEMORY_BYTES)",
                     c->arena.limit);
    else
        lm__crt_fail(c, at, LM_OUT_OF_MEMORY, "out of memory");
}

void *lm__crt_alloc(lm__crt *c, const lm__cnode *at, size_t n) {
    void *p = lm__chat_alloc(&c->arena, n);
    if (!p) alloc_failed(c, at, n);
    return p;
}

int lm__crt_charge(lm__crt *c, const lm__cnode *at, int64_t units) {
    c->work += units;
    if (c->work <= c->max_work) return 0;
    return lm__crt_fail(c, at, LM_OUT_OF_RANGE, "the render takes more than %lld steps (LM_CHAT_LIMIT_WORK)",
                        (long long)c->max_work);
}

char *lm__crt_strbuf(lm__crt *c, const lm__cnode *at, size_t n) {
    if ((int64_t)n > c->max_str || n > SIZE_MAX / 2) {
        lm__crt_fail(c, at, LM_OUT_OF_RANGE, "a string of %zu bytes exceeds the limit of %lld (LM_CHAT_LIMIT_STRING_BYTES)",
                     n, (long long)c->max_str);
        return NULL;
    }
    return lm__crt_alloc(c, at, n ? n : 1);
}

lm__cv_list *lm__crt_list(lm__crt *c, const lm__cnode *at, int64_t n, lm__cl_kind k) {
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(lm__cv) / 2) {
        lm__crt_fail(c, at, LM_OUT_OF_RANGE, "a list of %lld items is too long", (long long)n);
        return NULL;
    }
    lm__cv_list *l = lm__crt_alloc(c, at, sizeof *l);
    if (!l) return NULL;
    memset(l, 0, sizeof *l);
    l->kind = (uint8_t)k;
    l->n = n;
    if (n && !(l->v = lm__crt_alloc(c, at, (size_t)n * sizeof(lm__cv)))) return NULL;
    return l;
}

lm__cv_dict *lm__crt_dict(lm__crt *c, const lm__cnode *at, int64_t cap) {
    lm__cv_dict *d = lm__crt_alloc(c, at, sizeof *d);
    if (!d) return NULL;
    memset(d, 0, sizeof *d);
    if (cap > 0) {
        if ((uint64_t)cap > SIZE_MAX / sizeof(lm__cv) / 4) {
            lm__crt_fail(c, at, LM_OUT_OF_RANGE, "a dict of %lld items is too large", (long long)cap);
            return NULL;
        }
        d->k = lm__crt_alloc(c, at, (size_t)cap * sizeof(lm__cv));
        d->v = lm__crt_alloc(c, at, (size_t)cap * sizeof(lm__cv));
        if (!d->k || !d->v) return NULL;
        d->cap = cap;
    }
    return d;
}

int lm__crt_dict_set(lm__crt *c, const lm__cnode *at, lm__cv_dict *d, lm__cv k, lm__cv v) {
    int64_t i = lm__cv_dict_find(d, &k);
    if (i >= 0) {
        d->v[i] = v;
        return 0;
    }
    if (d->n == d->cap) {
        int64_t cap = d->cap ? 2 * d->cap : 4;
        lm__cv *nk = lm__crt_alloc(c, at, (size_t)cap * sizeof *nk);
        lm__cv *nv = nk ? lm__crt_alloc(c, at, (size_t)cap * sizeof *nv) : NULL;
        if (!nv) return -1;
        if (d->n) {
            memcpy(nk, d->k, (size_t)d->n * sizeof *nk);
            memcpy(nv, d->v, (size_t)d->n * sizeof *nv);
        }
        d->k = nk, d->v = nv, d->cap = cap;
    }
    d->k[d->n] = k;
    d->v[d->n] = v;
    d->n++;
    return 0;
}

const char *lm__crt_printf(lm__crt *c, const lm__cnode *at, const char *fmt, ...) {
    char small[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    char *p = lm__crt_alloc(c, at, (size_t)n + 1);
    if (!p) return NULL;
    if ((size_t)n < sizeof small) {
        memcpy(p, small, (size_t)n + 1);
    } else {
        va_start(ap, fmt);
        vsnprintf(p, (size_t)n + 1, fmt, ap);
        va_end(ap);
    }
    return p;
}

int lm__csink_put(lm__crt *c, const lm__cnode *at, lm__csink *s, const char *p, size_t n) {
    if (n == 0) return 0;
    if (s->n + n > s->cap) {
        if ((int64_t)(s->n + n) > c->max_str)
            return lm__crt_fail(c, at, LM_OUT_OF_RANGE,
                                "the output (or a string being built) exceeds %lld bytes (LM_CHAT_LIMIT_STRING_BYTES)",
                                (long long)c->max_str);
        size_t cap = LM_MAX(s->cap * 2, s->n + n);
        cap = LM_MAX(cap, (size_t)64);
        char *q = lm__chat_grow(&c->arena, s->p, s->cap, cap);
        if (!q) {
            alloc_failed(c, at, cap);
            return -1;
        }
        s->p = q, s->cap = cap;
    }
    memcpy(s->p + s->n, p, n);
    s->n += n;
    return 0;
}

int lm__csink_putc(lm__crt *c, const lm__cnode *at, lm__csink *s, char ch) { return lm__csink_put(c, at, s, &ch, 1); }

lm__cv lm__csink_value(const lm__csink *s) { return lm__cv_str(s->p ? s->p : "", s->n); }
