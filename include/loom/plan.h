/* loom/plan.h — the tile compiler: plan a fixed-shape graph onto a many-tile machine
 * (private SRAM per tile, bulk-synchronous compute/exchange phases) and run the
 * compiled program in a simulator with real data.
 *
 * Layers: a graph (fixed-shape SSA values and ops, views, Repeat) -> a mid program
 * (whole-device Compute/Copy/Exchange/Reduce/Repeat/Checkpoint over chosen layouts)
 * -> a low program (per-tile kernel calls with SRAM offsets and slotted exchange
 * phases). The machine description (tiles, SRAM, rates, exchange, sync) is the only
 * place target facts live. A plan is accepted only when its simulated results match
 * a CPU reference of the graph (lm_plan_simulate with check enabled).
 *
 * Values are referred to by lm_plan_value handles returned by the builders; every
 * builder validates shapes/dtypes and names the op in its error detail.
 */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "loom/base.h"
#include "loom/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- machine description --------------------------------------------------------- */
typedef struct lm_plan_machine lm_plan_machine;

/* Presets: "ipu21" (1,472 tiles x 624 KiB, 1.5 GHz; constants and sources in
 * docs/PLAN.md), "small16" (16 tiles x 64 KiB) and "small4" (4 tiles x 32 KiB) with
 * ipu21's per-tile rates. LM_NOT_FOUND for other names. */
lm_status lm_plan_machine_preset(const char *name, lm_plan_machine **out);
/* A JSON object (see docs/PLAN.md): "base" names a preset to start from, other keys
 * override it. Errors name the source and the field (LM_PARSE_ERROR). */
lm_status lm_plan_machine_parse(const char *json, const char *source, lm_plan_machine **out);
lm_status lm_plan_machine_load(const char *path, lm_plan_machine **out);
void lm_plan_machine_destroy(lm_plan_machine *m);
const char *lm_plan_machine_name(const lm_plan_machine *m);
int64_t lm_plan_machine_tiles(const lm_plan_machine *m);
int64_t lm_plan_machine_sram_bytes(const lm_plan_machine *m); /* per tile */
double lm_plan_machine_clock_hz(const lm_plan_machine *m);
/* Matrix-unit FLOP per cycle per tile for operands of dtype (f16 or f32), 0 otherwise. */
double lm_plan_machine_matmul_flops(const lm_plan_machine *m, lm_dtype dt);
/* The complete description as a JSON object; caller frees *out with lm_free. */
lm_status lm_plan_machine_to_json(const lm_plan_machine *m, char **out);

/* ---- graph IR ------------------------------------------------------------------------- */
typedef struct lm_plan_graph lm_plan_graph;
typedef int32_t lm_plan_value;

typedef enum lm_plan_unary { LM_PLAN_GELU = 0, LM_PLAN_SILU = 1 } lm_plan_unary;
typedef enum lm_plan_binary { LM_PLAN_ADD = 0, LM_PLAN_MUL = 1 } lm_plan_binary;

lm_status lm_plan_graph_create(lm_plan_graph **out);
void lm_plan_graph_destroy(lm_plan_graph *g);

/* Activations fed by the caller; the simulator fills them with N(0, std^2). Shapes
 * have 1..4 dimensions; dtype f32 or f16. */
lm_status lm_plan_graph_input(lm_plan_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                              double std, lm_plan_value *out);
/* Resident parameters (weights, biases, norm scales) filled with mean + N(0, std^2).
 * Inside a Repeat body a parameter has one copy per iteration. */
lm_status lm_plan_graph_param(lm_plan_graph *g, const char *name, lm_dtype dt, int ndim, const int64_t *shape,
                              double mean, double std, lm_plan_value *out);
/* a [..., M, K] x b [..., K, N] -> [..., M, N] in out_dt with f32 accumulation. a and
 * b have the same leading (batch) dims, or b has none (shared weights). */
lm_status lm_plan_graph_matmul(lm_plan_graph *g, const char *name, lm_plan_value a, lm_plan_value b, lm_dtype out_dt,
                               lm_plan_value *out);
/* x [..., N] + bias [N]. */
lm_status lm_plan_graph_bias_add(lm_plan_graph *g, const char *name, lm_plan_value x, lm_plan_value bias,
                                 lm_plan_value *out);
/* GeLU uses the tanh approximation (gelu_pytorch_tanh). */
lm_status lm_plan_graph_unary(lm_plan_graph *g, const char *name, lm_plan_unary op, lm_plan_value x,
                              lm_plan_value *out);
/* Same shapes and dtypes. */
lm_status lm_plan_graph_binary(lm_plan_graph *g, const char *name, lm_plan_binary op, lm_plan_value a, lm_plan_value b,
                               lm_plan_value *out);
/* softmax(scale * x) over the last axis. */
lm_status lm_plan_graph_softmax(lm_plan_graph *g, const char *name, lm_plan_value x, double scale, lm_plan_value *out);
/* Over the last axis; gamma/beta [N] (beta may be -1 for none). */
lm_status lm_plan_graph_layer_norm(lm_plan_graph *g, const char *name, lm_plan_value x, lm_plan_value gamma,
                                   lm_plan_value beta, double eps, lm_plan_value *out);
lm_status lm_plan_graph_rms_norm(lm_plan_graph *g, const char *name, lm_plan_value x, lm_plan_value gamma, double eps,
                                 lm_plan_value *out);
/* Views (no data movement): reshape keeps the element order; permute reorders axes
 * (out axis i = in axis perm[i]). split_heads [T, H*D] -> [H, T, D] and merge_heads
 * [H, T, D] -> [T, H*D] are reshape+permute compositions. */
lm_status lm_plan_graph_reshape(lm_plan_graph *g, const char *name, lm_plan_value x, int ndim, const int64_t *shape,
                                lm_plan_value *out);
lm_status lm_plan_graph_permute(lm_plan_graph *g, const char *name, lm_plan_value x, const int *perm,
                                lm_plan_value *out);
lm_status lm_plan_graph_split_heads(lm_plan_graph *g, const char *name, lm_plan_value x, int64_t heads,
                                    lm_plan_value *out);
lm_status lm_plan_graph_merge_heads(lm_plan_graph *g, const char *name, lm_plan_value x, lm_plan_value *out);
/* Repeat an identical block count times. outer[i] (defined before) seeds the body
 * input inner[i]; after the body, repeat_end(body_out) carries body_out[i] into the
 * next iteration's inner[i] (same shape and dtype) and returns the last iteration's
 * values as outer_out[i]. At most 4 carried values; no nesting. */
lm_status lm_plan_graph_repeat_begin(lm_plan_graph *g, int64_t count, int n, const lm_plan_value *outer,
                                     lm_plan_value *inner);
lm_status lm_plan_graph_repeat_end(lm_plan_graph *g, int n, const lm_plan_value *body_out, lm_plan_value *outer_out);
/* Marks a value as a program output (compared with the reference). */
lm_status lm_plan_graph_output(lm_plan_graph *g, lm_plan_value v);
/* A named value the simulator validates against the reference where it is produced
 * (every iteration inside a Repeat). */
lm_status lm_plan_graph_checkpoint(lm_plan_graph *g, lm_plan_value v, const char *name);

/* ---- workloads --------------------------------------------------------------------------- */
typedef enum lm_plan_workload_kind {
    LM_PLAN_WL_GEMM = 0,      /* Y[M,N] = X[M,K] W[K,N] */
    LM_PLAN_WL_MLP = 1,       /* SigLIP MLP: gelu(x W1 + b1) W2 + b2 */
    LM_PLAN_WL_ATTENTION = 2, /* SigLIP attention with Q/K/V/O projections */
    LM_PLAN_WL_MLP_REPEAT = 3 /* the MLP block repeated */
} lm_plan_workload_kind;

typedef struct lm_plan_workload {
    lm_plan_workload_kind kind;
    int64_t m, n, k;                      /* gemm */
    int64_t tokens, width, hidden, heads; /* mlp / attention */
    int64_t repeat;                       /* mlp-repeat */
    lm_dtype dtype;                       /* f16 (default) or f32 */
} lm_plan_workload;

/* SigLIP sizes: 729 tokens, width 1152, hidden 4304, 16 heads; gemm 4096^3; f16. */
void lm_plan_workload_default(lm_plan_workload_kind kind, lm_plan_workload *w);
lm_status lm_plan_workload_build(const lm_plan_workload *w, lm_plan_graph **out);
/* "gemm", "mlp", "attention", "mlp-repeat"; NULL for invalid kinds. */
const char *lm_plan_workload_name(lm_plan_workload_kind kind);

/* ---- compile ----------------------------------------------------------------------------- */
typedef enum lm_plan_attention {
    LM_PLAN_ATTN_AUTO = 0,        /* cheapest of the two */
    LM_PLAN_ATTN_FLASH = 1,       /* K/V streamed in blocks, online softmax */
    LM_PLAN_ATTN_MATERIALIZED = 2 /* scores materialized across tiles */
} lm_plan_attention;

typedef struct lm_plan_options {
    int beam_width; /* states kept per step (default 8) */
    int exhaustive; /* 1: enumerate every combination instead (small graphs) */
    lm_plan_attention attention;
    int64_t gemm_grid[3]; /* force every matmul's M,N,K split; 0 = free */
    lm_dtype partials;    /* dtype of cross-tile partial sums: f32 (default) or f16 */
    int gemm_candidates;  /* per matmul kept for the search (default 48) */
} lm_plan_options;

void lm_plan_options_default(lm_plan_options *o);

typedef struct lm_plan lm_plan;
/* Plans g for m. LM_UNSUPPORTED (with the op and the reason) when no plan fits. */
lm_status lm_plan_compile(const lm_plan_graph *g, const lm_plan_machine *m, const lm_plan_options *o, lm_plan **out);
void lm_plan_destroy(lm_plan *p);

typedef struct lm_plan_summary {
    double predicted_cycles;   /* the planner's cost of the chosen mid program */
    double lower_bound_cycles; /* matmul FLOPs / (tiles * f16-or-f32 matrix rate) */
    double matmul_flops;
    int64_t sram_peak_bytes; /* max over tiles of the allocated peak */
    int64_t sram_live_bound; /* max over tiles of the peak live bytes (allocation lower bound) */
    double sram_alloc_ratio; /* max over tiles of peak / live bound */
    int64_t exchange_bytes;  /* bytes received over all tiles and phases (one iteration of repeats) */
    int64_t compute_steps, exchange_steps;
    int64_t kernel_calls, transfers;
    double plan_seconds;        /* wall time of lm_plan_compile */
    int64_t candidates_costed;  /* mid-program candidates the search evaluated */
    int64_t planner_peak_bytes; /* largest planner working memory (bytes) */
} lm_plan_summary;

lm_status lm_plan_get_summary(const lm_plan *p, lm_plan_summary *out);
/* The chosen plan: per graph op its implementation, then the mid program. Caller frees
 * *out with lm_free. */
lm_status lm_plan_describe(const lm_plan *p, char **out);
/* Runs the independent checkers on the low program: SRAM ownership (no live value is
 * overwritten, every access in bounds) and exchange hazards (one send and one receive
 * stream per tile per slot, no write overlapping another write or a read in the
 * same phase). LM_INTERNAL with the first violation in the detail. */
lm_status lm_plan_check(const lm_plan *p);

/* ---- simulation ------------------------------------------------------------------------- */
typedef struct lm_plan_sim lm_plan_sim;

typedef struct lm_plan_sim_options {
    uint64_t seed;   /* data generator seed */
    int threads;     /* 0 = all CPUs */
    double nmse_tol; /* per-check NMSE gate (default 1e-5: f16 rounding, see docs/PLAN.md) */
    double abs_tol;  /* max |got-want| / max |want| gate (default 2e-2) */
} lm_plan_sim_options;

void lm_plan_sim_options_default(lm_plan_sim_options *o);
/* Executes the low program on real data and compares every checkpoint and output
 * with the CPU reference. Returns LM_OK even when a check fails: see the summary. */
lm_status lm_plan_simulate(const lm_plan *p, const lm_plan_sim_options *o, lm_plan_sim **out);
void lm_plan_sim_destroy(lm_plan_sim *s);

typedef struct lm_plan_sim_summary {
    double cycles; /* total simulated cycles */
    double compute_cycles, exchange_cycles, sync_cycles;
    int64_t exchange_bytes; /* received over all tiles, all iterations */
    int64_t sram_peak_bytes;
    int checks, checks_failed;
    double worst_nmse, worst_rel_abs;
    double sim_seconds, ref_seconds;
} lm_plan_sim_summary;

typedef struct lm_plan_check_result {
    char name[64];
    int64_t iteration;    /* repeat iteration, 0 outside repeats */
    double nmse, rel_abs; /* rel_abs = max |got-want| / max |want| */
    int pass;
} lm_plan_check_result;

lm_status lm_plan_sim_get_summary(const lm_plan_sim *s, lm_plan_sim_summary *out);
int lm_plan_sim_check_count(const lm_plan_sim *s);
lm_status lm_plan_sim_check_get(const lm_plan_sim *s, int i, lm_plan_check_result *out);

/* ---- reports (caller frees *out with lm_free) -------------------------------------------- */
lm_status lm_plan_report_text(const lm_plan *p, const lm_plan_sim *s, char **out); /* s may be NULL */
lm_status lm_plan_report_json(const lm_plan *p, const lm_plan_sim *s, char **out); /* s may be NULL */
/* Per-phase timeline (compute, exchange, sync) as an SVG document; needs a simulation. */
lm_status lm_plan_timeline_svg(const lm_plan *p, const lm_plan_sim *s, char **out);

#ifdef __cplusplus
}
#endif
#endif
