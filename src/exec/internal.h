/* exec/internal.h — the executor record shared by the exec sources (never installed).
 *
 * Storage classes of a graph value: bound (inputs and parameters: caller memory,
 * or an executor-owned input buffer), arena (a computed value owning storage: a
 * slice of the one arena allocation at offset[v]), or derived (views, and the
 * in-place results of kv_store and accumulating linears: a view computed from
 * another value's). Views are resolved once per binding change, so a run is just
 * the operator calls.
 */
#ifndef LOOM_EXEC_INTERNAL_H
#define LOOM_EXEC_INTERNAL_H

#include "graph/rewrite.h"
#include "loom/exec.h"

struct lm_exec {
    lm_graph *g; /* the graph as run (after the passes), owned */
    lm_device device;
    lm_exec_options opt;
    lm_tensor_view *view;  /* [nvalues] resolved views */
    int64_t *offset;       /* [nvalues] arena offset in bytes of values owning arena storage, else -1 */
    unsigned char *bound;  /* [nvalues] inputs and parameters with a binding */
    void **owned;          /* [nvalues] executor-owned input buffers (device memory) or NULL */
    void **work;           /* [nops] operator workspaces (device memory, zero-filled; one block per op kind) or NULL */
    size_t *work_bytes;    /* [nops] */
    void *arena;           /* [arena_bytes] device memory (the caller's with external_arena) */
    int64_t arena_bytes, live_bytes, owned_bytes;
    int can_capture;       /* the device records work for replay (lm_device_caps.graph_capture) */
    int dirty;             /* bindings changed since the views were resolved */
    int eager_runs;        /* runs since the last binding change (capture after one) */
    lm_device_graph *captured;
    int64_t runs, replays;
    int64_t resolves;      /* times the views were resolved (a binding change makes old views stale) */
    /* tracing (loom/trace.h): on a device that queues work, one event before and one
     * after each op, resolved into device spans after a traced run */
    int async;             /* lm_device_caps.async */
    lm_event **tev;        /* [1 + 2 * nops] created at the first traced run, or NULL */
    int64_t mem_counted;   /* bytes this executor adds to the "executor memory" counter */
};

/* exec/memory.c: 1 when value v owns storage in the arena (a computed value that is
 * neither a view nor written in place into an operand). */
int lm__exec_owns_arena(const lm_graph *g, int v);
/* exec/memory.c: arena offsets by liveness (offset[], arena_bytes, live_bytes) and
 * operator workspaces; allocates both on e->device. */
lm_status lm__exec_plan_memory(lm_exec *e);
/* exec/memory.c: adds delta bytes to the device memory all executors hold and writes
 * it (and its high-water mark, when it rises) as trace counters. */
void lm__exec_count_memory(int64_t delta);
/* exec/ops.c: the views of every value from the bindings and the arena. */
lm_status lm__exec_resolve(lm_exec *e);
/* exec/exec.c: the CUDA executor's rewrite passes over g under env. */
lm_status lm__exec_gpu_passes(const lm_graph *g, const lm__pass_env *env, lm_graph **out);
/* exec/exec.c: an env with the GPU graphs' rules for fused linears (lm__linear_graph_rule,
 * the pair rules, the low-precision outputs) on any device: how the CUDA executor would
 * rewrite a graph, for running its passes on the CPU's operators. */
void lm__exec_gpu_rules(lm__pass_env *env);
/* exec/exec.c: resolves the views when a binding changed since the last run (and
 * drops a capture made with the old ones); nothing otherwise. */
lm_status lm__exec_prepare(lm_exec *e);
/* exec/exec.c: fills the arena with NaN (all-ones bytes). */
lm_status lm__exec_poison(lm_exec *e);
/* exec/ops.c: the Linear parameters op i (linear, linear_swiglu, linear_qkv_rope) is run
 * with, and the q|k|v front's (qkv may be NULL); views of e->view; no workspace. */
void lm__exec_linear_params(const lm_exec *e, int64_t i, lm_linear_params *lin, lm_qkv_rope_params *qkv);
/* exec/ops.c: runs op i of e->g through the public operators on ctx. */
lm_status lm__exec_run_op(lm_exec *e, lm_ctx *ctx, int64_t i);
/* exec/ops.c: LM_UNSUPPORTED naming the first op no engine operator runs. */
lm_status lm__exec_check_ops(const lm_graph *g);
/* exec/ops.c: bytes of the workspace op i needs on device d (0: none). */
size_t lm__exec_workspace_bytes(const lm_graph *g, int64_t i, lm_device d);

#endif
