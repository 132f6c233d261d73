/* exec/exec.c — lm_exec: preparing a graph for a device (passes, memory plan),
 * bindings, and runs (eager, or captured once and replayed where the device can).
 *
 * Capture policy: after any change of bindings the next run is eager (one-time work
 * such as GEMM algorithm timing happens there, outside any capture), the run after
 * it is captured and launched, and later runs replay the capture. Rebinding a name
 * to the very same view changes nothing, so callers may rebind every run.
 */
#include "exec/internal.h"
#include "loom/trace.h"
#include "ops/internal.h"

#include <stdio.h>

void lm_exec_options_default(lm_exec_options *o) {
    if (!o) return;
    memset(o, 0, sizeof *o);
    o->fuse = 1;
    o->capture = 1;
}

lm_status lm__exec_gpu_passes(const lm_graph *g, const lm__pass_env *env, lm_graph **out) {
    static const lm__pass_fn gpu[] = {lm__pass_hoist_leaves,    lm__pass_linear,          lm__pass_stack_linears,
                                      lm__pass_qkv_rope_store,  lm__pass_linear_input,    lm__pass_linear_qkv_rope,
                                      lm__pass_linear_swiglu,   lm__pass_linear_residual, lm__pass_add_rmsnorm,
                                      lm__pass_gemm_inputs,     lm__pass_swiglu_gemm};
    return lm__graph_run_passes(g, env, (int)(sizeof gpu / sizeof gpu[0]), gpu, out);
}

static int gpu_rule(lm_device d, lm_linear_input in, int accumulate, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    (void)d;
    return lm__linear_graph_rule(in, accumulate, rows, K, x, w);
}
static int gpu_front_rule(lm_device d, lm_linear_input in, int64_t rows, int64_t K, lm_dtype x, lm_dtype w, int qk) {
    (void)d;
    return lm__linear_pair_rule(in, rows, K, x, w, qk);
}
static int gpu_swiglu_rule(lm_device d, lm_linear_input in, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    (void)d; /* as on an sm_90a device, where the gate|up GEMM with its SwiGLU runs */
    return lm__linear_pair_rule(in, rows, K, x, w, 0) || lm__linear_swiglu_gemm_rule(in, rows, K, x, w);
}
static int gpu_low_out_rule(lm_device d, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    (void)d;
    return lm__linear_low_out_rule(rows, K, x, w);
}

void lm__exec_gpu_rules(lm__pass_env *env) {
    *env = (lm__pass_env){lm_device_cuda(0), gpu_rule, gpu_front_rule, gpu_swiglu_rule, gpu_low_out_rule};
}

/* The rewrite passes for a device: the leaves first (every pass may then place a
 * fused op at any matched op), then the fusions its operators have kernels for. */
static lm_status passes_for(lm_device d, const lm_device_caps *caps, int fuse, const lm_graph *g, lm_graph **out) {
    static const lm__pass_fn host[] = {lm__pass_hoist_leaves, lm__pass_add_rmsnorm};
    static const lm__pass_fn none[] = {lm__pass_hoist_leaves};
    lm__pass_env env = {d, lm_linear_supported, lm_linear_qkv_rope_fused, lm_linear_swiglu_fused, lm__linear_low_out};
    if (!fuse) return lm__graph_run_passes(g, &env, 1, none, out);
    if (caps->host_addressable) return lm__graph_run_passes(g, &env, 2, host, out); /* the CPU's operators */
    return lm__exec_gpu_passes(g, &env, out);
}

void lm_exec_destroy(lm_exec *e) {
    if (!e) return;
    lm_device_graph_destroy(e->captured);
    if (e->g) {
        for (int64_t v = 0; e->owned && v < e->g->nvalues; v++) lm_device_free(e->device, e->owned[v]);
        for (int64_t i = 0; e->work && i < e->g->nops; i++) { /* a kind's block, freed at its first user */
            int first = e->work[i] != NULL;
            for (int64_t j = 0; first && j < i; j++) first = e->work[j] != e->work[i];
            if (first) lm_device_free(e->device, e->work[i]);
        }
    }
    if (!e->opt.external_arena) lm_device_free(e->device, e->arena);
    lm__exec_count_memory(-e->mem_counted);
    for (int64_t i = 0; e->tev && e->g && i < 1 + 2 * e->g->nops; i++) lm_event_destroy(e->tev[i]);
    lm__free(e->tev);
    lm__free(e->view);
    lm__free(e->offset);
    lm__free(e->bound);
    lm__free(e->owned);
    lm__free(e->work);
    lm__free(e->work_bytes);
    lm_graph_destroy(e->g);
    lm__free(e);
}

lm_status lm_exec_create(lm_ctx *ctx, const lm_graph *g, const lm_exec_options *o, lm_exec **out) {
    if (!ctx || !g || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_create: NULL argument");
    *out = NULL;
    if (g->open_region >= 0) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_create: a repeat is still open");
    LM_TRY(lm__exec_check_ops(g));
    lm_exec *e = lm__calloc(1, sizeof *e);
    if (!e) return LM_OUT_OF_MEMORY;
    e->device = lm_ctx_device(ctx);
    if (o) e->opt = *o;
    else lm_exec_options_default(&e->opt);
    e->dirty = 1;
    lm_device_caps caps;
    lm_status st = lm_device_caps_get(e->device, &caps);
    e->can_capture = st == LM_OK && caps.graph_capture;
    e->async = st == LM_OK && caps.async;
    if (st == LM_OK) st = passes_for(e->device, &caps, e->opt.fuse, g, &e->g);
    if (st == LM_OK) {
        size_t nv = (size_t)(e->g->nvalues ? e->g->nvalues : 1), no = (size_t)(e->g->nops ? e->g->nops : 1);
        e->view = lm__calloc(nv, sizeof *e->view);
        e->offset = lm__calloc(nv, sizeof *e->offset);
        e->bound = lm__calloc(nv, 1);
        e->owned = lm__calloc(nv, sizeof *e->owned);
        e->work = lm__calloc(no, sizeof *e->work);
        e->work_bytes = lm__calloc(no, sizeof *e->work_bytes);
        if (!e->view || !e->offset || !e->bound || !e->owned || !e->work || !e->work_bytes) st = LM_OUT_OF_MEMORY;
    }
    if (st == LM_OK) st = lm__exec_plan_memory(e);
    if (st != LM_OK) {
        lm_exec_destroy(e);
        return lm__error_context(st, "preparing a graph of %lld ops", (long long)g->nops);
    }
    e->mem_counted = (e->opt.external_arena ? 0 : e->arena_bytes) + e->owned_bytes;
    lm__exec_count_memory(e->mem_counted);
    *out = e;
    return LM_OK;
}

/* The input or parameter value called name, or -1. */
static int leaf_named(const lm_exec *e, const char *name) {
    const lm_graph *g = e->g;
    for (int64_t i = 0; i < g->nops; i++) /* passes may add parameters (stacked weights) anywhere */
        if (lm__gop_is_leaf(g->ops[i].kind) && strcmp(g->ops[i].name, name) == 0) return g->ops[i].out;
    return -1;
}

static lm_status check_binding(const lm_exec *e, int v, const lm_tensor_view *t) {
    const lm__gvalue *x = &e->g->values[v];
    int ok = t->ndim == x->ndim && t->dtype == x->dtype && lm_device_equal(t->device, e->device);
    for (int i = 0; ok && i < x->ndim; i++) ok = t->shape[i] == x->dims[i];
    if (ok) return LM_OK;
    char want[96] = "", got[96] = "", dw[32], dg[32];
    for (int i = 0, n = 0; i < x->ndim; i++) n += snprintf(want + n, sizeof want - (size_t)n, i ? ", %lld" : "%lld", (long long)x->dims[i]);
    for (int i = 0, n = 0; i < t->ndim && n < (int)sizeof got; i++)
        n += snprintf(got + n, sizeof got - (size_t)n, i ? ", %lld" : "%lld", (long long)t->shape[i]);
    return lm__error(LM_SHAPE_MISMATCH, "executor: '%s' is %s [%s] on %s, but %s [%s] on %s was bound", x->name,
                     lm_dtype_name(x->dtype), want, lm_device_format(e->device, dw, sizeof dw),
                     lm_dtype_name(t->dtype), got, lm_device_format(t->device, dg, sizeof dg));
}

static int same_view(const lm_tensor_view *a, const lm_tensor_view *b) {
    if (a->data != b->data || a->ndim != b->ndim || a->dtype != b->dtype) return 0;
    for (int i = 0; i < a->ndim; i++)
        if (a->shape[i] != b->shape[i] || a->stride[i] != b->stride[i]) return 0;
    return 1;
}

static lm_status bind_value(lm_exec *e, int v, const lm_tensor_view *t) {
    LM_TRY(check_binding(e, v, t));
    if (e->bound[v] && same_view(&e->view[v], t)) return LM_OK;
    e->view[v] = *t;
    e->bound[v] = 1;
    e->dirty = 1;
    return LM_OK;
}

lm_status lm_exec_bind(lm_exec *e, const char *name, const lm_tensor_view *v) {
    if (!e || !name || !v) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_bind: NULL argument");
    int id = leaf_named(e, name);
    if (id < 0) return lm__error(LM_NOT_FOUND, "executor: the graph has no input or parameter '%s'", name);
    if (e->owned[id]) return lm__error(LM_INVALID_ARGUMENT, "executor: input '%s' has an executor-owned buffer", name);
    return bind_value(e, id, v);
}

lm_status lm_exec_bind_params(lm_exec *e, lm_exec_param_fn lookup, void *user) {
    if (!e || !lookup) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_bind_params: NULL argument");
    for (int64_t i = 0; i < e->g->nops; i++) {
        const lm__gop *op = &e->g->ops[i];
        if (op->kind != LM__GOP_PARAM) continue;
        lm_tensor_view t;
        lm_status st = lookup(user, op->name, &t);
        if (st != LM_OK) return lm__error_context(st, "binding parameter '%s'", op->name);
        LM_TRY(bind_value(e, op->out, &t));
    }
    return LM_OK;
}

lm_status lm_exec_input(lm_exec *e, const char *name, lm_tensor_view *out) {
    if (!e || !name || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_input: NULL argument");
    int id = leaf_named(e, name);
    if (id < 0 || e->g->ops[e->g->values[id].op].kind != LM__GOP_INPUT)
        return lm__error(LM_NOT_FOUND, "executor: the graph has no input '%s'", name);
    const lm__gvalue *x = &e->g->values[id];
    if (!e->owned[id]) {
        size_t bytes = (size_t)(lm__gvalue_numel(x) * (int64_t)lm_dtype_size(x->dtype));
        LM_TRY(lm_device_alloc(e->device, bytes ? bytes : 1, &e->owned[id]));
        e->owned_bytes += (int64_t)bytes;
        e->mem_counted += (int64_t)bytes;
        lm__exec_count_memory((int64_t)bytes);
        lm_tensor_view t;
        LM_TRY(lm_tensor_view_init(&t, e->owned[id], x->dtype, e->device, x->ndim, x->dims, NULL));
        LM_TRY(bind_value(e, id, &t));
    }
    *out = e->view[id];
    return LM_OK;
}

/* All-ones bytes: NaN read as f32, bf16 or f16 alike (values of any float dtype share
 * the arena). */
lm_status lm__exec_poison(lm_exec *e) {
    static const uint8_t ones = 0xff;
    if (!e->arena_bytes) return LM_OK;
    return lm_device_fill(e->device, e->arena, (size_t)e->arena_bytes, &ones, 1);
}

/* Device spans of a traced run: tev[0] was recorded (and waited for) at host time
 * host0; op i ran between tev[1 + 2i] and tev[2 + 2i]. Each span starts no earlier than
 * the one before ends (the stream runs them in order; rounding must not overlap them). */
static void device_spans(lm_exec *e, int64_t host0, int64_t nops) {
    char track[48], dev[32];
    snprintf(track, sizeof track, "%s stream", lm_device_format(e->device, dev, sizeof dev));
    int64_t prev = host0;
    for (int64_t i = 0; i < nops; i++) {
        const lm__gop *op = &e->g->ops[i];
        double a = 0, b = 0;
        if (lm__gop_is_leaf(op->kind) || lm__gop_is_view(op->kind)) continue;
        if (lm_event_elapsed_ms(e->tev[0], e->tev[1 + 2 * i], &a) != LM_OK ||
            lm_event_elapsed_ms(e->tev[0], e->tev[2 + 2 * i], &b) != LM_OK) {
            lm_clear_error();
            continue;
        }
        int64_t t0 = LM_MAX(host0 + (int64_t)(a * 1e6), prev), t1 = LM_MAX(host0 + (int64_t)(b * 1e6), t0);
        lm_trace_span(track, "kernel", lm__gop_name(op->kind), op->name, t0, t1);
        prev = t1;
    }
}

/* A run while a trace is on: one host span per op (the time to issue it; on the CPU
 * also to run it) and, on a device that queues work, the op's span on the device
 * from a pair of events around it. Leaves and views issue nothing and get none. */
static lm_status run_ops_traced(lm_exec *e, lm_ctx *ctx) {
    int64_t nops = e->g->nops, host0 = 0;
    int dev = e->async;
    if (dev && !e->tev) { /* the event pool, made once; without it this executor traces the host only */
        e->tev = lm__calloc((size_t)(1 + 2 * nops), sizeof *e->tev);
        for (int64_t i = 0; e->tev && i < 1 + 2 * nops && dev; i++) dev = lm_event_create(ctx, &e->tev[i]) == LM_OK;
        if (!dev || !e->tev) {
            for (int64_t i = 0; e->tev && i < 1 + 2 * nops; i++) lm_event_destroy(e->tev[i]);
            lm__free(e->tev);
            e->tev = NULL;
            e->async = dev = 0;
        }
    }
    if (dev) dev = lm_event_record(e->tev[0], ctx) == LM_OK && lm_event_synchronize(e->tev[0]) == LM_OK;
    host0 = lm_trace_now();
    int64_t last = 0; /* the last event recorded */
    for (int64_t i = 0; i < nops; i++) {
        const lm__gop *op = &e->g->ops[i];
        if (lm__gop_is_leaf(op->kind) || lm__gop_is_view(op->kind)) continue; /* nothing to run */
        int64_t t0 = lm_trace_begin();
        if (dev) dev = lm_event_record(e->tev[1 + 2 * i], ctx) == LM_OK;
        lm_status st = lm__exec_run_op(e, ctx, i);
        if (dev) {
            dev = lm_event_record(e->tev[2 + 2 * i], ctx) == LM_OK;
            last = 2 + 2 * i;
        }
        lm_trace_end(t0, "op", lm__gop_name(op->kind), op->name);
        if (st != LM_OK) return lm__error_context(st, "op '%s'", op->name);
    }
    if (dev && lm_event_synchronize(e->tev[last]) == LM_OK) device_spans(e, host0, nops);
    lm_clear_error();
    return LM_OK;
}

static lm_status run_ops(lm_exec *e, lm_ctx *ctx) {
    if (lm_trace_enabled() && !lm_ctx_capturing(ctx)) return run_ops_traced(e, ctx);
    for (int64_t i = 0; i < e->g->nops; i++) {
        lm_status st = lm__exec_run_op(e, ctx, i);
        if (st != LM_OK) return lm__error_context(st, "op '%s'", e->g->ops[i].name);
    }
    return LM_OK;
}

/* Captures one run on ctx and keeps it for replay. */
static lm_status capture(lm_exec *e, lm_ctx *ctx) {
    LM_TRY(lm_ctx_capture_begin(ctx));
    lm_status st_run = run_ops(e, ctx);
    lm_device_graph *dg = NULL;
    lm_status st_end = lm_ctx_capture_end(ctx, &dg); /* always ends the capture */
    if (st_run != LM_OK) {
        lm_device_graph_destroy(dg);
        return lm__error_context(st_run, "capturing a step");
    }
    LM_TRY(st_end);
    e->captured = dg;
    return lm_device_graph_launch(dg, ctx);
}

lm_status lm_exec_set_arena(lm_exec *e, void *base, size_t bytes) {
    if (!e) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_set_arena: NULL executor");
    if (!e->opt.external_arena)
        return lm__error(LM_INVALID_ARGUMENT, "lm_exec_set_arena: the executor owns its arena (external_arena is 0)");
    if (bytes < (size_t)e->arena_bytes || (!base && e->arena_bytes))
        return lm__error(LM_INVALID_ARGUMENT, "lm_exec_set_arena: %zu bytes at %p; the plan needs %lld", bytes, base,
                         (long long)e->arena_bytes);
    if (base != e->arena) e->arena = base, e->dirty = 1;
    return LM_OK;
}

lm_status lm__exec_prepare(lm_exec *e) {
    if (!e->dirty) return LM_OK;
    lm_device_graph_destroy(e->captured);
    e->captured = NULL;
    e->eager_runs = 0;
    LM_TRY(lm__exec_resolve(e));
    e->dirty = 0;
    e->resolves++;
    return LM_OK;
}

lm_status lm_exec_run(lm_exec *e, lm_ctx *ctx) {
    if (!e || !ctx) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_run: NULL argument");
    if (!lm_device_equal(lm_ctx_device(ctx), e->device)) {
        char a[32], b[32];
        return lm__error(LM_INVALID_ARGUMENT, "lm_exec_run: the executor is for %s but the context runs on %s",
                         lm_device_format(e->device, a, sizeof a), lm_device_format(lm_ctx_device(ctx), b, sizeof b));
    }
    if (!e->arena && e->arena_bytes)
        return lm__error(LM_INVALID_ARGUMENT, "lm_exec_run: no arena (external_arena: call lm_exec_set_arena with %lld "
                         "bytes)", (long long)e->arena_bytes);
    LM_TRY(lm__exec_prepare(e));
    e->runs++;
    if (e->opt.poison) LM_TRY(lm__exec_poison(e));
    /* a traced run is eager, so each op gets its spans (docs/TIMELINES.md, "Step traces") */
    int traced = lm_trace_enabled();
    if (e->captured && !traced) {
        e->replays++;
        return lm_device_graph_launch(e->captured, ctx);
    }
    if (e->opt.capture && e->can_capture && e->eager_runs >= 1 && !e->opt.poison && !traced) return capture(e, ctx);
    e->eager_runs++;
    return run_ops(e, ctx);
}

lm_status lm_exec_output(const lm_exec *e, int i, lm_tensor_view *out) {
    if (!e || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_output: NULL argument");
    int k = 0;
    for (int64_t v = 0; v < e->g->nvalues; v++) {
        if (!e->g->values[v].output) continue;
        if (k++ != i) continue;
        if (e->dirty) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_output: bindings changed since the last run");
        *out = e->view[v];
        return LM_OK;
    }
    return lm__error(LM_OUT_OF_RANGE, "lm_exec_output: output %d of %d", i, k);
}

lm_status lm_exec_get_stats(const lm_exec *e, lm_exec_stats *out) {
    if (!e || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_exec_get_stats: NULL argument");
    memset(out, 0, sizeof *out);
    out->ops = e->g->nops;
    for (int64_t i = 0; i < e->g->nops; i++) out->fused_ops += e->g->ops[i].kind >= LM__GOP_ADD_RMSNORM;
    out->arena_bytes = e->arena_bytes;
    out->live_bytes = e->live_bytes;
    out->owned_bytes = e->owned_bytes;
    out->runs = e->runs;
    out->replays = e->replays;
    out->kernels = lm_device_graph_kernels(e->captured);
    return LM_OK;
}

const lm_graph *lm_exec_graph(const lm_exec *e) { return e ? e->g : NULL; }
