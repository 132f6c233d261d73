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
#define LM__G_MAX_IN 8
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
    LM__GOP_ATTENTION, /* q [B, Hq, Tq, D], k [B, Hkv, Tk, D], v [B, Hkv, Tk, Dv]; a = scale, i[0] = causal,
                          i[1] = window (0: none) */
    LM__GOP_KV_STORE,  /* cache [S, Hkv, P, D], x [B, T, Hkv, D], slots [B] i32, positions [B, T] i32;
                          output = the cache (same storage) with x's rows written at (slot, position) */
    LM__GOP_ATTENTION_CACHE, /* q [B, T, Hq, D], k_cache, v_cache [S, Hkv, P, D], slots [B], positions [B, T];
                                a = scale, i[1] = window; out [B, T, Hq, D] */
    LM__GOP_LINEAR_CE, /* x [N, H], w [V, H], targets [N] i32; i[0] = ignore_index; out f32 scalar loss */
    LM__GOP_SAMPLE,    /* logits [R, V] f32, params u8 [LM_SAMPLE_PARAMS_BYTES] -> ids [R] i32 */
    /* ---- fused ops (made by rewrite passes, each a public operator) ---- */
    LM__GOP_ADD_RMSNORM, /* x, residual, weight; a = eps; out = x + residual, out2 = rmsnorm(out) * weight */
    LM__GOP_LINEAR,      /* x, w [N, K], bias?, norm_weight?, residual?; i[0] = lm_linear_input,
                            i[1] = has bias, i[2] = has norm weight, i[3] = accumulate; a = eps */
    LM__GOP_QKV_ROPE_STORE, /* qkv [B, T, (Hq + 2 Hkv) D], bias?, q_norm?, k_norm?, inv_freq, positions, slots,
                               k_cache, v_cache; out = q [B, T, Hq, D]; a = eps, b = attention factor,
                               i[0] = Hq, i[1] = has bias, i[2] = has q/k norms */
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

/* Consumers of value v in op order (array owned by the caller: lm__free). */
lm_status lm__graph_uses(const lm_graph *g, int v, int **uses, int *n);
int lm__gop_is_view(lm__gopk k);
int lm__gop_is_elementwise(lm__gopk k); /* output follows the layout of in[0] */
int lm__gop_is_rows(lm__gopk k);        /* needs whole rows (last axis unsplit) */
const char *lm__gop_name(lm__gopk k);
int64_t lm__gvalue_numel(const lm__gvalue *v);
double lm__graph_matmul_flops(const lm_graph *g); /* repeats counted count times */
/* A deep copy of g (values, ops, regions, checks). */
lm_status lm__graph_clone(const lm_graph *g, lm_graph **out);

#endif
