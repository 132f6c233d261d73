/* io/tokenizer_train.c — byte-level BPE training (see loom/tokenizer_train.h).
 *
 * 1. Skeleton: the output tokenizer.json minus its merges (specials + 256 byte
 *    symbols) is built and loaded with lm_tokenizer_load_json, so special-token
 *    cutting and pre-tokenization run the loader's own code (PCRE2, same Split
 *    behaviour) and training sees exactly the pieces encode will see.
 * 2. Counting: inputs are cut into ~1 MiB chunks at newlines where no piece can
 *    cross (chunk_end), so the pieces equal those of the whole text and do not depend
 *    on the thread count; workers count distinct pieces in private hash tables,
 *    merged afterwards. O(text).
 * 3. Merging (single thread): words are symbol arrays with counts; a pair table maps
 *    (left, right) -> count and a list of words that may hold it (stale entries are
 *    re-checked); a max-heap of (count, pair) with lazy deletion picks the best pair
 *    (highest count, then smallest (left id, right id): Hugging Face's rule). A merge
 *    rewrites only the words listing the pair, left to right as HF's Word::merge
 *    does, and updates neighbour pair counts incrementally.
 * Invariant of the heap: every live pair with count > 0 has an entry whose count is
 * >= its current count (increases push a fresh entry; decreases are found at pop).
 */
#include "io/tokenizer_internal.h"
#include "loom/io_write.h"
#include "loom/tokenizer_train.h"

#include <stdatomic.h>
#include <string.h>
#include <utf8proc.h>

#define CHUNK_BYTES ((size_t)1 << 20)      /* target chunk size */
#define CHUNK_SEARCH ((size_t)64 << 20)    /* past this, any newline is a cut point */

/* ---- presets: the pre_tokenizer / post_processor / decoder of real files ---------------- */
typedef struct preset {
    const char *name;
    const char *regex;    /* Split pattern; NULL: ByteLevel's own GPT-2 regex */
    int pre[3], post[3], dec[3]; /* ByteLevel add_prefix_space, trim_offsets, use_regex */
} preset;

static const preset k_presets[] = {
    {"llama3", /* Meta-Llama-3 tokenizer.json */
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     {0, 1, 0}, {1, 0, 1}, {1, 1, 1}},
    {"qwen2", /* Qwen2 / Qwen2.5 / Qwen3 tokenizer.json (without their NFC normalizer) */
     "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|"
     "\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+",
     {0, 0, 0}, {0, 0, 0}, {0, 0, 0}},
    {"gpt2", NULL, {0, 1, 1}, {1, 0, 1}, {1, 1, 1}},
};

void lm_tokenizer_train_options_default(lm_tokenizer_train_options *o) {
    if (!o) return;
    *o = (lm_tokenizer_train_options){.vocab_size = 32000, .pretokenizer = "llama3", .progress_interval = 1.0};
}

/* ---- tokenizer.json ------------------------------------------------------------------------ */
static json_t *byte_level(const int f[3]) {
    return json_pack("{s:s, s:b, s:b, s:b}", "type", "ByteLevel", "add_prefix_space", f[0], "trim_offsets", f[1],
                     "use_regex", f[2]);
}

/* The whole file in Hugging Face's key order; takes vocab and merges. NULL on OOM. */
static json_t *build_root(const preset *pr, const char *const *specials, int n_special, json_t *vocab,
                          json_t *merges) {
    json_t *added = json_array();
    for (int i = 0; added && i < n_special; i++)
        if (json_array_append_new(added, json_pack("{s:i, s:s, s:b, s:b, s:b, s:b, s:b}", "id", i, "content",
                                                   specials[i], "single_word", 0, "lstrip", 0, "rstrip", 0,
                                                   "normalized", 0, "special", 1)))
            json_decref(added), added = NULL;
    json_t *pre = pr->regex ? json_pack("{s:s, s:[{s:s, s:{s:s}, s:s, s:b}, o]}", "type", "Sequence", "pretokenizers",
                                        "type", "Split", "pattern", "Regex", pr->regex, "behavior", "Isolated",
                                        "invert", 0, byte_level(pr->pre))
                            : byte_level(pr->pre);
    /* "o" steals its reference even when packing fails (jansson >= 2.11): no decref here */
    json_t *model = json_pack("{s:s, s:n, s:n, s:n, s:n, s:b, s:b, s:b, s:o, s:o}", "type", "BPE", "dropout",
                              "unk_token", "continuing_subword_prefix", "end_of_word_suffix", "fuse_unk", 0,
                              "byte_fallback", 0, "ignore_merges", 0, "vocab", vocab, "merges", merges);
    return json_pack("{s:s, s:n, s:n, s:o, s:n, s:o, s:o, s:o, s:o}", "version", "1.0", "truncation", "padding",
                     "added_tokens", added, "normalizer", "pre_tokenizer", pre, "post_processor", byte_level(pr->post),
                     "decoder", byte_level(pr->dec), "model", model);
}

typedef struct dump_buf {
    char *p;
    int64_t cap;
    size_t n;
    int failed; /* sticky: jansson does not stop at every failed write */
} dump_buf;

static int dump_cb(const char *s, size_t n, void *arg) {
    dump_buf *b = arg;
    if (b->failed || lm__reserve((void **)&b->p, &b->cap, (int64_t)(b->n + n + 1), 1) != LM_OK) {
        b->failed = 1;
        return -1;
    }
    memcpy(b->p + b->n, s, n);
    b->n += n;
    b->p[b->n] = '\0';
    return 0;
}

/* Serializes root (pretty, 2 spaces, UTF-8 unescaped) into an lm__alloc buffer. */
static lm_status dump_json(json_t *root, char **out, size_t *len) {
    dump_buf b = {0};
    if (json_dump_callback(root, dump_cb, &b, JSON_INDENT(2)) != 0 || b.failed || !b.p) {
        lm__free(b.p);
        return lm__error(LM_OUT_OF_MEMORY, "tokenizer train: cannot serialize tokenizer.json");
    }
    *out = b.p, *len = b.n;
    return LM_OK;
}

/* ---- piece counting: a hash table of distinct byte strings ------------------------------- */
typedef struct wc_entry {
    uint64_t hash, count, off; /* off: bytes in wc_table.text */
    uint32_t len;
} wc_entry;

typedef struct wc_table {
    wc_entry *e; /* [n] in insertion order */
    int64_t e_cap;
    size_t n;
    uint64_t *slots; /* [mask + 1] (hash >> 32) << 32 | (index + 1); 0 = empty; load <= 1/2 */
    uint64_t mask;
    uint8_t *text; /* [text_len] the strings back to back */
    int64_t text_cap;
    size_t text_len;
} wc_table;

static void wc_free(wc_table *t) {
    lm__free(t->e), lm__free(t->slots), lm__free(t->text);
    *t = (wc_table){0};
}

static lm_status wc_grow(wc_table *t) {
    uint64_t cap = t->slots ? 2 * (t->mask + 1) : 1u << 12;
    uint64_t *slots = lm__calloc(cap, sizeof *slots);
    if (!slots) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < t->n; i++) {
        uint64_t j = t->e[i].hash & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (t->e[i].hash >> 32) << 32 | (uint64_t)(i + 1);
    }
    lm__free(t->slots);
    t->slots = slots, t->mask = cap - 1;
    return LM_OK;
}

/* Adds count occurrences of s[0..n) (hash h). */
static lm_status wc_add(wc_table *t, const uint8_t *s, size_t n, uint64_t h, uint64_t count) {
    if (!t->slots || 2 * (t->n + 1) > t->mask + 1) LM_TRY(wc_grow(t));
    uint64_t tag = h >> 32, j = h & t->mask;
    for (;; j = (j + 1) & t->mask) {
        uint64_t v = t->slots[j];
        if (!v) break;
        if (v >> 32 != tag) continue;
        wc_entry *e = &t->e[(uint32_t)v - 1];
        if (e->hash == h && e->len == n && memcmp(t->text + e->off, s, n) == 0) {
            e->count += count;
            return LM_OK;
        }
    }
    if (n >= UINT32_MAX || t->n >= UINT32_MAX - 1)
        return lm__error(LM_UNSUPPORTED, "tokenizer train: a piece of %zu bytes or over 2^32 distinct pieces", n);
    LM_TRY(lm__reserve((void **)&t->text, &t->text_cap, (int64_t)(t->text_len + n), 1));
    LM_TRY(lm__reserve((void **)&t->e, &t->e_cap, (int64_t)t->n + 1, sizeof *t->e));
    memcpy(t->text + t->text_len, s, n);
    t->e[t->n] = (wc_entry){h, count, t->text_len, (uint32_t)n};
    t->text_len += n;
    t->slots[j] = tag << 32 | (uint64_t)(++t->n);
    return LM_OK;
}

/* ---- chunking ------------------------------------------------------------------------------- */
typedef struct chunk {
    int input;
    size_t off, len;
} chunk;

/* Oniguruma's \s (what the patterns mean by it): \t-\r, U+0085 and \p{Z}. */
static int is_space(uint32_t c) {
    if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || c == 0x20;
    if (c == 0x85) return 1;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)c);
    return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL || cat == UTF8PROC_CATEGORY_ZP;
}

/* 1 if the character at s[i..n) is a complete valid one and not \s. */
static int non_space_at(const uint8_t *s, size_t n, size_t i) {
    int kind;
    size_t clen;
    if (i >= n) return 0;
    lm__utf8_next(s + i, n - i, &kind);
    return kind == 0 && !is_space(lm__utf8_decode(s + i, &clen));
}

/* May the text be cut after the '\n' at s[i]? With the Llama 3 / Qwen2 patterns no
 * piece holds a newline and a following non-space character, so any '\n' followed
 * by \S ends a piece in the whole text too. GPT-2's `\s+(?!\S)` splits a whitespace
 * run before its last character, so there the newline must also stand alone. */
static int cut_ok(const uint8_t *s, size_t n, size_t i, int gpt2) {
    if (!non_space_at(s, n, i + 1)) return 0;
    if (!gpt2) return 1;
    if (i == 0) return 0;
    size_t b = i - 1;
    while (b > 0 && i - b < 4 && (s[b] & 0xC0) == 0x80) b--;
    return non_space_at(s, i, b);
}

/* End of the chunk that starts at off: the first cut point at or after off + target
 * bytes; past CHUNK_SEARCH any newline (a piece may then differ from the whole text's,
 * still the same for every thread count); n when there is none. A special token that
 * itself holds a newline followed by \S could be cut at a boundary and go unmatched. */
static size_t chunk_end(const uint8_t *s, size_t n, size_t off, int gpt2) {
    if (n - off <= CHUNK_BYTES) return n;
    size_t i = off + CHUNK_BYTES - 1, any = n;
    for (;;) {
        const uint8_t *nl = memchr(s + i, '\n', n - i);
        if (!nl) return any;
        i = (size_t)(nl - s);
        if (cut_ok(s, n, i, gpt2)) return i + 1;
        if (any == n) any = i + 1;
        if (i - off > CHUNK_SEARCH) return any;
        i++;
    }
}

/* ---- parallel counting ------------------------------------------------------------------------ */
typedef struct count_worker {
    lm__tok_state *st;
    wc_table table;
    int64_t err_chunk; /* the worker's earliest failing chunk; INT64_MAX none */
    lm_status status;  /* and its status and detail */
    char detail[512];
} count_worker;

typedef struct count_ctx {
    const lm_tokenizer *tok; /* the skeleton: specials and pre-tokenizer */
    const lm_tokenizer_train_input *inputs;
    const uint8_t **data; /* [n_inputs] the inputs' bytes (mapped files or buffers) */
    const chunk *chunks;
    count_worker *workers;
    atomic_ullong bytes_done, pieces;
    atomic_llong first_error; /* smallest failing chunk index; INT64_MAX none */
    const lm_tokenizer_train_options *o;
    lm_tokenizer_train_progress *prog;
    double t0, last_report;
} count_ctx;

static lm_status count_segment(count_ctx *c, count_worker *w, const uint8_t *s, size_t n, uint64_t *pieces) {
    if (!n) return LM_OK;
    const uint8_t *base;
    size_t count = 0;
    LM_TRY(lm__tok_pretokenize(c->tok, w->st, s, n, &base, &count));
    for (size_t i = 0; i < count; i++) {
        const uint8_t *p = base + w->st->pa[i].off;
        size_t len = w->st->pa[i].len;
        LM_TRY(wc_add(&w->table, p, len, lm__tok_hash(p, len), 1));
    }
    *pieces += count;
    return LM_OK;
}

static const char *input_name(const lm_tokenizer_train_input *in, int i, char *buf, size_t size) {
    if (in->path) return in->path;
    snprintf(buf, size, "input %d (buffer)", i);
    return buf;
}

/* Special tokens cut out (as encode does), then each gap pre-tokenized and counted. */
static lm_status count_chunk(count_ctx *c, count_worker *w, const chunk *ch, uint64_t *pieces) {
    const uint8_t *s = c->data[ch->input] + ch->off;
    size_t n = ch->len, bad;
    int truncated;
    if (!lm__utf8_valid(s, n, &bad, &truncated)) {
        char buf[64];
        return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: '%s' is not UTF-8: %s at byte offset %zu",
                         input_name(&c->inputs[ch->input], ch->input, buf, sizeof buf),
                         truncated ? "truncated sequence" : "invalid byte sequence", ch->off + bad);
    }
    size_t pos = 0, prev = 0, ms, me;
    int32_t id;
    while (lm__tok_added_find(c->tok, &c->tok->trie_raw, s, n, &pos, prev, &ms, &me, &id)) {
        LM_TRY(count_segment(c, w, s + prev, ms - prev, pieces));
        prev = me;
    }
    return count_segment(c, w, s + prev, n - prev, pieces);
}

static void report(const lm_tokenizer_train_options *o, lm_tokenizer_train_progress *p, double t0, double *last,
                   int force) {
    if (!o->progress) return;
    double now = lm__now_seconds();
    if (!force && now - *last < o->progress_interval) return;
    *last = now;
    p->seconds = now - t0;
    o->progress(o->progress_user, p);
}

static void count_task(void *arg, int64_t task, int worker) {
    count_ctx *c = arg;
    count_worker *w = &c->workers[worker];
    if (task > atomic_load(&c->first_error)) return; /* a failure before: nothing to gain */
    uint64_t pieces = 0;
    lm_status s = count_chunk(c, w, &c->chunks[task], &pieces);
    if (s != LM_OK) {
        long long cur = atomic_load(&c->first_error);
        while (task < cur && !atomic_compare_exchange_weak(&c->first_error, &cur, task)) {
        }
        if (task < w->err_chunk) {
            w->err_chunk = task, w->status = s;
            snprintf(w->detail, sizeof w->detail, "%s", lm_last_error());
        }
        return;
    }
    atomic_fetch_add(&c->bytes_done, c->chunks[task].len);
    atomic_fetch_add(&c->pieces, pieces);
    if (worker == 0) { /* worker 0 is the calling thread: it may call back */
        c->prog->bytes_done = atomic_load(&c->bytes_done);
        c->prog->pieces = atomic_load(&c->pieces);
        report(c->o, c->prog, c->t0, &c->last_report, 0);
    }
}

/* ---- BPE merging -------------------------------------------------------------------------------- */
typedef struct occ_list {
    uint32_t *v; /* [n] word indices that may hold the pair (duplicates and stale entries allowed) */
    uint32_t n, cap;
} occ_list;

typedef struct heap_item {
    int64_t count;
    uint64_t key; /* left << 32 | right */
} heap_item;

typedef struct bpe {
    /* words */
    int32_t *sym;     /* [total symbols] every word's symbols back to back; a word shrinks in place */
    uint64_t *wstart; /* [nw] */
    uint32_t *wlen;   /* [nw] current symbol count */
    uint64_t *wcount; /* [nw] occurrences in the corpus */
    uint32_t *wstamp; /* [nw] last merge step that rewrote the word */
    size_t nw;
    /* pairs */
    uint64_t *pkey;   /* [np] left << 32 | right */
    int64_t *pcount;  /* [np] occurrences (weighted by word count) */
    occ_list *pocc;   /* [np] */
    uint32_t *pstamp; /* [np] last step whose count increase was recorded */
    uint8_t *pdead;   /* [np] 1 once merged (or refused) */
    size_t np;
    int64_t cap_key, cap_count, cap_occ, cap_stamp, cap_dead;
    uint32_t *pslot; /* [pmask + 1] pair index + 1; 0 = empty; load <= 1/2 */
    uint64_t pmask;
    int pshift;
    uint32_t *touched; /* [ntouched] pairs whose count rose this step */
    size_t ntouched;
    int64_t cap_touched;
    heap_item *heap; /* [nh] max-heap by (count, then smallest key) */
    size_t nh;
    int64_t cap_heap;
    /* tokens: id -> byte-level string (the tokenizer.json form), and the reverse */
    char *ttext; /* [ttext_len] strings, each followed by NUL */
    size_t ttext_len;
    int64_t cap_ttext;
    uint64_t *toff; /* [ntok] */
    uint32_t *tlen; /* [ntok] */
    int64_t cap_toff, cap_tlen;
    int32_t ntok, n_special;
    uint32_t *tslot; /* [tmask + 1] id + 1 */
    uint64_t tmask;
    uint64_t *merges; /* [nmerges] keys in rank order */
    size_t nmerges;
    int64_t cap_merges;
    uint32_t step;
} bpe;

static void bpe_free(bpe *b) {
    lm__free(b->sym), lm__free(b->wstart), lm__free(b->wlen), lm__free(b->wcount), lm__free(b->wstamp);
    for (size_t i = 0; i < b->np; i++) lm__free(b->pocc[i].v);
    lm__free(b->pkey), lm__free(b->pcount), lm__free(b->pocc), lm__free(b->pstamp), lm__free(b->pdead);
    lm__free(b->pslot), lm__free(b->touched), lm__free(b->heap);
    lm__free(b->ttext), lm__free(b->toff), lm__free(b->tlen), lm__free(b->tslot), lm__free(b->merges);
    *b = (bpe){0};
}

/* -- token strings -- */
static lm_status tok_slots_grow(bpe *b) {
    uint64_t cap = b->tslot ? 2 * (b->tmask + 1) : 1024;
    uint32_t *slots = lm__calloc(cap, sizeof *slots);
    if (!slots) return LM_OUT_OF_MEMORY;
    for (int32_t id = 0; id < b->ntok; id++) {
        uint64_t j = lm__tok_hash(b->ttext + b->toff[id], b->tlen[id]) & (cap - 1);
        while (slots[j]) j = (j + 1) & (cap - 1);
        slots[j] = (uint32_t)id + 1;
    }
    lm__free(b->tslot);
    b->tslot = slots, b->tmask = cap - 1;
    return LM_OK;
}

/* The id of string s[0..n), or -1; *slot receives where it would go. */
static int32_t tok_find(const bpe *b, const char *s, size_t n, uint64_t *slot) {
    if (!b->tslot) return *slot = 0, -1;
    uint64_t j = lm__tok_hash(s, n) & b->tmask;
    for (;; j = (j + 1) & b->tmask) {
        uint32_t v = b->tslot[j];
        if (!v) break;
        int32_t id = (int32_t)v - 1;
        if (b->tlen[id] == n && memcmp(b->ttext + b->toff[id], s, n) == 0) return *slot = j, id;
    }
    *slot = j;
    return -1;
}

/* Writes s[0..n) (or, when s is NULL, the strings of ids a and c) after the last
 * token in the arena, NUL-terminated, without making it a token yet. */
static lm_status tok_stage(bpe *b, const char *s, size_t n, int32_t a, int32_t c, char **out) {
    if (!s) n = (size_t)b->tlen[a] + b->tlen[c];
    LM_TRY(lm__reserve((void **)&b->ttext, &b->cap_ttext, (int64_t)(b->ttext_len + n + 1), 1));
    char *d = b->ttext + b->ttext_len;
    if (s) {
        memcpy(d, s, n);
    } else {
        memcpy(d, b->ttext + b->toff[a], b->tlen[a]);
        memcpy(d + b->tlen[a], b->ttext + b->toff[c], b->tlen[c]);
    }
    d[n] = '\0';
    *out = d;
    return LM_OK;
}

/* Makes the staged string of n bytes (absent from the table) the next id. */
static lm_status tok_commit(bpe *b, size_t n, int32_t *id) {
    LM_TRY(lm__reserve((void **)&b->toff, &b->cap_toff, (int64_t)b->ntok + 1, sizeof *b->toff));
    LM_TRY(lm__reserve((void **)&b->tlen, &b->cap_tlen, (int64_t)b->ntok + 1, sizeof *b->tlen));
    if (!b->tslot || 2 * ((uint64_t)b->ntok + 1) > b->tmask + 1) LM_TRY(tok_slots_grow(b));
    uint64_t slot;
    LM_ASSERT(tok_find(b, b->ttext + b->ttext_len, n, &slot) < 0);
    *id = b->ntok++;
    b->toff[*id] = b->ttext_len, b->tlen[*id] = (uint32_t)n;
    b->ttext_len += n + 1;
    b->tslot[slot] = (uint32_t)*id + 1;
    return LM_OK;
}

static lm_status tok_add(bpe *b, const char *s, size_t n, int32_t *id) {
    char *d;
    LM_TRY(tok_stage(b, s, n, 0, 0, &d));
    return tok_commit(b, n, id);
}

/* -- pairs -- */
static inline uint64_t pair_key(int32_t a, int32_t c) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)c; }
static inline uint64_t pair_slot(const bpe *b, uint64_t key) { return (key * 0x9E3779B97F4A7C15ull) >> b->pshift; }

static lm_status pair_slots_grow(bpe *b) {
    uint64_t cap = b->pslot ? 2 * (b->pmask + 1) : 1u << 16;
    int shift = 64;
    for (uint64_t c = cap; c > 1; c >>= 1) shift--;
    uint32_t *slots = lm__calloc(cap, sizeof *slots);
    if (!slots) return LM_OUT_OF_MEMORY;
    lm__free(b->pslot);
    b->pslot = slots, b->pmask = cap - 1, b->pshift = shift;
    for (size_t p = 0; p < b->np; p++) {
        uint64_t j = pair_slot(b, b->pkey[p]);
        while (slots[j]) j = (j + 1) & b->pmask;
        slots[j] = (uint32_t)p + 1;
    }
    return LM_OK;
}

/* Index of pair key, created (count 0) when absent. */
static lm_status pair_get(bpe *b, uint64_t key, uint32_t *out) {
    if (!b->pslot || 2 * ((uint64_t)b->np + 1) > b->pmask + 1) LM_TRY(pair_slots_grow(b));
    uint64_t j = pair_slot(b, key);
    for (;; j = (j + 1) & b->pmask) {
        uint32_t v = b->pslot[j];
        if (!v) break;
        if (b->pkey[v - 1] == key) return *out = v - 1, LM_OK;
    }
    if (b->np >= UINT32_MAX - 1) return lm__error(LM_UNSUPPORTED, "tokenizer train: more than 2^32 distinct pairs");
    int64_t need = (int64_t)b->np + 1;
    LM_TRY(lm__reserve((void **)&b->pkey, &b->cap_key, need, sizeof *b->pkey));
    LM_TRY(lm__reserve((void **)&b->pcount, &b->cap_count, need, sizeof *b->pcount));
    LM_TRY(lm__reserve((void **)&b->pocc, &b->cap_occ, need, sizeof *b->pocc));
    LM_TRY(lm__reserve((void **)&b->pstamp, &b->cap_stamp, need, sizeof *b->pstamp));
    LM_TRY(lm__reserve((void **)&b->pdead, &b->cap_dead, need, sizeof *b->pdead));
    uint32_t p = (uint32_t)b->np++;
    b->pkey[p] = key, b->pcount[p] = 0, b->pocc[p] = (occ_list){0}, b->pstamp[p] = 0, b->pdead[p] = 0;
    b->pslot[j] = p + 1;
    *out = p;
    return LM_OK;
}

static uint32_t pair_find(const bpe *b, uint64_t key) {
    for (uint64_t j = pair_slot(b, key);; j = (j + 1) & b->pmask) {
        uint32_t v = b->pslot[j];
        LM_ASSERT(v != 0); /* only pairs that were counted are ever decremented */
        if (b->pkey[v - 1] == key) return v - 1;
    }
}

/* Records word w in the pair's list unless it was the last one added. */
static lm_status occ_add(occ_list *l, uint32_t w) {
    if (l->n && l->v[l->n - 1] == w) return LM_OK;
    if (l->n == l->cap) {
        if (l->cap > UINT32_MAX / 2) return lm__error(LM_UNSUPPORTED, "tokenizer train: a pair in 2^31 words");
        uint32_t cap = l->cap ? 2 * l->cap : 4;
        uint32_t *v = lm__alloc((size_t)cap * sizeof *v, 16);
        if (!v) return LM_OUT_OF_MEMORY;
        if (l->n) memcpy(v, l->v, (size_t)l->n * sizeof *v);
        lm__free(l->v);
        l->v = v, l->cap = cap;
    }
    l->v[l->n++] = w;
    return LM_OK;
}

/* -- heap -- */
static inline int heap_before(heap_item a, heap_item b) {
    return a.count > b.count || (a.count == b.count && a.key < b.key);
}

static lm_status heap_push(bpe *b, heap_item it) {
    LM_TRY(lm__reserve((void **)&b->heap, &b->cap_heap, (int64_t)b->nh + 1, sizeof *b->heap));
    size_t i = b->nh++;
    while (i > 0 && heap_before(it, b->heap[(i - 1) / 2])) {
        b->heap[i] = b->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    b->heap[i] = it;
    return LM_OK;
}

static heap_item heap_pop(bpe *b) {
    heap_item top = b->heap[0], last = b->heap[--b->nh];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= b->nh) break;
        if (c + 1 < b->nh && heap_before(b->heap[c + 1], b->heap[c])) c++;
        if (!heap_before(b->heap[c], last)) break;
        b->heap[i] = b->heap[c];
        i = c;
    }
    if (b->nh) b->heap[i] = last;
    return top;
}

/* -- setup -- */
/* Words from the counted pieces (pieces of one byte have no pair and are dropped);
 * byte b becomes id byte_id[b]. Then every adjacent pair is counted and queued. */
static lm_status bpe_init_words(bpe *b, const wc_table *t, const int32_t byte_id[256]) {
    size_t nw = 0, total = 0;
    for (size_t i = 0; i < t->n; i++)
        if (t->e[i].len >= 2) nw++, total += t->e[i].len;
    if (nw >= UINT32_MAX) return lm__error(LM_UNSUPPORTED, "tokenizer train: more than 2^32 distinct words");
    b->sym = lm__alloc((total ? total : 1) * sizeof *b->sym, 64);
    b->wstart = lm__alloc((nw ? nw : 1) * sizeof *b->wstart, 64);
    b->wlen = lm__alloc((nw ? nw : 1) * sizeof *b->wlen, 64);
    b->wcount = lm__alloc((nw ? nw : 1) * sizeof *b->wcount, 64);
    b->wstamp = lm__calloc(nw ? nw : 1, sizeof *b->wstamp);
    if (!b->sym || !b->wstart || !b->wlen || !b->wcount || !b->wstamp) return LM_OUT_OF_MEMORY;
    size_t at = 0;
    for (size_t i = 0; i < t->n; i++) {
        const wc_entry *e = &t->e[i];
        if (e->len < 2) continue;
        b->wstart[b->nw] = at, b->wlen[b->nw] = e->len, b->wcount[b->nw] = e->count;
        for (uint32_t k = 0; k < e->len; k++) b->sym[at + k] = byte_id[t->text[e->off + k]];
        at += e->len;
        b->nw++;
    }
    LM_TRY(pair_slots_grow(b));
    for (size_t w = 0; w < b->nw; w++) {
        const int32_t *s = b->sym + b->wstart[w];
        for (uint32_t k = 0; k + 1 < b->wlen[w]; k++) {
            uint32_t p;
            LM_TRY(pair_get(b, pair_key(s[k], s[k + 1]), &p));
            b->pcount[p] += (int64_t)b->wcount[w];
            LM_TRY(occ_add(&b->pocc[p], (uint32_t)w));
        }
    }
    for (size_t p = 0; p < b->np; p++) LM_TRY(heap_push(b, (heap_item){b->pcount[p], b->pkey[p]}));
    return LM_OK;
}

/* -- one merge -- */
static void pair_dec(bpe *b, int32_t a, int32_t c, int64_t n) { b->pcount[pair_find(b, pair_key(a, c))] -= n; }

static lm_status pair_inc(bpe *b, int32_t a, int32_t c, int64_t n, uint32_t w) {
    uint32_t p;
    LM_TRY(pair_get(b, pair_key(a, c), &p));
    b->pcount[p] += n;
    if (b->pdead[p]) return LM_OK;
    if (b->pstamp[p] != b->step) {
        b->pstamp[p] = b->step;
        LM_TRY(LM__PUSH(b->touched, b->ntouched, b->cap_touched, p));
    }
    return occ_add(&b->pocc[p], w);
}

/* Rewrites word w, replacing each (a, c) left to right by t (HF's Word::merge): the
 * left neighbour is the already rewritten symbol, the right one the original. */
static lm_status merge_word(bpe *b, uint32_t w, int32_t a, int32_t c, int32_t t) {
    int32_t *s = b->sym + b->wstart[w];
    uint32_t n = b->wlen[w], o = 0;
    int64_t cnt = (int64_t)b->wcount[w];
    for (uint32_t r = 0; r < n;) {
        if (r + 1 < n && s[r] == a && s[r + 1] == c) {
            if (o > 0) {
                pair_dec(b, s[o - 1], a, cnt);
                LM_TRY(pair_inc(b, s[o - 1], t, cnt, w));
            }
            if (r + 2 < n) {
                pair_dec(b, c, s[r + 2], cnt);
                LM_TRY(pair_inc(b, t, s[r + 2], cnt, w));
            }
            s[o++] = t;
            r += 2;
        } else {
            s[o++] = s[r++];
        }
    }
    b->wlen[w] = o;
    return LM_OK;
}

/* Pops until the best live pair; 0 when none is left. */
static int best_pair(bpe *b, uint32_t *pair, int64_t *count) {
    while (b->nh) {
        heap_item top = heap_pop(b);
        uint32_t p = pair_find(b, top.key);
        int64_t cur = b->pcount[p];
        if (b->pdead[p] || cur <= 0) continue;
        if (cur == top.count) return *pair = p, *count = cur, 1;
        /* cur > top.count: a newer entry holds it; cur < top.count: queue it again */
        if (cur < top.count && heap_push(b, (heap_item){cur, top.key}) != LM_OK) return -1;
    }
    return 0;
}

/* Merges until ntok == vocab_size, the pairs run out, or the best one is rarer than
 * min_frequency. *exhausted = 1 in the last two cases. */
static lm_status bpe_run(bpe *b, int32_t vocab_size, uint64_t min_frequency, const lm_tokenizer_train_options *o,
                         lm_tokenizer_train_progress *prog, double t0, int *exhausted) {
    double last = 0;
    *exhausted = 0;
    while (b->ntok < vocab_size) {
        uint32_t p;
        int64_t count;
        int got = best_pair(b, &p, &count);
        if (got < 0) return LM_OUT_OF_MEMORY;
        if (!got || (uint64_t)count < min_frequency) {
            *exhausted = 1;
            break;
        }
        int32_t a = (int32_t)(b->pkey[p] >> 32), c = (int32_t)(uint32_t)b->pkey[p];
        b->pdead[p] = 1;
        /* the merged string may exist already (HF reuses its id) or be a special token's
         * content (refused: the id would decode as the special token) */
        size_t n = (size_t)b->tlen[a] + b->tlen[c];
        char *merged;
        uint64_t slot;
        LM_TRY(tok_stage(b, NULL, 0, a, c, &merged));
        int32_t t = tok_find(b, merged, n, &slot);
        if (t >= 0 && t < b->n_special) continue;
        if (t < 0) LM_TRY(tok_commit(b, n, &t));
        LM_TRY(LM__PUSH(b->merges, b->nmerges, b->cap_merges, b->pkey[p]));
        b->step++;
        b->ntouched = 0;
        occ_list occ = b->pocc[p];
        b->pocc[p] = (occ_list){0};
        lm_status s = LM_OK;
        for (uint32_t i = 0; i < occ.n && s == LM_OK; i++) {
            uint32_t w = occ.v[i];
            if (b->wstamp[w] == b->step) continue;
            b->wstamp[w] = b->step;
            s = merge_word(b, w, a, c, t);
        }
        lm__free(occ.v);
        LM_TRY(s);
        for (size_t i = 0; i < b->ntouched; i++) {
            uint32_t q = b->touched[i];
            if (b->pcount[q] > 0) LM_TRY(heap_push(b, (heap_item){b->pcount[q], b->pkey[q]}));
        }
        if ((b->nmerges & 63) == 0) {
            prog->merges_done = (int64_t)b->nmerges;
            report(o, prog, t0, &last, 0);
        }
    }
    return LM_OK;
}

/* ---- driver ------------------------------------------------------------------------------------- */
static lm_status check_options(const lm_tokenizer_train_input *inputs, int n_inputs,
                               const lm_tokenizer_train_options *o, const preset **pr) {
    if ((!inputs && n_inputs) || n_inputs < 0 || !o)
        return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_train: NULL argument");
    if (n_inputs == 0) return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: no input (empty corpus)");
    for (int i = 0; i < n_inputs; i++)
        if (!inputs[i].path && !inputs[i].data && inputs[i].len)
            return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: input %d has neither a path nor data", i);
    const char *name = o->pretokenizer ? o->pretokenizer : "llama3";
    *pr = NULL;
    for (size_t i = 0; i < sizeof k_presets / sizeof k_presets[0]; i++)
        if (strcmp(name, k_presets[i].name) == 0) *pr = &k_presets[i];
    if (!*pr)
        return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: unknown pre-tokenizer '%s' (llama3, qwen2, gpt2)",
                         name);
    if (o->n_special < 0 || (o->n_special && !o->special_tokens))
        return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: bad special token list");
    if (o->vocab_size < 256 + o->n_special || o->vocab_size > LM__TOK_MAX_IDS)
        return lm__error(LM_INVALID_ARGUMENT,
                         "tokenizer train: vocab size %d must lie in [256 byte symbols + %d special tokens = %d, %d]",
                         (int)o->vocab_size, o->n_special, 256 + o->n_special, LM__TOK_MAX_IDS);
    for (int i = 0; i < o->n_special; i++) {
        const char *s = o->special_tokens[i];
        size_t bad;
        int trunc;
        if (!s || !*s) return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: special token %d is empty", i);
        if (!lm__utf8_valid((const uint8_t *)s, strlen(s), &bad, &trunc))
            return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: special token %d is not UTF-8", i);
        for (int j = 0; j < i; j++)
            if (strcmp(s, o->special_tokens[j]) == 0)
                return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: special token '%s' is given twice", s);
    }
    return LM_OK;
}

/* The skeleton tokenizer (specials + byte symbols, no merges) and the byte -> id map
 * (ids in code point order of the byte-level characters, after the specials). */
static lm_status build_skeleton(bpe *b, const preset *pr, const lm_tokenizer_train_options *o,
                                lm_tokenizer **tok, int32_t byte_id[256]) {
    lm_tokenizer probe = {0};
    lm__tok_byte_level_init(&probe); /* the loader's byte map */
    int order[256];
    for (int i = 0; i < 256; i++) order[i] = i;
    for (int i = 1; i < 256; i++) /* insertion sort by code point */
        for (int j = i; j > 0 && probe.byte_cp[order[j]] < probe.byte_cp[order[j - 1]]; j--) {
            int t = order[j];
            order[j] = order[j - 1], order[j - 1] = t;
        }
    b->n_special = o->n_special;
    for (int i = 0; i < o->n_special; i++) {
        int32_t id; /* duplicates were refused by check_options */
        LM_TRY(tok_add(b, o->special_tokens[i], strlen(o->special_tokens[i]), &id));
    }
    for (int r = 0; r < 256; r++) {
        int by = order[r];
        const char *s = (const char *)probe.byte_utf8[by];
        size_t n = probe.byte_utf8[by][1] ? 2 : 1;
        uint64_t slot;
        if (tok_find(b, s, n, &slot) >= 0)
            return lm__error(LM_INVALID_ARGUMENT, "tokenizer train: special token '%.*s' is a byte-level symbol",
                             (int)n, s);
        LM_TRY(tok_add(b, s, n, &byte_id[by]));
    }
    json_t *vocab = json_object(), *merges = json_array();
    for (int32_t id = 0; vocab && id < b->ntok; id++)
        if (json_object_set_new_nocheck(vocab, b->ttext + b->toff[id], json_integer(id)))
            json_decref(vocab), vocab = NULL;
    json_t *root = build_root(pr, o->special_tokens, o->n_special, vocab, merges);
    if (!root) return lm__error(LM_OUT_OF_MEMORY, "tokenizer train: cannot build the tokenizer.json skeleton");
    char *text = NULL;
    size_t len = 0;
    lm_status s = dump_json(root, &text, &len);
    json_decref(root);
    if (s == LM_OK) s = lm_tokenizer_load_json(text, len, tok);
    lm__free(text);
    return s;
}

static lm_status map_inputs(const lm_tokenizer_train_input *inputs, int n, lm_file_map *maps, const uint8_t **data,
                            uint64_t *total) {
    *total = 0;
    for (int i = 0; i < n; i++) {
        if (inputs[i].path) {
            LM_TRY(lm_file_map_open(inputs[i].path, &maps[i]));
            data[i] = maps[i].data;
            *total += maps[i].size;
        } else {
            data[i] = (const uint8_t *)inputs[i].data;
            *total += inputs[i].len;
        }
    }
    return LM_OK;
}

static lm_status make_chunks(const lm_tokenizer_train_input *inputs, int n, const lm_file_map *maps,
                             const uint8_t **data, int gpt2, chunk **out, size_t *count) {
    int64_t cap = 0;
    *count = 0;
    for (int i = 0; i < n; i++) {
        size_t size = inputs[i].path ? maps[i].size : inputs[i].len;
        for (size_t off = 0; off < size;) {
            size_t end = chunk_end(data[i], size, off, gpt2);
            LM_TRY(LM__PUSH(*out, *count, cap, ((chunk){i, off, end - off})));
            off = end;
        }
    }
    return LM_OK;
}

/* Counts every piece of the corpus into workers[0].table. */
static lm_status count_corpus(count_ctx *c, int nthreads, size_t nchunks) {
    lm_threadpool *pool = NULL;
    if (nthreads > 1) LM_TRY(lm_threadpool_create(nthreads, &pool));
    for (int w = 0; w < nthreads; w++) {
        c->workers[w].err_chunk = INT64_MAX;
        lm_status s = lm__tok_state_create(c->tok, 0, &c->workers[w].st);
        if (s != LM_OK) {
            lm_threadpool_destroy(pool);
            return s;
        }
    }
    atomic_store(&c->first_error, INT64_MAX);
    lm_threadpool_run(pool, (int64_t)nchunks, count_task, c);
    lm_threadpool_destroy(pool);
    /* The earliest failing chunk is never skipped (only later ones are), so the error
     * reported does not depend on the thread count or timing. */
    if (atomic_load(&c->first_error) != INT64_MAX) {
        const count_worker *first = &c->workers[0];
        for (int w = 1; w < nthreads; w++)
            if (c->workers[w].err_chunk < first->err_chunk) first = &c->workers[w];
        return lm__error(first->status, "%s", first->detail);
    }
    for (int w = 1; w < nthreads; w++) {
        const wc_table *t = &c->workers[w].table;
        for (size_t i = 0; i < t->n; i++)
            LM_TRY(wc_add(&c->workers[0].table, t->text + t->e[i].off, t->e[i].len, t->e[i].hash, t->e[i].count));
        wc_free(&c->workers[w].table);
    }
    return LM_OK;
}

/* The final tokenizer.json: vocab by id, merges as ["left", "right"] pairs. */
static lm_status write_result(const bpe *b, const preset *pr, const lm_tokenizer_train_options *o, char **json,
                              size_t *len) {
    json_t *vocab = json_object(), *merges = json_array();
    int oom = !vocab || !merges;
    for (int32_t id = 0; !oom && id < b->ntok; id++)
        oom = json_object_set_new_nocheck(vocab, b->ttext + b->toff[id], json_integer(id)) != 0;
    for (size_t i = 0; !oom && i < b->nmerges; i++) {
        int32_t l = (int32_t)(b->merges[i] >> 32), r = (int32_t)(uint32_t)b->merges[i];
        oom = json_array_append_new(merges, json_pack("[s#, s#]", b->ttext + b->toff[l], (int)b->tlen[l],
                                                      b->ttext + b->toff[r], (int)b->tlen[r])) != 0;
    }
    if (oom) {
        json_decref(vocab), json_decref(merges);
        return lm__error(LM_OUT_OF_MEMORY, "tokenizer train: cannot build tokenizer.json");
    }
    json_t *root = build_root(pr, o->special_tokens, o->n_special, vocab, merges);
    if (!root) return lm__error(LM_OUT_OF_MEMORY, "tokenizer train: cannot build tokenizer.json");
    lm_status s = dump_json(root, json, len);
    json_decref(root);
    return s;
}

lm_status lm_tokenizer_train(const lm_tokenizer_train_input *inputs, int n_inputs, const lm_tokenizer_train_options *o,
                             char **json, size_t *len, lm_tokenizer_train_stats *stats) {
    if (!json || !len) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_train: NULL argument");
    *json = NULL, *len = 0;
    const preset *pr = NULL;
    LM_TRY(check_options(inputs, n_inputs, o, &pr));
    double t0 = lm__now_seconds();
    int nthreads = o->n_threads > 0 ? o->n_threads : lm_cpu_get_features()->logical_cpus;
    if (nthreads < 1) nthreads = 1;
    bpe b = {0};
    lm_tokenizer *tok = NULL;
    lm_file_map *maps = lm__calloc((size_t)n_inputs, sizeof *maps);
    const uint8_t **data = lm__calloc((size_t)n_inputs, sizeof *data);
    count_worker *workers = lm__calloc((size_t)nthreads, sizeof *workers);
    chunk *chunks = NULL;
    size_t nchunks = 0;
    int32_t byte_id[256];
    lm_tokenizer_train_progress prog = {.stage = LM_TOKENIZER_TRAIN_COUNT};
    count_ctx c = {.inputs = inputs, .data = data, .workers = workers, .o = o, .prog = &prog, .t0 = t0,
                   .last_report = t0};
    lm_status s = maps && data && workers ? LM_OK : LM_OUT_OF_MEMORY;
    if (s == LM_OK) s = build_skeleton(&b, pr, o, &tok, byte_id);
    if (s == LM_OK) s = map_inputs(inputs, n_inputs, maps, data, &prog.bytes_total);
    if (s == LM_OK) s = make_chunks(inputs, n_inputs, maps, data, pr->regex == NULL, &chunks, &nchunks);
    if (s == LM_OK) {
        c.tok = tok, c.chunks = chunks;
        s = count_corpus(&c, (int)LM_MIN((size_t)nthreads, LM_MAX(nchunks, (size_t)1)), nchunks);
    }
    double t1 = lm__now_seconds();
    if (s == LM_OK) {
        prog.bytes_done = atomic_load(&c.bytes_done), prog.pieces = atomic_load(&c.pieces);
        prog.words = workers[0].table.n;
        prog.merges_max = o->vocab_size - b.ntok;
        report(o, &prog, t0, &c.last_report, 1);
        if (prog.pieces == 0)
            s = lm__error(LM_INVALID_ARGUMENT, "tokenizer train: the corpus is empty (%llu bytes, no text outside "
                                               "special tokens)", (unsigned long long)prog.bytes_total);
    }
    if (s == LM_OK) s = bpe_init_words(&b, &workers[0].table, byte_id);
    for (int w = 0; workers && w < nthreads; w++) {
        lm__tok_state_destroy(workers[w].st);
        wc_free(&workers[w].table);
    }
    for (int i = 0; maps && i < n_inputs; i++) lm_file_map_close(&maps[i]);
    int exhausted = 0;
    prog.stage = LM_TOKENIZER_TRAIN_MERGE;
    if (s == LM_OK) s = bpe_run(&b, o->vocab_size, o->min_frequency, o, &prog, t0, &exhausted);
    double t2 = lm__now_seconds();
    if (s == LM_OK) {
        prog.stage = LM_TOKENIZER_TRAIN_DONE;
        prog.merges_done = (int64_t)b.nmerges;
        report(o, &prog, t0, &c.last_report, 1);
        s = write_result(&b, pr, o, json, len);
    }
    if (s == LM_OK && stats)
        *stats = (lm_tokenizer_train_stats){b.ntok, (int64_t)b.nmerges, prog.bytes_total, prog.pieces, prog.words,
                                            exhausted, t1 - t0, t2 - t1};
    bpe_free(&b);
    lm_tokenizer_destroy(tok);
    lm__free(maps), lm__free(data), lm__free(workers), lm__free(chunks);
    return s;
}

lm_status lm_tokenizer_train_write(const lm_tokenizer_train_input *inputs, int n_inputs,
                                   const lm_tokenizer_train_options *o, const char *path,
                                   lm_tokenizer_train_stats *stats) {
    if (!path) return lm__error(LM_INVALID_ARGUMENT, "lm_tokenizer_train_write: NULL path");
    char *json = NULL;
    size_t len = 0;
    LM_TRY(lm_tokenizer_train(inputs, n_inputs, o, &json, &len, stats));
    lm_status s = lm_file_write_atomic(path, json, len);
    lm_free(json);
    return s;
}
