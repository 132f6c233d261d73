/* loom/sampler.h — next-token selection from a row of logits.
 *
 * Order of operations (as in Hugging Face generate): repetition penalty over the
 * token history, then temperature, top-k, top-p, min-p, then a draw from the
 * renormalized distribution. Greedy (or temperature 0) takes the argmax after the
 * repetition penalty. The random stream is a seeded xoshiro256** generator, so the
 * same seed, logits and history give the same tokens on every machine.
 */
#ifndef LOOM_SAMPLER_H
#define LOOM_SAMPLER_H

#include "loom/base.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_sampler_params {
    int greedy;               /* 1: argmax; the other fields except repetition_penalty are ignored */
    float temperature;        /* > 0; 0 means greedy */
    int top_k;                /* 0 = off */
    float top_p;              /* (0, 1]; 1 = off */
    float min_p;              /* [0, 1); 0 = off */
    float repetition_penalty; /* >= 1 in practice; 1 = off; > 0 required */
    uint64_t seed;
} lm_sampler_params;

/* Defaults: sampling at temperature 1 with every filter off and seed 0. */
LM_API lm_sampler_params lm_sampler_params_default(void);

typedef struct lm_sampler lm_sampler;

/* Validates params (LM_INVALID_ARGUMENT naming the field) and allocates scratch for a
 * vocabulary of vocab_size entries. The caller owns *out: lm_sampler_destroy. */
LM_API lm_status lm_sampler_create(const lm_sampler_params *params, int64_t vocab_size, lm_sampler **out);
LM_API void lm_sampler_destroy(lm_sampler *s); /* accepts NULL */
/* Restarts the random stream from seed. */
LM_API void lm_sampler_reseed(lm_sampler *s, uint64_t seed);
/* Picks the next token from logits [vocab_size] (not modified) given the ids seen so
 * far (prompt + generated; may be NULL when n_history == 0). NaN logits are an error
 * (LM_INVALID_ARGUMENT), history ids outside the vocabulary too. */
LM_API lm_status lm_sampler_sample(lm_sampler *s, const float *logits, const int32_t *history, size_t n_history,
                                   int32_t *out_id);

#ifdef __cplusplus
}
#endif
#endif
