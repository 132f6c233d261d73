/* ops/ref/embedding_backward.c — readable reference for the embedding gradient
 *   dtable[v, :] = sum over positions p with ids[p] == v of dout[p, :]
 * Positions are grouped by id with a counting sort (stable: each row sums its
 * positions in their row-major order), then every table row is written once, summed
 * in double: duplicates add exactly once per row, unused rows get 0, and the result
 * does not depend on how ids are ordered beyond that. Accumulating, a used row becomes
 * its old value plus that sum (rounded once) and unused rows are left alone. All ids
 * are checked before anything is written. O(numel(ids) * D + V * D) time, O(numel(ids) + V + D) space.
 */
#include "ops/ref/embedding_backward.h"

typedef struct positions {
    int64_t *start; /* [V + 1] first slot of each id in order[] */
    int64_t *order; /* [n] dout row offsets grouped by id */
    int64_t *id;    /* [n] id of position p (row-major over ids) */
    int64_t *off;   /* [n] element offset of dout row p */
} positions;

static lm_status gather(const lm_tensor_view *ids, const lm_tensor_view *dout, int64_t V, int64_t n, positions *ps) {
    int64_t idx[LM_MAX_DIMS] = {0}, p = 0;
    if (n > 0) do {
            int64_t id = lm__ld_index(ids->dtype, ids->data, lm__offset(ids, idx));
            if (id < 0 || id >= V)
                return lm__error(LM_OUT_OF_RANGE, "embedding_backward: id %lld at position %lld is outside [0, %lld)",
                                 (long long)id, (long long)p, (long long)V);
            ps->id[p] = id;
            ps->off[p++] = lm__offset(dout, idx); /* idx[ids->ndim] stays 0: start of the row */
        } while (lm__nd_next(ids->ndim, ids->shape, idx));
    for (int64_t i = 0; i < n; i++) ps->start[ps->id[i] + 1]++;
    for (int64_t v = 0; v < V; v++) ps->start[v + 1] += ps->start[v];
    int64_t *fill = ps->id; /* reuse: ids are no longer needed once counted */
    for (int64_t i = 0; i < n; i++) {
        int64_t v = fill[i];
        fill[i] = ps->start[v]++;
    }
    for (int64_t v = V; v > 0; v--) ps->start[v] = ps->start[v - 1]; /* undo the advance */
    ps->start[0] = 0;
    for (int64_t i = 0; i < n; i++) ps->order[fill[i]] = ps->off[i];
    return LM_OK;
}

lm_status lm__ref_embedding_backward(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                     const lm_tensor_view *dtable, int accumulate) {
    int64_t V = dtable->shape[0], D = dtable->shape[1], n = lm_tensor_view_numel(ids);
    int64_t *ints = lm__calloc((size_t)(V + 1 + 3 * n), sizeof(int64_t));
    double *acc = lm__calloc((size_t)D + 1, sizeof(double));
    lm_status st = (ints && acc) ? LM_OK : lm__error_context(LM_OUT_OF_MEMORY, "embedding_backward workspace");
    positions ps = {ints, ints ? ints + V + 1 : NULL, ints ? ints + V + 1 + n : NULL, ints ? ints + V + 1 + 2 * n : NULL};
    if (st == LM_OK) st = gather(ids, dout, V, n, &ps);
    int64_t ds = dout->stride[dout->ndim - 1];
    for (int64_t v = 0; st == LM_OK && v < V; v++) {
        if (accumulate && ps.start[v] == ps.start[v + 1]) continue;
        for (int64_t d = 0; d < D; d++) acc[d] = 0.0;
        for (int64_t s = ps.start[v]; s < ps.start[v + 1]; s++)
            for (int64_t d = 0; d < D; d++) acc[d] += lm__ld(dout->dtype, dout->data, ps.order[s] + d * ds);
        for (int64_t d = 0; d < D; d++) {
            int64_t o = v * dtable->stride[0] + d * dtable->stride[1];
            lm__st(dtable->dtype, dtable->data, o, accumulate ? lm__ld(dtable->dtype, dtable->data, o) + acc[d] : acc[d]);
        }
    }
    lm__free(ints);
    lm__free(acc);
    return st;
}
