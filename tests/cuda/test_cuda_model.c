/* The CUDA forward pass against the CPU forward pass and transformers, on every
 * reference checkpoint in tests/data/models:
 *  - prefill logits at every position of the three reference prompts (12 and 40
 *    tokens take the GEMM path, 1 token the decode path), then one-token decode steps
 *    through the reference greedy tokens (step 1 eager, step 2 captured as a graph,
 *    later steps replayed), GPU against CPU logits;
 *  - greedy continuations picked on the device (lm_model_forward_sample) against
 *    transformers' tokens, trusted while the reference margin allows (below);
 *  - ten rows decoded in one step (GEMM path, B > 8) and two rows at different
 *    positions (GEMV path) against the same rows run one at a time;
 *  - argument errors: a context on another device than the model, sampling
 *    parameters out of range.
 * Tolerance (bf16): the GPU rounds every weight to bf16 (relative 2^-9), the KV cache
 * and the GEMM inputs (normalized rows, attention output, SwiGLU output) to bf16, and
 * keeps the residual stream and all accumulation in f32; the CPU reference is f32
 * throughout (f32/f16 weights stay exact there). With about ten such roundings on the
 * path of a logit, each ~2^-9 relative and independent, the logit error is ~1% of the
 * logits' scale rms and a few times that at the extreme element. Gate per step: NMSE
 * <= 2e-3 and max |dlogit| <= 5% of max |logit|; the measured values are printed.
 * Greedy rule: a step's token is compared only while every step so far had a
 * transformers margin (top-1 minus top-2 logit) above 4 * delta, delta being the
 * prompt's measured max |dlogit| GPU vs CPU (each of the two logits may move by
 * delta, times a safety factor 2); from the first closer step on, divergence is
 * legitimate and comparison stops.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda model
 */
#include "cuda_test.h"
#include "loom/model.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static const char *k_models[] = {"llama_gqa2_f32",     "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
                                 "qwen2_bias_sharded", "qwen2_mqa_yarn",     "qwen3_headdim",
                                 "mistral_window_f32", "qwen2_window_bf16"};
#define NMODELS (int)(sizeof k_models / sizeof k_models[0])

static lm_ctx *g_gpu, *g_cpu;

static lm_model *load(const char *name, lm_device dev) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lm_model *m = NULL;
    LT_CHECK_OK(lm_model_load(dir, dev, &m));
    return m;
}

/* Compares GPU and CPU logits [n]; returns the max |diff| (infinite on failure). */
static double compare(const char *what, const float *gpu, const float *cpu, int64_t n) {
    double num = 0, den = 0, md = 0, mx = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)gpu[i] - cpu[i];
        num += d * d, den += (double)cpu[i] * cpu[i];
        if (!(fabs(d) <= md)) md = fabs(d);
        mx = fmax(mx, fabs(cpu[i]));
    }
    double nmse = num / (den > 0 ? den : 1);
    int ok = nmse <= 2e-3 && md <= 0.05 * mx;
    LT_CHECK_MSG(ok, "%s: nmse %.3g, max |d| %.3g vs max |logit| %.3g", what, nmse, md, mx);
    return ok ? md : INFINITY;
}

typedef struct pair_models {
    lm_model *cpu, *gpu;
    int64_t V;
    double worst_nmse_delta; /* largest delta seen, for the summary line */
    int greedy_compared, greedy_total;
} pair_models;

static void check_prompt(pair_models *pm, const char *name, const lt_fixture *fx, int p) {
    char key[64];
    snprintf(key, sizeof key, "prompt%d_ids", p);
    const lt_fixture_tensor *ids = lt_fixture_get(fx, key);
    snprintf(key, sizeof key, "prompt%d_greedy", p);
    const lt_fixture_tensor *greedy = lt_fixture_get(fx, key);
    snprintf(key, sizeof key, "prompt%d_margin", p);
    const lt_fixture_tensor *margin = lt_fixture_get(fx, key);
    if (!ids || !greedy || !margin) return;
    int64_t T = ids->numel, S = greedy->numel, V = pm->V;
    int32_t *seq = malloc(sizeof(int32_t) * (size_t)(T + S));
    for (int64_t i = 0; i < T; i++) seq[i] = (int32_t)ids->i64[i];
    for (int64_t i = 0; i < S; i++) seq[T + i] = (int32_t)greedy->i64[i];
    float *lg = malloc(sizeof(float) * (size_t)(T * V)), *lc = malloc(sizeof(float) * (size_t)(T * V));
    lm_kv_cache *cg = NULL, *cc = NULL;
    LT_CHECK_OK(lm_kv_cache_create(pm->gpu, 1, T + S, &cg));
    LT_CHECK_OK(lm_kv_cache_create(pm->cpu, 1, T + S, &cc));
    int slot = 0;
    for (int64_t i = 0; i < T * V; i++) lg[i] = NAN;
    LT_CHECK_OK(lm_model_forward(pm->gpu, g_gpu, cg, &slot, 1, seq, T, lg, 1));
    LT_CHECK_OK(lm_model_forward(pm->cpu, g_cpu, cc, &slot, 1, seq, T, lc, 1));
    char what[128];
    snprintf(what, sizeof what, "%s prompt %d prefill (%lld tokens)", name, p, (long long)T);
    double delta = compare(what, lg, lc, T * V);
    /* decode steps through the reference tokens: eager, capture, replays */
    for (int64_t s = 0; s + 1 < S; s++) {
        LT_CHECK_OK(lm_model_forward(pm->gpu, g_gpu, cg, &slot, 1, &seq[T + s], 1, lg, 0));
        LT_CHECK_OK(lm_model_forward(pm->cpu, g_cpu, cc, &slot, 1, &seq[T + s], 1, lc, 0));
        snprintf(what, sizeof what, "%s prompt %d decode step %lld", name, p, (long long)s + 1);
        delta = fmax(delta, compare(what, lg, lc, V));
    }
    pm->worst_nmse_delta = fmax(pm->worst_nmse_delta, delta);
    /* the decode step was captured from its second run on: its graph's kernel launches
     * (at least four a layer; none counted on the CPU, which runs uncaptured) */
    lm_kv_cache_steps ks;
    int64_t L = lm_model_get_config(pm->gpu)->num_hidden_layers;
    LT_CHECK_OK(lm_kv_cache_steps_get(cg, &ks));
    if (S >= 3)
        LT_CHECK_MSG(ks.last_kernels >= 4 * L && ks.last_kernels <= 64 * L + 64,
                     "%s: %lld kernels in the captured decode step of %lld layers", name, (long long)ks.last_kernels,
                     (long long)L);
    LT_CHECK_OK(lm_kv_cache_steps_get(cc, &ks));
    LT_CHECK(ks.last_kernels == 0);
    /* greedy on the device against transformers, while the margins allow */
    LT_CHECK_OK(lm_kv_cache_reset(cg, 0));
    lm_sample_params gp = {.greedy = 1, .temperature = 1.0f, .top_p = 1.0f};
    int32_t next = -1;
    LT_CHECK_OK(lm_model_forward_sample(pm->gpu, g_gpu, cg, &slot, 1, seq, T, &gp, &next));
    int compared = 0;
    for (int64_t s = 0; s < S; s++) {
        if (!(margin->f64[s] > 4 * delta)) break;
        LT_CHECK_MSG(next == greedy->i64[s], "%s prompt %d: greedy token %lld is %d, transformers %lld (margin %.3g, delta %.3g)",
                     name, p, (long long)s, next, (long long)greedy->i64[s], margin->f64[s], delta);
        if (next != greedy->i64[s]) break;
        compared++;
        gp.draw = (uint64_t)s + 1;
        if (s + 1 < S) LT_CHECK_OK(lm_model_forward_sample(pm->gpu, g_gpu, cg, &slot, 1, &next, 1, &gp, &next));
    }
    pm->greedy_compared += compared;
    pm->greedy_total += (int)S;
    free(seq), free(lg), free(lc);
    lm_kv_cache_destroy(cg);
    lm_kv_cache_destroy(cc);
}

static void test_logits_and_greedy_match(void) {
    for (int i = 0; i < NMODELS; i++) {
        char path[512];
        snprintf(path, sizeof path, "tests/data/models/%s/refs.lmfx", k_models[i]);
        lt_fixture fx;
        if (!lt_fixture_load(path, &fx)) continue;
        pair_models pm = {load(k_models[i], lm_device_cpu()), load(k_models[i], ct_gpu), 0, 0, 0, 0};
        if (pm.cpu && pm.gpu) {
            pm.V = lm_model_get_config(pm.cpu)->vocab_size;
            for (int p = 0; p < 3; p++) check_prompt(&pm, k_models[i], &fx, p);
            printf("  %-20s max |dlogit| GPU vs CPU %.4f; greedy tokens compared with transformers %d of %d\n",
                   k_models[i], pm.worst_nmse_delta, pm.greedy_compared, pm.greedy_total);
        }
        lm_model_destroy(pm.cpu);
        lm_model_destroy(pm.gpu);
        lt_fixture_free(&fx);
    }
}

/* rows[b] tokens prefilled per slot, then one decode step of all B rows together,
 * against each row prefilled and stepped alone. */
static void check_batch(lm_model *m, int B, int tol_exact) {
    const lm_model_config *c = lm_model_get_config(m);
    int64_t V = c->vocab_size;
    lm_kv_cache *batch = NULL, *solo = NULL;
    LT_CHECK_OK(lm_kv_cache_create(m, B, 16, &batch));
    LT_CHECK_OK(lm_kv_cache_create(m, 1, 16, &solo));
    int32_t seq[16][12];
    int *slots = malloc(sizeof(int) * (size_t)B);
    int32_t step[16];
    for (int b = 0; b < B; b++) {
        slots[b] = B - 1 - b; /* not in order */
        for (int t = 0; t < 12; t++) seq[b][t] = (int32_t)((b * 37 + t * 11 + 5) % V);
        int64_t len = 3 + b % 5; /* different positions per row */
        LT_CHECK_OK(lm_model_forward(m, g_gpu, batch, &slots[b], 1, seq[b], len, NULL, 0));
        step[b] = seq[b][len];
    }
    float *lb = malloc(sizeof(float) * (size_t)(B * V)), *ls = malloc(sizeof(float) * (size_t)V);
    LT_CHECK_OK(lm_model_forward(m, g_gpu, batch, slots, B, step, 1, lb, 0));
    for (int b = 0; b < B; b++) {
        int64_t len = 3 + b % 5;
        LT_CHECK_OK(lm_kv_cache_reset(solo, 0));
        int s0 = 0;
        LT_CHECK_OK(lm_model_forward(m, g_gpu, solo, &s0, 1, seq[b], len + 1, ls, 0));
        char what[64];
        snprintf(what, sizeof what, "batch of %d, row %d", B, b);
        if (tol_exact) {
            double md = 0;
            for (int64_t i = 0; i < V; i++) md = fmax(md, fabs(lb[b * V + i] - ls[i]));
            LT_CHECK_MSG(md < 1e-2, "%s: max diff %g", what, md);
        } else {
            compare(what, lb + b * V, ls, V);
        }
    }
    free(lb), free(ls), free(slots);
    lm_kv_cache_destroy(batch);
    lm_kv_cache_destroy(solo);
}

static void test_batched_decode_rows(void) {
    lm_model *m = load("qwen3_headdim", ct_gpu);
    if (!m) return;
    check_batch(m, 2, 0);
    check_batch(m, 10, 0); /* B > 8: the GEMM path in decode */
    lm_model_destroy(m);
}

static void test_argument_errors(void) {
    lm_model *g = load("llama_gqa2_f32", ct_gpu), *c = load("llama_gqa2_f32", lm_device_cpu());
    if (!g || !c) return;
    lm_kv_cache *kg = NULL, *kc = NULL;
    LT_CHECK_OK(lm_kv_cache_create(g, 1, 8, &kg));
    LT_CHECK_OK(lm_kv_cache_create(c, 1, 8, &kc));
    int slot = 0;
    int32_t ids[2] = {1, 2}, next;
    float logits[256];
    LT_CHECK_STATUS(lm_model_forward(g, g_cpu, kg, &slot, 1, ids, 2, logits, 0), LM_INVALID_ARGUMENT);
    lm_sample_params sp = {.temperature = 1.0f, .top_p = 1.0f};
    LT_CHECK_STATUS(lm_model_forward_sample(c, g_gpu, kc, &slot, 1, ids, 2, &sp, &next), LM_INVALID_ARGUMENT);
    sp.top_p = 1.5f;
    LT_CHECK_STATUS(lm_model_forward_sample(g, g_gpu, kg, &slot, 1, ids, 2, &sp, &next), LM_INVALID_ARGUMENT);
    LT_CHECK(lm_kv_cache_length(kg, 0) == 0);
    LT_CHECK(lm_model_weight_bytes(g) > 0);
    lm_kv_cache_destroy(kg);
    lm_kv_cache_destroy(kc);
    lm_model_destroy(g);
    lm_model_destroy(c);
}

int main(void) {
    g_gpu = ct_start();
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_cpu));
    LT_RUN(test_logits_and_greedy_match);
    LT_RUN(test_batched_decode_rows);
    LT_RUN(test_argument_errors);
    lm_ctx_destroy(g_cpu);
    lm_ctx_destroy(g_gpu);
    return lt_finish();
}
#endif
