/* The compiled programs on small machines: all four workloads (f16 and f32) compile,
 * pass the independent checkers and simulate to the CPU reference within the f16
 * tolerance (NMSE <= 1e-5, max |err| <= 2% of max |ref|); the simulator's cycles
 * track the planner's prediction; the checkers catch a corrupted allocation and a
 * slot hazard; reports render.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan_test_util.h"
#include "plan/low.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_plan *compile(const char *mach, lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c, int64_t heads,
                        lm_dtype dt, lm_plan_attention att) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(mach, &m));
    lm_plan_workload w;
    plan_test_workload(&w, k, a, b, c, heads, dt);
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.attention = att;
    lm_plan *p = NULL;
    lm_status st = lm_plan_compile(g, m, &o, &p);
    LT_CHECK_MSG(st == LM_OK, "%s %s %lldx%lldx%lld: %s", mach, lm_plan_workload_name(k), (long long)a, (long long)b,
                 (long long)c, lm_last_error());
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    return p;
}

/* Compiles, checks, simulates; returns simulated / predicted cycles. */
static double run_case(const char *mach, lm_plan_workload_kind k, int64_t a, int64_t b, int64_t c, int64_t heads,
                       lm_dtype dt, lm_plan_attention att) {
    lm_plan *p = compile(mach, k, a, b, c, heads, dt, att);
    if (!p) return 0;
    LT_CHECK_OK(lm_plan_check(p));
    lm_plan_sim *s = NULL;
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    double ratio = 0;
    if (s) {
        lm_plan_sim_summary ss;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &ss));
        LT_CHECK(ss.checks >= 1);
        LT_CHECK_MSG(ss.checks_failed == 0, "%s %s: %d checks failed (worst NMSE %.3g, rel %.3g)", mach,
                     lm_plan_workload_name(k), ss.checks_failed, ss.worst_nmse, ss.worst_rel_abs);
        for (int i = 0; i < lm_plan_sim_check_count(s); i++) {
            lm_plan_check_result r;
            LT_CHECK_OK(lm_plan_sim_check_get(s, i, &r));
            LT_CHECK_MSG(r.pass, "check %s iteration %lld: NMSE %.3g rel %.3g", r.name, (long long)r.iteration, r.nmse,
                         r.rel_abs);
        }
        ratio = ss.cycles / p->summary.predicted_cycles;
        char *txt = NULL;
        LT_CHECK_OK(lm_plan_report_json(p, s, &txt));
        LT_CHECK(txt && txt[0] == '{' && strstr(txt, "\"simulation\""));
        lm_free(txt);
        LT_CHECK_OK(lm_plan_timeline_svg(p, s, &txt));
        LT_CHECK(txt && strstr(txt, "<svg") && strstr(txt, "</svg>"));
        lm_free(txt);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    return ratio;
}

static void test_gemm_shapes_simulate_exactly(void) {
    static const int64_t shapes[][3] = {{64, 64, 64}, {33, 17, 50}, {128, 96, 80}, {256, 192, 320}, {7, 300, 9}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        double r = run_case("small16", LM_PLAN_WL_GEMM, shapes[i][0], shapes[i][1], shapes[i][2], 1, LM_F16,
                            LM_PLAN_ATTN_AUTO);
        LT_CHECK_MSG(r > 0.8 && r < 1.25, "gemm %zu: simulated/predicted = %.3f", i, r);
    }
    run_case("small4", LM_PLAN_WL_GEMM, 48, 40, 32, 1, LM_F32, LM_PLAN_ATTN_AUTO);
}

static void test_mlp_and_repeat_simulate(void) {
    LT_CHECK(run_case("small16", LM_PLAN_WL_MLP, 64, 96, 160, 1, LM_F16, LM_PLAN_ATTN_AUTO) > 0);
    LT_CHECK(run_case("small4", LM_PLAN_WL_MLP, 24, 32, 40, 1, LM_F32, LM_PLAN_ATTN_AUTO) > 0);
    LT_CHECK(run_case("small16", LM_PLAN_WL_MLP_REPEAT, 32, 64, 128, 1, LM_F16, LM_PLAN_ATTN_AUTO) > 0);
}

static void test_attention_both_strategies_simulate(void) {
    LT_CHECK(run_case("small16", LM_PLAN_WL_ATTENTION, 48, 64, 64, 4, LM_F16, LM_PLAN_ATTN_FLASH) > 0);
    LT_CHECK(run_case("small16", LM_PLAN_WL_ATTENTION, 48, 64, 64, 4, LM_F16, LM_PLAN_ATTN_MATERIALIZED) > 0);
    LT_CHECK(run_case("small16", LM_PLAN_WL_ATTENTION, 27, 48, 48, 3, LM_F32, LM_PLAN_ATTN_AUTO) > 0);
}

static void test_checkers_catch_overlap_and_slot_hazards(void) {
    lm_plan *p = compile("small16", LM_PLAN_WL_MLP, 32, 64, 96, 1, LM_F16, LM_PLAN_ATTN_AUTO);
    if (!p) return;
    LT_CHECK_OK(lm_plan_check(p));
    /* move a buffer on top of another one on the same tile live at the same time */
    int moved = 0;
    for (int64_t a = 0; a < p->low.nbufs && !moved; a++)
        for (int64_t b = 0; b < p->low.nbufs && !moved; b++) {
            lm__plan_buf *x = &p->low.bufs[a], *y = &p->low.bufs[b];
            if (a == b || x->tile != y->tile || x->first < 0 || y->first < 0 || x->alias >= 0 || y->alias >= 0 ||
                x->placed || y->placed || x->offset == y->offset || x->first > y->last || y->first > x->last)
                continue;
            int64_t saved = x->offset;
            x->offset = y->offset;
            LT_CHECK_STATUS(lm_plan_check(p), LM_INTERNAL);
            LT_CHECK_MSG(strstr(lm_last_error(), "check:") != NULL, "%s", lm_last_error());
            x->offset = saved;
            moved = 1;
        }
    LT_CHECK(moved);
    LT_CHECK_OK(lm_plan_check(p));
    lm_plan_destroy(p);
    /* a reduction over 4 contributors needs 3 slots: squeeze them into one */
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    lm_plan_workload w;
    lm_plan_workload_default(LM_PLAN_WL_GEMM, &w);
    w.m = 64, w.n = 64, w.k = 256;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.gemm_grid[0] = 1, o.gemm_grid[1] = 4, o.gemm_grid[2] = 4;
    p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    if (!p) return;
    LT_CHECK_OK(lm_plan_check(p));
    int hazard = 0;
    int64_t T = p->low.tiles;
    for (int64_t s = 0; s < p->low.nsteps && !hazard; s++) {
        lm__plan_step *st = &p->low.steps[s];
        if (st->kind != LM__PLAN_S_EXCHANGE || st->nslots < 2) continue;
        int32_t *saved = malloc(sizeof(int32_t) * (size_t)(st->x1 - st->x0));
        for (int64_t x = st->x0; x < st->x1; x++) saved[x - st->x0] = p->low.xfers[x].slot, p->low.xfers[x].slot = 0;
        int32_t ns = st->nslots;
        st->nslots = 1;
        LT_CHECK_STATUS(lm_plan_check(p), LM_INTERNAL);
        LT_CHECK_MSG(strstr(lm_last_error(), "two streams") != NULL, "%s", lm_last_error());
        for (int64_t x = st->x0; x < st->x1; x++) p->low.xfers[x].slot = saved[x - st->x0];
        st->nslots = ns;
        free(saved);
        hazard = 1;
    }
    (void)T;
    LT_CHECK(hazard);
    LT_CHECK_OK(lm_plan_check(p));
    lm_plan_destroy(p);
}

/* Elementwise ops, norms and softmax with parameters read both as broadcast rows and
 * as full-shape operands; a layer norm after a matmul that splits the row dim. */
static void test_vector_ops_and_row_gathers_simulate(void) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t s[2] = {32, 48}, s1[1] = {48}, ws[2] = {48, 96}, s96[1] = {96};
    lm_graph_value x, p, q, a, b, c, gm, bt, y, z, w, wm, mm, g2, ln2;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, s, 1, &x));
    LT_CHECK_OK(lm_graph_param(g, "p", LM_F16, 2, s, 0, 1, &p));
    LT_CHECK_OK(lm_graph_param(g, "q", LM_F16, 2, s, 0, 1, &q));
    LT_CHECK_OK(lm_graph_unary(g, "a", LM_GRAPH_SILU, q, &a));
    LT_CHECK_OK(lm_graph_binary(g, "b", LM_GRAPH_ADD, x, p, &b));
    LT_CHECK_OK(lm_graph_binary(g, "c", LM_GRAPH_MUL, b, a, &c));
    LT_CHECK_OK(lm_graph_param(g, "gamma", LM_F16, 1, s1, 1, 0.1, &gm));
    LT_CHECK_OK(lm_graph_param(g, "beta", LM_F16, 1, s1, 0, 0.1, &bt));
    LT_CHECK_OK(lm_graph_layer_norm(g, "ln", c, gm, bt, 1e-5, &y));
    LT_CHECK_OK(lm_graph_rms_norm(g, "rms", y, gm, 1e-5, &z));
    LT_CHECK_OK(lm_graph_softmax(g, "sm", z, 0.5, &w));
    LT_CHECK_OK(lm_graph_checkpoint(g, w, "softmax"));
    LT_CHECK_OK(lm_graph_param(g, "w", LM_F16, 2, ws, 0, 0.15, &wm));
    LT_CHECK_OK(lm_graph_matmul(g, "proj", w, wm, LM_F16, &mm));
    LT_CHECK_OK(lm_graph_param(g, "g2", LM_F16, 1, s96, 1, 0.1, &g2));
    LT_CHECK_OK(lm_graph_layer_norm(g, "ln2", mm, g2, -1, 1e-5, &ln2));
    LT_CHECK_OK(lm_graph_output(g, ln2));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.gemm_grid[0] = 4, o.gemm_grid[1] = 4, o.gemm_grid[2] = 1; /* N split: ln2 must gather rows */
    lm_plan *pl = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &pl));
    if (pl) {
        LT_CHECK_OK(lm_plan_check(pl));
        lm_plan_sim *sim = NULL;
        LT_CHECK_OK(lm_plan_simulate(pl, NULL, &sim));
        lm_plan_sim_summary ss;
        if (sim) {
            LT_CHECK_OK(lm_plan_sim_get_summary(sim, &ss));
            LT_CHECK_MSG(ss.checks == 2 && ss.checks_failed == 0, "%d/%d checks (worst NMSE %.3g)",
                         ss.checks - ss.checks_failed, ss.checks, ss.worst_nmse);
        }
        int gathers = 0;
        for (int64_t i = 0; i < pl->mid.nops; i++)
            gathers += pl->mid.ops[i].kind == LM__PLAN_M_EXCHANGE || pl->mid.ops[i].kind == LM__PLAN_M_COPY;
        LT_CHECK(gathers >= 1);
        lm_plan_sim_destroy(sim);
    }
    lm_plan_destroy(pl);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_describe_lists_the_mid_program(void) {
    lm_plan *p = compile("small16", LM_PLAN_WL_MLP_REPEAT, 16, 32, 64, 1, LM_F16, LM_PLAN_ATTN_AUTO);
    if (!p) return;
    char *txt = NULL;
    LT_CHECK_OK(lm_plan_describe(p, &txt));
    LT_CHECK(txt && strstr(txt, "Repeat") && strstr(txt, "Compute") && strstr(txt, "Checkpoint"));
    lm_free(txt);
    LT_CHECK_OK(lm_plan_report_text(p, NULL, &txt));
    LT_CHECK(txt && strstr(txt, "predicted cycles"));
    lm_free(txt);
    LT_CHECK_STATUS(lm_plan_timeline_svg(p, NULL, &txt), LM_INVALID_ARGUMENT);
    lm_plan_destroy(p);
}

int main(void) {
    LT_RUN(test_gemm_shapes_simulate_exactly);
    LT_RUN(test_mlp_and_repeat_simulate);
    LT_RUN(test_attention_both_strategies_simulate);
    LT_RUN(test_checkers_catch_overlap_and_slot_hazards);
    LT_RUN(test_vector_ops_and_row_gathers_simulate);
    LT_RUN(test_describe_lists_the_mid_program);
    return lt_finish();
}
