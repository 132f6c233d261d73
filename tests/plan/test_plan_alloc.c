/* SRAM allocation: on random buffer lifetimes no two simultaneously live buffers of a
 * tile overlap (checked pairwise, independently of the allocator) and the peak stays
 * within 1.5x the live-bytes lower bound (greedy by size; measured worst printed);
 * a tile that overflows is reported with its peak; the four workloads' plans on a
 * small machine stay within 1.25x and pass the ownership checker.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan/low.h"

#include <stdio.h>
#include <string.h>

/* A synthetic program: nsteps compute steps; each buffer is touched by a copy call
 * at its first and last step. */
static void synthetic(lt_rng *r, lm__plan_low *low, int64_t tiles, int64_t nbufs, int64_t nsteps) {
    memset(low, 0, sizeof *low);
    low->tiles = tiles;
    int64_t *first = malloc(sizeof(int64_t) * (size_t)nbufs), *last = malloc(sizeof(int64_t) * (size_t)nbufs);
    for (int64_t b = 0; b < nbufs; b++) {
        int64_t id;
        int64_t bytes = 8 * lt_rng_int(r, 1, 512);
        LT_CHECK_OK(lm__plan_low_add_buf(low, lt_rng_int(r, 0, tiles - 1), -1, bytes, &id));
        first[b] = lt_rng_int(r, 0, nsteps - 1);
        last[b] = LM_MIN(nsteps - 1, first[b] + lt_rng_int(r, 0, nsteps / 3));
    }
    for (int64_t s = 0; s < nsteps; s++) {
        int64_t id;
        LT_CHECK_OK(lm__plan_low_add_step(low, LM__PLAN_S_COMPUTE, -1, "synthetic", &id));
        for (int64_t b = 0; b < nbufs; b++) {
            if (first[b] != s && last[b] != s) continue;
            lm__plan_call c;
            memset(&c, 0, sizeof c);
            c.tile = low->bufs[b].tile;
            c.kernel = LM__PLAN_K_COPY;
            for (int k = 0; k < 4; k++) c.op[k].buf = -1;
            c.op[0].buf = (int32_t)b;
            c.op[0].ndim = 1;
            c.op[0].dtype = LM_F16;
            c.op[0].dims[0] = (int32_t)(low->bufs[b].bytes / 2);
            c.op[0].strides[0] = 1;
            c.op[1] = c.op[0];
            LT_CHECK_OK(lm__plan_low_add_call(low, &c));
        }
        low->steps[id].c1 = low->ncalls;
    }
    free(first);
    free(last);
}

static void test_random_lifetimes_never_overlap_and_stay_near_the_bound(void) {
    lt_rng r = lt_rng_seed(77);
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    lm__plan_mid mid;
    memset(&mid, 0, sizeof mid);
    double worst = 0;
    for (int trial = 0; trial < 40; trial++) {
        lm__plan_low low;
        synthetic(&r, &low, 4, lt_rng_int(&r, 5, 60), lt_rng_int(&r, 4, 30));
        lm_status st = lm__plan_sram_allocate(m, &mid, NULL, &low);
        LT_CHECK(st == LM_OK || st == LM_UNSUPPORTED);
        if (st == LM_OK) {
            for (int64_t a = 0; a < low.nbufs; a++)
                for (int64_t b = a + 1; b < low.nbufs; b++) {
                    const lm__plan_buf *x = &low.bufs[a], *y = &low.bufs[b];
                    if (x->tile != y->tile || x->first > y->last || y->first > x->last) continue;
                    int disjoint = x->offset + x->bytes <= y->offset || y->offset + y->bytes <= x->offset;
                    LT_CHECK_MSG(disjoint, "trial %d: buffers %lld and %lld overlap while both live", trial,
                                 (long long)a, (long long)b);
                }
            for (int64_t t = 0; t < low.tiles; t++) {
                LT_CHECK(low.peak[t] >= low.live_bound[t]);
                if (low.live_bound[t]) {
                    double ratio = (double)low.peak[t] / (double)low.live_bound[t];
                    if (ratio > worst) worst = ratio;
                }
            }
        }
        lm__plan_low_free(&low);
    }
    printf("      worst allocated peak / live lower bound on random lifetimes: %.3f\n", worst);
    LT_CHECK(worst <= 1.5);
    lm_plan_machine_destroy(m);
}

static void test_overflow_names_the_tile(void) {
    lt_rng r = lt_rng_seed(3);
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_parse("{\"base\":\"small4\",\"sram_bytes\":1024}", "tiny", &m));
    lm__plan_mid mid;
    memset(&mid, 0, sizeof mid);
    lm__plan_low low;
    synthetic(&r, &low, 4, 40, 6);
    LT_CHECK_STATUS(lm__plan_sram_allocate(m, &mid, NULL, &low), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "bytes of SRAM on tile") != NULL);
    lm__plan_low_free(&low);
    lm_plan_machine_destroy(m);
}

static void test_workload_plans_allocate_tightly(void) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    for (int k = 0; k < 4; k++) {
        lm_plan_workload w;
        lm_plan_workload_default((lm_plan_workload_kind)k, &w);
        w.m = 96, w.n = 64, w.k = 128;
        w.tokens = 48, w.width = 64, w.hidden = 96, w.heads = 4, w.repeat = 2;
        lm_graph *g = NULL;
        LT_CHECK_OK(lm_plan_workload_build(&w, &g));
        lm_plan *p = NULL;
        LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
        if (p) {
            lm_plan_summary s;
            LT_CHECK_OK(lm_plan_get_summary(p, &s));
            LT_CHECK(s.sram_peak_bytes <= lm_plan_machine_sram_bytes(m));
            LT_CHECK_MSG(s.sram_alloc_ratio >= 1.0 && s.sram_alloc_ratio <= 1.25, "%s: allocation ratio %.3f",
                         lm_plan_workload_name(w.kind), s.sram_alloc_ratio);
            LT_CHECK_OK(lm_plan_check(p));
        }
        lm_plan_destroy(p);
        lm_graph_destroy(g);
    }
    lm_plan_machine_destroy(m);
}

int main(void) {
    LT_RUN(test_random_lifetimes_never_overlap_and_stay_near_the_bound);
    LT_RUN(test_overflow_names_the_tile);
    LT_RUN(test_workload_plans_allocate_tightly);
    return lt_finish();
}
