/* loom/tokenizer_train.h — training a byte-level BPE tokenizer from text, written as
 * a Hugging Face tokenizer.json that lm_tokenizer_load and HF `tokenizers` both load
 * and encode identically.
 *
 * Pipeline: the special tokens are cut out of the raw text (as encode does), the rest
 * is pre-tokenized with the preset's regex by the loader's own pre-tokenizer code,
 * distinct pieces are counted (in parallel), and BPE merges the most frequent
 * adjacent pair until the vocabulary is full. Ids follow Hugging Face's BpeTrainer:
 * the special tokens first (0..k-1, in the order given), then the 256 byte-level
 * symbols in code point order (GPT-2's byte order), then one id per new token in
 * merge order. Ties between pairs of equal count go to the smallest (left id,
 * right id), HF's rule, so the result is deterministic and independent of the
 * thread count. No normalizer (NFC is not applied).
 *
 * Pre-tokenizer presets (the exact JSON of the named real tokenizer.json files):
 *   "llama3" (default) Split(Llama 3 regex, digits in runs of 1-3) + ByteLevel
 *   "qwen2"            Split(Qwen2/2.5/3 regex, single digits) + ByteLevel
 *   "gpt2"             ByteLevel with GPT-2's built-in regex
 */
#ifndef LOOM_TOKENIZER_TRAIN_H
#define LOOM_TOKENIZER_TRAIN_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Training stages reported through the progress callback. */
typedef enum lm_tokenizer_train_stage {
    LM_TOKENIZER_TRAIN_COUNT = 0, /* reading and counting pieces */
    LM_TOKENIZER_TRAIN_MERGE = 1, /* learning merges */
    LM_TOKENIZER_TRAIN_DONE = 2   /* finished (reported once, before the JSON is built) */
} lm_tokenizer_train_stage;

typedef struct lm_tokenizer_train_progress {
    lm_tokenizer_train_stage stage;
    uint64_t bytes_done, bytes_total; /* corpus bytes counted so far / in all inputs */
    uint64_t pieces;                  /* pre-tokenized pieces counted so far */
    uint64_t words;                   /* distinct pieces (known once counting ends; 0 before) */
    int64_t merges_done, merges_max;  /* merges learned / the most vocab_size allows */
    double seconds;                   /* since the start of training */
} lm_tokenizer_train_progress;

/* Called on the calling thread at most every progress_interval seconds per stage,
 * and once at the end of each stage. */
typedef void (*lm_tokenizer_train_progress_fn)(void *user, const lm_tokenizer_train_progress *p);

typedef struct lm_tokenizer_train_options {
    int32_t vocab_size;                /* ids in all: specials + 256 byte symbols + merges */
    const char *const *special_tokens; /* [n_special] contents; they get ids 0..n_special-1 */
    int n_special;
    uint64_t min_frequency;            /* stop when the best pair occurs fewer times (0 = no limit) */
    const char *pretokenizer;          /* "llama3" (NULL means this), "qwen2" or "gpt2" */
    int n_threads;                     /* counting threads; <= 0: one per logical CPU */
    lm_tokenizer_train_progress_fn progress; /* may be NULL */
    void *progress_user;
    double progress_interval;          /* seconds between progress calls */
} lm_tokenizer_train_options;

/* vocab_size 32000, no special tokens, min_frequency 0, "llama3", all CPUs, no
 * progress callback, progress_interval 1.0. */
LM_API void lm_tokenizer_train_options_default(lm_tokenizer_train_options *o);

/* One input: a file (path != NULL) or a buffer data[0..len). Text must be UTF-8. */
typedef struct lm_tokenizer_train_input {
    const char *path;
    const char *data;
    size_t len;
} lm_tokenizer_train_input;

typedef struct lm_tokenizer_train_stats {
    int32_t vocab_size; /* ids in the result: the requested size unless `exhausted` */
    int64_t merges;     /* merges learned */
    uint64_t bytes;     /* corpus bytes */
    uint64_t pieces;    /* pre-tokenized pieces */
    uint64_t words;     /* distinct pieces */
    int exhausted;      /* 1: stopped early (no pair left, or the best one below min_frequency) */
    double seconds_count, seconds_merge; /* wall time of the two stages */
} lm_tokenizer_train_stats;

/* Trains on inputs[0..n_inputs) and returns the tokenizer.json text in *json (NUL-
 * terminated, *len bytes without the NUL, lm_malloc: free with lm_free). stats may
 * be NULL. Errors (the detail names the cause): LM_INVALID_ARGUMENT for a
 * vocab_size below 256 + n_special, empty/duplicate/invalid special tokens, an
 * unknown preset, text that is not UTF-8 (naming the input and byte offset) or a
 * corpus without any text outside the special tokens; LM_IO_ERROR for an unreadable
 * file. */
LM_API lm_status lm_tokenizer_train(const lm_tokenizer_train_input *inputs, int n_inputs,
                                    const lm_tokenizer_train_options *o, char **json, size_t *len,
                                    lm_tokenizer_train_stats *stats);
/* The same, written atomically to path (LM_IO_ERROR naming path when it cannot be). */
LM_API lm_status lm_tokenizer_train_write(const lm_tokenizer_train_input *inputs, int n_inputs,
                                          const lm_tokenizer_train_options *o, const char *path,
                                          lm_tokenizer_train_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
