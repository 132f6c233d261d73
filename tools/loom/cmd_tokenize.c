/* tools/loom/cmd_tokenize.c — `loom tokenize`: JSON strings (one per line on stdin)
 * to JSON arrays of ids, or with --decode the reverse. A diagnostic contract other
 * tools parse: one output line per input line, no special tokens added. */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/tokenizer.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>

static int encode_line(const lm_tokenizer *tok, json_t *v, long line) {
    if (!json_is_string(v)) {
        fprintf(stderr, "loom tokenize: line %ld: expected a JSON string\n", line);
        return 1;
    }
    int32_t *ids = NULL;
    size_t n = 0;
    lm_status st = lm_tokenizer_encode(tok, json_string_value(v), json_string_length(v), &ids, &n);
    if (st != LM_OK) {
        char what[64];
        snprintf(what, sizeof what, "line %ld", line);
        return cli_fail("tokenize", what, st);
    }
    putchar('[');
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("]\n");
    lm_free(ids);
    return 0;
}

static int decode_line(const lm_tokenizer *tok, json_t *v, long line) {
    size_t n = json_is_array(v) ? json_array_size(v) : 0;
    int32_t *ids = malloc(sizeof(int32_t) * (n ? n : 1));
    if (!json_is_array(v) || !ids) {
        fprintf(stderr, "loom tokenize: line %ld: expected a JSON array of token ids\n", line);
        free(ids);
        return 1;
    }
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(v, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX) {
            fprintf(stderr, "loom tokenize: line %ld: element %zu is not a token id\n", line, i);
            free(ids);
            return 1;
        }
        ids[i] = (int32_t)json_integer_value(e);
    }
    char *text = NULL;
    size_t len = 0;
    lm_status st = lm_tokenizer_decode(tok, ids, n, LM_TOKENIZER_LOSSY, &text, &len);
    free(ids);
    if (st != LM_OK) {
        char what[64];
        snprintf(what, sizeof what, "line %ld", line);
        return cli_fail("tokenize", what, st);
    }
    cli_json_string(stdout, text, len);
    putchar('\n');
    lm_free(text);
    return 0;
}

/* A line buffer larger than this (bytes) is released once its line is parsed. */
enum { LARGE_LINE = 1 << 20 };

int cmd_tokenize(int argc, char **argv) {
    const char *path = NULL;
    int decode = 0;
    const cli_opt opts[] = {{"tokenizer", CLI_STRING, &path, "FILE: tokenizer.json (required)"},
                            {"decode", CLI_FLAG, &decode, "read JSON arrays of ids and write JSON strings"},
                            {NULL, 0, NULL, NULL}};
    const char *pos[1];
    int npos;
    int rc = cli_parse("tokenize", "--tokenizer FILE [--decode] < lines", opts, argc, argv, pos, 0, &npos);
    if (rc) return rc == 1 ? 0 : rc;
    if (!path) {
        fprintf(stderr, "loom tokenize: --tokenizer FILE is required\n");
        return 2;
    }
    lm_tokenizer *tok = NULL;
    lm_status st = lm_tokenizer_load(path, &tok);
    if (st != LM_OK) {
        char what[1100];
        snprintf(what, sizeof what, "cannot load '%s'", path);
        return cli_fail("tokenize", what, st);
    }
    char *buf = NULL;
    size_t cap = 0;
    ssize_t got;
    long line = 0;
    rc = 0;
    while (rc == 0 && (got = getline(&buf, &cap, stdin)) >= 0) {
        line++;
        json_error_t err;
        json_t *v = json_loadb(buf, (size_t)got, JSON_DECODE_ANY | JSON_ALLOW_NUL, &err);
        if (cap > LARGE_LINE) { /* the parsed copy is all that is needed: do not hold a long line twice */
            free(buf);
            buf = NULL, cap = 0;
        }
        if (!v) {
            fprintf(stderr, "loom tokenize: line %ld: invalid JSON: %s (column %d)\n", line, err.text, err.column);
            rc = 1;
            break;
        }
        rc = decode ? decode_line(tok, v, line) : encode_line(tok, v, line);
        json_decref(v);
        fflush(stdout);
    }
    free(buf);
    lm_tokenizer_destroy(tok);
    return rc;
}
