/* io/util.c — small helpers of the io layer: path joining, the existence test, JSON
 * parsing with source-naming errors, and shape formatting for messages.
 *
 * None of them keeps state; all allocation goes through the library hook.
 */
#include "io/internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

char *lm__io_path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    int slash = a > 0 && dir[a - 1] != '/';
    char *p = lm__alloc(a + (size_t)slash + b + 1, 1);
    if (!p) return NULL;
    memcpy(p, dir, a);
    if (slash) p[a] = '/';
    memcpy(p + a + (size_t)slash, name, b + 1);
    return p;
}

int lm__io_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

lm_status lm__io_json_parse(const char *text, size_t len, const char *what, const char *source, json_t **out) {
    json_error_t err;
    *out = json_loadb(text, len, JSON_REJECT_DUPLICATES, &err);
    if (!*out)
        return lm__error(LM_PARSE_ERROR, "%s '%s' is not valid JSON: line %d, column %d: %s", what, source, err.line,
                         err.column, err.text);
    return LM_OK;
}

const char *lm__io_shape_str(int ndim, const int64_t *shape, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    n += (size_t)snprintf(buf + n, size - n, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ",%lld" : "%lld", (long long)shape[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}
