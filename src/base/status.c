/* base/status.c — status names/messages from the X-macro table, and the
 * thread-local error detail behind lm_last_error().
 *
 * The detail buffer is fixed-size per thread (no allocation on the error path, so an
 * out-of-memory failure can still be described); longer messages are truncated.
 */
#include "internal.h"

#include <string.h>

#define LM__ERRBUF 1024
static _Thread_local char lm__errbuf[LM__ERRBUF];

const char *lm_status_name(lm_status s) {
    switch (s) {
#define LM__NAME(name, value, msg) \
    case LM_##name:                \
        return "LM_" #name;
        LM_STATUS_TABLE(LM__NAME)
#undef LM__NAME
    }
    return "LM_UNKNOWN_STATUS";
}

const char *lm_status_str(lm_status s) {
    switch (s) {
#define LM__STR(name, value, msg) \
    case LM_##name:               \
        return msg;
        LM_STATUS_TABLE(LM__STR)
#undef LM__STR
    }
    return "unknown status";
}

const char *lm_last_error(void) { return lm__errbuf; }
void lm_clear_error(void) { lm__errbuf[0] = '\0'; }

lm_status lm__error(lm_status status, const char *fmt, ...) {
    /* format off to the side: the arguments may quote lm_last_error() itself */
    char msg[LM__ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(lm__errbuf, msg, sizeof msg);
    lm__log(LM_LOG_DEBUG, "%s: %s", lm_status_name(status), lm__errbuf);
    return status;
}

lm_status lm__error_context(lm_status status, const char *fmt, ...) {
    char prefix[LM__ERRBUF], old[LM__ERRBUF];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, lm__errbuf, sizeof old);
    /* "prefix: old", truncated to the buffer */
    size_t n = strlen(prefix), cap = sizeof lm__errbuf - 1;
    if (n > cap) n = cap;
    memcpy(lm__errbuf, prefix, n);
    for (const char *s = ": "; *s && n < cap; s++) lm__errbuf[n++] = *s;
    for (const char *s = old; *s && n < cap; s++) lm__errbuf[n++] = *s;
    lm__errbuf[n] = '\0';
    return status;
}

void lm__assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "loom: internal invariant failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
