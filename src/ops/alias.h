/* ops/alias.h — cheap detection of outputs that share memory with inputs.
 *
 * Exact overlap of two arbitrary strided views is a number-theory problem, so the
 * operators only reject what is certain and O(ndim) to see: an output starting at the
 * same address as an input but laid out differently, or two dense (row-major
 * contiguous) views whose byte ranges intersect. A view identical to an input (same
 * address, dtype, shape and strides) is in-place use, allowed only where the operator
 * says so. Other overlaps are not detected and are the caller's responsibility.
 */
#ifndef LOOM_OPS_ALIAS_H
#define LOOM_OPS_ALIAS_H

#include "ops/internal.h"

/* 1 when a and b address the same elements in the same order. */
int lm__view_identical(const lm_tensor_view *a, const lm_tensor_view *b);
/* LM_INVALID_ARGUMENT (naming op, out_name and in_name) when output out overlaps input
 * in detectably; an identical view passes only when allow_identical is nonzero.
 * Empty views never overlap anything. */
lm_status lm__op_check_alias(const char *op, const char *out_name, const lm_tensor_view *out, const char *in_name,
                             const lm_tensor_view *in, int allow_identical);

#endif
