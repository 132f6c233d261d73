/* plan/workload.c — the benchmark graphs: GEMM, the SigLIP MLP and attention
 * blocks (so400m sizes: 729 tokens, width 1152, MLP hidden 4304, 16 heads x 72) and
 * the MLP repeated; and the forms the published IPU21 figures were measured on (the
 * MLP without biases, attention with Q/K/V projections and no output projection).
 *
 * Weights are N(0, 1/fan_in) so activations stay O(1) through the blocks (values
 * must stay inside f16 range for the numerical checks); biases N(0, 0.02^2).
 * Checkpoints name the interesting intermediate values.
 */
#include "plan/internal.h"

#include <math.h>
#include <stdio.h>

void lm_plan_workload_default(lm_plan_workload_kind kind, lm_plan_workload *w) {
    if (!w) return;
    memset(w, 0, sizeof *w);
    w->kind = kind;
    w->m = w->n = w->k = 4096;
    w->tokens = 729;
    w->width = 1152;
    w->hidden = 4304;
    w->heads = 16;
    w->repeat = 4;
    w->dtype = LM_F16;
}

const char *lm_plan_workload_name(lm_plan_workload_kind kind) {
    static const char *const n[] = {"gemm",       "mlp",           "attention",    "mlp-repeat",
                                    "mlp-nobias", "attention-qkv", "encoder-layer", "encoder-stack"};
    return (unsigned)kind < sizeof n / sizeof n[0] ? n[kind] : NULL;
}

static lm_status linear(lm_graph *g, const char *name, lm_graph_value x, int64_t in, int64_t out, lm_dtype dt,
                        int bias, lm_graph_value *y) {
    char nm[LM__G_NAME];
    int64_t ws[2] = {in, out}, bs[1] = {out};
    lm_graph_value w, b, mm;
    snprintf(nm, sizeof nm, "%s.weight", name);
    LM_TRY(lm_graph_param(g, nm, dt, 2, ws, 0.0, 1.0 / sqrt((double)in), &w));
    snprintf(nm, sizeof nm, "%s.matmul", name);
    LM_TRY(lm_graph_matmul(g, bias ? nm : name, x, w, dt, &mm));
    if (!bias) {
        *y = mm;
        return LM_OK;
    }
    snprintf(nm, sizeof nm, "%s.bias", name);
    LM_TRY(lm_graph_param(g, nm, dt, 1, bs, 0.0, 0.02, &b));
    return lm_graph_bias_add(g, name, mm, b, y);
}

static lm_status mlp_block(lm_graph *g, const lm_plan_workload *w, lm_graph_value x, lm_graph_value *y) {
    lm_graph_value h, a;
    int bias = w->kind != LM_PLAN_WL_MLP_NOBIAS;
    LM_TRY(linear(g, "fc1", x, w->width, w->hidden, w->dtype, bias, &h));
    LM_TRY(lm_graph_unary(g, "gelu", LM_GRAPH_GELU, h, &a));
    LM_TRY(lm_graph_checkpoint(g, a, "mlp.hidden"));
    return linear(g, "fc2", a, w->hidden, w->width, w->dtype, bias, y);
}

static lm_status attention(lm_graph *g, const lm_plan_workload *w, lm_graph_value x, lm_graph_value *y) {
    int64_t C = w->width, H = w->heads, D = C / H;
    lm_graph_value q, k, v, Q, K, V, KT, S, P, O, Om;
    LM_TRY(linear(g, "q_proj", x, C, C, w->dtype, 1, &q));
    LM_TRY(linear(g, "k_proj", x, C, C, w->dtype, 1, &k));
    LM_TRY(linear(g, "v_proj", x, C, C, w->dtype, 1, &v));
    LM_TRY(lm_graph_split_heads(g, "q_heads", q, H, &Q));
    LM_TRY(lm_graph_split_heads(g, "k_heads", k, H, &K));
    LM_TRY(lm_graph_split_heads(g, "v_heads", v, H, &V));
    const int perm[3] = {0, 2, 1};
    LM_TRY(lm_graph_permute(g, "k_t", K, perm, &KT));
    LM_TRY(lm_graph_matmul(g, "scores", Q, KT, w->dtype, &S));
    LM_TRY(lm_graph_softmax(g, "softmax", S, 1.0 / sqrt((double)D), &P));
    LM_TRY(lm_graph_matmul(g, "context", P, V, w->dtype, &O));
    if (w->kind == LM_PLAN_WL_ATTENTION_QKV) { /* the context is the output, head-major [H, T, D] */
        *y = O;
        return LM_OK;
    }
    LM_TRY(lm_graph_checkpoint(g, O, "attn.context"));
    LM_TRY(lm_graph_merge_heads(g, "merge_heads", O, &Om));
    return linear(g, "o_proj", Om, C, C, w->dtype, 1, y);
}

/* LayerNorm over the width with gamma ~ 1 + N(0, 0.02^2), beta ~ N(0, 0.02^2) (eps 1e-6, SigLIP's). */
static lm_status layer_norm(lm_graph *g, const char *name, lm_graph_value x, const lm_plan_workload *w,
                            lm_graph_value *y) {
    char nm[LM__G_NAME];
    int64_t s[1] = {w->width};
    lm_graph_value gamma, beta;
    snprintf(nm, sizeof nm, "%s.weight", name);
    LM_TRY(lm_graph_param(g, nm, w->dtype, 1, s, 1.0, 0.02, &gamma));
    snprintf(nm, sizeof nm, "%s.bias", name);
    LM_TRY(lm_graph_param(g, nm, w->dtype, 1, s, 0.0, 0.02, &beta));
    return lm_graph_layer_norm(g, name, x, gamma, beta, 1e-6, y);
}

/* One pre-LayerNorm encoder layer (SigLIP's): the residual stream stays O(1) because
 * each block adds an O(1) update to it. */
static lm_status encoder_layer(lm_graph *g, const lm_plan_workload *w, lm_graph_value x, lm_graph_value *y) {
    lm_graph_value h, a, r, h2, m;
    LM_TRY(layer_norm(g, "ln1", x, w, &h));
    LM_TRY(attention(g, w, h, &a));
    LM_TRY(lm_graph_binary(g, "residual1", LM_GRAPH_ADD, x, a, &r));
    LM_TRY(lm_graph_checkpoint(g, r, "layer.residual1"));
    LM_TRY(layer_norm(g, "ln2", r, w, &h2));
    LM_TRY(mlp_block(g, w, h2, &m));
    return lm_graph_binary(g, "residual2", LM_GRAPH_ADD, r, m, y);
}

lm_status lm_plan_workload_build(const lm_plan_workload *w, lm_graph **out) {
    if (!w || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_plan_workload_build: NULL argument");
    *out = NULL;
    if (w->dtype != LM_F16 && w->dtype != LM_F32)
        return lm__error(LM_UNSUPPORTED, "workload: dtype %s (f16 or f32)", lm_dtype_name(w->dtype));
    int64_t lim = 1LL << 20;
    int bad = 0;
    switch (w->kind) {
    case LM_PLAN_WL_GEMM: bad = w->m < 1 || w->n < 1 || w->k < 1 || w->m > lim || w->n > lim || w->k > lim; break;
    case LM_PLAN_WL_ATTENTION:
    case LM_PLAN_WL_ATTENTION_QKV:
    case LM_PLAN_WL_ENCODER_LAYER:
    case LM_PLAN_WL_ENCODER_STACK:
        bad = w->heads < 1 || w->width % (w->heads > 0 ? w->heads : 1) != 0;
        /* fallthrough */
    case LM_PLAN_WL_MLP:
    case LM_PLAN_WL_MLP_NOBIAS:
    case LM_PLAN_WL_MLP_REPEAT:
        bad |= w->tokens < 1 || w->width < 1 || w->hidden < 1 || w->tokens > lim || w->width > lim || w->hidden > lim;
        if (w->kind == LM_PLAN_WL_MLP_REPEAT || w->kind == LM_PLAN_WL_ENCODER_STACK)
            bad |= w->repeat < 1 || w->repeat > 4096;
        break;
    default: return lm__error(LM_INVALID_ARGUMENT, "workload: unknown kind %d", (int)w->kind);
    }
    if (bad)
        return lm__error(LM_INVALID_ARGUMENT, "workload %s: sizes out of range (or width not divisible by heads)",
                         lm_plan_workload_name(w->kind));
    lm_graph *g;
    LM_TRY(lm_graph_create(&g));
    lm_status st = LM_OK;
    lm_graph_value x, y;
    if (w->kind == LM_PLAN_WL_GEMM) {
        int64_t xs[2] = {w->m, w->k};
        st = lm_graph_input(g, "x", w->dtype, 2, xs, 1.0, &x);
        if (st == LM_OK) st = linear(g, "gemm", x, w->k, w->n, w->dtype, 0, &y);
    } else {
        int64_t xs[2] = {w->tokens, w->width};
        st = lm_graph_input(g, "x", w->dtype, 2, xs, 1.0, &x);
        if (st == LM_OK && (w->kind == LM_PLAN_WL_MLP || w->kind == LM_PLAN_WL_MLP_NOBIAS))
            st = mlp_block(g, w, x, &y);
        if (st == LM_OK && (w->kind == LM_PLAN_WL_ATTENTION || w->kind == LM_PLAN_WL_ATTENTION_QKV))
            st = attention(g, w, x, &y);
        if (st == LM_OK && w->kind == LM_PLAN_WL_ENCODER_LAYER) st = encoder_layer(g, w, x, &y);
        if (st == LM_OK && (w->kind == LM_PLAN_WL_MLP_REPEAT || w->kind == LM_PLAN_WL_ENCODER_STACK)) {
            lm_graph_value in, body;
            st = lm_graph_repeat_begin(g, w->repeat, 1, &x, &in);
            if (st == LM_OK)
                st = w->kind == LM_PLAN_WL_MLP_REPEAT ? mlp_block(g, w, in, &body) : encoder_layer(g, w, in, &body);
            if (st == LM_OK) st = lm_graph_repeat_end(g, 1, &body, &y);
        }
    }
    if (st == LM_OK) st = lm_graph_output(g, y);
    if (st != LM_OK) {
        lm_graph_destroy(g);
        return st;
    }
    *out = g;
    return LM_OK;
}
