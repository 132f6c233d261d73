/* ops/ref/embedding_backward.h — reference kernel for the embedding backward.
 * Arguments are validated by ops/embedding_backward.c: ids [...], dout [..., D],
 * dtable [V, D]. */
#ifndef LOOM_OPS_REF_EMBEDDING_BACKWARD_H
#define LOOM_OPS_REF_EMBEDDING_BACKWARD_H

#include "ops/internal.h"

/* accumulate: dtable[v] += the sum, for the ids that occur only */
lm_status lm__ref_embedding_backward(const lm_tensor_view *ids, const lm_tensor_view *dout,
                                     const lm_tensor_view *dtable, int accumulate);

#endif
