/* io/tokenizer.c — the public tokenizer API: loading, lookups and the encode pipeline.
 *
 * encode = validate UTF-8 -> cut out raw added tokens -> per gap: NFC -> cut out
 * normalized added tokens -> per gap: pre-tokenize -> BPE each piece (word cache).
 * The tokenizer is immutable after load. The shared scratch state (with the word
 * cache) is claimed by one encode at a time through an atomic flag; a concurrent
 * encode builds a temporary cache-less state instead of waiting. Cost: linear in
 * the text plus O(w log w) per uncached piece of w bytes.
 */
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

/* ---- encode ------------------------------------------------------------------------------ */
static lm_status encode_pieces(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n) {
    if (!n) return LM_OK;
    const uint8_t *base;
    size_t count = 0;
    LM_TRY(lm__tok_pretokenize(tok, st, s, n, &base, &count));
    for (size_t i = 0; i < count; i++) LM_TRY(lm__tok_bpe_piece(tok, st, base + st->pa[i].off, st->pa[i].len));
    return LM_OK;
}

/* Text between raw added tokens: normalize, then cut out the normalized added tokens. */
static lm_status encode_segment(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n) {
    if (!n) return LM_OK;
    const uint8_t *t = s;
    size_t m = n;
    if (tok->nfc) LM_TRY(lm__tok_nfc(s, n, &st->ucs, &st->ucs_cap, &t, &m));
    size_t pos = 0, prev = 0, ms, me;
    int32_t id;
    while (lm__tok_added_find(tok, &tok->trie_norm, t, m, &pos, prev, &ms, &me, &id)) {
        LM_TRY(encode_pieces(tok, st, t + prev, ms - prev));
        LM_TRY(lm__tok_push_id(st, id));
        prev = me;
    }
    return encode_pieces(tok, st, t + prev, m - prev);
}

static lm_status encode_text(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *s, size_t n) {
    st->n_out = 0;
    size_t pos = 0, prev = 0, ms, me;
    int32_t id;
    while (lm__tok_added_find(tok, &tok->trie_raw, s, n, &pos, prev, &ms, &me, &id)) {
        LM_TRY(encode_segment(tok, st, s + prev, ms - prev));
        LM_TRY(lm__tok_push_id(st, id));
        prev = me;
    }
    return encode_segment(tok, st, s + prev, n - prev);
}

/* Runs encode_text on the shared state when free, else on a temporary one; then
 * hands the ids to deliver() while the state is still held. */
typedef lm_status (*deliver_fn)(const lm__tok_state *st, void *arg);

static lm_status encode_with(const lm_tokenizer *tok, const char *text, size_t len, deliver_fn deliver, void *arg) {
    if (!tok || (!text && len)) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: NULL argument");
    const uint8_t *s = (const uint8_t *)(text ? text : "");
    size_t bad;
    int truncated;
    if (!lm__utf8_valid(s, len, &bad, &truncated))
        return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: text is not valid UTF-8: %s at byte offset %zu",
                         truncated ? "truncated sequence" : "invalid byte sequence", bad);
    lm__tok_state *st = tok->state;
    int temporary = atomic_flag_test_and_set_explicit(&st->busy, memory_order_acquire);
    if (temporary) LM_TRY(lm__tok_state_create(tok, 0, &st));
    lm_status s2 = encode_text(tok, st, s, len);
    if (s2 == LM_OK) s2 = deliver(st, arg);
    if (temporary) lm__tok_state_destroy(st);
    else atomic_flag_clear_explicit(&st->busy, memory_order_release);
    return s2;
}

typedef struct alloc_out {
    int32_t **ids;
    size_t *n;
} alloc_out;

static lm_status deliver_alloc(const lm__tok_state *st, void *arg) {
    alloc_out *o = arg;
    if (st->n_out) {
        *o->ids = lm__alloc(st->n_out * sizeof(int32_t), 64);
        if (!*o->ids) return LM_OUT_OF_MEMORY;
        memcpy(*o->ids, st->out, st->n_out * sizeof(int32_t));
    }
    *o->n = st->n_out;
    return LM_OK;
}

lm_status lm_tokenizer_encode(const lm_tokenizer *tok, const char *text, size_t len, int32_t **ids, size_t *n) {
    if (!ids || !n) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode: NULL argument");
    *ids = NULL, *n = 0;
    alloc_out o = {ids, n};
    return encode_with(tok, text, len, deliver_alloc, &o);
}

typedef struct buffer_out {
    int32_t *ids;
    size_t cap, *n;
} buffer_out;

static lm_status deliver_buffer(const lm__tok_state *st, void *arg) {
    buffer_out *o = arg;
    *o->n = st->n_out;
    if (st->n_out && o->cap) memcpy(o->ids, st->out, LM_MIN(st->n_out, o->cap) * sizeof(int32_t));
    if (st->n_out > o->cap)
        return lm__error(LM_OUT_OF_RANGE, "lm_tokenizer_encode_out: the text needs %zu ids but the buffer holds %zu",
                         st->n_out, o->cap);
    return LM_OK;
}

lm_status lm_tokenizer_encode_out(const lm_tokenizer *tok, const char *text, size_t len, int32_t *ids, size_t cap,
                                  size_t *n) {
    if (!n || (!ids && cap)) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_encode_out: NULL argument");
    *n = 0;
    buffer_out o = {ids, cap, n};
    return encode_with(tok, text, len, deliver_buffer, &o);
}
