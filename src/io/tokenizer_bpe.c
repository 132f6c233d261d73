/* io/tokenizer_bpe.c — the BPE model: vocabulary and merge hash maps, the merge loop
 * and the per-state word cache.
 *
 * A piece of n symbols is merged as Hugging Face's Word::merge_all does: a binary
 * min-heap of candidate merges ordered by (rank, left position) over a doubly linked
 * symbol list; stale heap entries are recognised by re-looking up the pair, so a
 * word costs O(n log n). The vocabulary and merges are open-addressing tables with
 * load factor <= 1/2 (expected O(1) probes). The cache maps raw piece bytes -> ids in
 * fixed arenas that are cleared wholesale when full (no allocation per insert).
 */
#include "io/tokenizer_internal.h"

#include <string.h>

/* 8 bytes per step, multiply-xorshift mixing; good enough spread for power-of-two tables. */
uint64_t lm__tok_hash(const void *p, size_t n) {
    const uint8_t *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0xC2B2AE3D27D4EB4Full);
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xFF51AFD7ED558CCDull;
        h ^= h >> 32;
        s += 8, n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    h = (h ^ w) * 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    return h ^ (h >> 32);
}

static uint64_t table_size(size_t count) {
    uint64_t cap = 16;
    while (cap < 2 * (uint64_t)count) cap <<= 1;
    return cap;
}

/* ---- vocabulary ---------------------------------------------------------------------- */
lm_status lm__tok_vocab_init(lm__tok_vocab *v, int32_t n_ids, size_t count, size_t text_bytes) {
    *v = (lm__tok_vocab){0};
    uint64_t cap = table_size(count);
    v->text_cap = text_bytes + count + 1;
    v->text = lm__alloc(v->text_cap, 16);
    v->off = lm__calloc((size_t)n_ids + 1, sizeof(uint32_t));
    v->len = lm__alloc(((size_t)n_ids + 1) * sizeof(uint32_t), 64);
    v->slots = lm__calloc(cap, sizeof(uint64_t));
    if (!v->text || !v->off || !v->len || !v->slots) {
        lm__tok_vocab_free(v);
        return LM_OUT_OF_MEMORY;
    }
    memset(v->len, 0xFF, ((size_t)n_ids + 1) * sizeof(uint32_t));
    v->mask = cap - 1;
    return LM_OK;
}

int32_t lm__tok_vocab_find(const lm__tok_vocab *v, const void *s, size_t n) {
    if (!v->slots) return -1;
    uint64_t h = lm__tok_hash(s, n), tag = h >> 32;
    for (uint64_t i = h & v->mask;; i = (i + 1) & v->mask) {
        uint64_t e = v->slots[i];
        if (!e) return -1;
        if (e >> 32 != tag) continue;
        int32_t id = (int32_t)(uint32_t)e - 1;
        if (v->len[id] == n && memcmp(v->text + v->off[id], s, n) == 0) return id;
    }
}

lm_status lm__tok_vocab_add(lm__tok_vocab *v, int32_t id, const char *s, size_t n) {
    if (v->len[id] != LM__TOK_NONE)
        return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.vocab id %d is given to both '%s' and '%s'", id,
                         v->text + v->off[id], s);
    if (lm__tok_vocab_find(v, s, n) >= 0)
        return lm__error(LM_PARSE_ERROR, "tokenizer.json: model.vocab token '%s' appears twice", s);
    LM_ASSERT(v->text_len + n + 1 <= v->text_cap && 2 * (v->count + 1) <= v->mask + 1);
    memcpy(v->text + v->text_len, s, n);
    v->text[v->text_len + n] = '\0';
    v->off[id] = (uint32_t)v->text_len;
    v->len[id] = (uint32_t)n;
    v->text_len += n + 1;
    uint64_t h = lm__tok_hash(s, n);
    uint64_t i = h & v->mask;
    while (v->slots[i]) i = (i + 1) & v->mask;
    v->slots[i] = (h >> 32) << 32 | (uint32_t)(id + 1);
    v->count++;
    return LM_OK;
}

void lm__tok_vocab_free(lm__tok_vocab *v) {
    lm__free(v->text), lm__free(v->off), lm__free(v->len), lm__free(v->slots);
    *v = (lm__tok_vocab){0};
}

/* ---- merges ------------------------------------------------------------------------------ */
lm_status lm__tok_merges_init(lm__tok_merges *m, size_t count) {
    *m = (lm__tok_merges){0};
    uint64_t cap = table_size(count);
    m->keys = lm__alloc(cap * sizeof(uint64_t), 64);
    m->rank = lm__alloc(cap * sizeof(uint32_t), 64);
    m->merged = lm__alloc(cap * sizeof(int32_t), 64);
    if (!m->keys || !m->rank || !m->merged) {
        lm__tok_merges_free(m);
        return LM_OUT_OF_MEMORY;
    }
    memset(m->keys, 0xFF, cap * sizeof(uint64_t));
    m->mask = cap - 1;
    m->shift = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) m->shift--;
    return LM_OK;
}

static inline uint64_t merge_slot(const lm__tok_merges *m, uint64_t key) {
    return (key * 0x9E3779B97F4A7C15ull) >> m->shift;
}

void lm__tok_merges_put(lm__tok_merges *m, int32_t left, int32_t right, uint32_t rank, int32_t merged) {
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    uint64_t i = merge_slot(m, key);
    while (m->keys[i] != UINT64_MAX && m->keys[i] != key) i = (i + 1) & m->mask;
    m->keys[i] = key;
    m->rank[i] = rank;
    m->merged[i] = merged;
}

/* 1 and (rank, merged id) when (left, right) is a merge. */
static inline int merge_find(const lm__tok_merges *m, int32_t left, int32_t right, uint32_t *rank, int32_t *merged) {
    if (!m->keys) return 0;
    uint64_t key = (uint64_t)(uint32_t)left << 32 | (uint32_t)right;
    for (uint64_t i = merge_slot(m, key);; i = (i + 1) & m->mask) {
        uint64_t k = m->keys[i];
        if (k == key) {
            *rank = m->rank[i];
            *merged = m->merged[i];
            return 1;
        }
        if (k == UINT64_MAX) return 0;
    }
}

void lm__tok_merges_free(lm__tok_merges *m) {
    lm__free(m->keys), lm__free(m->rank), lm__free(m->merged);
    *m = (lm__tok_merges){0};
}

/* ---- encode state ---------------------------------------------------------------------- */
lm_status lm__tok_state_create(const lm_tokenizer *tok, int with_cache, lm__tok_state **out) {
    *out = NULL;
    lm__tok_state *st = lm__calloc(1, sizeof *st);
    if (!st) return LM_OUT_OF_MEMORY;
    atomic_flag_clear(&st->busy);
    st->md = pcre2_match_data_create(1, tok->pcre_gctx);
    if (!st->md) {
        lm__tok_state_destroy(st);
        return lm__error(LM_OUT_OF_MEMORY, "tokenizer: cannot allocate regex match data");
    }
    st->batch_events = LM__TOK_BATCH_EVENTS;
    st->n_levels = tok->n_steps;
    st->levels = lm__calloc((size_t)tok->n_steps + 1, sizeof *st->levels);
    if (!st->levels) {
        lm__tok_state_destroy(st);
        return LM_OUT_OF_MEMORY;
    }
    if (with_cache) {
        st->cache_slots = lm__calloc(LM__TOK_CACHE_SLOTS, sizeof(uint32_t));
        st->cache_entries = lm__alloc(LM__TOK_CACHE_ENTRIES * sizeof(lm__tok_cache_entry), 64);
        st->cache_keys = lm__alloc(LM__TOK_CACHE_KEY_BYTES, 64);
        st->cache_ids = lm__alloc(LM__TOK_CACHE_IDS * sizeof(int32_t), 64);
        if (!st->cache_slots || !st->cache_entries || !st->cache_keys || !st->cache_ids) {
            lm__tok_state_destroy(st);
            return LM_OUT_OF_MEMORY;
        }
    }
    *out = st;
    return LM_OK;
}

void lm__tok_state_destroy(lm__tok_state *st) {
    if (!st) return;
    pcre2_match_data_free(st->md);
    for (int i = 0; st->levels && i < st->n_levels; i++)
        lm__free(st->levels[i].ev), lm__free(st->levels[i].piece), lm__free(st->levels[i].text);
    lm__free(st->levels);
    lm__free(st->ucs), lm__free(st->text2), lm__free(st->pa);
    lm__free(st->word), lm__free(st->sym_id), lm__free(st->sym_prev), lm__free(st->sym_next);
    lm__free(st->heap), lm__free(st->out);
    lm__free(st->cache_slots), lm__free(st->cache_entries), lm__free(st->cache_keys), lm__free(st->cache_ids);
    lm__free(st);
}

lm_status lm__tok_push_id(lm__tok_state *st, int32_t id) {
    return LM__PUSH(st->out, st->n_out, st->out_cap, id);
}

/* ---- word cache ------------------------------------------------------------------------ */
static const lm__tok_cache_entry *cache_get(const lm__tok_state *st, uint64_t h, const uint8_t *p, size_t n) {
    for (uint32_t i = (uint32_t)h & (LM__TOK_CACHE_SLOTS - 1);; i = (i + 1) & (LM__TOK_CACHE_SLOTS - 1)) {
        uint32_t e = st->cache_slots[i];
        if (!e) return NULL;
        const lm__tok_cache_entry *c = &st->cache_entries[e - 1];
        if (c->hash == h && c->key_len == n && memcmp(st->cache_keys + c->key_off, p, n) == 0) return c;
    }
}

static void cache_put(lm__tok_state *st, uint64_t h, const uint8_t *p, size_t n, const int32_t *ids, size_t k) {
    if (k > LM__TOK_CACHE_IDS) return;
    if (st->cache_count == LM__TOK_CACHE_ENTRIES || st->cache_key_used + n > LM__TOK_CACHE_KEY_BYTES ||
        st->cache_ids_used + k > LM__TOK_CACHE_IDS) {
        memset(st->cache_slots, 0, LM__TOK_CACHE_SLOTS * sizeof(uint32_t));
        st->cache_count = st->cache_key_used = st->cache_ids_used = 0;
    }
    lm__tok_cache_entry *c = &st->cache_entries[st->cache_count];
    *c = (lm__tok_cache_entry){h, (uint32_t)st->cache_key_used, (uint32_t)n, (uint32_t)st->cache_ids_used, (uint32_t)k};
    memcpy(st->cache_keys + st->cache_key_used, p, n);
    memcpy(st->cache_ids + st->cache_ids_used, ids, k * sizeof(int32_t));
    st->cache_key_used += n;
    st->cache_ids_used += k;
    uint32_t i = (uint32_t)h & (LM__TOK_CACHE_SLOTS - 1);
    while (st->cache_slots[i]) i = (i + 1) & (LM__TOK_CACHE_SLOTS - 1);
    st->cache_slots[i] = (uint32_t)++st->cache_count;
}

/* ---- BPE ----------------------------------------------------------------------------------- */
static inline int heap_less(const lm__tok_heap_item *a, const lm__tok_heap_item *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(lm__tok_heap_item *h, size_t *n, lm__tok_heap_item it) {
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&it, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = it;
}

static lm__tok_heap_item heap_pop(lm__tok_heap_item *h, size_t *n) {
    lm__tok_heap_item top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static lm_status unknown_char(const uint8_t *p, size_t n, size_t at) {
    size_t clen;
    uint32_t cp = lm__utf8_decode(p + at, &clen);
    return lm__error(LM_NOT_FOUND,
                     "tokenizer: character U+%04X (byte %zu of pre-token '%.*s') is not in the vocabulary and the "
                     "model has no unk_token",
                     (unsigned)cp, at, (int)LM_MIN(n, 64), (const char *)p);
}

/* The initial symbols: one per byte (byte-level) or per character, unknown ones
 * replaced by unk_id (fused into one when fuse_unk). Returns the count in *count. */
static lm_status initial_symbols(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *p, size_t n,
                                 size_t *count) {
    size_t k = 0;
    int last_unk = 0;
    for (size_t i = 0, clen; i < n; i += clen) {
        int32_t id;
        if (tok->byte_level) {
            clen = 1;
            id = tok->byte_id[p[i]];
        } else {
            uint32_t cp = lm__utf8_decode(p + i, &clen);
            id = cp < LM__TOK_CHAR_TABLE ? tok->char_id[cp] : lm__tok_vocab_find(&tok->vocab, p + i, clen);
        }
        if (id < 0) {
            if (tok->byte_level && tok->unk_id < 0) {
                return lm__error(LM_NOT_FOUND, "tokenizer: the byte-level character of byte 0x%02X is not in the "
                                               "vocabulary and the model has no unk_token", p[i]);
            }
            if (tok->unk_id < 0) return unknown_char(p, n, i);
            if (last_unk && tok->fuse_unk) continue;
            id = tok->unk_id;
            last_unk = 1;
        } else {
            last_unk = 0;
        }
        st->sym_id[k] = id;
        st->sym_prev[k] = (int32_t)k - 1;
        st->sym_next[k] = (int32_t)k + 1;
        k++;
    }
    if (k) st->sym_next[k - 1] = -1;
    *count = k;
    return LM_OK;
}

static void push_pair(const lm_tokenizer *tok, lm__tok_state *st, size_t *nh, int32_t pos) {
    int32_t next = st->sym_next[pos];
    uint32_t rank;
    int32_t merged;
    if (next >= 0 && merge_find(&tok->merges, st->sym_id[pos], st->sym_id[next], &rank, &merged))
        heap_push(st->heap, nh, (lm__tok_heap_item){rank, (uint32_t)pos, merged});
}

/* The three symbol arrays share sym_cap; their contents are rebuilt per word, so
 * growing them needs no copy. */
static lm_status reserve_symbols(lm__tok_state *st, size_t n) {
    if (n <= st->sym_cap) return LM_OK;
    size_t cap = LM_MAX(n, LM_MAX(2 * st->sym_cap, (size_t)64));
    lm__free(st->sym_id), lm__free(st->sym_prev), lm__free(st->sym_next);
    st->sym_id = lm__alloc(cap * sizeof(int32_t), 64);
    st->sym_prev = lm__alloc(cap * sizeof(int32_t), 64);
    st->sym_next = lm__alloc(cap * sizeof(int32_t), 64);
    st->sym_cap = cap;
    if (st->sym_id && st->sym_prev && st->sym_next) return LM_OK;
    lm__free(st->sym_id), lm__free(st->sym_prev), lm__free(st->sym_next);
    st->sym_id = st->sym_prev = st->sym_next = NULL;
    st->sym_cap = 0;
    return LM_OUT_OF_MEMORY;
}

/* Merges the symbols of one word and appends the resulting ids. */
static lm_status bpe_word(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *p, size_t n) {
    if (n >= INT32_MAX) return lm__error(LM_INVALID_ARGUMENT, "tokenizer: pre-token of %zu bytes is too long", n);
    LM_TRY(reserve_symbols(st, n));
    size_t count = 0;
    LM_TRY(initial_symbols(tok, st, p, n, &count));
    LM_TRY(lm__reserve((void **)&st->heap, &st->heap_cap, 3 * (int64_t)count + 1, sizeof(lm__tok_heap_item)));
    size_t nh = 0;
    for (size_t i = 0; i + 1 < count; i++) push_pair(tok, st, &nh, (int32_t)i);
    while (nh) {
        lm__tok_heap_item top = heap_pop(st->heap, &nh);
        int32_t pos = (int32_t)top.pos, next = st->sym_next[pos];
        if (st->sym_id[pos] < 0 || next < 0) continue; /* removed, or now the last symbol */
        uint32_t rank;
        int32_t merged;
        if (!merge_find(&tok->merges, st->sym_id[pos], st->sym_id[next], &rank, &merged) || merged != top.merged)
            continue; /* stale entry: the pair changed since it was queued */
        st->sym_id[pos] = merged;
        st->sym_id[next] = -1;
        st->sym_next[pos] = st->sym_next[next];
        if (st->sym_next[pos] >= 0) st->sym_prev[st->sym_next[pos]] = pos;
        if (st->sym_prev[pos] >= 0) push_pair(tok, st, &nh, st->sym_prev[pos]);
        push_pair(tok, st, &nh, pos);
    }
    for (int32_t i = count ? 0 : -1; i >= 0; i = st->sym_next[i]) LM_TRY(lm__tok_push_id(st, st->sym_id[i]));
    return LM_OK;
}

/* ignore_merges: a piece that is itself a vocabulary token is emitted whole. */
static int32_t whole_word_id(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *p, size_t n) {
    if (!tok->byte_level) return lm__tok_vocab_find(&tok->vocab, p, n);
    if (lm__reserve((void **)&st->word, &st->word_cap, 2 * (int64_t)n, 1) != LM_OK) return -2;
    size_t w = 0;
    for (size_t i = 0; i < n; i++) {
        st->word[w++] = tok->byte_utf8[p[i]][0];
        if (tok->byte_utf8[p[i]][1]) st->word[w++] = tok->byte_utf8[p[i]][1];
    }
    return lm__tok_vocab_find(&tok->vocab, st->word, w);
}

lm_status lm__tok_bpe_piece(const lm_tokenizer *tok, lm__tok_state *st, const uint8_t *p, size_t n) {
    if (n == 0) return LM_OK;
    int cached = st->cache_slots && n <= LM__TOK_CACHE_MAX_KEY;
    uint64_t h = 0;
    if (cached) {
        h = lm__tok_hash(p, n);
        const lm__tok_cache_entry *c = cache_get(st, h, p, n);
        if (c) {
            LM_TRY(lm__reserve((void **)&st->out, &st->out_cap, (int64_t)(st->n_out + c->ids_len), sizeof(int32_t)));
            memcpy(st->out + st->n_out, st->cache_ids + c->ids_off, c->ids_len * sizeof(int32_t));
            st->n_out += c->ids_len;
            return LM_OK;
        }
    }
    size_t first = st->n_out;
    int32_t whole = tok->ignore_merges ? whole_word_id(tok, st, p, n) : -1;
    if (whole == -2) return LM_OUT_OF_MEMORY;
    if (whole >= 0) LM_TRY(lm__tok_push_id(st, whole));
    else LM_TRY(bpe_word(tok, st, p, n));
    if (cached) cache_put(st, h, p, n, st->out + first, st->n_out - first);
    return LM_OK;
}
