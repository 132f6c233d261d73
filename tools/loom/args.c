/* tools/loom/args.c — long-option parsing for loom subcommands (see args.h). */
#include "args.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

void cli_usage(FILE *f, const char *cmd, const char *synopsis, const cli_opt *opts) {
    fprintf(f, "usage: loom %s %s\n", cmd, synopsis);
    if (!opts[0].name) return;
    fprintf(f, "options:\n");
    for (const cli_opt *o = opts; o->name; o++) {
        const char *colon = strstr(o->help, ": "); /* "ARG: text"; ARG may hold a colon (cuda[:N]) */
        if (o->kind != CLI_FLAG && colon) {
            char arg[64];
            size_t n = (size_t)(colon - o->help) < sizeof arg - 1 ? (size_t)(colon - o->help) : sizeof arg - 1;
            memcpy(arg, o->help, n);
            arg[n] = '\0';
            fprintf(f, "  --%s %s\n      %s\n", o->name, arg, colon + 2);
        } else {
            fprintf(f, "  --%s\n      %s\n", o->name, o->help);
        }
    }
}

static int set_value(const char *cmd, const cli_opt *o, const char *v) {
    char *end = NULL;
    errno = 0;
    switch (o->kind) {
    case CLI_STRING: *(const char **)o->dest = v; return 0;
    case CLI_INT:
    case CLI_COUNT: {
        long x = strtol(v, &end, 10);
        if (errno || *end || end == v || x < INT_MIN || x > INT_MAX) break;
        if (o->kind == CLI_COUNT && x < 0) {
            fprintf(stderr, "loom %s: --%s must be >= 0 (got %ld)\n", cmd, o->name, x);
            return 2;
        }
        *(int *)o->dest = (int)x;
        return 0;
    }
    case CLI_U64: {
        unsigned long long x = strtoull(v, &end, 10);
        if (errno || *end || end == v || v[0] == '-') break;
        *(uint64_t *)o->dest = x;
        return 0;
    }
    case CLI_FLOAT:
    case CLI_NONNEG: {
        float x = strtof(v, &end);
        if (errno || *end || end == v || !isfinite(x)) break;
        if (o->kind == CLI_NONNEG && x < 0) {
            fprintf(stderr, "loom %s: --%s must be >= 0 (got %s)\n", cmd, o->name, v);
            return 2;
        }
        *(float *)o->dest = x;
        return 0;
    }
    case CLI_FLAG: return 0;
    }
    fprintf(stderr, "loom %s: invalid value '%s' for --%s\n", cmd, v, o->name);
    return 2;
}

int cli_parse(const char *cmd, const char *synopsis, const cli_opt *opts, int argc, char **argv,
              const char **positional, int max_positional, int *npositional) {
    *npositional = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            cli_usage(stdout, cmd, synopsis, opts);
            return 1;
        }
        const cli_opt *out_opt = NULL; /* "-o" stands for --out / --output where a command has one */
        for (const cli_opt *o = opts; strcmp(a, "-o") == 0 && o->name && !out_opt; o++)
            if (!strcmp(o->name, "out") || !strcmp(o->name, "output")) out_opt = o;
        if (out_opt) {
            if (i + 1 >= argc) {
                fprintf(stderr, "loom %s: -o needs a value\n", cmd);
                return 2;
            }
            if (set_value(cmd, out_opt, argv[++i])) return 2;
            continue;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            if (*npositional >= max_positional) {
                fprintf(stderr, "loom %s: unexpected argument '%s'\n", cmd, a);
                return 2;
            }
            positional[(*npositional)++] = a;
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t len = eq ? (size_t)(eq - name) : strlen(name);
        const cli_opt *o = opts;
        while (o->name && !(strlen(o->name) == len && strncmp(o->name, name, len) == 0)) o++;
        if (!o->name) {
            fprintf(stderr, "loom %s: unknown option '--%.*s' (see loom %s --help)\n", cmd, (int)len, name, cmd);
            return 2;
        }
        if (o->kind == CLI_FLAG) {
            if (eq) {
                fprintf(stderr, "loom %s: --%s takes no value\n", cmd, o->name);
                return 2;
            }
            *(int *)o->dest = 1;
            continue;
        }
        const char *v = eq ? eq + 1 : (i + 1 < argc ? argv[++i] : NULL);
        if (!v) {
            fprintf(stderr, "loom %s: --%s needs a value\n", cmd, o->name);
            return 2;
        }
        if (set_value(cmd, o, v)) return 2;
    }
    return 0;
}

int cli_parse_ids(const char *text, int32_t **ids, size_t *n) {
    size_t cap = 16, len = 0;
    int32_t *out = malloc(cap * sizeof *out);
    const char *p = text;
    while (out && *p) {
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end && *end != ',')) {
            fprintf(stderr, "loom: invalid token id list '%s' (expected comma-separated non-negative integers)\n", text);
            free(out);
            return 0;
        }
        if (len == cap) {
            int32_t *grown = realloc(out, 2 * cap * sizeof *out);
            if (!grown) {
                fprintf(stderr, "loom: out of memory reading token ids\n");
                free(out);
                return 0;
            }
            out = grown;
            cap *= 2;
        }
        out[len++] = (int32_t)v;
        if (*end == ',' && end[1] == '\0') { /* "1,2," */
            fprintf(stderr, "loom: invalid token id list '%s' (it ends with a comma)\n", text);
            free(out);
            return 0;
        }
        p = *end ? end + 1 : end;
    }
    if (!out || len == 0) {
        fprintf(stderr, "loom: empty token id list\n");
        free(out);
        return 0;
    }
    *ids = out;
    *n = len;
    return 1;
}
