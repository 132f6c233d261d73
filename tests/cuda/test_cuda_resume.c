/* Bit-exact resume of a training run on CUDA, on the committed data of the CPU run test
 * (tests/data/train: corpus.txt tokenized with tokenizer.json, the 2-layer
 * tiny_llama.json initialised with seed 1): 24 AdamW steps of batch 8 x 32 on the GPU,
 * a checkpoint after step 12; then a fresh model loaded from that checkpoint onto the
 * GPU, a new data loader and lm_trainer_resume take steps 13..24 again. Every resumed
 * loss must equal the first run's bit for bit and the final weights (f32 masters, read
 * back) must be identical: the CUDA step has no atomics-ordered sums or other
 * run-to-run variation, and the checkpoint carries everything the step depends on
 * (weights, AdamW moments, step count, the data order). Once with f32 compute and once
 * with bf16 compute (bf16 copies of the weights, f32 masters); the loss must also fall.
 * Skipped (77) without a GPU or without CUDA in the build.
 * LM_TEST_LABELS: cuda model
 */
#include "cuda_test.h"

#include "loom/train.h"
#include "train/train_run_util.h"

#ifndef LOOM_HAVE_CUDA
int main(void) { lt_skip("built without CUDA"); }
#else

#define STEPS 24
#define MID 12

static lm_ctx *g_ctx;
static char g_train[512], g_config[512], g_tok[512];

static int prepare(void) {
    snprintf(g_train, sizeof g_train, "%s/cuda_resume_train.bin", LOOM_BINARY_DIR);
    snprintf(g_config, sizeof g_config, "%s/tests/data/train/tiny_llama.json", LOOM_SOURCE_DIR);
    snprintf(g_tok, sizeof g_tok, "%s/tests/data/train/tokenizer.json", LOOM_SOURCE_DIR);
    return lt_train_prepare("corpus.txt", g_train) > 0;
}

typedef lt_train_run run;

/* from_dir NULL: a fresh model from the config; else the model of a checkpoint. */
static int run_open(run *r, const char *from_dir, lm_dtype compute) {
    lm_train_options o;
    lm_train_options_default(&o);
    o.steps = STEPS, o.batch = 8, o.seq = 32, o.lr = 3e-3, o.min_lr = 3e-4, o.warmup = 4;
    return lt_train_run_open(r, &o, g_config, from_dir, g_train, ct_gpu, compute);
}

/* Parameter i's values as host floats (the caller frees). */
static float *values(lm_train_model *m, int i, int64_t *n) {
    lm_train_param p;
    LT_CHECK_OK(lm_train_model_param(m, i, &p));
    *n = lm_tensor_view_numel(&p.value);
    float *f = malloc(sizeof(float) * (size_t)*n);
    LT_CHECK_OK(lm_ctx_synchronize(g_ctx));
    LT_CHECK_OK(lm_tensor_view_read(NULL, &p.value, f));
    return f;
}

static int same_weights(lm_train_model *a, lm_train_model *b) {
    int same = lm_train_model_param_count(a) == lm_train_model_param_count(b);
    for (int i = 0; same && i < lm_train_model_param_count(a); i++) {
        int64_t na = 0, nb = 0;
        float *fa = values(a, i, &na), *fb = values(b, i, &nb);
        same = na == nb && memcmp(fa, fb, sizeof(float) * (size_t)na) == 0;
        free(fa), free(fb);
    }
    return same;
}

static void check_resume(lm_dtype compute) {
    char mid[600];
    snprintf(mid, sizeof mid, "%s/cuda_resume_mid_%s", LOOM_BINARY_DIR, lm_dtype_name(compute));
    run a, b;
    if (!run_open(&a, NULL, compute)) {
        lt_train_run_free(&a);
        return;
    }
    double losses[STEPS];
    for (int s = 0; s < STEPS; s++) {
        lm_train_step_info info;
        LT_CHECK_OK(lm_trainer_step(a.trainer, g_ctx, &info));
        LT_CHECK(info.step == s + 1 && isfinite(info.loss) && isfinite(info.grad_norm));
        losses[s] = info.loss;
        if (s + 1 == MID) LT_CHECK_OK(lm_trainer_save(a.trainer, g_ctx, mid, g_tok));
    }
    LT_CHECK_MSG(losses[STEPS - 1] < losses[0] - 1.0, "%s: loss did not fall: %.3f -> %.3f", lm_dtype_name(compute),
                 losses[0], losses[STEPS - 1]);
    int equal = 0, compared = 0;
    if (run_open(&b, mid, compute)) {
        LT_CHECK_OK(lm_trainer_resume(b.trainer, g_ctx, mid));
        LT_CHECK(lm_trainer_step_count(b.trainer) == MID);
        equal = 1;
        for (int s = MID; s < STEPS; s++) {
            lm_train_step_info info;
            LT_CHECK_OK(lm_trainer_step(b.trainer, g_ctx, &info));
            LT_CHECK_MSG(info.loss == losses[s], "%s step %d: resumed loss %.17g != %.17g", lm_dtype_name(compute),
                         s + 1, info.loss, losses[s]);
            equal &= info.loss == losses[s];
            compared++;
        }
        int weights = same_weights(a.model, b.model);
        LT_CHECK_MSG(weights, "%s: the resumed run's final weights differ", lm_dtype_name(compute));
        equal &= weights;
    }
    printf("  %s compute: loss %.3f -> %.3f; resumed at step %d: %d losses and the final weights %s\n",
           lm_dtype_name(compute), losses[0], losses[STEPS - 1], MID, compared, equal ? "bit-identical" : "DIFFER");
    lt_train_run_free(&b);
    lt_train_run_free(&a);
}

static void test_resume_bit_exact(void) {
    if (!prepare()) return;
    check_resume(LM_F32);
    check_resume(LM_BF16);
}

int main(void) {
    g_ctx = ct_start();
    LT_RUN(test_resume_bit_exact);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
