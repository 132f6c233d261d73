/* tools/loom/cmd_tokenizer.c — `loom tokenizer train`: learns a byte-level BPE
 * tokenizer from text files (loom/tokenizer_train.h) and writes it atomically as a
 * Hugging Face tokenizer.json. Progress goes to stderr (one updating line on a
 * terminal, a line every 10 s otherwise); a JSON summary line goes to stdout. */
#include "args.h"
#include "commands.h"
#include "common.h"
#include "loom/io_write.h"
#include "loom/tokenizer_train.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static const char *k_synopsis =
    "--vocab N [--special TOKEN]... [--min-frequency F] [--pretokenizer llama3|qwen2|gpt2] [--threads N] "
    "FILE... -o tokenizer.json";

typedef struct progress_line {
    int tty, printed;
} progress_line;

static void on_progress(void *user, const lm_tokenizer_train_progress *p) {
    progress_line *pl = user;
    if (p->seconds < 1.0) return; /* short runs stay quiet */
    const double mb = 1.0 / (1 << 20);
    if (p->stage == LM_TOKENIZER_TRAIN_COUNT)
        fprintf(stderr, "%sloom tokenizer train: [%.0fs] counting %.1f/%.1f MB, %llu pieces, %llu distinct%s",
                pl->tty ? "\r" : "", p->seconds, (double)p->bytes_done * mb, (double)p->bytes_total * mb,
                (unsigned long long)p->pieces, (unsigned long long)p->words, pl->tty ? "\033[K" : "\n");
    else
        fprintf(stderr, "%sloom tokenizer train: [%.0fs] %llu distinct pieces, merges %lld/%lld%s",
                pl->tty ? "\r" : "", p->seconds, (unsigned long long)p->words, (long long)p->merges_done,
                (long long)p->merges_max, pl->tty ? "\033[K" : "\n");
    pl->printed = 1;
    fflush(stderr);
}

/* Moves every "--special X" / "--special=X" out of argv into specials. Returns the
 * remaining count, or -1 on a missing value. */
static int take_specials(int argc, char **argv, char **rest, const char **specials, int *n_special) {
    int n = 0;
    *n_special = 0;
    for (int i = 0; i < argc; i++) {
        if (strcmp(argv[i], "--special") == 0) {
            if (i + 1 >= argc) return -1;
            specials[(*n_special)++] = argv[++i];
        } else if (strncmp(argv[i], "--special=", 10) == 0) {
            specials[(*n_special)++] = argv[i] + 10;
        } else {
            rest[n++] = argv[i];
        }
    }
    return n;
}

static int train(int argc, char **argv) {
    lm_tokenizer_train_options o;
    lm_tokenizer_train_options_default(&o);
    int vocab = 0, threads = 0, quiet = 0;
    uint64_t min_freq = 0;
    const char *out = NULL, *pretok = "llama3", *special_help = NULL;
    const cli_opt opts[] = {
        {"vocab", CLI_INT, &vocab, "N: vocabulary size: special tokens + 256 byte symbols + merges (required)"},
        {"special", CLI_STRING, &special_help, "TOKEN: a special token (repeatable); ids 0, 1, ... in order given"},
        {"min-frequency", CLI_U64, &min_freq, "F: stop merging when the best pair occurs fewer than F times"},
        {"pretokenizer", CLI_STRING, &pretok, "NAME: llama3 (default: Llama 3 regex), qwen2 or gpt2"},
        {"threads", CLI_INT, &threads, "N: threads for counting (default: all CPUs)"},
        {"output", CLI_STRING, &out, "FILE: the tokenizer.json to write (also -o; required)"},
        {"quiet", CLI_FLAG, &quiet, "no progress on stderr"},
        {NULL, 0, NULL, NULL}};
    char **rest = malloc(sizeof(char *) * (size_t)(argc + 1));
    const char **specials = malloc(sizeof(char *) * (size_t)(argc + 1));
    const char **files = malloc(sizeof(char *) * (size_t)(argc + 1));
    lm_tokenizer_train_input *inputs = calloc((size_t)argc + 1, sizeof *inputs);
    int rc = 0, n_special = 0, nfiles = 0;
    if (!rest || !specials || !files || !inputs) {
        fprintf(stderr, "loom tokenizer train: out of memory\n");
        rc = 1;
        goto done;
    }
    int nrest = take_specials(argc, argv, rest, specials, &n_special);
    if (nrest < 0) {
        fprintf(stderr, "loom tokenizer train: --special needs a value\n");
        rc = 2;
        goto done;
    }
    rc = cli_parse("tokenizer train", k_synopsis, opts, nrest, rest, files, argc, &nfiles);
    if (rc) {
        rc = rc == 1 ? 0 : rc;
        goto done;
    }
    if (vocab <= 0 || !out || nfiles < 1) {
        fprintf(stderr, "loom tokenizer train: --vocab N, -o FILE and at least one input file are required\n");
        rc = 2;
        goto done;
    }
    /* fail before a long training when the output cannot be written */
    lm_atomic_file *probe = NULL;
    lm_status st = lm_atomic_file_open(out, &probe);
    if (st != LM_OK) {
        rc = cli_fail("tokenizer train", "output not writable", st);
        goto done;
    }
    lm_atomic_file_abort(probe);
    for (int i = 0; i < nfiles; i++) inputs[i].path = files[i];
    progress_line pl = {isatty(2), 0};
    o.vocab_size = vocab;
    o.special_tokens = specials;
    o.n_special = n_special;
    o.min_frequency = min_freq;
    o.pretokenizer = pretok;
    o.n_threads = threads;
    o.progress = quiet ? NULL : on_progress;
    o.progress_user = &pl;
    o.progress_interval = pl.tty ? 0.5 : 10.0;
    lm_tokenizer_train_stats stats;
    st = lm_tokenizer_train_write(inputs, nfiles, &o, out, &stats);
    if (pl.printed && pl.tty) fputc('\n', stderr);
    if (st != LM_OK) {
        rc = cli_fail("tokenizer train", "training failed", st);
        goto done;
    }
    if (stats.exhausted && stats.vocab_size < vocab)
        fprintf(stderr, "loom tokenizer train: note: vocabulary stopped at %d ids (%s)\n", stats.vocab_size,
                min_freq > 1 ? "no pair left at --min-frequency" : "no pair left to merge");
    printf("{\"out\":");
    cli_json_string(stdout, out, strlen(out));
    printf(",\"vocab_size\":%d,\"merges\":%lld,\"special\":%d,\"bytes\":%llu,\"pieces\":%llu,\"words\":%llu,"
           "\"exhausted\":%s,\"seconds_count\":%.3f,\"seconds_merge\":%.3f}\n",
           stats.vocab_size, (long long)stats.merges, n_special, (unsigned long long)stats.bytes,
           (unsigned long long)stats.pieces, (unsigned long long)stats.words, stats.exhausted ? "true" : "false",
           stats.seconds_count, stats.seconds_merge);
done:
    free(rest), free(specials), free(files), free(inputs);
    return rc;
}

int cmd_tokenizer(int argc, char **argv) {
    if (argc >= 1 && strcmp(argv[0], "train") == 0) return train(argc - 1, argv + 1);
    int help = argc >= 1 && (!strcmp(argv[0], "--help") || !strcmp(argv[0], "-h"));
    fprintf(help ? stdout : stderr, "usage: loom tokenizer train %s\n(run 'loom tokenizer train --help' for options)\n",
            k_synopsis);
    return help ? 0 : 2;
}
