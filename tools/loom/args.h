/* tools/loom/args.h — a small long-option parser for the loom subcommands.
 *
 * Each subcommand declares a table of options (name, kind, destination, help); the
 * parser accepts "--name value" and "--name=value", rejects unknown options and bad
 * numbers with a message naming the option, and prints the table as help text.
 */
#ifndef LOOM_CLI_ARGS_H
#define LOOM_CLI_ARGS_H

#include <stdint.h>
#include <stdio.h>

/* CLI_COUNT and CLI_NONNEG are CLI_INT and CLI_FLOAT that refuse negative values
 * (thread counts, sizes, temperatures), naming the option and the value. */
typedef enum cli_kind { CLI_FLAG, CLI_STRING, CLI_INT, CLI_FLOAT, CLI_U64, CLI_COUNT, CLI_NONNEG } cli_kind;

typedef struct cli_opt {
    const char *name; /* without the leading "--" */
    cli_kind kind;
    void *dest;       /* int* (FLAG/INT/COUNT), const char** (STRING), float* (FLOAT/NONNEG), uint64_t* (U64) */
    const char *help; /* one line; "VALUE: text" shows the value's name */
} cli_opt;

/* Parses argv[0..argc) against opts (terminated by a {NULL} entry). Positional
 * arguments are stored in positional[0..*npositional) up to max_positional. "-o X" is
 * "--out X" (or "--output X") in a table that has such an option.
 * Returns 0 on success, prints an error to stderr and returns 2 otherwise. "--help"
 * prints usage to stdout and returns 1. */
int cli_parse(const char *cmd, const char *synopsis, const cli_opt *opts, int argc, char **argv,
              const char **positional, int max_positional, int *npositional);
void cli_usage(FILE *f, const char *cmd, const char *synopsis, const cli_opt *opts);
/* Parses "1,2,3" into a new malloc'd int32 array; returns 0 and prints an error on failure
 * (an empty entry, e.g. a trailing comma, is an error). */
int cli_parse_ids(const char *text, int32_t **ids, size_t *n);

#endif
