/* The GPU's rewrite passes, checked on the CPU: the decoder step graph of every
 * reference checkpoint goes through the CUDA pass pipeline (stacked q|k|v and
 * gate|up linears, the fused QKV + RoPE + KV write, GEMV input forms and residual
 * accumulation for few rows, fused add + RMSNorm and bf16 GEMM inputs for many),
 * under the GPU's rule for which fused linears run as one kernel; the result runs
 * on the CPU's operators (each fused operator's CPU level is its reference) and must
 * give the logits the canonical graph gives, within the rounding the passes add
 * (a bf16 prefill or decode step of more than 2 rows, whose GEMM inputs are rounded to
 * bf16: NMSE <= 1e-4, max |d| <= 2% of max |logit|, measured 4e-6..1.3e-5; everything
 * else NMSE <= 1e-9, measured ~1e-13).
 * It also checks what was fused: every layer has one fused QKV op (at decode with bf16
 * weights up to 2 rows or quantized weights from 3, and no q/k norms, joined with its
 * projection: linear_qkv_rope, whose CPU level is its composition), and with bf16
 * weights no RMSNorm, SwiGLU or residual add survives a 2-row decode step and a prefill
 * step's GEMM inputs are normalized into bf16 (other dtypes keep their unfused ops), and
 * past 2 rows the gate|up GEMM stores its product as bf16 for the SwiGLU (a 4-row decode
 * step); from 8 rows (prefills of 12 and 130 rows) the gate|up GEMM takes the SwiGLU
 * instead (linear_swiglu of bf16 x into a bf16 activation, the sm_90a GEMM's form; its
 * CPU level is the composition).
 * Quantized weights (llama_gqa2_f32 and qwen2_bias_sharded loaded as int8, int4 G32
 * and fp8) fuse the same way at every row count: stacked q|k|v and gate|up with their
 * scales stacked by rows (and int4's group), input forms and residual accumulation,
 * nothing left unfused in either step, a prefill's attention q in bf16 (the flash
 * kernel's); logits as the canonical graph's (decode NMSE <= 1e-9, prefill as bf16's).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"

#include "exec/internal.h"
#include "nn/internal.h"
#include "ops/internal.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static const char *k_models[] = {"llama_gqa2_f32",     "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
                                 "qwen2_bias_sharded", "qwen2_mqa_yarn",     "qwen3_headdim",
                                 "mistral_window_f32", "qwen2_window_bf16"};
#define NMODELS (int)(sizeof k_models / sizeof k_models[0])

static lm_ctx *g_ctx;

/* The pair epilogues' rule itself: RMSNorm input, f32 x, bf16 weights up to 2 rows (the
 * GEMV's rows in graphs), quantized 3-8 and int8 / fp8 at one row; and the graphs' rule against
 * the kernels' one. */
static void test_pair_epilogue_rule(void) {
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16, 0) == 1);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 2, 896, LM_F32, LM_BF16, 0) == 1);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 3, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 8, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 9, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 8, 896, LM_F32, LM_I8, 0) == 1);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 9, 896, LM_F32, LM_I8, 0) == 0);
    /* the kernels run f32 x over bf16 up to 8 rows; graphs use that for 2 */
    LT_CHECK(lm__linear_fused_rule(LM_LINEAR_IN_RMSNORM, 0, 8, 896, LM_F32, LM_BF16) == 1);
    LT_CHECK(lm__linear_graph_rule(LM_LINEAR_IN_RMSNORM, 0, 2, 896, LM_F32, LM_BF16) == 1);
    LT_CHECK(lm__linear_graph_rule(LM_LINEAR_IN_RMSNORM, 0, 3, 896, LM_F32, LM_BF16) == 0);
    LT_CHECK(lm__linear_graph_rule(LM_LINEAR_IN, 0, 3, 896, LM_BF16, LM_BF16) == 1); /* the GEMM */
    LT_CHECK(lm__linear_graph_rule(LM_LINEAR_IN_RMSNORM, 1, 8, 896, LM_F32, LM_I8) == 1);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN, 1, 896, LM_F32, LM_BF16, 0) == 0);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, LM_BF16, 1) == 0);
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 1, 896, LM_BF16, LM_BF16, 0) == 0);
    /* quantized: 3-8 rows, and int8 / fp8 at one row (their own GEMV shapes) */
    for (int q = 0; q < 3; q++) {
        lm_dtype w = q == 0 ? LM_I8 : q == 1 ? LM_F8_E4M3 : LM_U8;
        LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 1, 896, LM_F32, w, 0) == (w != LM_U8));
        LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 2, 896, LM_F32, w, 0) == 0);
        LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 3, 896, LM_F32, w, 0) == 1);
    }
    LT_CHECK(lm__linear_pair_rule(LM_LINEAR_IN_RMSNORM, 4, 912, LM_F32, LM_U8, 0) == 0); /* int4: K % 32 */
    /* the gate|up GEMM with its SwiGLU: bf16 x and weights, plain, from 8 rows (bf16 x
     * comes past the GEMV's rows: prefill and batched decode) */
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, 128, 896, LM_BF16, LM_BF16) == 1);
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, LM__LINEAR_SWIGLU_GEMM_ROWS, 896, LM_BF16, LM_BF16) == 1);
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, LM__LINEAR_SWIGLU_GEMM_ROWS - 1, 896, LM_BF16, LM_BF16) == 0);
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, 512, 896, LM_F32, LM_BF16) == 0);
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN_RMSNORM, 512, 896, LM_BF16, LM_BF16) == 0);
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, 512, 900, LM_BF16, LM_BF16) == 0); /* K % 8 */
    LT_CHECK(lm__linear_swiglu_gemm_rule(LM_LINEAR_IN, 512, 896, LM_BF16, LM_I8) == 0);
    LT_CHECK(lm_linear_swiglu_fused(lm_device_cpu(), LM_LINEAR_IN, 512, 896, LM_BF16, LM_BF16) == 0);
}


typedef struct binder {
    const lm_model *m;
    lm_tensor *made[256]; /* stacked weights built for the fused graph */
    int nmade;
} binder;

static lm_status lookup(void *user, const char *name, lm_tensor_view *out) {
    binder *b = user;
    const lm_tensor *t = lm__model_weight(b->m, name);
    if (!t) { /* "qkv_proj" / "gate_up_proj": rows of the members stacked */
        lm_tensor *s = NULL;
        LM_TRY(lm__model_stacked_weight(b->m, name, &s));
        b->made[b->nmade++] = s;
        t = s;
    }
    *out = *lm_tensor_as_view(t);
    return LM_OK;
}

static int count(const lm_graph *g, lm__gopk k) {
    int n = 0;
    for (int64_t i = 0; i < g->nops; i++) n += g->ops[i].kind == k;
    return n;
}

/* One step of B rows x T tokens (the rows at positions `start`, start + 3) through
 * graph g on fresh zero caches; logits [B, V] into out. */
static void run_step(const lm_model *m, const lm_graph *g, int64_t B, int64_t T, float *out) {
    const lm_model_config *c = &m->cfg;
    lm_exec_options o;
    lm_exec_options_default(&o);
    o.fuse = 0; /* run g as given */
    o.poison = 1;
    lm_exec *e = NULL;
    LT_CHECK_OK(lm_exec_create(g_ctx, g, &o, &e));
    if (!e) return;
    binder b = {m, {0}, 0};
    LT_CHECK_OK(lm_exec_bind_params(e, lookup, &b));
    int64_t cs[4] = {B, c->num_key_value_heads, T > 32 ? 256 : 64, c->head_dim};
    lm_tensor *caches[64] = {0};
    for (int l = 0; l < c->num_hidden_layers; l++)
        for (int kv = 0; kv < 2; kv++) {
            char name[32];
            snprintf(name, sizeof name, "%s_cache.%d", kv ? "v" : "k", l);
            LT_CHECK_OK(lm_tensor_zeros(lm_device_cpu(), LM_F32, 4, cs, &caches[2 * l + kv]));
            LT_CHECK_OK(lm_exec_bind(e, name, lm_tensor_as_view(caches[2 * l + kv])));
        }
    lm_tensor_view ids, pos, slots;
    LT_CHECK_OK(lm_exec_input(e, "ids", &ids));
    LT_CHECK_OK(lm_exec_input(e, "positions", &pos));
    LT_CHECK_OK(lm_exec_input(e, "slots", &slots));
    lt_rng r = lt_rng_seed(77);
    for (int64_t i = 0; i < B * T; i++) {
        ((int32_t *)ids.data)[i] = (int32_t)lt_rng_int(&r, 0, c->vocab_size - 1);
        ((int32_t *)pos.data)[i] = (int32_t)((i / T) * 3 + i % T);
    }
    for (int64_t i = 0; i < B; i++) ((int32_t *)slots.data)[i] = (int32_t)i;
    LT_CHECK_OK(lm_exec_run(e, g_ctx));
    lm_tensor_view y;
    LT_CHECK_OK(lm_exec_output(e, 0, &y));
    LT_CHECK_OK(lm_tensor_view_read(g_ctx, &y, out));
    for (int i = 0; i < 2 * c->num_hidden_layers; i++) lm_tensor_destroy(caches[i]);
    for (int i = 0; i < b.nmade; i++) lm_tensor_destroy(b.made[i]);
    lm_exec_destroy(e);
}

/* Stacked linears of the fused graph with weight scales (in[5]) of the weights' rows,
 * and int4's group in b; -1 when a stack lacks them. */
static int quant_stacks(const lm_graph *g, int group) {
    int n = 0;
    for (int64_t i = 0; i < g->nops; i++) {
        const lm__gop *op = &g->ops[i];
        if (op->kind == LM__GOP_LINEAR_QKV_ROPE) { /* the q|k|v stack joined to the front: scales in[3], group i[2] */
            if (op->in[3] < 0 || g->values[op->in[3]].dims[0] != g->values[op->in[1]].dims[0] || op->i[2] != group)
                return -1;
            n++;
            continue;
        }
        if ((op->kind != LM__GOP_LINEAR && op->kind != LM__GOP_LINEAR_SWIGLU) ||
            (!strstr(op->name, "qkv_proj") && !strstr(op->name, "gate_up_proj")))
            continue;
        if (op->in[5] < 0 || g->values[op->in[5]].dims[0] != g->values[op->in[1]].dims[0] || op->b != group) return -1;
        n++;
    }
    return n;
}

static void check_model_as(const char *name, lm_weights weights) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lm_model *m = NULL;
    lm_model_load_options lo;
    lm_model_load_options_default(&lo);
    lo.weights = weights;
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &lo, &m));
    if (!m) return;
    const lm_model_config *c = &m->cfg;
    lm_dtype wdt = lm_tensor_dtype(lm__model_weight(m, "model.layers.0.mlp.up_proj.weight"));
    int bf16 = wdt == LM_BF16; /* the rule fuses bf16 weights, and quantized ones at every row count */
    int quant = wdt == LM_I8 || wdt == LM_U8 || wdt == LM_F8_E4M3;
    /* decode rows (GEMV), a prefill of 12 rows and one of 130 (the gate|up GEMM with its
     * SwiGLU), 4 decode rows (the GEMM, its product stored as bf16 for the SwiGLU) */
    const int64_t shapes[4][2] = {{2, 1}, {2, 6}, {4, 1}, {1, 130}};
    for (int si = 0; si < 4; si++) {
        int s = si == 2 ? 0 : si == 3 ? 1 : si; /* the third is a decode step too, the fourth a prefill */
        int64_t B = shapes[si][0], T = shapes[si][1], V = c->vocab_size;
        lm_decoder_options o;
        lm_decoder_options_default(&o);
        o.batch = B, o.tokens = T, o.cache_slots = B, o.cache_tokens = T > 32 ? 256 : 64;
        o.matrix_dtype = quant ? LM_F32 : wdt; /* as stored */
        if (quant) o.param_dtype = lm__model_param_dtype, o.param_user = m; /* as nn/kv_cache.c builds it */
        lm_graph *g = NULL, *h = NULL, *fused = NULL;
        LT_CHECK_OK(lm_graph_build_decoder(c, &o, &g));
        lm__pass_env env;
        lm__exec_gpu_rules(&env); /* the GPU graphs' rules, whether or not this build has CUDA */
        LT_CHECK_OK(lm__exec_gpu_passes(g, &env, &fused));
        static const lm__pass_fn none[] = {lm__pass_hoist_leaves};
        LT_CHECK_OK(lm__graph_run_passes(g, &env, 1, none, &h));
        if (!fused || !h) return;
        int fronts = count(fused, LM__GOP_QKV_ROPE_STORE), with_proj = count(fused, LM__GOP_LINEAR_QKV_ROPE);
        LT_CHECK_MSG(fronts + with_proj == c->num_hidden_layers, "%s: %d fused QKV ops for %lld layers", name,
                     fronts + with_proj, (long long)c->num_hidden_layers);
        /* the decode GEMV takes the front (no q/k norms) for bf16 (up to 2 rows: more run
         * the GEMM) and quantized weights (from 3 rows) */
        int gemv_pairs = s == 0 && ((bf16 && B * T <= 2) || (quant && B * T > 2));
        int want_proj = gemv_pairs && !c->qk_norm ? (int)c->num_hidden_layers : 0;
        LT_CHECK_MSG(with_proj == want_proj, "%s %s %s: %d projections joined to the front, expected %d", name,
                     lm_weights_name(weights), s ? "prefill" : "decode", with_proj, want_proj);
        /* and the gate|up GEMV takes the SwiGLU (the down projection then reads [M, I] plainly) */
        int swiglus = count(fused, LM__GOP_LINEAR_SWIGLU);
        /* from 8 rows of bf16 x over bf16 weights (no bias): the gate|up GEMM takes its
         * SwiGLU, in prefill and batched decode alike: a bf16 activation, no product and no
         * SWIGLU op left */
        int swiglu_gemm = bf16 && !c->mlp_bias && B * T > LM__LINEAR_GEMV_BF16_ROWS &&
                          B * T >= LM__LINEAR_SWIGLU_GEMM_ROWS;
        int want_sw = gemv_pairs || swiglu_gemm ? (int)c->num_hidden_layers : 0;
        if (swiglu_gemm) {
            int act16 = 0;
            for (int64_t i = 0; i < fused->nops; i++)
                act16 += fused->ops[i].kind == LM__GOP_LINEAR_SWIGLU && fused->values[fused->ops[i].out].dtype == LM_BF16 &&
                         fused->values[fused->ops[i].in[0]].dtype == LM_BF16 && fused->ops[i].i[0] == LM_LINEAR_IN;
            LT_CHECK_MSG(act16 == c->num_hidden_layers && count(fused, LM__GOP_SWIGLU) == 0,
                         "%s %s %s of %lld rows: %d bf16 gate|up GEMMs with their SwiGLU, %d SwiGLUs left", name,
                         lm_weights_name(weights), s ? "prefill" : "decode", (long long)(B * T), act16,
                         count(fused, LM__GOP_SWIGLU));
        }
        LT_CHECK_MSG(swiglus == want_sw, "%s %s %s: %d gate|up projections with their SwiGLU, expected %d", name,
                     lm_weights_name(weights), s ? "prefill" : "decode", swiglus, want_sw);
        if ((s == 0 && bf16 && B * T <= 2) || quant) {
            LT_CHECK_MSG(count(fused, LM__GOP_RMSNORM) + count(fused, LM__GOP_SWIGLU) + count(fused, LM__GOP_ADD) == 0,
                         "%s %s %s: %d rmsnorm, %d swiglu, %d add left", name, lm_weights_name(weights),
                         s ? "prefill" : "decode", count(fused, LM__GOP_RMSNORM), count(fused, LM__GOP_SWIGLU),
                         count(fused, LM__GOP_ADD));
        }
        /* bf16 weights past the GEMV's rows: the gate|up GEMM stores bf16 for its SwiGLU */
        int low = 0;
        for (int64_t i = 0; i < fused->nops; i++)
            low += fused->ops[i].kind == LM__GOP_LINEAR && fused->values[fused->ops[i].out].dtype == LM_BF16;
        int want_low = bf16 && B * T > 2 && !c->mlp_bias && !swiglu_gemm ? (int)c->num_hidden_layers : 0;
        LT_CHECK_MSG(low == want_low, "%s %s %s: %d bf16 products, expected %d", name, lm_weights_name(weights),
                     s ? "prefill" : "decode", low, want_low);
        if (quant) {
            int n = quant_stacks(fused, (int)c->quant_group * (wdt == LM_U8));
            LT_CHECK_MSG(n == 2 * c->num_hidden_layers, "%s %s: %d quantized stacks for %lld layers", name,
                         lm_weights_name(weights), n, (long long)c->num_hidden_layers);
        }
        if (s == 1) {
            int narrow = 0;
            for (int64_t i = 0; i < fused->nops; i++)
                if (fused->ops[i].kind == LM__GOP_ADD_RMSNORM)
                    narrow += fused->values[fused->ops[i].out2].dtype == LM_BF16;
            int bq = 0;
            for (int64_t i = 0; i < fused->nops; i++)
                if (fused->ops[i].kind == LM__GOP_ATTENTION_CACHE)
                    bq += fused->values[fused->ops[i].in[0]].dtype == LM_BF16;
            LT_CHECK_MSG(bq == ((bf16 || quant) ? c->num_hidden_layers : 0), "%s %s prefill: %d bf16 attention q",
                         name, lm_weights_name(weights), bq);
            LT_CHECK_MSG(bf16 ? narrow > 0 : narrow == 0, "%s prefill: %d rows normalized into bf16 (weights %s)", name,
                         narrow, lm_dtype_name(o.matrix_dtype));
        }
        float *want = malloc(sizeof(float) * (size_t)(B * V)), *got = malloc(sizeof(float) * (size_t)(B * V));
        run_step(m, h, B, T, want);
        run_step(m, fused, B, T, got);
        double num = 0, den = 0, md = 0, mx = 0;
        for (int64_t i = 0; i < B * V; i++) {
            double d = (double)got[i] - want[i];
            num += d * d, den += (double)want[i] * want[i];
            md = fmax(md, fabs(d)), mx = fmax(mx, fabs(want[i]));
        }
        /* prefill rounds GEMM inputs (quantized: the flash q) to bf16, and so does a bf16
         * decode step of more than 2 rows (the GEMM path) */
        int narrowed = ((bf16 || quant) && s == 1) || (bf16 && B * T > 2);
        double nmse = num / (den > 0 ? den : 1), tol = narrowed ? 1e-4 : 1e-9;
        LT_CHECK_MSG(nmse <= tol && md <= (narrowed ? 0.02 : 1e-4) * mx && isfinite(nmse),
                     "%s %s %s: fused vs canonical nmse %.3g, max |d| %.3g of %.3g", name, lm_weights_name(weights),
                     s ? "prefill" : "decode", nmse, md, mx);
        free(want), free(got);
        lm_graph_destroy(g), lm_graph_destroy(h), lm_graph_destroy(fused);
    }
    lm_model_destroy(m);
}

static void test_gpu_passes_keep_the_logits(void) {
    for (int i = 0; i < NMODELS; i++) check_model_as(k_models[i], LM_WEIGHTS_AUTO);
}

/* The prefill's SwiGLU GEMM fuses only what its kernel computes: a product stored as
 * bf16 (with every product kept f32, env.low_out NULL, or a device rule that refuses
 * the rows, every SwiGLU stays) and, with both, exactly one per layer. */
static int no_gemm_swiglu(lm_device d, lm_linear_input in, int64_t rows, int64_t K, lm_dtype x, lm_dtype w) {
    (void)d;
    return lm__linear_pair_rule(in, rows, K, x, w, 0); /* the decode GEMV's pairs only */
}

static void test_swiglu_gemm_conditions(void) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/llama3_scaled_bf16", LOOM_SOURCE_DIR);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, lm_device_cpu(), &m));
    if (!m) return;
    const lm_model_config *c = &m->cfg;
    lm_decoder_options o;
    lm_decoder_options_default(&o);
    o.batch = 1, o.tokens = 130, o.cache_slots = 1, o.cache_tokens = 256, o.matrix_dtype = LM_BF16;
    lm_graph *g = NULL;
    LT_CHECK_OK(lm_graph_build_decoder(c, &o, &g));
    for (int v = 0; g && v < 3; v++) {
        lm__pass_env env;
        lm__exec_gpu_rules(&env);
        if (v == 1) env.low_out = NULL;
        if (v == 2) env.swiglu_fused = no_gemm_swiglu;
        lm_graph *fused = NULL;
        LT_CHECK_OK(lm__exec_gpu_passes(g, &env, &fused));
        if (!fused) continue;
        int want = v == 0 ? (int)c->num_hidden_layers : 0;
        LT_CHECK_MSG(count(fused, LM__GOP_LINEAR_SWIGLU) == want &&
                         count(fused, LM__GOP_SWIGLU) == (int)c->num_hidden_layers - want,
                     "variant %d: %d gate|up GEMMs with their SwiGLU (expected %d), %d SwiGLUs left", v,
                     count(fused, LM__GOP_LINEAR_SWIGLU), want, count(fused, LM__GOP_SWIGLU));
        lm_graph_destroy(fused);
    }
    lm_graph_destroy(g);
    lm_model_destroy(m);
}

static void test_gpu_passes_quantized(void) {
    static const lm_weights ws[3] = {LM_WEIGHTS_INT8, LM_WEIGHTS_INT4, LM_WEIGHTS_FP8};
    static const char *const models[2] = {"llama_gqa2_f32", "qwen2_bias_sharded"};
    for (int i = 0; i < 2; i++)
        for (int k = 0; k < 3; k++) check_model_as(models[i], ws[k]);
}

/* The value named name that ops read, or -1. */
static int read_value(const lm_graph *g, const char *name) {
    for (int64_t i = 0; i < g->nvalues; i++)
        if (strcmp(g->values[i].name, name) == 0 && g->values[i].nuses > 0) return (int)i;
    return -1;
}

/* A tied model quantized at load (qwen2_bias_sharded, int8) holds its table and the
 * table's int8 copy as "lm_head.weight": the step graph's output matrix is the copy, or
 * the table when the options ask (nn/kv_cache.c asks where the copy's product would pay
 * a dequantizing pass: past a GPU's GEMV rows, never on the CPU). */
static void test_tied_head_copy_or_table(void) {
    lm_model *m = NULL;
    lm_model_load_options lo;
    lm_model_load_options_default(&lo);
    lo.weights = LM_WEIGHTS_INT8;
    const char *dir = LOOM_SOURCE_DIR "/tests/data/models/qwen2_bias_sharded";
    LT_CHECK_OK(lm_model_load_opts(dir, lm_device_cpu(), &lo, &m));
    if (!m) return;
    const lm_tensor *copy = lm__model_weight(m, "lm_head.weight");
    LT_CHECK(m->cfg.tie_word_embeddings && copy && lm_tensor_dtype(copy) == LM_I8);
    for (int table = 0; table < 2; table++) {
        lm_decoder_options o;
        lm_decoder_options_default(&o);
        o.batch = 2, o.cache_slots = 2, o.cache_tokens = 16;
        o.param_dtype = lm__model_param_dtype, o.param_user = m;
        o.tied_head_float = table;
        lm_graph *g = NULL;
        LT_CHECK_OK(lm_graph_build_decoder(&m->cfg, &o, &g));
        if (!g) continue;
        int head = read_value(g, "lm_head.weight"), emb = read_value(g, "model.embed_tokens.weight");
        LT_CHECK_MSG(table ? head < 0 : head >= 0, "tied_head_float %d: lm_head.weight %s", table,
                     head >= 0 ? "read" : "not read");
        /* the table is read by the embedding lookup, and by the head too when it is the head */
        LT_CHECK(emb >= 0 && g->values[emb].nuses == 1 + table);
        lm_graph_destroy(g);
    }
    for (int64_t rows = 1; rows <= 64; rows *= 4) /* the CPU's int8 product needs no workspace */
        LT_CHECK(lm_linear_workspace_bytes(lm_device_cpu(), rows, lm_tensor_dim(copy, 0), m->cfg.hidden_size, LM_I8) ==
                 0);
    lm_model_destroy(m);
}

int main(void) {
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_ctx));
    LT_RUN(test_gpu_passes_keep_the_logits);
    LT_RUN(test_gpu_passes_quantized);
    LT_RUN(test_swiglu_gemm_conditions);
    LT_RUN(test_pair_epilogue_rule);
    LT_RUN(test_tied_head_copy_or_table);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
