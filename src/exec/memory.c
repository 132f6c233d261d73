/* exec/memory.c — the activation arena: one allocation for every computed value,
 * offsets from a liveness pass over the graph.
 *
 * A value owning storage lives from the op that produces it to the last op reading
 * it or any value derived from it (views, in-place results); program outputs live
 * to the end. Offsets come from the shared interval packer (base/pack.c: largest
 * first, lowest non-overlapping aligned offset), which also reports the live lower
 * bound the arena is judged against. Addresses never change after planning, which is
 * what lets a run be captured and replayed. Operator workspaces are separate (one
 * block per op kind, as large as its largest user), zero-filled once, and persistent.
 */
#include "exec/internal.h"
#include "loom/trace.h"

#include <stdatomic.h>

#define ALIGN 256 /* bytes: GEMM operands and vector loads want 16; 256 keeps every row of a value aligned */

/* The value whose storage v uses (itself for a value owning storage). */
static int storage_of(const lm_graph *g, int v) { return g->values[v].root; }

int lm__exec_owns_arena(const lm_graph *g, int v) {
    const lm__gvalue *x = &g->values[v];
    return x->root == v && !lm__gop_is_leaf(g->ops[x->op].kind);
}

lm_status lm__exec_plan_memory(lm_exec *e) {
    const lm_graph *g = e->g;
    int64_t nv = g->nvalues, nops = g->nops;
    int64_t *first = lm__alloc(sizeof(int64_t) * (size_t)nv * 2, 16);
    if (!first) return LM_OUT_OF_MEMORY;
    int64_t *last = first + nv;
    for (int64_t v = 0; v < nv; v++) first[v] = g->values[v].op, last[v] = -1;
    for (int64_t i = 0; i < nops; i++)
        for (int k = 0; k < g->ops[i].nin; k++) {
            int in = g->ops[i].in[k];
            if (in < 0) continue;
            int r = storage_of(g, in);
            last[r] = LM_MAX(last[r], i);
        }
    for (int64_t v = 0; v < nv; v++) {
        int r = storage_of(g, (int)v);
        if (g->values[v].output) last[r] = nops; /* read after the run */
        last[r] = LM_MAX(last[r], first[r]);     /* a result nobody reads still needs somewhere to go */
    }
    lm__interval *iv = lm__alloc(sizeof *iv * (size_t)(nv ? nv : 1), 16);
    int64_t n = 0;
    lm_status st = iv ? LM_OK : LM_OUT_OF_MEMORY;
    for (int64_t v = 0; st == LM_OK && v < nv; v++) {
        e->offset[v] = -1;
        if (!lm__exec_owns_arena(g, (int)v)) continue;
        int64_t bytes = lm__gvalue_numel(&g->values[v]) * (int64_t)lm_dtype_size(g->values[v].dtype);
        iv[n++] = (lm__interval){first[v], last[v], bytes, 0, v};
    }
    int64_t peak = 0;
    if (st == LM_OK) st = lm__pack_intervals(iv, n, ALIGN, nops, &peak, &e->live_bytes);
    for (int64_t k = 0; st == LM_OK && k < n; k++) e->offset[iv[k].id] = iv[k].offset;
    lm__free(iv);
    lm__free(first);
    if (st != LM_OK) return st;
    e->arena_bytes = peak;
    if (peak && !e->opt.external_arena) LM_TRY(lm_device_alloc(e->device, (size_t)peak, &e->arena));
    /* One workspace per op kind, as large as its largest user: ops run one after the
     * other, and each kind leaves its block as the next user of that kind needs it (the
     * split attention's counters back at zero). Kinds do not share: the sampler's
     * scratch would break the attention's zero counters. */
    for (int64_t i = 0; i < nops; i++) {
        size_t bytes = lm__exec_workspace_bytes(g, i, e->device);
        if (!bytes || e->work[i]) continue;
        lm__gopk kind = g->ops[i].kind;
        for (int64_t j = i + 1; j < nops; j++)
            if (g->ops[j].kind == kind) bytes = LM_MAX(bytes, lm__exec_workspace_bytes(g, j, e->device));
        void *block = NULL;
        static const uint8_t zero = 0;
        LM_TRY(lm_device_alloc(e->device, bytes, &block));
        e->work[i] = block, e->work_bytes[i] = bytes; /* owned by its first user (freed once) */
        LM_TRY(lm_device_fill(e->device, block, bytes, &zero, 1));
        e->owned_bytes += (int64_t)bytes;
        for (int64_t j = i + 1; j < nops; j++)
            if (g->ops[j].kind == kind && lm__exec_workspace_bytes(g, j, e->device))
                e->work[j] = block, e->work_bytes[j] = bytes;
    }
    return LM_OK;
}

/* Device memory held by all executors (arenas they own, input buffers, workspaces),
 * kept whether or not a trace runs so that a trace started later reads true values;
 * changes only when executors are made, given inputs or destroyed. */
static _Atomic int64_t g_exec_bytes, g_exec_peak;

void lm__exec_count_memory(int64_t delta) {
    if (!delta) return;
    int64_t now = atomic_fetch_add(&g_exec_bytes, delta) + delta, peak = atomic_load(&g_exec_peak);
    int rose = 0;
    while (now > peak && !(rose = atomic_compare_exchange_weak(&g_exec_peak, &peak, now))) {}
    if (!lm_trace_enabled()) return;
    lm_trace_counter("executor memory (bytes)", (double)now);
    if (rose) lm_trace_counter("executor memory peak (bytes)", (double)now);
}
