/* The tile compiler on real data: a caller's data source feeds inputs and
 * parameters by name, simulated outputs are read back and compared with an
 * independent double-precision computation written here; data-source errors
 * propagate with the value's name; unknown outputs and wrong sizes are refused.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- named tensors: the data source and the test's own reference read the same ones -------------------- */
typedef struct tensor {
    char name[64];
    int64_t n;
    float *v; /* [n], already rounded to the value's dtype */
} tensor;

typedef struct tensors {
    tensor t[64];
    int n;
    const char *fail; /* name the data source refuses, NULL for none */
    int calls;
    int any;           /* 1: names not in the table get N(0, 0.1^2) values (and are recorded) */
    char seen[16][64]; /* the first names asked for */
} tensors;

static float f16(double x) { return lm_f16_to_f32(lm_f32_to_f16((float)x)); }

/* Adds name with n values mean + std * N(0,1) (seeded by the table position), rounded to f16 unless f32. */
static float *add(tensors *ts, const char *name, int64_t n, double mean, double std, int f32) {
    tensor *t = &ts->t[ts->n];
    lt_rng r = lt_rng_seed(1000 + (uint64_t)ts->n);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n = n;
    t->v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double x = mean + std * lt_rng_normal(&r);
        t->v[i] = f32 ? (float)x : f16(x);
    }
    ts->n++;
    return t->v;
}

static void tensors_free(tensors *ts) {
    for (int i = 0; i < ts->n; i++) free(ts->t[i].v);
    ts->n = 0;
}

static lm_status fill(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape, float *dst) {
    tensors *ts = user;
    (void)dtype;
    if (ts->calls < 16) snprintf(ts->seen[ts->calls], sizeof ts->seen[0], "%s", name);
    ts->calls++;
    if (ts->fail && !strcmp(name, ts->fail)) return LM_NOT_FOUND;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->t[i].name, name) && ts->t[i].n == n) {
            memcpy(dst, ts->t[i].v, sizeof(float) * (size_t)n);
            return LM_OK;
        }
    if (!ts->any) return LM_SHAPE_MISMATCH;
    lt_rng r = lt_rng_seed((uint64_t)ts->calls);
    for (int64_t i = 0; i < n; i++) dst[i] = (float)(0.1 * lt_rng_normal(&r));
    return LM_OK;
}

/* NMSE and max |got - want| / max |want|; NaN/Inf never pass. */
static void compare(const char *what, const float *got, const double *want, int64_t n, double nmse_tol,
                    double rel_tol, double *nmse_out) {
    double num = 0, den = 0, maxd = 0, maxw = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        finite &= isfinite(got[i]);
        num += d * d;
        den += want[i] * want[i];
        maxd = fmax(maxd, fabs(d));
        maxw = fmax(maxw, fabs(want[i]));
    }
    double nmse = num / den, rel = maxd / maxw;
    LT_CHECK_MSG(finite && nmse <= nmse_tol && rel <= rel_tol, "%s: NMSE %.3g (tol %.1g), max err %.3g of max %.3g",
                 what, nmse, nmse_tol, rel, rel_tol);
    if (nmse_out) *nmse_out = nmse;
}

static lm_plan_machine *machine(const char *name) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(name, &m));
    return m;
}

/* ---- a GEMM fed by the data source ------------------------------------------------------------------------ */
static lm_graph *gemm_graph(int64_t M, int64_t K, int64_t N) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t xs[2] = {M, K}, ws[2] = {K, N};
    lm_graph_value x, w, y;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
    LT_CHECK_OK(lm_graph_param(g, "w", LM_F16, 2, ws, 0.0, 1.0, &w));
    LT_CHECK_OK(lm_graph_matmul(g, "y", x, w, LM_F16, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    return g;
}

static void test_data_source_feeds_inputs_and_outputs_read_back(void) {
    const int64_t M = 48, K = 40, N = 56;
    lm_plan_machine *m = machine("small16");
    lm_graph *g = gemm_graph(M, K, N);
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    tensors ts = {0};
    float *x = add(&ts, "x", M * K, 0, 1, 0), *w = add(&ts, "w", K * N, 0, 1.0 / sqrt((double)K), 0);
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    so.fill = fill;
    so.fill_user = &ts;
    lm_plan_sim *s = NULL;
    if (p) LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    if (s) {
        LT_CHECK(ts.calls == 2);
        lm_plan_sim_summary sum;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK(sum.checks == 1 && sum.checks_failed == 0);
        float *got = malloc(sizeof(float) * (size_t)(M * N));
        double *want = malloc(sizeof(double) * (size_t)(M * N));
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += (double)x[i * K + k] * w[k * N + j];
                want[i * N + j] = acc;
            }
        LT_CHECK_OK(lm_plan_sim_output(s, "y", got, M * N));
        compare("gemm", got, want, M * N, 1e-6, 5e-3, NULL);
        /* unknown names and wrong sizes are refused with the reason */
        LT_CHECK_STATUS(lm_plan_sim_output(s, "z", got, M * N), LM_NOT_FOUND);
        LT_CHECK_MSG(strstr(lm_last_error(), "'y'") != NULL, "%s", lm_last_error());
        LT_CHECK_STATUS(lm_plan_sim_output(s, "x", got, M * K), LM_NOT_FOUND);
        LT_CHECK_STATUS(lm_plan_sim_output(s, "y", got, M * N - 1), LM_SHAPE_MISMATCH);
        LT_CHECK_STATUS(lm_plan_sim_output(s, NULL, got, M * N), LM_INVALID_ARGUMENT);
        free(got);
        free(want);
    }
    lm_plan_sim_destroy(s);
    /* the data source's error stops the simulation and names the value */
    ts.fail = "w";
    s = NULL;
    if (p) LT_CHECK_STATUS(lm_plan_simulate(p, &so, &s), LM_NOT_FOUND);
    LT_CHECK(s == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), "'w'") != NULL, "%s", lm_last_error());
    ts.fail = NULL;
    tensors_free(&ts);
    add(&ts, "x", M * K, 0, 1, 0); /* w missing: the callback's own status comes back */
    if (p) LT_CHECK_STATUS(lm_plan_simulate(p, &so, &s), LM_SHAPE_MISMATCH);
    tensors_free(&ts);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

/* Parameters inside a Repeat body have one copy per iteration, asked for as "NAME#ITER". */
static void test_data_source_names_repeat_copies(void) {
    lm_plan_machine *m = machine("small16");
    lm_plan_workload w;
    lm_plan_workload_default(LM_PLAN_WL_MLP_REPEAT, &w);
    w.tokens = 16, w.width = 32, w.hidden = 48, w.repeat = 2;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    tensors ts = {0};
    ts.any = 1;
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2;
    so.fill = fill;
    so.fill_user = &ts;
    lm_plan_sim *s = NULL;
    if (p) LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    LT_CHECK_MSG(ts.calls == 1 + 2 * 4, "%d calls", ts.calls); /* x, then 4 parameters per iteration */
    int found0 = 0, found1 = 0;
    for (int i = 0; i < ts.calls && i < 16; i++) {
        found0 |= !strcmp(ts.seen[i], "fc1.weight#0");
        found1 |= !strcmp(ts.seen[i], "fc2.bias#1");
    }
    LT_CHECK(found0 && found1);
    lm_plan_sim_summary sum;
    if (s) {
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK_MSG(sum.checks_failed == 0, "%d of %d checks failed", sum.checks_failed, sum.checks);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

int main(void) {
    LT_RUN(test_data_source_feeds_inputs_and_outputs_read_back);
    LT_RUN(test_data_source_names_repeat_copies);
    return lt_finish();
}
