/* io/token_shard.c — token shards (format in loom/data.h): the atomic writer, the
 * memory-mapped reader that validates the whole file at open (so reads never fail on
 * content), and lm_data_prepare, which tokenizes text files into one shard, streaming
 * the ids of each file into the shard's final form as they are made.
 */
#include "io/internal.h"
#include "loom/data.h"
#include "loom/io_write.h"

#include <string.h>

struct lm_token_shard {
    lm_file_map map;
    char *path;
    lm_token_dtype dtype;
    int64_t count, vocab;
    const uint8_t *tokens; /* [count * element size] inside the mapping */
};

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

/* The error for token `index` = id outside the vocabulary; a shard that records no
 * vocabulary (0) bounds its ids only by being non-negative. */
static lm_status bad_token(lm_status status, const char *path, int64_t index, int64_t id, int64_t vocab) {
    if (vocab > 0)
        return lm__error(status, "token shard '%s': token %lld = %lld is outside [0, %lld)", path, (long long)index,
                         (long long)id, (long long)vocab);
    return lm__error(status, "token shard '%s': token %lld = %lld is negative (the shard records no vocabulary size: "
                     "its ids are bounded only by the model's vocabulary, and are never negative)", path,
                     (long long)index, (long long)id);
}

/* A shard built in memory: the header, then the tokens at their final width, so a
 * shard being prepared is held once, at its file size (2 bytes a token for a
 * vocabulary of at most 65536 ids), not first as int32 ids. */
typedef struct shard_buf {
    const char *path; /* for messages */
    int64_t vocab;    /* 0: not recorded */
    lm_token_dtype dtype;
    size_t es;        /* bytes per token */
    uint8_t *data;    /* [cap] header + count tokens */
    int64_t cap, count;
} shard_buf;

/* An empty shard with room for `expect` tokens. */
static lm_status shard_init(shard_buf *b, const char *path, int64_t vocab, int64_t expect) {
    b->data = NULL;
    b->path = path;
    b->vocab = vocab;
    b->dtype = vocab >= 1 && vocab <= 65536 ? LM_TOKENS_U16 : LM_TOKENS_I32;
    b->es = b->dtype == LM_TOKENS_U16 ? 2 : 4;
    b->count = 0;
    if ((uint64_t)expect > (INT64_MAX - LM_TOKEN_SHARD_HEADER) / b->es)
        return lm__error(LM_OUT_OF_MEMORY, "token shard '%s': %lld tokens do not fit in memory", path,
                         (long long)expect);
    b->cap = (int64_t)(LM_TOKEN_SHARD_HEADER + (size_t)expect * b->es);
    b->data = lm__alloc((size_t)b->cap, 8);
    return b->data ? LM_OK : LM_OUT_OF_MEMORY;
}

/* Appends ids[0..n) (each must lie in the vocabulary); an lm__tok_sink. */
static lm_status shard_append(void *arg, const int32_t *ids, size_t n) {
    shard_buf *b = arg;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < 0 || (b->vocab > 0 && ids[i] >= b->vocab))
            return bad_token(LM_OUT_OF_RANGE, b->path, b->count + (int64_t)i, ids[i], b->vocab);
    size_t used = LM_TOKEN_SHARD_HEADER + (size_t)b->count * b->es;
    if (n > (INT64_MAX - used) / b->es)
        return lm__error(LM_OUT_OF_MEMORY, "token shard '%s': %lld + %zu tokens do not fit in memory", b->path,
                         (long long)b->count, n);
    LM_TRY(lm__reserve((void **)&b->data, &b->cap, (int64_t)(used + n * b->es), 1));
    uint8_t *p = b->data + used;
    for (size_t i = 0; i < n; i++) {
        if (b->dtype == LM_TOKENS_U16) p[2 * i] = (uint8_t)ids[i], p[2 * i + 1] = (uint8_t)(ids[i] >> 8);
        else put_u32(p + 4 * i, (uint32_t)ids[i]);
    }
    b->count += (int64_t)n;
    return LM_OK;
}

/* Fills in the header and writes the shard to its path atomically. */
static lm_status shard_commit(shard_buf *b) {
    memcpy(b->data, LM_TOKEN_SHARD_MAGIC, 8);
    put_u32(b->data + 8, LM_TOKEN_SHARD_VERSION);
    put_u32(b->data + 12, (uint32_t)b->dtype);
    put_u64(b->data + 16, (uint64_t)b->count);
    put_u64(b->data + 24, (uint64_t)b->vocab);
    return lm_file_write_atomic(b->path, b->data, LM_TOKEN_SHARD_HEADER + (size_t)b->count * b->es);
}

lm_status lm_token_shard_write(const char *path, const int32_t *ids, int64_t n, int64_t vocab_size) {
    if (!path || n < 0 || (n > 0 && !ids) || vocab_size < 0)
        return lm__error(LM_INVALID_ARGUMENT, "lm_token_shard_write: bad arguments");
    shard_buf b;
    lm_status st = shard_init(&b, path, vocab_size, n);
    if (st == LM_OK) st = shard_append(&b, ids, (size_t)n);
    if (st == LM_OK) st = shard_commit(&b);
    lm__free(b.data);
    return st;
}

static int64_t token_at(const lm_token_shard *s, int64_t i) {
    const uint8_t *p = s->tokens + i * (s->dtype == LM_TOKENS_U16 ? 2 : 4);
    return s->dtype == LM_TOKENS_U16 ? (int64_t)(p[0] | p[1] << 8) : (int64_t)(int32_t)get_u32(p);
}

static lm_status validate(lm_token_shard *s) {
    const uint8_t *d = s->map.data;
    size_t size = s->map.size;
    if (size < LM_TOKEN_SHARD_HEADER || memcmp(d, LM_TOKEN_SHARD_MAGIC, 8) != 0)
        return lm__error(LM_PARSE_ERROR, "token shard '%s': not a token shard (bad magic or shorter than %d bytes)", s->path,
                         LM_TOKEN_SHARD_HEADER);
    uint32_t version = get_u32(d + 8), dt = get_u32(d + 12);
    if (version != LM_TOKEN_SHARD_VERSION)
        return lm__error(LM_PARSE_ERROR, "token shard '%s': version %u is not supported (expected %u)", s->path, version,
                         LM_TOKEN_SHARD_VERSION);
    if (dt != LM_TOKENS_U16 && dt != LM_TOKENS_I32)
        return lm__error(LM_PARSE_ERROR, "token shard '%s': unknown token dtype %u", s->path, dt);
    uint64_t n = get_u64(d + 16), vocab = get_u64(d + 24), es = dt == LM_TOKENS_U16 ? 2 : 4;
    if (n > (UINT64_MAX - LM_TOKEN_SHARD_HEADER) / es || LM_TOKEN_SHARD_HEADER + n * es != size)
        return lm__error(LM_PARSE_ERROR, "token shard '%s': header says %llu tokens (%llu bytes) but the file has %zu bytes",
                         s->path, (unsigned long long)n, (unsigned long long)(LM_TOKEN_SHARD_HEADER + n * es), size);
    if (vocab > INT32_MAX) return lm__error(LM_PARSE_ERROR, "token shard '%s': vocabulary size %llu", s->path, (unsigned long long)vocab);
    s->dtype = (lm_token_dtype)dt;
    s->count = (int64_t)n;
    s->vocab = (int64_t)vocab;
    s->tokens = d + LM_TOKEN_SHARD_HEADER;
    for (int64_t i = 0; i < s->count; i++) {
        int64_t t = token_at(s, i);
        if (t < 0 || (vocab > 0 && t >= (int64_t)vocab)) return bad_token(LM_PARSE_ERROR, s->path, i, t, s->vocab);
    }
    return LM_OK;
}

lm_status lm_token_shard_open(const char *path, lm_token_shard **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_token_shard_open: NULL argument");
    *out = NULL;
    lm_token_shard *s = lm__calloc(1, sizeof *s);
    if (!s || !(s->path = lm__strdup(path))) {
        lm__free(s);
        return LM_OUT_OF_MEMORY;
    }
    lm_status st = lm_file_map_open(path, &s->map);
    if (st == LM_OK) st = validate(s);
    if (st != LM_OK) {
        lm_token_shard_close(s);
        return st;
    }
    *out = s;
    return LM_OK;
}

void lm_token_shard_close(lm_token_shard *s) {
    if (!s) return;
    lm_file_map_close(&s->map);
    lm__free(s->path);
    lm__free(s);
}

int64_t lm_token_shard_count(const lm_token_shard *s) { return s->count; }
int64_t lm_token_shard_vocab(const lm_token_shard *s) { return s->vocab; }
lm_token_dtype lm_token_shard_dtype(const lm_token_shard *s) { return s->dtype; }

lm_status lm_token_shard_read(const lm_token_shard *s, int64_t start, int64_t n, int32_t *out) {
    if (start < 0 || n < 0 || start > s->count - n) /* count - n >= -INT64_MAX: no overflow */
        return lm__error(LM_OUT_OF_RANGE, "token shard '%s': %lld tokens from token %lld are outside its %lld tokens",
                         s->path, (long long)n, (long long)start, (long long)s->count);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)token_at(s, start + i);
    return LM_OK;
}

lm_status lm_data_prepare(const lm_tokenizer *tok, int nfiles, const char *const *inputs, int32_t separator_id,
                          const char *out, int64_t *count) {
    if (!tok || nfiles < 1 || !inputs || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_data_prepare: bad arguments");
    int64_t vocab = lm_tokenizer_vocab_size(tok);
    if (separator_id >= vocab)
        return lm__error(LM_OUT_OF_RANGE, "data prepare: separator id %d is outside the vocabulary of %lld", separator_id,
                         (long long)vocab);
    /* Each file is read whole and its ids go straight into the shard as the encoder
     * makes them: memory is the largest input plus the shard. */
    shard_buf b;
    lm_status st = shard_init(&b, out, vocab, 0);
    for (int i = 0; st == LM_OK && i < nfiles; i++) {
        char *text = NULL;
        size_t size = 0;
        st = lm_file_read_all(inputs[i], &text, &size);
        if (st == LM_OK && (st = lm__tokenizer_encode_each(tok, text, size, shard_append, &b)) != LM_OK)
            st = lm__error_context(st, "data prepare: '%s'", inputs[i]);
        if (st == LM_OK && separator_id >= 0) st = shard_append(&b, &separator_id, 1);
        lm__free(text);
    }
    if (st == LM_OK) st = shard_commit(&b);
    if (st == LM_OK && count) *count = b.count;
    lm__free(b.data);
    return st;
}
