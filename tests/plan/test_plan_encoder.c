/* Whole SigLIP-style encoder layers on small machines: one layer (LayerNorm, Q/K/V,
 * attention, output projection, residual, LayerNorm, MLP, residual) and a stack of
 * layers as one Repeat compile, pass the checker and simulate to the CPU reference
 * (checkpoints inside the layer every iteration, and the output) within the f16
 * tolerance; a stack whose first plans overflow a tile at allocation is planned again
 * within a smaller budget, and the report says so; the report's breakdown of the
 * cycles (the gap to the compute bound by category) adds up to the simulated total;
 * bad sizes are refused.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan_test_util.h"
#include "plan/low.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

typedef struct enc_case {
    const char *what;
    lm_plan_workload_kind kind;
    int64_t tokens, width, hidden, heads, repeat;
    lm_dtype dt;
    int expect_retry; /* 1: the first search's plans overflow, the report names the budget */
} enc_case;

static void run(const enc_case *c) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
    lm_plan_workload w;
    plan_test_workload(&w, c->kind, c->tokens, c->width, c->hidden, c->heads, c->dt);
    w.repeat = c->repeat;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan *p = NULL;
    lm_status st = lm_plan_compile(g, m, NULL, &p);
    LT_CHECK_MSG(st == LM_OK, "%s: %s", c->what, lm_last_error());
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    if (!p) return;
    LT_CHECK_OK(lm_plan_check(p));
    char *txt = NULL;
    LT_CHECK_OK(lm_plan_report_text(p, NULL, &txt));
    int retried = txt && strstr(txt, "search budget") != NULL;
    LT_CHECK(txt && strstr(txt, "where the cycles go") && strstr(txt, "mm_pass"));
    LT_CHECK_MSG(retried == c->expect_retry, "%s: report %s a reduced search budget", c->what,
                 retried ? "shows" : "lacks");
    LT_CHECK_MSG((p->search_attempts > 1) == c->expect_retry && p->search_sram <= p->m.sram_bytes,
                 "%s: %d searches, budget %lld", c->what, p->search_attempts, (long long)p->search_sram);
    lm_free(txt);
    LT_CHECK(p->summary.sram_peak_bytes <= p->m.sram_bytes);

    lm_plan_sim *s = NULL;
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    if (s) {
        lm_plan_sim_summary ss;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &ss));
        /* layer.residual1, mlp.hidden, attn.context per iteration, and the output */
        int64_t per_layer = 3, layers = c->kind == LM_PLAN_WL_ENCODER_STACK ? c->repeat : 1;
        LT_CHECK_MSG(ss.checks == per_layer * layers + 1, "%s: %d checks", c->what, ss.checks);
        LT_CHECK_MSG(ss.checks_failed == 0, "%s: %d checks failed (worst NMSE %.3g, rel %.3g)", c->what,
                     ss.checks_failed, ss.worst_nmse, ss.worst_rel_abs);
        int saw_residual = 0;
        for (int i = 0; i < lm_plan_sim_check_count(s); i++) {
            lm_plan_check_result r;
            LT_CHECK_OK(lm_plan_sim_check_get(s, i, &r));
            LT_CHECK_MSG(r.pass, "%s: check %s iteration %lld: NMSE %.3g rel %.3g", c->what, r.name,
                         (long long)r.iteration, r.nmse, r.rel_abs);
            saw_residual += strcmp(r.name, "layer.residual1") == 0;
        }
        LT_CHECK_MSG(saw_residual == layers, "%s: layer.residual1 checked %d times", c->what, saw_residual);
        /* the gap breakdown `loom plan` prints: its categories add up to the simulated total */
        lm__plan_gap gap;
        LT_CHECK_OK(lm__plan_gap_get(p, &gap));
        double sum = 0;
        for (int i = 0; i < G_COUNT; i++) {
            sum += gap.v[i];
            LT_CHECK_MSG(gap.v[i] >= -1e-6 * gap.total, "%s: gap %s = %.1f", c->what, gap.key[i], gap.v[i]);
        }
        LT_CHECK_MSG(fabs(sum - gap.total) <= 1e-6 * gap.total && fabs(gap.total - ss.cycles) <= 1e-6 * ss.cycles,
                     "%s: gap categories sum to %.1f, schedule %.1f, simulated %.1f", c->what, sum, gap.total,
                     ss.cycles);
        LT_CHECK(gap.v[G_BOUND] == p->summary.lower_bound_cycles && gap.v[G_MM_PASS] > 0 && gap.v[G_EXCH] > 0);
        char *js = NULL;
        LT_CHECK_OK(lm_plan_report_json(p, s, &js));
        LT_CHECK(js && strstr(js, "\"gap\":{\"total_cycles\"") && strstr(js, "\"mm_pass\":"));
        lm_free(js);
        double ratio = ss.cycles / p->summary.predicted_cycles;
        LT_CHECK_MSG(ratio > 0.8 && ratio < 1.25, "%s: simulated/predicted = %.3f", c->what, ratio);
        printf("  %s: predicted %.0f, simulated %.0f cycles (%.2fx the bound), SRAM peak %lld, %d searches\n",
               c->what, p->summary.predicted_cycles, ss.cycles,
               p->summary.predicted_cycles / p->summary.lower_bound_cycles, (long long)p->summary.sram_peak_bytes,
               p->search_attempts);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
}

static void test_layers_simulate_to_the_reference(void) {
    static const enc_case cases[] = {
        {"layer f16", LM_PLAN_WL_ENCODER_LAYER, 32, 64, 128, 4, 1, LM_F16, 0},
        {"layer f32", LM_PLAN_WL_ENCODER_LAYER, 24, 32, 96, 2, 1, LM_F32, 0},
        {"stack of 3", LM_PLAN_WL_ENCODER_STACK, 32, 64, 128, 4, 3, LM_F16, 0},
        {"stack of 2, retried", LM_PLAN_WL_ENCODER_STACK, 64, 128, 256, 4, 2, LM_F16, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run(&cases[i]);
}

/* Bias adds and GeLU fold into the final write of the matmul or reduction producing
 * their input (the report marks them), except when something else needs the value in
 * between: here a checkpoint on the matmul's output keeps the bias add (and the GeLU
 * after it) separate; both plans match the reference at every checkpoint. */
static void test_epilogues_fuse_unless_the_value_is_needed(void) {
    for (int keep = 0; keep < 2; keep++) {
        lm_graph *g = NULL;
        LT_CHECK_OK(lm_graph_create(&g));
        int64_t xs[2] = {32, 64}, ws[2] = {64, 96}, bs[1] = {96};
        lm_graph_value x, w, bias, mm, h, a;
        LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
        LT_CHECK_OK(lm_graph_param(g, "w", LM_F16, 2, ws, 0.0, 0.125, &w));
        LT_CHECK_OK(lm_graph_param(g, "b", LM_F16, 1, bs, 0.0, 0.02, &bias));
        LT_CHECK_OK(lm_graph_matmul(g, "mm", x, w, LM_F16, &mm));
        if (keep) LT_CHECK_OK(lm_graph_checkpoint(g, mm, "pre-bias"));
        LT_CHECK_OK(lm_graph_bias_add(g, "bias", mm, bias, &h));
        LT_CHECK_OK(lm_graph_unary(g, "gelu", LM_GRAPH_GELU, h, &a));
        LT_CHECK_OK(lm_graph_output(g, a));
        lm_plan_machine *m = NULL;
        LT_CHECK_OK(lm_plan_machine_preset("small16", &m));
        lm_plan *p = NULL;
        LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
        lm_graph_destroy(g);
        lm_plan_machine_destroy(m);
        if (!p) continue;
        LT_CHECK_OK(lm_plan_check(p));
        char *txt = NULL;
        LT_CHECK_OK(lm_plan_report_text(p, NULL, &txt));
        int fused = txt && strstr(txt, "+ bias + gelu (fused)") != NULL;
        LT_CHECK_MSG(fused == !keep, "%s checkpoint: the epilogue is %sfused:\n%s", keep ? "with" : "without",
                     fused ? "" : "not ", txt ? txt : "");
        lm_free(txt);
        int calls_with_epi = 0;
        for (int64_t i = 0; i < p->low.ncalls; i++) calls_with_epi += p->low.calls[i].i[2] != 0 &&
                                                                      (p->low.calls[i].kernel == LM__PLAN_K_MATMUL ||
                                                                       p->low.calls[i].kernel == LM__PLAN_K_REDUCE);
        LT_CHECK((calls_with_epi > 0) == !keep);
        lm_plan_sim *s = NULL;
        lm_plan_sim_options so;
        lm_plan_sim_options_default(&so);
        LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
        if (s) {
            lm_plan_sim_summary ss;
            LT_CHECK_OK(lm_plan_sim_get_summary(s, &ss));
            LT_CHECK_MSG(ss.checks == 1 + keep && ss.checks_failed == 0, "%d checks, %d failed (NMSE %.3g)", ss.checks,
                         ss.checks_failed, ss.worst_nmse);
        }
        lm_plan_sim_destroy(s);
        lm_plan_destroy(p);
    }
}

static void test_bad_sizes_are_refused(void) {
    lm_plan_workload w;
    lm_graph *g = NULL;
    plan_test_workload(&w, LM_PLAN_WL_ENCODER_STACK, 32, 64, 128, 4, LM_F16);
    w.repeat = 0;
    LT_CHECK_STATUS(lm_plan_workload_build(&w, &g), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "encoder-stack") != NULL);
    plan_test_workload(&w, LM_PLAN_WL_ENCODER_LAYER, 32, 64, 128, 5, LM_F16);
    LT_CHECK_STATUS(lm_plan_workload_build(&w, &g), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "divisible by heads") != NULL);
    LT_CHECK(g == NULL);
    LT_CHECK(strcmp(lm_plan_workload_name(LM_PLAN_WL_ENCODER_LAYER), "encoder-layer") == 0);
    LT_CHECK(strcmp(lm_plan_workload_name(LM_PLAN_WL_ENCODER_STACK), "encoder-stack") == 0);
}

int main(void) {
    LT_RUN(test_layers_simulate_to_the_reference);
    LT_RUN(test_epilogues_fuse_unless_the_value_is_needed);
    LT_RUN(test_bad_sizes_are_refused);
    return lt_finish();
}
