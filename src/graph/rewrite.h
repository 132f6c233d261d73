/* graph/rewrite.h — rewrite passes over the graph IR (graph/rewrite.c) and the
 * helpers passes share: a rewriter that copies a source graph op by op into a new
 * one (values renamed through map[]) while a pass emits fused ops instead of the
 * patterns it matches. */
#ifndef LOOM_GRAPH_REWRITE_H
#define LOOM_GRAPH_REWRITE_H

#include "graph/ir.h"
#include "loom/ops.h"

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
int lm__gop_is_leaf(lm__gopk k); /* input or parameter */
/* 1 when v is its storage's own value or reshapes of it (every element, row-major):
 * writing v in place then writes exactly its storage. */
int lm__graph_whole_storage(const lm_graph *g, int v);
/* 1 when no op after `after` reads a value stored in root's storage (views and
 * in-place results included) and no program output lives there. */
int lm__graph_storage_dead_after(const lm_graph *g, int root, int64_t after);

/* What a pass may ask about the target: the device its operators will run on, and
 * which fused linears it runs as one kernel (lm_linear_supported; tests substitute
 * another rule to run the GPU's rewrites on the CPU's operators). */
typedef struct lm__pass_env {
    lm_device device;
    int (*linear_supported)(lm_device d, lm_linear_input input, int accumulate, int64_t rows, int64_t K,
                            lm_dtype x_dtype, lm_dtype w_dtype);
    /* lm_linear_qkv_rope_fused, or NULL: the projection never joins the front */
    int (*front_fused)(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                       lm_dtype w_dtype, int qk_norm);
    /* lm_linear_swiglu_fused, or NULL: the gate|up projection never takes the SwiGLU */
    int (*swiglu_fused)(lm_device d, lm_linear_input input, int64_t rows, int64_t K, lm_dtype x_dtype,
                        lm_dtype w_dtype);
    /* lm__linear_low_out, or NULL: every product stays f32 */
    int (*low_out)(lm_device d, int64_t rows, int64_t K, lm_dtype x_dtype, lm_dtype w_dtype);
} lm__pass_env;

typedef lm_status (*lm__pass_fn)(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* Inputs and parameters first, in their order, then everything else in order. */
lm_status lm__pass_hoist_leaves(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* add + the rmsnorm of its sum -> add_rmsnorm (lm_add_rmsnorm_out). Run on canonical
 * graphs (no op between the two writes into the add's operands). */
lm_status lm__pass_add_rmsnorm(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* matmul(x, permute(w)) (+ bias_add) with parameters w [N, K], bias [N] -> linear
 * (x w^T + b). The permute stays if something else reads it (it costs nothing). */
lm_status lm__pass_linear(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* g through passes[0..n) in order; *out is a new graph (g itself when n = 0, cloned). */
lm_status lm__graph_run_passes(const lm_graph *g, const lm__pass_env *env, int n, const lm__pass_fn *passes,
                               lm_graph **out);

/* ---- the GPU's fusions (graph/fuse.c), in the order the CUDA executor runs them ---- */
/* Linears reading the same rows with weights q_proj|k_proj|v_proj (or gate_proj|
 * up_proj) of one layer -> one linear over the stacked parameter "qkv_proj" ("gate_up_
 * proj"; nn/upload.c registers it) whose column slices replace the three (two). */
lm_status lm__pass_stack_linears(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* The slices of a stacked q|k|v projection through reshape, (q/k) rmsnorm, rope and
 * the two kv_stores -> qkv_rope_store (lm_qkv_rope_store_out). */
lm_status lm__pass_qkv_rope_store(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* A linear whose input is an rmsnorm, or a swiglu of the two halves of one value,
 * read by nothing else -> the linear with that input form, where the device runs it
 * as one kernel (lm_linear_supported: the decode GEMVs). */
lm_status lm__pass_linear_input(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* A q|k|v linear (no bias left, no accumulate) read only through a reshape by a
 * qkv_rope_store without q/k norms -> linear_qkv_rope (lm_linear_qkv_rope_store_out),
 * where the device runs it as one kernel (env->front_fused: the decode GEMV). Runs after
 * lm__pass_linear_input, so the projection's RMSNorm input form comes along. */
lm_status lm__pass_linear_qkv_rope(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* A linear (no accumulate) read only by a linear of SWIGLU input form -> linear_swiglu
 * (lm_linear_swiglu_out: the product and its SwiGLU, [M, I]) and the reader as a plain
 * linear over it, where the device runs the first as one kernel (env->swiglu_fused:
 * the decode GEMV). Runs after lm__pass_linear_input. */
lm_status lm__pass_linear_swiglu(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* add(r, linear(..)) where r's storage is read by nothing later -> the linear
 * accumulating into r in place (the residual stream), where the device runs it as
 * one kernel. */
lm_status lm__pass_linear_residual(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* Values whose every reader is a linear's input (normalized rows, attention output,
 * the SwiGLU activation, multi-token q) become bf16 when the weights are bf16, so the
 * GEMMs run bf16 x bf16 -> f32 on tensor cores; a product read only by SwiGLUs whose
 * output became bf16 (the gate|up GEMM of a prefill) is stored as bf16 too, where
 * env->low_out admits it; an embedding of a bf16 table followed by a widening cast
 * becomes one embedding into f32. */
lm_status lm__pass_gemm_inputs(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* A SwiGLU over the two halves of a plain bf16 product (bf16 x and weights, no bias, the
 * product stored as bf16 and read by nothing else) -> linear_swiglu of bf16 x into the
 * bf16 activation, where env->swiglu_fused admits bf16 x (the wgmma GEMM with the SwiGLU
 * in its epilogue: prefill and batched decode from 8 rows). Runs after
 * lm__pass_gemm_inputs, which settles the dtypes. */
lm_status lm__pass_swiglu_gemm(const lm_graph *g, const lm__pass_env *env, lm_graph **out);

#endif
