/* loom/train.h — training decoder models (llama, mistral, qwen2, qwen3): trainable f32
 * master weights, forward + backward through autograd, AdamW with global-norm
 * clipping, learning-rate schedules, gradient accumulation, and checkpoints that are
 * Hugging Face directories plus a resumable training state.
 *
 * Precision: master weights, gradients and optimizer moments are f32. The compute
 * dtype (lm_train_model_compute_dtype) is f32 by default; on CUDA it may be bf16
 * (bf16 copies of the weights per step, f32 gradients through lm_ag_bind_grad).
 *
 * Devices: every tensor lives on the model's device and every step runs through the
 * public operators, so the code is the same for any device whose operators exist.
 * Objects belong to one thread at a time.
 */
#ifndef LOOM_TRAIN_H
#define LOOM_TRAIN_H

#include "loom/autograd.h"
#include "loom/config.h"
#include "loom/data.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- learning-rate schedules ------------------------------------------------------------
 * Step s (0-based) of total: linear warmup lr * (s + 1) / warmup for s < warmup, then
 * from lr down to min_lr over the remaining steps, following a half cosine or a
 * straight line (progress p = (s - warmup) / max(1, total - warmup), clamped to 1);
 * constant keeps lr after the warmup. */
typedef enum lm_lr_schedule_kind { LM_LR_CONSTANT = 0, LM_LR_COSINE = 1, LM_LR_LINEAR = 2 } lm_lr_schedule_kind;

typedef struct lm_lr_schedule {
    lm_lr_schedule_kind kind;
    double lr, min_lr;
    int64_t warmup, total;
} lm_lr_schedule;

LM_API double lm_lr_at(const lm_lr_schedule *s, int64_t step);
/* "cosine", "linear", "constant" -> kind; LM_INVALID_ARGUMENT otherwise. */
LM_API lm_status lm_lr_schedule_parse(const char *name, lm_lr_schedule_kind *out);

/* ---- the training model -------------------------------------------------------------------- */
typedef struct lm_train_model lm_train_model;

/* A Hugging Face directory (config.json + safetensors in f32, bf16 or f16): weights
 * widened to f32 master copies on device. Caller owns *out. */
LM_API lm_status lm_train_model_load(const char *dir, lm_device device, lm_train_model **out);
/* A fresh model from a config.json file, initialised as transformers does: Linear
 * weights and embeddings N(0, initializer_range^2) (0.02 when absent), biases 0, norm
 * weights 1, drawn from lm_rng seeded with seed (the same seed gives the same bits). */
LM_API lm_status lm_train_model_init(const char *config_path, uint64_t seed, lm_device device, lm_train_model **out);
LM_API void lm_train_model_destroy(lm_train_model *m); /* accepts NULL */

LM_API const lm_model_config *lm_train_model_config(const lm_train_model *m);
LM_API lm_device lm_train_model_device(const lm_train_model *m);
LM_API int64_t lm_train_model_numel(const lm_train_model *m); /* trainable scalars */
LM_API lm_dtype lm_train_model_compute_dtype(const lm_train_model *m);
/* LM_F32 on any device; LM_BF16 on a CUDA model (LM_UNSUPPORTED elsewhere): each
 * forward then refreshes one bf16 copy of the weights from the f32 masters and runs
 * every operator in bf16 (f32 accumulation inside), with the loss in f32 and the
 * gradients added into the f32 gradient buffer. */
LM_API lm_status lm_train_model_set_compute_dtype(lm_train_model *m, lm_dtype dt);
/* Training FLOPs per token at sequence length T, the usual model-FLOPs count:
 * 6 x (weights of every matmul, the output projection included) + 12 x layers x
 * query heads x head_dim x T (attention scores and mixing, causal mask ignored).
 * MFU = tokens/s x this / peak FLOP/s. */
LM_API double lm_train_model_flops_per_token(const lm_train_model *m, int64_t T);

/* Parameter i in the Hugging Face order of lm_model_config_tensor (tied models have
 * no lm_head.weight): its name, f32 value and gradient views (borrowed, valid while m
 * lives), and whether weight decay applies (matrices: yes; norms and biases: no). */
typedef struct lm_train_param {
    const char *name;
    lm_tensor_view value; /* f32, the master weight */
    lm_tensor_view grad;  /* f32, the accumulated gradient */
    int decay;
} lm_train_param;
LM_API int lm_train_model_param_count(const lm_train_model *m);
LM_API lm_status lm_train_model_param(const lm_train_model *m, int i, lm_train_param *out);
/* LM_NOT_FOUND naming the tensor. */
LM_API lm_status lm_train_model_find(const lm_train_model *m, const char *name, lm_train_param *out);

/* Sets every gradient to 0, in ctx's stream order (ctx on the model's device). */
LM_API lm_status lm_train_model_zero_grad(lm_train_model *m, lm_ctx *ctx);
/* One micro-batch: ids and targets [B, T] host int32 (targets equal to -100 are
 * ignored). Runs forward and backward and ADDS grad_scale * d(mean loss) to the
 * gradients (grad_scale = 1 / accumulation steps). *loss = the micro-batch's mean
 * loss. Positions are 0..T-1 in every row (causal attention within the row). */
LM_API lm_status lm_train_model_forward_backward(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets,
                                                 int B, int64_t T, float grad_scale, float *loss);
/* The same mean loss without gradients (no_grad: no graph is kept). */
LM_API lm_status lm_train_model_loss(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, const int32_t *targets, int B,
                                     int64_t T, float *loss);
/* Logits of one sequence of T ids: logits [T, vocab] host f32. */
LM_API lm_status lm_train_model_logits(lm_train_model *m, lm_ctx *ctx, const int32_t *ids, int64_t T, float *logits);
/* The global gradient norm sqrt(sum of squares over all gradients). */
LM_API lm_status lm_train_model_grad_norm(lm_train_model *m, lm_ctx *ctx, double *norm);

/* Writes a Hugging Face directory into dir (which must exist): model.safetensors (f32
 * master weights, tied models without lm_head.weight), config.json (the source config
 * with torch_dtype float32), generation_config.json when the source directory had
 * one, and tokenizer.json from tokenizer_path, or from the source directory when
 * tokenizer_path is NULL and it has one. Each file is written atomically. */
LM_API lm_status lm_train_model_save(const lm_train_model *m, lm_ctx *ctx, const char *dir, const char *tokenizer_path);

/* ---- AdamW --------------------------------------------------------------------------------------- */
typedef struct lm_adamw_config {
    double beta1, beta2, eps; /* 0.9, 0.95, 1e-8 by default */
    double weight_decay;      /* applied to parameters with decay = 1; 0.1 by default */
} lm_adamw_config;

typedef struct lm_optimizer lm_optimizer;
/* Zeroed moments for every parameter of m (borrowed: must outlive the optimizer). */
LM_API lm_status lm_optimizer_create(lm_train_model *m, const lm_adamw_config *c, lm_optimizer **out);
LM_API void lm_optimizer_destroy(lm_optimizer *o); /* accepts NULL */
LM_API int64_t lm_optimizer_steps(const lm_optimizer *o); /* updates done so far */
/* One AdamW update of every parameter (one lm_adamw_update call over all of them) with
 * learning rate lr, gradients multiplied by grad_scale (clipping) first. */
LM_API lm_status lm_optimizer_step(lm_optimizer *o, lm_ctx *ctx, double lr, double grad_scale);

/* ---- data parallel: ranks of one MPI launch ---------------------------------------------------
 * N processes started together (`mpirun -np N loom train ...`) each hold the whole model
 * and train on their share of every global batch; gradients and losses are summed over
 * them (lm_trainer_set_dist). lm_dist is the communicator. In a build without MPI, or
 * without a launcher in the environment, it is a world of one rank in which every
 * collective returns at once. Collectives must be called by every rank in the same
 * order; an MPI error ends the whole job (MPI's default), so no rank waits forever. */
typedef struct lm_dist lm_dist;

/* 1 when loom was built with MPI. */
LM_API int lm_dist_available(void);
/* Joins the launch: MPI_Init_thread (funneled: the creating thread alone makes the
 * calls) when built with MPI and a launcher's variables (OMPI_COMM_WORLD_SIZE,
 * PMI_SIZE, PMIX_SIZE, MV2_COMM_WORLD_SIZE) are set, else one rank of one.
 * LM_UNSUPPORTED ("loom was built without MPI") when a launcher announces more than one
 * process to a build without MPI. One per process; caller owns *out. */
LM_API lm_status lm_dist_create(lm_dist **out);
/* MPI_Finalize when lm_dist_create initialised MPI. Accepts NULL. */
LM_API void lm_dist_destroy(lm_dist *d);
LM_API int lm_dist_rank(const lm_dist *d);       /* 0-based; 0 for NULL */
LM_API int lm_dist_size(const lm_dist *d);       /* ranks in the job; 1 for NULL */
LM_API int lm_dist_local_rank(const lm_dist *d); /* among the ranks on this host */
LM_API int lm_dist_local_size(const lm_dist *d);
/* buf[0..n) = its sum over all ranks, on every rank (host memory). */
LM_API lm_status lm_dist_allreduce_sum_f32(lm_dist *d, float *buf, int64_t n);
LM_API lm_status lm_dist_allreduce_sum_f64(lm_dist *d, double *buf, int64_t n);
/* buf[0..nbytes) of rank root, on every rank. */
LM_API lm_status lm_dist_broadcast(lm_dist *d, void *buf, size_t nbytes, int root);
LM_API lm_status lm_dist_barrier(lm_dist *d);
/* Ends every rank of the job with exit code `code` (MPI_Abort) when it has more than
 * one; returns at once in a world of one (the caller then exits as usual). */
LM_API void lm_dist_abort(lm_dist *d, int code);

/* ---- the training loop ------------------------------------------------------------------------------ */
typedef struct lm_train_options {
    int64_t steps;     /* optimizer steps of the whole run (the schedule's total) */
    int batch;         /* sequences per micro-batch */
    int64_t seq;       /* tokens per sequence */
    int grad_accum;    /* micro-batches per optimizer step */
    lm_lr_schedule_kind schedule;
    double lr, min_lr; /* peak and final learning rate */
    int64_t warmup;    /* warmup steps */
    double clip;       /* global gradient-norm limit; <= 0 disables clipping */
    lm_adamw_config adamw;
    /* One rank on a GPU: the loss and the gradient norm stay on the device and are read
     * (the step's one wait for it) only every log_every steps and at the last step; the
     * other steps report NaN (lm_train_step_info.stats 0). 0 or 1: every step. */
    int64_t log_every;
} lm_train_options;

/* steps 100, batch 8, seq 256, accum 1, cosine, lr 3e-4, min_lr 3e-5, warmup 10,
 * clip 1.0, AdamW (0.9, 0.95, 1e-8, weight decay 0.1), log_every 1. */
LM_API void lm_train_options_default(lm_train_options *o);

typedef struct lm_train_step_info {
    int64_t step;     /* 1-based number of the step just taken */
    double loss;      /* mean over its micro-batches */
    double lr;        /* learning rate used */
    double grad_norm; /* before clipping */
    int64_t tokens;   /* tokens processed by this step */
    int stats;        /* 1: loss and grad_norm are this step's; 0: not read (NaN; log_every) */
} lm_train_step_info;

typedef struct lm_trainer lm_trainer;
/* model and data are borrowed (must outlive the trainer). LM_INVALID_ARGUMENT for
 * options out of range or data whose vocabulary exceeds the model's. */
LM_API lm_status lm_trainer_create(lm_train_model *model, lm_data_loader *data, const lm_train_options *o,
                                   lm_trainer **out);
LM_API void lm_trainer_destroy(lm_trainer *t); /* accepts NULL */
LM_API int64_t lm_trainer_step_count(const lm_trainer *t);
/* Makes t one of lm_dist_size(d) data-parallel replicas (d borrowed; NULL: alone).
 * Call it on every rank before lm_trainer_resume and the first step, with the same
 * model, data and options everywhere. With N ranks and grad_accum A, a step consumes
 * N x A micro-batches in the data loader's one global order; rank r trains micro-batches
 * r x A .. r x A + A - 1 of them, each gradient scaled by 1 / (N x A), and the gradient
 * buffer is summed over the ranks before clipping, so every rank applies the same
 * AdamW update: N ranks with grad_accum A take the steps of one rank with grad_accum
 * N x A, up to the order of the floating-point sums. On the CPU the sums go through
 * MPI. With a model on a GPU (one GPU per rank) this joins the ranks in a NCCL
 * communicator (collective: every rank must call it), and the sums run on the GPUs in
 * the stream order of the step; when any rank cannot load NCCL (libnccl.so.2, or the
 * file $LOOM_NCCL_LIBRARY names), every rank sums through page-locked host memory and
 * MPI instead, and lm_trainer_collectives says so. */
LM_API lm_status lm_trainer_set_dist(lm_trainer *t, lm_dist *d);
/* How the ranks' gradients are summed, for a log line: "none (one rank)", "MPI in host
 * memory", "NCCL 2.27.3 on the GPUs" or "MPI through page-locked host memory (no
 * NCCL: why)". Borrowed; lives as long as t. */
LM_API const char *lm_trainer_collectives(const lm_trainer *t);
/* ZeRO stage of the data-parallel run: 0 (the default) keeps the whole AdamW state on
 * every rank; 1 shards it: rank r of N owns the contiguous slice r of the flat
 * parameter space (numel / N elements, boundaries rounded down to 16; a slice may cut
 * through tensors) and holds the two f32 moments of that slice alone (8 x numel / N
 * bytes instead of 8 x numel). Each step then reduce-scatters the gradients (a rank
 * receives the sum of its slice; the rest of its gradient buffer is left undefined),
 * takes the clip norm from the per-slice sums of squares summed over the ranks,
 * updates its slice and all-gathers the weights, so every rank ends the step with
 * the whole model, as at stage 0; the losses are the same up to the order of the
 * floating-point sums (with two ranks, identical). Checkpoints keep one format (rank 0
 * gathers the moments to write them, holding 8 x numel bytes while it does; a resume
 * reads this rank's slice), so stage 0 and stage 1 runs of any rank count resume each
 * other's. One rank at stage 1 is stage 0. Call it on every rank, after
 * lm_trainer_set_dist and before lm_trainer_resume and the first step.
 * LM_INVALID_ARGUMENT for another stage or after a step or resume; LM_UNSUPPORTED
 * for stage 1 with ranks on GPUs that sum without NCCL. */
LM_API lm_status lm_trainer_set_zero(lm_trainer *t, int stage);
LM_API int lm_trainer_zero_stage(const lm_trainer *t); /* 0 for NULL */
/* Bytes of optimizer state (the AdamW moments) this rank holds: 8 x numel at stage 0,
 * 8 x its slice at stage 1. */
LM_API int64_t lm_trainer_optimizer_state_bytes(const lm_trainer *t);
/* One optimizer step: zero gradients, grad_accum micro-batches of forward + backward,
 * the sum over the ranks (lm_trainer_set_dist), clip, AdamW at the scheduled learning
 * rate. info->loss is the mean over every rank's micro-batches and info->tokens counts
 * them all.
 * With one rank on a GPU the step never waits for the device before its end: the
 * losses, the gradient norm and the clipping coefficient stay on the device (read at
 * the end of the step, every log_every steps), and from the second step on the whole
 * step is one CUDA graph, captured once (the allocator keeps the memory it used for its
 * replays) and replayed with each step's batch and learning rate; the same operations
 * in the same order as the first, eager step, so the results are the same bits.
 * LOOM_TRAIN_CAPTURE=0, a trace or LOOM_PROFILE keep every step eager; a capture that
 * fails (lm_trainer_step_form says why) leaves the steps eager. */
LM_API lm_status lm_trainer_step(lm_trainer *t, lm_ctx *ctx, lm_train_step_info *info);
/* How steps run, for a log line: "eager (statistics read by the host each step)" (a
 * CPU, or ranks), "one captured CUDA graph", or "eager on the device (...)" with the
 * reason it is not captured. Borrowed, valid until the next call. */
LM_API const char *lm_trainer_step_form(const lm_trainer *t);
/* Kernels one replay of the captured step launches; 0 when steps are not captured. */
LM_API int64_t lm_trainer_graph_kernels(const lm_trainer *t);
/* Mean loss over the first `batches` batches of val (rewound first, so every
 * evaluation sees the same data). With ranks, batch b is computed by rank b mod N and
 * the mean is summed over them (every rank receives it). */
LM_API lm_status lm_trainer_evaluate(lm_trainer *t, lm_ctx *ctx, lm_data_loader *val, int64_t batches, double *loss);

/* A checkpoint: lm_train_model_save's files plus train_state.bin (optimizer moments,
 * step, data loader position with its RNG, batch geometry with the micro-batches per
 * step over all ranks, checksummed). With ranks every rank calls it: the replicas are
 * first checked to be identical (a hash of weights and moments against rank 0's, of
 * the weights alone under ZeRO-1, whose moment slices are then gathered at rank 0:
 * LM_INTERNAL on every rank otherwise), rank 0 alone writes, and every rank returns
 * rank 0's status. The checkpoint is built in the
 * sibling directory "<dir>.tmp-<pid>" and then put in place: renamed to dir when it
 * is new, atomically exchanged with it where the filesystem can (Linux renameat2),
 * else the previous one is renamed to "<dir>.old-<pid>" first and removed after. A
 * crash at any point leaves dir holding the old or the complete new checkpoint, or
 * leaves the old one as "<dir>.old-<pid>" for lm_train_checkpoints_recover to put
 * back. Errors name dir and the failing file (e.g. "No space left on device"); dir is
 * unchanged then. */
LM_API lm_status lm_trainer_save(lm_trainer *t, lm_ctx *ctx, const char *dir, const char *tokenizer_path);
/* Restores optimizer moments, step and data position from dir/train_state.bin. The
 * model must already hold dir's weights (lm_train_model_load(dir)). Errors:
 * LM_IO_ERROR (dir missing); LM_NOT_FOUND naming the files a partial checkpoint lacks;
 * LM_PARSE_ERROR naming the file and what is wrong (magic, version, truncation,
 * checksum, a field out of range); LM_SHAPE_MISMATCH when the state belongs to a model
 * of another size; LM_INVALID_ARGUMENT when batch or seq differ, or the micro-batches
 * per step over all ranks (ranks x grad_accum: any rank count N and grad_accum A with
 * the saved N x A resume) (the resumed run would not replay the same batches). Every
 * rank reads dir. Nothing changes on failure. */
LM_API lm_status lm_trainer_resume(lm_trainer *t, lm_ctx *ctx, const char *dir);

/* Whether dir is a complete checkpoint: config.json, model.safetensors and a
 * train_state.bin whose header, size and fields are valid (the checksum over the
 * moments is left to lm_trainer_resume: this check only maps the file, O(1)). *step
 * (may be NULL) receives its step. Errors: LM_IO_ERROR when dir is missing,
 * LM_NOT_FOUND naming every missing file, LM_PARSE_ERROR naming the bad field. */
LM_API lm_status lm_train_checkpoint_check(const char *dir, int64_t *step);

/* Receives one line of text per action of lm_train_checkpoints_recover. */
typedef void (*lm_train_report_fn)(void *user, const char *line);
/* Cleans up after interrupted saves in the output directory out, looking only at
 * entries "<name>.tmp-<pid>" and "<name>.old-<pid>" whose process no longer runs:
 * "<name>.old-<pid>" is renamed back to name when name is missing and it is a
 * complete checkpoint; every other such entry (a partial or replaced checkpoint, a
 * temporary file) is removed. Calls report (may be NULL) once per directory or file
 * restored or removed. A missing out is not an error. */
LM_API lm_status lm_train_checkpoints_recover(const char *out, lm_train_report_fn report, void *user);

#ifdef __cplusplus
}
#endif
#endif
