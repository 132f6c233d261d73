/* plan/util.c — a text builder shared by the planner files (reports, descriptions).
 * Growth goes through lm__reserve, so allocation-failure tests reach every path.
 */
#include "plan/internal.h"

#include <stdarg.h>
#include <stdio.h>

void lm__plan_sbuf_printf(lm__plan_sbuf *b, const char *fmt, ...) {
    if (b->failed) return;
    for (;;) {
        int64_t room = b->cap - b->len;
        va_list ap;
        va_start(ap, fmt);
        int n = room > 0 ? vsnprintf(b->p + b->len, (size_t)room, fmt, ap) : vsnprintf(NULL, 0, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if (n < room) {
            b->len += n;
            return;
        }
        if (lm__reserve((void **)&b->p, &b->cap, b->len + n + 1, 1) != LM_OK) {
            b->failed = 1;
            return;
        }
    }
}

lm_status lm__plan_sbuf_finish(lm__plan_sbuf *b, char **out) {
    *out = NULL;
    if (!b->p) lm__plan_sbuf_printf(b, "%s", "");
    if (b->failed) {
        lm__free(b->p);
        *b = (lm__plan_sbuf){0};
        return lm__error(LM_OUT_OF_MEMORY, "report text: out of memory");
    }
    *out = b->p;
    *b = (lm__plan_sbuf){0};
    return LM_OK;
}
