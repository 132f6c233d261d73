/* Training on CUDA against training on the CPU, on the nine reference checkpoints
 * (tests/data/models) with the batches of the committed gradient fixtures:
 *  - f32 compute: the loss within 1e-5 relative and every parameter's gradient with
 *    NMSE <= 1e-8 (both compute in f32; only summation orders differ);
 *  - bf16 compute (bf16 weight copies and activations, f32 master weights and
 *    gradients): the loss within 2e-2 relative and the whole gradient with NMSE
 *    <= 2e-2 against the f32 CPU gradient (bf16 keeps 8 bits: ~4e-3 relative per
 *    rounding, compounded over the layers of these random models); the measured
 *    values are printed;
 *  - five AdamW steps on the same batch on both devices (the batch gets memorized:
 *    29 -> ~4e-4): f32 losses within 1e-4 relative + 1e-6 at every step and the
 *    final weights within NMSE 1e-8; bf16 losses within 3e-2 relative at the first
 *    two steps (later ones amplify bf16 rounding chaotically as the loss collapses)
 *    and below 5% of the first after five;
 *  - the trainer's 2nd..A-th micro-batch skips refreshing the bf16 weight copies: a
 *    forward told not to refresh after an optimizer step reproduces the loss of the
 *    old weights to the bit, and a refreshing one the public call's new loss;
 *  - the logits of lm_train_model_logits under bf16 compute come back as f32;
 *  - a context of the other device is refused by name.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda model
 */
#include "cuda_test.h"

#include "loom/train.h"
#include "train/internal.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

static lm_ctx *g_ctx, *g_cpu;
static const char *k_models[] = {"llama_gqa2_f32", "llama3_scaled_bf16", "llama_linear_f16", "mistral_mha_f16",
                                 "qwen2_bias_sharded", "qwen2_mqa_yarn", "qwen3_headdim",
                                 "mistral_window_f32", "qwen2_window_bf16"};

typedef struct batch {
    int32_t *ids, *tgt;
    int B;
    int64_t T;
} batch;

static int load_batch(const char *name, batch *b) {
    char path[512];
    snprintf(path, sizeof path, "tests/data/train/grad_refs/%s.lmfx", name);
    lt_fixture fx;
    if (!lt_fixture_load(path, &fx)) return 0;
    const lt_fixture_tensor *ids = lt_fixture_get(&fx, "ids"), *tg = lt_fixture_get(&fx, "targets");
    int ok = ids && tg;
    if (ok) {
        b->B = (int)ids->shape[0], b->T = ids->shape[1];
        b->ids = malloc(sizeof(int32_t) * (size_t)ids->numel);
        b->tgt = malloc(sizeof(int32_t) * (size_t)ids->numel);
        for (int64_t i = 0; i < ids->numel; i++) b->ids[i] = (int32_t)ids->i64[i], b->tgt[i] = (int32_t)tg->i64[i];
    }
    lt_fixture_free(&fx);
    return ok;
}

static lm_train_model *load(const char *name, lm_device dev) {
    char dir[512];
    snprintf(dir, sizeof dir, "%s/tests/data/models/%s", LOOM_SOURCE_DIR, name);
    lm_train_model *m = NULL;
    LT_CHECK_OK(lm_train_model_load(dir, dev, &m));
    return m;
}

/* Parameter i's gradient (or value) as host doubles. */
static double *param_host(lm_train_model *m, int i, int grad) {
    lm_train_param p;
    LT_CHECK_OK(lm_train_model_param(m, i, &p));
    const lm_tensor_view *v = grad ? &p.grad : &p.value;
    int64_t n = lm_tensor_view_numel(v);
    float *f = malloc(sizeof(float) * (size_t)n);
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_tensor_view_read(NULL, v, f));
    double *d = malloc(sizeof(double) * (size_t)n);
    for (int64_t k = 0; k < n; k++) d[k] = f[k];
    free(f);
    return d;
}

/* Worst per-tensor NMSE (per_tensor) or whole-model NMSE of gradients/values. */
static double compare(lm_train_model *gpu, lm_train_model *cpu, int grad, int per_tensor, const char *what,
                      double gate) {
    double worst = 0, err = 0, ref = 0;
    for (int i = 0; i < lm_train_model_param_count(cpu); i++) {
        lm_train_param p;
        LT_CHECK_OK(lm_train_model_param(cpu, i, &p));
        int64_t n = lm_tensor_view_numel(&p.value);
        double *g = param_host(gpu, i, grad), *c = lt_view_to_f64(grad ? &p.grad : &p.value);
        lt_metrics mt = lt_measure(g, c, n);
        LT_CHECK_MSG(mt.nonfinite == 0, "%s %s: non-finite values", what, p.name);
        if (per_tensor) {
            LT_CHECK_MSG(mt.nmse <= gate, "%s %s: nmse %.2e > %.0e", what, p.name, mt.nmse, gate);
            worst = mt.nmse > worst ? mt.nmse : worst;
        }
        for (int64_t k = 0; k < n; k++) err += (g[k] - c[k]) * (g[k] - c[k]), ref += c[k] * c[k];
        free(g), free(c);
    }
    double whole = ref > 0 ? err / ref : err;
    if (!per_tensor) LT_CHECK_MSG(whole <= gate, "%s: whole-model nmse %.2e > %.0e", what, whole, gate);
    return per_tensor ? worst : whole;
}

static void check_model(const char *name) {
    batch b;
    if (!load_batch(name, &b)) return;
    lm_train_model *cpu = load(name, lm_device_cpu()), *gpu = load(name, ct_gpu);
    if (!cpu || !gpu) goto done;
    float lc = 0, lg = 0, lb = 0;
    LT_CHECK_OK(lm_train_model_zero_grad(cpu, g_cpu));
    LT_CHECK_OK(lm_train_model_forward_backward(cpu, g_cpu, b.ids, b.tgt, b.B, b.T, 1.0f, &lc));
    LT_CHECK_OK(lm_train_model_zero_grad(gpu, g_ctx));
    LT_CHECK_OK(lm_train_model_forward_backward(gpu, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &lg));
    double rel = fabs((double)lg - lc) / fabs((double)lc);
    LT_CHECK_MSG(rel <= 1e-5, "%s f32: loss %.8g on CUDA vs %.8g on the CPU", name, lg, lc);
    double g32 = compare(gpu, cpu, 1, 1, "f32 gradient", 1e-8);

    LT_CHECK_OK(lm_train_model_set_compute_dtype(gpu, LM_BF16));
    LT_CHECK(lm_train_model_compute_dtype(gpu) == LM_BF16);
    LT_CHECK_OK(lm_train_model_zero_grad(gpu, g_ctx));
    LT_CHECK_OK(lm_train_model_forward_backward(gpu, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &lb));
    double relb = fabs((double)lb - lc) / fabs((double)lc);
    LT_CHECK_MSG(relb <= 2e-2, "%s bf16: loss %.8g on CUDA vs %.8g on the CPU", name, lb, lc);
    double gb = compare(gpu, cpu, 1, 0, "bf16 gradient", 2e-2);
    printf("  %-20s f32: loss rel %.1e, worst tensor nmse %.1e | bf16: loss rel %.1e, gradient nmse %.1e\n", name, rel,
           g32, relb, gb);
done:
    lm_train_model_destroy(cpu), lm_train_model_destroy(gpu);
    free(b.ids), free(b.tgt);
}

static void test_gradients_match_cpu(void) {
    for (size_t i = 0; i < sizeof k_models / sizeof k_models[0]; i++) check_model(k_models[i]);
}

/* Five AdamW steps on one batch; losses[5]. */
static void run_steps(lm_train_model *m, lm_ctx *ctx, const batch *b, double *losses) {
    lm_adamw_config c = {0.9, 0.95, 1e-8, 0.1};
    lm_optimizer *o = NULL;
    LT_CHECK_OK(lm_optimizer_create(m, &c, &o));
    for (int s = 0; s < 5 && o; s++) {
        float l = 0;
        double norm = 0;
        LT_CHECK_OK(lm_train_model_zero_grad(m, ctx));
        LT_CHECK_OK(lm_train_model_forward_backward(m, ctx, b->ids, b->tgt, b->B, b->T, 1.0f, &l));
        LT_CHECK_OK(lm_train_model_grad_norm(m, ctx, &norm));
        LT_CHECK_OK(lm_optimizer_step(o, ctx, 3e-3, norm > 1.0 ? 1.0 / norm : 1.0));
        losses[s] = l;
    }
    lm_optimizer_destroy(o);
}

static void test_training_steps_match_cpu(void) {
    const char *name = "qwen2_bias_sharded";
    batch b;
    if (!load_batch(name, &b)) return;
    double lc[5], lg[5], lb[5];
    lm_train_model *cpu = load(name, lm_device_cpu()), *gpu = load(name, ct_gpu), *gpb = load(name, ct_gpu);
    if (!cpu || !gpu || !gpb) goto done;
    run_steps(cpu, g_cpu, &b, lc);
    run_steps(gpu, g_ctx, &b, lg);
    LT_CHECK_OK(lm_train_model_set_compute_dtype(gpb, LM_BF16));
    run_steps(gpb, g_ctx, &b, lb);
    for (int s = 0; s < 5; s++) {
        /* relative, with an absolute floor: the batch is memorized, the loss heads for 0 */
        LT_CHECK_MSG(fabs(lg[s] - lc[s]) <= 1e-4 * fabs(lc[s]) + 1e-6, "step %d: f32 CUDA loss %.8g vs CPU %.8g", s, lg[s],
                     lc[s]);
        if (s < 2) /* later bf16 steps diverge chaotically from f32 as the loss collapses; only the trend is checked */
            LT_CHECK_MSG(fabs(lb[s] - lc[s]) <= 3e-2 * fabs(lc[s]), "step %d: bf16 CUDA loss %.8g vs CPU %.8g", s, lb[s],
                         lc[s]);
    }
    LT_CHECK_MSG(lb[4] < 0.05 * lb[0] && lg[4] < lg[0], "losses did not fall: f32 %.4f -> %.4f, bf16 %.4f -> %.4f", lg[0], lg[4],
                 lb[0], lb[4]);
    double w = compare(gpu, cpu, 0, 0, "weights after 5 steps", 1e-8);
    printf("  5 steps: CPU %.5f -> %.5f, CUDA f32 %.5f -> %.5f, CUDA bf16 %.5f -> %.5f; f32 weights nmse %.1e\n", lc[0],
           lc[4], lg[0], lg[4], lb[0], lb[4], w);
done:
    lm_train_model_destroy(cpu), lm_train_model_destroy(gpu), lm_train_model_destroy(gpb);
    free(b.ids), free(b.tgt);
}

/* refresh_low 0 must read the bf16 copies as the last refresh left them, 1 the masters. */
static void test_bf16_copy_refresh(void) {
    const char *name = "qwen2_bias_sharded";
    batch b;
    if (!load_batch(name, &b)) return;
    lm_train_model *m = load(name, ct_gpu);
    lm_adamw_config c = {0.9, 0.95, 1e-8, 0.1};
    lm_optimizer *o = NULL;
    float l0 = 0, stale = 0, fresh = 0, pub = 0;
    if (!m) goto done;
    LT_CHECK_OK(lm_train_model_set_compute_dtype(m, LM_BF16));
    LT_CHECK_OK(lm_optimizer_create(m, &c, &o));
    if (!o) goto done;
    LT_CHECK_OK(lm__train_model_forward_backward_notify(m, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &l0, NULL, NULL, 1));
    LT_CHECK_OK(lm_optimizer_step(o, g_ctx, 1e-2, 1.0)); /* the masters move */
    LT_CHECK_OK(lm__train_model_forward_backward_notify(m, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &stale, NULL, NULL, 0));
    LT_CHECK_OK(lm__train_model_forward_backward_notify(m, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &fresh, NULL, NULL, 1));
    LT_CHECK_OK(lm_train_model_forward_backward(m, g_ctx, b.ids, b.tgt, b.B, b.T, 1.0f, &pub));
    LT_CHECK_MSG(stale == l0, "no refresh: loss %.9g, the old weights' %.9g", stale, l0);
    LT_CHECK_MSG(fresh != l0 && fresh == pub, "refresh: loss %.9g, public call %.9g, old weights %.9g", fresh, pub, l0);
    printf("  bf16 copies: old weights %.6f, not refreshed %.6f, refreshed %.6f\n", l0, stale, fresh);
done:
    lm_optimizer_destroy(o);
    lm_train_model_destroy(m);
    free(b.ids), free(b.tgt);
}

static void test_bf16_logits_and_errors(void) {
    const char *name = "qwen3_headdim";
    lm_train_model *cpu = load(name, lm_device_cpu()), *gpu = load(name, ct_gpu);
    if (!cpu || !gpu) goto done;
    int64_t V = lm_train_model_config(cpu)->vocab_size, T = 5;
    int32_t ids[5] = {1, 7, 3, 3, 0};
    float *a = malloc(sizeof(float) * (size_t)(V * T)), *g = malloc(sizeof(float) * (size_t)(V * T));
    LT_CHECK_OK(lm_train_model_logits(cpu, g_cpu, ids, T, a));
    LT_CHECK_OK(lm_train_model_set_compute_dtype(gpu, LM_BF16));
    LT_CHECK_OK(lm_train_model_logits(gpu, g_ctx, ids, T, g));
    double *da = malloc(sizeof(double) * (size_t)(V * T)), *dg = malloc(sizeof(double) * (size_t)(V * T));
    for (int64_t i = 0; i < V * T; i++) da[i] = a[i], dg[i] = g[i];
    lt_check_close("bf16 logits vs f32 CPU", dg, da, V * T, 2e-2, 1e9);
    float l = 0;
    LT_CHECK_STATUS(lm_train_model_loss(gpu, g_cpu, ids, ids, 1, T, &l), LM_INVALID_ARGUMENT);
    LT_CHECK_MSG(strstr(lm_last_error(), "cuda") != NULL, "message: %s", lm_last_error());
    LT_CHECK_STATUS(lm_train_model_set_compute_dtype(cpu, LM_BF16), LM_UNSUPPORTED);
    LT_CHECK_STATUS(lm_train_model_set_compute_dtype(gpu, LM_F16), LM_UNSUPPORTED);
    free(a), free(g), free(da), free(dg);
done:
    lm_train_model_destroy(cpu), lm_train_model_destroy(gpu);
}

int main(void) {
    g_ctx = ct_start();
    LT_CHECK_OK(lm_ctx_create(lm_device_cpu(), 2, &g_cpu));
    LT_RUN(test_gradients_match_cpu);
    LT_RUN(test_training_steps_match_cpu);
    LT_RUN(test_bf16_copy_refresh);
    LT_RUN(test_bf16_logits_and_errors);
    lm_ctx_destroy(g_cpu);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
