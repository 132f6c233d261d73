/* ops/ref/embedding.h — reference kernel for the embedding lookup. Arguments are
 * already validated by ops/embedding.c: table [V, D] float, ids i32/i64 [...],
 * out [..., D] in table's dtype. */
#ifndef LOOM_OPS_REF_EMBEDDING_H
#define LOOM_OPS_REF_EMBEDDING_H

#include "ops/internal.h"

/* LM_OUT_OF_RANGE (naming the first bad id's position and value) before anything is
 * written when an id lies outside [0, V). */
lm_status lm__ref_embedding(const lm_tensor_view *table, const lm_tensor_view *ids, const lm_tensor_view *out);

#endif
