/* infer/stop.c — the stop-string filter (infer/internal.h). */
#include "infer/internal.h"

#include <string.h>

void lm__stop_filter_init(lm__stop_filter *f, const char *const *stop, int n_stop) {
    memset(f, 0, sizeof *f);
    f->stop = stop;
    f->n_stop = n_stop;
    for (int i = 0; i < n_stop; i++) f->longest = LM_MAX(f->longest, strlen(stop[i]));
}

void lm__stop_filter_free(lm__stop_filter *f) {
    lm__free(f->held);
    memset(f, 0, sizeof *f);
}

/* Position of the earliest stop string in held, or -1. */
static int64_t find_stop(const lm__stop_filter *f) {
    int64_t best = -1;
    for (int i = 0; i < f->n_stop; i++) {
        size_t sl = strlen(f->stop[i]);
        for (size_t p = 0; sl && p + sl <= f->len; p++)
            if (memcmp(f->held + p, f->stop[i], sl) == 0) {
                if (best < 0 || (int64_t)p < best) best = (int64_t)p;
                break;
            }
    }
    return best;
}

/* Bytes of held that are final: all but the last longest-1, backed up to a UTF-8
 * character start. */
static size_t final_prefix(const lm__stop_filter *f, int at_end) {
    if (at_end || f->longest <= 1) return f->len;
    size_t keep = f->longest - 1;
    if (f->len <= keep) return 0;
    size_t n = f->len - keep;
    while (n > 0 && ((unsigned char)f->held[n] & 0xC0) == 0x80) n--;
    return n;
}

lm_status lm__stop_filter_push(lm__stop_filter *f, const char *text, size_t n, int at_end, size_t *give, int *hit) {
    LM_TRY(lm__reserve((void **)&f->held, &f->cap, (int64_t)(f->len + n + 1), 1));
    memcpy(f->held + f->len, text, n);
    f->len += n;
    f->held[f->len] = 0;
    int64_t at = find_stop(f);
    *hit = at >= 0;
    *give = at >= 0 ? (size_t)at : final_prefix(f, at_end);
    return LM_OK;
}

void lm__stop_filter_consume(lm__stop_filter *f, size_t give, int hit) {
    if (hit) {
        f->len = 0; /* the stop string and anything after it are dropped */
        return;
    }
    memmove(f->held, f->held + give, f->len - give);
    f->len -= give;
}
