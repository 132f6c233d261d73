/* serve/request.c — one request's token path: logits row -> penalties -> sampler ->
 * history, events, detokenizer -> stop filter -> text.
 *
 * Log-probabilities are those of the model's raw distribution (log-softmax of the
 * logits before penalties, temperature or filters), as most OpenAI-compatible servers
 * report them; the top alternatives come from one pass with a small sorted list.
 * Presence and frequency penalties (OpenAI's definitions) count the generated ids
 * only, not the prompt; the repetition penalty (lm_sampler) reads the whole history.
 */
#include "serve/internal.h"

#include <math.h>
#include <string.h>

void lm_serve_params_default(lm_serve_params *p) {
    memset(p, 0, sizeof *p);
    p->max_tokens = 16;
    p->sampler = lm_sampler_params_default();
    p->sampler.greedy = 1;
}

const char *lm_finish_reason_name(lm_finish_reason r) {
    switch (r) {
    case LM_FINISH_LENGTH: return "length";
    case LM_FINISH_EOS: return "eos";
    case LM_FINISH_STOP: return "stop";
    case LM_FINISH_CANCELLED: return "cancelled";
    case LM_FINISH_ERROR: return "error";
    }
    return "unknown";
}

static lm_status check_params(const lm_model_config *c, const lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                              const lm_serve_params *p) {
    if (n_prompt == 0) return lm__error(LM_INVALID_ARGUMENT, "request: the prompt is empty");
    for (size_t i = 0; i < n_prompt; i++)
        if (prompt[i] < 0 || prompt[i] >= c->vocab_size)
            return lm__error(LM_OUT_OF_RANGE, "request: prompt token %zu is id %d, outside the vocabulary of %lld", i,
                             prompt[i], (long long)c->vocab_size);
    if (p->max_tokens < 1) return lm__error(LM_INVALID_ARGUMENT, "request: max_tokens %lld must be >= 1", (long long)p->max_tokens);
    if (!(fabsf(p->presence_penalty) <= 2) || !(fabsf(p->frequency_penalty) <= 2))
        return lm__error(LM_INVALID_ARGUMENT, "request: presence_penalty %g and frequency_penalty %g must be in [-2, 2]",
                         p->presence_penalty, p->frequency_penalty);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop)) return lm__error(LM_INVALID_ARGUMENT, "request: bad stop string list");
    if (p->n_stop > 0 && !tok) return lm__error(LM_INVALID_ARGUMENT, "request: stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return lm__error(LM_INVALID_ARGUMENT, "request: stop string %d is empty", i);
    if (p->top_logprobs < 0 || p->top_logprobs > LM_SERVE_MAX_TOP_LOGPROBS)
        return lm__error(LM_INVALID_ARGUMENT, "request: top_logprobs %d must be in [0, %d]", p->top_logprobs,
                         LM_SERVE_MAX_TOP_LOGPROBS);
    if (p->top_logprobs > 0 && !p->logprobs) return lm__error(LM_INVALID_ARGUMENT, "request: top_logprobs needs logprobs");
    return LM_OK;
}

lm_status lm__req_create(const lm_model_config *c, const lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                         const lm_serve_params *p, lm_serve_event_fn cb, void *user, lm__req **out) {
    *out = NULL;
    if (!p || (n_prompt && !prompt)) return lm__error(LM_INVALID_ARGUMENT, "request: NULL argument");
    LM_TRY(check_params(c, tok, prompt, n_prompt, p));
    lm__req *r = lm__calloc(1, sizeof *r);
    if (!r) return LM_OUT_OF_MEMORY;
    r->p = *p;
    r->cb = cb, r->user = user;
    r->bucket = r->slot = -1;
    r->n_prompt = r->n_history = (int64_t)n_prompt;
    lm_status st = LM_OK;
    /* the history (prompt + generated), then room to sort the generated ids (penalties) */
    size_t scratch = p->presence_penalty != 0 || p->frequency_penalty != 0 ? (size_t)p->max_tokens : 0;
    if (!(r->history = lm__calloc(n_prompt + (size_t)p->max_tokens + scratch, sizeof *r->history))) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK && p->n_stop > 0 && !(r->stop = lm__calloc((size_t)p->n_stop, sizeof *r->stop))) st = LM_OUT_OF_MEMORY;
    for (int i = 0; st == LM_OK && i < p->n_stop; i++)
        if (!(r->stop[i] = lm__strdup(p->stop[i]))) st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) st = lm_sampler_create(&p->sampler, c->vocab_size, &r->sampler);
    if (st == LM_OK && tok) st = lm_tokenizer_stream_create(tok, p->decode_flags, &r->stream);
    if (st != LM_OK) {
        r->p.n_stop = r->stop ? p->n_stop : 0;
        lm__req_free(r);
        return lm__error_context(st, "request");
    }
    memcpy(r->history, prompt, n_prompt * sizeof *prompt);
    r->p.stop = (const char *const *)r->stop;
    lm__stop_filter_init(&r->filter, r->p.stop, r->p.n_stop);
    *out = r;
    return LM_OK;
}

void lm__req_free(lm__req *r) {
    if (!r) return;
    for (int i = 0; r->stop && i < r->p.n_stop; i++) lm__free(r->stop[i]);
    lm__free(r->stop);
    lm__free(r->history);
    lm__free(r->table);
    lm_sampler_destroy(r->sampler);
    lm_tokenizer_stream_destroy(r->stream);
    lm__stop_filter_free(&r->filter);
    lm__free(r);
}

static int is_eos(const lm_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id) return 1;
    return 0;
}

/* ev's top alternatives from the raw logits; returns log(sum(exp(logits))). */
static double fill_logprobs(const lm__req *r, const float *logits, int64_t V, lm_serve_event *ev) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < V; i++) mx = logits[i] > mx ? logits[i] : mx;
    double sum = 0;
    for (int64_t i = 0; i < V; i++) sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    int k = r->p.top_logprobs, n = 0;
    for (int64_t i = 0; i < V && k > 0; i++) { /* a sorted list of the k largest (ties: lower id first) */
        float x = logits[i];
        if (n == k && !(x > logits[ev->top_ids[n - 1]])) continue;
        int at = n < k ? n++ : n - 1;
        while (at > 0 && x > logits[ev->top_ids[at - 1]]) {
            ev->top_ids[at] = ev->top_ids[at - 1];
            at--;
        }
        ev->top_ids[at] = (int32_t)i;
    }
    ev->n_top = n;
    for (int j = 0; j < n; j++) ev->top_logprobs[j] = (float)(logits[ev->top_ids[j]] - lse);
    return lse;
}

static int cmp_id(const void *a, const void *b) {
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* OpenAI's presence and frequency penalties over the generated ids: the ids sorted in
 * the request's scratch, each distinct id adjusted once by its count. O(n log n) per
 * token, no allocation. */
static void apply_penalties(lm__req *r, float *logits) {
    if (r->p.presence_penalty == 0 && r->p.frequency_penalty == 0) return;
    int64_t n = r->n_history - r->n_prompt;
    int32_t *ids = r->history + r->n_prompt + r->p.max_tokens; /* the scratch after the history */
    memcpy(ids, r->history + r->n_prompt, sizeof *ids * (size_t)n);
    qsort(ids, (size_t)n, sizeof *ids, cmp_id);
    for (int64_t i = 0; i < n;) {
        int64_t j = i;
        while (j < n && ids[j] == ids[i]) j++;
        logits[ids[i]] -= r->p.presence_penalty + r->p.frequency_penalty * (float)(j - i);
        i = j;
    }
}

static void send(lm__req *r, lm_serve_event *ev, int *cancel) {
    ev->request = r->id;
    int ask = r->cb ? r->cb(r->user, ev) : 0;
    if (cancel) *cancel = ask;
}

void lm__req_finish(lm__req *r, lm_finish_reason reason, lm_status status, const char *message) {
    const char *rest = "";
    size_t nrest = 0, give = 0;
    int hit = 0;
    /* An error or a stop string ends the text where it is; otherwise the held bytes are final. */
    if (r->stream && reason != LM_FINISH_STOP && reason != LM_FINISH_ERROR &&
        lm_tokenizer_stream_flush(r->stream, &rest, &nrest) != LM_OK)
        rest = "", nrest = 0;
    if (reason != LM_FINISH_STOP && reason != LM_FINISH_ERROR &&
        lm__stop_filter_push(&r->filter, rest, nrest, 1, &give, &hit) == LM_OK && hit)
        reason = LM_FINISH_STOP; /* the flushed bytes completed a stop string */
    lm_serve_event ev = {0};
    ev.kind = LM_SERVE_FINISH;
    ev.id = -1;
    ev.text = r->filter.held ? r->filter.held : "";
    ev.len = give;
    ev.reason = reason;
    ev.status = status;
    ev.message = message ? message : "";
    ev.prompt_tokens = r->n_prompt;
    ev.completion_tokens = r->n_history - r->n_prompt;
    r->state = LM__REQ_DONE;
    r->reason = reason;
    r->finished = lm_scheduler_now();
    send(r, &ev, NULL);
    r->filter.len = 0;
}

static lm_status commit(lm__req *r, const lm_model_config *c, int32_t id, lm_serve_event *ev, int *finished);

lm_status lm__req_accept(lm__req *r, const lm_model_config *c, float *logits, int *finished) {
    *finished = 0;
    lm_serve_event ev = {0};
    ev.kind = LM_SERVE_TOKEN;
    double lse = 0;
    if (r->p.logprobs) lse = fill_logprobs(r, logits, c->vocab_size, &ev); /* the raw distribution */
    apply_penalties(r, logits);
    int32_t id = -1;
    LM_TRY(lm_sampler_sample(r->sampler, logits, r->history, (size_t)r->n_history, &id));
    if (r->p.logprobs) { /* undo id's own penalty to read its raw logit */
        int64_t count = 0;
        for (int64_t j = r->n_prompt; j < r->n_history; j++) count += r->history[j] == id;
        float raw = logits[id] + (count ? r->p.presence_penalty + r->p.frequency_penalty * (float)count : 0.0f);
        ev.logprob = (float)((double)raw - lse);
    }
    return commit(r, c, id, &ev, finished);
}

int lm__req_device_samplable(const lm__req *r) {
    return !r->p.logprobs && r->p.presence_penalty == 0 && r->p.frequency_penalty == 0 &&
           r->p.sampler.repetition_penalty == 1.0f;
}

lm_sample_params lm__req_device_params(const lm__req *r) {
    const lm_sampler_params *s = &r->p.sampler;
    lm_sample_params p = {s->greedy, s->temperature, s->top_k, s->top_p, s->min_p, LM_SAMPLE_OWN_STREAM, s->seed,
                          (uint64_t)(r->n_history - r->n_prompt)};
    return p;
}

lm_status lm__req_accept_id(lm__req *r, const lm_model_config *c, int32_t id, int *finished) {
    *finished = 0;
    if (id < 0 || id >= c->vocab_size)
        return lm__error(LM_INTERNAL, "request %lld: the device sampler returned id %d", (long long)r->id, id);
    lm_serve_event ev = {0};
    ev.kind = LM_SERVE_TOKEN;
    return commit(r, c, id, &ev, finished);
}

/* Records id as the request's next token, sends its TOKEN event (ev carries the
 * logprobs, if any) and finishes the request when it ended. */
static lm_status commit(lm__req *r, const lm_model_config *c, int32_t id, lm_serve_event *ev_in, int *finished) {
    lm_serve_event ev = *ev_in;
    const char *text = "";
    size_t n = 0;
    int eos = !r->p.ignore_eos && is_eos(c, id);
    if (r->stream && !eos) {
        lm_status ts = lm_tokenizer_stream_push(r->stream, id, &text, &n);
        if (ts == LM_OUT_OF_RANGE) { /* an id of the model's padded vocabulary with no token: no text, as in HF */
            lm_clear_error();
            text = "", n = 0;
        } else if (ts != LM_OK) {
            return ts;
        }
    }
    r->history[r->n_history++] = id;
    r->next = id;
    if (r->first_token == 0) r->first_token = lm_scheduler_now();
    size_t give = 0;
    int hit = 0;
    LM_TRY(lm__stop_filter_push(&r->filter, text, n, 0, &give, &hit));
    ev.id = id;
    ev.text = r->filter.held;
    ev.len = give;
    int cancel = 0;
    send(r, &ev, &cancel);
    lm__stop_filter_consume(&r->filter, give, hit);
    int64_t generated = r->n_history - r->n_prompt;
    lm_finish_reason reason = hit ? LM_FINISH_STOP : eos ? LM_FINISH_EOS : cancel ? LM_FINISH_CANCELLED
                            : generated >= r->p.max_tokens ? LM_FINISH_LENGTH : (lm_finish_reason)-1;
    if ((int)reason >= 0) {
        lm__req_finish(r, reason, LM_OK, NULL);
        *finished = 1;
    }
    return LM_OK;
}
