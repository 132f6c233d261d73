/* tests/train/train_run_util.h — a training run of the tests on committed data
 * (test_train_run.c on the CPU, tests/cuda/test_cuda_resume.c on CUDA): its model, data
 * loader and trainer, opened fresh from a config or from a checkpoint. The including
 * test includes harness.h and loom/train.h first.
 */
#ifndef LOOM_TESTS_TRAIN_RUN_UTIL_H
#define LOOM_TESTS_TRAIN_RUN_UTIL_H

#include <string.h>

#include "loom/tokenizer.h"

/* Tokenizes the committed text tests/data/train/NAME (e.g. "corpus.txt") with the
 * committed tokenizer into the token file out (documents separated by id 384); returns
 * the tokens written (0 on failure, recorded as a test failure). */
static inline int64_t lt_train_prepare(const char *name, const char *out) {
    char tok_path[512], text[512];
    snprintf(tok_path, sizeof tok_path, "%s/tests/data/train/tokenizer.json", LOOM_SOURCE_DIR);
    snprintf(text, sizeof text, "%s/tests/data/train/%s", LOOM_SOURCE_DIR, name);
    lm_tokenizer *tok = NULL;
    int64_t n = 0;
    LT_CHECK_OK(lm_tokenizer_load(tok_path, &tok));
    const char *inputs[1] = {text};
    if (tok) LT_CHECK_OK(lm_data_prepare(tok, 1, inputs, 384, out, &n));
    lm_tokenizer_destroy(tok);
    return n;
}

typedef struct lt_train_run {
    lm_train_model *model;
    lm_data_loader *data;
    lm_trainer *trainer;
} lt_train_run;

static inline void lt_train_run_free(lt_train_run *r) {
    lm_trainer_destroy(r->trainer);
    lm_data_loader_destroy(r->data);
    lm_train_model_destroy(r->model);
}

/* from_dir NULL: a fresh model from config (seed 1); else the model of that checkpoint.
 * On dev, computing in compute, reading train_bin (shuffled, seed 1) with options o.
 * Returns whether the trainer exists (failures are recorded as test failures). */
static inline int lt_train_run_open(lt_train_run *r, const lm_train_options *o, const char *config,
                                    const char *from_dir, const char *train_bin, lm_device dev, lm_dtype compute) {
    memset(r, 0, sizeof *r);
    const char *paths[1] = {train_bin};
    LT_CHECK_OK(from_dir ? lm_train_model_load(from_dir, dev, &r->model) : lm_train_model_init(config, 1, dev, &r->model));
    if (!r->model) return 0;
    LT_CHECK_OK(lm_train_model_set_compute_dtype(r->model, compute));
    LT_CHECK_OK(lm_data_loader_create(1, paths, o->seq, 1, 1, &r->data));
    if (r->data) LT_CHECK_OK(lm_trainer_create(r->model, r->data, o, &r->trainer));
    return r->trainer != NULL;
}

#endif
