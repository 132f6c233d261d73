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
 * (The resumed run steps while the first one still holds its captured step, so its
 * own capture is refused and it runs eagerly: the losses also compare the two forms.)
 * And the step captured as one CUDA graph against the same steps run eagerly
 * (LOOM_TRAIN_CAPTURE=0), with gradient accumulation and a changing learning rate: the
 * same bits; log_every reads the statistics only on its steps.
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

/* The captured step against the same steps run eagerly (LOOM_TRAIN_CAPTURE=0), with 2
 * micro-batches a step and a warmup (the learning rate changes every step): the same
 * losses, gradient norms and final weights to the bit; the captured run reports its
 * graph. With log_every 3 only steps 3, 6, ... and the last read their statistics
 * (the others report NaN), and those equal the eager run's. */
#define CSTEPS 8
static void check_captured(lm_dtype compute) {
    lm_train_options o;
    lm_train_options_default(&o);
    o.steps = CSTEPS, o.batch = 4, o.seq = 32, o.grad_accum = 2, o.lr = 3e-3, o.min_lr = 3e-4, o.warmup = 3;
    double loss[3][CSTEPS], norm[3][CSTEPS];
    int stats[3][CSTEPS];
    run r[3];
    for (int k = 0; k < 3; k++) {
        if (k == 0) setenv("LOOM_TRAIN_CAPTURE", "0", 1);
        else unsetenv("LOOM_TRAIN_CAPTURE");
        o.log_every = k == 2 ? 3 : 1;
        if (!lt_train_run_open(&r[k], &o, g_config, NULL, g_train, ct_gpu, compute)) {
            lt_train_run_free(&r[k]);
            return;
        }
        for (int st = 0; st < CSTEPS; st++) {
            lm_train_step_info info;
            LT_CHECK_OK(lm_trainer_step(r[k].trainer, g_ctx, &info));
            loss[k][st] = info.loss, norm[k][st] = info.grad_norm, stats[k][st] = info.stats;
        }
        int64_t kernels = lm_trainer_graph_kernels(r[k].trainer);
        LT_CHECK_MSG(k == 0 ? kernels == 0 : kernels > 0, "%s run %d: %lld kernels captured (%s)",
                     lm_dtype_name(compute), k, (long long)kernels, lm_trainer_step_form(r[k].trainer));
        if (k == 1) {
            LT_CHECK_MSG(same_weights(r[0].model, r[1].model), "%s: the captured run's weights differ",
                         lm_dtype_name(compute));
            printf("  %s compute: %s of %lld kernels; eager: %s\n", lm_dtype_name(compute),
                   lm_trainer_step_form(r[1].trainer), (long long)kernels, lm_trainer_step_form(r[0].trainer));
            lt_train_run_free(&r[1]); /* its reservation: run 2 captures its own */
        }
    }
    unsetenv("LOOM_TRAIN_CAPTURE");
    for (int st = 0; st < CSTEPS; st++) {
        LT_CHECK_MSG(stats[0][st] && stats[1][st] && isfinite(loss[0][st]) && loss[1][st] == loss[0][st] &&
                         norm[1][st] == norm[0][st],
                     "%s step %d: captured loss %.17g norm %.17g, eager %.17g %.17g", lm_dtype_name(compute), st + 1,
                     loss[1][st], norm[1][st], loss[0][st], norm[0][st]);
        int read = (st + 1) % 3 == 0 || st + 1 == CSTEPS;
        LT_CHECK_MSG(stats[2][st] == read && (read ? loss[2][st] == loss[0][st] && norm[2][st] == norm[0][st]
                                                   : isnan(loss[2][st]) && isnan(norm[2][st])),
                     "%s step %d, log_every 3: stats %d loss %.17g (eager %.17g)", lm_dtype_name(compute), st + 1,
                     stats[2][st], loss[2][st], loss[0][st]);
    }
    LT_CHECK(same_weights(r[0].model, r[2].model));
    lt_train_run_free(&r[2]);
    lt_train_run_free(&r[0]);
}

static void test_captured_step_equals_eager(void) {
    if (!prepare()) return;
    check_captured(LM_BF16);
    check_captured(LM_F32);
}

int main(void) {
    g_ctx = ct_start();
    LT_RUN(test_resume_bit_exact);
    LT_RUN(test_captured_step_equals_eager);
    lm_ctx_destroy(g_ctx);
    return lt_finish();
}
#endif
