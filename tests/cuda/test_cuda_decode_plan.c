/* The decode schedule's skeleton on the GPU (lm_decode_plan_replay_cuda): a bf16
 * model's step planned on the CPU (1, 2, 16 and all SMs; small pieces, so there are
 * many items and dependencies) runs as one cooperative launch whose blocks walk their
 * lists, wait for dependencies through counters and stream each item's bytes; every
 * launch must finish (no wait outlasts ~2 s) and report its times (no time is compared
 * with another: speed belongs in bench/NOTES.md). A plan made to deadlock (an
 * item waiting for a later item of its own list) must be reported as a wait that never
 * ends, not hang. And a plan of the CUDA executor's own step (device arena, bf16 caches,
 * key-chunk partials on the device) is checked and replayed. Times are printed, not gated.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda plan
 */
#include "cuda/cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#include "plan/dplan.h"

#include <math.h>

static lm_ctx *g_cpu, *g_gpu;

static void test_replay_runs(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/llama3_scaled_bf16", LOOM_SOURCE_DIR);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &m));
    lm_decode_step *s = NULL;
    if (m) LT_CHECK_OK(lm_decode_step_create(g_cpu, m, 1, 64, &s));
    int sm_count = 0;
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
    const int sms[4] = {1, 2, 16, sm_count};
    for (int k = 0; s && k < 4; k++) {
        lm_decode_plan_options o;
        lm_decode_plan_options_default(&o);
        o.sms = sms[k], o.full_sms = sm_count;
        o.item_bytes = 2048, o.min_item_bytes = 256, o.prefetch_bytes = k % 2 ? 1024 : 0;
        lm_decode_plan *p = NULL;
        LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
        if (!p) continue;
        lm_decode_plan_replay r;
        LT_CHECK_OK(lm_decode_plan_replay_cuda(p, 0, 5, &r));
        lm_decode_plan_stats st;
        LT_CHECK_OK(lm_decode_plan_get_stats(p, &st));
        printf("  %d SMs, %lld items: replay %.1f us (min %.1f), waits only %.1f us (min %.1f); with op counters "
               "%.1f us, waits only %.1f us; predicted %.1f us\n", sms[k], (long long)st.items, r.step_us,
               r.step_us_min, r.empty_us, r.empty_us_min, r.ops_step_us, r.ops_empty_us, st.step_s * 1e6);
        LT_CHECK(r.steps == 5 && r.step_us > 0 && r.step_us_min > 0 && r.step_us_min <= r.step_us * (1 + 1e-9));
        LT_CHECK(r.empty_us > 0 && r.empty_us_min <= r.empty_us * (1 + 1e-9));
        LT_CHECK(r.ops_step_us > 0 && r.ops_step_us_min <= r.ops_step_us * (1 + 1e-9));
        LT_CHECK(r.ops_empty_us > 0 && r.ops_empty_us_min <= r.ops_empty_us * (1 + 1e-9));
        /* the counters replace every all-of-an-op dependency with one wait */
        LT_CHECK(r.waits == st.deps && r.ops_waits > 0 && r.ops_waits <= r.waits);
        lm_decode_plan_destroy(p);
    }
    /* the replay's prefetch buffers live in shared memory: more than it holds is refused */
    if (s) {
        lm_decode_plan_options o;
        lm_decode_plan_options_default(&o);
        o.sms = 2, o.full_sms = sm_count, o.prefetch_bytes = 200 << 10;
        lm_decode_plan *p = NULL;
        LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
        lm_decode_plan_replay r;
        if (p) LT_CHECK_STATUS(lm_decode_plan_replay_cuda(p, 0, 1, &r), LM_INVALID_ARGUMENT);
        if (p) LT_CHECK_MSG(strstr(lm_last_error(), "prefetches at most") != NULL, "%s", lm_last_error());
        lm_decode_plan_destroy(p);
    }
    /* an item waiting for a later item of its own list never starts */
    lm_decode_plan_options o;
    lm_decode_plan_options_default(&o);
    o.sms = 1, o.item_bytes = 2048, o.min_item_bytes = 256;
    lm_decode_plan *p = NULL;
    if (s) LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    if (p) {
        int64_t i = -1;
        for (int64_t k = 0; k + 1 < p->nitems && i < 0; k++)
            if (p->items[k].ndep > 0) i = k;
        LT_CHECK(i >= 0);
        if (i >= 0) {
            p->deps[p->items[i].dep0] = (int32_t)(p->nitems - 1);
            lm_decode_plan_replay r;
            LT_CHECK_STATUS(lm_decode_plan_replay_cuda(p, 0, 1, &r), LM_INTERNAL);
            LT_CHECK_MSG(strstr(lm_last_error(), "waited more than") != NULL, "%s", lm_last_error());
        }
        lm_decode_plan_destroy(p);
    }
    lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

/* A plan of the CUDA executor's own step (its passes, its arena, bf16 caches on the
 * device; key chunks, so the partials live on the device too): the step runs and gives
 * finite logits, the plan is checked and its skeleton replayed. */
static void test_plan_of_the_cuda_step(void) {
    lm_ctx *g = g_gpu;
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/qwen2_window_bf16", LOOM_SOURCE_DIR);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, ct_gpu, &m));
    lm_decode_step *s = NULL;
    if (m) LT_CHECK_OK(lm_decode_step_create(g, m, 1, 2048, &s));
    if (!s) {
        lm_model_destroy(m);
        return;
    }
    int64_t V = lm_model_get_config(m)->vocab_size;
    float *logits = malloc(sizeof(float) * (size_t)V);
    int32_t id = 3, pos = 0;
    LT_CHECK_OK(lm_decode_step_run(s, g, &id, &pos, NULL, 0, logits));
    int finite = 1;
    for (int64_t i = 0; i < V; i++) finite &= isfinite(logits[i]) != 0;
    LT_CHECK(finite);
    lm_decode_plan_options o;
    lm_decode_plan_options_default(&o);
    o.sms = 8, o.item_bytes = 4096, o.min_item_bytes = 256;
    lm_decode_plan *p = NULL;
    LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(s), &o, &p));
    if (p) {
        LT_CHECK_OK(lm_decode_plan_check(p));
        int parts = 0;
        for (int64_t i = 0; i < p->nitems; i++) parts += p->items[i].kind == LM__DP_ATTN_PART;
        LT_CHECK_MSG(parts > 0 && p->part_on_device, "%d key chunks, partials on the device %d", parts, p->part_on_device);
        lm_decode_plan_replay r;
        LT_CHECK_OK(lm_decode_plan_replay_cuda(p, 0, 3, &r));
        printf("  the CUDA step: %lld items, replay %.1f us, waits only %.1f us\n", (long long)p->nitems, r.step_us,
               r.empty_us);
        LT_CHECK_STATUS(lm_decode_plan_run_cpu(p, g, 0), LM_INVALID_ARGUMENT); /* the CPU run needs the CPU */
    }
    lm_decode_plan_destroy(p);
    free(logits);
    lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

int main(void) {
    lm_ctx *g = ct_start();
    g_gpu = g;
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_cpu));
    LT_RUN(test_replay_runs);
    LT_RUN(test_plan_of_the_cuda_step);
    lm_ctx_destroy(g_cpu);
    lm_ctx_destroy(g);
    return lt_finish();
}
#endif
