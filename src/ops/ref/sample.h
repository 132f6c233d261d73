/* ops/ref/sample.h — reference of lm_sample_out (arguments validated by ops/sample.c). */
#ifndef LOOM_OPS_REF_SAMPLE_H
#define LOOM_OPS_REF_SAMPLE_H

#include "ops/internal.h"

/* LM_OUT_OF_MEMORY when its [V] rank workspace cannot be had. */
lm_status lm__ref_sample(const lm_tensor_view *logits, const lm_sample_params *p, int64_t records, const lm_tensor_view *ids);
/* The draw of (seed, draw, row) in [0, 1): splitmix64's finalizer, 53 random bits. */
double lm__sample_uniform(uint64_t seed, uint64_t draw, uint64_t row);

#endif
