/* base/log.c — the logging hook. The library is silent unless a caller installs a
 * function; messages are formatted into a bounded stack buffer (no allocation). */
#include "internal.h"

static lm_log_fn g_log_fn;
static void *g_log_user;
static lm_log_level g_log_max = LM_LOG_WARN;

void lm_set_log_fn(lm_log_fn fn, void *user, lm_log_level max_level) {
    g_log_fn = fn;
    g_log_user = user;
    g_log_max = max_level;
}

void lm__log(lm_log_level level, const char *fmt, ...) {
    if (!g_log_fn || level > g_log_max) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    g_log_fn(g_log_user, level, buf);
}
