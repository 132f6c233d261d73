/* graph/ir.h — the model-step IR shared by every consumer: the graph builders, the
 * rewrite passes, the executors (CPU, CUDA, autograd) and the tile compiler (plan/).
 * Never installed; include/loom/graph.h is the public builder API over it.
 *
 * A graph is fixed-shape SSA: values (1..4 dims, any dtype) produced by ops kept in a
 * valid program order. Inputs are bound by the caller per run (token ids, positions,
 * cache slots, KV caches), parameters by name (Hugging Face tensor names) to weights.
 * View ops (reshape, permute, slice) move no data: a view records its root, the value
 * owning the storage. Two ops write into an operand's storage instead of a new one:
 * kv_store (its output is the updated cache, rooted at the cache) and a fused linear
 * with accumulate (its output is the residual, rooted at the residual); everything
 * else writes a fresh value. Repeat regions (plan workloads) run a body count times.
 * Attributes per op kind are listed beside the kinds below.
 */
#ifndef LOOM_GRAPH_IR_H
#define LOOM_GRAPH_IR_H

#include "base/internal.h"
#include "loom/graph.h"

#include <stdint.h>
#include <string.h>

#define LM__G_MAX_DIMS 4
#define LM__G_MAX_IN 10
#define LM__G_NAME 64
#define LM__G_MAX_CARRY 4

/* Op kinds. Attributes: a, b (double), i[4] (int64), perm. Inputs in order. */
typedef enum lm__gopk {
    LM__GOP_INPUT,     /* a = simulator mean (0), b = simulator std */
    LM__GOP_PARAM,     /* a = mean, b = std (tile-compiler workloads fill params randomly) */
    LM__GOP_MATMUL,    /* a [.., M, K] x b [.., K, N]; b may be a permuted parameter (linear) */
    LM__GOP_BIAS_ADD,  /* x [.., N] + bias [N] */
    LM__GOP_GELU,
    LM__GOP_SILU,
    LM__GOP_ADD,
    LM__GOP_MUL,
    LM__GOP_SOFTMAX,   /* a = scale */
    LM__GOP_LAYERNORM, /* x, gamma, beta?; a = eps */
    LM__GOP_RMSNORM,   /* x, gamma; a = eps; the output dtype may differ from x's */
    LM__GOP_RESHAPE,   /* view */
    LM__GOP_PERMUTE,   /* view; perm */
    LM__GOP_REPEAT_IN, /* the carried value inside the body: in[0] = outer value */
    LM__GOP_REPEAT_OUT, /* outer result: in[0] = body output, a = region */
    /* ---- model-step ops ---- */
    LM__GOP_SLICE,     /* view; i = {dim, start, stop, step} */
    LM__GOP_CAST,      /* x -> the output dtype */
    LM__GOP_EMBEDDING, /* table [V, D], ids [...] i32 -> [..., D] */
    LM__GOP_SWIGLU,    /* silu(gate) * up */
    LM__GOP_ROPE,      /* x [B, T, H, D], positions [B, T] i32, inv_freq [D/2] f32; a = attention factor */
    LM__GOP_ATTENTION, /* q [B, Tq, Hq, D], k [B, Tk, Hkv, D], v [B, Tk, Hkv, Dv] -> [B, Tq, Hq, Dv] (token-major
                          like the projections, so no permutes appear in graphs); a = scale, i[0] = causal,
                          i[1] = window (0: none) */
    LM__GOP_KV_STORE,  /* cache [S, Hkv, P, D], x [B, T, Hkv, D], slots [B] i32, positions [B, T] i32;
                          output = the cache (same storage) with x's rows written at (slot, position) */
    LM__GOP_ATTENTION_CACHE, /* q [B, T, Hq, D], k_cache, v_cache [S, Hkv, P, D], slots [B], positions [B, T];
                                a = scale, i[1] = window; out [B, T, Hq, D] */
    LM__GOP_LINEAR_CE, /* x [N, H], w [V, H], targets [N] i32; i[0] = ignore_index; out f32 scalar loss */
    LM__GOP_SAMPLE,    /* logits [R, V] f32, params u8 [LM_SAMPLE_PARAMS_BYTES or R * that] -> ids [R] i32 */
    /* ---- fused ops (made by rewrite passes, each a public operator) ---- */
    LM__GOP_ADD_RMSNORM, /* x, residual, weight; a = eps; out = x + residual, out2 = rmsnorm(out) * weight;
                            i[0] = 1: out is written in place into the residual */
    LM__GOP_LINEAR,      /* x, w [N, K], bias?, norm_weight?, residual?, w_scales?; i[0] = lm_linear_input,
                            i[1] = has bias, i[2] = has norm weight, i[3] = accumulate; a = eps.
                            w_scales (in[5], f32 [N]) exactly when w is i8 (int8 weights: the canonical
                            graph has no matmul form for them, so the decoder builds this op directly);
                            int4 weights: w u8 [N, K/2], w_scales f32 [N, K/group], b = group (32/64/128;
                            0 for every other linear) */
    LM__GOP_QKV_ROPE_STORE, /* qkv [B, T, (Hq + 2 Hkv) D], bias?, q_norm?, k_norm?, inv_freq, positions, slots,
                               k_cache, v_cache; out = q [B, T, Hq, D]; a = eps, b = attention factor,
                               i[0] = Hq, i[1] = has bias, i[2] = has q/k norms */
    LM__GOP_LINEAR_QKV_ROPE, /* x [B*T, K], w, norm_weight?, w_scales?, bias?, inv_freq, positions, slots, k_cache,
                                v_cache; out = q [B, T, Hq, D]: the q|k|v linear (no accumulate) and the
                                qkv_rope_store of its rows without q/k norms; a = the linear's eps, b = attention
                                factor, i[0] = Hq, i[1] = lm_linear_input, i[2] = int4 group (0 otherwise) */
    LM__GOP_LINEAR_SWIGLU, /* as LINEAR (x, w [2I, K], bias?, norm_weight?, -, w_scales?; i[0..2], a, b; never
                              accumulates), out [M, I] = silu(y[:, :I]) * y[:, I:] of its product y */
    LM__GOP_COUNT
} lm__gopk;

typedef struct lm__gvalue {
    char name[LM__G_NAME];
    int ndim;
    int64_t dims[LM__G_MAX_DIMS];
    lm_dtype dtype;
    int op;     /* producing op */
    int root;   /* value whose storage this one uses (itself when it owns storage) */
    int region; /* repeat region defining it, -1 at top level */
    int nuses;  /* ops reading it */
    int output; /* 1: program output */
} lm__gvalue;

typedef struct lm__gop {
    lm__gopk kind;
    char name[LM__G_NAME];
    int in[LM__G_MAX_IN]; /* -1 for an absent optional input */
    int nin;
    int out;
    int out2;    /* second output (add_rmsnorm's normalized rows), -1 otherwise */
    int region;  /* repeat region the op belongs to, -1 at top level */
    double a, b; /* per kind, see lm__gopk */
    int64_t i[4];
    int perm[LM__G_MAX_DIMS];
} lm__gop;

typedef struct lm__gregion {
    int64_t count;
    int begin, end; /* ops [begin, end) form the body (REPEAT_IN first) */
    int ncarry;
    int outer_in[LM__G_MAX_CARRY], body_in[LM__G_MAX_CARRY], body_out[LM__G_MAX_CARRY],
        outer_out[LM__G_MAX_CARRY];
} lm__gregion;

typedef struct lm__gcheck {
    int value;
    char name[64];
} lm__gcheck;

struct lm_graph {
    lm__gvalue *values; /* [nvalues] */
    int64_t nvalues, cap_values;
    lm__gop *ops; /* [nops] in program order */
    int64_t nops, cap_ops;
    lm__gregion regions[8];
    int nregions;
    int open_region;    /* -1 when no repeat is open */
    lm__gcheck *checks; /* [nchecks] */
    int64_t nchecks, cap_checks;
};

int lm__gop_is_view(lm__gopk k);
int lm__gop_is_elementwise(lm__gopk k); /* output follows the layout of in[0] */
int lm__gop_is_rows(lm__gopk k);        /* needs whole rows (last axis unsplit) */
const char *lm__gop_name(lm__gopk k);
/* The input whose storage op's output is (kv_store: the cache; a linear with
 * accumulate, an in-place add_rmsnorm: the residual), or -1 when the output is a new
 * value or a view. */
int lm__gop_inplace_input(const lm__gop *op);
int64_t lm__gvalue_numel(const lm__gvalue *v);
double lm__graph_matmul_flops(const lm_graph *g); /* repeats counted count times */
/* ---- building (graph.c): shared by the public builders and graph/ops.c ---- */
/* Validates the builder arguments and resolves the op's name (name, or "opN" in buf). */
lm_status lm__graph_begin_op(const lm_graph *g, const void *out, const char *name, char *buf, size_t n,
                             const char **nm);
/* v exists and is visible from the open repeat region; errors name op and role. */
lm_status lm__graph_check_value(const lm_graph *g, lm_graph_value v, const char *op, const char *role);
lm_status lm__graph_check_shape(const char *op, int ndim, const int64_t *shape);
/* Appends an op with inputs in[nin] (entries may be -1: absent optional inputs) and
 * one output value of shape dims[ndim] and dtype dt; *op_out (may be NULL) points at
 * the new op until the next append. */
lm_status lm__graph_append(lm_graph *g, lm__gopk kind, const char *name, const int *in, int nin, int ndim,
                           const int64_t *dims, lm_dtype dt, lm__gop **op_out, lm_graph_value *out_value);

/* ---- model-step op builders (graph/ops.c); shapes as in graph/ir.h's kinds ---- */
lm_status lm__graph_slice(lm_graph *g, const char *name, lm_graph_value x, int dim, int64_t start, int64_t stop,
                          lm_graph_value *out);
lm_status lm__graph_cast(lm_graph *g, const char *name, lm_graph_value x, lm_dtype dt, lm_graph_value *out);
/* rms_norm whose output dtype may differ from x's (the CUDA path normalizes the f32
 * residual stream into bf16 GEMM inputs). */
lm_status lm__graph_rmsnorm(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value weight, double eps,
                            lm_dtype out_dt, lm_graph_value *out);
lm_status lm__graph_embedding(lm_graph *g, const char *name, lm_graph_value table, lm_graph_value ids, lm_dtype out_dt,
                              lm_graph_value *out);
lm_status lm__graph_kv_store(lm_graph *g, const char *name, lm_graph_value cache, lm_graph_value x,
                             lm_graph_value slots, lm_graph_value positions, lm_graph_value *out);
lm_status lm__graph_attention_cache(lm_graph *g, const char *name, lm_graph_value q, lm_graph_value k_cache,
                                    lm_graph_value v_cache, lm_graph_value slots, lm_graph_value positions,
                                    double scale, int64_t window, lm_graph_value *out);
lm_status lm__graph_linear_ce(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                              lm_graph_value targets, int64_t ignore_index, lm_graph_value *out);
lm_status lm__graph_sample(lm_graph *g, const char *name, lm_graph_value logits, lm_graph_value params,
                           lm_graph_value *out);
/* y [N, n_out] (out_dt) = x [N, K] (float) . (w [n_out, K] i8 * w_scales [n_out] f32 by row)^T (+ bias [n_out]):
 * the linear op of int8 weights (bias may be -1). */
lm_status lm__graph_linear_int8(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                                lm_graph_value w_scales, lm_graph_value bias, lm_dtype out_dt, lm_graph_value *out);

/* y [N, n_out] (out_dt) = x [N, K] (float) . (int4 w [n_out, K/2] u8, two values a byte, times w_scales
 * [n_out, K/group] f32 by group)^T (+ bias [n_out]): the linear op of int4 weights (b = group). */
lm_status lm__graph_linear_int4(lm_graph *g, const char *name, lm_graph_value x, lm_graph_value w,
                                lm_graph_value w_scales, int group, lm_graph_value bias, lm_dtype out_dt,
                                lm_graph_value *out);

/* A second output value for the op appended last (fused ops with two results). */
lm_status lm__graph_add_out2(lm_graph *g, const char *name, int ndim, const int64_t *dims, lm_dtype dt,
                             lm_graph_value *out);

/* A deep copy of g (values, ops, regions, checks). */
lm_status lm__graph_clone(const lm_graph *g, lm_graph **out);

#endif
