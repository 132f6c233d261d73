/* The operation profile (LOOM_PROFILE=1, autograd/profile.c) on CPU contexts, whose
 * events are host timestamps: a mark is charged the time since the previous mark on
 * the same context, resolved in batches. Checked: the mark after a sleep is charged at
 * least the time the test measures inside that interval on the same clock (containment,
 * not speed: it holds however slow the machine is); every mark is counted once; the
 * first mark (no earlier one) is charged nothing; a reset forgets the totals but keeps
 * the last mark as the base; 10,000 marks (more than one batch of 4,096) are all
 * counted; a mark on another context starts a new batch (the first mark there is not
 * charged, nor the first back on the first context); a NULL context is ignored; marks
 * past the table's 96 names are counted in the report. (tests/cuda/test_cuda_profile.c
 * checks the same on a GPU, where the intervals are the device's.)
 */
#include "harness.h"

#include "loom/autograd.h"

#include <stdlib.h>
#include <string.h>
#include <time.h>

static lm_ctx *g, *g2;

static void test_marks(void) {
    lm_ag_profile_reset();
    lm_ag_profile_mark(g, "t ", "first");
    struct timespec t0, t1, ts = {0, 2 * 1000 * 1000};
    clock_gettime(CLOCK_MONOTONIC, &t0); /* the clock CPU events read */
    while (nanosleep(&ts, &ts) != 0) {
    }
    clock_gettime(CLOCK_MONOTONIC, &t1);
    lm_ag_profile_mark(g, "t ", "slept");
    double inner = (double)(t1.tv_sec - t0.tv_sec) * 1e3 + (double)(t1.tv_nsec - t0.tv_nsec) * 1e-6;
    lm_ag_profile_mark(g, "t ", "nothing");
    lm_ag_profile_mark(NULL, "t ", "no context");
    char *r = lt_profile_report();
    double ms = 0, ms0 = 0;
    long long calls = 0, calls0 = 0;
    LT_CHECK_MSG(r && strstr(r, "profile (LOOM_PROFILE)"), "no report header:\n%s", r ? r : "");
    LT_CHECK_MSG(!strstr(r, "t first") && !strstr(r, "t no context"), "an uncharged mark is listed:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t slept", &ms, &calls) && calls == 1 && ms >= inner - 0.006, /* the report rounds to 0.01 ms */
                 "slept: the interval between the marks (%.6f ms measured inside it) is charged:\n%s", inner, r);
    LT_CHECK_MSG(lt_profile_row(r, "t nothing", &ms0, &calls0) && calls0 == 1 && ms0 >= 0, "nothing:\n%s", r);
    free(r);

    lt_profile_check_batches(g, g2);

    /* more names than the table holds: the rest are counted, not dropped silently */
    lm_ag_profile_reset();
    char name[32];
    for (int i = 0; i < 101; i++) {
        snprintf(name, sizeof name, "name %d", i);
        lm_ag_profile_mark(g, "t ", name);
    }
    r = lt_profile_report();
    LT_CHECK_MSG(r && strstr(r, "(5 marks past the table's 96 names, charged to none)"), "overflow:\n%s", r);
    free(r);
}

int main(void) {
    setenv("LOOM_PROFILE", "1", 1); /* read once, at the first profile call */
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g2));
    LT_CHECK(lm_ag_profile_enabled());
    LT_RUN(test_marks);
    lm_ctx_destroy(g2);
    lm_ctx_destroy(g);
    return lt_finish();
}
