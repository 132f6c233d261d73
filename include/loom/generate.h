/* loom/generate.h — the generation loop: prefill a prompt, then sample one token at a
 * time through the KV cache, streaming text as it becomes final.
 *
 * Stops at max_new_tokens, at one of the model's eos ids (unless ignore_eos), when a
 * stop string appears in the generated text (the text is cut before it), or when the
 * callback asks to. Text is delivered only once it is complete UTF-8 and can no
 * longer turn out to be the start of a stop string.
 */
#ifndef LOOM_GENERATE_H
#define LOOM_GENERATE_H

#include "loom/model.h"
#include "loom/sampler.h"
#include "loom/tokenizer.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_generate_params {
    int64_t max_new_tokens;    /* >= 1 */
    lm_sampler_params sampler;
    const char *const *stop;   /* [n_stop] NUL-terminated stop strings; needs a tokenizer */
    int n_stop;
    int ignore_eos;            /* 1: keep going past eos ids */
    unsigned decode_flags;     /* LM_TOKENIZER_SKIP_SPECIAL to hide special tokens in text */
} lm_generate_params;

typedef enum lm_stop_reason {
    LM_STOP_LENGTH = 0,  /* max_new_tokens reached */
    LM_STOP_EOS = 1,     /* an eos id was generated */
    LM_STOP_STRING = 2,  /* a stop string appeared */
    LM_STOP_CALLBACK = 3 /* the callback returned nonzero */
} lm_stop_reason;

typedef struct lm_generate_result {
    int64_t prompt_tokens, new_tokens;
    lm_stop_reason reason;
    double prefill_seconds; /* prompt forward pass, wall clock */
    double decode_seconds;  /* all later steps, wall clock */
} lm_generate_result;

/* Called once per generated token with its id and the text that became final
 * (possibly empty), and once more at the end with id -1 and the remaining text.
 * Return nonzero to stop. */
typedef int (*lm_token_fn)(void *user, int32_t id, const char *text, size_t len);

/* tok may be NULL (then no text is produced and stop strings are an error). Errors
 * name the problem: LM_INVALID_ARGUMENT for bad parameters or an empty prompt,
 * LM_OUT_OF_RANGE when prompt + max_new_tokens exceeds max_position_embeddings, and
 * any forward-pass error. res may be NULL. */
LM_API lm_status lm_generate(const lm_model *m, lm_ctx *ctx, const lm_tokenizer *tok, const int32_t *prompt, size_t n_prompt,
                             const lm_generate_params *p, lm_token_fn on_token, void *user, lm_generate_result *res);

#ifdef __cplusplus
}
#endif
#endif
