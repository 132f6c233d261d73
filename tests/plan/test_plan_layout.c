/* Layouts, views and redistribution: tile maps are distinct and invertible; a layout
 * mapped through reshape/permute/split_heads addresses every element at the same
 * (tile, offset) as its root layout; boxes and affine maps agree with the element
 * mapping; redistribution pieces cover every destination element exactly once (once
 * per contributor for partial sums) from the shard that holds it, and the exchange
 * statistics add up the remote pieces.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan/internal.h"

#include <stdlib.h>

static void test_layout_tiles_are_distinct_and_invertible(void) {
    int64_t dims[2] = {10, 7};
    lm__plan_layout l;
    lm__plan_layout_init(&l, 2, dims, LM_F16);
    lm__plan_layout_set_block(&l, 0, 3); /* 4 shards, last short */
    lm__plan_layout_set_block(&l, 1, 4); /* 2 shards */
    l.tstride[0] = 2, l.tstride[1] = 1;
    LT_CHECK(lm__plan_layout_add_rep(&l, 2, 8));
    lm__plan_layout_canon(&l);
    LT_CHECK(lm__plan_layout_shards(&l) == 8 && lm__plan_layout_reps(&l) == 2);
    LT_CHECK(lm__plan_layout_shard_bytes(&l) == 3 * 4 * 2);
    LT_CHECK(lm__plan_layout_valid(&l, 16));
    LT_CHECK(!lm__plan_layout_valid(&l, 15)); /* the last tile would be 15 */
    int32_t shard[16], rep[16];
    lm__plan_layout_tilemap(&l, 16, shard, rep);
    for (int64_t s = 0; s < 8; s++)
        for (int64_t r = 0; r < 2; r++) {
            int64_t t = lm__plan_layout_tile(&l, s, r);
            LT_CHECK(shard[t] == s && rep[t] == r);
        }
    int64_t lo[2], hi[2];
    LT_CHECK(lm__plan_layout_box(&l, 7, lo, hi));
    LT_CHECK(lo[0] == 9 && hi[0] == 10 && lo[1] == 4 && hi[1] == 7);
    lm__plan_layout bad = l;
    bad.rstride[0] = 2; /* replicas collide with shards */
    LT_CHECK(!lm__plan_layout_valid(&bad, 64));
    lm__plan_layout same = l;
    LT_CHECK(lm__plan_layout_equal(&l, &same) && lm__plan_layout_hash(&l) == lm__plan_layout_hash(&same));
    same.tile0 = 1;
    LT_CHECK(!lm__plan_layout_equal(&l, &same));
}

/* (tile, byte offset in the shard) of element idx of a value in layout l. */
static void locate(const lm__plan_layout *l, const int64_t *idx, int64_t *tile, int64_t *off) {
    int64_t c[LM__PLAN_MAX_DIMS], st[LM__PLAN_MAX_DIMS], s = 0;
    lm__plan_layout_strides(l, st);
    *off = 0;
    for (int d = 0; d < l->ndim; d++) {
        c[d] = idx[d] / l->block[d];
        s = s * l->grid[d] + c[d];
        *off += (idx[d] - c[d] * l->block[d]) * st[d];
    }
    *tile = lm__plan_layout_tile(l, s, 0);
}

static lm_graph *heads_graph(int64_t T, int64_t H, int64_t D, lm_graph_value *x, lm_graph_value *q,
                                  lm_graph_value *qt, lm_graph_value *m) {
    lm_graph *g = NULL;
    lm_graph_create(&g);
    int64_t s[2] = {T, H * D};
    lm_graph_input(g, "x", LM_F16, 2, s, 1, x);
    lm_graph_split_heads(g, "q", *x, H, q);
    const int perm[3] = {0, 2, 1};
    lm_graph_permute(g, "qt", *q, perm, qt);
    lm_graph_merge_heads(g, "m", *q, m);
    return g;
}

static void random_layout(lt_rng *r, lm__plan_layout *l, int ndim, const int64_t *dims, int64_t tiles) {
    for (;;) {
        lm__plan_layout_init(l, ndim, dims, LM_F16);
        int64_t used = 1;
        for (int d = ndim - 1; d >= 0; d--) {
            lm__plan_layout_set_block(l, d, lt_rng_int(r, 1, dims[d]));
            l->tstride[d] = used;
            used *= l->grid[d];
        }
        int perm[LM__PLAN_MAX_DIMS];
        for (int d = 0; d < ndim; d++) perm[d] = d;
        for (int d = ndim - 1; d > 0; d--) {
            int j = (int)lt_rng_int(r, 0, d), t = perm[d];
            perm[d] = perm[j], perm[j] = t;
        }
        for (int d = 0; d < ndim; d++) l->order[d] = (int8_t)perm[d];
        if (lt_rng_int(r, 0, 2) == 0) lm__plan_layout_add_rep(l, lt_rng_int(r, 2, 3), used);
        lm__plan_layout_canon(l);
        if (lm__plan_layout_valid(l, tiles)) return;
    }
}

static void test_views_address_the_same_bytes(void) {
    lt_rng r = lt_rng_seed(11);
    int64_t T = 6, H = 4, D = 6;
    lm_graph_value x, q, qt, m;
    lm_graph *g = heads_graph(T, H, D, &x, &q, &qt, &m);
    int mapped = 0, tried = 0;
    for (int trial = 0; trial < 400; trial++) {
        lm__plan_layout root;
        int64_t dims[2] = {T, H * D};
        random_layout(&r, &root, 2, dims, 4096);
        lm_graph_value views[3] = {q, qt, m};
        for (int v = 0; v < 3; v++) {
            lm__plan_layout vl, back;
            tried++;
            if (!lm__plan_view_chain_map(g, views[v], &root, &vl)) continue;
            mapped++;
            LT_CHECK(lm__plan_layout_shard_bytes(&vl) == lm__plan_layout_shard_bytes(&root));
            LT_CHECK(lm__plan_view_chain_unmap(g, views[v], &vl, &back) && lm__plan_layout_equal(&back, &root));
            int64_t A[LM__PLAN_MAX_DIMS][LM__PLAN_MAX_DIMS];
            int affine = lm__plan_view_chain_affine(g, views[v], A);
            LT_CHECK(affine == (views[v] != m));
            /* every element: same tile and offset through the view */
            const lm__gvalue *val = &g->values[views[v]];
            int64_t n = lm__gvalue_numel(val);
            for (int64_t i = 0; i < n; i++) {
                int64_t vi[LM__PLAN_MAX_DIMS], ri[2], rem = i;
                for (int d = val->ndim - 1; d >= 0; d--) vi[d] = rem % val->dims[d], rem /= val->dims[d];
                if (views[v] == m) { /* [T, H*D] from [H, T, D]: t, h*D + d */
                    ri[0] = vi[0], ri[1] = vi[1];
                } else if (views[v] == q) { /* [H, T, D] */
                    ri[0] = vi[1], ri[1] = vi[0] * D + vi[2];
                } else { /* [H, D, T] */
                    ri[0] = vi[2], ri[1] = vi[0] * D + vi[1];
                }
                int64_t t1, o1, t2, o2;
                locate(&root, ri, &t1, &o1);
                locate(&vl, vi, &t2, &o2);
                if (t1 != t2 || o1 != o2) {
                    LT_CHECK_MSG(0, "view %d element %lld: tile/offset %lld/%lld vs root %lld/%lld", v, (long long)i,
                                 (long long)t2, (long long)o2, (long long)t1, (long long)o1);
                    break;
                }
                if (affine)
                    for (int rd = 0; rd < 2; rd++) {
                        int64_t s = 0;
                        for (int d = 0; d < val->ndim; d++) s += A[rd][d] * vi[d];
                        LT_CHECK(s == ri[rd]);
                    }
            }
        }
    }
    LT_CHECK_MSG(mapped > tried / 4, "only %d of %d layouts mapped through the views", mapped, tried);
    lm_graph_destroy(g);
}

static void test_boxes_map_through_views(void) {
    lm_graph_value x, q, qt, m;
    lm_graph *g = heads_graph(5, 3, 4, &x, &q, &qt, &m);
    int64_t lo[3] = {1, 0, 2}, hi[3] = {3, 4, 5}, rlo[2], rhi[2], back_lo[3], back_hi[3];
    /* K^T box: heads 1..2, all d, tokens 2..4 -> root rows 2..4, columns 4..11 */
    LT_CHECK(lm__plan_view_chain_box_unmap(g, qt, lo, hi, rlo, rhi));
    LT_CHECK(rlo[0] == 2 && rhi[0] == 5 && rlo[1] == 4 && rhi[1] == 12);
    LT_CHECK(lm__plan_view_chain_box_map(g, qt, rlo, rhi, back_lo, back_hi));
    for (int d = 0; d < 3; d++) LT_CHECK(back_lo[d] == lo[d] && back_hi[d] == hi[d]);
    /* a partial head range over two heads is not a box of the root */
    int64_t plo[3] = {1, 1, 0}, phi[3] = {3, 3, 5};
    LT_CHECK(!lm__plan_view_chain_box_unmap(g, qt, plo, phi, rlo, rhi));
    lm_graph_destroy(g);
}

static void test_redistribution_covers_every_element_once(void) {
    lt_rng r = lt_rng_seed(5);
    lm__plan_ws ws;
    LT_CHECK_OK(lm__plan_ws_init(&ws, 64));
    int64_t dims[3] = {5, 7, 6};
    int64_t n = 5 * 7 * 6;
    for (int trial = 0; trial < 150; trial++) {
        lm__plan_layout s, d;
        random_layout(&r, &s, 3, dims, 64);
        random_layout(&r, &d, 3, dims, 64);
        int partial = trial % 3 == 0 && s.nrep == 0;
        if (partial) {
            int64_t used = 1;
            for (int k = 0; k < 3; k++) used *= s.grid[k];
            if (used * 2 > 64) continue;
            lm__plan_layout_add_rep(&s, 2, used);
            s.partial = 1;
            lm__plan_layout_canon(&s);
            if (!lm__plan_layout_valid(&s, 64)) continue;
        }
        lm__plan_piece *pc = NULL;
        int64_t np = 0;
        LT_CHECK_OK(lm__plan_redist_pieces(&s, &d, &ws, &pc, &np));
        int64_t R = lm__plan_layout_reps(&d), contributors = partial ? 2 : 1;
        int *cover = calloc((size_t)(n * R), sizeof(int));
        int64_t remote = 0;
        for (int64_t k = 0; k < np; k++) {
            const lm__plan_piece *p = &pc[k];
            int64_t slo[3], shi[3], dlo[3], dhi[3];
            lm__plan_layout_box(&s, p->src_shard, slo, shi);
            lm__plan_layout_box(&d, p->dst_shard, dlo, dhi);
            LT_CHECK(lm__plan_layout_tile(&s, p->src_shard, p->src_rep) == p->src_tile);
            LT_CHECK(lm__plan_layout_tile(&d, p->dst_shard, p->dst_rep) == p->dst_tile);
            int64_t e = 1;
            for (int k2 = 0; k2 < 3; k2++) {
                LT_CHECK(p->lo[k2] >= slo[k2] && p->hi[k2] <= shi[k2] && p->lo[k2] >= dlo[k2] && p->hi[k2] <= dhi[k2]);
                e *= p->hi[k2] - p->lo[k2];
            }
            if (p->src_tile != p->dst_tile) remote += e * 2;
            for (int64_t a = p->lo[0]; a < p->hi[0]; a++)
                for (int64_t b = p->lo[1]; b < p->hi[1]; b++)
                    for (int64_t c = p->lo[2]; c < p->hi[2]; c++) cover[p->dst_rep * n + (a * 7 + b) * 6 + c]++;
        }
        int ok = 1;
        for (int64_t i = 0; i < n * R; i++) ok &= cover[i] == contributors;
        LT_CHECK_MSG(ok, "trial %d: destination elements not covered exactly %lld times", trial,
                     (long long)contributors);
        lm__plan_xcost x;
        lm__plan_redist_stats(&s, &d, &ws, &x);
        LT_CHECK(x.total_recv == remote);
        free(cover);
        lm__free(pc);
    }
    lm__plan_ws_free(&ws);
}

int main(void) {
    LT_RUN(test_layout_tiles_are_distinct_and_invertible);
    LT_RUN(test_views_address_the_same_bytes);
    LT_RUN(test_boxes_map_through_views);
    LT_RUN(test_redistribution_covers_every_element_once);
    return lt_finish();
}
