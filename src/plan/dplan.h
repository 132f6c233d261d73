/* plan/dplan.h — decode schedules (loom/plan.h lm_decode_plan): the record shared by
 * dplan.c (items, footprints, dependencies, the SM lists, the check) and dplan_run.c
 * (the CPU run of a schedule, the decode step it plans). */
#ifndef LOOM_PLAN_DPLAN_H
#define LOOM_PLAN_DPLAN_H

#include "exec/internal.h"
#include "loom/plan.h"
#include "plan/dplan_part.h"

/* How an item runs its op: whole, or a range of the op's units. */
typedef enum lm__dp_kind {
    LM__DP_WHOLE = 0,
    LM__DP_ROWS,   /* linear: output columns [lo, hi) = weight rows */
    LM__DP_SWIGLU, /* linear_swiglu: output columns [lo, hi) = gate rows [lo, hi) and up rows I + [lo, hi) */
    LM__DP_QKV,    /* linear_qkv_rope: heads [lo, hi) of the q|k|v stack, all in one of the three, their
                      RoPE pairs (dims) [k0, k1) and D/2 + [k0, k1) */
    LM__DP_ATTN,   /* attention_cache: units [lo, hi) of (row b, kv head h) = b * Hkv + h, each with the
                      query heads of h */
    LM__DP_ATTN_PART,    /* attention_cache, kv head lo, keys [k0, k1): chunk c of nc, its softmax partials
                            (max, sum, weighted values) into the plan's buffer at poff */
    LM__DP_ATTN_COMBINE, /* attention_cache, kv head lo: the nc chunks' partials merged into the output */
    LM__DP_MROWS,        /* rms_norm, add_rmsnorm, swiglu: rows [lo, hi) (dim 0) of the output and of the
                            inputs lm__dp_row_input names */
} lm__dp_kind;

/* A byte interval [lo, hi) of one item's footprint. */
typedef struct lm__dp_iv {
    uintptr_t lo, hi;
    int32_t item;
    int32_t write;
} lm__dp_iv;

typedef struct lm__dp_item {
    int32_t op;
    lm__dp_kind kind;
    int64_t lo, hi;
    int32_t sm;
    double start, cost; /* predicted (seconds) */
    double hbm;         /* weight / KV-cache bytes it streams */
    double flops;       /* its products' floating-point operations */
    int64_t dep0;       /* deps[dep0 .. dep0 + ndep): earlier items it waits for */
    int32_t ndep;
    int64_t iv0; /* iv[iv0 .. iv0 + niv) */
    int32_t niv;
    int64_t k0, k1; /* ATTN_PART: the key positions; QKV: the pairs */
    int32_t c, nc;  /* ATTN_PART / ATTN_COMBINE: chunk c of nc per kv head */
    int64_t poff;   /* ATTN_PART / ATTN_COMBINE: the op's partials in part[] (floats) */
} lm__dp_item;

/* Linear pieces start at multiples of this many output rows (SwiGLU: half as many
 * columns, each a gate and an up row; the front's RoPE pieces: half as many pairs), so
 * that a GPU item covers whole row groups of the decode GEMV (2, 4 or 8 rows a warp). */
#define LM__DP_ROW_QUANTUM 8
#define LM__DP_MAX_HEAD_DIM 512 /* the key split's head dimensions (larger ones run whole heads) */

struct lm_decode_plan {
    lm_exec *e; /* borrowed */
    const lm_graph *g;
    lm_tensor_view *fview; /* [g->nvalues] the views footprints are taken from (dplan.c footprint_views) */
    int64_t resolves; /* e->resolves when planned: the views the footprints were taken from */
    lm_decode_plan_options opt;
    lm__dp_item *items;
    int64_t nitems, cap_items;
    int32_t *deps;
    int64_t ndeps, cap_deps;
    lm__dp_iv *iv;
    int64_t niv, cap_iv;
    /* The dependencies as a kernel waits for them: an item's dependencies on every item
     * of one op are one wait on that op's counter (it holds op_count[j] a step when the
     * op is done), the others stay waits on an item's own flag. Entry w >= 0: item w;
     * w < 0: op -w - 1 (ops numbered densely in order of their first item). */
    int32_t *item_op;    /* [nitems] */
    int32_t *op_count;   /* [nops] items of each op */
    int32_t nops;
    int32_t *waits;      /* item i: waits[wait_begin[i] .. wait_begin[i + 1]) */
    int64_t *wait_begin; /* [nitems + 1] */
    int32_t *order;    /* [nitems] items grouped by SM, ascending inside a group */
    int64_t *sm_begin; /* [sms + 1] */
    double step_s, busy_s, hbm_bytes;
    int64_t ops_split, ops_whole;
    struct lm__dp_exec *exec; /* the GPU run's tables and kernel, made at its first run (dplan_exec_cuda.c) */
    float *part; /* attention partials of the key-split ops, in the executor's device memory */
    int64_t npart;
    int part_on_device;
    lm_device part_device;
};

/* The units of op i's split kind: G query heads per kv head (attention), Hq (the
 * front); dplan.c and dplan_run.c read an op the same way through these. */
int64_t lm__dp_group(const lm_graph *g, const lm__gop *op);
int64_t lm__dp_heads_q(const lm__gop *op);
/* 1 when input k of op is cut with the output's rows in an MROWS item (the others, the
 * weights, are read whole); 0 for ops without row pieces. */
static inline int lm__dp_row_input(const lm__gop *op, int k) {
    switch (op->kind) {
    case LM__GOP_RMSNORM: return k == 0;
    case LM__GOP_ADD_RMSNORM:
    case LM__GOP_SWIGLU: return k == 0 || k == 1;
    default: return 0;
    }
}
/* The GPU run (dplan_exec_cuda.c; dplan_exec_nocuda.c without CUDA): enqueue one step on
 * ctx's stream (the whole ops before and after the launch as the executor runs them);
 * finish: synchronize and report a wait that timed out. free: the run's tables. */
lm_status lm__dp_exec_enqueue(lm_decode_plan *p, lm_ctx *ctx);
lm_status lm__dp_exec_finish(lm_decode_plan *p, lm_ctx *ctx);
void lm__dp_exec_free(lm_decode_plan *p);
/* One profiled step of the GPU run: per op family (the op's name without its layer)
 * items, mean wait and run time an item, as text (free with lm_free). */
lm_status lm__dp_exec_profile(lm_decode_plan *p, lm_ctx *ctx, char **out);
/* Test hooks: remove dependency k of item i, or wait k of item i (the check must then fail). */
void lm__dp_drop_dep(lm_decode_plan *p, int64_t i, int k);
void lm__dp_drop_wait(lm_decode_plan *p, int64_t i, int k);

#endif
