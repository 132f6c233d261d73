/* The executor's contract on the CPU (include/loom/exec.h), on a small graph built
 * with the public builders: x [6, 16] -> rmsnorm -> matmul with w [16, 24] -> silu ->
 * matmul with v [24, 16] -> + x, the output.
 *  - its output equals the same chain run operator by operator (NMSE 1e-12: the same
 *    kernels in the same order; poisoned outputs in both);
 *  - the arena is planned by liveness: at least the live lower bound, smaller than
 *    the sum of every value's bytes (values whose lives do not overlap share bytes);
 *  - bindings: an unknown name is LM_NOT_FOUND, a view of the wrong shape or dtype is
 *    refused naming the value, an unbound input is named when running, an output
 *    index past the last is LM_OUT_OF_RANGE; an executor-owned input buffer keeps
 *    its address;
 *  - a tile-compiler-only op (gelu) is LM_UNSUPPORTED naming it at creation;
 *  - external arenas: running without one names what to call, one too small is
 *    refused with the size needed, and two executors sharing one arena give their
 *    own results when run alternately; poisoning the arena before each run changes
 *    nothing in the outputs.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "loom/exec.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;

enum { M = 6, H = 16, F = 24 };

typedef struct weights {
    lm_tensor *x, *gamma, *w, *v;
} weights;

static weights make_weights(uint64_t seed) {
    lt_rng r = lt_rng_seed(seed);
    int64_t xs[2] = {M, H}, gs[1] = {H}, ws[2] = {H, F}, vs[2] = {F, H};
    weights t = {lt_random_tensor(&r, LM_F32, 2, xs, 1.0), lt_random_tensor(&r, LM_F32, 1, gs, 1.0),
                 lt_random_tensor(&r, LM_F32, 2, ws, 0.3), lt_random_tensor(&r, LM_F32, 2, vs, 0.3)};
    return t;
}

static void free_weights(weights *t) {
    lm_tensor_destroy(t->x), lm_tensor_destroy(t->gamma), lm_tensor_destroy(t->w), lm_tensor_destroy(t->v);
}

/* The graph; gelu instead of silu when `tile_only`. */
static lm_graph *build(int tile_only) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t xs[2] = {M, H}, gs[1] = {H}, ws[2] = {H, F}, vs[2] = {F, H};
    lm_graph_value x, gamma, w, v, h, a, b, c, y;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F32, 2, xs, 1.0, &x));
    LT_CHECK_OK(lm_graph_param(g, "gamma", LM_F32, 1, gs, 1.0, 0.1, &gamma));
    LT_CHECK_OK(lm_graph_param(g, "w", LM_F32, 2, ws, 0.0, 0.1, &w));
    LT_CHECK_OK(lm_graph_param(g, "v", LM_F32, 2, vs, 0.0, 0.1, &v));
    LT_CHECK_OK(lm_graph_rms_norm(g, "norm", x, gamma, 1e-5, &h));
    LT_CHECK_OK(lm_graph_matmul(g, "up", h, w, LM_F32, &a));
    LT_CHECK_OK(lm_graph_unary(g, "act", tile_only ? LM_GRAPH_GELU : LM_GRAPH_SILU, a, &b));
    LT_CHECK_OK(lm_graph_matmul(g, "down", b, v, LM_F32, &c));
    LT_CHECK_OK(lm_graph_binary(g, "residual", LM_GRAPH_ADD, c, x, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    return g;
}

/* The same chain through the operators, into want [M, H]. */
static void reference(const weights *t, lm_tensor *want) {
    int64_t hs[2] = {M, H}, as[2] = {M, F};
    lm_tensor *h = lt_poisoned_tensor(LM_F32, 2, hs), *a = lt_poisoned_tensor(LM_F32, 2, as);
    lm_tensor *b = lt_poisoned_tensor(LM_F32, 2, as), *c = lt_poisoned_tensor(LM_F32, 2, hs);
#define V(p) lm_tensor_as_view(p)
    LT_CHECK_OK(lm_rmsnorm_out(g_ctx, V(t->x), V(t->gamma), 1e-5f, V(h)));
    LT_CHECK_OK(lm_matmul_out(g_ctx, V(h), V(t->w), V(a)));
    LT_CHECK_OK(lm_silu_out(g_ctx, V(a), V(b)));
    LT_CHECK_OK(lm_matmul_out(g_ctx, V(b), V(t->v), V(c)));
    LT_CHECK_OK(lm_add_out(g_ctx, V(c), V(t->x), V(want)));
#undef V
    lm_tensor_destroy(h), lm_tensor_destroy(a), lm_tensor_destroy(b), lm_tensor_destroy(c);
}

static void bind_all(lm_exec *e, const weights *t) {
    LT_CHECK_OK(lm_exec_bind(e, "x", lm_tensor_as_view(t->x)));
    LT_CHECK_OK(lm_exec_bind(e, "gamma", lm_tensor_as_view(t->gamma)));
    LT_CHECK_OK(lm_exec_bind(e, "w", lm_tensor_as_view(t->w)));
    LT_CHECK_OK(lm_exec_bind(e, "v", lm_tensor_as_view(t->v)));
}

static void check_output(lm_exec *e, const weights *t, const char *what) {
    int64_t hs[2] = {M, H};
    lm_tensor *want = lt_poisoned_tensor(LM_F32, 2, hs);
    reference(t, want);
    lm_tensor_view y;
    LT_CHECK_OK(lm_exec_output(e, 0, &y));
    double *got = lt_view_to_f64(&y), *ref = lt_view_to_f64(lm_tensor_as_view(want));
    lt_check_close(what, got, ref, M * H, 1e-12, 1e-5);
    free(got), free(ref);
    lm_tensor_destroy(want);
}

static void test_runs_like_the_operators(void) {
    weights t = make_weights(1);
    lm_graph *g = build(0);
    lm_exec_options o;
    lm_exec_options_default(&o);
    o.poison = 1;
    lm_exec *e = NULL;
    LT_CHECK_OK(lm_exec_create(g_ctx, g, &o, &e));
    lm_graph_destroy(g); /* the executor keeps its own copy */
    if (!e) return;
    bind_all(e, &t);
    for (int run = 0; run < 2; run++) {
        LT_CHECK_OK(lm_exec_run(e, g_ctx));
        check_output(e, &t, run ? "second run" : "first run");
    }
    lm_exec_stats s;
    LT_CHECK_OK(lm_exec_get_stats(e, &s));
    /* every computed value: h [M, H], a and b [M, F], c and the output [M, H] */
    int64_t all = 4 * (3 * M * H + 2 * M * F);
    LT_CHECK_MSG(s.live_bytes > 0 && s.arena_bytes >= s.live_bytes && s.arena_bytes < all,
                 "arena %lld, live %lld, all values %lld", (long long)s.arena_bytes, (long long)s.live_bytes,
                 (long long)all);
    LT_CHECK(s.runs == 2 && s.replays == 0); /* the CPU cannot capture */
    lm_exec_destroy(e);
    free_weights(&t);
}

static void test_binding_errors_name_the_value(void) {
    weights t = make_weights(2);
    lm_graph *g = build(0);
    lm_exec *e = NULL;
    LT_CHECK_OK(lm_exec_create(g_ctx, g, NULL, &e));
    lm_graph_destroy(g);
    if (!e) return;
    LT_CHECK_STATUS(lm_exec_bind(e, "nope", lm_tensor_as_view(t.x)), LM_NOT_FOUND);
    LT_CHECK(strstr(lm_last_error(), "nope"));
    LT_CHECK(lm_exec_bind(e, "w", lm_tensor_as_view(t.v)) != LM_OK && strstr(lm_last_error(), "w")); /* [F, H] */
    int64_t xs[2] = {M, H};
    lm_tensor *xb = lt_poisoned_tensor(LM_BF16, 2, xs);
    LT_CHECK(lm_exec_bind(e, "x", lm_tensor_as_view(xb)) != LM_OK && strstr(lm_last_error(), "x"));
    LT_CHECK_OK(lm_exec_bind(e, "gamma", lm_tensor_as_view(t.gamma)));
    LT_CHECK_OK(lm_exec_bind(e, "w", lm_tensor_as_view(t.w)));
    LT_CHECK_OK(lm_exec_bind(e, "v", lm_tensor_as_view(t.v)));
    LT_CHECK_STATUS(lm_exec_run(e, g_ctx), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "'x'"));
    /* an executor-owned buffer for x: the same address every time */
    lm_tensor_view in1, in2, y;
    LT_CHECK_OK(lm_exec_input(e, "x", &in1));
    LT_CHECK_OK(lm_exec_input(e, "x", &in2));
    LT_CHECK(in1.data == in2.data && in1.shape[0] == M && in1.shape[1] == H);
    memcpy(in1.data, lm_tensor_data(t.x), sizeof(float) * M * H);
    LT_CHECK_OK(lm_exec_run(e, g_ctx));
    check_output(e, &t, "owned input");
    LT_CHECK_STATUS(lm_exec_output(e, 1, &y), LM_OUT_OF_RANGE);
    lm_tensor_destroy(xb);
    lm_exec_destroy(e);
    /* gelu runs only on the tile machine */
    g = build(1);
    e = NULL;
    LT_CHECK_STATUS(lm_exec_create(g_ctx, g, NULL, &e), LM_UNSUPPORTED);
    LT_CHECK(strstr(lm_last_error(), "act") && e == NULL);
    lm_graph_destroy(g);
    free_weights(&t);
}

static void test_shared_external_arena(void) {
    weights t1 = make_weights(3), t2 = make_weights(4);
    lm_graph *g = build(0);
    lm_exec_options o;
    lm_exec_options_default(&o);
    o.external_arena = 1;
    o.poison = 1;
    lm_exec *a = NULL, *b = NULL;
    LT_CHECK_OK(lm_exec_create(g_ctx, g, &o, &a));
    LT_CHECK_OK(lm_exec_create(g_ctx, g, &o, &b));
    lm_graph_destroy(g);
    if (!a || !b) return;
    bind_all(a, &t1);
    bind_all(b, &t2);
    LT_CHECK_STATUS(lm_exec_run(a, g_ctx), LM_INVALID_ARGUMENT);
    LT_CHECK(strstr(lm_last_error(), "lm_exec_set_arena"));
    lm_exec_stats s;
    LT_CHECK_OK(lm_exec_get_stats(a, &s));
    void *arena = NULL;
    LT_CHECK_OK(lm_device_alloc(lm_device_cpu(), (size_t)s.arena_bytes, &arena));
    LT_CHECK_STATUS(lm_exec_set_arena(a, arena, (size_t)s.arena_bytes - 1), LM_INVALID_ARGUMENT);
    LT_CHECK_OK(lm_exec_set_arena(a, arena, (size_t)s.arena_bytes));
    LT_CHECK_OK(lm_exec_set_arena(b, arena, (size_t)s.arena_bytes));
    for (int round = 0; round < 2; round++) { /* each output read before the other runs */
        LT_CHECK_OK(lm_exec_run(a, g_ctx));
        check_output(a, &t1, "shared arena, executor a");
        LT_CHECK_OK(lm_exec_run(b, g_ctx));
        check_output(b, &t2, "shared arena, executor b");
    }
    lm_exec_options own;
    lm_exec_options_default(&own);
    lm_exec *c = NULL;
    g = build(0);
    LT_CHECK_OK(lm_exec_create(g_ctx, g, &own, &c));
    lm_graph_destroy(g);
    LT_CHECK_STATUS(lm_exec_set_arena(c, arena, (size_t)s.arena_bytes), LM_INVALID_ARGUMENT);
    lm_exec_destroy(c);
    lm_exec_destroy(a);
    lm_exec_destroy(b);
    lm_device_free(lm_device_cpu(), arena);
    free_weights(&t1), free_weights(&t2);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_runs_like_the_operators);
    LT_RUN(test_binding_errors_name_the_value);
    LT_RUN(test_shared_external_arena);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
