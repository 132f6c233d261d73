/* io/tokenizer.c — the public tokenizer API: loading, lookups and the encode pipeline.
 *
 * encode = validate UTF-8 -> cut out raw added tokens -> per gap: NFC -> cut out
 * normalized added tokens -> per gap: pre-tokenize -> BPE each piece (word cache).
 * Pieces go to BPE as the pre-tokenizer makes them and the ids to the caller in
 * batches, so an encode's scratch stays bounded however long the text (the NFC
 * workspace, 4 bytes per character of a text that is not already NFC, aside).
 * The tokenizer is immutable after load. The shared scratch state (with the word
 * cache) is claimed by one encode at a time through an atomic flag; a concurrent
 * encode builds a temporary cache-less state instead of waiting. Cost: linear in
 * the text plus O(w log w) per uncached piece of w bytes.
 */
#include "io/internal.h"
#include "io/tokenizer_internal.h"

#include <string.h>

static lm_status build(lm_tokenizer *tok, json_t *root) {
    if (!json_is_object(root)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: the top level is not an object");
    lm__tok_byte_level_init(tok);
    LM_TRY(lm__tok_parse_model(tok, root));
    LM_TRY(lm__tok_parse_added(tok, root));
    LM_TRY(lm__tok_parse_normalizer(tok, json_object_get(root, "normalizer")));
    LM_TRY(lm__tok_parse_pretokenizer(tok, json_object_get(root, "pre_tokenizer")));
    LM_TRY(lm__tok_parse_decoder(tok, json_object_get(root, "decoder")));
    LM_TRY(lm__tok_build_tries(tok));
    LM_TRY(lm__tok_build_decode_table(tok));
    return lm__tok_state_create(tok, 1, &tok->state);
}

lm_status lm_tokenizer_load_json(const char *json, size_t len, lm_tokenizer **out) {
    if (!out || (!json && len)) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_load_json: NULL argument");
    *out = NULL;
    json_error_t jerr;
    json_t *root = json_loadb(json ? json : "", len, 0, &jerr);
    if (!root)
        return lm__error(LM_PARSE_ERROR, "tokenizer.json: line %d, column %d: %s", jerr.line, jerr.column, jerr.text);
    lm_tokenizer *tok = lm__calloc(1, sizeof *tok);
    lm_status s = tok ? build(tok, root) : LM_OUT_OF_MEMORY;
    json_decref(root);
    if (s != LM_OK) {
        lm_tokenizer_destroy(tok);
        return s;
    }
    *out = tok;
    return LM_OK;
}

lm_status lm_tokenizer_load(const char *path, lm_tokenizer **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_load: NULL argument");
    *out = NULL;
    lm_file_map map;
    LM_TRY(lm_file_map_open(path, &map));
    lm_status s = lm_tokenizer_load_json((const char *)map.data, map.size, out);
    lm_file_map_close(&map);
    if (s != LM_OK) return lm__error_context(s, "'%s'", path);
    return LM_OK;
}

void lm_tokenizer_destroy(lm_tokenizer *tok) {
    if (!tok) return;
    lm__tok_state_destroy(tok->state);
    lm__tok_steps_free(tok);
    lm__tok_vocab_free(&tok->vocab);
    lm__tok_merges_free(&tok->merges);
    lm__tok_trie_free(&tok->trie_raw);
    lm__tok_trie_free(&tok->trie_norm);
    lm__free(tok->kind), lm__free(tok->added), lm__free(tok->added_text), lm__free(tok->added_of_id);
    lm__free(tok->dec_text), lm__free(tok->dec_off);
    lm__free(tok);
}

/* ---- lookups ------------------------------------------------------------------------- */
int32_t lm_tokenizer_vocab_size(const lm_tokenizer *tok) { return tok ? tok->n_ids : 0; }

int lm_tokenizer_is_special(const lm_tokenizer *tok, int32_t id) {
    return tok && id >= 0 && id < tok->n_ids && (tok->kind[id] & LM__KIND_SPECIAL) != 0;
}

static lm_status check_id(const lm_tokenizer *tok, int32_t id, const char *fn) {
    if (id < 0 || id >= tok->n_ids || !tok->kind[id])
        return lm__error(LM_OUT_OF_RANGE, "%s: id %d has no token (vocabulary of %d ids)", fn, id, tok->n_ids);
    return LM_OK;
}

lm_status lm_tokenizer_id_to_token(const lm_tokenizer *tok, int32_t id, const char **token, size_t *len) {
    if (!tok || !token) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_id_to_token: NULL argument");
    LM_TRY(check_id(tok, id, "lm_tokenizer_id_to_token"));
    if (tok->added_of_id[id] >= 0) {
        const lm__tok_added *a = &tok->added[tok->added_of_id[id]];
        *token = tok->added_text + a->off;
        if (len) *len = a->len;
    } else {
        *token = tok->vocab.text + tok->vocab.off[id];
        if (len) *len = tok->vocab.len[id];
    }
    return LM_OK;
}

lm_status lm_tokenizer_id_to_bytes(const lm_tokenizer *tok, int32_t id, const char **bytes, size_t *len) {
    if (!tok || !bytes || !len) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_id_to_bytes: NULL argument");
    LM_TRY(check_id(tok, id, "lm_tokenizer_id_to_bytes"));
    *bytes = tok->dec_text + tok->dec_off[id];
    *len = tok->dec_off[id + 1] - tok->dec_off[id];
    return LM_OK;
}

lm_status lm_tokenizer_token_to_id(const lm_tokenizer *tok, const char *token, size_t len, int32_t *id) {
    if (!tok || (!token && len) || !id)
        return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_token_to_id: NULL argument");
    for (int i = tok->n_added; i-- > 0;) { /* the last entry with this content wins, as in Hugging Face */
        const lm__tok_added *a = &tok->added[i];
        if (a->len == len && memcmp(tok->added_text + a->off, token, len) == 0) return *id = a->id, LM_OK;
    }
    *id = lm__tok_vocab_find(&tok->vocab, token ? token : "", len);
    if (*id < 0)
        return lm__error(LM_NOT_FOUND, "lm_tokenizer_token_to_id: '%.*s' is not a token", (int)LM_MIN(len, 200), token);
    return LM_OK;
}

/* ---- encode ------------------------------------------------------------------------------
 * The ids gather in st->out and go to the caller's sink whenever FLUSH_IDS of them are
 * there, and at the end; with the pre-tokenizer handing out its pieces one batch at a
 * time, the encode's scratch does not grow with the text. */
enum { FLUSH_IDS = 1 << 14 };

typedef struct encoder {
    const lm_tokenizer *tok;
    lm__tok_state *st;
    lm__tok_sink sink;
    void *arg;
} encoder;

static lm_status flush_ids(encoder *e, int all) {
    lm__tok_state *st = e->st;
    if (st->n_out == 0 || (!all && st->n_out < FLUSH_IDS)) return LM_OK;
    size_t n = st->n_out;
    st->n_out = 0;
    return e->sink(e->arg, st->out, n);
}

static lm_status encode_piece(void *arg, const uint8_t *p, size_t n) {
    encoder *e = arg;
    LM_TRY(lm__tok_bpe_piece(e->tok, e->st, p, n));
    return flush_ids(e, 0);
}

static lm_status push_added(encoder *e, int32_t id) {
    LM_TRY(lm__tok_push_id(e->st, id));
    return flush_ids(e, 0);
}

/* Text between raw added tokens: normalize, then cut out the normalized added tokens. */
static lm_status encode_segment(encoder *e, const uint8_t *s, size_t n) {
    if (!n) return LM_OK;
    const lm_tokenizer *tok = e->tok;
    const uint8_t *t = s;
    size_t m = n;
    if (tok->nfc) LM_TRY(lm__tok_nfc(s, n, &e->st->ucs, &e->st->ucs_cap, &t, &m));
    size_t pos = 0, prev = 0, ms, me;
    int32_t id;
    while (lm__tok_added_find(tok, &tok->trie_norm, t, m, &pos, prev, &ms, &me, &id)) {
        LM_TRY(lm__tok_pretokenize_each(tok, e->st, t + prev, ms - prev, encode_piece, e));
        LM_TRY(push_added(e, id));
        prev = me;
    }
    return lm__tok_pretokenize_each(tok, e->st, t + prev, m - prev, encode_piece, e);
}

static lm_status encode_text(encoder *e, const uint8_t *s, size_t n) {
    size_t pos = 0, prev = 0, ms, me;
    int32_t id;
    while (lm__tok_added_find(e->tok, &e->tok->trie_raw, s, n, &pos, prev, &ms, &me, &id)) {
        LM_TRY(encode_segment(e, s + prev, ms - prev));
        LM_TRY(push_added(e, id));
        prev = me;
    }
    LM_TRY(encode_segment(e, s + prev, n - prev));
    return flush_ids(e, 1);
}

/* Runs encode_text on the shared state when free, else on a temporary one. */
lm_status lm__tokenizer_encode_each(const lm_tokenizer *tok, const char *text, size_t len, lm__tok_sink sink,
                                    void *arg) {
    if (!tok || (!text && len) || !sink) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: NULL argument");
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    size_t bad;
    int truncated;
    if (!lm__utf8_valid(s, len, &bad, &truncated))
        return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: text is not valid UTF-8: %s at byte offset %zu",
                         truncated ? "truncated sequence" : "invalid byte sequence", bad);
    lm__tok_state *st = tok->state;
    int temporary = atomic_flag_test_and_set_explicit(&st->busy, memory_order_acquire);
    if (temporary) LM_TRY(lm__tok_state_create(tok, 0, &st));
    encoder e = {tok, st, sink, arg};
    st->n_out = 0;
    lm_status s2 = encode_text(&e, s, len);
    if (temporary) lm__tok_state_destroy(st);
    else atomic_flag_clear_explicit(&st->busy, memory_order_release);
    return s2;
}

typedef struct alloc_out {
    int32_t *ids; /* [cap] */
    int64_t cap;
    size_t n;
} alloc_out;

static lm_status append_ids(void *arg, const int32_t *ids, size_t n) {
    alloc_out *o = arg;
    if (!o->ids) { /* the first batch, often the only one, gets an exact allocation */
        if (!(o->ids = lm__alloc(n * sizeof *ids, 64))) return LM_OUT_OF_MEMORY;
        o->cap = (int64_t)n;
    }
    LM_TRY(lm__reserve((void **)&o->ids, &o->cap, (int64_t)(o->n + n), sizeof *o->ids));
    memcpy(o->ids + o->n, ids, n * sizeof *ids);
    o->n += n;
    return LM_OK;
}

lm_status lm_tokenizer_encode(const lm_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n) {
    if (!ids || !n) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: NULL argument");
    *ids = NULL, *n = 0;
    alloc_out o = {NULL, 0, 0};
    lm_status s = lm__tokenizer_encode_each(tok, text, len, append_ids, &o);
    if (s != LM_OK) {
        lm__free(o.ids);
        return s;
    }
    *ids = o.ids, *n = o.n;
    return LM_OK;
}

typedef struct buffer_out {
    int32_t *ids; /* [cap] the caller's */
    size_t cap, n;
} buffer_out;

static lm_status copy_ids(void *arg, const int32_t *ids, size_t n) {
    buffer_out *o = arg;
    if (o->n < o->cap) memcpy(o->ids + o->n, ids, LM_MIN(n, o->cap - o->n) * sizeof *ids);
    o->n += n;
    return LM_OK;
}

lm_status lm_tokenizer_encode_out(const lm_tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                                  size_t *n) {
    if (!n || (!ids && cap)) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode_out: NULL argument");
    *n = 0;
    buffer_out o = {ids, cap, 0};
    LM_TRY(lm__tokenizer_encode_each(tok, text, len, copy_ids, &o));
    *n = o.n;
    if (o.n > cap)
        return lm__error(LM_OUT_OF_RANGE, "lm_tokenizer_encode_out: the text needs %zu ids but the buffer holds %zu",
                         o.n, cap);
    return LM_OK;
}
