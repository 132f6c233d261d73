/* loom/tokenizer.h — Hugging Face tokenizer.json byte-level BPE tokenizers
 * (Llama 3, Qwen2/2.5/3, DeepSeek V3 and their relatives).
 *
 * Pipeline of encode, as in Hugging Face `tokenizers` with add_special_tokens=False:
 * added tokens are cut out of the raw text first (longest match at the leftmost
 * position); the text between them is normalized (NFC), pre-tokenized (regex splits,
 * digits, byte-level mapping) and each piece is merged by BPE. The post-processor
 * (BOS/EOS templates) is NOT applied: callers add special tokens explicitly.
 *
 * Supported components (anything else is LM_UNSUPPORTED, naming it): normalizer
 * null / NFC / Sequence; pre_tokenizer Split (Regex or String, any behavior, invert),
 * Digits, ByteLevel (must be last), Sequence; model BPE (both merges forms,
 * ignore_merges, unk_token/fuse_unk); decoder ByteLevel; added tokens with their
 * single_word / lstrip / rstrip / normalized / special flags.
 *
 * Ids are int32 in [0, lm_tokenizer_vocab_size()). Text in and out is UTF-8;
 * encode rejects invalid UTF-8 with LM_INVALID_ARGUMENT naming the byte offset.
 *
 * Thread safety: a loaded tokenizer is immutable; every function that takes a
 * `const lm_tokenizer *` may run concurrently from any number of threads. Encode
 * keeps a word cache: one caller at a time uses it (claimed with an atomic flag);
 * a concurrent caller uses private scratch state without the cache, so results
 * never differ, only speed. A stream decoder belongs to one thread at a time.
 */
#ifndef LOOM_TOKENIZER_H
#define LOOM_TOKENIZER_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_tokenizer lm_tokenizer;

/* Loads a tokenizer.json file. Errors: LM_IO_ERROR (file), LM_PARSE_ERROR (bad JSON or
 * inconsistent vocabulary/merges), LM_UNSUPPORTED (a component type or option loom
 * does not implement; the detail names it). The caller owns *out. */
LM_API lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out);
/* The same from a JSON text of len bytes (need not be NUL-terminated). */
LM_API lm_status lm_tokenizer_load_json(const char *json, size_t len, lm_tokenizer **out);
LM_API void lm_tokenizer_destroy(lm_tokenizer *tok); /* accepts NULL */

/* Number of id slots: max id + 1 over the model vocabulary and the added tokens.
 * 0 for NULL. */
LM_API int32_t lm_tokenizer_vocab_size(const lm_tokenizer *tok);

/* Encodes len bytes of UTF-8 text. *ids is allocated with lm_malloc (caller frees
 * with lm_free; NULL when *n == 0). */
LM_API lm_status lm_tokenizer_encode(const lm_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n);
/* Encodes into a caller buffer of cap ids. *n receives the number of ids the text
 * needs; when that exceeds cap the first cap ids are written and LM_OUT_OF_RANGE
 * is returned. */
LM_API lm_status lm_tokenizer_encode_out(const lm_tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                                         size_t *n);

/* Decode flags. */
enum {
    LM_TOKENIZER_SKIP_SPECIAL = 1, /* drop ids of added tokens marked "special" */
    LM_TOKENIZER_LOSSY = 2         /* replace invalid UTF-8 with U+FFFD (as HF decode does) */
};

/* Concatenates the bytes of ids[0..n). Without LM_TOKENIZER_LOSSY the result is the
 * exact byte string, which may be invalid UTF-8 when a multi-byte character is cut
 * between ids. *text is NUL-terminated (the NUL is not counted in *len), allocated
 * with lm_malloc. An id without a token is LM_OUT_OF_RANGE. */
LM_API lm_status lm_tokenizer_decode(const lm_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char **text,
                                     size_t *len);

/* The token string of id as stored in tokenizer.json (byte-level form, e.g. "Ġthe";
 * added tokens give their content). Borrowed, NUL-terminated, valid while tok lives.
 * Errors: LM_OUT_OF_RANGE. */
LM_API lm_status lm_tokenizer_id_to_token(const lm_tokenizer *tok, int32_t id, const char **token, size_t *len);
/* The raw bytes id decodes to (e.g. " the"). Borrowed, valid while tok lives. */
LM_API lm_status lm_tokenizer_id_to_bytes(const lm_tokenizer *tok, int32_t id, const char **bytes, size_t *len);
/* Looks up a token string (added-token content first, then the model vocabulary in
 * its tokenizer.json form). Errors: LM_NOT_FOUND. */
LM_API lm_status lm_tokenizer_token_to_id(const lm_tokenizer *tok, const char *token, size_t len, int32_t *id);
/* 1 if id is an added token marked "special", else 0 (also for invalid ids). */
LM_API int lm_tokenizer_is_special(const lm_tokenizer *tok, int32_t id);

/* ---- streaming decoder --------------------------------------------------------
 * Turns ids arriving one at a time (generation) into text that is always complete
 * UTF-8: bytes of a character cut between ids are held back until it completes.
 * Invalid sequences become U+FFFD exactly as LM_TOKENIZER_LOSSY decode would, so the
 * concatenation of all outputs plus the flush equals lossy decode of all ids. */
typedef struct lm_tokenizer_stream lm_tokenizer_stream;

/* flags: LM_TOKENIZER_SKIP_SPECIAL or 0. The stream borrows tok (must outlive it). */
LM_API lm_status lm_tokenizer_stream_create(const lm_tokenizer *tok, unsigned flags, lm_tokenizer_stream **out);
LM_API void lm_tokenizer_stream_destroy(lm_tokenizer_stream *s); /* accepts NULL */
/* Adds one id; *text and *len receive the newly completed text (possibly empty). The
 * buffer is owned by the stream and valid until its next call. On error the
 * stream is unchanged. */
LM_API lm_status lm_tokenizer_stream_push(lm_tokenizer_stream *s, int32_t id, const char **text, size_t *len);
/* Ends the sequence: returns the held-back bytes (an incomplete character becomes
 * U+FFFD) and resets the stream for a new sequence. */
LM_API lm_status lm_tokenizer_stream_flush(lm_tokenizer_stream *s, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
