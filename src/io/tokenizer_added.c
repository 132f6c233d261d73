/* io/tokenizer_added.c — added tokens ("added_tokens" of tokenizer.json): parsing and
 * matching.
 *
 * Matching follows Hugging Face's AddedVocabulary: a leftmost-longest scan (as its
 * Aho-Corasick automaton) over two sets — tokens with normalized == false on the raw
 * text, the others (content normalized at load) on the normalized text. A byte trie
 * with a direct first-byte table finds the longest token at a position in
 * O(token length x siblings); positions whose byte starts no token cost one lookup.
 * single_word rejects a match touching a word character; lstrip/rstrip widen a match
 * over neighbouring whitespace (Unicode White_Space), as Hugging Face does.
 */
#include "io/tokenizer_internal.h"

#include <string.h>
#include <utf8proc.h>

static int json_flag(json_t *obj, const char *key, int dflt) {
    json_t *v = json_object_get(obj, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

lm_status lm__tok_parse_added(lm_tokenizer *tok, json_t *root) {
    json_t *list = json_object_get(root, "added_tokens");
    if (!list || json_is_null(list)) return LM_OK;
    if (!json_is_array(list)) return lm__error(LM_PARSE_ERROR, "tokenizer.json: \"added_tokens\" is not an array");
    size_t n = json_array_size(list), text = 0;
    for (size_t i = 0; i < n; i++) text += json_string_length(json_object_get(json_array_get(list, i), "content")) + 1;
    tok->added = lm__calloc(n ? n : 1, sizeof *tok->added);
    tok->added_text = lm__alloc(text + 1, 16);
    if (!tok->added || !tok->added_text) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(list, i), *jid = json_object_get(a, "id"), *content = json_object_get(a, "content");
        if (!json_is_integer(jid) || !json_is_string(content))
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: added_tokens[%zu] needs an integer \"id\" and a string "
                                             "\"content\"", i);
        json_int_t id = json_integer_value(jid);
        if (id < 0 || id >= tok->n_ids)
            return lm__error(LM_PARSE_ERROR, "tokenizer.json: added_tokens[%zu] id %lld is out of range", i,
                             (long long)id);
        size_t len = json_string_length(content);
        if (len == 0) continue; /* Hugging Face ignores empty added tokens */
        lm__tok_added *t = &tok->added[tok->n_added++];
        t->id = (int32_t)id;
        t->off = (uint32_t)tok->added_text_len;
        t->len = (uint32_t)len;
        memcpy(tok->added_text + tok->added_text_len, json_string_value(content), len + 1);
        tok->added_text_len += len + 1;
        t->special = (uint8_t)json_flag(a, "special", 0);
        t->normalized = (uint8_t)json_flag(a, "normalized", !t->special);
        t->single_word = (uint8_t)json_flag(a, "single_word", 0);
        t->lstrip = (uint8_t)json_flag(a, "lstrip", 0);
        t->rstrip = (uint8_t)json_flag(a, "rstrip", 0);
        tok->added_of_id[id] = tok->n_added - 1; /* a repeated id keeps the last entry */
        tok->kind[id] |= LM__KIND_ADDED | (t->special ? LM__KIND_SPECIAL : 0);
    }
    return LM_OK;
}

/* ---- trie ---------------------------------------------------------------------------- */
static lm_status trie_new_node(lm__tok_trie *t, uint8_t byte, int32_t *out) {
    LM_TRY(lm__reserve((void **)&t->nodes, &t->cap, (int64_t)t->count + 1, sizeof *t->nodes));
    t->nodes[t->count] = (lm__tok_trie_node){-1, -1, -1, byte};
    *out = (int32_t)t->count++;
    return LM_OK;
}

/* Inserts s[0..n) for token index tok_index; a repeated content keeps the later one. */
static lm_status trie_insert(lm__tok_trie *t, const uint8_t *s, size_t n, int32_t tok_index) {
    int32_t node = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t c = i == 0 ? t->first[s[0]] : t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != s[i]) c = t->nodes[c].sibling;
        if (c < 0) {
            LM_TRY(trie_new_node(t, s[i], &c));
            if (i == 0) t->first[s[0]] = c;
            t->nodes[c].sibling = i == 0 ? -1 : t->nodes[node].child;
            if (i > 0) t->nodes[node].child = c;
        }
        node = c;
    }
    t->nodes[node].token = tok_index;
    return LM_OK;
}

void lm__tok_trie_free(lm__tok_trie *t) {
    lm__free(t->nodes);
    t->nodes = NULL;
    t->count = t->cap = 0;
}

lm_status lm__tok_build_tries(lm_tokenizer *tok) {
    lm__tok_trie *ts[2] = {&tok->trie_raw, &tok->trie_norm};
    for (int k = 0; k < 2; k++) {
        memset(ts[k]->first, 0xFF, sizeof ts[k]->first);
        int32_t root;
        LM_TRY(trie_new_node(ts[k], 0, &root));
    }
    int32_t *ucs = NULL;
    int64_t ucs_cap = 0;
    lm_status s = LM_OK;
    /* Hugging Face inserts special tokens before the others; with unique contents the
     * order does not matter, with repeated contents the later entry wins in both. */
    for (int i = 0; i < tok->n_added && s == LM_OK; i++) {
        const lm__tok_added *a = &tok->added[i];
        const uint8_t *c = (const uint8_t *)tok->added_text + a->off;
        size_t n = a->len, bad;
        int trunc;
        if (!lm__utf8_valid(c, n, &bad, &trunc)) {
            s = lm__error(LM_PARSE_ERROR, "tokenizer.json: added token %d is not valid UTF-8", a->id);
            break;
        }
        if (a->normalized && tok->nfc) s = lm__tok_nfc(c, n, &ucs, &ucs_cap, &c, &n);
        if (s == LM_OK && n) s = trie_insert(a->normalized ? &tok->trie_norm : &tok->trie_raw, c, n, i);
    }
    lm__free(ucs);
    return s;
}

/* Longest token starting at s[0..n): its length (0 if none) and index. */
static size_t trie_longest(const lm__tok_trie *t, const uint8_t *s, size_t n, int32_t *index) {
    size_t best = 0;
    int32_t node = t->first[s[0]];
    for (size_t i = 1;; i++) {
        if (t->nodes[node].token >= 0) best = i, *index = t->nodes[node].token;
        if (i == n) break;
        int32_t c = t->nodes[node].child;
        while (c >= 0 && t->nodes[c].byte != s[i]) c = t->nodes[c].sibling;
        if (c < 0) break;
        node = c;
    }
    return best;
}

/* ---- character classes used by single_word / lstrip / rstrip ---------------------------- */
static int is_white_space(uint32_t c) { /* Unicode White_Space */
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

static int is_word_char(uint32_t c) { /* regex \w: letters, marks, digits, connectors, joiners */
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_ME) || cat == UTF8PROC_CATEGORY_ND ||
           cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC || c == 0x200C || c == 0x200D;
}

/* Start of the character that ends at s[end) (end > 0). */
static size_t char_before(const uint8_t *s, size_t end) {
    size_t i = end - 1;
    while (i > 0 && (s[i] & 0xC0) == 0x80) i--;
    return i;
}

int lm__tok_added_find(const lm_tokenizer *tok, const lm__tok_trie *t, const uint8_t *s, size_t n, size_t *pos,
                       size_t prev_end, size_t *start, size_t *end, int32_t *id) {
    if (t->count <= 1) return 0;
    size_t i = *pos, clen;
    while (i < n) {
        int32_t index;
        size_t len = t->first[s[i]] >= 0 ? trie_longest(t, s + i, n - i, &index) : 0;
        if (!len) {
            i++;
            continue;
        }
        const lm__tok_added *a = &tok->added[index];
        size_t ms = i, me = i + len;
        i = me; /* the scan resumes after this match even when single_word rejects it */
        if (a->single_word && ((ms > 0 && is_word_char(lm__utf8_decode(s + char_before(s, ms), &clen))) ||
                               (me < n && is_word_char(lm__utf8_decode(s + me, &clen)))))
            continue;
        if (a->lstrip)
            while (ms > prev_end && is_white_space(lm__utf8_decode(s + char_before(s, ms), &clen)))
                ms = char_before(s, ms);
        if (a->rstrip)
            while (me < n && is_white_space(lm__utf8_decode(s + me, &clen))) me += clen;
        *start = ms, *end = me, *id = a->id, *pos = me;
        return 1;
    }
    *pos = n;
    return 0;
}
