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
 * The graph it compiles is loom/graph.h's IR (the one the engine's executors run),
 * up to a whole decoder layer (RoPE, grouped causal/windowed attention over one
 * batch row, SwiGLU); lm_plan_compile rejects, naming the op, what the tile machine
 * cannot run: dtypes other than f32/f16 (i32 only as RoPE positions), the
 * model-step ops (embedding, KV cache, ...) it has no kernel for, more than 3-d
 * matmuls, attention over several batch rows.
 */
#ifndef LOOM_PLAN_H
#define LOOM_PLAN_H

#include "loom/base.h"
#include "loom/graph.h"
#include "loom/tensor.h"
#include "loom/exec.h"
#include "loom/model.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- machine description --------------------------------------------------------- */
typedef struct lm_plan_machine lm_plan_machine;

/* Presets: "ipu21" (1,472 tiles x 624 KiB, 1.5 GHz; constants and sources in
 * docs/PLAN.md), "small16" (16 tiles x 64 KiB) and "small4" (4 tiles x 32 KiB) with
 * ipu21's per-tile rates. LM_NOT_FOUND for other names. */
LM_API lm_status lm_plan_machine_preset(const char *name, lm_plan_machine **out);
/* A JSON object (see docs/PLAN.md): "base" names a preset to start from, other keys
 * override it. Errors name the source and the field (LM_PARSE_ERROR). */
LM_API lm_status lm_plan_machine_parse(const char *json, const char *source, lm_plan_machine **out);
LM_API lm_status lm_plan_machine_load(const char *path, lm_plan_machine **out);
LM_API void lm_plan_machine_destroy(lm_plan_machine *m);
LM_API const char *lm_plan_machine_name(const lm_plan_machine *m);
LM_API int64_t lm_plan_machine_tiles(const lm_plan_machine *m);
/* Physical SRAM per tile; the planner allocates at most this minus the description's
 * "sram_reserved_bytes" (code and exchange tables: 96 KiB on ipu21, 0 on the small presets). */
LM_API int64_t lm_plan_machine_sram_bytes(const lm_plan_machine *m);
LM_API double lm_plan_machine_clock_hz(const lm_plan_machine *m);
/* Matrix-unit FLOP per cycle per tile for operands of dtype (f16 or f32), 0 otherwise. */
LM_API double lm_plan_machine_matmul_flops(const lm_plan_machine *m, lm_dtype dt);
/* The complete description as a JSON object; caller frees *out with lm_free. */
LM_API lm_status lm_plan_machine_to_json(const lm_plan_machine *m, char **out);

/* ---- workloads --------------------------------------------------------------------------- */
typedef enum lm_plan_workload_kind {
    LM_PLAN_WL_GEMM = 0,      /* Y[M,N] = X[M,K] W[K,N] */
    LM_PLAN_WL_MLP = 1,       /* SigLIP MLP: gelu(x W1 + b1) W2 + b2 */
    LM_PLAN_WL_ATTENTION = 2, /* SigLIP attention with Q/K/V/O projections */
    LM_PLAN_WL_MLP_REPEAT = 3, /* the MLP block repeated */
    /* The forms of the published IPU21 figures (like-for-like comparisons, docs/PLAN.md
     * "Calibration"): */
    LM_PLAN_WL_MLP_NOBIAS = 4,    /* gelu(x W1) W2: the SigLIP MLP without biases */
    LM_PLAN_WL_ATTENTION_QKV = 5, /* Q/K/V projections (with biases) and attention, no output projection */
    /* Whole SigLIP encoder layers (pre-LayerNorm): y = x + attn(ln1(x)); out = y + mlp(ln2(y)). */
    LM_PLAN_WL_ENCODER_LAYER = 6,
    LM_PLAN_WL_ENCODER_STACK = 7 /* `repeat` layers as one Repeat (each its own weights, all resident) */
} lm_plan_workload_kind;

typedef struct lm_plan_workload {
    lm_plan_workload_kind kind;
    int64_t m, n, k;                      /* gemm */
    int64_t tokens, width, hidden, heads; /* mlp / attention */
    int64_t repeat;                       /* mlp-repeat, encoder-stack */
    lm_dtype dtype;                       /* f16 (default) or f32 */
} lm_plan_workload;

/* SigLIP sizes: 729 tokens, width 1152, hidden 4304, 16 heads; gemm 4096^3; f16. */
LM_API void lm_plan_workload_default(lm_plan_workload_kind kind, lm_plan_workload *w);
LM_API lm_status lm_plan_workload_build(const lm_plan_workload *w, lm_graph **out);
/* "gemm", "mlp", "attention", "mlp-repeat", "mlp-nobias", "attention-qkv",
 * "encoder-layer", "encoder-stack"; NULL for invalid kinds. */
LM_API const char *lm_plan_workload_name(lm_plan_workload_kind kind);

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
    int64_t flash_grid[4]; /* force every flash attention's split of query heads, query rows, keys (kv-split
                              tiles) and serial kv steps; all 0 = free (default), else all >= 1. An attention
                              op the grid does not fit fails naming it; a matmul pattern runs materialized */
} lm_plan_options;

LM_API void lm_plan_options_default(lm_plan_options *o);

typedef struct lm_plan lm_plan;
/* Plans g for m. LM_UNSUPPORTED (with the op and the reason) when no plan fits. */
LM_API lm_status lm_plan_compile(const lm_graph *g, const lm_plan_machine *m, const lm_plan_options *o, lm_plan **out);
LM_API void lm_plan_destroy(lm_plan *p);

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

LM_API lm_status lm_plan_get_summary(const lm_plan *p, lm_plan_summary *out);
/* The chosen plan: per graph op its implementation, then the mid program. Caller frees
 * *out with lm_free. */
LM_API lm_status lm_plan_describe(const lm_plan *p, char **out);
/* Runs the independent checkers on the low program: SRAM ownership (no live value is
 * overwritten, every access in bounds) and exchange hazards (one send and one receive
 * stream per tile per slot, no write overlapping another write or a read in the
 * same phase). LM_INTERNAL with the first violation in the detail. */
LM_API lm_status lm_plan_check(const lm_plan *p);

/* ---- simulation ------------------------------------------------------------------------- */
typedef struct lm_plan_sim lm_plan_sim;

/* A data source for the simulation's inputs and parameters (real weights, token
 * positions). Called on the simulating thread, once per input and parameter before
 * anything runs (a parameter declared inside a Repeat body once per iteration, as
 * "NAME#ITER"), with the value's graph name, dtype and shape; it writes the value's
 * numel elements, dense row-major, as floats into dst (simulator-owned, valid during
 * the call). The simulator rounds them to the dtype exactly as it rounds generated
 * data (f16: nearest even); i32 values (RoPE positions) travel as floats holding
 * integers of magnitude <= 2^24, anything else is LM_INVALID_ARGUMENT. A status
 * other than LM_OK stops lm_plan_simulate, which returns it with the detail the
 * callback left (lm_last_error) prefixed by the value's name. */
typedef lm_status (*lm_plan_fill_fn)(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape,
                                     float *dst);

typedef struct lm_plan_sim_options {
    uint64_t seed;        /* data generator seed (generated data only) */
    int threads;          /* 0 = all CPUs */
    double nmse_tol;      /* per-check NMSE gate (default 1e-5: f16 rounding, see docs/PLAN.md) */
    double abs_tol;       /* max |got-want| / max |want| gate (default 2e-2) */
    lm_plan_fill_fn fill; /* NULL (default): N(mean, std^2) data as declared by the builders, positions 0..T-1 */
    void *fill_user;      /* passed to fill, borrowed */
} lm_plan_sim_options;

LM_API void lm_plan_sim_options_default(lm_plan_sim_options *o);
/* Executes the low program on real data and compares every checkpoint and output
 * with the CPU reference (which reads the same data). Returns LM_OK even when a
 * check fails: see the summary. */
LM_API lm_status lm_plan_simulate(const lm_plan *p, const lm_plan_sim_options *o, lm_plan_sim **out);
LM_API void lm_plan_sim_destroy(lm_plan_sim *s);

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

LM_API lm_status lm_plan_sim_get_summary(const lm_plan_sim *s, lm_plan_sim_summary *out);
LM_API int lm_plan_sim_check_count(const lm_plan_sim *s);
LM_API lm_status lm_plan_sim_check_get(const lm_plan_sim *s, int i, lm_plan_check_result *out);
/* The simulated value of the program output named name (a value marked with
 * lm_graph_output): its n elements, dense row-major in the value's shape, as floats
 * (f16 values widened exactly) into dst, which the caller owns. LM_NOT_FOUND when no
 * output has that name (the detail lists the outputs), LM_SHAPE_MISMATCH when n is
 * not the output's element count, LM_INVALID_ARGUMENT when two outputs share it. */
LM_API lm_status lm_plan_sim_output(const lm_plan_sim *s, const char *name, float *dst, int64_t n);

/* ---- reports (caller frees *out with lm_free) -------------------------------------------- */
LM_API lm_status lm_plan_report_text(const lm_plan *p, const lm_plan_sim *s, char **out); /* s may be NULL */
LM_API lm_status lm_plan_report_json(const lm_plan *p, const lm_plan_sim *s, char **out); /* s may be NULL */
/* Per-phase timeline (compute, exchange, sync) as an SVG document; needs a simulation. */
LM_API lm_status lm_plan_timeline_svg(const lm_plan *p, const lm_plan_sim *s, char **out);
/* Per-tile timeline as one self-contained HTML page (inline script, no external
 * resources): a row per group of tiles with identical schedules (expandable), compute /
 * exchange / sync / idle spans on a cycle axis, a tooltip per span (kernel, mid-program
 * op, bytes, cycles), the critical path and the gap to the compute bound by category.
 * s may be NULL: the schedule then follows the low program's cost model (the
 * simulator's timing rules); with s its total must equal the simulated cycles. */
LM_API lm_status lm_plan_timeline_html(const lm_plan *p, const lm_plan_sim *s, char **out);

/* ---- executable packages (.lmx) ------------------------------------------------------------
 * A compiled plan as one versioned binary file (format: docs/PLAN.md section 8): the
 * machine, the per-tile program (kernel calls and their SRAM operands, buffers,
 * exchange transfers per phase and slot, checkpoints), the layouts saying where each
 * element of an input, parameter and output lives, and the graph the simulator's data
 * generator and CPU reference read. A loaded package is an lm_plan like a compiled
 * one: lm_plan_simulate, lm_plan_sim_output, lm_plan_check, lm_plan_get_summary and the
 * reports accept it (lm_plan_compile is not needed). */

/* Writes p to path atomically (a temporary sibling, fsync, rename). LM_UNSUPPORTED when
 * the plan's machine does not survive its JSON form exactly. */
LM_API lm_status lm_plan_package_write(const lm_plan *p, const char *path);
/* Loads and validates a package: sizes, checksums, every index, range and operand
 * footprint, the rebuilt graph, then the plan checker. expect (may be NULL) is the
 * machine the caller means to run on: a package built for another one is refused.
 * Every failure is LM_PARSE_ERROR naming path and what is wrong (LM_IO_ERROR when the
 * file cannot be read, LM_OUT_OF_MEMORY). Caller frees *out with lm_plan_destroy. */
LM_API lm_status lm_plan_package_load(const char *path, const lm_plan_machine *expect, lm_plan **out);
/* The same from memory; source names the bytes in error details. */
LM_API lm_status lm_plan_package_parse(const void *data, size_t size, const char *source,
                                       const lm_plan_machine *expect, lm_plan **out);
/* The machine a plan runs on (borrowed, lives as long as p). */
LM_API const lm_plan_machine *lm_plan_get_machine(const lm_plan *p);

/* What a caller feeds and reads: inputs and parameters (in graph order; the names the
 * data source is asked for), then program outputs (lm_plan_sim_output's names). */
typedef enum lm_plan_binding_kind {
    LM_PLAN_BIND_INPUT = 0,
    LM_PLAN_BIND_PARAM = 1,
    LM_PLAN_BIND_OUTPUT = 2
} lm_plan_binding_kind;

typedef struct lm_plan_binding {
    char name[64];
    lm_plan_binding_kind kind;
    lm_dtype dtype; /* f32, f16, or i32 (RoPE positions) */
    int ndim;
    int64_t shape[4];
    int64_t copies; /* a parameter declared in a Repeat body: one copy per iteration ("NAME#ITER"); else 1 */
} lm_plan_binding;

LM_API int64_t lm_plan_binding_count(const lm_plan *p);
LM_API lm_status lm_plan_binding_get(const lm_plan *p, int64_t i, lm_plan_binding *out);

/* ---- decode schedules: one decode step as work items on a GPU's SMs ----------------
 * The CUDA target of the planner (docs/PLAN.md "Decode schedules"): a prepared decode
 * step (an lm_exec, normally of the graph as the CUDA executor rewrites it) becomes
 * work items, each a piece of one op, with the dependencies that make it safe and a
 * static list of items per SM, so that one persistent kernel could run the step with
 * no kernel boundaries: an item starts when the items it depends on are done. Weight
 * products split along their outputs (linear rows, SwiGLU columns, the fused q|k|v
 * front by heads; one piece per SM, more past item_bytes, fewer below min_item_bytes),
 * attention by kv heads; other ops are one item. Each item recomputes
 * its input form (the RMSNorm prologue of a fused linear) itself. Dependencies come from
 * the bytes each item reads and writes in the executor's real storage (activation
 * arena reuse included), reduced transitively; every SM's list follows one global
 * order in which each item depends only on earlier ones, so the schedule cannot
 * deadlock on any number of SMs. The predicted time is a list-scheduling simulation
 * under the options' cost constants (a prediction, not a measurement). */
typedef struct lm_decode_plan lm_decode_plan;

typedef struct lm_decode_plan_options {
    int sms;                      /* SMs the schedule runs on (default 132: an H200) */
    int full_sms;                 /* SMs at which bandwidth_bytes_per_s is reached (default 132) */
    double bandwidth_bytes_per_s; /* weight and KV-cache (HBM) read rate of the whole GPU (default 4.2e12) */
    double l2_bytes_per_s;        /* activation traffic rate of the whole GPU (default 1.0e13) */
    double flops_per_s;           /* the products' rate of the whole GPU (default 7.8e14: bf16 tensor cores) */
    double item_s;                /* fixed cost of one work item (default 1.2e-6, measured: docs/PLAN.md 9) */
    double dep_s;                 /* a dependency met on another SM is seen after this (default 0.1e-6) */
    int64_t item_bytes;           /* a split op gets more items than SMs when its items would stream more (256 KiB) */
    int64_t min_item_bytes;       /* and fewer items than SMs when they would stream less than this (4 KiB) */
    int max_items_per_sm;         /* a split op has at most this many items per SM (default 4) */
    int64_t prefetch_bytes;       /* weight bytes an item may stream before its dependencies are met
                                     (shared memory filled ahead; default 0: none) */
    int64_t context;              /* positions attention reads, for its cost (default 0: the cache's size) */
} lm_decode_plan_options;

LM_API void lm_decode_plan_options_default(lm_decode_plan_options *o);
/* Plans the prepared executor e (views resolved from its current bindings; its graph
 * must be a decode step: no repeat regions). The plan borrows e, which must outlive it
 * and keep its bindings (a later binding change makes lm_decode_plan_run_cpu refuse).
 * LM_INVALID_ARGUMENT names a bad option; LM_OUT_OF_RANGE when the step needs more
 * items than the checker's reachability sets allow (raise item_bytes). */
LM_API lm_status lm_decode_plan_create(lm_exec *e, const lm_decode_plan_options *o, lm_decode_plan **out);
LM_API void lm_decode_plan_destroy(lm_decode_plan *p); /* accepts NULL */
/* The independent check: every pair of items whose byte footprints conflict (one
 * writes what the other reads or writes) is ordered by a chain of dependencies, every
 * dependency points to an earlier item, the waits (the dependencies with op counters,
 * as a kernel reads them) name earlier items only and cover every dependency, each SM's
 * list ascends, and every item sits on exactly one SM. LM_INTERNAL naming the first
 * violation. */
LM_API lm_status lm_decode_plan_check(const lm_decode_plan *p);
/* Runs one step on the CPU the way the SMs would: item by item through the public
 * operators on views of the executor's storage (arena poisoned first when the executor
 * poisons), each SM taking its next item once its dependencies are done. order 0 takes
 * items in their global order; any other value picks among the ready SMs at random
 * (seeded by order), an interleaving a GPU could produce. The executor's output then
 * holds the step's result (lm_exec_output). The executor must be on the CPU. */
LM_API lm_status lm_decode_plan_run_cpu(lm_decode_plan *p, lm_ctx *ctx, uint64_t order);

typedef struct lm_decode_plan_stats {
    int sms;
    int64_t items, deps;       /* work items and dependency edges (after reduction) */
    int64_t waits;             /* the dependencies as waits: all of an op's items = one wait on its counter */
    int64_t ops_split, ops_whole; /* ops cut into several items / run as one */
    int64_t max_items_sm;      /* the longest SM list */
    double step_s;             /* predicted step time (the list-scheduling simulation) */
    double busy_s;             /* summed item time over all SMs */
    double hbm_bytes;          /* weight and KV-cache bytes one step reads */
    double bound_s;            /* hbm_bytes at bandwidth_bytes_per_s x sms / full_sms */
} lm_decode_plan_stats;
LM_API lm_status lm_decode_plan_get_stats(const lm_decode_plan *p, lm_decode_plan_stats *out);
/* The schedule's skeleton on CUDA device `device`: one block per SM list (a
 * cooperative launch), each item streaming as many bytes as it would (weights, KV) from
 * its own region of one buffer, waiting for its dependencies through flags in device
 * memory and releasing its own; an item's first prefetch_bytes (at most 112 KiB) are
 * bulk-copied into shared memory once the item before it on its SM has its dependencies
 * met, so they land while that item streams and this one waits: no arithmetic, no real
 * data. steps timed launches after one untimed; then the same with
 * op counters (a dependency on every item of an op is one wait on a counter the op's
 * items add to); then both with no bytes (the items' and the waits' fixed costs alone). Host events
 * around each launch, so a launch's own cost is included. LM_UNSUPPORTED without CUDA;
 * LM_INVALID_ARGUMENT when the plan has more SMs than the device; LM_INTERNAL when a
 * wait never ends (~2 s). */
typedef struct lm_decode_plan_replay {
    int steps;
    /* an item waits for each dependency's own flag */
    double step_us, step_us_min;   /* streams and waits: mean and fastest launch */
    double empty_us, empty_us_min; /* waits only */
    /* an item waits for an op's counter where it depends on all of the op's items */
    double ops_step_us, ops_step_us_min;
    double ops_empty_us, ops_empty_us_min;
    int64_t waits, ops_waits; /* the two protocols' waits in one step */
} lm_decode_plan_replay;
LM_API lm_status lm_decode_plan_replay_cuda(const lm_decode_plan *p, int device, int steps, lm_decode_plan_replay *out);

/* Runs one step of the plan's executor, which must be on a CUDA device, the way the
 * schedule says, as one persistent launch: one block per SM list (a cooperative launch),
 * each item waiting for its dependencies through flags and op counters in device memory,
 * then running its piece of the operator with the parameters the executor's own launch
 * would take (the decode GEMV's rows, attention's kv heads, key chunks and merges); the
 * whole ops before the first split op and after the last (the embedding) run as the
 * executor runs them. ctx must be on the executor's device. The first run builds the
 * kernel's tables. Waits for the step: the executor's output then holds its result.
 * LM_UNSUPPORTED names what the kernel does not run (it is built for bf16 weights at one
 * or two rows; an op with no item code inside the step); LM_INTERNAL names an item whose
 * wait never ended (~2 s). */
LM_API lm_status lm_decode_plan_run_cuda(lm_decode_plan *p, lm_ctx *ctx);
typedef struct lm_decode_plan_timing {
    int steps;
    double plan_us; /* a step as the plan's persistent launch (the faster of two rounds of `steps`) */
    double exec_us; /* a step as the executor runs it (lm_exec_run), in the same rounds */
} lm_decode_plan_timing;
/* Times `steps` back-to-back steps of the plan (lm_decode_plan_run_cuda without the wait
 * between steps) and `steps` of the executor itself, twice, interleaved; host clock
 * around each batch and one synchronization, so launch costs are included. */
LM_API lm_status lm_decode_plan_time_cuda(lm_decode_plan *p, lm_ctx *ctx, int steps, lm_decode_plan_timing *out);
/* Where a step of the persistent launch spends its time: one step with every list
 * position stamped (clock64 at the item's start, after its wait, at its end), as text:
 * the longest list, the share of list time waiting, and per op family (the op's name
 * without its layer: q_rope, attention, ...) items and mean wait and run time an item.
 * Free *out with lm_free. */
LM_API lm_status lm_decode_plan_profile_cuda(lm_decode_plan *p, lm_ctx *ctx, char **out);

/* One line per op (items, SMs used, predicted span) as text; caller frees *out with lm_free. */
LM_API lm_status lm_decode_plan_report(const lm_decode_plan *p, char **out);

/* A CPU executor of model m's decode step (batch rows of one token, a KV cache of
 * cache_tokens positions per row, last-position logits) as the CUDA executor prepares
 * it: the GPU's rewrite passes under the GPU's rules for fused linears, q|k|v and
 * gate|up stacked (copies owned by the step), zero f32 caches. ids and positions
 * ([batch] each) are the inputs; lm_decode_step_run writes them and runs the executor,
 * or the plan when one is given. */
typedef struct lm_decode_step lm_decode_step;
LM_API lm_status lm_decode_step_create(lm_ctx *ctx, const lm_model *m, int64_t batch, int64_t cache_tokens,
                                       lm_decode_step **out);
LM_API void lm_decode_step_destroy(lm_decode_step *s);
LM_API lm_exec *lm_decode_step_exec(lm_decode_step *s);
/* One step: ids and positions written, then the executor (plan NULL) or the plan's run
 * (on the CPU with `order`; on a CUDA context the persistent launch); the logits
 * [batch, vocab] copied to logits. */
LM_API lm_status lm_decode_step_run(lm_decode_step *s, lm_ctx *ctx, const int32_t *ids, const int32_t *positions,
                                    lm_decode_plan *plan, uint64_t order, float *logits);

#ifdef __cplusplus
}
#endif
#endif
