/* Tests that libloom.so exports exactly the public API. `nm -D --defined-only` on the
 * built shared library (LOOM_BINARY_DIR/libloom.so) lists its dynamic symbols: every
 * one must start with lm_ but not lm__ (internal helpers, file-local kernels and
 * template code from CUDA headers stay hidden); the linker's own _init, _fini,
 * __bss_start, _edata and _end are allowed. And every lm_ function libloom.a defines
 * (`nm -g --defined-only`, which lists hidden symbols too) must be exported, so a
 * public declaration without LM_API (scripts/mark_lm_api.py) fails here. Prints the
 * number of exported symbols. nm comes with binutils, which every gcc installation has.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char k_shared[] = LOOM_BINARY_DIR "/libloom.so";
static const char k_static[] = LOOM_BINARY_DIR "/libloom.a";

typedef struct names {
    char **v; /* [n] symbol names without version suffix, malloc'd */
    size_t n, cap;
} names;

static void names_free(names *s) {
    for (size_t i = 0; i < s->n; i++) free(s->v[i]);
    free(s->v);
    *s = (names){0};
}

static int names_add(names *s, const char *name) {
    if (s->n == s->cap) {
        size_t cap = s->cap ? 2 * s->cap : 256;
        char **v = realloc(s->v, cap * sizeof *v);
        if (!v) return 0;
        s->v = v, s->cap = cap;
    }
    s->v[s->n] = strdup(name);
    if (!s->v[s->n]) return 0;
    s->n++;
    return 1;
}

static int cmp_name(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static int names_has(const names *s, const char *name) {
    return bsearch(&name, s->v, s->n, sizeof *s->v, cmp_name) != NULL;
}

/* Runs nm with flags on path and collects the defined symbols' names, sorted. Lines
 * that are not "<address> <type> <name>" (an archive's "member.o:" headers, blank
 * lines) are skipped. Returns 0, with *out empty and a failure recorded, when the
 * file is missing or nm fails. */
static int nm_symbols(const char *flags, const char *path, names *out) {
    *out = (names){0};
    if (access(path, R_OK) != 0) {
        LT_CHECK_MSG(0, "%s is missing: build loom (cmake --build) first", path);
        return 0;
    }
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "nm %s '%s' 2>&1", flags, path);
    FILE *p = popen(cmd, "r");
    LT_CHECK_MSG(p != NULL, "cannot run '%s'", cmd);
    if (!p) return 0;
    char line[4096], last[4096] = "";
    int ok = 1;
    while (fgets(line, sizeof line, p)) {
        char addr[64], type[8], name[1024];
        if (sscanf(line, "%63s %7s %1023s", addr, type, name) != 3 || strlen(type) != 1) {
            snprintf(last, sizeof last, "%.*s", (int)strcspn(line, "\n"), line);
            continue;
        }
        name[strcspn(name, "@")] = '\0'; /* "name@@VERSION" in a versioned library */
        ok &= names_add(out, name);
    }
    int status = pclose(p);
    int code = status != -1 && WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    LT_CHECK_MSG(ok, "out of memory reading nm's output");
    LT_CHECK_MSG(code == 0, "'%s' exited with %d (is binutils installed?): %s", cmd, code, last);
    if (!ok || code != 0) {
        names_free(out);
        return 0;
    }
    if (out->n) qsort(out->v, out->n, sizeof *out->v, cmp_name);
    return 1;
}

static int is_linker_symbol(const char *name) {
    static const char *const linker[] = {"_init", "_fini", "__bss_start", "_edata", "_end"};
    for (size_t i = 0; i < sizeof linker / sizeof linker[0]; i++)
        if (strcmp(name, linker[i]) == 0) return 1;
    return 0;
}

static int is_api_name(const char *name) { return strncmp(name, "lm_", 3) == 0 && strncmp(name, "lm__", 4) != 0; }

static void test_only_lm_api_is_exported(void) {
    names exported;
    if (!nm_symbols("-D --defined-only", k_shared, &exported)) return;
    int count = 0;
    for (size_t i = 0; i < exported.n; i++) {
        if (is_linker_symbol(exported.v[i])) continue;
        count++;
        LT_CHECK_MSG(is_api_name(exported.v[i]), "libloom.so exports %s, which is not lm_ API", exported.v[i]);
    }
    printf("libloom.so exports %d symbols\n", count);
    LT_CHECK_MSG(names_has(&exported, "lm_status_name"), "lm_status_name is not among the %d exported symbols", count);
    names_free(&exported);
}

static void test_every_public_function_is_exported(void) {
    names exported, defined;
    if (!nm_symbols("-D --defined-only", k_shared, &exported)) return;
    if (nm_symbols("-g --defined-only", k_static, &defined)) {
        int api = 0;
        for (size_t i = 0; i < defined.n; i++) {
            if (!is_api_name(defined.v[i]) || (i && strcmp(defined.v[i], defined.v[i - 1]) == 0)) continue;
            api++;
            LT_CHECK_MSG(names_has(&exported, defined.v[i]),
                         "%s is defined in libloom.a but not exported: its declaration lacks LM_API "
                         "(run scripts/mark_lm_api.py)", defined.v[i]);
        }
        LT_CHECK_MSG(api > 0, "no lm_ symbols found in %s", k_static);
    }
    names_free(&defined);
    names_free(&exported);
}

int main(void) {
    LT_RUN(test_only_lm_api_is_exported);
    LT_RUN(test_every_public_function_is_exported);
    return lt_finish();
}
