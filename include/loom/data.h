/* loom/data.h — training data: a seeded random number generator, token shards (the
 * output of `loom data prepare`) and a shuffling, resumable data loader over them.
 *
 * Token shard file format (little-endian), 32-byte header then the tokens:
 *   [0, 8)   magic "LMTOKENS"
 *   [8, 12)  u32 version (1)
 *   [12, 16) u32 token dtype: 1 = u16, 2 = i32 (lm_token_dtype)
 *   [16, 24) u64 token count n
 *   [24, 32) u64 vocabulary size V (every token is < V; 0 = not recorded)
 *   [32, ..) n tokens; the file is exactly 32 + n * element size bytes
 *
 * The loader cuts each shard into windows of seq + 1 consecutive tokens starting at
 * multiples of seq (inputs are the first seq, targets the last seq: the next-token
 * pairs), and serves them in a permutation drawn per epoch from its RNG (or in file
 * order when shuffle is off). Its whole position is a small value (RNG state at the
 * start of the epoch, epoch, cursor) that a checkpoint stores: restoring it replays
 * exactly the same batches.
 */
#ifndef LOOM_DATA_H
#define LOOM_DATA_H

#include "loom/base.h"
#include "loom/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- token shards ---------------------------------------------------------------------------- */
typedef enum lm_token_dtype { LM_TOKENS_U16 = 1, LM_TOKENS_I32 = 2 } lm_token_dtype;

#define LM_TOKEN_SHARD_MAGIC "LMTOKENS"
#define LM_TOKEN_SHARD_VERSION 1u
#define LM_TOKEN_SHARD_HEADER 32

/* Writes ids[0..n) atomically, as u16 when 1 <= vocab_size <= 65536, else i32. Every
 * id must lie in [0, vocab_size) (any non-negative int32 when vocab_size is 0). */
LM_API lm_status lm_token_shard_write(const char *path, const int32_t *ids, int64_t n, int64_t vocab_size);

typedef struct lm_token_shard lm_token_shard;
/* Maps and validates a shard. Errors: LM_IO_ERROR; LM_PARSE_ERROR naming the file and
 * the field (bad magic, unsupported version or dtype, a size that disagrees with the
 * count, a token outside [0, V) naming its index). Caller owns *out. */
LM_API lm_status lm_token_shard_open(const char *path, lm_token_shard **out);
LM_API void lm_token_shard_close(lm_token_shard *s); /* accepts NULL */
LM_API int64_t lm_token_shard_count(const lm_token_shard *s);
LM_API int64_t lm_token_shard_vocab(const lm_token_shard *s);
LM_API lm_token_dtype lm_token_shard_dtype(const lm_token_shard *s);
/* out[0..n) = tokens [start, start + n); LM_OUT_OF_RANGE outside the shard. */
LM_API lm_status lm_token_shard_read(const lm_token_shard *s, int64_t start, int64_t n, int32_t *out);

/* Tokenizes each input file (UTF-8 text, read whole) and writes one shard to out.
 * separator_id >= 0 is appended after every file (e.g. an end-of-text id); -1 for
 * none. *count receives the number of tokens written (may be NULL). */
LM_API lm_status lm_data_prepare(const lm_tokenizer *tok, int nfiles, const char *const *inputs, int32_t separator_id,
                                 const char *out, int64_t *count);

/* ---- data loader -------------------------------------------------------------------------------- */
typedef struct lm_data_loader_state {
    uint64_t rng[4]; /* RNG state at the start of the current epoch */
    int64_t epoch;   /* 0-based */
    int64_t cursor;  /* windows of this epoch already served */
} lm_data_loader_state;

typedef struct lm_data_loader lm_data_loader;

/* Windows of seq + 1 tokens over the shards at paths[0..n). LM_INVALID_ARGUMENT when
 * no shard holds seq + 1 tokens. Caller owns *out. */
LM_API lm_status lm_data_loader_create(int n, const char *const *paths, int64_t seq, uint64_t seed, int shuffle,
                                       lm_data_loader **out);
LM_API void lm_data_loader_destroy(lm_data_loader *dl); /* accepts NULL */
LM_API int64_t lm_data_loader_windows(const lm_data_loader *dl); /* per epoch */
LM_API int64_t lm_data_loader_vocab(const lm_data_loader *dl);   /* largest vocabulary size of the shards */
/* The next `batch` windows: inputs and targets, each [batch, seq] row-major. Crossing
 * the end of an epoch starts the next one (reshuffled). */
LM_API lm_status lm_data_loader_next(lm_data_loader *dl, int batch, int32_t *inputs, int32_t *targets);
LM_API lm_data_loader_state lm_data_loader_get_state(const lm_data_loader *dl);
/* LM_OUT_OF_RANGE when the cursor exceeds the windows per epoch (a state of another
 * data set). */
LM_API lm_status lm_data_loader_set_state(lm_data_loader *dl, const lm_data_loader_state *st);
/* Back to the first batch of epoch 0. */
LM_API void lm_data_loader_rewind(lm_data_loader *dl);

#ifdef __cplusplus
}
#endif
#endif
