/* autograd/internal.h — the tape, variable and node records shared by the autograd
 * sources (never installed).
 *
 * Variables live in fixed-size blocks that the tape keeps across resets, so running
 * operations under no_grad allocates nothing beyond each operator's output. Nodes
 * are appended to one growable array in execution order, which is a topological
 * order: backward walks it in reverse. A node's backward function reads its inputs'
 * values (alive until reset) and the upstream gradients of its outputs, and returns
 * one new tensor per input that requires a gradient (NULL for the others).
 */
#ifndef LOOM_AUTOGRAD_INTERNAL_H
#define LOOM_AUTOGRAD_INTERNAL_H

#include "base/internal.h"
#include "loom/autograd.h"

#define LM__AG_MAX_IN 4
#define LM__AG_MAX_OUT 2
#define LM__AG_MAX_SAVED 3
#define LM__AG_BLOCK 128 /* variables per arena block */

struct lm_ag_var {
    lm_ag *ag;
    lm_tensor *value;     /* owned */
    lm_tensor *grad;      /* owned; the gradient accumulated during backward */
    int requires_grad;
    int is_leaf;
    int needed;           /* backward: the root depends on this variable */
    int64_t pending;      /* backward: contributions still to come */
    lm_tensor_view bound; /* caller's gradient buffer when has_bound */
    int has_bound, bound_accumulate;
    int in_bound;         /* backward: the gradient was put straight into the bound buffer */
    lm_ag_hook_fn hook;
    void *hook_user;
};

typedef struct lm__ag_node lm__ag_node;
/* gout[j]: gradient of output j (NULL when nothing depends on it); gin[i] receives a
 * new tensor for each input that requires a gradient. */
typedef lm_status (*lm__ag_backward_fn)(lm_ag *ag, const lm__ag_node *n, lm_tensor *const *gout, lm_tensor **gin);

/* Operation parameters a backward needs besides the input values. */
typedef struct lm__ag_params {
    float f;                      /* eps, scale */
    int flag;                     /* causal; rope style */
    int64_t i0, i1, i2;           /* ignore_index; transpose dims; slice dim/start/step */
    int ndim;
    int64_t shape[LM_MAX_DIMS];   /* the input's shape (reshape, slice, sum) */
    float attn_factor;            /* rope */
    int64_t pos_offset;           /* rope */
} lm__ag_params;

struct lm__ag_node {
    const char *name; /* operation, for error details */
    lm__ag_backward_fn backward;
    int nin, nout;
    lm_ag_var *in[LM__AG_MAX_IN];
    lm_ag_var *out[LM__AG_MAX_OUT];
    lm_tensor *saved[LM__AG_MAX_SAVED]; /* owned: ids, targets, positions, inv_freq, kept statistics
                                         * and gradients computed ahead (linear + cross-entropy) */
    lm__ag_params p;
};

struct lm_ag {
    lm_ctx *ctx;
    int grad_enabled;
    int backward_done;
    lm_ag_var **blocks; /* [nblocks] arrays of LM__AG_BLOCK variables */
    int64_t nblocks, nvars;
    lm__ag_node *nodes; /* [cap_nodes], the first nnodes recorded */
    int64_t nnodes, cap_nodes;
    lm_ag_stats stats;
};

/* ---- graph.c ---- */
/* A node template with up to three inputs (unused ones NULL) and no parameters. */
lm__ag_node lm__ag_node_make(const char *name, lm__ag_backward_fn fn, int nin, int nout, lm_ag_var *a, lm_ag_var *b,
                             lm_ag_var *c);
/* A new variable taking ownership of value (destroyed on failure). */
lm_status lm__ag_var_new(lm_ag *ag, lm_tensor *value, int requires_grad, lm_ag_var **out);
/* 1 when an operation with these inputs must be recorded. */
int lm__ag_recording(const lm_ag *ag, int n, lm_ag_var *const *in);
/* Appends a node; on failure the saved tensors are destroyed. */
lm_status lm__ag_push(lm_ag *ag, const lm__ag_node *node);
/* Checks that every input is a variable of this tape. */
lm_status lm__ag_check_inputs(const lm_ag *ag, const char *op, int n, lm_ag_var *const *in);
/* A new tensor on the tape's device. */
lm_status lm__ag_tensor(lm_ag *ag, lm_dtype dt, int ndim, const int64_t *shape, lm_tensor **out);
/* A new tensor shaped and typed like t. */
lm_status lm__ag_new_like(lm_ag *ag, const lm_tensor *t, lm_tensor **out);
/* A new tensor of dtype dt and shape [ndim] whose storage orders the dims as `order`'s
 * strides do when `order` is a permutation of a dense layout (e.g. attention's
 * [B, H, T, D] view of a [B, T, H, D] buffer): the result is then that permuted view,
 * so transposing it back is contiguous and a reshape needs no copy. Contiguous when
 * `order` is not such a view. */
lm_status lm__ag_new_ordered(lm_ag *ag, const lm_tensor_view *order, lm_dtype dt, int ndim, const int64_t *shape,
                             lm_tensor **out);
/* gin[i] = a new tensor like input i, for each input that requires a gradient. */
lm_status lm__ag_grads_like(lm_ag *ag, const lm__ag_node *n, lm_tensor **gin);
/* Takes saved tensor s out of node n (a node of ag's tape): the caller owns it and the
 * slot is left NULL. For a backward that hands on what its forward computed; a tape's
 * backward runs once, so the slot is not needed again. */
lm_tensor *lm__ag_take_saved(lm_ag *ag, const lm__ag_node *n, int s);
/* During a backward: v's bound buffer when the node now running may put v's gradient
 * straight into it (v is a leaf with a buffer, this is its only contribution and none
 * has arrived), else NULL. On a buffer the node must write (*accumulate 0) or add
 * (*accumulate 1) the gradient there and leave its gin slot NULL; the leaf then skips
 * its buffer copy. */
const lm_tensor_view *lm__ag_claim_bound(lm_ag_var *v, int *accumulate);
/* During a backward: v's gradient so far when a node may add its contribution into it
 * in place (the tape's in-place sum condition: one owner, no self-overlap, v's dtype),
 * else NULL. A node that does adds into it and leaves its gin slot NULL. */
lm_tensor *lm__ag_summable_grad(const lm_ag_var *v);
/* t's view, or NULL for no tensor (an optional gradient output). */
static inline const lm_tensor_view *lm__ag_opt(const lm_tensor *t) { return t ? lm_tensor_as_view(t) : NULL; }
/* A new contiguous tensor holding a copy of view v (for saved index operands). */
lm_status lm__ag_copy(lm_ag *ag, const lm_tensor_view *v, lm_tensor **out);
/* A new tensor sharing t's storage and view (a reference, no copy). */
lm_status lm__ag_alias(const lm_tensor *t, lm_tensor **out);

/* Records an operation whose outputs are already computed: makes out vars for
 * values[0..nout) (taking ownership), and when recording pushes a node copied from
 * tmpl with those outputs. On failure everything is released. */
lm_status lm__ag_finish(lm_ag *ag, const lm__ag_node *tmpl, int record, lm_tensor **values, lm_ag_var **outs);
/* graph.c: a new tensor of like's device, dtype and shape, zeroed in ag's stream order
 * (nothing waits for the device, so a captured step may hold it). */
lm_status lm__ag_zeros(lm_ag *ag, const lm_tensor_view *like, lm_tensor **out);

#define LM__AG_V(t) lm_tensor_as_view(t)

#endif
