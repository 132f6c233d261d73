/* infer/internal.h — the stop-string filter shared by lm_generate and the serving
 * schedulers (never installed).
 *
 * Generated text passes through the filter before anyone sees it: it holds back the
 * last (longest stop string - 1) bytes, rounded back to a character boundary,
 * because they could still begin a stop string; everything before that is final.
 * When a stop string appears, the text before it is final and the rest is dropped.
 */
#ifndef LOOM_INFER_INTERNAL_H
#define LOOM_INFER_INTERNAL_H

#include "base/internal.h"

typedef struct lm__stop_filter {
    const char *const *stop; /* [n_stop] borrowed, non-empty */
    int n_stop;
    size_t longest;
    char *held; /* [cap] text not yet delivered */
    size_t len;
    int64_t cap; /* int64_t: lm__reserve's capacity type */
} lm__stop_filter;

/* stop may be NULL when n_stop == 0. The strings must outlive the filter. */
void lm__stop_filter_init(lm__stop_filter *f, const char *const *stop, int n_stop);
void lm__stop_filter_free(lm__stop_filter *f);
/* Appends text; *give = how many bytes at the start of f->held are final now (all of
 * them when at_end), *hit = 1 when a stop string begins at *give. The caller reads
 * f->held[0, *give) and then calls lm__stop_filter_consume. */
lm_status lm__stop_filter_push(lm__stop_filter *f, const char *text, size_t n, int at_end, size_t *give, int *hit);
/* Drops the delivered bytes (and, after a hit, everything held). */
void lm__stop_filter_consume(lm__stop_filter *f, size_t give, int hit);

#endif
