/* The schedulers against the reference scheduler: for random arrival orders, batch
 * compositions, slot counts and bucket layouts, every request gets exactly the
 * reference's greedy tokens, text and finish reason (CPU). Also: equal-length
 * prompts prefill in one step, the lowest free slot is reused, cancellation (by the
 * caller and by the callback) frees the slot, requests that fit no bucket are
 * refused, a full queue is refused, the reference scheduler equals lm_generate,
 * logprobs are the raw log-softmax, and presence/frequency penalties follow OpenAI's
 * definition on synthetic logits.
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/serve.h"
#include "serve/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define MODEL LOOM_SOURCE_DIR "/tests/data/models/qwen3_headdim"
#define TOKENIZER LOOM_SOURCE_DIR "/tests/data/train/tokenizer.json" /* byte-level BPE, 384 ids */
#define NREQ 12
#define MAXTOK 40

typedef struct outcome {
    int32_t ids[MAXTOK];
    int n, finishes;
    char text[1024];
    size_t len;
    lm_finish_reason reason;
    int64_t prompt_tokens, completion_tokens;
    int cancel_after; /* the callback asks to cancel after this many tokens (0: never) */
    float logprob[MAXTOK];
    int n_top[MAXTOK];
    int32_t top0[MAXTOK];
    float top_lp[MAXTOK][4];
} outcome;

static int on_event(void *user, const lm_serve_event *ev) {
    outcome *o = user;
    if (o->len + ev->len < sizeof o->text) {
        memcpy(o->text + o->len, ev->text, ev->len);
        o->len += ev->len;
    }
    if (ev->kind == LM_SERVE_FINISH) {
        o->finishes++;
        o->reason = ev->reason;
        o->prompt_tokens = ev->prompt_tokens;
        o->completion_tokens = ev->completion_tokens;
        return 0;
    }
    if (o->n < MAXTOK) {
        o->logprob[o->n] = ev->logprob;
        o->n_top[o->n] = ev->n_top;
        o->top0[o->n] = ev->n_top ? ev->top_ids[0] : -1;
        for (int j = 0; j < ev->n_top && j < 4; j++) o->top_lp[o->n][j] = ev->top_logprobs[j];
        o->ids[o->n++] = ev->id;
    }
    return o->cancel_after && o->n >= o->cancel_after;
}

typedef struct job {
    int32_t prompt[24];
    size_t n_prompt;
    lm_serve_params p;
    const char *stop[1];
    char stop_text[8];
} job;

static lm_model *g_model;
static lm_tokenizer *g_tok;
static lm_ctx *g_ctx;
static job g_jobs[NREQ];
static outcome g_ref[NREQ];

/* Prompts of lengths with repeats (so equal-length groups form), mixed max_tokens,
 * one request with a stop string and one sampled at a temperature with a seed. */
static void make_jobs(void) {
    lt_rng r = lt_rng_seed(42);
    static const int lens[NREQ] = {5, 3, 5, 8, 5, 3, 12, 1, 8, 20, 5, 2};
    for (int i = 0; i < NREQ; i++) {
        job *j = &g_jobs[i];
        j->n_prompt = (size_t)lens[i];
        for (size_t t = 0; t < j->n_prompt; t++) j->prompt[t] = (int32_t)lt_rng_int(&r, 3, 383);
        lm_serve_params_default(&j->p);
        j->p.max_tokens = 4 + (i * 7) % 29;
        j->p.ignore_eos = 1;
        j->p.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
        if (i == 3) {
            j->p.sampler.greedy = 0;
            j->p.sampler.temperature = 0.8f;
            j->p.sampler.top_k = 20;
            j->p.sampler.seed = 1234;
        }
        if (i == 5) j->p.logprobs = 1, j->p.top_logprobs = 3;
        if (i == 6) j->p.frequency_penalty = 0.5f, j->p.presence_penalty = 0.25f;
    }
}

/* Runs every job through s: job order[k] is submitted before step arrive[k]. */
static void run_jobs(lm_scheduler *s, const int *order, const int *arrive, outcome *out) {
    memset(out, 0, sizeof(outcome) * NREQ);
    int next = 0, busy = 1;
    for (int step = 0; (busy || next < NREQ) && step < 10000; step++) {
        while (next < NREQ && arrive[next] <= step) {
            int i = order[next++];
            int64_t id;
            LT_CHECK_OK(lm_scheduler_submit(s, g_jobs[i].prompt, g_jobs[i].n_prompt, &g_jobs[i].p, on_event, &out[i], &id));
        }
        LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    }
    for (int i = 0; i < NREQ; i++) LT_CHECK_MSG(out[i].finishes == 1, "request %d finished %d times", i, out[i].finishes);
}

static void expect_same(const char *what, const outcome *got) {
    for (int i = 0; i < NREQ; i++) {
        const outcome *a = &got[i], *b = &g_ref[i];
        int same = a->n == b->n && memcmp(a->ids, b->ids, sizeof(int32_t) * (size_t)a->n) == 0 && a->len == b->len &&
                   memcmp(a->text, b->text, a->len) == 0 && a->reason == b->reason &&
                   a->completion_tokens == b->completion_tokens && a->prompt_tokens == b->prompt_tokens;
        LT_CHECK_MSG(same, "%s: request %d differs from the reference (%d vs %d tokens)", what, i, a->n, b->n);
    }
}

static int collect_generate(void *user, int32_t id, const char *text, size_t len) {
    outcome *o = user;
    if (o->len + len < sizeof o->text) memcpy(o->text + o->len, text, len), o->len += len;
    if (id >= 0 && o->n < MAXTOK) o->ids[o->n++] = id;
    return 0;
}

static lm_scheduler *make(lm_sched_kind kind, int slots, int64_t context) {
    lm_sched_options o;
    lm_sched_options_default(&o);
    o.kind = kind, o.slots = slots, o.context = context;
    lm_scheduler *s = NULL;
    LT_CHECK_OK(lm_scheduler_create(g_model, g_tok, &o, &s));
    return s;
}

static void test_reference_equals_generate(void) {
    int order[NREQ], arrive[NREQ] = {0};
    for (int i = 0; i < NREQ; i++) order[i] = i;
    lm_scheduler *s = make(LM_SCHED_REFERENCE, 0, 0);
    run_jobs(s, order, arrive, g_ref);
    lm_scheduler_destroy(s);
    for (int i = 0; i < NREQ; i++) {
        LT_CHECK(g_ref[i].reason == LM_FINISH_LENGTH && g_ref[i].n == g_jobs[i].p.max_tokens);
        LT_CHECK(g_ref[i].prompt_tokens == (int64_t)g_jobs[i].n_prompt && g_ref[i].completion_tokens == g_ref[i].n);
    }
    /* the same requests through lm_generate (host sampler, same seeds): same ids */
    for (int i = 0; i < NREQ; i++) {
        if (g_jobs[i].p.frequency_penalty != 0) continue; /* lm_generate has no OpenAI penalties */
        lm_generate_params gp = {0};
        gp.max_new_tokens = g_jobs[i].p.max_tokens;
        gp.sampler = g_jobs[i].p.sampler;
        gp.ignore_eos = 1;
        gp.decode_flags = LM_TOKENIZER_SKIP_SPECIAL;
        outcome g = {0};
        lm_generate_result res;
        LT_CHECK_OK(lm_generate(g_model, g_ctx, g_tok, g_jobs[i].prompt, g_jobs[i].n_prompt, &gp, collect_generate, &g, &res));
        LT_CHECK_MSG(res.new_tokens == g_ref[i].n && g.n == g_ref[i].n &&
                         memcmp(g.ids, g_ref[i].ids, sizeof(int32_t) * (size_t)g.n) == 0 && g.len == g_ref[i].len &&
                         memcmp(g.text, g_ref[i].text, g.len) == 0,
                     "request %d: the reference scheduler differs from lm_generate", i);
    }
    /* one stop string, taken from the middle of request 0's text */
    job *j = &g_jobs[0];
    LT_CHECK(g_ref[0].len >= 6);
    size_t at = g_ref[0].len / 2;
    while (at > 0 && ((unsigned char)g_ref[0].text[at] & 0xC0) == 0x80) at--;
    memcpy(j->stop_text, g_ref[0].text + at, 2);
    j->stop[0] = j->stop_text;
    j->p.stop = j->stop;
    j->p.n_stop = 1;
    s = make(LM_SCHED_REFERENCE, 0, 0);
    run_jobs(s, order, arrive, g_ref);
    lm_scheduler_destroy(s);
    LT_CHECK(g_ref[0].reason == LM_FINISH_STOP && strstr(g_ref[0].text, j->stop_text) == NULL);
}

static void test_continuous_equals_reference(void) {
    lt_rng r = lt_rng_seed(7);
    static const int slot_counts[] = {1, 2, 3, 5, 16};
    for (int trial = 0; trial < 10; trial++) {
        int order[NREQ], arrive[NREQ];
        for (int i = 0; i < NREQ; i++) order[i] = i;
        for (int i = NREQ - 1; i > 0; i--) { /* a random arrival order */
            int k = (int)lt_rng_int(&r, 0, i), t = order[i];
            order[i] = order[k], order[k] = t;
        }
        int spread = trial % 3 == 0 ? 0 : (int)lt_rng_int(&r, 1, 30); /* 0: all at once */
        for (int i = 0; i < NREQ; i++) arrive[i] = spread ? (int)lt_rng_int(&r, 0, spread) : 0;
        for (int i = 1; i < NREQ; i++) arrive[i] = arrive[i] < arrive[i - 1] ? arrive[i - 1] : arrive[i];
        int slots = slot_counts[trial % 5];
        lm_scheduler *s = make(LM_SCHED_CONTINUOUS, slots, 64);
        outcome got[NREQ];
        run_jobs(s, order, arrive, got);
        char what[64];
        snprintf(what, sizeof what, "continuous, %d slots, trial %d", slots, trial);
        expect_same(what, got);
        lm_sched_stats st;
        lm_scheduler_stats_get(s, &st);
        LT_CHECK(st.running == 0 && st.pending == 0 && st.slots_used == 0 && st.kv_tokens_used == 0);
        LT_CHECK(st.finished == NREQ && st.failed == 0 && st.cancelled == 0);
        lm_scheduler_destroy(s);
    }
}

static void test_bucketed_equals_reference(void) {
    for (int spill = 0; spill < 2; spill++) {
        lm_sched_options o;
        lm_sched_options_default(&o);
        o.kind = LM_SCHED_BUCKETED;
        o.n_buckets = 3;
        o.bucket_slots[0] = 2, o.bucket_context[0] = 16;
        o.bucket_slots[1] = 1, o.bucket_context[1] = 32;
        o.bucket_slots[2] = 3, o.bucket_context[2] = 64;
        o.spill_to_larger = spill;
        lm_scheduler *s = NULL;
        LT_CHECK_OK(lm_scheduler_create(g_model, g_tok, &o, &s));
        int order[NREQ];
        for (int i = 0; i < NREQ; i++) order[i] = NREQ - 1 - i;
        outcome got[NREQ];
        /* placement: watch the buckets while it runs */
        memset(got, 0, sizeof got);
        int64_t ids[NREQ];
        for (int k = 0; k < NREQ; k++) {
            int i = order[k];
            LT_CHECK_OK(lm_scheduler_submit(s, g_jobs[i].prompt, g_jobs[i].n_prompt, &g_jobs[i].p, on_event, &got[i], &ids[i]));
        }
        int busy = 1;
        for (int step = 0; busy && step < 10000; step++) LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
        for (int i = 0; i < NREQ; i++) {
            lm_serve_snapshot sn;
            LT_CHECK_OK(lm_scheduler_snapshot(s, ids[i], 1, &sn));
            int64_t need = (int64_t)g_jobs[i].n_prompt + g_jobs[i].p.max_tokens;
            int smallest = need <= 16 ? 0 : need <= 32 ? 1 : 2;
            LT_CHECK_MSG(sn.done && sn.slot >= 0 && o.bucket_context[sn.bucket] >= need, "request %d in bucket %d", i, sn.bucket);
            if (!spill) LT_CHECK_MSG(sn.bucket == smallest, "request %d (%lld positions) in bucket %d", i, (long long)need, sn.bucket);
            LT_CHECK(sn.submitted > 0 && sn.first_token >= sn.submitted && sn.finished >= sn.first_token);
            LT_CHECK_STATUS(lm_scheduler_snapshot(s, ids[i], 0, &sn), LM_NOT_FOUND); /* taken */
        }
        expect_same(spill ? "bucketed with spill" : "bucketed", got);
        /* a request longer than the largest bucket is refused at once */
        lm_serve_params p = g_jobs[0].p;
        p.max_tokens = 64;
        int64_t id;
        LT_CHECK_STATUS(lm_scheduler_submit(s, g_jobs[0].prompt, g_jobs[0].n_prompt, &p, on_event, &got[0], &id), LM_OUT_OF_RANGE);
        lm_scheduler_destroy(s);
    }
}

static void test_prefill_groups_slots_and_cancel(void) {
    lm_scheduler *s = make(LM_SCHED_CONTINUOUS, 4, 64);
    outcome o[6];
    memset(o, 0, sizeof o);
    int64_t ids[6];
    lm_serve_params p;
    lm_serve_params_default(&p);
    p.ignore_eos = 1;
    p.max_tokens = 30;
    int32_t prompt[5] = {10, 20, 30, 40, 50};
    /* three prompts of length 5 and one of length 3: two prefill steps, then decodes */
    for (int i = 0; i < 3; i++) LT_CHECK_OK(lm_scheduler_submit(s, prompt, 5, &p, on_event, &o[i], &ids[i]));
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 3, &p, on_event, &o[3], &ids[3]));
    int busy;
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_sched_stats st;
    lm_scheduler_stats_get(s, &st);
    LT_CHECK(st.prefill_steps == 1 && st.prompt_tokens == 15 && st.running == 4 && st.slots_used == 4);
    LT_CHECK(o[0].n == 1 && o[1].n == 1 && o[2].n == 1 && o[3].n == 0);
    LT_CHECK(o[0].ids[0] == o[1].ids[0] && o[1].ids[0] == o[2].ids[0]); /* same prompt, greedy */
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_scheduler_stats_get(s, &st);
    LT_CHECK(st.prefill_steps == 2 && o[3].n == 1);
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_scheduler_stats_get(s, &st);
    LT_CHECK(st.decode_steps == 1 && o[0].n == 2 && o[3].n == 2);
    /* cancel slot 1's request: it finishes at the next step and a new one takes slot 1 */
    lm_scheduler_cancel(s, ids[1]);
    o[4].cancel_after = 3; /* this one cancels itself from its callback */
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 2, &p, on_event, &o[4], &ids[4]));
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    LT_CHECK(o[1].finishes == 1 && o[1].reason == LM_FINISH_CANCELLED && o[1].n == 2);
    lm_serve_snapshot sn;
    LT_CHECK_OK(lm_scheduler_snapshot(s, ids[4], 0, &sn));
    LT_CHECK_MSG(sn.slot == 1, "the new request took slot %d, not the lowest free slot 1", sn.slot);
    LT_CHECK_OK(lm_scheduler_snapshot(s, ids[1], 1, &sn));
    LT_CHECK(sn.done && sn.reason == LM_FINISH_CANCELLED && sn.slot == 1);
    for (int step = 0; busy && step < 200; step++) LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    LT_CHECK(o[4].finishes == 1 && o[4].reason == LM_FINISH_CANCELLED && o[4].n == 3);
    for (int i = 0; i < 5; i++) LT_CHECK(o[i].finishes == 1);
    LT_CHECK(o[0].reason == LM_FINISH_LENGTH && o[0].n == 30);
    lm_scheduler_stats_get(s, &st);
    LT_CHECK(st.cancelled == 2 && st.finished == 5 && st.slots_used == 0 && st.running == 0);
    /* cancelling a pending request: it never runs */
    lm_scheduler_destroy(s);
    s = make(LM_SCHED_CONTINUOUS, 1, 64);
    memset(o, 0, sizeof o);
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 5, &p, on_event, &o[0], &ids[0]));
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 5, &p, on_event, &o[1], &ids[1]));
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_scheduler_cancel(s, ids[1]);
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    LT_CHECK(o[1].finishes == 1 && o[1].reason == LM_FINISH_CANCELLED && o[1].n == 0 && o[1].completion_tokens == 0);
    lm_scheduler_destroy(s);
}

static void test_refusals(void) {
    lm_sched_options o;
    lm_sched_options_default(&o);
    o.slots = 1, o.context = 16, o.max_queue = 2;
    lm_scheduler *s = NULL;
    LT_CHECK_OK(lm_scheduler_create(g_model, g_tok, &o, &s));
    lm_serve_params p;
    lm_serve_params_default(&p);
    int32_t prompt[12] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
    int64_t id;
    p.max_tokens = 5;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 12, &p, NULL, NULL, &id), LM_OUT_OF_RANGE); /* 17 > 16 */
    p.max_tokens = 0;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id), LM_INVALID_ARGUMENT);
    p.max_tokens = 2;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 0, &p, NULL, NULL, &id), LM_INVALID_ARGUMENT);
    int32_t bad = 384;
    LT_CHECK_STATUS(lm_scheduler_submit(s, &bad, 1, &p, NULL, NULL, &id), LM_OUT_OF_RANGE);
    p.top_logprobs = 3;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id), LM_INVALID_ARGUMENT);
    p.top_logprobs = 0;
    p.presence_penalty = 3;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id), LM_INVALID_ARGUMENT);
    p.presence_penalty = 0;
    p.sampler.top_p = 0;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id), LM_INVALID_ARGUMENT);
    p.sampler.top_p = 1;
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id));
    LT_CHECK_OK(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id));
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompt, 2, &p, NULL, NULL, &id), LM_UNSUPPORTED); /* queue full */
    lm_sched_stats st;
    lm_scheduler_stats_get(s, &st);
    LT_CHECK(st.rejected == 2 && st.pending == 2);
    lm_scheduler_destroy(s); /* drops the queued requests */
    o.slots = 0;
    LT_CHECK_STATUS(lm_scheduler_create(g_model, g_tok, &o, &s), LM_INVALID_ARGUMENT);
    o.slots = 1, o.context = 1 << 20;
    LT_CHECK_STATUS(lm_scheduler_create(g_model, g_tok, &o, &s), LM_INVALID_ARGUMENT);
    o.kind = LM_SCHED_BUCKETED, o.n_buckets = 2;
    o.bucket_slots[0] = o.bucket_slots[1] = 1;
    o.bucket_context[0] = 32, o.bucket_context[1] = 16;
    LT_CHECK_STATUS(lm_scheduler_create(g_model, g_tok, &o, &s), LM_INVALID_ARGUMENT);
}

static void test_logprobs(void) {
    const outcome *o = &g_ref[5]; /* greedy with logprobs and 3 alternatives */
    LT_CHECK(o->n > 0);
    for (int t = 0; t < o->n; t++) {
        LT_CHECK(o->n_top[t] == 3 && o->top0[t] == o->ids[t]); /* greedy: the top alternative */
        LT_CHECK(fabsf(o->logprob[t] - o->top_lp[t][0]) < 1e-6f && o->logprob[t] <= 0);
        LT_CHECK(o->top_lp[t][0] >= o->top_lp[t][1] && o->top_lp[t][1] >= o->top_lp[t][2]);
        double mass = exp(o->top_lp[t][0]) + exp(o->top_lp[t][1]) + exp(o->top_lp[t][2]);
        LT_CHECK(mass <= 1.0 + 1e-5);
    }
}

/* Presence/frequency penalties on synthetic logits, through the request record. */
static void test_penalties_on_synthetic_logits(void) {
    lm_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 6;
    lm_serve_params p;
    lm_serve_params_default(&p);
    p.max_tokens = 8;
    p.frequency_penalty = 0.5f, p.presence_penalty = 1.0f;
    p.logprobs = 1, p.top_logprobs = 2;
    int32_t prompt[1] = {5};
    lm__req *r = NULL;
    LT_CHECK_OK(lm__req_create(&c, NULL, prompt, 1, &p, NULL, NULL, &r));
    /* id 0 leads id 1 by 2.2; its penalty after u uses is 1 + 0.5 u: 1.5, 2.0, then
     * 2.5 > 2.2, so the fourth pick is id 1; then id 0 (3.2 - 2.5 = 0.7) beats id 1
     * (1.0 - 1.5) and id 5 (0.5). */
    const float base[6] = {3.2f, 1.0f, 0.0f, -1.0f, -2.0f, 0.5f};
    int32_t want[5] = {0, 0, 0, 1, 0};
    for (int t = 0; t < 5; t++) {
        float l[6];
        memcpy(l, base, sizeof l);
        int fin;
        LT_CHECK_OK(lm__req_accept(r, &c, l, &fin));
        LT_CHECK_MSG(r->next == want[t], "step %d picked %d, want %d", t, r->next, want[t]);
        LT_CHECK(!fin);
    }
    lm__req_free(r);
}

static lm_scheduler *make_paged(int slots, int64_t context, int64_t block, int64_t blocks) {
    lm_sched_options o;
    lm_sched_options_default(&o);
    o.slots = slots, o.context = context, o.paged = 1, o.block_size = block, o.kv_blocks = blocks;
    lm_scheduler *s = NULL;
    LT_CHECK_OK(lm_scheduler_create(g_model, g_tok, &o, &s));
    return s;
}

/* The paged cache: the reference's tokens for random arrival orders, a pool roomy
 * enough for everyone and one so small that requests are preempted and recomputed;
 * blocks all return to the pool at the end. */
static void test_paged_equals_reference(void) {
    lt_rng r = lt_rng_seed(21);
    static const struct {
        int slots;
        int64_t block, blocks; /* 0: the default pool */
    } cfg[] = {{3, 4, 0}, {5, 8, 0}, {12, 4, 0}, {4, 4, 14}, {6, 4, 16}, {12, 2, 30}};
    for (int trial = 0; trial < (int)(sizeof cfg / sizeof *cfg); trial++) {
        int order[NREQ], arrive[NREQ];
        for (int i = 0; i < NREQ; i++) order[i] = i;
        for (int i = NREQ - 1; i > 0; i--) {
            int k = (int)lt_rng_int(&r, 0, i), t = order[i];
            order[i] = order[k], order[k] = t;
        }
        for (int i = 0; i < NREQ; i++) arrive[i] = trial % 2 ? (int)lt_rng_int(&r, 0, 25) : 0;
        for (int i = 1; i < NREQ; i++) arrive[i] = arrive[i] < arrive[i - 1] ? arrive[i - 1] : arrive[i];
        lm_scheduler *s = make_paged(cfg[trial].slots, 64, cfg[trial].block, cfg[trial].blocks);
        outcome got[NREQ];
        run_jobs(s, order, arrive, got);
        char what[96];
        snprintf(what, sizeof what, "paged, %d slots, blocks of %lld, pool %lld", cfg[trial].slots,
                 (long long)cfg[trial].block, (long long)cfg[trial].blocks);
        expect_same(what, got);
        lm_sched_stats st;
        lm_scheduler_stats_get(s, &st);
        LT_CHECK_MSG(st.kv_blocks_used == 0 && st.running == 0 && st.finished == NREQ, "%s: %lld blocks still held", what,
                     (long long)st.kv_blocks_used);
        if (cfg[trial].blocks) LT_CHECK_MSG(st.preemptions > 0, "%s: no request was preempted", what);
        printf("%s: %lld preemptions, %lld of %lld prompt tokens found cached\n", what, (long long)st.preemptions,
               (long long)st.prefix_hit_tokens, (long long)st.prefix_query_tokens);
        lm_scheduler_destroy(s);
    }
}

/* Prompts with a common prefix share its blocks: after the first request ran, the
 * others find its full blocks cached (and compute only their tails), and every
 * request's tokens equal the same request run alone. */
static void test_prefix_sharing(void) {
    enum { N = 6, PREFIX = 10, TAIL = 3 };
    lm_scheduler *s = make_paged(4, 64, 4, 0);
    lt_rng r = lt_rng_seed(31);
    int32_t prompts[N][PREFIX + TAIL];
    for (int t = 0; t < PREFIX; t++) prompts[0][t] = (int32_t)lt_rng_int(&r, 3, 383);
    for (int i = 0; i < N; i++) {
        memcpy(prompts[i], prompts[0], PREFIX * sizeof(int32_t));
        for (int t = PREFIX; t < PREFIX + TAIL; t++) prompts[i][t] = (int32_t)lt_rng_int(&r, 3, 383);
    }
    lm_serve_params p;
    lm_serve_params_default(&p);
    p.max_tokens = 7;
    p.ignore_eos = 1;
    outcome got[N], ref[N];
    memset(got, 0, sizeof got);
    int64_t id;
    int busy = 1;
    LT_CHECK_OK(lm_scheduler_submit(s, prompts[0], PREFIX + TAIL, &p, on_event, &got[0], &id));
    LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy)); /* its prefill registers the prefix blocks */
    for (int i = 1; i < N; i++) LT_CHECK_OK(lm_scheduler_submit(s, prompts[i], PREFIX + TAIL, &p, on_event, &got[i], &id));
    for (int step = 0; busy && step < 1000; step++) LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_sched_stats st;
    lm_scheduler_stats_get(s, &st);
    LT_CHECK_MSG(st.prefix_hit_tokens == (N - 1) * 8, "%lld prompt tokens found cached, want %d",
                 (long long)st.prefix_hit_tokens, (N - 1) * 8); /* 2 full blocks of the 10-token prefix each */
    LT_CHECK(st.kv_blocks_used == 0 && st.kv_blocks_cached > 0);
    lm_scheduler_destroy(s);
    s = make(LM_SCHED_REFERENCE, 0, 0);
    memset(ref, 0, sizeof ref);
    for (int i = 0; i < N; i++) LT_CHECK_OK(lm_scheduler_submit(s, prompts[i], PREFIX + TAIL, &p, on_event, &ref[i], &id));
    busy = 1;
    for (int step = 0; busy && step < 1000; step++) LT_CHECK_OK(lm_scheduler_step(s, g_ctx, &busy));
    lm_scheduler_destroy(s);
    for (int i = 0; i < N; i++)
        LT_CHECK_MSG(got[i].n == 7 && !memcmp(got[i].ids, ref[i].ids, sizeof(int32_t) * 7),
                     "request %d differs from the reference", i);
    /* a request that needs more blocks than the pool holds is refused at once */
    s = make_paged(2, 64, 4, 5);
    p.max_tokens = 20;
    LT_CHECK_STATUS(lm_scheduler_submit(s, prompts[0], PREFIX + TAIL, &p, on_event, &got[0], &id), LM_OUT_OF_RANGE);
    LT_CHECK(strstr(lm_last_error(), "blocks") != NULL);
    lm_scheduler_destroy(s);
}

/* A model vocabulary padded beyond the tokenizer's: such ids are tokens without text
 * (as Hugging Face decodes them), not errors. */
static void test_ids_beyond_the_tokenizer(void) {
    lm_model_config c;
    memset(&c, 0, sizeof c);
    c.vocab_size = 400; /* the tokenizer has 384 */
    lm_serve_params p;
    lm_serve_params_default(&p);
    p.max_tokens = 3;
    int32_t prompt[1] = {5};
    outcome o = {0};
    lm__req *r = NULL;
    LT_CHECK_OK(lm__req_create(&c, g_tok, prompt, 1, &p, on_event, &o, &r));
    int fin = 0;
    LT_CHECK_OK(lm__req_accept_id(r, &c, 390, &fin));
    LT_CHECK_OK(lm__req_accept_id(r, &c, 72, &fin)); /* 'h'-like byte token of the small tokenizer */
    LT_CHECK_OK(lm__req_accept_id(r, &c, 399, &fin));
    LT_CHECK(fin && o.finishes == 1 && o.n == 3 && o.ids[0] == 390 && o.reason == LM_FINISH_LENGTH);
    LT_CHECK_STATUS(lm__req_accept_id(r, &c, 400, &fin), LM_INTERNAL); /* outside the model's vocabulary */
    lm__req_free(r);
}

int main(void) {
    LT_CHECK_OK(lm_model_load(MODEL, lm_device_cpu(), &g_model));
    LT_CHECK_OK(lm_tokenizer_load(TOKENIZER, &g_tok));
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 1, &g_ctx));
    make_jobs();
    LT_RUN(test_reference_equals_generate);
    LT_RUN(test_continuous_equals_reference);
    LT_RUN(test_bucketed_equals_reference);
    LT_RUN(test_prefill_groups_slots_and_cancel);
    LT_RUN(test_refusals);
    LT_RUN(test_logprobs);
    LT_RUN(test_penalties_on_synthetic_logits);
    LT_RUN(test_ids_beyond_the_tokenizer);
    LT_RUN(test_paged_equals_reference);
    LT_RUN(test_prefix_sharing);
    lm_ctx_destroy(g_ctx);
    lm_tokenizer_destroy(g_tok);
    lm_model_destroy(g_model);
    return lt_finish();
}
