/* The operation profile (LOOM_PROFILE=1, autograd/profile.c) on CPU contexts, whose
 * events are host timestamps: a mark is charged the time since the previous mark on
 * the same context, resolved in batches. Checked: a mark after a 20 ms sleep is charged
 * at least that (a sleep lasts at least its length, so the bound holds on a busy
 * machine); every mark is counted once; the first mark (no earlier one) is charged
 * nothing; a reset forgets the totals but keeps the last mark as the base; 10,000
 * marks (more than one batch of 4,096) are all counted; a mark on another context
 * starts a new batch (the first mark there is not charged, nor the first back on the
 * first context); a NULL context is ignored. (tests/cuda/test_cuda_profile.c checks the
 * same on a GPU, where the intervals are the device's.)
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
    struct timespec ts = {0, 20 * 1000 * 1000};
    while (nanosleep(&ts, &ts) != 0) {
    }
    lm_ag_profile_mark(g, "t ", "slept");
    lm_ag_profile_mark(g, "t ", "nothing");
    lm_ag_profile_mark(NULL, "t ", "no context");
    char *r = lt_profile_report();
    double ms = 0, ms0 = 0;
    long long calls = 0, calls0 = 0;
    LT_CHECK_MSG(r && strstr(r, "profile (LOOM_PROFILE)"), "no report header:\n%s", r ? r : "");
    LT_CHECK_MSG(!strstr(r, "t first") && !strstr(r, "t no context"), "an uncharged mark is listed:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t slept", &ms, &calls) && calls == 1 && ms >= 19.9, "slept:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t nothing", &ms0, &calls0) && calls0 == 1 && ms0 >= 0, "nothing:\n%s", r);
    free(r);

    lt_profile_check_batches(g, g2);
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
