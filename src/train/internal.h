/* train/internal.h — the training model, optimizer and state-file records shared by
 * the train sources (never installed).
 *
 * All parameters live in one f32 allocation (flat, [numel]) carved into per-tensor
 * views in the Hugging Face order of lm_model_config_tensor; gradients mirror it in
 * flat_grad and the optimizer's moments in two more flat buffers with the same
 * offsets. One allocation per role keeps zeroing, norms, checkpoint I/O and device
 * copies single calls, and makes the optimizer state a plain array.
 */
#ifndef LOOM_TRAIN_INTERNAL_H
#define LOOM_TRAIN_INTERNAL_H

#include "base/internal.h"
#include "loom/train.h"

typedef struct lm__tparam {
    char name[96];
    int ndim;
    int64_t shape[2];
    int64_t offset; /* elements from the start of the flat buffers */
    lm_tensor *value, *grad; /* views over flat and flat_grad */
    lm_tensor *low;          /* view over flat_low (bf16 compute), else NULL */
    int decay;
} lm__tparam;

struct lm_train_model {
    lm_model_config cfg;
    lm_device device;
    char *config_json;  /* [config_len] the source config.json text */
    size_t config_len;
    char *source_dir;   /* directory the model was loaded from, or NULL */
    int nparams;
    lm__tparam *params; /* [nparams] */
    int64_t numel;
    lm_tensor *flat, *flat_grad; /* [numel] f32 on device */
    lm_tensor *flat_low;         /* [numel] bf16 copy of flat under bf16 compute; NULL: f32 compute */
    int embed, head;             /* parameter indices; head == embed when tied */
    lm_tensor *inv_freq;         /* [head_dim / 2] f32 on device */
};

struct lm_optimizer {
    lm_train_model *m;
    lm_adamw_config c;
    lm_tensor *m1, *m2;            /* [numel] f32 first and second moments */
    lm_tensor_view *pv, *gv, *mv, *vv; /* [nparams] views per parameter */
    float *wd;                     /* [nparams] weight decay per parameter */
    int64_t steps;
};

/* ---- model.c ---- */
/* Index of the parameter called name, or -1. */
int lm__train_find(const lm_train_model *m, const char *name);

/* ---- state.c: train_state.bin ---- */
typedef struct lm__train_state {
    int64_t step;
    int64_t numel;
    int64_t nparams;
    int64_t batch, seq;
    int64_t grad_accum; /* micro-batches per optimizer step over all ranks (ranks x --grad-accum) */
    lm_data_loader_state data;
} lm__train_state;

/* Writes the header fields and the two moment buffers (host copies are taken). */
lm_status lm__train_state_write(lm_ctx *ctx, const char *path, const lm__train_state *s, const lm_tensor *m1,
                                const lm_tensor *m2);
/* Reads and validates path; on success *s is filled and the moments are copied into
 * m1 and m2 (which must have s->numel elements: checked against expect_numel first). */
lm_status lm__train_state_read(const char *path, int64_t expect_numel, int64_t expect_nparams, lm__train_state *s,
                               lm_tensor *m1, lm_tensor *m2);
/* Validates path's header, size and field ranges without a model and without the
 * checksum pass (lm__train_state_read does that), filling *s: the test of a complete
 * checkpoint, O(1) in the file size. */
lm_status lm__train_state_check(const char *path, lm__train_state *s);

/* ---- dist.c: data-parallel helpers ---- */
/* Sums the f32 tensor t (contiguous, on any device) over the ranks of d in place; a
 * device tensor goes through page-locked host memory, allocated at the first call into
 * *stage (numel floats; the caller frees it with lm_host_free on t's device). */
lm_status lm__dist_allreduce_tensor(lm_dist *d, lm_tensor *t, float **stage);
/* Every rank hashes bufs (f32 tensors) and compares with rank 0's hash: LM_INTERNAL on
 * every rank when any replica differs (data-parallel ranks must stay identical). */
lm_status lm__dist_check_replicas(lm_dist *d, lm_ctx *ctx, const lm_tensor *const *bufs, int nbufs);

#endif
