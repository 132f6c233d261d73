/* tests/train/dist_test_util.h — what the data-parallel training tests share
 * (test_train_dist.c, test_train_zero.c): the mpirun command line, the sanitizer
 * environment for Open MPI, and the comparison of two runs' logs and final weights.
 * The including test defines STEPS (the steps a run logs) and includes harness.h,
 * loom/train.h and jansson.h first.
 */
#ifndef LOOM_TESTS_DIST_TEST_UTIL_H
#define LOOM_TESTS_DIST_TEST_UTIL_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

/* Open MPI: root is refused without --allow-run-as-root; the vader transport's
 * single-copy mechanism needs ptrace rights that containers often lack. */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none"

/* Runs a shell command built from fmt that must succeed (a failed check otherwise);
 * its stderr goes into err[size] (err may be NULL). 1 when it succeeded. */
static inline int dist_run_ok(char *err, size_t size, const char *fmt, ...) {
    char cmd[8192];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    lt_cmd_result r = lt_run_cmd(cmd);
    LT_CHECK_MSG(r.status == 0, "`%s` exited %d: %s", cmd, r.status, r.err ? r.err : "");
    if (err) snprintf(err, size, "%s", r.err ? r.err : "");
    int ok = r.status == 0;
    lt_cmd_free(&r);
    return ok;
}

/* Final weights of two runs: NMSE <= nmse, max-abs <= max_abs over every parameter. */
static inline void check_weights_within(const char *what, const char *got_dir, const char *want_dir, double nmse,
                                        double max_abs) {
    char a[1024], b[1024];
    snprintf(a, sizeof a, "%s/final", got_dir);
    snprintf(b, sizeof b, "%s/final", want_dir);
    lm_train_model *ma = NULL, *mb = NULL;
    LT_CHECK_OK(lm_train_model_load(a, lm_device_cpu(), &ma));
    LT_CHECK_OK(lm_train_model_load(b, lm_device_cpu(), &mb));
    if (ma && mb) {
        LT_CHECK(lm_train_model_numel(ma) == lm_train_model_numel(mb));
        for (int i = 0; i < lm_train_model_param_count(mb); i++) {
            lm_train_param pa, pb;
            LT_CHECK_OK(lm_train_model_param(ma, i, &pa));
            LT_CHECK_OK(lm_train_model_param(mb, i, &pb));
            double *x = lt_view_to_f64(&pa.value), *y = lt_view_to_f64(&pb.value);
            char name[256];
            snprintf(name, sizeof name, "%s: %s", what, pb.name);
            lt_check_close(name, x, y, lm_tensor_view_numel(&pb.value), nmse, max_abs);
            free(x);
            free(y);
        }
    }
    lm_train_model_destroy(ma);
    lm_train_model_destroy(mb);
}

/* The same with NMSE <= 1e-10. */
static inline void check_weights(const char *what, const char *got_dir, const char *want_dir, double max_abs) {
    check_weights_within(what, got_dir, want_dir, 1e-10, max_abs);
}

/* The losses and gradient norms (norm may be NULL) of steps 1..STEPS in dir/log.jsonl
 * (NAN where missing). */
static inline void read_log(const char *dir, double *loss, double *norm) {
    char path[1024];
    snprintf(path, sizeof path, "%s/log.jsonl", dir);
    for (int i = 0; i < STEPS; i++) loss[i] = NAN, norm ? norm[i] = NAN : 0;
    FILE *f = fopen(path, "r");
    LT_CHECK_MSG(f != NULL, "no log '%s'", path);
    char line[1024];
    while (f && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *s = json_object_get(j, "step"), *l = json_object_get(j, "loss"), *g = json_object_get(j, "grad_norm");
        int64_t k = s ? json_integer_value(s) : 0;
        if (l && k >= 1 && k <= STEPS) {
            loss[k - 1] = json_number_value(l);
            if (norm) norm[k - 1] = g ? json_number_value(g) : NAN;
        }
        json_decref(j);
    }
    if (f) fclose(f);
}

/* Losses (logged %.9g), and with norms the gradient norms (logged %.6g), within rel of
 * want's; rel 0: equal as logged. */
static inline void check_losses(const char *what, const char *got_dir, const char *want_dir, double rel, int norms) {
    double got[STEPS], want[STEPS], gn[STEPS], wn[STEPS];
    read_log(got_dir, got, gn);
    read_log(want_dir, want, wn);
    for (int i = 0; i < STEPS; i++) {
        LT_CHECK_MSG(fabs(got[i] - want[i]) <= rel * fabs(want[i]), "%s: step %d loss %.9g, expected %.9g", what, i + 1,
                     got[i], want[i]);
        if (norms)
            LT_CHECK_MSG(fabs(gn[i] - wn[i]) <= rel * fabs(wn[i]), "%s: step %d grad norm %.9g, expected %.9g", what,
                         i + 1, gn[i], wn[i]);
    }
    printf("%s: losses", what);
    for (int i = 0; i < STEPS; i++) printf(" %.9g%s", got[i], got[i] == want[i] ? "" : "*");
    printf(" (* where not bit-equal to the reference)\n");
}

/* Under AddressSanitizer: Open MPI's own leaks at exit suppressed
 * (tests/train/lsan_openmpi.supp says which), its components kept loaded for the stacks. */
static inline void dist_test_sanitizer_env(void) {
    if (LT_UNDER_ASAN) {
        setenv("LSAN_OPTIONS", "suppressions=" LOOM_SOURCE_DIR "/tests/train/lsan_openmpi.supp:fast_unwind_on_malloc=0",
               1);
        setenv("OMPI_MCA_mca_base_component_disable_dlclose", "1", 1);
    }
}

#endif
