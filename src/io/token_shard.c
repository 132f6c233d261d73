/* io/token_shard.c — token shards (format in loom/data.h): the atomic writer, the
 * memory-mapped reader that validates the whole file at open (so reads never fail on
 * content), and lm_data_prepare, which tokenizes text files into one shard.
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

lm_status lm_token_shard_write(const char *path, const int32_t *ids, int64_t n, int64_t vocab_size) {
    if (!path || n < 0 || (n > 0 && !ids) || vocab_size < 0)
        return lm__error(LM_INVALID_ARGUMENT, "lm_token_shard_write: bad arguments");
    for (int64_t i = 0; i < n; i++)
        if (ids[i] < 0 || (vocab_size > 0 && ids[i] >= vocab_size))
            return lm__error(LM_OUT_OF_RANGE, "token shard '%s': token %lld = %d is outside [0, %lld)", path, (long long)i,
                             ids[i], (long long)vocab_size);
    lm_token_dtype dt = vocab_size >= 1 && vocab_size <= 65536 ? LM_TOKENS_U16 : LM_TOKENS_I32;
    size_t es = dt == LM_TOKENS_U16 ? 2 : 4, bytes = LM_TOKEN_SHARD_HEADER + (size_t)n * es;
    uint8_t *buf = lm__alloc(bytes, 8);
    if (!buf) return LM_OUT_OF_MEMORY;
    memcpy(buf, LM_TOKEN_SHARD_MAGIC, 8);
    put_u32(buf + 8, LM_TOKEN_SHARD_VERSION);
    put_u32(buf + 12, (uint32_t)dt);
    put_u64(buf + 16, (uint64_t)n);
    put_u64(buf + 24, (uint64_t)vocab_size);
    uint8_t *p = buf + LM_TOKEN_SHARD_HEADER;
    for (int64_t i = 0; i < n; i++) {
        if (dt == LM_TOKENS_U16) p[2 * i] = (uint8_t)ids[i], p[2 * i + 1] = (uint8_t)(ids[i] >> 8);
        else put_u32(p + 4 * i, (uint32_t)ids[i]);
    }
    lm_status st = lm_file_write_atomic(path, buf, bytes);
    lm__free(buf);
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
        if (t < 0 || (vocab > 0 && t >= (int64_t)vocab))
            return lm__error(LM_PARSE_ERROR, "token shard '%s': token %lld = %lld is outside [0, %llu)", s->path, (long long)i,
                             (long long)t, (unsigned long long)vocab);
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
    if (start < 0 || n < 0 || start > s->count - n)
        return lm__error(LM_OUT_OF_RANGE, "token shard '%s': tokens [%lld, %lld) outside [0, %lld)", s->path,
                         (long long)start, (long long)(start + n), (long long)s->count);
    for (int64_t i = 0; i < n; i++) out[i] = (int32_t)token_at(s, start + i);
    return LM_OK;
}

/* Appends the tokens of one file to *ids (capacity *cap, length *len). */
static lm_status append_file(const lm_tokenizer *tok, const char *path, int32_t **ids, int64_t *len, int64_t *cap,
                             int32_t separator) {
    char *text = NULL;
    size_t size = 0, n = 0;
    int32_t *part = NULL;
    LM_TRY(lm_file_read_all(path, &text, &size));
    lm_status st = lm_tokenizer_encode(tok, text, size, &part, &n);
    if (st != LM_OK) st = lm__error_context(st, "data prepare: '%s'", path);
    if (st == LM_OK) st = lm__reserve((void **)ids, cap, *len + (int64_t)n + 1, sizeof **ids);
    if (st == LM_OK) {
        if (n) memcpy(*ids + *len, part, n * sizeof *part);
        *len += (int64_t)n;
        if (separator >= 0) (*ids)[(*len)++] = separator;
    }
    lm_free(part);
    lm_free(text);
    return st;
}

lm_status lm_data_prepare(const lm_tokenizer *tok, int nfiles, const char *const *inputs, int32_t separator_id,
                          const char *out, int64_t *count) {
    if (!tok || nfiles < 1 || !inputs || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_data_prepare: bad arguments");
    int64_t vocab = lm_tokenizer_vocab_size(tok);
    if (separator_id >= vocab)
        return lm__error(LM_OUT_OF_RANGE, "data prepare: separator id %d is outside the vocabulary of %lld", separator_id,
                         (long long)vocab);
    int32_t *ids = NULL;
    int64_t len = 0, cap = 0;
    lm_status st = LM_OK;
    for (int i = 0; st == LM_OK && i < nfiles; i++) st = append_file(tok, inputs[i], &ids, &len, &cap, separator_id);
    if (st == LM_OK) st = lm_token_shard_write(out, ids, len, vocab);
    if (st == LM_OK && count) *count = len;
    lm__free(ids);
    return st;
}
