/* exec/autograd.h — the autograd executor: a graph run on the tape (loom/autograd.h)
 * so its backward is derived from the same description the other executors run.
 * Internal: the training model (train/) is its user. */
#ifndef LOOM_EXEC_AUTOGRAD_H
#define LOOM_EXEC_AUTOGRAD_H

#include "graph/ir.h"
#include "loom/autograd.h"

typedef struct lm__ag_bindings {
    /* The leaf of parameter `name`, or (a constant such as "rope.inv_freq") NULL and
     * its view in *view. */
    lm_status (*param)(void *user, const char *name, lm_ag_var **var, lm_tensor_view *view);
    /* The view of input `name` (token ids, positions, targets) on the tape's device. */
    lm_status (*input)(void *user, const char *name, lm_tensor_view *view);
    void *user;
} lm__ag_bindings;

/* The passes the tape runs a graph through (leaves first, linear, add + rmsnorm):
 * the forward operations the training step is made of. *out is a new graph. */
lm_status lm__exec_autograd_prepare(const lm_graph *g, lm_graph **out);
/* Records every op of a prepared graph on ag; *out = the program output's variable. */
lm_status lm__exec_autograd(lm_ag *ag, const lm_graph *g, const lm__ag_bindings *b, lm_ag_var **out);

#endif
