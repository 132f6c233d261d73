/* loom/exec.h — running a graph (loom/graph.h) on a device.
 *
 * An executor takes a graph, applies the rewrite passes of the context's device
 * (fused operators, each a public operator of loom/ops.h), plans every activation
 * into one arena allocation by liveness (stable addresses: a step can be captured
 * and replayed), and runs each op through the public operator dispatch. Inputs and
 * parameters are bound by name to caller memory, or inputs are given executor-owned
 * buffers (lm_exec_input). On devices that can capture work (lm_device_caps), the
 * second run of an executor is captured and later runs replay it, as long as no
 * binding moved; the first run is eager so one-time work (GEMM algorithm choice)
 * happens outside the capture.
 *
 * Bound memory must stay valid, and at the same address, while the executor may
 * run. An executor belongs to one thread at a time; the graph may be freed after
 * lm_exec_create.
 */
#ifndef LOOM_EXEC_H
#define LOOM_EXEC_H

#include "loom/graph.h"
#include "loom/ops.h"
#include "loom/ops_backward.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lm_exec lm_exec;

typedef struct lm_exec_options {
    int fuse;    /* apply the device's rewrite passes (default 1); 0 runs the graph as built */
    int capture; /* capture and replay on devices that can (default 1) */
    int poison;  /* fill the arena with NaN before each run (tests: unwritten reads show) */
    int external_arena; /* 1: allocate no arena; the caller provides one with lm_exec_set_arena */
} lm_exec_options;

LM_API void lm_exec_options_default(lm_exec_options *o);

/* Prepares g for ctx's device. LM_UNSUPPORTED names an op the engine cannot run
 * (tile-compiler-only ops such as gelu or repeat regions). Caller owns *out. */
LM_API lm_status lm_exec_create(lm_ctx *ctx, const lm_graph *g, const lm_exec_options *o, lm_exec **out);
LM_API void lm_exec_destroy(lm_exec *e); /* accepts NULL */

/* Binds the input or parameter called name to v (shape, dtype and device must match
 * the graph's value; LM_NOT_FOUND for an unknown name). Rebinding is allowed. */
LM_API lm_status lm_exec_bind(lm_exec *e, const char *name, const lm_tensor_view *v);
/* Binds every parameter: lookup(user, name, &view) is asked once per parameter. */
typedef lm_status (*lm_exec_param_fn)(void *user, const char *name, lm_tensor_view *out);
LM_API lm_status lm_exec_bind_params(lm_exec *e, lm_exec_param_fn lookup, void *user);
/* An executor-owned buffer for input `name` (allocated on first call, then the same
 * each time): the caller writes the input there before each run. */
LM_API lm_status lm_exec_input(lm_exec *e, const char *name, lm_tensor_view *out);

/* With external_arena: the activation arena, device memory of at least the
 * executor's arena_bytes (lm_exec_get_stats) that the caller owns and keeps valid.
 * Several executors may share one arena when their runs never overlap (one context,
 * each run's outputs read before the next run starts). Setting it again (e.g. a
 * larger shared block) counts as a binding change. */
LM_API lm_status lm_exec_set_arena(lm_exec *e, void *base, size_t bytes);

/* Runs the graph on ctx (the executor's device). Work is queued: the output is ready
 * after lm_ctx_synchronize (or a copy through ctx). Every input and parameter must be
 * bound (LM_INVALID_ARGUMENT names the first one that is not). */
LM_API lm_status lm_exec_run(lm_exec *e, lm_ctx *ctx);
/* The program output i (in value order; most graphs have one): a view into the
 * executor's arena, valid until the next run. */
LM_API lm_status lm_exec_output(const lm_exec *e, int i, lm_tensor_view *out);

typedef struct lm_exec_stats {
    int64_t ops;            /* ops run per step after the passes (views included) */
    int64_t fused_ops;      /* of them, fused operators made by the passes */
    int64_t arena_bytes;    /* the activation arena */
    int64_t live_bytes;     /* the largest sum of activations live at one op: what any plan needs */
    int64_t owned_bytes;    /* executor-owned input buffers and operator workspaces */
    int64_t runs, replays;  /* runs so far, and of them replays of a captured device graph */
    int64_t kernels;        /* kernel launches one replay of the captured graph makes (0: none captured) */
} lm_exec_stats;

LM_API lm_status lm_exec_get_stats(const lm_exec *e, lm_exec_stats *out);
/* The graph as run (after the passes); borrowed, lives as long as e. */
LM_API const lm_graph *lm_exec_graph(const lm_exec *e);

#ifdef __cplusplus
}
#endif
#endif
