/* io/tokenizer_load.c — the "model" section of tokenizer.json: a BPE vocabulary,
 * its merges (both JSON forms: "left right" strings and ["left", "right"] pairs) and
 * its options.
 *
 * Every merge must name two vocabulary tokens whose concatenation is a vocabulary
 * token (Hugging Face's MergeTokenOutOfVocabulary rule); its rank is its position.
 * Options loom does not implement (dropout, byte_fallback, subword prefixes/suffixes)
 * are refused with LM_UNSUPPORTED rather than ignored. Also sizes the id space: one
 * slot per id up to the largest id of the vocabulary or the added tokens.
 */
#include "io/tokenizer_internal.h"

#include <string.h>

static lm_status check_options(json_t *model) {
    json_t *v = json_object_get(model, "dropout");
    if (v && !json_is_null(v) && !(json_is_number(v) && json_number_value(v) == 0.0))
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: model.dropout %g is not supported (only null or 0)",
                         json_number_value(v));
    if (json_is_true(json_object_get(model, "byte_fallback")))
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: model.byte_fallback = true is not supported");
    static const char *affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++) {
        v = json_object_get(model, affixes[i]);
        if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
            return lm__error(LM_UNSUPPORTED, "tokenizer.json: model.%s is not supported (only null or \"\")",
                             affixes[i]);
    }
    return LM_OK;
}

/* The id space: largest id over the vocabulary and added tokens, plus one. */
static lm_status count_ids(json_t *vocab, json_t *added, int32_t *n_ids, size_t *text_bytes) {
    json_int_t max = -1;
    const char *key;
    json_t *val;
    size_t text = 0;
    json_object_foreach(vocab, key, val) {
        if (!json_is_integer(val) || json_integer_value(val) < 0 || json_integer_value(val) >= LM__TOK_MAX_IDS)
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.vocab['%s'] is not an id in [0, %d)", key,
                             LM__TOK_MAX_IDS);
        if (json_integer_value(val) > max) max = json_integer_value(val);
        text += strlen(key);
    }
    for (size_t i = 0; i < json_array_size(added); i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (json_is_integer(id) && json_integer_value(id) >= LM__TOK_MAX_IDS)
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: added_tokens[%zu] id %lld is too large", i,
                             (long long)json_integer_value(id));
        if (json_is_integer(id) && json_integer_value(id) > max) max = json_integer_value(id);
    }
    *n_ids = (int32_t)(max + 1);
    *text_bytes = text;
    return LM_OK;
}

static lm_status load_vocab(lm_tokenizer *tok, json_t *vocab, size_t text_bytes) {
    LM_TRY(lm__tok_vocab_init(&tok->vocab, tok->n_ids, json_object_size(vocab), text_bytes));
    const char *key;
    json_t *val;
    json_object_foreach(vocab, key, val) {
        int32_t id = (int32_t)json_integer_value(val);
        size_t n = strlen(key);
        LM_TRY(lm__tok_vocab_add(&tok->vocab, id, key, n));
        tok->kind[id] |= LM__KIND_MODEL;
        size_t clen;
        uint32_t cp = n ? lm__utf8_decode((const uint8_t *)key, &clen) : 0;
        if (n && clen == n && cp < LM__TOK_CHAR_TABLE) tok->char_id[cp] = id;
    }
    for (int b = 0; b < 256; b++) tok->byte_id[b] = tok->char_id[tok->byte_cp[b]];
    return LM_OK;
}

/* One merges entry as (left, right) strings. */
static lm_status merge_parts(json_t *e, size_t i, const char **l, size_t *ln, const char **r, size_t *rn) {
    if (json_is_string(e)) {
        const char *s = json_string_value(e), *sp = strchr(s, ' ');
        if (!sp || strchr(sp + 1, ' '))
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.merges[%zu] \"%s\" is not two tokens separated by "
                                             "one space", i, s);
        *l = s, *ln = (size_t)(sp - s), *r = sp + 1, *rn = strlen(sp + 1);
        return LM_OK;
    }
    if (json_is_array(e) && json_array_size(e) == 2 && json_is_string(json_array_get(e, 0)) &&
        json_is_string(json_array_get(e, 1))) {
        *l = json_string_value(json_array_get(e, 0)), *ln = json_string_length(json_array_get(e, 0));
        *r = json_string_value(json_array_get(e, 1)), *rn = json_string_length(json_array_get(e, 1));
        return LM_OK;
    }
    return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.merges[%zu] is neither \"left right\" nor [\"left\", "
                                     "\"right\"]", i);
}

static lm_status load_merges(lm_tokenizer *tok, json_t *merges) {
    if (!merges || json_is_null(merges)) return lm__tok_merges_init(&tok->merges, 0);
    if (!json_is_array(merges)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.merges is not an array");
    size_t n = json_array_size(merges);
    if (n >= UINT32_MAX) return lm__error(LM_PARSE_ERROR, "tokenizer.json: too many merges");
    LM_TRY(lm__tok_merges_init(&tok->merges, n));
    char *buf = NULL; /* left || right */
    int64_t cap = 0;
    lm_status s = LM_OK;
    for (size_t i = 0; i < n && s == LM_OK; i++) {
        const char *l = NULL, *r = NULL;
        size_t ln = 0, rn = 0;
        s = merge_parts(json_array_get(merges, i), i, &l, &ln, &r, &rn);
        if (s != LM_OK) break;
        int32_t a = lm__tok_vocab_find(&tok->vocab, l, ln), b = lm__tok_vocab_find(&tok->vocab, r, rn);
        if (a < 0 || b < 0) {
            s = lm__error(LM_PARSE_ERROR,
                          "tokenizer.json: model.merges[%zu] names '%.*s', which is not in the vocabulary", i,
                          a < 0 ? (int)ln : (int)rn, a < 0 ? l : r);
            break;
        }
        s = lm__reserve((void **)&buf, &cap, (int64_t)(ln + rn), 1);
        if (s != LM_OK) break;
        memcpy(buf, l, ln);
        memcpy(buf + ln, r, rn);
        int32_t m = lm__tok_vocab_find(&tok->vocab, buf, ln + rn);
        if (m < 0) {
            s = lm__error(LM_PARSE_ERROR, "tokenizer.json: model.merges[%zu]: the merged token '%.*s' is not in the "
                                          "vocabulary", i, (int)(ln + rn), buf);
            break;
        }
        lm__tok_merges_put(&tok->merges, a, b, (uint32_t)i, m);
    }
    lm__free(buf);
    return s;
}

static lm_status load_unk(lm_tokenizer *tok, json_t *model) {
    json_t *unk = json_object_get(model, "unk_token");
    tok->unk_id = -1;
    tok->fuse_unk = json_is_true(json_object_get(model, "fuse_unk"));
    if (!unk || json_is_null(unk)) return LM_OK;
    if (!json_is_string(unk)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.unk_token is not a string");
    tok->unk_id = lm__tok_vocab_find(&tok->vocab, json_string_value(unk), json_string_length(unk));
    if (tok->unk_id < 0)
        return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.unk_token '%s' is not in the vocabulary",
                         json_string_value(unk));
    return LM_OK;
}

lm_status lm__tok_parse_model(lm_tokenizer *tok, json_t *root) {
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(model)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: missing \"model\" object");
    const char *type = json_string_value(json_object_get(model, "type"));
    if (type && strcmp(type, "BPE") != 0)
        return lm__error(LM_UNSUPPORTED, "tokenizer.json: model type '%s' is not supported (supported: BPE)", type);
    LM_TRY(check_options(model));
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.vocab is not an object");
    size_t text_bytes = 0;
    LM_TRY(count_ids(vocab, json_object_get(root, "added_tokens"), &tok->n_ids, &text_bytes));
    if (tok->n_ids == 0) return lm__error(LM_PARSE_ERROR, "tokenizer.json: the vocabulary is empty");
    tok->kind = lm__calloc((size_t)tok->n_ids, 1);
    tok->added_of_id = lm__alloc((size_t)tok->n_ids * sizeof(int32_t), 64);
    if (!tok->kind || !tok->added_of_id) return LM_OUT_OF_MEMORY;
    memset(tok->added_of_id, 0xFF, (size_t)tok->n_ids * sizeof(int32_t));
    for (int i = 0; i < LM__TOK_CHAR_TABLE; i++) tok->char_id[i] = -1;
    tok->ignore_merges = json_is_true(json_object_get(model, "ignore_merges"));
    LM_TRY(load_vocab(tok, vocab, text_bytes));
    LM_TRY(load_unk(tok, model));
    return load_merges(tok, json_object_get(model, "merges"));
}
