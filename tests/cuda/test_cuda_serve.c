/* The schedulers on the GPU (tokens picked on the device, one sampling record per
 * row, each row its own random stream):
 *  - deterministic mode: for random arrival orders and slot counts, every request's
 *    tokens (greedy, and seeded temperature sampling) equal the deterministic
 *    reference scheduler's exactly — the batch-invariant mode;
 *  - the paged cache, deterministic: the reference's tokens too;
 *  - the default (batched) mode, with one request asking for logprobs (the host path in
 *    the same steps): every request finishes with its max_tokens; how many greedy
 *    requests equal the reference is printed (the batched kernels round differently,
 *    so a near tie may go the other way: not a failure).
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda model
 */
#include "cuda_test.h"
#include "loom/serve.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#define MODEL LOOM_SOURCE_DIR "/tests/data/models/qwen3_headdim"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json"
#define NREQ 12
#define MAXTOK 24
#define CONTEXT 64

typedef struct outcome {
    int32_t ids[MAXTOK];
    int n, finishes;
    lm_finish_reason reason;
} outcome;

static int on_event(void *user, const lm_serve_event *ev) {
    outcome *o = user;
    if (ev->kind == LM_SERVE_FINISH) o->finishes++, o->reason = ev->reason;
    else if (o->n < MAXTOK) o->ids[o->n++] = ev->id;
    return 0;
}

static lm_model *g_model;
static lm_tokenizer *g_tok;
static lm_ctx *g_ctx;
static int32_t g_prompt[NREQ][16];
static size_t g_len[NREQ];
static lm_serve_params g_p[NREQ];

static void make_jobs(void) {
    lt_rng r = lt_rng_seed(3);
    static const int lens[NREQ] = {5, 3, 5, 9, 5, 3, 12, 1, 9, 16, 5, 2};
    for (int i = 0; i < NREQ; i++) {
        g_len[i] = (size_t)lens[i];
        for (size_t t = 0; t < g_len[i]; t++) g_prompt[i][t] = (int32_t)lt_rng_int(&r, 3, 383);
        lm_serve_params_default(&g_p[i]);
        g_p[i].max_tokens = 6 + (i * 5) % 18;
        g_p[i].ignore_eos = 1;
        if (i % 4 == 3) { /* seeded sampling: each request its own stream */
            g_p[i].sampler.greedy = 0;
            g_p[i].sampler.temperature = 0.9f;
            g_p[i].sampler.seed = 100 + (uint64_t)i;
        }
    }
}

static void run_opts(lm_sched_kind kind, int slots, int deterministic, int64_t paged_blocks, const int *order,
                     const int *arrive, outcome *out, int logprobs_request) {
    lm_sched_options o;
    lm_sched_options_default(&o);
    o.kind = kind, o.slots = slots, o.context = CONTEXT, o.deterministic = deterministic;
    if (paged_blocks >= 0) o.paged = 1, o.block_size = 16, o.kv_blocks = paged_blocks;
    lm_scheduler *s = NULL;
    LT_CHECK_OK(lm_scheduler_create(g_model, g_tok, &o, &s));
    memset(out, 0, sizeof(outcome) * NREQ);
    int next = 0, busy = 1;
    for (int step = 0; (busy || next < NREQ) && step < 5000; step++) {
        while (next < NREQ && arrive[next] <= step) {
            int i = order[next++];
            lm_serve_params p = g_p[i];
            if (i == logprobs_request) p.logprobs = 1, p.top_logprobs = 2;
            int64_t id;
            LT_CHECK_OK(lm_scheduler_submit(s, g_prompt[i], g_len[i], &p, on_event, &out[i], &id));
        }
        LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    }
    for (int i = 0; i < NREQ; i++)
        LT_CHECK_MSG(out[i].finishes == 1 && out[i].n == g_p[i].max_tokens && out[i].reason == LM_FINISH_LENGTH,
                     "request %d: %d finishes, %d tokens", i, out[i].finishes, out[i].n);
    lm_scheduler_destroy(s);
}

static void run(lm_sched_kind kind, int slots, int deterministic, const int *order, const int *arrive, outcome *out,
                int logprobs_request) {
    run_opts(kind, slots, deterministic, -1, order, arrive, out, logprobs_request);
}

static void shuffled(lt_rng *r, int *order, int *arrive, int spread) {
    for (int i = 0; i < NREQ; i++) order[i] = i;
    for (int i = NREQ - 1; i > 0; i--) {
        int k = (int)lt_rng_int(r, 0, i), t = order[i];
        order[i] = order[k], order[k] = t;
    }
    for (int i = 0; i < NREQ; i++) arrive[i] = spread ? (int)lt_rng_int(r, 0, spread) : 0;
    for (int i = 1; i < NREQ; i++) arrive[i] = arrive[i] < arrive[i - 1] ? arrive[i - 1] : arrive[i];
}

static void test_deterministic_equals_reference(void) {
    int order[NREQ], arrive[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) order[i] = i;
    outcome ref[NREQ], got[NREQ];
    run(LM_SCHED_REFERENCE, 1, 1, order, arrive, ref, -1);
    lt_rng r = lt_rng_seed(11);
    static const int slot_counts[] = {3, 8, 12};
    for (int trial = 0; trial < 3; trial++) {
        shuffled(&r, order, arrive, trial == 0 ? 0 : 20);
        run(LM_SCHED_CONTINUOUS, slot_counts[trial], 1, order, arrive, got, -1);
        for (int i = 0; i < NREQ; i++)
            LT_CHECK_MSG(got[i].n == ref[i].n && memcmp(got[i].ids, ref[i].ids, sizeof(int32_t) * (size_t)ref[i].n) == 0,
                         "trial %d (%d slots): request %d differs from the reference", trial, slot_counts[trial], i);
    }
}

/* The paged cache on the GPU, deterministic (no prefix reuse; a pool roomy enough that
 * nobody is preempted): the reference's tokens. */
static void test_paged_deterministic_equals_reference(void) {
    int order[NREQ], arrive[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) order[i] = i;
    outcome ref[NREQ], got[NREQ];
    run(LM_SCHED_REFERENCE, 1, 1, order, arrive, ref, -1);
    lt_rng r = lt_rng_seed(13);
    static const int64_t pools[2] = {0, 40};
    for (int trial = 0; trial < 2; trial++) {
        shuffled(&r, order, arrive, 15);
        run_opts(LM_SCHED_CONTINUOUS, 8, 1, pools[trial], order, arrive, got, -1);
        for (int i = 0; i < NREQ; i++)
            LT_CHECK_MSG(got[i].n == ref[i].n && memcmp(got[i].ids, ref[i].ids, sizeof(int32_t) * (size_t)ref[i].n) == 0,
                         "paged (pool %lld): request %d differs from the reference", (long long)pools[trial], i);
    }
}

static void test_batched_mode(void) {
    int order[NREQ], arrive[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) order[i] = i;
    outcome ref[NREQ], got[NREQ];
    run(LM_SCHED_REFERENCE, 1, 1, order, arrive, ref, -1);
    lt_rng r = lt_rng_seed(12);
    shuffled(&r, order, arrive, 10);
    run(LM_SCHED_CONTINUOUS, 12, 0, order, arrive, got, 6); /* request 6 takes the host path (logprobs) */
    int equal = 0, greedy = 0, first = 0;
    for (int i = 0; i < NREQ; i++) {
        if (!g_p[i].sampler.greedy) continue;
        greedy++;
        first += got[i].ids[0] == ref[i].ids[0];
        equal += got[i].n == ref[i].n && memcmp(got[i].ids, ref[i].ids, sizeof(int32_t) * (size_t)ref[i].n) == 0;
    }
    printf("batched mode: %d of %d greedy requests equal the reference throughout; %d agree on the first token\n", equal,
           greedy, first);
}

int main(void) {
    g_ctx = ct_start();
    LT_CHECK_OK(lm_model_load(MODEL, ct_gpu, &g_model));
    LT_CHECK_OK(lm_tokenizer_load(TOKENIZER, &g_tok));
    make_jobs();
    LT_RUN(test_deterministic_equals_reference);
    LT_RUN(test_paged_deterministic_equals_reference);
    LT_RUN(test_batched_mode);
    lm_tokenizer_destroy(g_tok);
    lm_model_destroy(g_model);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
