/* The tile compiler on a decoder layer and on real data: a caller's data source
 * feeds inputs and parameters by name (per repeat iteration as NAME#ITER), simulated
 * outputs are read back and compared with an independent double-precision
 * computation written here — SwiGLU MLP with Hugging Face [out, in] weights, RoPE
 * (with q/k norms), the attention op under forced flash grids that run every path
 * (shared and straddled kv groups, kv-split combines, masked, skipped and dropped
 * blocks, no mask), and whole Llama/Mistral/Qwen2/Qwen3-shaped layers (GQA, MHA, a
 * window shorter than T, biases, q/k norms) on small16 and small4; refusals and
 * data-source errors name the op or value; unknown outputs and wrong sizes fail.
 * LM_TEST_LABELS: unit
 */
#include "harness.h"
#include "plan/low.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- named tensors: the data source and the test's own reference read the same ones -------------------- */
typedef struct tensor {
    char name[64];
    int64_t n;
    float *v; /* [n], already rounded to the value's dtype */
} tensor;

typedef struct tensors {
    tensor t[64];
    int n;
    const char *fail; /* name the data source refuses, NULL for none */
    int calls;
    int any;           /* 1: names not in the table get N(0, 0.1^2) values (and are recorded) */
    char seen[16][64]; /* the first names asked for */
} tensors;

static float f16(double x) { return lm_f16_to_f32(lm_f32_to_f16((float)x)); }

/* Adds name with n values mean + std * N(0,1) (seeded by the table position), rounded to f16 unless f32. */
static float *add(tensors *ts, const char *name, int64_t n, double mean, double std, int f32) {
    tensor *t = &ts->t[ts->n];
    lt_rng r = lt_rng_seed(1000 + (uint64_t)ts->n);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->n = n;
    t->v = malloc(sizeof(float) * (size_t)n);
    for (int64_t i = 0; i < n; i++) {
        double x = mean + std * lt_rng_normal(&r);
        t->v[i] = f32 ? (float)x : f16(x);
    }
    ts->n++;
    return t->v;
}

static void tensors_free(tensors *ts) {
    for (int i = 0; i < ts->n; i++) free(ts->t[i].v);
    ts->n = 0;
}

static lm_status fill(void *user, const char *name, lm_dtype dtype, int ndim, const int64_t *shape, float *dst) {
    tensors *ts = user;
    (void)dtype;
    if (ts->calls < 16) snprintf(ts->seen[ts->calls], sizeof ts->seen[0], "%s", name);
    ts->calls++;
    if (ts->fail && !strcmp(name, ts->fail)) return LM_NOT_FOUND;
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->t[i].name, name) && ts->t[i].n == n) {
            memcpy(dst, ts->t[i].v, sizeof(float) * (size_t)n);
            return LM_OK;
        }
    if (!ts->any) return LM_SHAPE_MISMATCH;
    lt_rng r = lt_rng_seed((uint64_t)ts->calls);
    for (int64_t i = 0; i < n; i++) dst[i] = (float)(0.1 * lt_rng_normal(&r));
    return LM_OK;
}

/* Simulation options reading the data of ts (2 threads). */
static lm_plan_sim_options with_data(tensors *ts) {
    lm_plan_sim_options so;
    lm_plan_sim_options_default(&so);
    so.threads = 2, so.fill = fill, so.fill_user = ts;
    return so;
}

/* Compiles g for m (options o), runs the checkers and simulates on the data of ts;
 * *p receives the plan (NULL when compile fails). The plan's own checks against its
 * reference must pass. */
static lm_plan_sim *compile_and_simulate(const char *what, const lm_graph *g, const lm_plan_machine *m,
                                         const lm_plan_options *o, tensors *ts, lm_plan **p) {
    *p = NULL;
    lm_status st = lm_plan_compile(g, m, o, p);
    LT_CHECK_MSG(st == LM_OK, "%s: compile: %s", what, lm_last_error());
    lm_plan_sim *s = NULL;
    if (*p) {
        LT_CHECK_OK(lm_plan_check(*p));
        lm_plan_sim_options so = with_data(ts);
        LT_CHECK_OK(lm_plan_simulate(*p, &so, &s));
    }
    if (s) {
        lm_plan_sim_summary sum;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK_MSG(sum.checks_failed == 0, "%s: %d of %d checks against the plan's reference failed (NMSE %.3g)",
                     what, sum.checks_failed, sum.checks, sum.worst_nmse);
    }
    return s;
}

/* NMSE and max |got - want| / max |want|; NaN/Inf never pass. */
static void compare(const char *what, const float *got, const double *want, int64_t n, double nmse_tol,
                    double rel_tol, double *nmse_out) {
    double num = 0, den = 0, maxd = 0, maxw = 0;
    int finite = 1;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)got[i] - want[i];
        finite &= isfinite(got[i]);
        num += d * d;
        den += want[i] * want[i];
        maxd = fmax(maxd, fabs(d));
        maxw = fmax(maxw, fabs(want[i]));
    }
    double nmse = num / den, rel = maxd / maxw;
    LT_CHECK_MSG(finite && nmse <= nmse_tol && rel <= rel_tol, "%s: NMSE %.3g (tol %.1g), max err %.3g of max %.3g",
                 what, nmse, nmse_tol, rel, rel_tol);
    if (nmse_out) *nmse_out = nmse;
}

static lm_plan_machine *machine(const char *name) {
    lm_plan_machine *m = NULL;
    LT_CHECK_OK(lm_plan_machine_preset(name, &m));
    return m;
}

/* ---- a GEMM fed by the data source ------------------------------------------------------------------------ */
static lm_graph *gemm_graph(int64_t M, int64_t K, int64_t N) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t xs[2] = {M, K}, ws[2] = {K, N};
    lm_graph_value x, w, y;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
    LT_CHECK_OK(lm_graph_param(g, "w", LM_F16, 2, ws, 0.0, 1.0, &w));
    LT_CHECK_OK(lm_graph_matmul(g, "y", x, w, LM_F16, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    return g;
}

static void test_data_source_feeds_inputs_and_outputs_read_back(void) {
    const int64_t M = 48, K = 40, N = 56;
    lm_plan_machine *m = machine("small16");
    lm_graph *g = gemm_graph(M, K, N);
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    tensors ts = {0};
    float *x = add(&ts, "x", M * K, 0, 1, 0), *w = add(&ts, "w", K * N, 0, 1.0 / sqrt((double)K), 0);
    lm_plan_sim_options so = with_data(&ts);
    lm_plan_sim *s = NULL;
    if (p) LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    if (s) {
        LT_CHECK(ts.calls == 2);
        lm_plan_sim_summary sum;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK(sum.checks == 1 && sum.checks_failed == 0);
        float *got = malloc(sizeof(float) * (size_t)(M * N));
        double *want = malloc(sizeof(double) * (size_t)(M * N));
        for (int64_t i = 0; i < M; i++)
            for (int64_t j = 0; j < N; j++) {
                double acc = 0;
                for (int64_t k = 0; k < K; k++) acc += (double)x[i * K + k] * w[k * N + j];
                want[i * N + j] = acc;
            }
        LT_CHECK_OK(lm_plan_sim_output(s, "y", got, M * N));
        compare("gemm", got, want, M * N, 1e-6, 5e-3, NULL);
        /* unknown names and wrong sizes are refused with the reason */
        LT_CHECK_STATUS(lm_plan_sim_output(s, "z", got, M * N), LM_NOT_FOUND);
        LT_CHECK_MSG(strstr(lm_last_error(), "'y'") != NULL, "%s", lm_last_error());
        LT_CHECK_STATUS(lm_plan_sim_output(s, "x", got, M * K), LM_NOT_FOUND);
        LT_CHECK_STATUS(lm_plan_sim_output(s, "y", got, M * N - 1), LM_SHAPE_MISMATCH);
        LT_CHECK_STATUS(lm_plan_sim_output(s, NULL, got, M * N), LM_INVALID_ARGUMENT);
        free(got);
        free(want);
    }
    lm_plan_sim_destroy(s);
    /* the data source's error stops the simulation and names the value */
    ts.fail = "w";
    s = NULL;
    if (p) LT_CHECK_STATUS(lm_plan_simulate(p, &so, &s), LM_NOT_FOUND);
    LT_CHECK(s == NULL);
    LT_CHECK_MSG(strstr(lm_last_error(), "'w'") != NULL, "%s", lm_last_error());
    ts.fail = NULL;
    tensors_free(&ts);
    add(&ts, "x", M * K, 0, 1, 0); /* w missing: the callback's own status comes back */
    if (p) LT_CHECK_STATUS(lm_plan_simulate(p, &so, &s), LM_SHAPE_MISMATCH);
    tensors_free(&ts);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

/* Parameters inside a Repeat body have one copy per iteration, asked for as "NAME#ITER". */
static void test_data_source_names_repeat_copies(void) {
    lm_plan_machine *m = machine("small16");
    lm_plan_workload w;
    lm_plan_workload_default(LM_PLAN_WL_MLP_REPEAT, &w);
    w.tokens = 16, w.width = 32, w.hidden = 48, w.repeat = 2;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_plan_workload_build(&w, &g));
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    tensors ts = {0};
    ts.any = 1;
    lm_plan_sim_options so = with_data(&ts);
    lm_plan_sim *s = NULL;
    if (p) LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    LT_CHECK_MSG(ts.calls == 1 + 2 * 4, "%d calls", ts.calls); /* x, then 4 parameters per iteration */
    int found0 = 0, found1 = 0;
    for (int i = 0; i < ts.calls && i < 16; i++) {
        found0 |= !strcmp(ts.seen[i], "fc1.weight#0");
        found1 |= !strcmp(ts.seen[i], "fc2.bias#1");
    }
    LT_CHECK(found0 && found1);
    lm_plan_sim_summary sum;
    if (s) {
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK_MSG(sum.checks_failed == 0, "%d of %d checks failed", sum.checks_failed, sum.checks);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}


/* ---- a decoder layer (Llama/Qwen2/Qwen3/Mistral shape) built with the public builders --------------------- */
typedef struct layer_cfg {
    const char *name, *machine;
    int64_t T, H, Hq, Hkv, D, I, window;
    int attention;       /* 0: only the MLP half (x + mlp(rms_norm(x))) */
    int qkv_bias, qk_norm; /* qwen2 biases, qwen3 q/k norms */
    double theta, factor;  /* RoPE base and attention factor */
} layer_cfg;

static const double k_eps = 1e-6;

static const float *get(const tensors *ts, const char *name) {
    for (int i = 0; i < ts->n; i++)
        if (!strcmp(ts->t[i].name, name)) return ts->t[i].v;
    return NULL;
}

static lm_graph_value param(lm_graph *g, tensors *ts, const char *name, int ndim, const int64_t *shape, double mean,
                            double std) {
    int64_t n = 1;
    for (int d = 0; d < ndim; d++) n *= shape[d];
    add(ts, name, n, mean, std, 0);
    lm_graph_value v = -1;
    LT_CHECK_OK(lm_graph_param(g, name, LM_F16, ndim, shape, mean, std, &v));
    return v;
}

/* y = x W^T (+ b) with W [out, in] as Hugging Face stores it (a permuted parameter). */
static lm_graph_value linear(lm_graph *g, tensors *ts, const char *name, lm_graph_value x, int64_t in, int64_t out,
                             int bias) {
    char nm[64];
    int64_t ws[2] = {out, in}, bs[1] = {out};
    const int perm[2] = {1, 0};
    snprintf(nm, sizeof nm, "%s.weight", name);
    lm_graph_value w = param(g, ts, nm, 2, ws, 0, 1.0 / sqrt((double)in)), wt = -1, y = -1, yb = -1;
    snprintf(nm, sizeof nm, "%s.weight_t", name);
    LT_CHECK_OK(lm_graph_permute(g, nm, w, perm, &wt));
    snprintf(nm, sizeof nm, "%s.matmul", name);
    LT_CHECK_OK(lm_graph_matmul(g, bias ? nm : name, x, wt, LM_F16, &y));
    if (!bias) return y;
    snprintf(nm, sizeof nm, "%s.bias", name);
    lm_graph_value b = param(g, ts, nm, 1, bs, 0, 0.1);
    LT_CHECK_OK(lm_graph_bias_add(g, name, y, b, &yb));
    return yb;
}

static lm_graph_value rms(lm_graph *g, tensors *ts, const char *name, lm_graph_value x, int64_t n) {
    char nm[64];
    int64_t s1[1] = {n};
    snprintf(nm, sizeof nm, "%s.weight", name);
    lm_graph_value w = param(g, ts, nm, 1, s1, 1.0, 0.1), y = -1;
    LT_CHECK_OK(lm_graph_rms_norm(g, name, x, w, k_eps, &y));
    return y;
}

/* The layer; outputs "y" and, with attention, "attn" (the attention op's output) and "mlp". */
static lm_graph *build_layer(const layer_cfg *c, tensors *ts) {
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t T = c->T, H = c->H, D = c->D, xs[2] = {T, H};
    lm_graph_value x = -1, x1, d, y = -1;
    add(ts, "x", T * H, 0, 1, 0);
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
    x1 = x;
    if (c->attention) {
        int64_t ps[2] = {1, T}, fs[1] = {D / 2}, q4s[4] = {1, T, c->Hq, D}, k4s[4] = {1, T, c->Hkv, D},
                as[2] = {T, c->Hq * D};
        lm_graph_value pos = -1, inv = -1, q4 = -1, k4 = -1, v4 = -1, qr = -1, kr = -1, a = -1, a2 = -1, o;
        float *pv = add(ts, "pos", T, 0, 0, 1), *iv = add(ts, "rope.inv_freq", D / 2, 0, 0, 1);
        for (int64_t t = 0; t < T; t++) pv[t] = (float)t;
        for (int64_t i = 0; i < D / 2; i++) iv[i] = (float)pow(c->theta, -2.0 * (double)i / (double)D);
        LT_CHECK_OK(lm_graph_input(g, "pos", LM_I32, 2, ps, 0, &pos));
        LT_CHECK_OK(lm_graph_param(g, "rope.inv_freq", LM_F32, 1, fs, 0, 0, &inv));
        lm_graph_value h = rms(g, ts, "input_layernorm", x, H);
        lm_graph_value q = linear(g, ts, "self_attn.q_proj", h, H, c->Hq * D, c->qkv_bias);
        lm_graph_value k = linear(g, ts, "self_attn.k_proj", h, H, c->Hkv * D, c->qkv_bias);
        lm_graph_value v = linear(g, ts, "self_attn.v_proj", h, H, c->Hkv * D, c->qkv_bias);
        LT_CHECK_OK(lm_graph_reshape(g, "q4", q, 4, q4s, &q4));
        LT_CHECK_OK(lm_graph_reshape(g, "k4", k, 4, k4s, &k4));
        LT_CHECK_OK(lm_graph_reshape(g, "v4", v, 4, k4s, &v4));
        if (c->qk_norm) {
            q4 = rms(g, ts, "self_attn.q_norm", q4, D);
            k4 = rms(g, ts, "self_attn.k_norm", k4, D);
        }
        LT_CHECK_OK(lm_graph_rope(g, "q_rope", q4, pos, inv, c->factor, &qr));
        LT_CHECK_OK(lm_graph_rope(g, "k_rope", k4, pos, inv, c->factor, &kr));
        LT_CHECK_OK(lm_graph_attention(g, "attn", qr, kr, v4, 1.0 / sqrt((double)D), 1, c->window, &a));
        LT_CHECK_OK(lm_graph_output(g, a));
        LT_CHECK_OK(lm_graph_reshape(g, "attn2", a, 2, as, &a2));
        o = linear(g, ts, "self_attn.o_proj", a2, c->Hq * D, H, c->qkv_bias);
        LT_CHECK_OK(lm_graph_binary(g, "x1", LM_GRAPH_ADD, x, o, &x1));
    }
    lm_graph_value h2 = rms(g, ts, "post_attention_layernorm", x1, H), s = -1;
    lm_graph_value gt = linear(g, ts, "mlp.gate_proj", h2, H, c->I, 0);
    lm_graph_value up = linear(g, ts, "mlp.up_proj", h2, H, c->I, 0);
    LT_CHECK_OK(lm_graph_swiglu(g, "swiglu", gt, up, &s));
    d = linear(g, ts, "mlp.down_proj", s, c->I, H, 0);
    LT_CHECK_OK(lm_graph_output(g, d));
    LT_CHECK_OK(lm_graph_binary(g, "y", LM_GRAPH_ADD, x1, d, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    return g;
}

/* ---- the same layer in double precision, straight from the formulas ---------------------------------------- */
/* y[t, o] = sum_i x[t, i] w[o, i] (+ b[o]); x [T, in], w [out, in]. */
static void ref_linear(const double *x, const float *w, const float *b, int64_t T, int64_t in, int64_t out, double *y) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t o = 0; o < out; o++) {
            double acc = b ? b[o] : 0.0;
            for (int64_t i = 0; i < in; i++) acc += x[t * in + i] * w[o * in + i];
            y[t * out + o] = acc;
        }
}

static void ref_rms(const double *x, const float *w, int64_t rows, int64_t n, double *y) {
    for (int64_t r = 0; r < rows; r++) {
        double ss = 0;
        for (int64_t i = 0; i < n; i++) ss += x[r * n + i] * x[r * n + i];
        double inv = 1.0 / sqrt(ss / (double)n + k_eps);
        for (int64_t i = 0; i < n; i++) y[r * n + i] = x[r * n + i] * inv * w[i];
    }
}

static const float *weight(const tensors *ts, const char *name, const char *what) {
    char nm[64];
    snprintf(nm, sizeof nm, "%s.%s", name, what);
    return get(ts, nm);
}

/* x [T, H, ...] rows of D: in place RoPE at positions pos with inv_freq inv. */
static void ref_rope(double *x, int64_t T, int64_t heads, int64_t D, const float *pos, const float *inv, double f) {
    for (int64_t t = 0; t < T; t++)
        for (int64_t i = 0; i < D / 2; i++) {
            double ang = (double)pos[t] * (double)inv[i], c = cos(ang) * f, s = sin(ang) * f;
            for (int64_t h = 0; h < heads; h++) {
                double *r = x + (t * heads + h) * D, a = r[i], b = r[i + D / 2];
                r[i] = a * c - b * s;
                r[i + D / 2] = b * c + a * s;
            }
        }
}

/* Grouped attention on token-major q [Tq, Hq, D], k/v [Tk, Hkv, D]: causal rows see
 * keys j <= i + Tk - Tq, and with a window only j > i + Tk - Tq - window. */
static void ref_attention(const double *q, const double *k, const double *v, int64_t Tq, int64_t Tk, int64_t Hq,
                          int64_t Hkv, int64_t D, int causal, int64_t window, double *out) {
    double *p = malloc(sizeof(double) * (size_t)Tk);
    for (int64_t h = 0; h < Hq; h++)
        for (int64_t i = 0; i < Tq; i++) {
            int64_t kh = h / (Hq / Hkv), last = causal ? i + Tk - Tq : Tk - 1;
            int64_t lo = window > 0 && last - window + 1 > 0 ? last - window + 1 : 0;
            double mx = -INFINITY, sum = 0;
            for (int64_t j = lo; j <= last; j++) {
                double dot = 0;
                for (int64_t e = 0; e < D; e++) dot += q[(i * Hq + h) * D + e] * k[(j * Hkv + kh) * D + e];
                p[j] = dot / sqrt((double)D);
                mx = fmax(mx, p[j]);
            }
            for (int64_t j = lo; j <= last; j++) sum += p[j] = exp(p[j] - mx);
            for (int64_t e = 0; e < D; e++) {
                double acc = 0;
                for (int64_t j = lo; j <= last; j++) acc += p[j] * v[(j * Hkv + kh) * D + e];
                out[(i * Hq + h) * D + e] = acc / sum;
            }
        }
    free(p);
}

/* y [T, H], attn [T, Hq*D] (with attention), mlp [T, H] in double. */
static void ref_layer(const layer_cfg *c, const tensors *ts, double *y, double *attn, double *mlp) {
    int64_t T = c->T, H = c->H, D = c->D, I = c->I, qn = c->Hq * D, kn = c->Hkv * D;
    double *x = malloc(sizeof(double) * (size_t)(T * H)), *h = malloc(sizeof(double) * (size_t)(T * H));
    double *gt = malloc(sizeof(double) * (size_t)(T * I)), *up = malloc(sizeof(double) * (size_t)(T * I));
    const float *xf = get(ts, "x");
    for (int64_t i = 0; i < T * H; i++) x[i] = xf[i];
    if (c->attention) {
        double *q = malloc(sizeof(double) * (size_t)(T * qn)), *k = malloc(sizeof(double) * (size_t)(T * kn)),
               *v = malloc(sizeof(double) * (size_t)(T * kn)), *o = malloc(sizeof(double) * (size_t)(T * H));
        const char *qp = "self_attn.q_proj", *kp = "self_attn.k_proj", *vp = "self_attn.v_proj";
        ref_rms(x, get(ts, "input_layernorm.weight"), T, H, h);
        ref_linear(h, weight(ts, qp, "weight"), c->qkv_bias ? weight(ts, qp, "bias") : NULL, T, H, qn, q);
        ref_linear(h, weight(ts, kp, "weight"), c->qkv_bias ? weight(ts, kp, "bias") : NULL, T, H, kn, k);
        ref_linear(h, weight(ts, vp, "weight"), c->qkv_bias ? weight(ts, vp, "bias") : NULL, T, H, kn, v);
        if (c->qk_norm) {
            ref_rms(q, get(ts, "self_attn.q_norm.weight"), T * c->Hq, D, q);
            ref_rms(k, get(ts, "self_attn.k_norm.weight"), T * c->Hkv, D, k);
        }
        ref_rope(q, T, c->Hq, D, get(ts, "pos"), get(ts, "rope.inv_freq"), c->factor);
        ref_rope(k, T, c->Hkv, D, get(ts, "pos"), get(ts, "rope.inv_freq"), c->factor);
        ref_attention(q, k, v, T, T, c->Hq, c->Hkv, D, 1, c->window, attn);
        ref_linear(attn, get(ts, "self_attn.o_proj.weight"), c->qkv_bias ? get(ts, "self_attn.o_proj.bias") : NULL,
                   T, qn, H, o);
        for (int64_t i = 0; i < T * H; i++) x[i] += o[i];
        free(q), free(k), free(v), free(o);
    }
    ref_rms(x, get(ts, "post_attention_layernorm.weight"), T, H, h);
    ref_linear(h, get(ts, "mlp.gate_proj.weight"), NULL, T, H, I, gt);
    ref_linear(h, get(ts, "mlp.up_proj.weight"), NULL, T, H, I, up);
    for (int64_t i = 0; i < T * I; i++) gt[i] = gt[i] / (1.0 + exp(-gt[i])) * up[i];
    ref_linear(gt, get(ts, "mlp.down_proj.weight"), NULL, T, I, H, mlp);
    for (int64_t i = 0; i < T * H; i++) y[i] = x[i] + mlp[i];
    free(x), free(h), free(gt), free(up);
}

/* Compiles, checks and simulates the layer on real data; compares the outputs with
 * ref_layer. f16 activations are rounded at every op while the reference keeps
 * double throughout, so the tolerances are those of f16 (NMSE 1e-5; max error 2% of
 * the largest magnitude, 3% on the attention output which passes 6 roundings). */
static void run_layer(const layer_cfg *c) {
    lm_plan_machine *m = machine(c->machine);
    tensors ts = {0};
    lm_graph *g = build_layer(c, &ts);
    lm_plan *p;
    lm_plan_sim *s = compile_and_simulate(c->name, g, m, NULL, &ts, &p);
    if (s) {
        int64_t T = c->T, H = c->H, qn = c->Hq * c->D;
        lm_plan_sim_summary sum;
        lm_plan_summary ps;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        LT_CHECK_OK(lm_plan_get_summary(p, &ps));
        double *y = malloc(sizeof(double) * (size_t)(T * H)), *mlp = malloc(sizeof(double) * (size_t)(T * H));
        double *attn = malloc(sizeof(double) * (size_t)(T * qn));
        float *got = malloc(sizeof(float) * (size_t)(T * (H > qn ? H : qn)));
        double ny = 0, na = 0, nm = 0;
        ref_layer(c, &ts, y, attn, mlp);
        LT_CHECK_OK(lm_plan_sim_output(s, "y", got, T * H));
        compare(c->name, got, y, T * H, 1e-5, 2e-2, &ny);
        LT_CHECK_OK(lm_plan_sim_output(s, "mlp.down_proj", got, T * H));
        compare(c->name, got, mlp, T * H, 1e-5, 2e-2, &nm);
        if (c->attention) {
            LT_CHECK_OK(lm_plan_sim_output(s, "attn", got, T * qn));
            compare(c->name, got, attn, T * qn, 1e-5, 3e-2, &na);
        }
        printf("  %-22s %s: predicted %.0f, simulated %.0f cycles (%.2fx bound); NMSE y %.2g, mlp %.2g, attn %.2g\n",
               c->name, c->machine, ps.predicted_cycles, sum.cycles, ps.predicted_cycles / ps.lower_bound_cycles, ny,
               nm, na);
        free(y), free(mlp), free(attn), free(got);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    tensors_free(&ts);
}

static void test_swiglu_mlp_with_hf_weights_matches_double(void) {
    layer_cfg c = {"mlp-half", "small16", 32, 64, 0, 0, 0, 160, 0, 0, 0, 0, 0, 0};
    run_layer(&c);
    c.name = "mlp-half small4", c.machine = "small4", c.T = 24, c.H = 32, c.I = 96;
    run_layer(&c);
}

/* q = x Wq^T reshaped to [1, T, heads, D], optionally RMS-normed per head, then RoPE
 * with i32 positions and an f32 inv_freq table: matches the double computation. */
static void rope_case(const char *mach, int64_t T, int64_t H, int64_t heads, int64_t D, int qk_norm, double factor) {
    lm_plan_machine *m = machine(mach);
    tensors ts = {0};
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t xs[2] = {T, H}, ps[2] = {1, T}, fs[1] = {D / 2}, q4s[4] = {1, T, heads, D};
    lm_graph_value x = -1, pos = -1, inv = -1, q4 = -1, r = -1;
    add(&ts, "x", T * H, 0, 1, 0);
    float *pv = add(&ts, "pos", T, 0, 0, 1), *iv = add(&ts, "rope.inv_freq", D / 2, 0, 0, 1);
    for (int64_t t = 0; t < T; t++) pv[t] = (float)(3 * t + 1); /* positions need not be 0..T-1 */
    for (int64_t i = 0; i < D / 2; i++) iv[i] = (float)pow(10000.0, -2.0 * (double)i / (double)D);
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, xs, 1.0, &x));
    LT_CHECK_OK(lm_graph_input(g, "pos", LM_I32, 2, ps, 0, &pos));
    LT_CHECK_OK(lm_graph_param(g, "rope.inv_freq", LM_F32, 1, fs, 0, 0, &inv));
    lm_graph_value q = linear(g, &ts, "q_proj", x, H, heads * D, 1);
    LT_CHECK_OK(lm_graph_reshape(g, "q4", q, 4, q4s, &q4));
    if (qk_norm) q4 = rms(g, &ts, "q_norm", q4, D);
    LT_CHECK_OK(lm_graph_rope(g, "rope", q4, pos, inv, factor, &r));
    LT_CHECK_OK(lm_graph_output(g, r));
    lm_plan *p;
    lm_plan_sim *s = compile_and_simulate("rope", g, m, NULL, &ts, &p);
    if (s) {
        int64_t n = T * heads * D;
        double *xd = malloc(sizeof(double) * (size_t)(T * H)), *want = malloc(sizeof(double) * (size_t)n);
        float *got = malloc(sizeof(float) * (size_t)n);
        for (int64_t i = 0; i < T * H; i++) xd[i] = get(&ts, "x")[i];
        ref_linear(xd, get(&ts, "q_proj.weight"), get(&ts, "q_proj.bias"), T, H, heads * D, want);
        if (qk_norm) ref_rms(want, get(&ts, "q_norm.weight"), T * heads, D, want);
        ref_rope(want, T, heads, D, pv, iv, factor);
        LT_CHECK_OK(lm_plan_sim_output(s, "rope", got, n));
        compare("rope", got, want, n, 1e-5, 2e-2, NULL);
        free(xd), free(want), free(got);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    tensors_free(&ts);
}

static void test_rope_matches_double(void) {
    rope_case("small16", 32, 64, 4, 16, 0, 1.0);
    rope_case("small16", 24, 48, 3, 32, 1, 1.25);
    rope_case("small4", 16, 32, 2, 16, 1, 1.0);
}

/* Llama/Mistral (grouped kv heads), a window shorter than T, Qwen2 biases with Qwen3
 * q/k norms, multi-head attention, and the smallest machine. */
static void test_decoder_layer_matches_double(void) {
    /* name, machine, T, H, Hq, Hkv, D, I, window, attention, qkv_bias, qk_norm, theta, factor */
    static const layer_cfg cases[] = {
        {"llama gqa", "small16", 32, 128, 4, 2, 32, 256, 0, 1, 0, 0, 10000.0, 1.0},
        {"mistral window 24", "small16", 64, 64, 4, 2, 16, 128, 24, 1, 0, 0, 10000.0, 1.0},
        {"qwen bias + qk norm", "small16", 32, 64, 4, 2, 32, 128, 0, 1, 1, 1, 1000000.0, 1.0},
        {"mha", "small16", 40, 64, 4, 4, 16, 160, 0, 1, 0, 0, 10000.0, 1.1},
        {"gqa small4", "small4", 16, 32, 4, 2, 8, 64, 0, 1, 1, 0, 10000.0, 1.0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_layer(&cases[i]);
}

/* The attention op alone on token-major inputs with a forced flash grid, so that
 * each path runs: kv heads shared by several query-head blocks (aligned or not),
 * several kv heads per block, kv-split combines, partially masked and skipped
 * blocks, steps no query sees (Tk > Tq with a window), and no mask at all. */
typedef struct attn_case {
    int64_t Tq, Tk, Hq, Hkv, D, window;
    int causal;
    int64_t grid[4];
    int expect_dropped; /* serial steps the mask removes entirely */
} attn_case;

static void attention_case(const attn_case *ac) {
    lm_plan_machine *m = machine("small16");
    tensors ts = {0};
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    int64_t qs[4] = {1, ac->Tq, ac->Hq, ac->D}, ks[4] = {1, ac->Tk, ac->Hkv, ac->D};
    int64_t nq = ac->Tq * ac->Hq * ac->D, nk = ac->Tk * ac->Hkv * ac->D;
    lm_graph_value q = -1, k = -1, v = -1, a = -1;
    float *qf = add(&ts, "q", nq, 0, 1, 0), *kf = add(&ts, "k", nk, 0, 1, 0), *vf = add(&ts, "v", nk, 0, 1, 0);
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, qs, 1, &q));
    LT_CHECK_OK(lm_graph_input(g, "k", LM_F16, 4, ks, 1, &k));
    LT_CHECK_OK(lm_graph_input(g, "v", LM_F16, 4, ks, 1, &v));
    LT_CHECK_OK(lm_graph_attention(g, "attn", q, k, v, 1.0 / sqrt((double)ac->D), ac->causal, ac->window, &a));
    LT_CHECK_OK(lm_graph_output(g, a));
    lm_plan_options o;
    lm_plan_options_default(&o);
    for (int i = 0; i < 4; i++) o.flash_grid[i] = ac->grid[i];
    lm_plan *p;
    lm_plan_sim *s = compile_and_simulate("attention", g, m, &o, &ts, &p);
    if (p) {
        int steps = 0, masked = 0, found = 0;
        for (int64_t i = 0; i < p->mid.nops; i++)
            if (p->mid.ops[i].kind == LM__PLAN_M_FLASH) {
                found = 1;
                for (int d = 0; d < 4; d++) LT_CHECK(p->mid.ops[i].grid[d] == ac->grid[d]);
            }
        LT_CHECK(found);
        for (int64_t i = 0; i < p->low.nsteps; i++)
            steps += p->low.steps[i].kind == LM__PLAN_S_EXCHANGE && !strncmp(p->low.steps[i].label, "flash step", 10);
        for (int64_t i = 0; i < p->low.ncalls; i++)
            masked += p->low.calls[i].kernel == LM__PLAN_K_FLASH_UPDATE && p->low.calls[i].i[0];
        LT_CHECK_MSG(steps == ac->grid[3] - ac->expect_dropped, "%d flash steps of %lld", steps,
                     (long long)ac->grid[3]);
        LT_CHECK_MSG(ac->causal ? masked > 0 : masked == 0, "%d masked updates", masked);
    }
    if (s) {
        lm_plan_sim_summary sum;
        LT_CHECK_OK(lm_plan_sim_get_summary(s, &sum));
        double ratio = sum.cycles / p->summary.predicted_cycles;
        LT_CHECK_MSG(ratio > 0.8 && ratio < 1.25, "simulated / predicted = %.3f", ratio);
        double *qd = malloc(sizeof(double) * (size_t)nq), *kd = malloc(sizeof(double) * (size_t)nk),
               *vd = malloc(sizeof(double) * (size_t)nk), *want = malloc(sizeof(double) * (size_t)nq);
        float *got = malloc(sizeof(float) * (size_t)nq);
        for (int64_t i = 0; i < nq; i++) qd[i] = qf[i];
        for (int64_t i = 0; i < nk; i++) kd[i] = kf[i], vd[i] = vf[i];
        ref_attention(qd, kd, vd, ac->Tq, ac->Tk, ac->Hq, ac->Hkv, ac->D, ac->causal, ac->window, want);
        LT_CHECK_OK(lm_plan_sim_output(s, "attn", got, nq));
        compare("attention", got, want, nq, 1e-5, 2e-2, NULL);
        free(qd), free(kd), free(vd), free(want), free(got);
    }
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    tensors_free(&ts);
}

static void test_attention_op_paths_match_double(void) {
    static const attn_case cases[] = {
        /* Tq, Tk, Hq, Hkv, D, window, causal, grid {heads, queries, kv tiles, steps}, dropped */
        {32, 32, 4, 2, 16, 0, 1, {4, 2, 2, 2}, 0},  /* a kv head shared by two head blocks, combine */
        {32, 32, 6, 2, 16, 0, 1, {3, 2, 2, 2}, 0},  /* head blocks straddling kv groups */
        {24, 24, 8, 2, 16, 0, 1, {1, 4, 1, 3}, 0},  /* two kv heads of four query heads per block */
        {48, 48, 4, 2, 16, 8, 1, {2, 4, 2, 3}, 0},  /* a window of 8: most blocks skipped */
        {16, 48, 4, 2, 16, 16, 1, {2, 2, 2, 3}, 1}, /* keys 0..16 seen by no query: step 0 dropped */
        {24, 24, 4, 2, 16, 0, 0, {2, 3, 1, 3}, 0},  /* no mask */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attention_case(&cases[i]);
}

/* Refusals name the op: an op without a kernel, i32 values other than RoPE
 * positions, a bf16 value, attention over two batch rows, the attention op with the
 * materialized strategy or a flash grid that does not fit; a data source giving
 * non-integer positions is refused naming the value. */
static const int64_t k_x2[2] = {16, 32}, k_x4[4] = {1, 16, 2, 16}, k_ps[2] = {1, 16};

/* Graphs the compiler must refuse; each returns its output value. */
static lm_graph_value cast_graph(lm_graph *g) { /* an op the tile machine has no kernel for */
    lm_graph_value x = -1, y = -1;
    LT_CHECK_OK(lm_graph_input(g, "x", LM_F16, 2, k_x2, 1, &x));
    LT_CHECK_OK(lm__graph_cast(g, "widen", x, LM_F32, &y));
    return y;
}

static lm_graph_value embedding_graph(lm_graph *g) { /* i32 ids that are not RoPE positions */
    int64_t tab[2] = {64, 32};
    lm_graph_value ids = -1, t = -1, y = -1;
    LT_CHECK_OK(lm_graph_input(g, "ids", LM_I32, 2, k_ps, 0, &ids));
    LT_CHECK_OK(lm_graph_param(g, "table", LM_F16, 2, tab, 0, 1, &t));
    LT_CHECK_OK(lm__graph_embedding(g, "embed", t, ids, LM_F16, &y));
    return y;
}

static lm_graph_value bf16_graph(lm_graph *g) {
    lm_graph_value x = -1, y = -1;
    LT_CHECK_OK(lm_graph_input(g, "xb", LM_BF16, 2, k_x2, 1, &x));
    LT_CHECK_OK(lm_graph_unary(g, "act", LM_GRAPH_SILU, x, &y));
    return y;
}

static lm_graph_value batch2_graph(lm_graph *g) {
    int64_t x4b[4] = {2, 16, 2, 16};
    lm_graph_value q = -1, a = -1;
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, x4b, 1, &q));
    LT_CHECK_OK(lm_graph_attention(g, "attn2", q, q, q, 0.25, 1, 0, &a));
    return a;
}

static lm_graph_value attention_graph(lm_graph *g) {
    lm_graph_value q = -1, k = -1, v = -1, a = -1;
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, k_x4, 1, &q));
    LT_CHECK_OK(lm_graph_input(g, "k", LM_F16, 4, k_x4, 1, &k));
    LT_CHECK_OK(lm_graph_input(g, "v", LM_F16, 4, k_x4, 1, &v));
    LT_CHECK_OK(lm_graph_attention(g, "attn", q, k, v, 0.25, 1, 0, &a));
    return a;
}

/* Compiling build's graph with options o fails with want, the detail naming a (and b). */
static void refused(lm_graph_value (*build)(lm_graph *), const lm_plan_options *o, lm_status want, const char *a,
                    const char *b) {
    lm_plan_machine *m = machine("small16");
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    LT_CHECK_OK(lm_graph_output(g, build(g)));
    lm_plan *p = NULL;
    lm_status st = lm_plan_compile(g, m, o, &p);
    int ok = st == want && p == NULL && strstr(lm_last_error(), a) && (!b || strstr(lm_last_error(), b));
    LT_CHECK_MSG(ok, "got %s: %s (want %s naming %s)", lm_status_name(st), lm_last_error(), lm_status_name(want), a);
    lm_plan_destroy(p);
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
}

static void test_refusals_name_the_op(void) {
    refused(cast_graph, NULL, LM_UNSUPPORTED, "'widen'", "cast");
    refused(embedding_graph, NULL, LM_UNSUPPORTED, "'embed'", "i32");
    refused(bf16_graph, NULL, LM_UNSUPPORTED, "'xb'", "bf16");
    refused(batch2_graph, NULL, LM_UNSUPPORTED, "'attn2'", "batch");
    /* the attention op: no materialized strategy, and a forced grid must fit */
    lm_plan_options o;
    lm_plan_options_default(&o);
    o.attention = LM_PLAN_ATTN_MATERIALIZED;
    refused(attention_graph, &o, LM_UNSUPPORTED, "'attn'", "flash");
    lm_plan_options_default(&o);
    o.flash_grid[0] = 3, o.flash_grid[1] = 1, o.flash_grid[2] = 1, o.flash_grid[3] = 1; /* 3 head blocks of 2 heads */
    refused(attention_graph, &o, LM_UNSUPPORTED, "'attn'", "3x1x1x1");
    o.flash_grid[3] = 0;
    refused(attention_graph, &o, LM_INVALID_ARGUMENT, "flash grid", NULL);
    /* positions must be integers */
    int64_t fs[1] = {8};
    lm_graph_value q = -1, pos = -1, inv = -1, y = -1;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_create(&g));
    LT_CHECK_OK(lm_graph_input(g, "q", LM_F16, 4, k_x4, 1, &q));
    LT_CHECK_OK(lm_graph_input(g, "pos", LM_I32, 2, k_ps, 0, &pos));
    LT_CHECK_OK(lm_graph_param(g, "inv", LM_F32, 1, fs, 0.1, 0.01, &inv));
    LT_CHECK_OK(lm_graph_rope(g, "rope", q, pos, inv, 1.0, &y));
    LT_CHECK_OK(lm_graph_output(g, y));
    lm_plan_machine *m = machine("small16");
    lm_plan *p = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    tensors ts = {0};
    add(&ts, "q", 16 * 2 * 16, 0, 1, 0);
    add(&ts, "pos", 16, 0, 1, 1); /* N(0, 1): not integers */
    add(&ts, "inv", 8, 0.1, 0.01, 1);
    lm_plan_sim_options so = with_data(&ts);
    lm_plan_sim *s = NULL;
    if (p) LT_CHECK_STATUS(lm_plan_simulate(p, &so, &s), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "'pos'") != NULL, "%s", lm_last_error());
    /* generated data: positions 0..T-1 */
    if (p) LT_CHECK_OK(lm_plan_simulate(p, NULL, &s));
    lm_plan_sim_destroy(s);
    tensors_free(&ts);
    lm_plan_destroy(p);
    lm_plan_machine_destroy(m);
    lm_graph_destroy(g);
}

/* Every k-th allocation failing (strided over compile and a data-source simulation
 * of a small layer) gives LM_OK or LM_OUT_OF_MEMORY and leaks nothing. */
static void test_layer_survives_allocation_failures(void) {
    layer_cfg c = {"gqa small4", "small4", 16, 32, 4, 2, 8, 64, 6, 1, 1, 1, 10000.0, 1.0};
    tensors ts = {0};
    lm_graph *g = build_layer(&c, &ts);
    lm_plan_machine *m = machine("small4");
    lm_plan_sim_options so = with_data(&ts);
    so.threads = 1;
    lt_alloc_track(0);
    lm_plan *p = NULL;
    lm_plan_sim *s = NULL;
    LT_CHECK_OK(lm_plan_compile(g, m, NULL, &p));
    if (p) LT_CHECK_OK(lm_plan_simulate(p, &so, &s));
    int64_t total = lt_alloc_count();
    lm_plan_sim_destroy(s);
    lm_plan_destroy(p);
    lt_alloc_untrack();
    for (int64_t f = 1; f <= total; f += total / 100 + 1) {
        lt_alloc_track(f);
        p = NULL, s = NULL;
        lm_status st = lm_plan_compile(g, m, NULL, &p);
        if (st == LM_OK) st = lm_plan_simulate(p, &so, &s);
        LT_CHECK_MSG(st == LM_OK || st == LM_OUT_OF_MEMORY, "failing allocation %lld gave %s: %s", (long long)f,
                     lm_status_name(st), lm_last_error());
        lm_plan_sim_destroy(s);
        lm_plan_destroy(p);
        LT_CHECK_MSG(lt_alloc_live() == 0, "failing allocation %lld leaked %lld", (long long)f,
                     (long long)lt_alloc_live());
        lt_alloc_untrack();
    }
    lm_graph_destroy(g);
    lm_plan_machine_destroy(m);
    tensors_free(&ts);
}

int main(void) {
    LT_RUN(test_data_source_feeds_inputs_and_outputs_read_back);
    LT_RUN(test_data_source_names_repeat_copies);
    LT_RUN(test_swiglu_mlp_with_hf_weights_matches_double);
    LT_RUN(test_rope_matches_double);
    LT_RUN(test_attention_op_paths_match_double);
    LT_RUN(test_decoder_layer_matches_double);
    LT_RUN(test_refusals_name_the_op);
    LT_RUN(test_layer_survives_allocation_failures);
    return lt_finish();
}
