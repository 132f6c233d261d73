/* io/tokenizer_decode.c — byte-level tables, ids -> bytes, the streaming decoder and
 * UTF-8 checks.
 *
 * GPT-2's byte-level map sends the 188 printable bytes ('!'..'~', 0xA1..0xAC,
 * 0xAE..0xFF) to the code point of the same value and the other 68 bytes, in order,
 * to U+0100..U+0143. Each id's decoded bytes are computed once at load: a model token
 * whose characters all lie in the map becomes those bytes, any other model token its
 * own UTF-8 (Hugging Face's ByteLevel decoder rule), an added token its content.
 * Invalid UTF-8 is replaced per maximal subpart (Unicode/W3C practice, as Rust's
 * from_utf8_lossy does), so lossy decode and the stream agree byte for byte.
 */
#include "io/tokenizer_internal.h"

#include <string.h>

void lm__tok_byte_level_init(lm_tokenizer *tok) {
    uint32_t next = 256;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        uint32_t cp = printable ? (uint32_t)b : next++;
        tok->byte_cp[b] = (uint16_t)cp;
        if (cp < 0x80) {
            tok->byte_utf8[b][0] = (uint8_t)cp, tok->byte_utf8[b][1] = 0;
        } else {
            tok->byte_utf8[b][0] = (uint8_t)(0xC0 | (cp >> 6));
            tok->byte_utf8[b][1] = (uint8_t)(0x80 | (cp & 0x3F));
        }
    }
}

lm_status lm__tok_parse_decoder(lm_tokenizer *tok, json_t *j) {
    (void)tok;
    const char *type = json_is_object(j) ? json_string_value(json_object_get(j, "type")) : NULL;
    if (!json_is_object(j))
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: decoder %s is not supported (supported: ByteLevel)",
                         json_is_null(j) || !j ? "null" : "of this form");
    if (!type || strcmp(type, "ByteLevel") != 0)
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: decoder type '%s' is not supported (supported: ByteLevel)",
                         type ? type : "(missing)");
    return LM_OK;
}

/* Byte-level decode of one model token: 1 and the bytes in out[0..*n) if every
 * character is in the byte-level map, else 0. */
static int token_to_bytes(const uint8_t inv[0x144 + 1], const uint8_t *s, size_t len, uint8_t *out, size_t *n) {
    size_t k = 0;
    for (size_t i = 0, clen; i < len; i += clen) {
        uint32_t cp = lm__utf8_decode(s + i, &clen);
        if (cp > 0x143 || !inv[cp]) return 0;
        out[k++] = (uint8_t)(inv[cp] - 1);
    }
    *n = k;
    return 1;
}

lm_status lm__tok_build_decode_table(lm_tokenizer *tok) {
    uint8_t inv[0x144 + 1] = {0}; /* code point -> byte + 1; 0 = not a byte-level char */
    for (int b = 0; b < 256; b++) inv[tok->byte_cp[b]] = (uint8_t)(b + 1);
    size_t total = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        if (tok->added_of_id[id] >= 0) total += tok->added[tok->added_of_id[id]].len;
        else if (tok->vocab.len[id] != LM__TOK_NONE) total += tok->vocab.len[id];
    }
    if (total >= UINT32_MAX) return lm__error(LM_PARSE_ERROR, "tokenizer.json: vocabulary too large");
    tok->dec_off = lm__alloc(((size_t)tok->n_ids + 1) * sizeof(uint32_t), 64);
    tok->dec_text = lm__alloc(total + 1, 16);
    if (!tok->dec_off || !tok->dec_text) return LM_OUT_OF_MEMORY;
    size_t at = 0;
    for (int32_t id = 0; id < tok->n_ids; id++) {
        tok->dec_off[id] = (uint32_t)at;
        uint8_t *dst = (uint8_t *)tok->dec_text + at;
        if (tok->added_of_id[id] >= 0) {
            const lm__tok_added *a = &tok->added[tok->added_of_id[id]];
            memcpy(dst, tok->added_text + a->off, a->len);
            at += a->len;
        } else if (tok->vocab.len[id] != LM__TOK_NONE) {
            const uint8_t *s = (const uint8_t *)tok->vocab.text + tok->vocab.off[id];
            size_t len = tok->vocab.len[id], n;
            if (!token_to_bytes(inv, s, len, dst, &n)) memcpy(dst, s, n = len);
            at += n;
        }
    }
    tok->dec_off[tok->n_ids] = (uint32_t)at;
    return LM_OK;
}

/* ---- UTF-8 ------------------------------------------------------------------------------- */
size_t lm__utf8_next(const uint8_t *s, size_t n, int *kind) {
    uint8_t b = s[0], lo = 0x80, hi = 0xBF;
    size_t need;
    if (b < 0x80) return *kind = 0, 1;
    if (b >= 0xC2 && b <= 0xDF) need = 1;
    else if (b == 0xE0) need = 2, lo = 0xA0;            /* no overlong 3-byte forms */
    else if (b == 0xED) need = 2, hi = 0x9F;            /* no surrogates */
    else if (b >= 0xE1 && b <= 0xEF) need = 2;
    else if (b == 0xF0) need = 3, lo = 0x90;            /* no overlong 4-byte forms */
    else if (b >= 0xF1 && b <= 0xF3) need = 3;
    else if (b == 0xF4) need = 3, hi = 0x8F;            /* nothing above U+10FFFF */
    else return *kind = 1, 1;                           /* continuation, C0/C1, F5..FF */
    for (size_t i = 1; i <= need; i++) {
        if (i >= n) return *kind = 2, n;
        if (s[i] < lo || s[i] > hi) return *kind = 1, i;
        lo = 0x80, hi = 0xBF;
    }
    return *kind = 0, need + 1;
}

int lm__utf8_valid(const uint8_t *s, size_t n, size_t *bad, int *truncated) {
    size_t i = 0;
    while (i < n) {
        if (i + 8 <= n) { /* skip ASCII 8 bytes at a time */
            uint64_t w;
            memcpy(&w, s + i, 8);
            if (!(w & 0x8080808080808080ull)) {
                i += 8;
                continue;
            }
        }
        int kind;
        size_t len = lm__utf8_next(s + i, n - i, &kind);
        if (kind) {
            *bad = i;
            *truncated = kind == 2;
            return 0;
        }
        i += len;
    }
    return 1;
}

/* Appends s[0..n) to out with invalid subparts replaced by U+FFFD (out needs 3n
 * bytes). With final == 0 a valid prefix cut at the end is left unconsumed.
 * Returns the bytes consumed; *out_n grows by the bytes written. */
static size_t utf8_lossy(const uint8_t *s, size_t n, int final, uint8_t *out, size_t *out_n) {
    size_t i = 0, o = *out_n;
    while (i < n) {
        int kind;
        size_t len = lm__utf8_next(s + i, n - i, &kind);
        if (kind == 2 && !final) break;
        if (kind == 0) {
            memcpy(out + o, s + i, len);
            o += len;
        } else {
            memcpy(out + o, "\xEF\xBF\xBD", 3);
            o += 3;
        }
        i += len;
    }
    *out_n = o;
    return i;
}

/* ---- decode --------------------------------------------------------------------------- */
static int valid_id(const lm_tokenizer *tok, int32_t id) { return id >= 0 && id < tok->n_ids && tok->kind[id]; }

static int skipped(const lm_tokenizer *tok, int32_t id, unsigned flags) {
    return (flags & LM_TOKENIZER_SKIP_SPECIAL) && (tok->kind[id] & LM__KIND_SPECIAL);
}

lm_status lm_tokenizer_decode(const lm_tokenizer *tok, const int32_t *ids, size_t n, unsigned flags, char **text,
                              size_t *len) {
    if (!tok || (!ids && n) || !text || !len)
        return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_decode: NULL argument");
    *text = NULL, *len = 0;
    size_t total = 0;
    for (size_t i = 0; i < n; i++) {
        if (!valid_id(tok, ids[i]))
            return lm__error(LM_OUT_OF_RANGE, "lm_tokenizer_decode: ids[%zu] = %d has no token (vocabulary of %d ids)",
                             i, ids[i], tok->n_ids);
        if (!skipped(tok, ids[i], flags)) total += tok->dec_off[ids[i] + 1] - tok->dec_off[ids[i]];
    }
    uint8_t *raw = lm__alloc(total + 1, 16);
    if (!raw) return LM_OUT_OF_MEMORY;
    size_t at = 0;
    for (size_t i = 0; i < n; i++) {
        if (skipped(tok, ids[i], flags)) continue;
        size_t k = tok->dec_off[ids[i] + 1] - tok->dec_off[ids[i]];
        memcpy(raw + at, tok->dec_text + tok->dec_off[ids[i]], k);
        at += k;
    }
    size_t bad;
    int trunc;
    if ((flags & LM_TOKENIZER_LOSSY) && !lm__utf8_valid(raw, total, &bad, &trunc)) {
        uint8_t *fixed = lm__alloc(3 * total + 1, 16);
        if (!fixed) {
            lm__free(raw);
            return LM_OUT_OF_MEMORY;
        }
        at = 0;
        utf8_lossy(raw, total, 1, fixed, &at);
        lm__free(raw);
        raw = fixed;
    }
    raw[at] = '\0';
    *text = (char *)raw;
    *len = at;
    return LM_OK;
}

/* ---- streaming decoder ------------------------------------------------------------------ */
struct lm_tokenizer_stream {
    const lm_tokenizer *tok; /* borrowed */
    unsigned flags;
    uint8_t pending[4]; /* bytes of a character not yet complete (at most 3) */
    size_t n_pending;
    uint8_t *buf; /* [cap] work area: pending + token bytes, then the text returned */
    size_t cap;
};

lm_status lm_tokenizer_stream_create(const lm_tokenizer *tok, unsigned flags, lm_tokenizer_stream **out) {
    if (!tok || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_stream_create: NULL argument");
    *out = lm__calloc(1, sizeof **out);
    if (!*out) return LM_OUT_OF_MEMORY;
    (*out)->tok = tok;
    (*out)->flags = flags;
    return LM_OK;
}

void lm_tokenizer_stream_destroy(lm_tokenizer_stream *s) {
    if (!s) return;
    lm__free(s->buf);
    lm__free(s);
}

/* Emits pending + bytes[0..k) as complete text; keeps a cut character pending. */
static lm_status stream_emit(lm_tokenizer_stream *s, const char *bytes, size_t k, int final, const char **text,
                             size_t *len) {
    size_t in = s->n_pending + k; /* input occupies buf[0..in), output goes to buf[in..) */
    size_t need = in + 3 * in + 1;
    if (need > s->cap) {
        uint8_t *nb = lm__alloc(need, 16);
        if (!nb) return LM_OUT_OF_MEMORY;
        lm__free(s->buf);
        s->buf = nb;
        s->cap = need;
    }
    memcpy(s->buf, s->pending, s->n_pending);
    memcpy(s->buf + s->n_pending, bytes, k);
    size_t o = in;
    size_t used = utf8_lossy(s->buf, in, final, s->buf, &o);
    s->n_pending = in - used;
    memcpy(s->pending, s->buf + used, s->n_pending);
    s->buf[o] = '\0';
    *text = (const char *)s->buf + in;
    *len = o - in;
    return LM_OK;
}

lm_status lm_tokenizer_stream_push(lm_tokenizer_stream *s, int32_t id, const char **text, size_t *len) {
    if (!s || !text || !len) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_stream_push: NULL argument");
    const lm_tokenizer *tok = s->tok;
    if (!valid_id(tok, id))
        return lm__error(LM_OUT_OF_RANGE, "lm_tokenizer_stream_push: id %d has no token (vocabulary of %d ids)", id,
                         tok->n_ids);
    size_t k = skipped(tok, id, s->flags) ? 0 : tok->dec_off[id + 1] - tok->dec_off[id];
    return stream_emit(s, tok->dec_text + tok->dec_off[id], k, 0, text, len);
}

lm_status lm_tokenizer_stream_flush(lm_tokenizer_stream *s, const char **text, size_t *len) {
    if (!s || !text || !len) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_stream_flush: NULL argument");
    return stream_emit(s, "", 0, 1, text, len);
}
