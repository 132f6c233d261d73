/* Full-size workloads on the ipu21 machine: the SigLIP MLP, attention (flash and
 * materialized), a 1024^3 GEMM and the MLP repeated twice compile within 2 GiB (their
 * planning time is printed, not asserted: a busy machine may take any time), pass the
 * independent checkers, and simulate with real data to the CPU
 * reference (f16 tolerance); the 4096^3 GEMM plans (serial K steps). Prints the
 * measured numbers quoted in docs/PLAN.md. Under AddressSanitizer (the sanitize preset)
 * only the SigLIP MLP is simulated: the others are planned and checked, which keeps the
 * test well inside its timeout on a busy 2-core machine (the simulations took most of
 * its 350 s there).
 * LM_TEST_LABELS: slow
 */
#include "harness.h"
#include "loom/plan.h"

#include <stdio.h>
#include <sys/resource.h>

#define UNDER_ASAN LT_UNDER_ASAN

static int64_t max_rss(void) {
    struct rusage ru;
    return getrusage(RUSAGE_SELF, &ru) == 0 ? (int64_t)ru.ru_maxrss * 1024 : 0;
}

static void run(lm_plan_workload_kind k, int64_t gemm, int64_t repeat, lm_plan_attention att, int simulate) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset("ipu21", &m));
    lm_plan_workload w;
    lm_plan_workload_default(k, &w);
    if (gemm) w.m = w.n = w.k = gemm;
    if (repeat) w.repeat = repeat;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.attention = att;
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, &o, &p));
    if (!p) {
        lm_graph_destroy(g);
        lm_plan_machine_destroy(m);
        return;
    }
    lm_plan_summary s;
    LT_CHECK_OK(lm_plan_get_summary(p, &s));
    int64_t rss = max_rss();
    printf("      %-10s predicted %9.0f cycles (lower bound %9.0f, %.2fx), SRAM peak %lld (%.2fx live bound), "
           "plan %.2f s, rss %.0f MiB\n",
           lm_plan_workload_name(k), s.predicted_cycles, s.lower_bound_cycles,
           s.predicted_cycles / s.lower_bound_cycles, (long long)s.sram_peak_bytes, s.sram_alloc_ratio, s.plan_seconds,
           (double)rss / 1048576.0);
    LT_CHECK_MSG(rss < (2LL << 30), "process resident memory %lld bytes", (long long)rss);
    LT_CHECK(s.sram_peak_bytes <= lm_plan_machine_sram_bytes(m));
    if (simulate) LT_CHECK_OK(lm_plan_check(p));
    if (simulate && UNDER_ASAN && k != LM_PLAN_WL_MLP) {
        printf("      %-10s (not simulated under AddressSanitizer)\n", lm_plan_workload_name(k));
        simulate = 0;
    }
    if (simulate) {
        lm_plan_sim *sim = NULL;
        lm_plan_sim_options so;
        lm_plan_sim_options_default(&so);
        LT_CHECK_OK(lm_plan_simulate(p, &so, &sim));
        if (sim) {
            lm_plan_sim_summary ss;
            LT_CHECK_OK(lm_plan_sim_get_summary(sim, &ss));
            printf("      %-10s simulated %9.0f cycles, %d/%d checks (worst NMSE %.2g), sim %.1f s, reference %.1f s\n",
                   lm_plan_workload_name(k), ss.cycles, ss.checks - ss.checks_failed, ss.checks, ss.worst_nmse,
                   ss.sim_seconds, ss.ref_seconds);
            LT_CHECK(ss.checks >= 1 && ss.checks_failed == 0);
        }
        lm_plan_sim_destroy(sim);
    }
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_siglip_mlp(void) { run(LM_PLAN_WL_MLP, 0, 0, LM_PLAN_ATTN_AUTO, 1); }
static void test_siglip_attention_flash(void) { run(LM_PLAN_WL_ATTENTION, 0, 0, LM_PLAN_ATTN_FLASH, 1); }
static void test_siglip_attention_materialized(void) { run(LM_PLAN_WL_ATTENTION, 0, 0, LM_PLAN_ATTN_MATERIALIZED, 1); }
static void test_gemm_1024(void) { run(LM_PLAN_WL_GEMM, 1024, 0, LM_PLAN_ATTN_AUTO, 1); }
static void test_gemm_4096_plans(void) { run(LM_PLAN_WL_GEMM, 4096, 0, LM_PLAN_ATTN_AUTO, 0); }
static void test_mlp_repeat_2(void) { run(LM_PLAN_WL_MLP_REPEAT, 0, 2, LM_PLAN_ATTN_AUTO, 1); }

int main(void) {
    LT_RUN(test_siglip_mlp);
    LT_RUN(test_siglip_attention_flash);
    LT_RUN(test_siglip_attention_materialized);
    LT_RUN(test_gemm_1024);
    LT_RUN(test_gemm_4096_plans);
    LT_RUN(test_mlp_repeat_2);
    return lt_finish();
}
