/* io/safetensors_write.c — the safetensors writer (see loom/io_write.h).
 * Layout: tensors sorted by decreasing element size, then by name, are packed back to
 * back; the JSON header (keys sorted, compact) is padded with spaces to a multiple of
 * 8 bytes, so every tensor starts at an offset that is a multiple of its element size
 * from an 8-aligned data section. Data are written little-endian as stored in memory
 * (loom runs on little-endian hosts). Non-contiguous or device tensors go through a
 * host copy of one tensor at a time. The file is replaced atomically.
 */
#include "io/internal.h"
#include "loom/io_write.h"
#include "runtime/internal.h"

#include <stdlib.h>
#include <string.h>

static const char *st_dtype(lm_dtype dt) {
    switch (dt) {
    case LM_F32: return "F32";
    case LM_BF16: return "BF16";
    case LM_F16: return "F16";
    case LM_I32: return "I32";
    case LM_I64: return "I64";
    case LM_U8: return "U8";
    case LM_I8: return "I8";
    case LM_F8_E4M3: return "F8_E4M3";
    }
    return NULL;
}

typedef struct order_item {
    const char *name;
    size_t esize;
    int index;
} order_item;

static int cmp_item(const void *a, const void *b) {
    const order_item *x = a, *y = b;
    if (x->esize != y->esize) return x->esize > y->esize ? -1 : 1;
    return strcmp(x->name, y->name);
}

static lm_status check_inputs(int n, const char *const *names, const lm_tensor_view *t) {
    for (int i = 0; i < n; i++) {
        if (!names[i] || !names[i][0] || strlen(names[i]) >= 256)
            return lm__error(LM_INVALID_ARGUMENT, "safetensors write: tensor %d has an empty or over-long name", i);
        if (!st_dtype(t[i].dtype))
            return lm__error(LM_UNSUPPORTED, "safetensors write: tensor '%s' has dtype %s", names[i], lm_dtype_name(t[i].dtype));
        for (int j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return lm__error(LM_INVALID_ARGUMENT, "safetensors write: tensor name '%s' appears twice", names[i]);
    }
    return LM_OK;
}

/* The JSON header for the tensors in the given order; *text (NUL-terminated) is owned
 * by the caller (lm__free). */
static lm_status build_header(int n, const char *const *names, const lm_tensor_view *t, const order_item *order,
                              const char *const *meta, char **text) {
    json_t *root = json_object(), *md = meta ? json_object() : NULL;
    int ok = root != NULL && (!meta || md != NULL);
    for (int k = 0; ok && meta && meta[k] && meta[k + 1]; k += 2) ok = json_object_set_new(md, meta[k], json_string(meta[k + 1])) == 0;
    if (ok && md) ok = json_object_set_new(root, "__metadata__", md) == 0, md = NULL;
    uint64_t offset = 0;
    for (int k = 0; ok && k < n; k++) {
        const lm_tensor_view *v = &t[order[k].index];
        uint64_t bytes = (uint64_t)lm_tensor_view_numel(v) * lm_dtype_size(v->dtype);
        json_t *e = json_object(), *shape = json_array(), *offs = json_array();
        ok = e && shape && offs;
        for (int d = 0; ok && d < v->ndim; d++) ok = json_array_append_new(shape, json_integer(v->shape[d])) == 0;
        ok = ok && json_array_append_new(offs, json_integer((json_int_t)offset)) == 0 &&
             json_array_append_new(offs, json_integer((json_int_t)(offset + bytes))) == 0;
        ok = ok && json_object_set_new(e, "dtype", json_string(st_dtype(v->dtype))) == 0 &&
             json_object_set_new(e, "shape", shape) == 0 && json_object_set_new(e, "data_offsets", offs) == 0;
        if (ok) ok = json_object_set_new(root, names[order[k].index], e) == 0;
        else json_decref(e), json_decref(shape), json_decref(offs);
        offset += bytes;
    }
    size_t len = ok ? json_dumpb(root, NULL, 0, JSON_SORT_KEYS | JSON_COMPACT) : 0;
    *text = len ? lm__alloc(len + 1, 1) : NULL;
    if (*text) {
        json_dumpb(root, *text, len, JSON_SORT_KEYS | JSON_COMPACT);
        (*text)[len] = '\0';
    }
    json_decref(root);
    json_decref(md);
    return *text ? LM_OK : lm__error(LM_OUT_OF_MEMORY, "safetensors write: cannot build the header");
}

/* Writes one tensor's bytes in row-major order. */
static lm_status write_tensor(lm_ctx *ctx, lm_atomic_file *f, const lm_tensor_view *v) {
    size_t bytes = (size_t)lm_tensor_view_numel(v) * lm_dtype_size(v->dtype);
    if (bytes == 0) return LM_OK;
    int on_host = lm__device_host_addressable(v->device); /* the host reads its bytes directly */
    if (on_host && lm_tensor_view_is_contiguous(v)) return lm_atomic_file_write(f, v->data, bytes);
    lm_tensor *host = NULL;
    LM_TRY(lm_tensor_create(lm_device_cpu(), v->dtype, v->ndim, v->shape, &host));
    lm_status st;
    if (on_host) st = lm_tensor_view_copy(ctx, lm_tensor_as_view(host), v);
    else if (lm_tensor_view_is_contiguous(v)) st = lm_device_copy(lm_device_cpu(), lm_tensor_data(host), v->device, v->data, bytes);
    else st = lm__error(LM_UNSUPPORTED, "safetensors write: a non-contiguous device tensor (make it contiguous first)");
    if (st == LM_OK) st = lm_atomic_file_write(f, lm_tensor_data(host), bytes);
    lm_tensor_destroy(host);
    return st;
}

lm_status lm_safetensors_write(lm_ctx *ctx, const char *path, int n, const char *const *names,
                               const lm_tensor_view *tensors, const char *const *meta) {
    if (!path || n < 0 || (n > 0 && (!names || !tensors)))
        return lm__error(LM_INVALID_ARGUMENT, "lm_safetensors_write: NULL argument");
    LM_TRY(check_inputs(n, names, tensors));
    order_item *order = lm__calloc((size_t)n + 1, sizeof *order);
    if (!order) return LM_OUT_OF_MEMORY;
    for (int i = 0; i < n; i++) order[i] = (order_item){names[i], lm_dtype_size(tensors[i].dtype), i};
    qsort(order, (size_t)n, sizeof *order, cmp_item);
    char *header = NULL;
    lm_atomic_file *f = NULL;
    lm_status st = build_header(n, names, tensors, order, meta, &header);
    if (st == LM_OK) st = lm_atomic_file_open(path, &f);
    if (st == LM_OK) {
        size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;
        uint8_t len8[8];
        for (int b = 0; b < 8; b++) len8[b] = (uint8_t)((uint64_t)padded >> (8 * b));
        static const char spaces[8] = {' ', ' ', ' ', ' ', ' ', ' ', ' ', ' '};
        st = lm_atomic_file_write(f, len8, 8);
        if (st == LM_OK) st = lm_atomic_file_write(f, header, hlen);
        if (st == LM_OK) st = lm_atomic_file_write(f, spaces, padded - hlen);
        for (int k = 0; st == LM_OK && k < n; k++) st = write_tensor(ctx, f, &tensors[order[k].index]);
        if (st == LM_OK) st = lm_atomic_file_commit(f);
        else lm_atomic_file_abort(f);
    }
    lm__free(header);
    lm__free(order);
    return st;
}
