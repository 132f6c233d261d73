/* graph/rewrite.h — rewrite passes over the graph IR (graph/rewrite.c) and the
 * helpers passes share: a rewriter that copies a source graph op by op into a new
 * one (values renamed through map[]) while a pass emits fused ops instead of the
 * patterns it matches. */
#ifndef LOOM_GRAPH_REWRITE_H
#define LOOM_GRAPH_REWRITE_H

#include "graph/ir.h"

typedef struct lm__rw {
    const lm_graph *src;
    lm_graph *dst;
    int *map;            /* [src->nvalues]: the dst value standing for each src value, -1 if none yet */
    unsigned char *done; /* [src->nops]: already emitted (copied or fused away) */
} lm__rw;

lm_status lm__rw_init(lm__rw *rw, const lm_graph *src);
void lm__rw_free(lm__rw *rw);
/* Marks the program outputs in dst and hands it over (*out); frees the rest. */
lm_status lm__rw_finish(lm__rw *rw, lm_graph **out);
/* The dst value of src value v (-1 for v < 0). */
int lm__rw_in(const lm__rw *rw, int v);
/* Copies src op i (attributes, output(s), storage roots) unless already done. */
lm_status lm__rw_copy(lm__rw *rw, int64_t i);
lm_status lm__rw_copy_rest(lm__rw *rw, int64_t i);

/* The only op at or after `from` reading v (-1 when none, several, or v is a
 * program output). */
int lm__graph_sole_use(const lm_graph *g, int v, int64_t from);
/* The first op at or after `from` reading v, or -1. */
int lm__graph_first_use(const lm_graph *g, int v, int64_t from);
/* 1 when an op in [from, to) reads v. */
int lm__graph_used_between(const lm_graph *g, int v, int64_t from, int64_t to);
int lm__gop_is_leaf(lm__gopk k); /* input or parameter */

typedef lm_status (*lm__pass_fn)(const lm_graph *g, lm_graph **out);
/* Inputs and parameters first, in their order, then everything else in order. */
lm_status lm__pass_hoist_leaves(const lm_graph *g, lm_graph **out);
/* add + the rmsnorm of its sum -> add_rmsnorm (lm_add_rmsnorm_out). Run on canonical
 * graphs (no op between the two writes into the add's operands). */
lm_status lm__pass_add_rmsnorm(const lm_graph *g, lm_graph **out);
/* matmul(x, permute(w)) (+ bias_add) with parameters w [N, K], bias [N] -> linear
 * (x w^T + b). The permute stays if something else reads it (it costs nothing). */
lm_status lm__pass_linear(const lm_graph *g, lm_graph **out);
/* g through passes[0..n) in order; *out is a new graph (g itself when n = 0, cloned). */
lm_status lm__graph_run_passes(const lm_graph *g, int n, const lm__pass_fn *passes, lm_graph **out);

#endif
