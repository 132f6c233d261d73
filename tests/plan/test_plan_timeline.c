/* The per-tile timeline page (lm_plan_timeline_html) of small plans: the page is
 * self-contained (no network reference, no external script or style) and its embedded
 * JSON parses; every tile appears in exactly one group; per tile the spans are ordered,
 * disjoint and inside [0, total]; the compute spans add up to the program's kernel
 * cycles (repeats unrolled), every tile's sync spans to the simulated sync cycles, the
 * phases to the simulated compute / exchange cycles and the gap categories to the
 * total; without a simulation the predicted schedule is the same; a simulation of
 * another plan, NULL arguments and every failing allocation are refused cleanly.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "html_page_util.h"
#include "plan/low.h"
#include "plan_test_util.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_plan *compile(lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c, int64_t heads) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    lm_plan_workload w;
    plan_test_workload(&w, k, a, b, c, heads, LM_F16);
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    return p;
}

static lm_plan_sim *simulate(const lm_plan *p) {
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    lm_plan_sim *s = NULL;
    LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    return s;
}

/* Sum of the kernel calls' cycles over the program as executed (repeat bodies count times). */
static double kernel_cycles(const lm__plan_low *low) {
    double sum = 0;
    int64_t iter = 0;
    for (int64_t si = 0; si < low->nsteps; si++) {
        const lm__plan_step *st = &low->steps[si];
        if (st->kind == LM__PLAN_S_COMPUTE)
            for (int64_t i = st->c0; i < st->c1; i++) sum += low->calls[i].cycles;
        if (st->kind == LM__PLAN_S_END && ++iter < low->steps[st->match].count)
            si = st->match;
        else if (st->kind == LM__PLAN_S_END)
            iter = 0;
    }
    return sum;
}

static double num(const json_t *a, size_t i) { return json_number_value(json_array_get(a, i)); }

/* Everything the page's data promises about plan p (s may be NULL). */
static void check_page(const lm_plan *p, const lm_plan_sim *s, const char *html) {
    check_self_contained(html);
    json_t *d = page_data(html, "tl-data");
    if (!d) return;
    int64_t tiles = p->low.tiles;
    double total = json_number_value(json_object_get(d, "total"));
    double eps = 1e-6 * fmax(1, total);
    LT_CHECK(json_integer_value(json_object_get(d, "tiles")) == tiles);
    LT_CHECK(!strcmp(json_string_value(json_object_get(d, "source")), s ? "simulation" : "predicted"));
    const json_t *types = json_object_get(d, "types"), *groups = json_object_get(d, "groups");
    LT_CHECK(json_is_array(types) && json_array_size(types) % 7 == 0 && json_is_array(groups));
    size_t ntypes = json_array_size(types) / 7;
    int *seen = calloc((size_t)tiles, sizeof(int));
    double compute = 0, sync_per_tile = -1;
    int critical = 0;
    for (size_t gi = 0; gi < json_array_size(groups); gi++) {
        const json_t *g = json_array_get(groups, gi);
        const json_t *tl = json_object_get(g, "tiles"), *runs = json_object_get(g, "runs");
        int64_t n = json_integer_value(json_object_get(g, "n")), counted = 0;
        for (size_t i = 0; i + 2 < json_array_size(tl); i += 3) {
            int64_t a = (int64_t)num(tl, i), b = (int64_t)num(tl, i + 1), step = (int64_t)num(tl, i + 2);
            LT_CHECK(a >= 0 && b < tiles && a <= b && step >= 1);
            for (int64_t t = a; t <= b && t >= 0 && t < tiles && step >= 1; t += step) seen[t]++, counted++;
        }
        LT_CHECK_MSG(counted == n, "group %zu: %lld tiles listed, n = %lld", gi, (long long)counted, (long long)n);
        /* runs: idle gap, type, count of back-to-back spans */
        double end = 0, gcompute = 0, gsync = 0;
        LT_CHECK(json_array_size(runs) % 3 == 0);
        for (size_t r = 0; r + 2 < json_array_size(runs); r += 3) {
            double idle = num(runs, r);
            size_t ty = (size_t)num(runs, r + 1);
            int64_t count = (int64_t)num(runs, r + 2);
            LT_CHECK_MSG(idle >= 0 && ty < ntypes && count >= 1, "group %zu run %zu: idle %g type %zu count %lld", gi,
                         r / 3, idle, ty, (long long)count);
            if (ty >= ntypes) break;
            int cat = (int)num(types, 7 * ty);
            double dur = num(types, 7 * ty + 1);
            LT_CHECK(dur >= 0);
            double start = end + idle;
            end = start + (double)count * dur;
            LT_CHECK_MSG(start >= -eps && end <= total + eps, "group %zu: span [%g, %g) outside [0, %g]", gi, start,
                         end, total);
            if ((cat & 3) <= 1) gcompute += (double)count * dur;
            if ((cat & 3) == 3) gsync += (double)count * dur;
            if ((cat & 4) && (cat & 3) != 3) critical = 1;
        }
        compute += (double)n * gcompute;
        if (sync_per_tile < 0) sync_per_tile = gsync;
        LT_CHECK_MSG(fabs(gsync - sync_per_tile) <= eps, "group %zu syncs %g cycles, another %g", gi, gsync,
                     sync_per_tile);
    }
    for (int64_t t = 0; t < tiles; t++) LT_CHECK_MSG(seen[t] == 1, "tile %lld appears %d times", (long long)t, seen[t]);
    free(seen);
    double want = kernel_cycles(&p->low);
    LT_CHECK(want > 0);
    LT_CHECK_MSG(fabs(compute - want) <= 1e-6 * want, "compute spans %.3f cycles, kernel calls %.3f", compute, want);
    LT_CHECK_MSG(critical, "no span marked critical");
    /* phases: kind, start, cycles, sync, step, iteration, bytes */
    const json_t *ph = json_object_get(d, "phases");
    double pc = 0, px = 0, ps = 0, at = 0;
    for (size_t i = 0; i + 6 < json_array_size(ph); i += 7) {
        LT_CHECK(fabs(num(ph, i + 1) - at) <= eps);
        at = num(ph, i + 1) + num(ph, i + 2);
        if (num(ph, i) == 0) pc += num(ph, i + 2);
        else px += num(ph, i + 2) - num(ph, i + 3), ps += num(ph, i + 3);
    }
    LT_CHECK(fabs(at - total) <= eps);
    const json_t *gap = json_object_get(d, "gap");
    double gsum = 0;
    for (size_t i = 0; i < json_array_size(gap); i++) gsum += num(json_array_get(gap, i), 2);
    LT_CHECK_MSG(fabs(gsum - total) <= eps, "gap categories add up to %.3f, total %.3f", gsum, total);
    LT_CHECK(fabs(num(json_array_get(gap, 0), 2) - p->summary.lower_bound_cycles) <= eps);
    LT_CHECK(json_array_size(json_object_get(d, "last")) >= 3);
    if (s) {
        lm_plan_sim_summary ss;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &ss));
        LT_CHECK_MSG(fabs(total - ss.cycles) <= eps, "page total %.3f, simulated %.3f", total, ss.cycles);
        LT_CHECK_MSG(fabs(pc - ss.compute_cycles) <= eps, "compute phases %.3f, simulated %.3f", pc, ss.compute_cycles);
        LT_CHECK_MSG(fabs(px - ss.exchange_cycles) <= eps, "exchange phases %.3f, simulated %.3f", px,
                     ss.exchange_cycles);
        LT_CHECK(fabs(ps - ss.sync_cycles) <= eps);
        LT_CHECK_MSG(fabs(sync_per_tile - ss.sync_cycles) <= eps, "a tile syncs %.3f cycles, simulated %.3f",
                     sync_per_tile, ss.sync_cycles);
    }
    json_decref(d);
}

/* Page of p with its simulation and without: both valid, same total. */
static void check_plan(lm_plan *p) {
    if (!p) return;
    lm_plan_sim *s = simulate(p);
    char *with = NULL, *without = NULL;
    LT_CHECK_OK(lm_plan_timeline_html(p, s, &with));
    LT_CHECK_OK(lm_plan_timeline_html(p, NULL, &without));
    if (with) check_page(p, s, with);
    if (without) check_page(p, NULL, without);
    if (with && without) {
        json_t *a = page_data(with, "tl-data"), *b = page_data(without, "tl-data");
        if (a && b)
            LT_CHECK(json_number_value(json_object_get(a, "total")) == json_number_value(json_object_get(b, "total")));
        json_decref(a), json_decref(b);
    }
    lm_free(with), lm_free(without);
    lm_plan_sim_destroy(s);
}

static void test_mlp_page_is_consistent(void) {
    lm_plan *p = compile(LM_PLAN_WL_MLP, 64, 96, 160, 1);
    check_plan(p);
    lm_plan_destroy(p);
}

static void test_repeat_page_unrolls_iterations(void) {
    lm_plan *p = compile(LM_PLAN_WL_MLP_REPEAT, 32, 64, 96, 1);
    check_plan(p);
    lm_plan_destroy(p);
}

static void test_attention_page_is_consistent(void) {
    lm_plan *p = compile(LM_PLAN_WL_ATTENTION, 48, 64, 64, 4);
    check_plan(p);
    lm_plan_destroy(p);
}

static void test_bad_arguments_are_refused(void) {
    lm_plan *p = compile(LM_PLAN_WL_MLP, 64, 96, 160, 1), *q = compile(LM_PLAN_WL_MLP_REPEAT, 32, 64, 96, 1);
    char *html = (char *)"untouched";
    LT_CHECK_STATUS(lm_plan_timeline_html(NULL, NULL, &html), LM_INVALID_ARGUMENT);
    LT_CHECK(html == NULL);
    LT_CHECK_STATUS(lm_plan_timeline_html(p, NULL, NULL), LM_INVALID_ARGUMENT);
    if (p && q) { /* a simulation of another plan */
        lm_plan_sim *s = simulate(q);
        html = NULL;
        LT_CHECK_STATUS(lm_plan_timeline_html(p, s, &html), LM_INTERNAL);
        LT_CHECK(html == NULL);
        lm_plan_sim_destroy(s);
    }
    lm_plan_destroy(p);
    lm_plan_destroy(q);
}

static void test_allocation_failures_are_clean(void) {
    lm_plan *p = compile(LM_PLAN_WL_MLP, 64, 96, 160, 1);
    if (!p) return;
    char *html = NULL;
    lt_alloc_track(0);
    LT_CHECK_OK(lm_plan_timeline_html(p, NULL, &html));
    int64_t total = lt_alloc_count();
    lm_free(html);
    lt_alloc_untrack();
    for (int64_t f = 1; f <= total; f++) {
        html = NULL;
        lt_alloc_track(f);
        lm_status st = lm_plan_timeline_html(p, NULL, &html);
        LT_CHECK_MSG(st == LM_OUT_OF_MEMORY && html == NULL, "failing allocation %lld of %lld: %s", (long long)f,
                     (long long)total, lm_status_name(st));
        LT_CHECK_MSG(lt_alloc_live() == 0, "failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
        lm_free(html);
    }
    lm_plan_destroy(p);
}

int main(void) {
    LT_RUN(test_mlp_page_is_consistent);
    LT_RUN(test_repeat_page_unrolls_iterations);
    LT_RUN(test_attention_page_is_consistent);
    LT_RUN(test_bad_arguments_are_refused);
    LT_RUN(test_allocation_failures_are_clean);
    return lt_finish();
}
