/* plan/layout.c — value layouts over tiles: shard grid, padding, storage order,
 * affine tile placement and replica axes, plus mapping layouts through views.
 *
 * A layout splits each dim into blocks of block[d] elements (grid[d] =
 * ceil(dims/block) shards, the last one possibly short; storage is padded to full
 * blocks). Shard coordinates c and replica coordinates r live on tile
 * tile0 + sum c[d]*tstride[d] + sum r[a]*rstride[a]. Canonical form: grid-1 dims and
 * empty replica axes have zero strides, so equal placements compare equal.
 * Mapping layouts through views lives in views.c.
 */
#include "plan/internal.h"

#include <stdio.h>

void lm__plan_layout_canon(lm__plan_layout *l) {
    /* storage order: dims with block > 1 keep their relative order, unit blocks go
     * innermost in index order (they do not change any stride) */
    int8_t ord[LM__PLAN_MAX_DIMS];
    int k = 0;
    for (int i = 0; i < l->ndim; i++)
        if (l->block[l->order[i]] > 1) ord[k++] = l->order[i];
    for (int d = 0; d < l->ndim; d++)
        if (l->block[d] <= 1) ord[k++] = (int8_t)d;
    for (int i = 0; i < l->ndim; i++) l->order[i] = ord[i];
    for (int d = 0; d < LM__PLAN_MAX_DIMS; d++) {
        if (d >= l->ndim) {
            l->dims[d] = l->block[d] = l->grid[d] = l->tstride[d] = 0;
            l->order[d] = 0;
        } else if (l->grid[d] == 1) {
            l->tstride[d] = 0;
        }
    }
    k = 0;
    for (int a = 0; a < l->nrep; a++)
        if (l->rcount[a] > 1) {
            l->rcount[k] = l->rcount[a];
            l->rstride[k] = l->rstride[a];
            k++;
        } else if (a == 0 && l->partial) {
            l->partial = 0; /* a single contributor is the full value */
        }
    l->nrep = (int8_t)k;
    for (int a = k; a < LM__PLAN_MAX_REP; a++) l->rcount[a] = l->rstride[a] = 0;
    if (!l->nrep) l->partial = 0;
}

void lm__plan_layout_init(lm__plan_layout *l, int ndim, const int64_t *dims, lm_dtype dt) {
    memset(l, 0, sizeof *l);
    l->ndim = (int8_t)ndim;
    l->dtype = dt;
    for (int d = 0; d < ndim; d++) {
        l->dims[d] = l->block[d] = dims[d];
        l->grid[d] = 1;
        l->order[d] = (int8_t)d;
    }
    lm__plan_layout_canon(l);
}

void lm__plan_layout_set_block(lm__plan_layout *l, int d, int64_t block) {
    if (block < 1) block = 1;
    if (block > l->dims[d]) block = l->dims[d];
    l->block[d] = block;
    l->grid[d] = lm__plan_ceil_div(l->dims[d], block);
    if (l->grid[d] == 1) l->tstride[d] = 0;
}

int lm__plan_layout_add_rep(lm__plan_layout *l, int64_t count, int64_t stride) {
    if (count <= 1) return 1;
    if (l->nrep >= LM__PLAN_MAX_REP) return 0;
    l->rcount[l->nrep] = count;
    l->rstride[l->nrep] = stride;
    l->nrep++;
    return 1;
}

int64_t lm__plan_layout_shards(const lm__plan_layout *l) {
    int64_t n = 1;
    for (int d = 0; d < l->ndim; d++) n *= l->grid[d];
    return n;
}

int64_t lm__plan_layout_reps(const lm__plan_layout *l) {
    int64_t n = 1;
    for (int a = 0; a < l->nrep; a++) n *= l->rcount[a];
    return n;
}

int64_t lm__plan_layout_shard_elems(const lm__plan_layout *l) {
    int64_t n = 1;
    for (int d = 0; d < l->ndim; d++) n *= l->block[d];
    return n;
}

int64_t lm__plan_layout_shard_bytes(const lm__plan_layout *l) {
    return lm__plan_layout_shard_elems(l) * (int64_t)lm_dtype_size(l->dtype);
}

void lm__plan_layout_strides(const lm__plan_layout *l, int64_t *strides) {
    int64_t s = 1;
    for (int i = l->ndim - 1; i >= 0; i--) {
        int d = l->order[i];
        strides[d] = s;
        s *= l->block[d];
    }
}

void lm__plan_layout_coord(const lm__plan_layout *l, int64_t shard, int64_t *coord) {
    for (int d = l->ndim - 1; d >= 0; d--) {
        coord[d] = shard % l->grid[d];
        shard /= l->grid[d];
    }
}

int64_t lm__plan_layout_tile(const lm__plan_layout *l, int64_t shard, int64_t rep) {
    int64_t t = l->tile0;
    for (int d = l->ndim - 1; d >= 0; d--) {
        t += (shard % l->grid[d]) * l->tstride[d];
        shard /= l->grid[d];
    }
    for (int a = l->nrep - 1; a >= 0; a--) {
        t += (rep % l->rcount[a]) * l->rstride[a];
        rep /= l->rcount[a];
    }
    return t;
}

int lm__plan_layout_box(const lm__plan_layout *l, int64_t shard, int64_t *lo, int64_t *hi) {
    int64_t c[LM__PLAN_MAX_DIMS];
    lm__plan_layout_coord(l, shard, c);
    int nonempty = 1;
    for (int d = 0; d < l->ndim; d++) {
        lo[d] = c[d] * l->block[d];
        hi[d] = LM_MIN(l->dims[d], lo[d] + l->block[d]);
        if (lo[d] >= hi[d]) nonempty = 0;
    }
    return nonempty;
}

int lm__plan_layout_valid(const lm__plan_layout *l, int64_t tiles) {
    if (l->tile0 < 0) return 0;
    int64_t max = l->tile0, count = 1;
    for (int d = 0; d < l->ndim; d++) {
        if (l->tstride[d] < 0 || l->block[d] < 1 || l->grid[d] != lm__plan_ceil_div(l->dims[d], l->block[d])) return 0;
        max += (l->grid[d] - 1) * l->tstride[d];
        count *= l->grid[d];
    }
    for (int a = 0; a < l->nrep; a++) {
        if (l->rstride[a] < 0) return 0;
        max += (l->rcount[a] - 1) * l->rstride[a];
        count *= l->rcount[a];
    }
    if (max >= tiles || count > tiles) return 0;
    uint8_t stack[4096];
    uint8_t *seen = tiles <= (int64_t)sizeof stack ? stack : lm__calloc((size_t)tiles, 1);
    if (!seen) return 0;
    memset(seen, 0, (size_t)LM_MIN(tiles, (int64_t)sizeof stack));
    int ok = 1;
    int64_t S = lm__plan_layout_shards(l), R = lm__plan_layout_reps(l);
    for (int64_t s = 0; s < S && ok; s++)
        for (int64_t r = 0; r < R && ok; r++) {
            int64_t t = lm__plan_layout_tile(l, s, r);
            if (seen[t]) ok = 0;
            seen[t] = 1;
        }
    if (seen != stack) lm__free(seen);
    return ok;
}

void lm__plan_layout_tilemap(const lm__plan_layout *l, int64_t tiles, int32_t *shard_of, int32_t *rep_of) {
    for (int64_t t = 0; t < tiles; t++) shard_of[t] = rep_of[t] = -1;
    int64_t S = lm__plan_layout_shards(l), R = lm__plan_layout_reps(l);
    for (int64_t s = 0; s < S; s++)
        for (int64_t r = 0; r < R; r++) {
            int64_t t = lm__plan_layout_tile(l, s, r);
            shard_of[t] = (int32_t)s;
            rep_of[t] = (int32_t)r;
        }
}

int lm__plan_layout_equal(const lm__plan_layout *a, const lm__plan_layout *b) {
    if (a->ndim != b->ndim || a->nrep != b->nrep || a->partial != b->partial || a->dtype != b->dtype ||
        a->tile0 != b->tile0)
        return 0;
    for (int d = 0; d < a->ndim; d++)
        if (a->dims[d] != b->dims[d] || a->block[d] != b->block[d] || a->tstride[d] != b->tstride[d] ||
            a->order[d] != b->order[d])
            return 0;
    for (int r = 0; r < a->nrep; r++)
        if (a->rcount[r] != b->rcount[r] || a->rstride[r] != b->rstride[r]) return 0;
    return 1;
}

static uint64_t mix(uint64_t h, int64_t v) {
    h ^= (uint64_t)v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
    return h;
}

uint64_t lm__plan_layout_hash(const lm__plan_layout *l) {
    uint64_t h = mix(0, l->ndim * 1000 + l->nrep * 10 + l->partial);
    h = mix(h, (int64_t)l->dtype);
    h = mix(h, l->tile0);
    for (int d = 0; d < l->ndim; d++) {
        h = mix(h, l->dims[d]);
        h = mix(h, l->block[d]);
        h = mix(h, l->tstride[d]);
        h = mix(h, l->order[d]);
    }
    for (int r = 0; r < l->nrep; r++) {
        h = mix(h, l->rcount[r]);
        h = mix(h, l->rstride[r]);
    }
    return h;
}

int lm__plan_layout_project(const lm__plan_layout *lx, int d0, int ndim, const int64_t *dims, lm_dtype dt,
                            lm__plan_layout *out) {
    lm__plan_layout_init(out, ndim, dims, dt);
    for (int i = 0; i < ndim; i++) {
        lm__plan_layout_set_block(out, i, lx->block[d0 + i]);
        out->tstride[i] = lx->tstride[d0 + i];
    }
    out->tile0 = lx->tile0;
    for (int d = 0; d < lx->ndim; d++)
        if ((d < d0 || d >= d0 + ndim) && lx->grid[d] > 1 && !lm__plan_layout_add_rep(out, lx->grid[d], lx->tstride[d]))
            return 0;
    for (int a = 0; a < lx->nrep; a++)
        if (!lm__plan_layout_add_rep(out, lx->rcount[a], lx->rstride[a])) return 0;
    lm__plan_layout_canon(out);
    return 1;
}

void lm__plan_layout_strip_reps(const lm__plan_layout *in, lm__plan_layout *out) {
    *out = *in;
    out->nrep = 0;
    out->partial = 0;
    for (int a = 0; a < LM__PLAN_MAX_REP; a++) out->rcount[a] = out->rstride[a] = 0;
}

void lm__plan_layout_format(const lm__plan_layout *l, char *buf, size_t n) {
    int k = 0;
#define PUT(...) k += snprintf(buf + k, n > (size_t)k ? n - (size_t)k : 0, __VA_ARGS__)
    PUT("[");
    for (int d = 0; d < l->ndim; d++) PUT("%s%lld", d ? "x" : "", (long long)l->dims[d]);
    PUT("]%s blk ", lm_dtype_name(l->dtype));
    for (int d = 0; d < l->ndim; d++) PUT("%s%lld", d ? "x" : "", (long long)l->block[d]);
    PUT(" grid ");
    for (int d = 0; d < l->ndim; d++) PUT("%s%lld", d ? "x" : "", (long long)l->grid[d]);
    PUT(" ts ");
    for (int d = 0; d < l->ndim; d++) PUT("%s%lld", d ? "," : "", (long long)l->tstride[d]);
    for (int a = 0; a < l->nrep; a++)
        PUT(" %s%lld:%lld", a == 0 && l->partial ? "sum" : "rep", (long long)l->rcount[a], (long long)l->rstride[a]);
    int identity = 1;
    for (int d = 0; d < l->ndim; d++) identity &= l->order[d] == d;
    if (!identity) {
        PUT(" ord ");
        for (int d = 0; d < l->ndim; d++) PUT("%s%d", d ? "," : "", l->order[d]);
    }
    PUT(" @%lld", (long long)l->tile0);
#undef PUT
}
