/* serve/openai.c — OpenAI request bodies -> lm__oai_request (serve/openai.h). */
#include "serve/openai.h"

#include <jansson.h>
#include <math.h>
#include <string.h>

static lm_status bad(char *param, size_t cap, const char *name, const char *fmt, const char *what) {
    snprintf(param, cap, "%s", name);
    return lm__error(LM_INVALID_ARGUMENT, fmt, name, what);
}

/* A number field: absent or null leaves *v; otherwise it must be a JSON number in [lo, hi]. */
static lm_status get_number(json_t *o, const char *name, double lo, double hi, double *v, char *param, size_t cap) {
    json_t *x = json_object_get(o, name);
    if (!x || json_is_null(x)) return LM_OK;
    if (!json_is_number(x)) return bad(param, cap, name, "'%s' must be a number%s", "");
    double d = json_number_value(x);
    if (!(d >= lo && d <= hi)) {
        snprintf(param, cap, "%s", name);
        return lm__error(LM_INVALID_ARGUMENT, "'%s' is %g; it must be in [%g, %g]", name, d, lo, hi);
    }
    *v = d;
    return LM_OK;
}

static lm_status get_int(json_t *o, const char *name, int64_t lo, int64_t hi, int64_t *v, char *param, size_t cap) {
    json_t *x = json_object_get(o, name);
    if (!x || json_is_null(x)) return LM_OK;
    if (!json_is_integer(x)) return bad(param, cap, name, "'%s' must be an integer%s", "");
    json_int_t d = json_integer_value(x);
    if (d < lo || d > hi) {
        snprintf(param, cap, "%s", name);
        return lm__error(LM_INVALID_ARGUMENT, "'%s' is %lld; it must be in [%lld, %lld]", name, (long long)d, (long long)lo,
                         (long long)hi);
    }
    *v = (int64_t)d;
    return LM_OK;
}

static lm_status get_bool(json_t *o, const char *name, int *v, char *param, size_t cap) {
    json_t *x = json_object_get(o, name);
    if (!x || json_is_null(x)) return LM_OK;
    if (!json_is_boolean(x)) return bad(param, cap, name, "'%s' must be true or false%s", "");
    *v = json_is_true(x);
    return LM_OK;
}

static char *dump(json_t *x) { return json_dumps(x, JSON_COMPACT | JSON_ENCODE_ANY); }

static lm_status get_stop(json_t *o, lm__oai_request *r, char *param, size_t cap) {
    json_t *x = json_object_get(o, "stop");
    if (!x || json_is_null(x)) return LM_OK;
    json_t *one[1] = {x};
    json_t **items = one;
    size_t n = 1;
    if (json_is_array(x)) n = json_array_size(x);
    else if (!json_is_string(x)) return bad(param, cap, "stop", "'%s' must be a string or an array of strings%s", "");
    if (n > LM__OAI_MAX_STOP) {
        snprintf(param, cap, "stop");
        return lm__error(LM_INVALID_ARGUMENT, "'stop' has %zu strings; at most %d are allowed", n, LM__OAI_MAX_STOP);
    }
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_array(x) ? json_array_get(x, i) : items[0];
        if (!json_is_string(s)) return bad(param, cap, "stop", "'%s' must be a string or an array of strings%s", "");
        if (json_string_length(s) == 0) continue; /* an empty stop string never matches: dropped */
        if (!(r->stop[r->params.n_stop] = lm__strdup(json_string_value(s)))) return LM_OUT_OF_MEMORY;
        r->params.n_stop++;
    }
    r->params.stop = (const char *const *)r->stop;
    return LM_OK;
}

static lm_status get_prompt(json_t *o, lm__oai_request *r, char *param, size_t cap) {
    json_t *x = json_object_get(o, "prompt");
    if (!x || json_is_null(x)) return bad(param, cap, "prompt", "'%s' is required%s", "");
    if (json_is_array(x) && json_array_size(x) == 1 && json_is_string(json_array_get(x, 0))) x = json_array_get(x, 0);
    if (json_is_string(x)) {
        if (!(r->prompt = lm__strdup(json_string_value(x)))) return LM_OUT_OF_MEMORY;
        if (strlen(r->prompt) != json_string_length(x)) return bad(param, cap, "prompt", "'%s' contains a NUL character%s", "");
        return LM_OK;
    }
    if (!json_is_array(x)) return bad(param, cap, "prompt", "'%s' must be a string or an array of token ids%s", "");
    size_t n = json_array_size(x);
    if (n == 0) return bad(param, cap, "prompt", "'%s' is empty%s", "");
    if (!json_is_integer(json_array_get(x, 0)))
        return bad(param, cap, "prompt", "'%s': one prompt per request (a string or an array of token ids)%s", "");
    if (!(r->prompt_ids = lm__calloc(n, sizeof *r->prompt_ids))) return LM_OUT_OF_MEMORY;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(x, i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 || json_integer_value(e) > INT32_MAX)
            return bad(param, cap, "prompt", "'%s' token arrays hold non-negative integers only%s", "");
        r->prompt_ids[i] = (int32_t)json_integer_value(e);
    }
    r->n_prompt_ids = n;
    return LM_OK;
}

static lm_status get_messages(json_t *o, lm__oai_request *r, char *param, size_t cap) {
    json_t *x = json_object_get(o, "messages");
    if (!json_is_array(x) || json_array_size(x) == 0)
        return bad(param, cap, "messages", "'%s' must be a non-empty array of messages%s", "");
    size_t i;
    json_t *m;
    json_array_foreach(x, i, m) {
        json_t *role = json_object_get(m, "role"), *content = json_object_get(m, "content");
        if (!json_is_object(m) || !json_is_string(role))
            return bad(param, cap, "messages", "'%s': every message needs a string 'role'%s", "");
        if (content && !json_is_null(content) && !json_is_string(content) && !json_is_array(content))
            return bad(param, cap, "messages", "'%s': a message's 'content' must be a string or an array of parts%s", "");
        if (json_is_array(content)) { /* text parts only: joined into one string */
            size_t k;
            json_t *part;
            json_array_foreach(content, k, part) {
                json_t *type = json_object_get(part, "type");
                if (!json_is_string(type) || strcmp(json_string_value(type), "text") != 0 ||
                    !json_is_string(json_object_get(part, "text")))
                    return bad(param, cap, "messages", "'%s': only text content parts are supported%s", "");
            }
        }
    }
    /* text parts become one string, so templates see content as a string */
    json_t *copy = json_deep_copy(x);
    if (!copy) return LM_OUT_OF_MEMORY;
    json_array_foreach(copy, i, m) {
        json_t *content = json_object_get(m, "content");
        if (!json_is_array(content)) continue;
        size_t k, total = 0;
        json_t *part;
        json_array_foreach(content, k, part) total += json_string_length(json_object_get(part, "text"));
        char *joined = lm__calloc(total + 1, 1);
        if (!joined) {
            json_decref(copy);
            return LM_OUT_OF_MEMORY;
        }
        size_t at = 0;
        json_array_foreach(content, k, part) {
            json_t *t = json_object_get(part, "text");
            memcpy(joined + at, json_string_value(t), json_string_length(t));
            at += json_string_length(t);
        }
        json_object_set_new(m, "content", json_stringn(joined, at));
        lm__free(joined);
    }
    r->messages_json = dump(copy);
    json_decref(copy);
    if (!r->messages_json) return LM_OUT_OF_MEMORY;
    json_t *tools = json_object_get(o, "tools");
    if (tools && !json_is_null(tools)) {
        if (!json_is_array(tools)) return bad(param, cap, "tools", "'%s' must be an array%s", "");
        if (json_array_size(tools) && !(r->tools_json = dump(tools))) return LM_OUT_OF_MEMORY;
    }
    json_t *kw = json_object_get(o, "chat_template_kwargs");
    if (kw && !json_is_null(kw)) {
        if (!json_is_object(kw)) return bad(param, cap, "chat_template_kwargs", "'%s' must be an object%s", "");
        if (!(r->template_kwargs = dump(kw))) return LM_OUT_OF_MEMORY;
    }
    return get_bool(o, "add_generation_prompt", &r->add_generation_prompt, param, cap);
}

/* Fields loom refuses rather than silently ignore. */
static lm_status refuse_unsupported(json_t *o, const lm__oai_request *r, char *param, size_t cap) {
    json_t *x;
    if ((x = json_object_get(o, "echo")) && json_is_true(x))
        return bad(param, cap, "echo", "'%s' is not supported%s", "");
    if ((x = json_object_get(o, "suffix")) && !json_is_null(x))
        return bad(param, cap, "suffix", "'%s' is not supported%s", "");
    if ((x = json_object_get(o, "best_of")) && !json_is_null(x) &&
        (!json_is_integer(x) || json_integer_value(x) != r->n))
        return bad(param, cap, "best_of", "'%s' other than n is not supported%s", "");
    if ((x = json_object_get(o, "logit_bias")) && !json_is_null(x) && !(json_is_object(x) && json_object_size(x) == 0))
        return bad(param, cap, "logit_bias", "'%s' is not supported%s", "");
    if ((x = json_object_get(o, "response_format")) && !json_is_null(x)) {
        json_t *t = json_object_get(x, "type");
        if (!json_is_string(t) || strcmp(json_string_value(t), "text") != 0)
            return bad(param, cap, "response_format", "'%s' other than {\"type\": \"text\"} is not supported%s", "");
    }
    return LM_OK;
}

static lm_status parse_object(json_t *o, lm__oai_kind kind, lm__oai_request *r, char *param, size_t cap) {
    json_t *model = json_object_get(o, "model");
    if (model && !json_is_null(model)) {
        if (!json_is_string(model)) return bad(param, cap, "model", "'%s' must be a string%s", "");
        if (!(r->model = lm__strdup(json_string_value(model)))) return LM_OUT_OF_MEMORY;
    }
    if (kind == LM__OAI_COMPLETION) LM_TRY(get_prompt(o, r, param, cap));
    else LM_TRY(get_messages(o, r, param, cap));
    lm_serve_params *p = &r->params;
    int64_t v = -1, n = 1;
    LM_TRY(get_int(o, "max_tokens", 1, INT32_MAX, &v, param, cap));
    LM_TRY(get_int(o, "max_completion_tokens", 1, INT32_MAX, &v, param, cap));
    p->max_tokens = v;
    LM_TRY(get_int(o, "n", 1, LM__OAI_MAX_N, &n, param, cap));
    r->n = (int)n;
    double temperature = 1, top_p = 1, min_p = 0, rep = 1, pres = 0, freq = 0;
    LM_TRY(get_number(o, "temperature", 0, 2, &temperature, param, cap));
    LM_TRY(get_number(o, "top_p", 0, 1, &top_p, param, cap));
    if (top_p <= 0) return bad(param, cap, "top_p", "'%s' must be in (0, 1]%s", "");
    LM_TRY(get_number(o, "min_p", 0, 0.999999, &min_p, param, cap));
    LM_TRY(get_number(o, "repetition_penalty", 1e-6, 1e6, &rep, param, cap));
    LM_TRY(get_number(o, "presence_penalty", -2, 2, &pres, param, cap));
    LM_TRY(get_number(o, "frequency_penalty", -2, 2, &freq, param, cap));
    int64_t top_k = 0, seed = 0;
    LM_TRY(get_int(o, "top_k", -1, INT32_MAX, &top_k, param, cap));
    json_t *sx = json_object_get(o, "seed");
    if (sx && !json_is_null(sx) && !json_is_integer(sx)) return bad(param, cap, "seed", "'%s' must be an integer%s", "");
    if (sx && json_is_integer(sx)) seed = (int64_t)json_integer_value(sx);
    p->sampler = lm_sampler_params_default();
    p->sampler.temperature = (float)temperature;
    p->sampler.greedy = temperature == 0;
    p->sampler.top_p = (float)top_p;
    p->sampler.min_p = (float)min_p;
    p->sampler.top_k = top_k < 0 ? 0 : (int)top_k;
    p->sampler.repetition_penalty = (float)rep;
    p->sampler.seed = (uint64_t)seed;
    p->presence_penalty = (float)pres;
    p->frequency_penalty = (float)freq;
    LM_TRY(get_stop(o, r, param, cap));
    LM_TRY(get_bool(o, "ignore_eos", &p->ignore_eos, param, cap));
    int skip = 1;
    LM_TRY(get_bool(o, "skip_special_tokens", &skip, param, cap));
    p->decode_flags = skip ? LM_TOKENIZER_SKIP_SPECIAL : 0;
    LM_TRY(get_bool(o, "stream", &r->stream, param, cap));
    json_t *so = json_object_get(o, "stream_options");
    if (so && !json_is_null(so)) {
        if (!json_is_object(so)) return bad(param, cap, "stream_options", "'%s' must be an object%s", "");
        LM_TRY(get_bool(so, "include_usage", &r->include_usage, param, cap));
    }
    json_t *lp = json_object_get(o, "logprobs");
    if (kind == LM__OAI_CHAT) {
        LM_TRY(get_bool(o, "logprobs", &r->logprobs, param, cap));
        int64_t top = 0;
        LM_TRY(get_int(o, "top_logprobs", 0, LM_SERVE_MAX_TOP_LOGPROBS, &top, param, cap));
        if (top > 0 && !r->logprobs) return bad(param, cap, "top_logprobs", "'%s' needs \"logprobs\": true%s", "");
        p->top_logprobs = (int)top;
    } else if (lp && !json_is_null(lp)) {
        int64_t top = 0;
        LM_TRY(get_int(o, "logprobs", 0, LM_SERVE_MAX_TOP_LOGPROBS, &top, param, cap));
        r->logprobs = 1;
        p->top_logprobs = (int)top;
    }
    p->logprobs = r->logprobs;
    return refuse_unsupported(o, r, param, cap);
}

lm_status lm__oai_parse(const char *body, size_t len, lm__oai_kind kind, lm__oai_request *out, char *param,
                        size_t param_cap) {
    memset(out, 0, sizeof *out);
    out->kind = kind;
    out->add_generation_prompt = 1;
    lm_serve_params_default(&out->params);
    if (param_cap) param[0] = 0;
    json_error_t err;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &err);
    if (!o) return lm__error(LM_PARSE_ERROR, "the body is not valid JSON: %s (at byte %d)", err.text, err.position);
    lm_status st = json_is_object(o) ? parse_object(o, kind, out, param, param_cap)
                                     : lm__error(LM_INVALID_ARGUMENT, "the body must be a JSON object");
    json_decref(o);
    return st;
}

void lm__oai_request_free(lm__oai_request *r) {
    lm__free(r->model);
    lm__free(r->prompt);
    lm__free(r->prompt_ids);
    free(r->messages_json); /* json_dumps memory */
    free(r->tools_json);
    free(r->template_kwargs);
    for (int i = 0; i < LM__OAI_MAX_STOP; i++) lm__free(r->stop[i]);
    memset(r, 0, sizeof *r);
}

char *lm__oai_error_json(const char *message, const char *type, const char *param, const char *code) {
    json_t *e = json_pack("{s:{s:s, s:s, s:o, s:o}}", "error", "message", message, "type", type, "param",
                          param && param[0] ? json_string(param) : json_null(), "code",
                          code ? json_string(code) : json_null());
    if (!e) return NULL;
    char *s = dump(e);
    json_decref(e);
    if (!s) return NULL;
    char *copy = lm__strdup(s);
    free(s);
    return copy;
}
