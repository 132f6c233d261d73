/* plan/views.c — layouts, boxes and index maps through views (reshape, permute and
 * their compositions such as split_heads).
 *
 * A view maps a layout when every shard stays a dense box on the same tile with the
 * same bytes: each reshape group of dims is merged into one virtual dim and split
 * again (rules at merge_group / split_group); permute always maps. Boxes map when
 * they stay boxes; the index map view -> root is affine unless a reshape merges
 * input dims. Views therefore never move data; a consumer needing an unmappable
 * layout converts in the root's space instead.
 */
#include "plan/internal.h"

/* ---- views --------------------------------------------------------------------------------------- */
/* One reshape group after merging: a virtual dim of n elements in blocks of b with
 * tile stride ts, stored at storage position pos. */
typedef struct vdim {
    int64_t n, b, ts;
    int pos;
} vdim;

static int order_pos(const lm__plan_layout *l, int d) {
    for (int i = 0; i < l->ndim; i++)
        if (l->order[i] == d) return i;
    return -1;
}

/* Merges dims [d0, d1) of l (outermost first). Rules: dims after some j are whole,
 * dims before j have block 1, dim j any block (exact unless j is the outermost);
 * tile strides nest (outer stride = inner stride x inner grid); dims j.. with
 * block > 1 are adjacent in storage order, outer to inner. */
static int merge_group(const lm__plan_layout *l, int d0, int d1, vdim *v) {
    int j = d1 - 1;
    while (j > d0 && l->block[j] == l->dims[j]) j--;
    for (int i = d0; i < j; i++)
        if (l->block[i] != 1) return 0;
    if (j > d0 && l->dims[j] % l->block[j]) return 0;
    int64_t ts = l->grid[j] > 1 ? l->tstride[j] : 0, span = l->grid[j];
    for (int i = j - 1; i >= d0; i--) {
        if (l->grid[i] > 1 && l->tstride[i] != ts * span) return 0;
        span *= l->grid[i];
    }
    int prev = -1, first = -1;
    for (int i = j; i < d1; i++) {
        if (l->block[i] == 1) continue;
        int p = order_pos(l, i);
        if (prev >= 0) {
            if (p <= prev) return 0;
            for (int q = prev + 1; q < p; q++)
                if (l->block[l->order[q]] != 1) return 0;
        } else {
            first = p;
        }
        prev = p;
    }
    int64_t n = 1, inner = 1;
    for (int i = d0; i < d1; i++) n *= l->dims[i];
    for (int i = j + 1; i < d1; i++) inner *= l->dims[i];
    v->n = n;
    v->b = l->block[j] * inner;
    v->ts = ts;
    v->pos = first >= 0 ? first : order_pos(l, j);
    return 1;
}

/* Splits a virtual dim into dims[0..q) written to out at [o0, o0+q): the block must
 * cover whole inner dims after some j, a divisor-sized part of dim j (any part when
 * j is the outermost) and single indices of the dims before j. */
static int split_group(const vdim *v, const int64_t *dims, int q, lm__plan_layout *out, int o0) {
    int j = q - 1;
    int64_t inner = 1;
    while (j > 0 && v->b % (inner * dims[j]) == 0) {
        inner *= dims[j];
        j--;
    }
    int64_t k = v->b / inner;
    if (k > dims[j] || (j > 0 && dims[j] % k)) return 0;
    int64_t span = 1;
    for (int i = q - 1; i >= 0; i--) {
        int d = o0 + i;
        out->dims[d] = dims[i];
        if (i > j) {
            out->block[d] = dims[i];
            out->grid[d] = 1;
            out->tstride[d] = 0;
        } else if (i == j) {
            out->block[d] = k;
            out->grid[d] = lm__plan_ceil_div(dims[i], k);
            out->tstride[d] = out->grid[d] > 1 ? v->ts : 0;
            span = out->grid[d];
        } else {
            out->block[d] = 1;
            out->grid[d] = dims[i];
            out->tstride[d] = dims[i] > 1 ? v->ts * span : 0;
            span *= dims[i];
        }
    }
    return 1;
}

/* Pairs the dims of a reshape from fdims to tdims into groups whose sizes multiply
 * to the same product (trailing size-1 dims join the group before them): group g
 * covers input dims [gi0[g], gi1[g]) and output dims [go0[g], go1[g]). Returns the
 * group count, or -1 when the shapes cannot be grouped. */
static int reshape_groups(const int64_t *fdims, int fnd, const int64_t *tdims, int tnd, int *gi0, int *gi1, int *go0,
                          int *go1) {
    int i = 0, o = 0, ng = 0;
    while (i < fnd || o < tnd) {
        int i0 = i, o0 = o;
        int64_t pi = i < fnd ? fdims[i++] : 1, po = o < tnd ? tdims[o++] : 1;
        while (pi != po) {
            if (pi < po && i < fnd)
                pi *= fdims[i++];
            else if (po < pi && o < tnd)
                po *= tdims[o++];
            else
                return -1;
        }
        while (i < fnd && fdims[i] == 1 && (o >= tnd || tdims[o] != 1)) i++;
        while (o < tnd && tdims[o] == 1 && (i >= fnd || fdims[i] != 1)) o++;
        gi0[ng] = i0, gi1[ng] = i, go0[ng] = o0, go1[ng] = o;
        ng++;
    }
    return ng;
}

static int reshape_map(const int64_t *fdims, int fnd, const int64_t *tdims, int tnd, const lm__plan_layout *in,
                       lm__plan_layout *out) {
    lm__plan_layout r = *in;
    r.ndim = (int8_t)tnd;
    int gi0[2 * LM__PLAN_MAX_DIMS], gi1[2 * LM__PLAN_MAX_DIMS], go0[2 * LM__PLAN_MAX_DIMS], go1[2 * LM__PLAN_MAX_DIMS];
    int ng = reshape_groups(fdims, fnd, tdims, tnd, gi0, gi1, go0, go1);
    if (ng < 0) return 0;
    vdim vd[2 * LM__PLAN_MAX_DIMS];
    for (int g = 0; g < ng; g++) {
        if (gi1[g] == gi0[g])
            vd[g] = (vdim){1, 1, 0, fnd}; /* only size-1 output dims */
        else if (!merge_group(in, gi0[g], gi1[g], &vd[g]))
            return 0;
        if (go1[g] > go0[g] && !split_group(&vd[g], tdims + go0[g], go1[g] - go0[g], &r, go0[g])) return 0;
    }
    /* storage order: groups by anchor position, each group's out dims outer to inner */
    int used[2 * LM__PLAN_MAX_DIMS] = {0}, k = 0;
    for (int step = 0; step < ng; step++) {
        int best = -1;
        for (int g = 0; g < ng; g++)
            if (!used[g] && (best < 0 || vd[g].pos < vd[best].pos)) best = g;
        used[best] = 1;
        for (int d = go0[best]; d < go1[best]; d++) r.order[k++] = (int8_t)d;
    }
    lm__plan_layout_canon(&r);
    *out = r;
    return 1;
}

static int permute_map(const int *perm, const lm__plan_layout *in, lm__plan_layout *out) {
    lm__plan_layout r = *in;
    int inv[LM__PLAN_MAX_DIMS];
    for (int i = 0; i < in->ndim; i++) inv[perm[i]] = i;
    for (int i = 0; i < in->ndim; i++) {
        r.dims[i] = in->dims[perm[i]];
        r.block[i] = in->block[perm[i]];
        r.grid[i] = in->grid[perm[i]];
        r.tstride[i] = in->tstride[perm[i]];
        r.order[i] = (int8_t)inv[in->order[i]];
    }
    lm__plan_layout_canon(&r);
    *out = r;
    return 1;
}

int lm__plan_view_map(const lm__gop *op, const lm_graph *g, const lm__plan_layout *in, lm__plan_layout *out) {
    const lm__gvalue *vi = &g->values[op->in[0]], *vo = &g->values[op->out];
    if (op->kind == LM__GOP_PERMUTE) return permute_map(op->perm, in, out);
    if (op->kind == LM__GOP_RESHAPE) return reshape_map(vi->dims, vi->ndim, vo->dims, vo->ndim, in, out);
    return 0;
}

int lm__plan_view_unmap(const lm__gop *op, const lm_graph *g, const lm__plan_layout *out,
                        lm__plan_layout *in) {
    const lm__gvalue *vi = &g->values[op->in[0]], *vo = &g->values[op->out];
    if (op->kind == LM__GOP_PERMUTE) {
        int inv[LM__PLAN_MAX_DIMS];
        for (int i = 0; i < vi->ndim; i++) inv[op->perm[i]] = i;
        return permute_map(inv, out, in);
    }
    if (op->kind == LM__GOP_RESHAPE) return reshape_map(vo->dims, vo->ndim, vi->dims, vi->ndim, out, in);
    return 0;
}

int lm__plan_view_chain_map(const lm_graph *g, int v, const lm__plan_layout *root_layout, lm__plan_layout *out) {
    if (g->values[v].root == v) {
        *out = *root_layout;
        return 1;
    }
    const lm__gop *op = &g->ops[g->values[v].op];
    lm__plan_layout mid;
    if (!lm__plan_view_chain_map(g, op->in[0], root_layout, &mid)) return 0;
    return lm__plan_view_map(op, g, &mid, out);
}

int lm__plan_view_chain_unmap(const lm_graph *g, int v, const lm__plan_layout *view_layout,
                              lm__plan_layout *root_layout) {
    if (g->values[v].root == v) {
        *root_layout = *view_layout;
        return 1;
    }
    const lm__gop *op = &g->ops[g->values[v].op];
    lm__plan_layout mid;
    if (!lm__plan_view_unmap(op, g, view_layout, &mid)) return 0;
    return lm__plan_view_chain_unmap(g, op->in[0], &mid, root_layout);
}

/* ---- boxes through views ------------------------------------------------------------------------ */
/* Box of a reshape group [lo, hi) over dims[0..q) as a flat range: dims after the
 * first with extent > 1 must be whole. */
static int box_to_range(const int64_t *dims, int q, const int64_t *lo, const int64_t *hi, int64_t *a, int64_t *b) {
    int i = 0;
    while (i < q && hi[i] - lo[i] == 1) i++;
    for (int k = i + 1; k < q; k++)
        if (lo[k] != 0 || hi[k] != dims[k]) return 0;
    int64_t first = 0, last = 0;
    for (int k = 0; k < q; k++) {
        first = first * dims[k] + lo[k];
        last = last * dims[k] + hi[k] - 1;
    }
    *a = first;
    *b = last + 1;
    return 1;
}

/* A flat range [a, b) over dims[0..q) as a box: inner dims after some j whole, a
 * range of dim j, single indices before j. */
static int range_to_box(const int64_t *dims, int q, int64_t a, int64_t b, int64_t *lo, int64_t *hi) {
    int j = q - 1;
    int64_t inner = 1;
    while (j > 0 && a % (inner * dims[j]) == 0 && b % (inner * dims[j]) == 0 && b - a >= inner * dims[j]) {
        inner *= dims[j];
        j--;
    }
    if (a % inner || b % inner) return 0;
    int64_t ia = a / inner, ib = (b - 1) / inner;
    if (j > 0 && ia / dims[j] != ib / dims[j]) return 0;
    for (int k = q - 1; k > j; k--) lo[k] = 0, hi[k] = dims[k];
    lo[j] = ia % dims[j];
    hi[j] = ib % dims[j] + 1;
    if (j == 0) lo[0] = ia, hi[0] = ib + 1;
    int64_t rest = ia / dims[j];
    for (int k = j - 1; k >= 0; k--) {
        lo[k] = rest % dims[k];
        hi[k] = lo[k] + 1;
        rest /= dims[k];
    }
    return 1;
}

static int reshape_box(const int64_t *fdims, int fnd, const int64_t *tdims, int tnd, const int64_t *flo,
                       const int64_t *fhi, int64_t *tlo, int64_t *thi) {
    int gi0[2 * LM__PLAN_MAX_DIMS], gi1[2 * LM__PLAN_MAX_DIMS], go0[2 * LM__PLAN_MAX_DIMS], go1[2 * LM__PLAN_MAX_DIMS];
    int ng = reshape_groups(fdims, fnd, tdims, tnd, gi0, gi1, go0, go1);
    if (ng < 0) return 0;
    for (int g = 0; g < ng; g++) {
        int64_t a = 0, b = 1;
        if (gi1[g] > gi0[g] && !box_to_range(fdims + gi0[g], gi1[g] - gi0[g], flo + gi0[g], fhi + gi0[g], &a, &b))
            return 0;
        if (go1[g] > go0[g] && !range_to_box(tdims + go0[g], go1[g] - go0[g], a, b, tlo + go0[g], thi + go0[g]))
            return 0;
    }
    return 1;
}

int lm__plan_view_chain_box_unmap(const lm_graph *g, int v, const int64_t *lo, const int64_t *hi, int64_t *rlo,
                                  int64_t *rhi) {
    const lm__gvalue *val = &g->values[v];
    if (val->root == v) {
        for (int d = 0; d < val->ndim; d++) rlo[d] = lo[d], rhi[d] = hi[d];
        return 1;
    }
    const lm__gop *op = &g->ops[val->op];
    const lm__gvalue *in = &g->values[op->in[0]];
    int64_t mlo[LM__PLAN_MAX_DIMS], mhi[LM__PLAN_MAX_DIMS];
    if (op->kind == LM__GOP_PERMUTE) {
        for (int d = 0; d < val->ndim; d++) mlo[op->perm[d]] = lo[d], mhi[op->perm[d]] = hi[d];
    } else if (!reshape_box(val->dims, val->ndim, in->dims, in->ndim, lo, hi, mlo, mhi)) {
        return 0;
    }
    return lm__plan_view_chain_box_unmap(g, op->in[0], mlo, mhi, rlo, rhi);
}

int lm__plan_view_chain_box_map(const lm_graph *g, int v, const int64_t *rlo, const int64_t *rhi, int64_t *lo,
                                int64_t *hi) {
    const lm__gvalue *val = &g->values[v];
    if (val->root == v) {
        for (int d = 0; d < val->ndim; d++) lo[d] = rlo[d], hi[d] = rhi[d];
        return 1;
    }
    const lm__gop *op = &g->ops[val->op];
    const lm__gvalue *in = &g->values[op->in[0]];
    int64_t mlo[LM__PLAN_MAX_DIMS], mhi[LM__PLAN_MAX_DIMS];
    if (!lm__plan_view_chain_box_map(g, op->in[0], rlo, rhi, mlo, mhi)) return 0;
    if (op->kind == LM__GOP_PERMUTE) {
        for (int d = 0; d < val->ndim; d++) lo[d] = mlo[op->perm[d]], hi[d] = mhi[op->perm[d]];
        return 1;
    }
    return reshape_box(in->dims, in->ndim, val->dims, val->ndim, mlo, mhi, lo, hi);
}

/* ---- affine index maps ------------------------------------------------------------------------- */
int lm__plan_view_chain_affine(const lm_graph *g, int v, int64_t A[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS]) {
    const lm__gvalue *val = &g->values[v];
    if (val->root == v) {
        for (int r = 0; r < LM__PLAN_MAX_DIMS; r++)
            for (int i = 0; i < LM__PLAN_MAX_DIMS; i++) A[r][i] = r == i;
        return 1;
    }
    const lm__gop *op = &g->ops[val->op];
    const lm__gvalue *in = &g->values[op->in[0]];
    int64_t B[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS] = {{0}}; /* in coords = B x view coords */
    if (op->kind == LM__GOP_PERMUTE) {
        for (int i = 0; i < val->ndim; i++) B[op->perm[i]][i] = 1;
    } else {
        int i = 0, o = 0;
        while (i < in->ndim || o < val->ndim) {
            int i0 = i, o0 = o;
            int64_t pi = i < in->ndim ? in->dims[i++] : 1, po = o < val->ndim ? val->dims[o++] : 1;
            while (pi != po) {
                if (pi < po && i < in->ndim)
                    pi *= in->dims[i++];
                else if (po < pi && o < val->ndim)
                    po *= val->dims[o++];
                else
                    return 0;
            }
            while (i < in->ndim && in->dims[i] == 1 && (o >= val->ndim || val->dims[o] != 1)) i++;
            while (o < val->ndim && val->dims[o] == 1 && (i >= in->ndim || in->dims[i] != 1)) o++;
            int nonunit = 0, at = i0;
            for (int k = i0; k < i; k++)
                if (in->dims[k] > 1) nonunit++, at = k;
            if (nonunit > 1) return 0; /* merging input dims is not affine */
            int64_t w = 1;
            for (int k = o - 1; k >= o0; k--) {
                if (i > i0) B[at][k] = w;
                w *= val->dims[k];
            }
        }
    }
    int64_t C[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS];
    if (!lm__plan_view_chain_affine(g, op->in[0], C)) return 0;
    for (int r = 0; r < LM__PLAN_MAX_DIMS; r++)
        for (int k = 0; k < LM__PLAN_MAX_DIMS; k++) {
            int64_t s = 0;
            for (int j = 0; j < LM__PLAN_MAX_DIMS; j++) s += C[r][j] * B[j][k];
            A[r][k] = s;
        }
    return 1;
}
