/* tools/loom/cmd_data.c — `loom data prepare`: tokenizes text files into one token
 * shard for `loom train` (format in loom/data.h) and prints a JSON summary line. */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/data.h"

#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

/* Every input must be a regular file (opened without blocking: a FIFO or directory is
 * refused by name) and -o must not be a directory, checked before any tokenizing.
 * Prints why and returns 2 when not. */
static int check_paths(const char *const *inputs, int n, const char *out) {
    for (int i = 0; i < n; i++) {
        lm_file_map map;
        lm_status st = lm_file_map_open(inputs[i], &map);
        if (st != LM_OK) {
            cli_fail("data prepare", "input", st);
            return 2;
        }
        lm_file_map_close(&map);
    }
    struct stat sb;
    if (stat(out, &sb) == 0 && S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "loom data prepare: -o '%s' is a directory\n", out);
        return 2;
    }
    return 0;
}

static const char *k_synopsis = "--tokenizer FILE IN.txt... -o OUT.bin [--separator TOKEN | --separator-id N]";

int cmd_data(int argc, char **argv) {
    if (argc < 1 || strcmp(argv[0], "prepare") != 0) {
        fprintf(argc >= 1 && !strcmp(argv[0], "--help") ? stdout : stderr, "usage: loom data %s\n", k_synopsis);
        return argc >= 1 && !strcmp(argv[0], "--help") ? 0 : 2;
    }
    const char *tok_path = NULL, *out = NULL, *sep_text = NULL;
    int sep_id = -1;
    const cli_opt opts[] = {
        {"tokenizer", CLI_STRING, &tok_path, "FILE: tokenizer.json to encode with (required)"},
        {"out", CLI_STRING, &out, "FILE: the token shard to write (also -o; required)"},
        {"separator", CLI_STRING, &sep_text, "TOKEN: token appended after each file, e.g. <|endoftext|>"},
        {"separator-id", CLI_COUNT, &sep_id, "N: token id appended after each file (below the vocabulary size)"},
        {NULL, 0, NULL, NULL}};
    const char **inputs = malloc(sizeof(char *) * (size_t)(argc > 1 ? argc : 1));
    int n = 0;
    int rc = inputs ? cli_parse("data prepare", k_synopsis, opts, argc - 1, argv + 1, inputs, argc, &n) : 1;
    if (rc) {
        free(inputs);
        return rc == 1 ? 0 : rc;
    }
    if (!tok_path || !out || n < 1) {
        fprintf(stderr, "loom data prepare: --tokenizer, -o and at least one input file are required\n");
        free(inputs);
        return 2;
    }
    if (sep_text && sep_id >= 0) {
        fprintf(stderr, "loom data prepare: give --separator or --separator-id, not both\n");
        free(inputs);
        return 2;
    }
    if (check_paths(inputs, n, out) != 0) {
        free(inputs);
        return 2;
    }
    lm_tokenizer *tok = NULL;
    lm_status st = lm_tokenizer_load(tok_path, &tok);
    if (st != LM_OK) {
        free(inputs);
        return cli_fail("data prepare", "cannot load the tokenizer", st);
    }
    if (sep_id >= lm_tokenizer_vocab_size(tok)) {
        fprintf(stderr, "loom data prepare: --separator-id %d is outside the tokenizer's vocabulary of %d ids\n",
                sep_id, lm_tokenizer_vocab_size(tok));
        lm_tokenizer_destroy(tok);
        free(inputs);
        return 2;
    }
    if (sep_text && (st = lm_tokenizer_token_to_id(tok, sep_text, strlen(sep_text), &sep_id)) != LM_OK) {
        lm_tokenizer_destroy(tok);
        free(inputs);
        return cli_fail("data prepare", "--separator is not a token of the tokenizer", st);
    }
    int64_t count = 0;
    st = lm_data_prepare(tok, n, inputs, sep_id, out, &count);
    if (st == LM_OK) {
        int32_t vocab = lm_tokenizer_vocab_size(tok);
        printf("{\"out\":");
        cli_json_string(stdout, out, strlen(out));
        printf(",\"files\":%d,\"tokens\":%lld,\"vocab\":%d,\"dtype\":\"%s\"}\n", n, (long long)count, vocab,
               vocab <= 65536 ? "u16" : "i32");
    }
    lm_tokenizer_destroy(tok);
    free(inputs);
    return st == LM_OK ? 0 : cli_fail("data prepare", "failed", st);
}
