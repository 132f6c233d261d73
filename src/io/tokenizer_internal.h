/* io/tokenizer_internal.h — the parts of the tokenizer shared by its source files.
 *
 * tokenizer.c (public API, encode pipeline), tokenizer_load.c (tokenizer.json model
 * and options), tokenizer_added.c (added-token trie), tokenizer_pretok.c (normalizer
 * and pre-tokenizers), tokenizer_bpe.c (vocabulary/merge hash maps, BPE, word cache),
 * tokenizer_decode.c (byte-level tables, decode, stream, UTF-8 checks).
 * Invariants: ids are in [0, n_ids); every string handed between stages is valid
 * UTF-8 (checked once at the encode entry, so PCRE2 runs with NO_UTF_CHECK).
 */
#ifndef LOOM_IO_TOKENIZER_INTERNAL_H
#define LOOM_IO_TOKENIZER_INTERNAL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <jansson.h>
#include <pcre2.h>
#include <stdatomic.h>

#include "base/internal.h"
#include "loom/tokenizer.h"

#define LM__TOK_NONE UINT32_MAX   /* vocab.len[id] of an id outside the model vocabulary */
#define LM__TOK_CHAR_TABLE 0x800  /* code points with a direct single-char id table */
#define LM__TOK_MAX_IDS (1 << 26) /* sanity bound on ids (largest real vocabularies ~260k) */
#define LM__TOK_MAX_STEPS 256     /* pre-tokenizer steps (real files have up to 4); bounds the recursion */
#define LM__TOK_BATCH_EVENTS 1024 /* events a pre-tokenizer split step folds at a time */

/* id kinds (bit set in lm_tokenizer.kind) */
enum { LM__KIND_MODEL = 1, LM__KIND_ADDED = 2, LM__KIND_SPECIAL = 4 };

/* ---- small helpers ------------------------------------------------------------- */
uint64_t lm__tok_hash(const void *p, size_t n);

/* Classifies the UTF-8 sequence at s[0..n), n >= 1. Returns its length; *kind is 0 for
 * a complete valid character, 1 for an invalid maximal subpart (length >= 1), 2 for a
 * valid prefix cut by the end of the input (length n). */
size_t lm__utf8_next(const uint8_t *s, size_t n, int *kind);
/* Decodes one character of valid UTF-8; *len receives its byte length. */
static inline uint32_t lm__utf8_decode(const uint8_t *s, size_t *len) {
    uint8_t b = s[0];
    if (b < 0x80) return *len = 1, b;
    if (b < 0xE0) return *len = 2, ((uint32_t)(b & 0x1F) << 6) | (s[1] & 0x3F);
    if (b < 0xF0) return *len = 3, ((uint32_t)(b & 0x0F) << 12) | ((uint32_t)(s[1] & 0x3F) << 6) | (s[2] & 0x3F);
    *len = 4;
    return ((uint32_t)(b & 0x07) << 18) | ((uint32_t)(s[1] & 0x3F) << 12) | ((uint32_t)(s[2] & 0x3F) << 6) |
           (s[3] & 0x3F);
}

/* ---- model vocabulary: open-addressing map string -> id ------------------------------ */
typedef struct lm__tok_vocab {
    char *text;      /* [text_cap] token strings in tokenizer.json form, each followed by NUL */
    size_t text_len, text_cap;
    uint32_t *off;   /* [n_ids] offset of the id's token in text */
    uint32_t *len;   /* [n_ids] its byte length; LM__TOK_NONE: id not in the model vocabulary */
    uint64_t *slots; /* [mask + 1] (hash >> 32) << 32 | (id + 1); 0 = empty; load <= 1/2 */
    uint64_t mask;
    size_t count;
} lm__tok_vocab;

lm_status lm__tok_vocab_init(lm__tok_vocab *v, int32_t n_ids, size_t count, size_t text_bytes);
/* Adds (s, n) as id. LM_PARSE_ERROR when the id or the string is already present. */
lm_status lm__tok_vocab_add(lm__tok_vocab *v, int32_t id, const char *s, size_t n);
int32_t lm__tok_vocab_find(const lm__tok_vocab *v, const void *s, size_t n); /* -1 if absent */
void lm__tok_vocab_free(lm__tok_vocab *v);

/* ---- merges: (left id, right id) -> (rank, merged id) --------------------------------- */
typedef struct lm__tok_merges {
    uint64_t *keys;  /* [mask + 1] (left << 32) | right; UINT64_MAX = empty */
    uint32_t *rank;  /* [mask + 1] position in the merges list (lower merges first) */
    int32_t *merged; /* [mask + 1] id of the concatenated token */
    uint64_t mask;
    int shift; /* 64 - log2(mask + 1), for the multiplicative hash */
} lm__tok_merges;

lm_status lm__tok_merges_init(lm__tok_merges *m, size_t count);
/* A repeated pair overwrites the earlier entry (as Hugging Face's HashMap collect does). */
void lm__tok_merges_put(lm__tok_merges *m, int32_t left, int32_t right, uint32_t rank, int32_t merged);
void lm__tok_merges_free(lm__tok_merges *m);

/* ---- pre-tokenizer steps (a Sequence is flattened into these) -------------------------- */
typedef enum lm__tok_behavior {
    LM__SPLIT_REMOVED,
    LM__SPLIT_ISOLATED,
    LM__SPLIT_MERGED_WITH_PREVIOUS,
    LM__SPLIT_MERGED_WITH_NEXT,
    LM__SPLIT_CONTIGUOUS
} lm__tok_behavior;

typedef enum lm__tok_step_kind { LM__STEP_SPLIT, LM__STEP_PREFIX_SPACE } lm__tok_step_kind;

typedef struct lm__tok_step {
    lm__tok_step_kind kind;
    pcre2_code *re; /* owned; the split pattern (LM__STEP_SPLIT) */
    int jit;        /* 1 when pcre2_jit_compile succeeded */
    lm__tok_behavior behavior;
    int invert; /* flip which parts count as matches */
} lm__tok_step;

/* ---- added tokens ----------------------------------------------------------------------- */
typedef struct lm__tok_added {
    int32_t id;
    uint32_t off, len; /* content in lm_tokenizer.added_text */
    uint8_t single_word, lstrip, rstrip, normalized, special;
} lm__tok_added;

typedef struct lm__tok_trie_node {
    int32_t child;   /* first child node, -1 none */
    int32_t sibling; /* next node with the same parent, -1 none */
    int32_t token;   /* index in lm_tokenizer.added of the token ending here, -1 none */
    uint8_t byte;
} lm__tok_trie_node;

typedef struct lm__tok_trie {
    lm__tok_trie_node *nodes; /* [cap]; node 0 is the root */
    size_t count;
    int64_t cap; /* int64_t: lm__reserve's capacity type */
    int32_t first[256]; /* root's child per first byte (-1 none): skips most positions at once */
} lm__tok_trie;

/* ---- per-encode scratch state and word cache ------------------------------------------- */
typedef struct lm__tok_piece {
    size_t off, len; /* bytes in the current piece text */
} lm__tok_piece;

typedef struct lm__tok_event {
    size_t start, end;
    int match;
} lm__tok_event;

typedef struct lm__tok_heap_item {
    uint32_t rank, pos; /* ordered by rank, then leftmost position */
    int32_t merged;
} lm__tok_heap_item;

/* Scratch of one pre-tokenizer step while the steps run depth-first (tokenizer_pretok.c):
 * a batch of events of the piece being split, and the pieces folded from it. */
typedef struct lm__tok_level {
    lm__tok_event *ev;    /* [ev_cap] events of the piece being split, not yet folded */
    lm__tok_piece *piece; /* [piece_cap] pieces folded from one batch, offsets into that piece */
    uint8_t *text;        /* [text_cap] the piece with a space prepended (LM__STEP_PREFIX_SPACE) */
    int64_t ev_cap, piece_cap, text_cap; /* int64_t: lm__reserve's capacity type */
} lm__tok_level;

typedef struct lm__tok_cache_entry {
    uint64_t hash;
    uint32_t key_off, key_len; /* piece bytes in cache_keys */
    uint32_t ids_off, ids_len; /* ids in cache_ids */
} lm__tok_cache_entry;

typedef struct lm__tok_state {
    atomic_flag busy; /* claimed by the encode call using this state */
    pcre2_match_data *md;
    int32_t *ucs;  /* [ucs_cap] utf8proc workspace; NFC output is re-encoded in place */
    lm__tok_level *levels;  /* [n_levels] scratch of each pre-tokenizer step */
    int n_levels;           /* tok->n_steps */
    size_t batch_events;    /* events a split step reads at a time (LM__TOK_BATCH_EVENTS; tests vary it) */
    uint8_t *text2;         /* [text2_cap] lm__tok_pretokenize: the pieces' bytes, back to back */
    lm__tok_piece *pa;      /* [pa_cap] lm__tok_pretokenize: the pieces, offsets into text2 */
    uint8_t *word;          /* [word_cap] one piece in model (byte-level) form */
    int32_t *sym_id, *sym_prev, *sym_next; /* [sym_cap] BPE symbol linked list */
    lm__tok_heap_item *heap;               /* [heap_cap] pending merges */
    int32_t *out;                          /* [out_cap] ids of the current encode */
    /* int64_t: lm__reserve's capacity type */
    int64_t ucs_cap, text2_cap, pa_cap, word_cap, heap_cap, out_cap;
    size_t sym_cap;
    size_t n_out;
    /* word cache (absent in temporary states): fixed arenas, cleared when full */
    uint32_t *cache_slots; /* [LM__TOK_CACHE_SLOTS] entry + 1; 0 = empty */
    lm__tok_cache_entry *cache_entries; /* [LM__TOK_CACHE_ENTRIES] */
    uint8_t *cache_keys;                /* [LM__TOK_CACHE_KEY_BYTES] */
    int32_t *cache_ids;                 /* [LM__TOK_CACHE_IDS] */
    size_t cache_count, cache_key_used, cache_ids_used;
} lm__tok_state;

#define LM__TOK_CACHE_SLOTS (1u << 15)
#define LM__TOK_CACHE_ENTRIES (1u << 14)
#define LM__TOK_CACHE_KEY_BYTES (1u << 20)
#define LM__TOK_CACHE_IDS (1u << 18)
#define LM__TOK_CACHE_MAX_KEY 256 /* longer pieces are not cached */

/* ---- the tokenizer ------------------------------------------------------------------------ */
struct lm_tokenizer {
    int32_t n_ids;
    uint8_t *kind; /* [n_ids] LM__KIND_* bits; 0 = id without a token */
    lm__tok_vocab vocab;
    lm__tok_merges merges;
    int32_t char_id[LM__TOK_CHAR_TABLE]; /* id of the 1-char model token U+cp, -1 none */
    int32_t byte_id[256];                /* id of the byte-level char of byte b, -1 none */
    int32_t unk_id;                      /* -1: a character outside the vocabulary is an error */
    int fuse_unk, ignore_merges;
    int nfc;        /* normalizer: NFC */
    int byte_level; /* the last pre-tokenizer is ByteLevel: pieces become byte-level chars */
    lm__tok_step *steps; /* [n_steps] pre-tokenizer steps in order */
    int n_steps;
    pcre2_general_context *pcre_gctx; /* routes PCRE2 memory through lm__alloc */
    lm__tok_added *added; /* [n_added] in tokenizer.json order */
    int n_added;
    char *added_text;     /* [added_text_len] contents, each followed by NUL */
    size_t added_text_len;
    int32_t *added_of_id; /* [n_ids] index in added, -1 none */
    lm__tok_trie trie_raw;  /* tokens with normalized == false: matched on raw text */
    lm__tok_trie trie_norm; /* normalized tokens: matched on normalized text */
    uint16_t byte_cp[256];  /* byte-level map: byte -> code point (U+0021..U+0143) */
    uint8_t byte_utf8[256][2]; /* UTF-8 of byte_cp[b] (1 or 2 bytes; [1] = 0 when 1 byte) */
    char *dec_text;        /* [dec_off[n_ids]] the bytes each id decodes to */
    uint32_t *dec_off;     /* [n_ids + 1] */
    lm__tok_state *state;  /* shared encode scratch with the word cache */
};

/* tokenizer_load.c */
lm_status lm__tok_parse_model(lm_tokenizer *tok, json_t *root);
/* tokenizer_added.c */
lm_status lm__tok_parse_added(lm_tokenizer *tok, json_t *root);
lm_status lm__tok_build_tries(lm_tokenizer *tok);
void lm__tok_trie_free(lm__tok_trie *t);
/* Finds the next added-token match in s[*pos..n), honoring single_word/lstrip/rstrip
 * (lstrip never reaches before prev_end). Returns 1 and the span and id, or 0. */
int lm__tok_added_find(const lm_tokenizer *tok, const lm__tok_trie *t, const uint8_t *s, size_t n, size_t *pos,
                       size_t prev_end, size_t *start, size_t *end, int32_t *id);
/* tokenizer_pretok.c */
lm_status lm__tok_parse_normalizer(lm_tokenizer *tok, json_t *j);
lm_status lm__tok_parse_pretokenizer(lm_tokenizer *tok, json_t *j);
void lm__tok_steps_free(lm_tokenizer *tok);
/* NFC of s[0..n) into *ucs (grown as needed); *out points into *ucs or is s itself. */
lm_status lm__tok_nfc(const uint8_t *s, size_t n, int32_t **ucs, int64_t *ucs_cap, const uint8_t **out, size_t *out_n);
/* Receives one piece of the pre-tokenizer's output; p is valid only during the call. */
typedef lm_status (*lm__tok_piece_fn)(void *arg, const uint8_t *p, size_t n);
/* Runs the pre-tokenizer steps on s[0..n) and hands every resulting piece to fn, in
 * order, as it is made. The scratch (st->levels) holds a batch of events per step,
 * however long the text, unless one piece itself is long. */
lm_status lm__tok_pretokenize_each(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n,
                                   lm__tok_piece_fn fn, void *arg);
/* The same pieces gathered: copies of their bytes in *base (st->text2), the list in
 * st->pa[0..*count), offsets into *base. */
lm_status lm__tok_pretokenize(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n,
                              const uint8_t **base, size_t *count);
/* tokenizer_bpe.c */
lm_status lm__tok_state_create(const lm_tokenizer *tok, int with_cache, lm__tok_state **out);
void lm__tok_state_destroy(lm__tok_state *st);
/* Appends the ids of one pre-tokenized piece (raw bytes, before byte-level mapping). */
lm_status lm__tok_bpe_piece(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *p, size_t n);
lm_status lm__tok_push_id(lm__tok_state *st, int32_t id);
/* tokenizer_decode.c */
void lm__tok_byte_level_init(lm_tokenizer *tok);
lm_status lm__tok_parse_decoder(lm_tokenizer *tok, json_t *j);
lm_status lm__tok_build_decode_table(lm_tokenizer *tok);
/* 1 if s[0..n) is valid UTF-8; else 0 with *bad = offset of the first bad byte and
 * *truncated = 1 when the input ends inside a character. */
int lm__utf8_valid(const uint8_t *s, size_t n, size_t *bad, int *truncated);

#endif
