/* A decode schedule run on the GPU as one persistent launch (lm_decode_plan_run_cuda)
 * against the CUDA executor running the same step, and against the CPU executor: steps
 * objects of one bf16 model on the GPU (two) and on the CPU (one), fed the same random
 * tokens for several positions (so each step reads the caches earlier steps of its own
 * run wrote), at 1 and 2 rows, on 2, 7 and all SMs, with small pieces (many items and
 * waits) and long caches (key chunks and merges). The executors poison their arenas
 * before each run, so a byte the launch fails to write is NaN in the logits.
 * Gates:
 *  - against the CUDA executor: the two runs differ by summation order (the launch's
 *    GEMV may split a row's K where the standalone kernel does not, its attention is its
 *    own) and by the bf16 rounding of cache values that follows: NMSE <= 1e-6 and
 *    max |d| <= 1e-2 of max |logit| per step, and the same argmax wherever the
 *    reference's top-2 margin exceeds that max |d|;
 *  - against the CPU executor (f32 activations and caches): test_cuda_model's gate for
 *    the GPU's bf16 roundings, NMSE <= 2e-3 and max |d| <= 5% of max |logit| per step,
 *    and the same argmax wherever the CPU's margin exceeds that max |d|.
 * Also: a plan made to deadlock is reported (LM_INTERNAL naming the wait), not hung on.
 * Times are printed, not gated. Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda plan
 */
#include "cuda/cuda_test.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#include "plan/dplan.h"

#include <math.h>

static lm_ctx *g_gpu, *g_cpu;

static uint32_t rnd(uint64_t *s) {
    *s = *s * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(*s >> 33);
}

/* Logits y of B rows against the reference x: NMSE <= nmse_gate and max |d| <= maxd_gate x
 * max |logit| per row, the same argmax where the reference's margin exceeds max |d|.
 * Returns the worst NMSE (INFINITY for a NaN). */
static double check_logits(const float *x, const float *y, int64_t B, int64_t V, double nmse_gate, double maxd_gate,
                           const char *what, const char *against, int t) {
    double worst = 0;
    for (int64_t r = 0; r < B; r++, x += V, y += V) {
        double num = 0, den = 0, mx = 0, amax = 0;
        int64_t ia = 0, ib = 0, i2 = -1;
        for (int64_t i = 0; i < V; i++) {
            double d = (double)y[i] - x[i];
            num += d * d, den += (double)x[i] * x[i];
            mx = isnan(d) || fabs(d) > mx ? (isnan(d) ? INFINITY : fabs(d)) : mx;
            amax = fmax(amax, fabs(x[i]));
            if (x[i] > x[ia]) ia = i;
            if (y[i] > y[ib]) ib = i;
        }
        for (int64_t i = 0; i < V; i++)
            if (i != ia && (i2 < 0 || x[i] > x[i2])) i2 = i;
        double nmse = num / fmax(den, 1e-30), margin = x[ia] - x[i2];
        worst = fmax(worst, isnan(nmse) ? INFINITY : nmse);
        LT_CHECK_MSG(nmse <= nmse_gate && mx <= maxd_gate * amax,
                     "%s against the %s, step %d row %lld: NMSE %.3g, max |d| %.3g of %.3g", what, against, t,
                     (long long)r, nmse, mx, amax);
        if (margin > mx)
            LT_CHECK_MSG(ia == ib, "%s against the %s, step %d row %lld: argmax %lld vs %lld (margin %.3g)", what,
                         against, t, (long long)r, (long long)ia, (long long)ib, margin);
    }
    return worst;
}

/* Steps of the plan's run against the CUDA executor's and the CPU executor's (model mc,
 * the same checkpoint in host memory); the worst NMSEs seen go to worst[0] (CUDA) and
 * worst[1] (CPU). */
static void compare_runs(lm_model *m, lm_model *mc, int64_t B, int64_t cache, const lm_decode_plan_options *o,
                         int steps, const char *what, double worst[2]) {
    lm_ctx *g = g_gpu;
    lm_decode_step *ref = NULL, *run = NULL, *cpu = NULL;
    LT_CHECK_OK(lm_decode_step_create(g, m, B, cache, &ref));
    LT_CHECK_OK(lm_decode_step_create(g, m, B, cache, &run));
    LT_CHECK_OK(lm_decode_step_create(g_cpu, mc, B, cache, &cpu));
    lm_decode_plan *p = NULL;
    if (run) LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(run), o, &p));
    if (p) LT_CHECK_OK(lm_decode_plan_check(p));
    const int64_t V = lm_model_get_config(m)->vocab_size;
    float *a = malloc(sizeof(float) * (size_t)(B * V)), *b = malloc(sizeof(float) * (size_t)(B * V));
    float *c = malloc(sizeof(float) * (size_t)(B * V));
    int32_t ids[8], pos[8];
    uint64_t seed = 77 + (uint64_t)B;
    worst[0] = worst[1] = 0;
    for (int t = 0; p && ref && cpu && t < steps; t++) {
        for (int64_t r = 0; r < B; r++) ids[r] = (int32_t)(rnd(&seed) % (uint32_t)V), pos[r] = t + (int32_t)r;
        LT_CHECK_OK(lm_decode_step_run(ref, g, ids, pos, NULL, 0, a));
        LT_CHECK_OK(lm_decode_step_run(cpu, g_cpu, ids, pos, NULL, 0, c));
        for (int64_t i = 0; i < B * V; i++) b[i] = NAN;
        lm_status st = lm_decode_step_run(run, g, ids, pos, p, 0, b);
        LT_CHECK_MSG(st == LM_OK, "%s step %d: %s", what, t, lm_last_error());
        if (st != LM_OK) break;
        worst[0] = fmax(worst[0], check_logits(a, b, B, V, 1e-6, 1e-2, what, "CUDA executor", t));
        worst[1] = fmax(worst[1], check_logits(c, b, B, V, 2e-3, 5e-2, what, "CPU executor", t));
    }
    free(a), free(b), free(c);
    lm_decode_plan_destroy(p);
    lm_decode_step_destroy(ref), lm_decode_step_destroy(run), lm_decode_step_destroy(cpu);
}

static void test_runs_match_the_executor(void) {
    static const char *names[] = {"qwen2_window_bf16", "llama3_scaled_bf16"};
    int sm_count = 0;
    cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, 0);
    const int sms[3] = {2, 7, sm_count};
    for (int k = 0; k < 2; k++) {
        char dir[512];
        snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, names[k]);
        lm_model *m = NULL, *mc = NULL;
        LT_CHECK_OK(lm_model_load(dir, ct_gpu, &m));
        LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &mc));
        if (!m || !mc) {
            lm_model_destroy(m), lm_model_destroy(mc);
            continue;
        }
        for (int64_t B = 1; B <= 2; B++)
            for (int j = 0; j < 3; j++) {
                lm_decode_plan_options o;
                lm_decode_plan_options_default(&o);
                o.sms = sms[j], o.full_sms = sm_count;
                if (j < 2) o.item_bytes = 8192, o.min_item_bytes = 512; /* many small pieces */
                char what[160];
                snprintf(what, sizeof what, "%s B%lld on %d SMs", names[k], (long long)B, sms[j]);
                double w[2];
                compare_runs(m, mc, B, 64, &o, 6, what, w);
                printf("  %s: worst NMSE %.3g (CUDA executor), %.3g (CPU executor)\n", what, w[0], w[1]);
            }
        /* long caches: key chunks of each kv head and their merges */
        lm_decode_plan_options o;
        lm_decode_plan_options_default(&o);
        o.full_sms = sm_count;
        char what[160];
        snprintf(what, sizeof what, "%s B1, cache 2048 (key chunks)", names[k]);
        double w[2];
        compare_runs(m, mc, 1, 2048, &o, 4, what, w);
        printf("  %s: worst NMSE %.3g (CUDA executor), %.3g (CPU executor)\n", what, w[0], w[1]);
        lm_model_destroy(m), lm_model_destroy(mc);
    }
}

/* Test model `name` on the GPU, its one-row step with a cache of `cache` positions and
 * a plan of it (o: NULL for the defaults); NULLs where a step failed (checked). */
static void open_plan(const char *name, int64_t cache, const lm_decode_plan_options *o, lm_model **m,
                      lm_decode_step **s, lm_decode_plan **p) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    *m = NULL, *s = NULL, *p = NULL;
    LT_CHECK_OK(lm_model_load(dir, ct_gpu, m));
    if (*m) LT_CHECK_OK(lm_decode_step_create(g_gpu, *m, 1, cache, s));
    if (*s) LT_CHECK_OK(lm_decode_plan_create(lm_decode_step_exec(*s), o, p));
}

/* The kinds of items a plan of that long cache holds (the test above must exercise them). */
static void test_long_cache_has_key_chunks(void) {
    lm_model *m;
    lm_decode_step *s;
    lm_decode_plan *p;
    open_plan("qwen2_window_bf16", 2048, NULL, &m, &s, &p);
    int parts = 0, merges = 0;
    for (int64_t i = 0; p && i < p->nitems; i++)
        parts += p->items[i].kind == LM__DP_ATTN_PART, merges += p->items[i].kind == LM__DP_ATTN_COMBINE;
    LT_CHECK_MSG(parts > 0 && merges > 0, "%d key chunks, %d merges", parts, merges);
    if (p) {
        lm_decode_plan_timing tm;
        LT_CHECK_OK(lm_decode_plan_time_cuda(p, g_gpu, 20, &tm));
        printf("  a step of the test model: plan %.1f us, executor %.1f us\n", tm.plan_us, tm.exec_us);
    }
    lm_decode_plan_destroy(p);
    lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

/* An item waiting for a later item of its own list never starts: reported, not hung on. */
static void test_deadlock_is_reported(void) {
    lm_decode_plan_options o;
    lm_decode_plan_options_default(&o);
    o.sms = 1;
    lm_model *m;
    lm_decode_step *s;
    lm_decode_plan *p;
    open_plan("llama3_scaled_bf16", 64, &o, &m, &s, &p);
    if (p) {
        int64_t i = -1, last = p->nitems - 1;
        for (int64_t k = 1; k < last && i < 0; k++)
            if (p->items[k].kind != LM__DP_WHOLE && p->wait_begin[k + 1] > p->wait_begin[k]) i = k;
        LT_CHECK(i >= 0 && p->items[last].kind != LM__DP_WHOLE);
        if (i >= 0) {
            p->waits[p->wait_begin[i]] = (int32_t)last;
            LT_CHECK_STATUS(lm_decode_plan_run_cuda(p, g_gpu), LM_INTERNAL);
            LT_CHECK_MSG(strstr(lm_last_error(), "waited more than") != NULL, "%s", lm_last_error());
        }
    }
    lm_decode_plan_destroy(p);
    lm_decode_step_destroy(s);
    lm_model_destroy(m);
}

int main(void) {
    g_gpu = ct_start();
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_cpu));
    LT_RUN(test_runs_match_the_executor);
    LT_RUN(test_long_cache_has_key_chunks);
    LT_RUN(test_deadlock_is_reported);
    lm_ctx_destroy(g_gpu), lm_ctx_destroy(g_cpu);
    return lt_finish();
}
#endif
