/* plan/planner.h — the planner's internals: cost model entry points, candidates,
 * search units and states, the decision trace and the mid program.
 *
 * Candidates describe an op's implementation in layout terms (required input
 * layouts in each input's root space, output layout, kernel costs). The search walks
 * units (one op, a fusible attention triple, or a Repeat region) keeping the cheapest
 * states; a state records which layouts of each root value are materialized. The
 * winning trace is lowered to a mid program (whole-device operations).
 */
#ifndef LOOM_PLAN_PLANNER_H
#define LOOM_PLAN_PLANNER_H

#include "plan/internal.h"

#define LM__PLAN_MAX_MAT 4  /* materializations of one value tracked per state */
#define LM__PLAN_MAX_REQ 16 /* layouts requested of one value by its consumers */
#define LM__PLAN_REASON 240

/* Ops the planner lays out like their first input, shard by shard (the graph's
 * elementwise ops plus swiglu), and ops that need whole rows of their last axis
 * (the graph's row ops); both are planned by following a layout of in[0]. */
int lm__plan_is_elementwise(lm__gopk k);
int lm__plan_is_rows(lm__gopk k);
/* The layout a following op o wants of its input i >= 1, in that input's own space,
 * when its output (and in[0]) takes layout lx: lx itself for a same-shape operand;
 * for an operand indexing only some of lx's dims — a [N] bias or scale and RoPE's
 * inv_freq [D/2] (lx's last dim), RoPE positions [B, T] (lx's first two) — lx
 * projected onto those dims (lm__plan_layout_project). *narrow receives 1 for the
 * projected ones. 0 when the layout cannot be expressed. */
int lm__plan_follow_input(const lm_graph *g, const lm__gop *o, int i, const lm__plan_layout *lx,
                          lm__plan_layout *l, int *narrow);

/* ---- cost model (cost.c) ---------------------------------------------------------------------- */
double lm__plan_cost_matmul(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n, int64_t k);
/* lm__plan_cost_matmul split into the call overhead, the weight passes' fixed costs and
 * the row work as if the shape were a multiple of the grain, and the grain padding
 * (what rounding the shape up to the grain adds to both); they sum to the cost. */
enum { LM__PLAN_MM_CALL, LM__PLAN_MM_PASS, LM__PLAN_MM_ROWS, LM__PLAN_MM_PAD, LM__PLAN_MM_PARTS };
/* A fused epilogue on a matmul's or a reduction's final write: + bias[col], then GeLU
 * (tanh form) or SiLU, one rounding to the output dtype. The code is kept in the
 * call's i[2] and the mid op's epi; 0 = none. */
enum { LM__PLAN_EPI_BIAS = 1, LM__PLAN_EPI_GELU = 2, LM__PLAN_EPI_SILU = 4 };
int lm__plan_epi_valid(int64_t epi); /* known bits, not GeLU and SiLU together */
/* The epilogue's cycles on elems outputs: its FLOPs, transcendentals and the bias read,
 * no call and no pass over the output of its own. */
double lm__plan_cost_epilogue(const lm_plan_machine *m, lm_dtype dt, int64_t elems, int64_t epi);
void lm__plan_cost_matmul_parts(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n,
                                int64_t k, double parts[LM__PLAN_MM_PARTS]);
/* One orientation only: the [k, n] operand held as weights, `rows` streamed (how a
 * measured kernel was run; the calibration in docs/PLAN.md fits this form). */
double lm__plan_cost_matmul_fixed(const lm_plan_machine *m, lm_dtype dt, int64_t batch, int64_t rows, int64_t n,
                                  int64_t k);
double lm__plan_cost_vector(const lm_plan_machine *m, lm_dtype dt, double bytes, double flops, double transc);
double lm__plan_cost_elementwise(const lm_plan_machine *m, lm__gopk k, lm_dtype dt, int64_t elems);
double lm__plan_cost_rows(const lm_plan_machine *m, lm__gopk k, lm_dtype dt, int64_t rows, int64_t n);
/* RoPE of tokens x heads rows of d elements (angles once per token and frequency). */
double lm__plan_cost_rope(const lm_plan_machine *m, lm_dtype dt, int64_t tokens, int64_t heads, int64_t d);
/* Kernel cycles of a following (elementwise or row) op of kind k on one shard of lx. */
double lm__plan_cost_follow(const lm_plan_machine *m, lm__gopk k, const lm__plan_layout *lx);
double lm__plan_cost_copy(const lm_plan_machine *m, int64_t bytes);
double lm__plan_cost_reduce(const lm_plan_machine *m, lm_dtype in_dt, lm_dtype out_dt, int64_t out_elems,
                            int64_t add_elems);
double lm__plan_cost_exchange(const lm_plan_machine *m, const lm__plan_xcost *x);
/* Exchange + local copy or partial-sum kernel of converting s into d. */
double lm__plan_cost_redist(const lm_plan_machine *m, const lm__plan_layout *s, const lm__plan_layout *d,
                            lm__plan_ws *w, lm__plan_xcost *x_out);

/* ---- candidates -------------------------------------------------------------------------------- */
typedef enum lm__plan_ck { LM__PLAN_C_GEMM, LM__PLAN_C_FLASH } lm__plan_ck;

typedef struct lm__plan_cand {
    lm__plan_ck kind;
    int64_t grid[4];         /* gemm: b, m, n, k splits; flash: heads, query, kv splits, steps */
    int64_t steps;           /* gemm: serial K steps (operands streamed in per step), 1 = single pass */
    lm__plan_layout step[2]; /* gemm with steps > 1: step-0 layouts of A and B (own space, windowed) */
    int nin;
    int in_param[3];            /* 1: input i is a parameter placed in in_view[i] for free */
    lm__plan_layout in_view[3]; /* required input layouts in the input value's own space */
    lm__plan_layout in_root[3]; /* the same in the root value's space */
    int has_partial;
    lm__plan_layout partial; /* gemm with a k split: the partial-sum layout */
    lm__plan_layout out;     /* final output layout */
    double compute;          /* kernel cycles on the busiest tile (all flash steps) */
    double reduce;           /* partial-sum reduction into 'out' */
    double estimate;         /* compute + reduce + input-exchange estimate (ranking only) */
    int64_t work_bytes;      /* per-tile activation working set (inputs, partials, output) */
    int64_t param_bytes;     /* per-tile bytes of the parameters it places (resident to the end) */
} lm__plan_cand;

/* ---- search units, states, trace --------------------------------------------------------------- */
typedef enum lm__plan_uk { LM__PLAN_U_OP, LM__PLAN_U_ATTN, LM__PLAN_U_REPEAT } lm__plan_uk;

typedef struct lm__plan_unit {
    lm__plan_uk kind;
    int op;                /* OP: the op; ATTN: the score matmul or the attention op; REPEAT: -1 */
    int region;            /* REPEAT: region index */
    int child_begin, next; /* children units are [child_begin, next) ; next sibling = next */
} lm__plan_unit;

typedef struct lm__plan_trace {
    int parent; /* previous decision, -1 at the start */
    int unit;
    int choice;                    /* candidate index, -1 for layout-following ops */
    int src[3], req[3];            /* per input: source and required layout ids (root space); -1 none */
    int out;                       /* output layout id (REPEAT: carry layout of carried value 0) */
    int carry[LM__G_MAX_CARRY]; /* REPEAT: carry layout ids */
    int body;                      /* nested search's last node (REPEAT, ATTN materialized), else -1 */
    int start;                     /* nested search's start marker node */
    double cost;                   /* cycles this decision adds */
} lm__plan_trace;

typedef struct lm__plan_state {
    double cost;
    double resident; /* per-tile bytes of parameters placed so far (max over tiles) */
    int trace;
    int keep;     /* prune's scratch: 0 drop, 1 keep, 2 a frontier candidate */
    int32_t *mat; /* [nvalues][LM__PLAN_MAX_MAT] layout ids of root values, -1 empty */
} lm__plan_state;

typedef struct lm__plan_planner {
    const lm_graph *g;   /* borrowed (the plan's copy) */
    const lm_plan_machine *m; /* borrowed */
    lm_plan_options opt;
    lm__plan_ws ws;
    /* interned layouts */
    lm__plan_layout *lay; /* [nlay] */
    int64_t nlay, cap_lay;
    int32_t *lay_index; /* [lay_hcap] open addressing, -1 empty */
    int64_t lay_hcap;
    /* memoized conversion costs: key (src id, dst id) */
    uint64_t *memo_key; /* [memo_cap], 0 = empty */
    double *memo_val;   /* [memo_cap] */
    int64_t memo_cap, memo_n;
    /* candidates per op */
    lm__plan_cand **cands; /* [nops] */
    int *ncands;           /* [nops] */
    lm__plan_cand **flash; /* [nops] indexed by the score matmul op */
    int *nflash;           /* [nops] */
    /* requested layouts per value (root space of the value itself) */
    int32_t *req; /* [nvalues][LM__PLAN_MAX_REQ] layout ids, -1 empty */
    /* units */
    lm__plan_unit *units; /* [nunits] */
    int64_t nunits, cap_units;
    /* decisions */
    lm__plan_trace *trace; /* [ntrace] */
    int64_t ntrace, cap_trace;
    int64_t costed; /* candidate evaluations */
    int64_t states_made;
    char reason[320]; /* why the last follow op had no usable input layout */
    char *op_reason;  /* [nops][LM__PLAN_REASON] why an op has no candidate ("" if it has) */
} lm__plan_planner;

/* planner.c */
lm_status lm__plan_planner_init(lm__plan_planner *P, const lm_graph *g, const lm_plan_machine *m,
                                const lm_plan_options *o);
void lm__plan_planner_free(lm__plan_planner *P);
/* Interns l; returns its id (>= 0) or -1 on allocation failure. */
int lm__plan_layout_id(lm__plan_planner *P, const lm__plan_layout *l);
/* Memoized cost of converting layout id s to id d (0 when equal). */
double lm__plan_conv_cost(lm__plan_planner *P, int s, int d);
/* Adds a request for layout id to value v (deduplicated, capped). */
void lm__plan_request(lm__plan_planner *P, int v, int id);
int64_t lm__plan_planner_bytes(const lm__plan_planner *P);

/* gemm_plan.c: candidates of a matmul op (uses requests on its output). */
lm_status lm__plan_gemm_candidates(lm__plan_planner *P, int op);
/* A layout spreading a value's outermost splittable dim over the tiles. */
void lm__plan_spread_layout(const lm__plan_planner *P, const lm__gvalue *v, lm__plan_layout *l);
/* Cycles of streaming a stepped matmul's operands from layouts a_id / b_id. */
double lm__plan_gemm_stream_cost(lm__plan_planner *P, int op, const lm__plan_cand *c, int a_id, int b_id);
/* The step-s layout of a streamed operand and its window (dim, [lo, hi)). */
void lm__plan_gemm_step_layout(const lm__plan_cand *c, int operand, int64_t s, lm__plan_layout *l,
                               lm__plan_window *win);
/* Memo of arbitrary 64-bit keys (conversion and streaming costs). */
int lm__plan_memo_get(const lm__plan_planner *P, uint64_t key, double *val);
void lm__plan_memo_put(lm__plan_planner *P, uint64_t key, double val);
/* attn_plan.c: fusible score-softmax-value triple starting at op (fills ops[3]). */
int lm__plan_attention_match(const lm_graph *g, int op, int ops[3]);
/* An attention the flash path runs: the pattern above on [H, T, D] values, or the
 * attention op on token-major [1, T, H, D] values with grouped kv heads, a causal
 * mask and a window. Both are read through canonical index spaces q [H, Tq, D],
 * K^T [Hkv, D, Tk], V [Hkv, Tk, Dv] and out [H, Tq, Dv]: map[c] is the value dim
 * holding canonical dim c (the op's batch dim, of extent 1, stays at index 0). */
typedef struct lm__plan_attn {
    int op;                 /* the unit's op: the score matmul or the attention op */
    int q, kt, v, out;      /* graph values: q, K^T (pattern) or k (op), v, the output */
    int8_t qmap[3], kmap[3], vmap[3], omap[3];
    int64_t H, Hkv, Tq, Tk, D, Dv;
    int64_t group;          /* query heads per kv head: query head h reads kv head h / group */
    double scale;
    int causal;             /* query i sees keys j <= i + Tk - Tq ... */
    int64_t window;         /* ... and, when > 0, only j > i + Tk - Tq - window */
    lm_dtype dt, out_dt;
} lm__plan_attn;
/* The attention unit starting at op (a pattern's score matmul or an attention op); 0 if none. */
int lm__plan_attn_of(const lm_graph *g, int op, lm__plan_attn *a);
/* Blocks of a flash grid (gh, gq, gkv, steps): query heads, query rows, keys per step
 * and tile, and the most kv heads one query-head block reads. */
typedef struct lm__plan_flash_geom {
    int64_t g[4];
    int64_t bh, bq, bs, bkv;
} lm__plan_flash_geom;
void lm__plan_flash_geom_of(const lm__plan_attn *a, const int64_t *grid, lm__plan_flash_geom *f);
/* kv heads [*k0, *k1) read by query-head block ih. */
void lm__plan_flash_kv_heads(const lm__plan_attn *a, const lm__plan_flash_geom *f, int64_t ih, int64_t *k0,
                             int64_t *k1);
/* Keys of kv block j seen by query block iq: 0 none (the block is skipped), 1 all,
 * 2 some (the block is masked). */
int lm__plan_flash_visible(const lm__plan_attn *a, const lm__plan_flash_geom *f, int64_t iq, int64_t j);
lm_status lm__plan_flash_candidates(lm__plan_planner *P, const lm__plan_attn *a);
/* One piece of a flash step's K^T (which = 0) or V (which = 1) stream: one kv head of
 * kv block j = s*gkv + ikv, needed by the query-head blocks [ih0, ih1). */
typedef struct lm__plan_flash_piece {
    int64_t ih0, ih1, ikv, j;    /* destinations: tiles (ih*gq + iq)*gkv + ikv, iq whose block sees block j */
    int64_t src_shard, src_tile; /* in the source (root) layout */
    int64_t rlo[LM__PLAN_MAX_DIMS], rhi[LM__PLAN_MAX_DIMS]; /* the piece in root coordinates */
    int64_t plo[3], phi[3];      /* the piece in canonical coordinates */
    int64_t vlo[3];              /* origin of the kv block's step box (canonical; dim 0 per destination) */
} lm__plan_flash_piece;
typedef void (*lm__plan_flash_piece_fn)(void *ctx, const lm__plan_flash_piece *p);
lm_status lm__plan_flash_step_pieces(const lm_graph *g, const lm__plan_attn *a, const int64_t *grid, int which,
                                     int64_t s, const lm__plan_layout *src, lm__plan_flash_piece_fn fn, void *ctx);
/* State-dependent flash cost: K/V streaming exchanges from their current layouts. */
double lm__plan_flash_stream_cost(lm__plan_planner *P, const lm__plan_cand *c, const lm__plan_attn *a, int k_layout,
                                  int v_layout);

/* search.c */
lm_status lm__plan_search(lm__plan_planner *P, int *best_trace, double *best_cost, int *finals, int *nfinals,
                          int max_finals);

/* ---- mid program ----------------------------------------------------------------------------- */
typedef enum lm__plan_mk {
    LM__PLAN_M_COMPUTE,   /* kernel grid over the output's shards */
    LM__PLAN_M_COPY,      /* on-tile conversion (layout or view materialization) */
    LM__PLAN_M_EXCHANGE,  /* move shards between tiles (multicast when one source feeds many) */
    LM__PLAN_M_REDUCE,    /* add partial sums of contributors into a full layout */
    LM__PLAN_M_FLASH,     /* streamed attention: K/V blocks exchanged step by step */
    LM__PLAN_M_REPEAT,    /* ops [index+1, body_end) run count times */
    LM__PLAN_M_CHECKPOINT /* compare a value with the reference */
} lm__plan_mk;

typedef struct lm__plan_mval {
    int value;         /* graph value */
    lm__plan_layout l; /* layout in the value's own space */
    int view_of;       /* mid value whose buffers this view reads, -1 for storage owners */
    int placed;        /* 1: input/parameter present before the program starts */
    int stacked;       /* > 1: a per-iteration parameter with this many copies */
    int region;        /* repeat region the value lives in, -1 top level */
} lm__plan_mval;

typedef struct lm__plan_mop {
    lm__plan_mk kind;
    int gop;   /* graph op, -1 for conversions */
    int out;   /* mid value written */
    int in[3]; /* mid values read */
    int nin;
    int64_t grid[4];         /* gemm / flash grid (description) */
    int body_end;            /* REPEAT */
    int64_t count;           /* REPEAT */
    int check;               /* CHECKPOINT: graph checkpoint index, or -1 - value for outputs */
    int64_t steps;           /* COMPUTE matmul: serial K steps with streamed operands */
    lm__plan_layout step[2]; /* their step-0 layouts */
    int flash_k, flash_v;    /* FLASH: the K and V view values (graph ids) */
    int epi;                 /* COMPUTE matmul / REDUCE: fused epilogue (LM__PLAN_EPI_*; in[nin-1] is the bias) */
    double cost;             /* predicted cycles of one execution */
} lm__plan_mop;

typedef struct lm__plan_mid {
    lm__plan_mval *vals; /* [nvals] */
    int64_t nvals, cap_vals;
    lm__plan_mop *ops; /* [nops] */
    int64_t nops, cap_ops;
    double cost; /* predicted total (repeats counted) */
} lm__plan_mid;

lm_status lm__plan_mid_build(lm__plan_planner *P, int trace_end, lm__plan_mid *mid);
void lm__plan_mid_free(lm__plan_mid *mid);
const char *lm__plan_mid_kind_name(lm__plan_mk k);

#endif
