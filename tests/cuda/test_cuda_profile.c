/* The operation profile (LOOM_PROFILE=1, autograd/profile.c) on a GPU context: marks
 * record events and are resolved later, so each name is charged the device time
 * between its mark and the one before it. Checked: the mark after four 256 MiB device
 * copies (2 GiB moved) is charged at least 0.05 ms, which no GPU beats (43 TB/s), so
 * the copies' time lands on it (a bound slowness cannot break); every mark is counted
 * once; the first mark (no earlier one) is charged nothing; the shared checks of
 * lt_profile_check_batches (resets, more marks than one batch of 4,096 events, a mark
 * on another context starting a new batch).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda
 */
#include "cuda_test.h"

#include "loom/autograd.h"

#include <stdio.h>

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g, *g2;

static void test_marks(void) {
    int64_t n = 64 << 20; /* 256 MiB of f32 each way */
    lm_tensor *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_F32, 1, &n, &a));
    LT_CHECK_OK(lm_tensor_create(ct_gpu, LM_F32, 1, &n, &b));
    size_t bytes = (size_t)n * sizeof(float);
    lm_ag_profile_reset();
    lm_ag_profile_mark(g, "t ", "first");
    for (int i = 0; i < 4; i++) LT_CHECK_OK(lm_ctx_copy(g, ct_gpu, lm_tensor_data(b), ct_gpu, lm_tensor_data(a), bytes));
    lm_ag_profile_mark(g, "t ", "copies");
    lm_ag_profile_mark(g, "t ", "nothing");
    char *r = lt_profile_report();
    double ms = 0, ms0 = 0;
    long long calls = 0, calls0 = 0;
    LT_CHECK_MSG(!strstr(r, "t first"), "the first mark was charged:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t copies", &ms, &calls) && calls == 1, "copies:\n%s", r);
    LT_CHECK_MSG(lt_profile_row(r, "t nothing", &ms0, &calls0) && calls0 == 1, "nothing:\n%s", r);
    LT_CHECK_MSG(ms >= 0.05 && ms0 >= 0, "4 x 256 MiB copies charged %.4f ms, an empty interval %.4f ms", ms, ms0);
    free(r);

    lt_profile_check_batches(g, g2);
    lm_tensor_destroy(a);
    lm_tensor_destroy(b);
}

int main(void) {
    setenv("LOOM_PROFILE", "1", 1); /* read once, at the first profile call */
    g = ct_start();
    LT_CHECK_OK(lm_ctx_create(ct_gpu, 1, &g2));
    LT_CHECK(lm_ag_profile_enabled());
    LT_RUN(test_marks);
    lm_ctx_destroy(g2);
    lm_ctx_destroy(g);
    return lt_finish();
}
#endif
