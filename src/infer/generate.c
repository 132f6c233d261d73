/* infer/generate.c — prefill + sampled decode with streaming text and stop strings.
 *
 * Text path: ids -> tokenizer stream decoder (complete UTF-8 only) -> stop filter
 * (infer/stop.c) -> the callback. Memory: one KV cache of
 * prompt + max_new_tokens positions and one logits row. A model on a CUDA device
 * picks its tokens on the device (lm_model_forward_sample: no logits row crosses to
 * the host) unless a repetition penalty needs the host sampler.
 */
#include "infer/internal.h"
#include "loom/generate.h"
#include "loom/trace.h"

#include <string.h>

typedef struct run {
    const lm_model *m;
    lm_ctx *ctx;
    lm_kv_cache *cache;
    lm_sampler *sampler;
    lm_tokenizer_stream *stream;
    lm__stop_filter filter;
    float *logits;    /* [vocab] */
    int32_t *history; /* [n_prompt + max_new] */
    size_t n_history;
    lm_token_fn cb;
    void *user;
    const lm_sampler_params *device_sampler; /* non-NULL: tokens are picked on the model's device */
} run;

/* The sampler's settings as the device-side record of draw `draw`. */
static lm_sample_params device_params(const lm_sampler_params *s, uint64_t draw) {
    lm_sample_params p = {s->greedy, s->temperature, s->top_k, s->top_p, s->min_p, 0, s->seed, draw};
    return p;
}

/* Runs n ids through the model; the next token comes back in *next (device
 * sampling, draw counter `draw`) or as logits in r->logits (host sampling). */
static lm_status forward(run *r, const int32_t *ids, int64_t n, uint64_t draw, int32_t *next) {
    int slot = 0;
    if (r->device_sampler) {
        lm_sample_params sp = device_params(r->device_sampler, draw);
        return lm_model_forward_sample(r->m, r->ctx, r->cache, &slot, 1, ids, n, &sp, next);
    }
    return lm_model_forward(r->m, r->ctx, r->cache, &slot, 1, ids, n, r->logits, 0);
}

/* Feeds new text through the stop filter and delivers what is final. Sets *stopped
 * to the reason when a stop string or the callback ends generation. */
static lm_status deliver(run *r, int32_t id, const char *text, size_t n, int at_end, int *stopped) {
    lm__stop_filter *f = &r->filter;
    size_t give;
    int hit;
    LM_TRY(lm__stop_filter_push(f, text, n, at_end, &give, &hit));
    int want_stop = r->cb ? r->cb(r->user, id, f->held, give) : 0;
    lm__stop_filter_consume(f, give, hit);
    if (hit)
        *stopped = LM_STOP_STRING + 1;
    else if (want_stop)
        *stopped = LM_STOP_CALLBACK + 1;
    return LM_OK;
}

static int is_eos(const lm_model_config *c, int32_t id) {
    for (int i = 0; i < c->n_eos; i++)
        if (c->eos_token_ids[i] == id) return 1;
    return 0;
}

static lm_status token_text(run *r, int32_t id, const char **text, size_t *n) {
    *text = "";
    *n = 0;
    if (!r->stream) return LM_OK;
    lm_status st = lm_tokenizer_stream_push(r->stream, id, text, n);
    if (st == LM_OUT_OF_RANGE) { /* an id of the model's padded vocabulary with no token: no text, as in HF */
        lm_clear_error();
        *text = "", *n = 0;
        return LM_OK;
    }
    return st;
}

static lm_status loop(run *r, const int32_t *prompt, size_t n_prompt, const lm_generate_params *p,
                      lm_generate_result *res) {
    const lm_model_config *c = lm_model_get_config(r->m);
    int stopped = 0;
    int32_t next = -1;
    double t0 = lm__now_seconds();
    int64_t tr = lm_trace_begin();
    LM_TRY(forward(r, prompt, (int64_t)n_prompt, 0, &next));
    lm_trace_end(tr, "generate", "prefill", NULL);
    lm_trace_memory();
    double t1 = lm__now_seconds();
    res->prefill_seconds = t1 - t0;
    res->reason = LM_STOP_LENGTH;
    while (res->new_tokens < p->max_new_tokens && !stopped) {
        int32_t id = next;
        tr = r->device_sampler ? 0 : lm_trace_begin(); /* on a device the step itself picked the token */
        if (!r->device_sampler) LM_TRY(lm_sampler_sample(r->sampler, r->logits, r->history, r->n_history, &id));
        lm_trace_end(tr, "generate", "sample", NULL);
        r->history[r->n_history++] = id;
        res->new_tokens++;
        const char *text;
        size_t n;
        tr = lm_trace_begin();
        LM_TRY(token_text(r, id, &text, &n));
        lm_trace_end(tr, "generate", "detokenize", NULL);
        if (!p->ignore_eos && is_eos(c, id)) {
            res->reason = LM_STOP_EOS;
            LM_TRY(deliver(r, id, "", 0, 0, &stopped)); /* the eos itself adds no text */
            break;
        }
        LM_TRY(deliver(r, id, text, n, 0, &stopped));
        if (stopped || res->new_tokens == p->max_new_tokens) break;
        tr = lm_trace_begin();
        LM_TRY(forward(r, &id, 1, (uint64_t)res->new_tokens, &next));
        lm_trace_end(tr, "generate", "decode step", NULL);
        lm_trace_memory();
    }
    if (stopped) res->reason = (lm_stop_reason)(stopped - 1);
    const char *rest = "";
    size_t nrest = 0;
    if (r->stream && res->reason != LM_STOP_STRING) LM_TRY(lm_tokenizer_stream_flush(r->stream, &rest, &nrest));
    int at_end = 0; /* the final call always happens, with id -1 */
    LM_TRY(deliver(r, -1, rest, nrest, 1, &at_end));
    if (at_end == LM_STOP_STRING + 1) res->reason = LM_STOP_STRING;
    res->decode_seconds = lm__now_seconds() - t1;
    return LM_OK;
}

static lm_status check_params(const lm_model_config *c, const lm_tokenizer *tok, size_t n_prompt,
                              const lm_generate_params *p) {
    if (n_prompt == 0) return lm__error(LM_INVALID_ARGUMENT, "generate: the prompt is empty");
    if (p->max_new_tokens < 1)
        return lm__error(LM_INVALID_ARGUMENT, "generate: max_new_tokens %lld must be >= 1", (long long)p->max_new_tokens);
    if (p->n_stop < 0 || (p->n_stop > 0 && !p->stop))
        return lm__error(LM_INVALID_ARGUMENT, "generate: bad stop string list");
    if (p->n_stop > 0 && !tok) return lm__error(LM_INVALID_ARGUMENT, "generate: stop strings need a tokenizer");
    for (int i = 0; i < p->n_stop; i++)
        if (!p->stop[i] || !p->stop[i][0]) return lm__error(LM_INVALID_ARGUMENT, "generate: stop string %d is empty", i);
    if ((int64_t)n_prompt + p->max_new_tokens > c->max_position_embeddings)
        return lm__error(LM_OUT_OF_RANGE, "generate: %zu prompt tokens + %lld new exceed max_position_embeddings %lld",
                         n_prompt, (long long)p->max_new_tokens, (long long)c->max_position_embeddings);
    return LM_OK;
}

lm_status lm_generate(const lm_model *m, lm_ctx *ctx, const lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                      const lm_generate_params *p, lm_token_fn on_token, void *user, lm_generate_result *res) {
    if (!m || !ctx || !p || (n_prompt && !prompt)) return lm__error(LM_INVALID_ARGUMENT, "lm_generate: NULL argument");
    const lm_model_config *c = lm_model_get_config(m);
    LM_TRY(check_params(c, tok, n_prompt, p));
    lm_generate_result local = {0};
    if (!res) res = &local;
    memset(res, 0, sizeof *res);
    res->prompt_tokens = (int64_t)n_prompt;
    run r = {m, ctx, NULL, NULL, NULL, {0}, NULL, NULL, 0, on_token, user, NULL};
    lm__stop_filter_init(&r.filter, p->stop, p->n_stop);
    /* Where the logits are not host memory, pick tokens beside them (no logits copy per
     * step), unless the repetition penalty needs the host sampler's history. */
    lm_device_caps caps;
    if (lm_device_caps_get(lm_model_device(m), &caps) == LM_OK && !caps.host_addressable &&
        p->sampler.repetition_penalty == 1.0f)
        r.device_sampler = &p->sampler;
    size_t cap = n_prompt + (size_t)p->max_new_tokens;
    lm_status st = lm_kv_cache_create(m, 1, (int64_t)cap, &r.cache);
    if (st == LM_OK) st = lm_sampler_create(&p->sampler, c->vocab_size, &r.sampler);
    if (st == LM_OK && tok) st = lm_tokenizer_stream_create(tok, p->decode_flags, &r.stream);
    if (st == LM_OK && (!(r.logits = lm__calloc((size_t)c->vocab_size, sizeof(float))) ||
                        !(r.history = lm__calloc(cap, sizeof(int32_t)))))
        st = LM_OUT_OF_MEMORY;
    if (st == LM_OK) {
        memcpy(r.history, prompt, n_prompt * sizeof *prompt);
        r.n_history = n_prompt;
        int64_t tr = lm_trace_begin();
        st = loop(&r, prompt, n_prompt, p, res);
        lm_trace_end(tr, "generate", "generate", NULL);
    }
    lm__stop_filter_free(&r.filter);
    lm__free(r.logits);
    lm__free(r.history);
    lm_tokenizer_stream_destroy(r.stream);
    lm_sampler_destroy(r.sampler);
    lm_kv_cache_destroy(r.cache);
    return st;
}
