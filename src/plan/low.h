/* plan/low.h — the low program: per-tile kernel calls with SRAM buffers, slotted
 * exchange phases, SRAM allocation, the simulator's kernels and the checkers.
 *
 * A step is a compute phase (calls grouped by tile, executed in order per tile), an
 * exchange phase (transfers assigned to slots: per slot a tile sends at most one
 * stream, possibly multicast, and receives at most one), a checkpoint, or the
 * begin/end of a repeat whose body runs count times. Operands address a box inside a
 * buffer with element strides; a buffer has one SRAM offset per tile for the whole
 * program (stacked per-iteration parameters add iteration * bytes).
 */
#ifndef LOOM_PLAN_LOW_H
#define LOOM_PLAN_LOW_H

#include "plan/planner.h"

typedef enum lm__plan_kk {
    LM__PLAN_K_MATMUL,        /* op2[b,m,n] (+= if i[0]) sum_k op0[b,m,k] op1[b,k,n], f32 accumulation */
    LM__PLAN_K_BIAS,          /* op2 = op0 + op1[n] (op1 is 1-D, broadcast over the leading dims) */
    LM__PLAN_K_UNARY,         /* op1 = f(op0); i[0]: 0 gelu (tanh), 1 silu */
    LM__PLAN_K_BINARY,        /* op2 = op0 (+|*) op1; i[0]: 0 add, 1 mul, 2 silu(op0) * op1 (swiglu) */
    LM__PLAN_K_SOFTMAX,       /* op1 = softmax(f[0] * op0) over the last dim */
    LM__PLAN_K_LAYERNORM,     /* op1 = norm(op0) * op2 (+ op3); f[0] eps */
    LM__PLAN_K_RMSNORM,       /* op1 = op0 / rms(op0) * op2; f[0] eps */
    LM__PLAN_K_COPY,          /* op1 = op0 (dtype converting) */
    LM__PLAN_K_REDUCE,        /* op0 = (op1 if present) + sum of i[0] pieces of op2 (i[1] elements apart) */
    LM__PLAN_K_FLASH_INIT,    /* op0 state [rows, dv+2] = (0..., -inf, 0) */
    LM__PLAN_K_FLASH_UPDATE,  /* op0 S [h, rows, n] f32, op1 P [h, rows, n], op2 state: online softmax, f[0] scale;
                                 i[0] = 1: key kj is seen by row qi only if kj <= qi + i[1] and, when i[2] > 0,
                                 kj > qi + i[1] - i[2] (causal / windowed block) */
    LM__PLAN_K_FLASH_COMBINE, /* op0 state += i[0] states in op1 (i[1] elements apart) */
    LM__PLAN_K_FLASH_FINAL,   /* op1 [rows, dv] = O / l of state op0 */
    LM__PLAN_K_ROPE,          /* op1 [b, t, h, d] = rope(op0) at positions op2 [b, t] (i32) with inv_freq op3
                                 [d/2] (f32); f[0] attention factor; reads each pair before writing it */
    LM__PLAN_K_COUNT
} lm__plan_kk;

typedef struct lm__plan_opnd {
    int32_t buf; /* buffer id, -1 = absent */
    int32_t ndim;
    lm_dtype dtype;
    int64_t off; /* element offset of the box origin inside the buffer */
    int32_t dims[LM__PLAN_MAX_DIMS];
    int32_t strides[LM__PLAN_MAX_DIMS]; /* elements */
} lm__plan_opnd;

typedef struct lm__plan_call {
    int32_t tile;
    int16_t kernel; /* lm__plan_kk */
    int16_t nops;
    lm__plan_opnd op[4];
    float f[2];
    int64_t i[3];
    double cycles; /* cost model */
} lm__plan_call;

typedef struct lm__plan_xdst {
    int32_t tile;
    lm__plan_opnd dst;
} lm__plan_xdst;

typedef struct lm__plan_xfer {
    int32_t src_tile;
    int32_t slot;
    lm__plan_opnd src;
    int64_t bytes;
    int64_t dst0; /* destinations xdst[dst0 .. dst0 + ndst) (multicast) */
    int32_t ndst;
} lm__plan_xfer;

typedef enum lm__plan_sk {
    LM__PLAN_S_COMPUTE,
    LM__PLAN_S_EXCHANGE,
    LM__PLAN_S_CHECK,
    LM__PLAN_S_REPEAT,
    LM__PLAN_S_END
} lm__plan_sk;

typedef struct lm__plan_step {
    lm__plan_sk kind;
    int32_t mop;    /* mid op implemented */
    int64_t c0, c1; /* COMPUTE: calls [c0, c1), sorted by tile */
    int64_t x0, x1; /* EXCHANGE: transfers [x0, x1) */
    int32_t nslots;
    int64_t count;       /* REPEAT */
    int32_t match;       /* REPEAT <-> END */
    int32_t check, mval; /* CHECK: graph checkpoint (or -1 - value), mid value */
    char label[48];
} lm__plan_step;

typedef struct lm__plan_buf {
    int32_t tile;
    int32_t mval;        /* owning mid value, -1 for scratch */
    int32_t alias;       /* -1, or the buffer whose bytes this one reuses (in place) */
    int32_t first, last; /* live step interval */
    int64_t bytes;       /* one copy, aligned */
    int64_t copies;      /* per-iteration copies (stacked parameters) */
    int64_t offset;      /* SRAM offset in bytes */
    int placed;          /* filled before the program starts */
} lm__plan_buf;

typedef struct lm__plan_low {
    int64_t tiles;
    lm__plan_step *steps; /* [nsteps] */
    int64_t nsteps, cap_steps;
    lm__plan_call *calls; /* [ncalls] */
    int64_t ncalls, cap_calls;
    lm__plan_xfer *xfers; /* [nxfers] */
    int64_t nxfers, cap_xfers;
    lm__plan_xdst *xdst; /* [nxdst] */
    int64_t nxdst, cap_xdst;
    lm__plan_buf *bufs; /* [nbufs] */
    int64_t nbufs, cap_bufs;
    int32_t *buf_of; /* [nmvals][tiles] buffer of an owner mid value on a tile, -1 none */
    int64_t nmvals;
    int64_t *peak;       /* [tiles] allocated SRAM peak */
    int64_t *live_bound; /* [tiles] max live bytes */
} lm__plan_low;

/* low.c */
lm_status lm__plan_low_build(const lm__plan_planner *P, const lm__plan_mid *mid, lm__plan_low *low);
void lm__plan_low_free(lm__plan_low *low);
int lm__plan_mid_owner(const lm__plan_mid *mid, int mv);
/* Operand for the shard of mid value mv on tile t restricted to box [lo, hi). */
lm_status lm__plan_low_operand(const lm__plan_low *low, const lm__plan_mid *mid, int mv, int64_t t, const int64_t *lo,
                               const int64_t *hi, lm__plan_opnd *o);
lm_status lm__plan_low_add_call(lm__plan_low *low, const lm__plan_call *c);
lm_status lm__plan_low_add_buf(lm__plan_low *low, int64_t tile, int mval, int64_t bytes, int64_t *id);
lm_status lm__plan_low_add_step(lm__plan_low *low, lm__plan_sk kind, int mop, const char *label, int64_t *id);
/* Sorts a compute step's calls by tile (stable: program order per tile kept). */
void lm__plan_low_sort_calls(lm__plan_low *low, int64_t c0, int64_t c1);
/* Assigns transfers [x0, x1) to slots; returns the slot count. */
int32_t lm__plan_low_slot(lm__plan_low *low, int64_t x0, int64_t x1);
double lm__plan_call_cycles(const lm_plan_machine *m, const lm__plan_call *c);
int64_t lm__plan_opnd_elems(const lm__plan_opnd *o);

/* Projection state shared by low.c and low_move.c. */
typedef struct lm__plan_proj {
    const lm__plan_planner *P; /* borrowed */
    const lm__plan_mid *mid;   /* borrowed */
    lm__plan_low *low;         /* being built */
    lm__plan_ws ws;
    int32_t *shard_at; /* [nmvals][tiles] shard of a mid value's layout on a tile, -1 none */
    int32_t *last_use; /* [nmvals] last mid op reading the owner */
} lm__plan_proj;
int32_t lm__plan_proj_shard_at(const lm__plan_proj *p, int mv, int64_t t);
lm_status lm__plan_proj_shard_box(const lm__plan_proj *p, int mv, int64_t t, int64_t *lo, int64_t *hi);
/* Pads an operand to 3 dims (leading extent 1) or inserts a broadcast batch dim. */
void lm__plan_proj_to3(lm__plan_opnd *o, int32_t batch);
/* An empty call of kernel k on tile t: operands unset (buf -1), cycles 0. */
lm__plan_call lm__plan_proj_call(int64_t t, lm__plan_kk k);
/* Appends c with its cycles from the cost model. */
lm_status lm__plan_proj_add_call(lm__plan_proj *p, lm__plan_call *c);
/* low_move.c: mid op i (Copy/Exchange, Reduce, stepped matmul Compute). */
lm_status lm__plan_low_convert(lm__plan_proj *p, int i);
lm_status lm__plan_low_reduce(lm__plan_proj *p, int i);
lm_status lm__plan_low_stream_matmul(lm__plan_proj *p, int i);

/* low_flash.c */
lm_status lm__plan_low_flash(const lm__plan_planner *P, const lm__plan_mid *mid, int mop, lm__plan_low *low);

/* sram_alloc.c: liveness, then per-tile offsets; LM_UNSUPPORTED when a tile overflows. */
lm_status lm__plan_sram_allocate(const lm_plan_machine *m, const lm__plan_mid *mid, const lm_graph *g,
                                 lm__plan_low *low);

/* kernels.c: one call on one tile's memory; scratch holds at least lm__plan_kernel_scratch floats. */
int64_t lm__plan_kernel_scratch(const lm__plan_low *low);
void lm__plan_kernel_run(const lm__plan_call *c, uint8_t *mem, const lm__plan_low *low, int64_t iter, float *scratch);
/* Element access helpers shared with the simulator (f32, f16 or i32 storage). */
float lm__plan_load(const uint8_t *p, lm_dtype dt);
void lm__plan_store(uint8_t *p, lm_dtype dt, float v);
/* Byte address of operand o's element 0 in a tile memory at repeat iteration iter. */
uint8_t *lm__plan_opnd_base(const lm__plan_low *low, const lm__plan_opnd *o, uint8_t *mem, int64_t iter);

/* check.c: independent validation of a low program (see lm_plan_check). */
lm_status lm__plan_check_low(const lm_plan_machine *m, const lm__plan_mid *mid, const lm__plan_low *low);

/* sim.c: the simulated timeline (kind 0 compute superstep, 1 exchange phase). */
int64_t lm__plan_sim_phases(const lm_plan_sim *s);
void lm__plan_sim_phase(const lm_plan_sim *s, int64_t i, int *kind, int32_t *step, int64_t *iter, double *start,
                        double *cycles, double *sync, int64_t *bytes);

/* ---- the compiled plan (plan.c) ------------------------------------------------------------------ */
struct lm_plan {
    lm_graph *g; /* the plan's own copy of the graph */
    lm_plan_machine m;
    lm_plan_options opt;
    lm__plan_mid mid;
    lm__plan_low low;
    double search_cost; /* the search's cost of the chosen trace */
    int64_t search_sram; /* SRAM per tile the search planned within (< m.sram_bytes after a retry) */
    int search_attempts; /* searches run (1 unless an allocation overflowed, see plan.c) */
    lm_plan_summary summary;
};

/* timeline.c: the gap between a plan's schedule (the low program with the simulator's
 * timing rules, the total of lm_plan_simulate) and the compute bound, split along the
 * critical path (the busiest tile of each superstep, the longest transfer of each
 * exchange slot) so that the categories add up to the total exactly. v[G_BOUND] is
 * the compute bound, v[G_MM_WORK] the matmul row work above it. */
enum {
    G_BOUND, G_MM_WORK, G_MM_CALL, G_MM_PASS, G_MM_PAD, G_KERNEL, G_REDUCE, G_COPY, G_EXCH, G_SYNC, G_COUNT
};
typedef struct lm__plan_gap {
    double total;
    double v[G_COUNT];
    const char *key[G_COUNT], *label[G_COUNT]; /* static strings */
} lm__plan_gap;
lm_status lm__plan_gap_get(const lm_plan *p, lm__plan_gap *out);

/* data.c: the inputs and parameters a simulation starts from (the caller's data
 * source or generated data, see data.c), rounded to their dtypes. */
typedef struct lm__plan_data {
    const lm_graph *g; /* borrowed */
    uint64_t seed;
    float **given; /* [nvalues] caller data of inputs/parameters ([copies * numel]), NULL without a source */
} lm__plan_data;
/* Asks o->fill (when set) for every input and parameter; errors name the value. */
lm_status lm__plan_data_init(lm__plan_data *d, const lm_graph *g, const lm_plan_sim_options *o);
void lm__plan_data_free(lm__plan_data *d);
/* Value v (an input or parameter) at repeat iteration iter: dense row-major [numel] floats. */
void lm__plan_data_get(const lm__plan_data *d, int v, int64_t iter, float *out);

/* ref.c: the CPU reference. expected[k] receives, for check target k (graph
 * checkpoints first, then outputs in value order), count(k) dense arrays (one per
 * repeat iteration) of the value's elements. */
typedef struct lm__plan_ref {
    int ntargets;
    int *value;     /* [ntargets] graph value of each target */
    int64_t *count; /* [ntargets] iterations recorded */
    float **data;   /* [ntargets] [count * numel] */
} lm__plan_ref;
lm_status lm__plan_ref_run(const lm_graph *g, const lm__plan_data *data, lm_threadpool *pool, lm__plan_ref *ref);
void lm__plan_ref_free(lm__plan_ref *ref);

#endif
