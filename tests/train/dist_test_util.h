/* tests/train/dist_test_util.h — what the data-parallel training tests share
 * (test_train_dist.c, test_train_zero.c): the mpirun command line and the comparison of
 * two runs' final weights. Included after harness.h and loom/train.h.
 */
#ifndef LOOM_TESTS_DIST_TEST_UTIL_H
#define LOOM_TESTS_DIST_TEST_UTIL_H

#include <stdio.h>
#include <stdlib.h>

/* Open MPI: root is refused without --allow-run-as-root; the vader transport's
 * single-copy mechanism needs ptrace rights that containers often lack. */
#define MPIRUN "mpirun --allow-run-as-root --oversubscribe --bind-to none --mca btl_vader_single_copy_mechanism none"

/* Final weights of two runs: NMSE <= 1e-10, max-abs <= max_abs over every parameter. */
static inline void check_weights(const char *what, const char *got_dir, const char *want_dir, double max_abs) {
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
            lt_check_close(name, x, y, lm_tensor_view_numel(&pb.value), 1e-10, max_abs);
            free(x);
            free(y);
        }
    }
    lm_train_model_destroy(ma);
    lm_train_model_destroy(mb);
}

#endif
