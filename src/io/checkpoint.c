/* io/checkpoint.c — a Hugging Face checkpoint: one model.safetensors, or shards named
 * by model.safetensors.index.json ({"weight_map": {tensor name: shard file}}).
 *
 * Invariants after lm_checkpoint_open succeeds: every exposed name resolves to an
 * entry of an open shard (checked eagerly, so lookups never fail on a missing shard),
 * each shard file is opened once however many tensors it holds, and the name table
 * is sorted for binary search. Names point into the shards' own string tables.
 */
#include "io/internal.h"

#include <errno.h>
#include <string.h>
#include <sys/stat.h>

typedef struct ck_ref {
    const char *name; /* borrowed from files[file] */
    int file;
    int64_t index; /* entry index inside files[file] */
} ck_ref;

struct lm_checkpoint {
    char *path;
    int nfiles;
    lm_safetensors **files; /* [nfiles] */
    char **file_names;      /* [nfiles] shard names as written in the index (sharded only) */
    int64_t count;
    ck_ref *refs; /* [count] ordered by name */
};

static int cmp_ref(const void *a, const void *b) {
    return strcmp(((const ck_ref *)a)->name, ((const ck_ref *)b)->name);
}

static lm_status open_single(lm_checkpoint *ck, const char *file) {
    ck->files = lm__calloc(1, sizeof *ck->files);
    if (!ck->files) return LM_OUT_OF_MEMORY;
    LM_TRY(lm_safetensors_open(file, &ck->files[0]));
    ck->nfiles = 1;
    ck->count = lm_safetensors_count(ck->files[0]);
    ck->refs = lm__calloc((size_t)ck->count + 1, sizeof *ck->refs);
    if (!ck->refs) return LM_OUT_OF_MEMORY;
    for (int64_t i = 0; i < ck->count; i++) ck->refs[i] = (ck_ref){lm__safetensors_name(ck->files[0], i), 0, i};
    return LM_OK; /* already in name order */
}

/* A shard name must stay inside the directory: relative, with no ".." component. */
static int shard_name_safe(const char *f) {
    if (!*f || f[0] == '/') return 0;
    for (const char *p = f; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') return 0;
        p += n;
        if (*p == '/') p++;
    }
    return 1;
}

/* Index of shard file f in ck->files, opening it on first use. */
static lm_status shard_for(lm_checkpoint *ck, const char *index_path, const char *tensor, const char *f, int *out) {
    for (int i = 0; i < ck->nfiles; i++)
        if (strcmp(ck->file_names[i], f) == 0) {
            *out = i;
            return LM_OK;
        }
    if (!shard_name_safe(f))
        return lm__error(LM_PARSE_ERROR, "index '%s': tensor '%s' maps to shard '%s', which is outside the directory",
                         index_path, tensor, f);
    char *full = lm__io_path_join(ck->path, f);
    if (!full) return LM_OUT_OF_MEMORY;
    lm_status s = LM_OK;
    if (!lm__io_exists(full))
        s = lm__error(LM_NOT_FOUND, "checkpoint '%s': index maps tensor '%s' to shard '%s', which does not exist",
                      ck->path, tensor, f);
    int i = ck->nfiles;
    if (s == LM_OK) s = lm_safetensors_open(full, &ck->files[i]);
    lm__free(full);
    if (s == LM_OK && !(ck->file_names[i] = lm__strdup(f))) {
        lm_safetensors_close(ck->files[i]);
        s = LM_OUT_OF_MEMORY;
    }
    if (s != LM_OK) return s;
    ck->nfiles++;
    *out = i;
    return LM_OK;
}

static lm_status build_sharded(lm_checkpoint *ck, const char *index_path, json_t *root) {
    json_t *map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    if (!json_is_object(map))
        return lm__error(LM_PARSE_ERROR, "index '%s' has no \"weight_map\" object", index_path);
    size_t n = json_object_size(map);
    ck->files = lm__calloc(n + 1, sizeof *ck->files);
    ck->file_names = lm__calloc(n + 1, sizeof *ck->file_names);
    ck->refs = lm__calloc(n + 1, sizeof *ck->refs);
    if (!ck->files || !ck->file_names || !ck->refs) return LM_OUT_OF_MEMORY;
    const char *name;
    json_t *val;
    json_object_foreach(map, name, val) {
        if (!json_is_string(val))
            return lm__error(LM_PARSE_ERROR, "index '%s': weight_map value for tensor '%s' is not a file name string",
                             index_path, name);
        int f = 0;
        LM_TRY(shard_for(ck, index_path, name, json_string_value(val), &f));
        int64_t i = lm__safetensors_lookup(ck->files[f], name);
        if (i < 0)
            return lm__error(LM_NOT_FOUND, "checkpoint '%s': index maps tensor '%s' to shard '%s', which does not "
                             "contain it", ck->path, name, json_string_value(val));
        ck->refs[ck->count++] = (ck_ref){lm__safetensors_name(ck->files[f], i), f, i};
    }
    qsort(ck->refs, (size_t)ck->count, sizeof *ck->refs, cmp_ref);
    return LM_OK;
}

static lm_status open_sharded(lm_checkpoint *ck, const char *index_path) {
    char *text;
    size_t len;
    LM_TRY(lm_file_read_all(index_path, &text, &len));
    json_t *root;
    lm_status s = lm__io_json_parse(text, len, "index", index_path, &root);
    lm__free(text);
    if (s != LM_OK) return s;
    s = build_sharded(ck, index_path, root);
    json_decref(root);
    return s;
}

static lm_status open_dir(lm_checkpoint *ck) {
    char *index = lm__io_path_join(ck->path, "model.safetensors.index.json");
    char *single = lm__io_path_join(ck->path, "model.safetensors");
    lm_status s = LM_OUT_OF_MEMORY;
    if (index && single) {
        /* the order transformers' from_pretrained tries them in; a name that is there
         * but is no regular file (a directory, a FIFO) is opened all the same, so the
         * error says what is wrong with it instead of calling it absent */
        if (lm__io_exists(single)) s = open_single(ck, single);
        else if (lm__io_exists(index)) s = open_sharded(ck, index);
        else
            s = lm__error(LM_NOT_FOUND,
                          "checkpoint '%s' has neither model.safetensors nor model.safetensors.index.json", ck->path);
    }
    lm__free(index);
    lm__free(single);
    return s;
}

lm_status lm_checkpoint_open(const char *path, lm_checkpoint **out) {
    if (!path || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_checkpoint_open: NULL argument");
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb) != 0) {
        int e = errno;
        return lm__error(e == ENOENT ? LM_NOT_FOUND : LM_IO_ERROR, "checkpoint '%s': %s", path, strerror(e));
    }
    lm_checkpoint *ck = lm__calloc(1, sizeof *ck);
    if (!ck) return LM_OUT_OF_MEMORY;
    lm_status s = (ck->path = lm__strdup(path)) ? LM_OK : LM_OUT_OF_MEMORY;
    if (s == LM_OK) s = S_ISDIR(sb.st_mode) ? open_dir(ck) : open_single(ck, path);
    if (s != LM_OK) {
        lm_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return LM_OK;
}

void lm_checkpoint_close(lm_checkpoint *ck) {
    if (!ck) return;
    for (int i = 0; ck->files && i < ck->nfiles; i++) lm_safetensors_close(ck->files[i]);
    for (int i = 0; ck->file_names && i < ck->nfiles; i++) lm__free(ck->file_names[i]);
    lm__free(ck->files);
    lm__free(ck->file_names);
    lm__free(ck->refs);
    lm__free(ck->path);
    lm__free(ck);
}

const char *lm_checkpoint_path(const lm_checkpoint *ck) { return ck->path; }
int64_t lm_checkpoint_count(const lm_checkpoint *ck) { return ck->count; }
int lm_checkpoint_file_count(const lm_checkpoint *ck) { return ck->nfiles; }

const char *lm_checkpoint_name(const lm_checkpoint *ck, int64_t i) {
    return ck && i >= 0 && i < ck->count ? ck->refs[i].name : NULL;
}

static int cmp_key_ref(const void *key, const void *r) { return strcmp(key, ((const ck_ref *)r)->name); }

static lm_status find_ref(const lm_checkpoint *ck, const char *name, const ck_ref **out) {
    *out = bsearch(name, ck->refs, (size_t)ck->count, sizeof *ck->refs, cmp_key_ref);
    if (!*out) return lm__error(LM_NOT_FOUND, "tensor '%s' not found in checkpoint '%s'", name, ck->path);
    return LM_OK;
}

lm_status lm_checkpoint_find(const lm_checkpoint *ck, const char *name, lm_safetensors_entry *entry) {
    if (!ck || !name || !entry) return lm__error(LM_INVALID_ARGUMENT, "lm_checkpoint_find: NULL argument");
    const ck_ref *r;
    LM_TRY(find_ref(ck, name, &r));
    return lm_safetensors_info(ck->files[r->file], r->index, entry);
}

lm_status lm_checkpoint_tensor(const lm_checkpoint *ck, const char *name, lm_tensor **out) {
    if (!ck || !name || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_checkpoint_tensor: NULL argument");
    *out = NULL;
    const ck_ref *r;
    LM_TRY(find_ref(ck, name, &r));
    return lm__safetensors_tensor_at(ck->files[r->file], r->index, out);
}
