/* Whole-model gradients of the training model.
 * 1. Against PyTorch (scripts/gen_train_refs.py: a float64 plain-torch forward of the
 *    same checkpoint and batch) for all nine reference checkpoints (llama GQA, llama3
 *    and linear RoPE scaling, mistral MHA, qwen2 biases + sharded + tied, qwen2 MQA +
 *    yarn, qwen3 q/k norms + explicit head_dim, mistral's sliding window on every
 *    layer, qwen2's on the layers from max_window_layers on): the loss within 1e-6 relative; per
 *    tensor, the gradient's sum of squares within 1e-5 relative and the 48 sampled
 *    entries with NMSE <= 1e-10 (loom computes in f32: activations and gradients carry
 *    ~1e-7 relative rounding, amplified by the logit scale of these random models;
 *    measured worst: 5e-7 and 1.3e-12).
 * 2. Against finite differences of the loom loss itself on a tiny tied model built from
 *    a config (seeded init): derivatives along random unit directions, one per parameter
 *    tensor and one over all, by central differences with Richardson extrapolation
 *    (steps 0.02 and 0.01); the f32 loss limits them to ~1e-5 absolute, so the gate is
 *    |fd - analytic| <= 2e-3 * (|analytic| + 0.01 * |gradient|).
 * 3. Gradient accumulation: two micro-batches at scale 1/2 equal one batch of both.
 * 4. Compute dtype and model FLOPs on the CPU: bf16 compute is refused (LM_UNSUPPORTED,
 *    the model keeps f32), a CUDA context is refused for a CPU model, and
 *    lm_train_model_flops_per_token equals the formula counted by hand for the tiny
 *    model (tied: the output projection counts the embedding once more).
 * LM_TEST_LABELS: unit model
 */
#include "harness.h"
#include "loom/train.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

static lm_ctx *g_ctx;
static const char *k_models[] = {"llama_gqa2_f32", "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
                                 "qwen2_bias_sharded", "qwen2_mqa_yarn", "qwen3_headdim",
                                 "mistral_window_f32", "qwen2_window_bf16"};

static int32_t *to_i32(const lt_fixture_tensor *t) {
    int32_t *out = malloc(sizeof(int32_t) * (size_t)t->numel);
    for (int64_t i = 0; i < t->numel; i++) out[i] = (int32_t)t->i64[i];
    return out;
}

static void check_against_torch(const char *name) {
    char path[512], dir[512];
    snprintf(path, sizeof path, "tests/data/train/grad_refs/%s.lmfx", name);
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lt_fixture fx;
    if (!lt_fixture_load(path, &fx)) return;
    lm_train_model *m = NULL;
    LT_CHECK_OK(lm_train_model_load(dir, lm_device_cpu(), &m));
    const lt_fixture_tensor *ids = lt_fixture_get(&fx, "ids"), *tg = lt_fixture_get(&fx, "targets");
    const lt_fixture_tensor *loss = lt_fixture_get(&fx, "loss");
    if (!m || !ids || !tg || !loss) goto done;
    int32_t *ii = to_i32(ids), *tt = to_i32(tg);
    float got = 0;
    LT_CHECK_OK(lm_train_model_zero_grad(m, g_ctx));
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, ii, tt, (int)ids->shape[0], ids->shape[1], 1.0f, &got));
    double lrel = fabs(got - loss->f64[0]) / fabs(loss->f64[0]);
    LT_CHECK_MSG(lrel <= 1e-6, "%s: loss %.9g vs torch %.9g (rel %.2e)", name, got, loss->f64[0], lrel);
    double worst_ss = 0, worst_nmse = 0;
    for (int i = 0; i < lm_train_model_param_count(m); i++) {
        lm_train_param p;
        LT_CHECK_OK(lm_train_model_param(m, i, &p));
        char key[96];
        snprintf(key, sizeof key, "s.%s", p.name);
        const lt_fixture_tensor *ss = lt_fixture_get(&fx, key);
        snprintf(key, sizeof key, "i.%s", p.name);
        const lt_fixture_tensor *ix = lt_fixture_get(&fx, key);
        snprintf(key, sizeof key, "v.%s", p.name);
        const lt_fixture_tensor *vals = lt_fixture_get(&fx, key);
        if (!ss || !ix || !vals) continue;
        double *g = lt_view_to_f64(&p.grad), mine = 0, *pick = malloc(sizeof(double) * (size_t)ix->numel);
        int64_t n = lm_tensor_view_numel(&p.grad);
        for (int64_t k = 0; k < n; k++) mine += g[k] * g[k];
        for (int64_t k = 0; k < ix->numel; k++) pick[k] = g[ix->i64[k]];
        double rel = fabs(mine - ss->f64[0]) / (ss->f64[0] > 0 ? ss->f64[0] : 1);
        lt_metrics mt = lt_measure(pick, vals->f64, ix->numel);
        worst_ss = rel > worst_ss ? rel : worst_ss;
        worst_nmse = mt.nmse > worst_nmse ? mt.nmse : worst_nmse;
        LT_CHECK_MSG(rel <= 1e-5 && mt.nmse <= 1e-10 && mt.nonfinite == 0,
                     "%s %s: sum of squares rel %.2e, sampled nmse %.2e", name, p.name, rel, mt.nmse);
        free(g), free(pick);
    }
    printf("  %-20s loss rel %.1e, worst tensor: sum-of-squares rel %.1e, sampled nmse %.1e\n", name, lrel, worst_ss,
           worst_nmse);
    free(ii), free(tt);
done:
    lm_train_model_destroy(m);
    lt_fixture_free(&fx);
}

static void test_gradients_match_pytorch_float64(void) {
    for (size_t i = 0; i < sizeof k_models / sizeof k_models[0]; i++) check_against_torch(k_models[i]);
}

/* ---- the tiny model ----------------------------------------------------------------------------- */
static const char k_tiny[] =
    "{\"architectures\":[\"LlamaForCausalLM\"],\"model_type\":\"llama\",\"vocab_size\":37,\"hidden_size\":16,"
    "\"intermediate_size\":24,\"num_hidden_layers\":2,\"num_attention_heads\":4,\"num_key_value_heads\":2,"
    "\"max_position_embeddings\":64,\"rms_norm_eps\":1e-5,\"rope_theta\":100.0,\"tie_word_embeddings\":true,"
    "\"initializer_range\":0.3,\"hidden_act\":\"silu\"}";

static lm_train_model *tiny_model(uint64_t seed) {
    char path[512];
    snprintf(path, sizeof path, "%s/train_tiny_config.json", LOOM_BINARY_DIR);
    FILE *f = fopen(path, "w");
    if (!f) return NULL;
    fputs(k_tiny, f);
    fclose(f);
    lm_train_model *m = NULL;
    LT_CHECK_OK(lm_train_model_init(path, seed, lm_device_cpu(), &m));
    return m;
}

static const int32_t k_ids[12] = {3, 17, 9, 9, 30, 1, 4, 22, 36, 0, 11, 5};
static const int32_t k_tgt[12] = {17, 9, 9, 30, 1, -100, 22, 36, 0, 11, 5, 2};

static double loss_at(lm_train_model *m) {
    float l = 0;
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 2, 6, &l));
    return l;
}

/* Moves every parameter by h * u (u over the whole flat buffer, in parameter order). */
static void shift(lm_train_model *m, const double *u, double h) {
    int64_t off = 0;
    for (int i = 0; i < lm_train_model_param_count(m); i++) {
        lm_train_param p;
        LT_CHECK_OK(lm_train_model_param(m, i, &p));
        float *w = p.value.data;
        int64_t n = lm_tensor_view_numel(&p.value);
        for (int64_t k = 0; k < n; k++) w[k] = (float)((double)w[k] + h * u[off + k]);
        off += n;
    }
}

/* (L(+h u) - L(-h u)) / 2h, the parameters restored afterwards. */
static double central(lm_train_model *m, const double *u, double h) {
    shift(m, u, h);
    double up = loss_at(m);
    shift(m, u, -2 * h);
    double down = loss_at(m);
    shift(m, u, h);
    return (up - down) / (2 * h);
}

static void test_gradients_match_finite_differences(void) {
    lm_train_model *m = tiny_model(7);
    if (!m) return;
    float l0 = 0;
    LT_CHECK_OK(lm_train_model_zero_grad(m, g_ctx));
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, k_ids, k_tgt, 2, 6, 1.0f, &l0));
    LT_CHECK(fabs(l0 - loss_at(m)) < 1e-6); /* the no_grad loss equals the training one */
    int64_t numel = lm_train_model_numel(m), np = lm_train_model_param_count(m);
    double *u = calloc((size_t)numel, sizeof *u), gnorm = 0;
    lt_rng r = lt_rng_seed(99);
    LT_CHECK_OK(lm_train_model_grad_norm(m, g_ctx, &gnorm));
    double worst = 0;
    for (int64_t which = -1; which < np; which++) { /* -1: all parameters at once */
        int64_t off = 0;
        double gu = 0, len = 0;
        for (int i = 0; i < np; i++) {
            lm_train_param p;
            LT_CHECK_OK(lm_train_model_param(m, i, &p));
            int64_t n = lm_tensor_view_numel(&p.value);
            for (int64_t k = 0; k < n; k++) {
                u[off + k] = (which < 0 || which == i) ? lt_rng_normal(&r) : 0.0;
                len += u[off + k] * u[off + k];
            }
            off += n;
        }
        for (int64_t k = 0; k < numel; k++) u[k] /= sqrt(len); /* a unit direction */
        off = 0;
        for (int i = 0; i < np; i++) {
            lm_train_param p;
            LT_CHECK_OK(lm_train_model_param(m, i, &p));
            const float *g = p.grad.data;
            int64_t n = lm_tensor_view_numel(&p.value);
            for (int64_t k = 0; k < n; k++) gu += g[k] * u[off + k];
            off += n;
        }
        /* Richardson: (4 D(h/2) - D(h)) / 3 cancels the h^2 term; f32 rounding of the loss
         * (~1e-7 relative) contributes ~1e-5 absolute at these steps */
        double fd = (4 * central(m, u, 0.01) - central(m, u, 0.02)) / 3;
        double rel = fabs(fd - gu) / (fabs(gu) + 1e-2 * gnorm);
        worst = rel > worst ? rel : worst;
        LT_CHECK_MSG(rel <= 2e-3, "direction %lld: analytic %.6g vs finite differences %.6g (rel %.2e)", (long long)which,
                     gu, fd, rel);
    }
    printf("  %lld directional derivatives, worst relative error %.1e\n", (long long)np + 1, worst);
    free(u);
    lm_train_model_destroy(m);
}

static void test_accumulation_equals_one_large_batch(void) {
    lm_train_model *m = tiny_model(8);
    if (!m) return;
    int64_t n = lm_train_model_numel(m);
    lm_train_param all;
    LT_CHECK_OK(lm_train_model_param(m, 0, &all));
    float l = 0, *ref = malloc(sizeof(float) * (size_t)n);
    LT_CHECK_OK(lm_train_model_zero_grad(m, g_ctx));
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, k_ids, k_tgt, 2, 6, 1.0f, &l));
    const float *g0 = all.grad.data; /* parameter 0 starts the flat gradient buffer */
    memcpy(ref, g0, sizeof(float) * (size_t)n);
    LT_CHECK_OK(lm_train_model_zero_grad(m, g_ctx));
    int32_t tg1[12], tg2[12]; /* each half of the batch; the other row ignored keeps T */
    for (int i = 0; i < 12; i++) {
        tg1[i] = i < 6 ? k_tgt[i] : -100;
        tg2[i] = i < 6 ? -100 : k_tgt[i];
    }
    /* rows 0 and 1 hold 5 and 6 counted targets: weight the halves by their share */
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, k_ids, tg1, 2, 6, 5.0f / 11.0f, &l));
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, k_ids, tg2, 2, 6, 6.0f / 11.0f, &l));
    double *a = malloc(sizeof(double) * (size_t)n), *b = malloc(sizeof(double) * (size_t)n);
    for (int64_t i = 0; i < n; i++) a[i] = g0[i], b[i] = ref[i];
    lt_check_close("accumulated gradient", a, b, n, 1e-12, 1e-6);
    free(a), free(b), free(ref);
    lm_train_model_destroy(m);
}

/* The model keeps the prepared graph and positions of the last shape between calls
 * (train/step.c): a call of another shape or output rebuilds them, and the results
 * are those of a model that never saw the other shapes (the same bits). */
static void test_shape_changes_between_calls(void) {
    lm_train_model *m = tiny_model(11), *fresh = tiny_model(11);
    if (!m || !fresh) return;
    float a = 0, b = 0, c = 0, want_b = 0, want_c = 0, again = 0, bb = 0;
    float logits[6 * 37], want_logits[6 * 37];
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 2, 6, &a));
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 1, 6, &b));   /* one row */
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 3, 4, &c));   /* other rows, other length */
    LT_CHECK_OK(lm_train_model_logits(m, g_ctx, k_ids + 6, 6, logits)); /* the other output */
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 2, 6, &again));
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 1, 6, &bb)); /* cached again */
    LT_CHECK_OK(lm_train_model_loss(fresh, g_ctx, k_ids, k_tgt, 1, 6, &want_b));
    lm_train_model_destroy(fresh);
    fresh = tiny_model(11);
    if (fresh) LT_CHECK_OK(lm_train_model_loss(fresh, g_ctx, k_ids, k_tgt, 3, 4, &want_c));
    lm_train_model_destroy(fresh);
    fresh = tiny_model(11);
    if (fresh) LT_CHECK_OK(lm_train_model_logits(fresh, g_ctx, k_ids + 6, 6, want_logits));
    LT_CHECK_MSG(a == again, "2 x 6 loss %.9g, then %.9g after other shapes", a, again);
    LT_CHECK_MSG(b == want_b && bb == want_b, "1 x 6 loss %.9g / %.9g, fresh model %.9g", b, bb, want_b);
    LT_CHECK_MSG(c == want_c, "3 x 4 loss %.9g, fresh model %.9g", c, want_c);
    LT_CHECK(memcmp(logits, want_logits, sizeof logits) == 0);
    LT_CHECK(a != b && b != c); /* the shapes did give other losses */
    lm_train_model_destroy(fresh);
    lm_train_model_destroy(m);
}

static void test_compute_dtype_and_flops(void) {
    lm_train_model *m = tiny_model(3);
    if (!m) return;
    LT_CHECK_STATUS(lm_train_model_set_compute_dtype(m, LM_BF16), LM_UNSUPPORTED);
    LT_CHECK_MSG(strstr(lm_last_error(), "16-bit matrix units") != NULL, "message: %s", lm_last_error());
    LT_CHECK_STATUS(lm_train_model_set_compute_dtype(m, LM_F16), LM_UNSUPPORTED);
    LT_CHECK(lm_train_model_compute_dtype(m) == LM_F32);
    LT_CHECK_OK(lm_train_model_set_compute_dtype(m, LM_F32));
    float l = 0;
    LT_CHECK_OK(lm_train_model_loss(m, g_ctx, k_ids, k_tgt, 2, 6, &l)); /* still trains in f32 */
    LT_CHECK(isfinite(l));
    /* hidden 16, intermediate 24, 2 layers, 4 heads of 4, 2 kv heads, vocab 37, tied */
    double per_layer = 16.0 * 16 * 2 + 16.0 * 8 * 2 + 3.0 * 16 * 24; /* q, o; k, v; gate, up, down */
    double want = 6.0 * (2 * per_layer + 37.0 * 16) + 12.0 * 2 * 4 * 4 * 10;
    double got = lm_train_model_flops_per_token(m, 10);
    LT_CHECK_MSG(fabs(got - want) < 1e-6, "flops per token %.1f, counted %.1f", got, want);
    lm_train_model_destroy(m);
}

int main(void) {
    if (lm_ctx_create(lm_device_cpu(), 0, &g_ctx) != LM_OK) return 1;
    LT_RUN(test_gradients_match_pytorch_float64);
    LT_RUN(test_gradients_match_finite_differences);
    LT_RUN(test_accumulation_equals_one_large_batch);
    LT_RUN(test_shape_changes_between_calls);
    LT_RUN(test_compute_dtype_and_flops);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
