/* serve/openai.h — OpenAI-compatible request bodies as loom requests (never
 * installed).
 *
 * lm__oai_parse turns the JSON body of POST /v1/completions or /v1/chat/completions
 * into an lm__oai_request: every field OpenAI defines is type-checked and range-checked
 * (a wrong type or value names the field in the error, for a 400 with "param"); the
 * fields loom cannot honour (echo, suffix, best_of > n, logit_bias, a response_format
 * other than text) are refused rather than ignored; fields it does not know are ignored,
 * as OpenAI clients send vendor extensions. Extensions read here: top_k, min_p,
 * repetition_penalty, ignore_eos, skip_special_tokens, add_generation_prompt and
 * chat_template_kwargs (extra template variables).
 */
#ifndef LOOM_SERVE_OPENAI_H
#define LOOM_SERVE_OPENAI_H

#include "serve/internal.h"

#define LM__OAI_MAX_STOP 16
#define LM__OAI_MAX_N 16

typedef enum lm__oai_kind { LM__OAI_COMPLETION = 0, LM__OAI_CHAT = 1 } lm__oai_kind;

typedef struct lm__oai_request {
    lm__oai_kind kind;
    char *model;            /* NULL when absent */
    char *prompt;           /* COMPLETION: the text prompt, or NULL when given as ids */
    int32_t *prompt_ids;    /* COMPLETION: [n_prompt_ids] when the prompt is a token array */
    size_t n_prompt_ids;
    char *messages_json;    /* CHAT: the messages array, re-serialized */
    char *tools_json;       /* CHAT: the tools array or NULL */
    char *template_kwargs;  /* CHAT: a JSON object of extra template variables, or NULL */
    int add_generation_prompt;
    lm_serve_params params; /* max_tokens = -1 when absent (the server picks) */
    char *stop[LM__OAI_MAX_STOP];
    int n;                  /* choices */
    int stream, include_usage;
    int logprobs;           /* chat: bool; completions: 1 when logprobs was a number */
} lm__oai_request;

/* Parses body (len bytes). On error returns LM_INVALID_ARGUMENT (or LM_PARSE_ERROR for
 * malformed JSON) with the detail in lm_last_error() and the offending field's name in
 * param (empty when none). The caller frees *out with lm__oai_request_free, also after
 * an error. */
lm_status lm__oai_parse(const char *body, size_t len, lm__oai_kind kind, lm__oai_request *out, char *param,
                        size_t param_cap);
void lm__oai_request_free(lm__oai_request *r);

/* The OpenAI error object {"error": {"message", "type", "param", "code"}} as a
 * NUL-terminated string from lm__alloc (caller frees with lm__free); NULL when out of memory. */
char *lm__oai_error_json(const char *message, const char *type, const char *param, const char *code);

#endif
