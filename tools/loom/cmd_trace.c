/* tools/loom/cmd_trace.c — `loom trace view TRACE.json -o FILE.html`: a step trace
 * (Chrome trace-event JSON, as `--trace` writes it) as one self-contained HTML page
 * that any browser opens offline (lm_trace_html; docs/TIMELINES.md, "Step traces").
 * The input must be a regular file (a FIFO or directory is refused by name, without
 * blocking); the page is written atomically (temporary file, fsync, rename), and never
 * over the input. Exit 0 ok, 1 failure (unreadable or malformed trace, write error),
 * 2 usage.
 */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/trace.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static const char *k_synopsis = "view TRACE.json [-o FILE.html]";

static void usage(FILE *f) {
    fprintf(f, "usage: loom trace %s\n"
               "  view: write TRACE.json (a trace of `loom generate|bench|train|serve --trace`, or any Chrome\n"
               "        trace-event JSON) as one self-contained HTML page: a row per thread with nested spans,\n"
               "        request lanes, counters, zoom and pan, tooltips, and a summary of which operations take\n"
               "        the time and how busy each thread is. No network is needed to open it.\n"
               "options:\n"
               "  -o, --out FILE  the page to write (default: TRACE with .json replaced by .html)\n",
            k_synopsis);
}

/* TRACE.json -> TRACE.html (any other name: TRACE.html appended). malloc'd. */
static char *default_out(const char *in) {
    size_t n = strlen(in);
    char *o = malloc(n + 6);
    if (!o) return NULL;
    memcpy(o, in, n + 1);
    if (n > 5 && !strcmp(in + n - 5, ".json")) o[n - 5] = '\0';
    strcat(o, ".html");
    return o;
}

/* 1 when both paths name the same existing file. */
static int same_file(const char *a, const char *b) {
    struct stat x, y;
    return stat(a, &x) == 0 && stat(b, &y) == 0 && x.st_dev == y.st_dev && x.st_ino == y.st_ino;
}

static int view(int argc, char **argv) {
    const char *out = NULL, *in[2] = {NULL, NULL};
    const cli_opt opts[] = {{"out", CLI_STRING, &out, "FILE: the page to write (also -o; default TRACE.html)"},
                            {NULL, 0, NULL, NULL}};
    for (int i = 0; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
    int n = 0;
    int rc = cli_parse("trace view", k_synopsis, opts, argc, argv, in, 2, &n);
    if (rc) return rc == 1 ? 0 : rc;
    if (n != 1) {
        fprintf(stderr, "loom trace view: give one trace file (%s)\n", n ? "more than one given" : "none given");
        return 2;
    }
    char *made = out ? NULL : default_out(in[0]);
    if (!out && !made) return cli_fail("trace view", "out of memory", LM_OUT_OF_MEMORY);
    const char *path = out ? out : made;
    if (same_file(in[0], path)) {
        fprintf(stderr, "loom trace view: -o '%s' is the trace itself\n", path);
        free(made);
        return 2;
    }
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "loom trace view: -o '%s' is a directory\n", path);
        free(made);
        return 2;
    }
    lm_file_map map;
    lm_status st = lm_file_map_open(in[0], &map); /* regular files only: a FIFO cannot block us */
    if (st != LM_OK) {
        free(made);
        return cli_fail("trace view", "cannot read the trace", st);
    }
    char *html = NULL;
    double t = cli_now();
    st = lm_trace_html((const char *)map.data, map.size, in[0], &html);
    size_t in_bytes = map.size;
    lm_file_map_close(&map);
    if (st != LM_OK) {
        free(made);
        return cli_fail("trace view", "cannot read the trace", st);
    }
    size_t bytes = strlen(html);
    st = lm_file_write_atomic(path, html, bytes);
    lm_free(html);
    if (st != LM_OK) {
        rc = cli_fail("trace view", "cannot write the page", st);
        free(made);
        return rc;
    }
    printf("{\"trace\":");
    cli_json_string(stdout, in[0], strlen(in[0]));
    printf(",\"out\":");
    cli_json_string(stdout, path, strlen(path));
    printf(",\"trace_bytes\":%zu,\"page_bytes\":%zu,\"seconds\":%.3f}\n", in_bytes, bytes, cli_now() - t);
    free(made);
    return 0;
}

int cmd_trace(int argc, char **argv) {
    if (argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h") || !strcmp(argv[0], "help"))) {
        usage(stdout);
        return 0;
    }
    if (argc >= 1 && !strcmp(argv[0], "view")) return view(argc - 1, argv + 1);
    if (argc >= 1) fprintf(stderr, "loom trace: unknown action '%s'\n", argv[0]);
    usage(stderr);
    return 2;
}
