/* ops/ref/embedding.c — readable reference for the embedding lookup
 *   out[p, :] = table[ids[p], :]   for every index p of ids.
 * All ids are validated first, so a bad id leaves out untouched. Rows are copied
 * element by element with lm__ld/lm__st, converted to out's dtype (exact when
 * they share one or out is wider). O(numel(ids) * D). */
#include "ops/ref/embedding.h"

#include <stdio.h>

/* "[i, j, ...]" for an index of ndim entries. */
static const char *index_str(int ndim, const int64_t *idx, char *buf, size_t size) {
    size_t n = (size_t)snprintf(buf, size, "[");
    for (int i = 0; i < ndim && n < size; i++)
        n += (size_t)snprintf(buf + n, size - n, i ? ", %lld" : "%lld", (long long)idx[i]);
    if (n < size) snprintf(buf + n, size - n, "]");
    return buf;
}

static lm_status check_ids(const lm_tensor_view *ids, int64_t vocab) {
    int64_t idx[LM_MAX_DIMS] = {0};
    do {
        int64_t id = lm__ld_index(ids->dtype, ids->data, lm__offset(ids, idx));
        if (id < 0 || id >= vocab) {
            char where[160];
            return lm__error(LM_OUT_OF_RANGE, "embedding: ids%s = %lld is outside [0, %lld) (vocab size %lld)",
                             index_str(ids->ndim, idx, where, sizeof where), (long long)id, (long long)vocab,
                             (long long)vocab);
        }
    } while (lm__nd_next(ids->ndim, ids->shape, idx));
    return LM_OK;
}

lm_status lm__ref_embedding(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out) {
    if (lm_tensor_view_numel(ids) == 0) return LM_OK;
    int64_t vocab = table->shape[0], dim = table->shape[1];
    LM_TRY(check_ids(ids, vocab));
    int64_t idx[LM_MAX_DIMS] = {0}; /* index over ids; idx[ids->ndim] stays 0 for out */
    int64_t ostep = out->stride[out->ndim - 1];
    do {
        int64_t id = lm__ld_index(ids->dtype, ids->data, lm__offset(ids, idx));
        int64_t tb = id * table->stride[0], ob = lm__offset(out, idx);
        for (int64_t k = 0; k < dim; k++)
            lm__st(out->dtype, out->data, ob + k * ostep, lm__ld(table->dtype, table->data, tb + k * table->stride[1]));
    } while (lm__nd_next(ids->ndim, ids->shape, idx));
    return LM_OK;
}
