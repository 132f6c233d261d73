/* io/safetensors.c — one memory-mapped safetensors file: header validation, the
 * name-ordered entry table, and zero-copy tensors over the mapping.
 *
 * Invariants after lm_safetensors_open succeeds: every entry's byte range
 * [begin, end) lies inside the data section, equals numel * dtype size for dtypes
 * whose size is known, and no two non-empty ranges overlap. The mapping is shared
 * through an atomic reference count: the lm_safetensors object holds one reference
 * and every tensor storage made over it holds another, so tensors outlive close().
 * Validation is O(n log n) in the number of tensors; lookups are binary searches.
 */
#include "io/internal.h"

#include <stdatomic.h>
#include <string.h>

typedef struct st_mapping {
    atomic_int refs;
    lm_file_map map;
} st_mapping;

typedef struct st_entry {
    const char *name;       /* NUL-terminated, in the strings arena */
    const char *dtype_name; /* NUL-terminated, in the strings arena */
    int dtype;              /* lm_dtype, or -1 when loom does not support the dtype */
    int rank;               /* may exceed LM_MAX_DIMS (then shape is not kept) */
    int64_t shape[LM_MAX_DIMS];
    uint64_t begin, end; /* byte range inside the data section */
} st_entry;

struct lm_safetensors {
    char *path;
    st_mapping *mapping;
    const uint8_t *data; /* [data_size] data section inside the mapping */
    uint64_t data_size;
    int64_t count;
    st_entry *entries; /* [count] ordered by name */
    int64_t nmeta;
    const char **meta; /* [2 * nmeta] key, value pairs in the strings arena */
    char *strings;     /* arena of every name, dtype string and metadata string */
};

/* The safetensors dtype vocabulary with element sizes in bits (sub-byte float
 * formats pack elements), and the loom dtype when there is one. */
static const struct {
    const char *name;
    int bits;
    int dtype;
} k_dtypes[] = {
    {"F32", 32, LM_F32},     {"BF16", 16, LM_BF16},   {"F16", 16, LM_F16},   {"I32", 32, LM_I32},
    {"I64", 64, LM_I64},     {"U8", 8, LM_U8},        {"F64", 64, -1},       {"I8", 8, LM_I8},
    {"I16", 16, -1},         {"U16", 16, -1},         {"U32", 32, -1},       {"U64", 64, -1},
    {"BOOL", 8, -1},         {"F8_E5M2", 8, -1},      {"F8_E4M3", 8, LM_F8_E4M3},    {"F8_E8M0", 8, -1},
    {"F6_E2M3", 6, -1},      {"F6_E3M2", 6, -1},      {"F4", 4, -1},         {"C64", 64, -1},
};

static void mapping_release(st_mapping *m) {
    if (!m || atomic_fetch_sub(&m->refs, 1) != 1) return;
    lm_file_map_close(&m->map);
    lm__free(m);
}

/* lm_release_fn of storages that alias the mapping. */
static void storage_release(void *user, void *data) {
    (void)data;
    mapping_release(user);
}

static int find_dtype(const char *name, int *bits, int *dtype) {
    for (size_t i = 0; i < sizeof k_dtypes / sizeof k_dtypes[0]; i++)
        if (strcmp(name, k_dtypes[i].name) == 0) {
            *bits = k_dtypes[i].bits;
            *dtype = k_dtypes[i].dtype;
            return 1;
        }
    return 0;
}

/* Reads a JSON integer in [0, INT64_MAX] into *v. */
static int get_nonneg(const json_t *j, int64_t *v) {
    if (!json_is_integer(j) || json_integer_value(j) < 0) return 0;
    *v = (int64_t)json_integer_value(j);
    return 1;
}

static lm_status parse_shape(const lm_safetensors *st, const char *name, const json_t *shape, st_entry *e,
                             uint64_t *numel) {
    if (!json_is_array(shape))
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': \"shape\" is not an array", st->path, name);
    size_t rank = json_array_size(shape);
    int has_zero = 0;
    for (size_t d = 0; d < rank; d++) {
        int64_t v;
        if (!get_nonneg(json_array_get(shape, d), &v))
            return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': shape[%zu] is not a non-negative integer",
                             st->path, name, d);
        if (d < LM_MAX_DIMS) e->shape[d] = v;
        has_zero |= v == 0;
    }
    e->rank = (int)rank; /* rank <= header bytes / 2 <= 50M: fits */
    *numel = has_zero ? 0 : 1;
    for (size_t d = 0; d < rank && !has_zero; d++) {
        uint64_t v = (uint64_t)json_integer_value(json_array_get(shape, d));
        if (*numel > UINT64_MAX / v)
            return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': element count of the shape overflows",
                             st->path, name);
        *numel *= v;
    }
    return LM_OK;
}

static lm_status parse_offsets(const lm_safetensors *st, const char *name, const json_t *offs, st_entry *e) {
    int64_t b, en;
    if (!json_is_array(offs) || json_array_size(offs) != 2 || !get_nonneg(json_array_get(offs, 0), &b) ||
        !get_nonneg(json_array_get(offs, 1), &en))
        return lm__error(LM_PARSE_ERROR,
                         "safetensors '%s': tensor '%s': \"data_offsets\" is not a [begin, end] pair of "
                         "non-negative integers",
                         st->path, name);
    if (b > en)
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': data_offsets [%lld, %lld] has begin > end",
                         st->path, name, (long long)b, (long long)en);
    if ((uint64_t)en > st->data_size)
        return lm__error(LM_PARSE_ERROR,
                         "safetensors '%s': tensor '%s': data_offsets end %lld is beyond the %llu-byte data section "
                         "(file truncated?)",
                         st->path, name, (long long)en, (unsigned long long)st->data_size);
    e->begin = (uint64_t)b;
    e->end = (uint64_t)en;
    return LM_OK;
}

static lm_status parse_entry(const lm_safetensors *st, const char *name, const json_t *v, st_entry *e) {
    if (!json_is_object(v))
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': entry is not an object", st->path, name);
    static const char *const fields[3] = {"dtype", "shape", "data_offsets"};
    for (int i = 0; i < 3; i++)
        if (!json_object_get(v, fields[i]))
            return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': missing \"%s\"", st->path, name,
                             fields[i]);
    const json_t *dt = json_object_get(v, "dtype");
    if (!json_is_string(dt))
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': \"dtype\" is not a string", st->path, name);
    e->name = name;
    e->dtype_name = json_string_value(dt);
    uint64_t numel = 0;
    LM_TRY(parse_shape(st, name, json_object_get(v, "shape"), e, &numel));
    LM_TRY(parse_offsets(st, name, json_object_get(v, "data_offsets"), e));
    int bits = 0;
    e->dtype = -1;
    if (!find_dtype(e->dtype_name, &bits, &e->dtype)) return LM_OK; /* unknown: size cannot be checked */
    uint64_t have = e->end - e->begin;
    if (numel <= UINT64_MAX / (uint64_t)bits && numel * (uint64_t)bits == have * 8) return LM_OK;
    char sh[160], need[64];
    if (numel > UINT64_MAX / (uint64_t)bits) snprintf(need, sizeof need, "more than 2^64 bits");
    else if (numel * (uint64_t)bits % 8) snprintf(need, sizeof need, "%llu bits, not whole bytes",
                                                  (unsigned long long)(numel * (uint64_t)bits));
    else snprintf(need, sizeof need, "%llu bytes", (unsigned long long)(numel * (uint64_t)bits / 8));
    return lm__error(LM_PARSE_ERROR, "safetensors '%s': tensor '%s': data_offsets span %llu bytes but shape %s of %s "
                     "needs %s", st->path, name, (unsigned long long)have,
                     lm__io_shape_str(e->rank < LM_MAX_DIMS ? e->rank : LM_MAX_DIMS, e->shape, sh, sizeof sh),
                     e->dtype_name, need);
}

static lm_status parse_metadata(const lm_safetensors *st, const json_t *v) {
    if (!json_is_object(v))
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': \"__metadata__\" is not an object", st->path);
    const char *key;
    json_t *val;
    json_object_foreach((json_t *)v, key, val) {
        if (!json_is_string(val))
            return lm__error(LM_PARSE_ERROR, "safetensors '%s': \"__metadata__\" value for '%s' is not a string",
                             st->path, key);
    }
    return LM_OK;
}

typedef struct st_range {
    uint64_t begin, end;
    int64_t index;
} st_range;

static int cmp_range(const void *a, const void *b) {
    const st_range *x = a, *y = b;
    return x->begin < y->begin ? -1 : x->begin > y->begin;
}

static int cmp_entry_name(const void *a, const void *b) {
    return strcmp(((const st_entry *)a)->name, ((const st_entry *)b)->name);
}

/* Non-empty ranges sorted by begin must not overlap their predecessor. */
static lm_status check_overlaps(const lm_safetensors *st) {
    st_range *r = lm__calloc((size_t)st->count + 1, sizeof *r);
    if (!r) return LM_OUT_OF_MEMORY;
    int64_t n = 0;
    for (int64_t i = 0; i < st->count; i++)
        if (st->entries[i].end > st->entries[i].begin)
            r[n++] = (st_range){st->entries[i].begin, st->entries[i].end, i};
    qsort(r, (size_t)n, sizeof *r, cmp_range);
    lm_status s = LM_OK;
    for (int64_t i = 1; i < n && s == LM_OK; i++)
        if (r[i].begin < r[i - 1].end)
            s = lm__error(LM_PARSE_ERROR,
                          "safetensors '%s': tensor '%s' bytes [%llu, %llu) overlap tensor '%s' bytes [%llu, %llu)",
                          st->path, st->entries[r[i].index].name, (unsigned long long)r[i].begin,
                          (unsigned long long)r[i].end, st->entries[r[i - 1].index].name,
                          (unsigned long long)r[i - 1].begin, (unsigned long long)r[i - 1].end);
    lm__free(r);
    return s;
}

static char *arena_put(char **cursor, const char *s) {
    size_t n = strlen(s) + 1;
    char *d = *cursor;
    memcpy(d, s, n);
    *cursor += n;
    return d;
}

/* Validates every entry of the parsed header, then copies the strings out of the
 * JSON tree (which is freed afterwards) and orders the entries by name. */
static lm_status build_table(lm_safetensors *st, json_t *root) {
    if (!json_is_object(root))
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': header is not a JSON object", st->path);
    const json_t *metadata = json_object_get(root, "__metadata__");
    if (metadata) LM_TRY(parse_metadata(st, metadata));
    st->nmeta = metadata ? (int64_t)json_object_size(metadata) : 0;
    st->count = (int64_t)json_object_size(root) - (metadata ? 1 : 0);
    st->entries = lm__calloc((size_t)st->count + 1, sizeof *st->entries);
    st->meta = lm__calloc((size_t)st->nmeta * 2 + 1, sizeof *st->meta);
    if (!st->entries || !st->meta) return LM_OUT_OF_MEMORY;
    size_t bytes = 1, k = 0;
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) continue;
        LM_TRY(parse_entry(st, key, val, &st->entries[k]));
        bytes += strlen(key) + strlen(st->entries[k].dtype_name) + 2;
        k++;
    }
    if (metadata) {
        k = 0;
        json_object_foreach((json_t *)metadata, key, val) {
            st->meta[k++] = key;
            st->meta[k++] = json_string_value(val);
            bytes += strlen(key) + strlen(json_string_value(val)) + 2;
        }
    }
    LM_TRY(check_overlaps(st));
    char *cursor = st->strings = lm__alloc(bytes, 1);
    if (!cursor) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < st->count; i++) {
        st->entries[i].name = arena_put(&cursor, st->entries[i].name);
        st->entries[i].dtype_name = arena_put(&cursor, st->entries[i].dtype_name);
    }
    for (int64_t i = 0; i < 2 * st->nmeta; i++) st->meta[i] = arena_put(&cursor, st->meta[i]);
    qsort(st->entries, (size_t)st->count, sizeof *st->entries, cmp_entry_name);
    return LM_OK;
}

static lm_status read_header(lm_safetensors *st) {
    const lm_file_map *m = &st->mapping->map;
    if (m->size < 8)
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': file is %zu bytes, shorter than the 8-byte header length",
                         st->path, m->size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | m->data[i]; /* little-endian u64 */
    if (n > LM_SAFETENSORS_MAX_HEADER)
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': header length %llu exceeds the %llu-byte limit", st->path,
                         (unsigned long long)n, (unsigned long long)LM_SAFETENSORS_MAX_HEADER);
    if (n > m->size - 8)
        return lm__error(LM_PARSE_ERROR, "safetensors '%s': header length %llu exceeds the %zu bytes after it",
                         st->path, (unsigned long long)n, m->size - 8);
    st->data = m->data + 8 + n;
    st->data_size = m->size - 8 - n;
    json_t *root;
    LM_TRY(lm__io_json_parse((const char *)m->data + 8, (size_t)n, "safetensors header of", st->path, &root));
    lm_status s = build_table(st, root);
    json_decref(root);
    return s;
}

lm_status lm_safetensors_open(const char *path, lm_safetensors **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_safetensors_open: NULL argument");
    *out = NULL;
    lm_safetensors *st = lm__calloc(1, sizeof *st);
    if (!st) return LM_OUT_OF_MEMORY;
    lm_status s = LM_OUT_OF_MEMORY;
    st->mapping = lm__calloc(1, sizeof *st->mapping);
    if (st->mapping) atomic_init(&st->mapping->refs, 1); /* before anything can fail: close() drops it */
    st->path = lm__strdup(path);
    if (st->path && st->mapping) {
        s = lm_file_map_open(path, &st->mapping->map);
        if (s == LM_OK) s = read_header(st);
    }
    if (s != LM_OK) {
        lm_safetensors_close(st);
        return s;
    }
    *out = st;
    return LM_OK;
}

void lm_safetensors_close(lm_safetensors *st) {
    if (!st) return;
    mapping_release(st->mapping);
    lm__free(st->entries);
    lm__free(st->meta);
    lm__free(st->strings);
    lm__free(st->path);
    lm__free(st);
}

const char *lm_safetensors_path(const lm_safetensors *st) { return st->path; }
int64_t lm_safetensors_count(const lm_safetensors *st) { return st->count; }

static int cmp_key_entry(const void *key, const void *e) { return strcmp(key, ((const st_entry *)e)->name); }

int64_t lm__safetensors_lookup(const lm_safetensors *st, const char *name) {
    const st_entry *e = bsearch(name, st->entries, (size_t)st->count, sizeof *st->entries, cmp_key_entry);
    return e ? (int64_t)(e - st->entries) : -1;
}

const char *lm__safetensors_name(const lm_safetensors *st, int64_t i) { return st->entries[i].name; }

lm_status lm_safetensors_info(const lm_safetensors *st, int64_t i, lm_safetensors_entry *entry) {
    if (!st || !entry) return lm__error(LM_INVALID_ARGUMENT, "lm_safetensors_info: NULL argument");
    if (i < 0 || i >= st->count)
        return lm__error(LM_OUT_OF_RANGE, "safetensors '%s': entry %lld out of range [0, %lld)", st->path,
                         (long long)i, (long long)st->count);
    const st_entry *e = &st->entries[i];
    *entry = (lm_safetensors_entry){.name = e->name, .dtype_name = e->dtype_name, .dtype = (lm_dtype)e->dtype,
                                    .data = st->data + e->begin, .nbytes = (size_t)(e->end - e->begin),
                                    .file = st->path};
    if (e->rank > LM_MAX_DIMS)
        return lm__error(LM_UNSUPPORTED, "safetensors '%s': tensor '%s' has %d dimensions; loom supports at most %d",
                         st->path, e->name, e->rank, LM_MAX_DIMS);
    entry->ndim = e->rank;
    memcpy(entry->shape, e->shape, sizeof e->shape);
    if (e->dtype < 0)
        return lm__error(LM_UNSUPPORTED,
                         "safetensors '%s': tensor '%s' has dtype '%s'; loom supports F32, BF16, F16, I32, I64, U8",
                         st->path, e->name, e->dtype_name);
    return LM_OK;
}

lm_status lm_safetensors_find(const lm_safetensors *st, const char *name, lm_safetensors_entry *entry) {
    if (!st || !name || !entry) return lm__error(LM_INVALID_ARGUMENT, "lm_safetensors_find: NULL argument");
    int64_t i = lm__safetensors_lookup(st, name);
    if (i < 0) return lm__error(LM_NOT_FOUND, "tensor '%s' not found in safetensors '%s'", name, st->path);
    return lm_safetensors_info(st, i, entry);
}

const char *lm_safetensors_metadata(const lm_safetensors *st, const char *key) {
    for (int64_t i = 0; st && key && i < st->nmeta; i++)
        if (strcmp(st->meta[2 * i], key) == 0) return st->meta[2 * i + 1];
    return NULL;
}

lm_status lm__safetensors_tensor_at(const lm_safetensors *st, int64_t i, lm_tensor **out) {
    *out = NULL;
    lm_safetensors_entry e;
    LM_TRY(lm_safetensors_info(st, i, &e));
    size_t esize = lm_dtype_size(e.dtype);
    if ((uintptr_t)e.data % esize != 0) {
        /* unaligned for the element type: typed loads would be undefined, so copy */
        LM_TRY(lm_tensor_create(lm_device_cpu(), e.dtype, e.ndim, e.shape, out));
        if (e.nbytes) memcpy(lm_tensor_data(*out), e.data, e.nbytes);
        return LM_OK;
    }
    lm_storage *s;
    atomic_fetch_add(&st->mapping->refs, 1);
    lm_status rc = lm_storage_wrap(lm_device_cpu(), (void *)e.data, e.nbytes, storage_release, st->mapping, &s);
    if (rc != LM_OK) {
        mapping_release(st->mapping);
        return rc;
    }
    rc = lm_tensor_from_storage(s, e.dtype, e.ndim, e.shape, NULL, 0, out);
    lm_storage_release(s); /* the tensor holds its own reference */
    return rc;
}

lm_status lm_safetensors_tensor(const lm_safetensors *st, const char *name, lm_tensor **out) {
    if (!st || !name || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_safetensors_tensor: NULL argument");
    *out = NULL;
    int64_t i = lm__safetensors_lookup(st, name);
    if (i < 0) return lm__error(LM_NOT_FOUND, "tensor '%s' not found in safetensors '%s'", name, st->path);
    return lm__safetensors_tensor_at(st, i, out);
}
