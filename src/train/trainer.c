/* train/trainer.c — the training loop: one optimizer step = zeroed gradients, then
 * grad_accum micro-batches of forward + backward (each scaled by 1 / grad_accum, so
 * the update follows the mean loss), global-norm clipping folded into the AdamW pass,
 * and the scheduled learning rate. Also evaluation, and crash-safe checkpoints.
 *
 * Data parallel (lm_trainer_set_dist, N ranks): the step's N x grad_accum micro-batches
 * are drawn on every rank in the loader's one order (so every loader stays in the same
 * state, the one a checkpoint records) and rank r trains the r-th run of grad_accum of
 * them, scaled by 1 / (N x grad_accum); the gradient buffer and the loss are then
 * summed over the ranks, so the clip norm and the AdamW update are the global ones and
 * identical everywhere. With N = 1 the code and its floating-point operations are the
 * single-process ones exactly (bit-exact resume is unchanged).
 *
 * ZeRO-1 (lm_trainer_set_zero): the optimizer state is sharded. Rank r owns the flat
 * elements [bounds[r], bounds[r + 1]) (numel / N each, boundaries rounded down to 16
 * floats; a slice may cut through tensors) and holds the AdamW moments of those alone.
 * A step reduce-scatters the gradient buffer (each rank receives the sum of its
 * slice), sums the per-slice sums of squares over the ranks for the clip norm, runs
 * AdamW on its slice and all-gathers the updated weights, so every rank again holds
 * the whole model. With two ranks the sums are the all-reduce's exactly (a + b is
 * commutative) and the AdamW map is per element, so the steps are bit-identical to
 * the replicated ones; the norm is rounded to f32 from a double sum as the unsharded
 * one is. Checkpoints keep the one format: rank 0 gathers the moments to write them,
 * and a resuming rank reads its slice, so either setting and any rank count resume
 * the other's checkpoints. GPU ranks run these collectives through NCCL on the
 * compute stream (train/dist_cuda.c); without NCCL, GPU ranks all-reduce through
 * page-locked host memory and ZeRO-1 is refused there.
 * Everything the next step depends on (weights, moments, step, data position) is in
 * a checkpoint, so a resumed run replays the same steps bit for bit.
 *
 * Checkpoint protocol. In an output directory a checkpoint NAME only ever appears as
 *   NAME          a complete checkpoint: the only name readers and --resume take;
 *   NAME.tmp-PID  being built by process PID or, after an exchange, the replaced
 *                 checkpoint being removed: never taken for a checkpoint;
 *   NAME.old-PID  the replaced checkpoint moved aside (fallback scheme below).
 * Complete = config.json, model.safetensors and a valid train_state.bin
 * (lm_train_checkpoint_check). A save (lm_trainer_save):
 *   1. builds NAME.tmp-PID: the model files, then train_state.bin LAST, each file
 *      written atomically, then fsyncs the directory;
 *   2. NAME absent: rename(tmp, NAME), atomic;
 *      NAME present: renameat2(tmp, NAME, RENAME_EXCHANGE) swaps the two in one step
 *      (Linux 3.15+, glibc 2.28+), so NAME goes from the old complete checkpoint to the
 *      new one, and tmp now holds the old one;
 *      where the filesystem cannot exchange (EINVAL, ENOSYS, EOPNOTSUPP): rename(NAME,
 *      NAME.old-PID), then rename(tmp, NAME); between the two NAME is missing and the
 *      old complete checkpoint is NAME.old-PID;
 *   3. fsyncs the parent directory, then removes the replaced checkpoint,
 *      train_state.bin first, so a half-removed directory is never complete.
 * Recovery (lm_train_checkpoints_recover, run by `loom train` on its output directory
 * before anything else) looks at the .tmp-PID / .old-PID entries of processes that no
 * longer run: NAME.old-PID is renamed back to NAME when NAME is missing and it is
 * complete; every other such entry is removed (a .tmp- directory is never promoted:
 * it may be partial). So at every instant the old or the new complete checkpoint is
 * NAME, or NAME.old-PID until the next start puts it back.
 *
 * Test hooks, read from the environment at each save:
 *   LOOM_TEST_KILL_AT=PHASE:N      the process raises SIGKILL at PHASE of the trainer's
 *                                  Nth save (1-based); PHASE is after-weights,
 *                                  after-state, before-swap, after-move-aside
 *                                  (fallback only), after-swap, before-remove-old or
 *                                  mid-remove-old;
 *   LOOM_TEST_NO_RENAME_EXCHANGE=1 uses the fallback scheme even where exchange works.
 */
#define _GNU_SOURCE /* renameat2 and RENAME_EXCHANGE in <stdio.h> (glibc 2.28+) */
#include "train/internal.h"
#include "ops/internal.h"
#include "runtime/internal.h"

#include "loom/io_write.h"
#include "loom/trace.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct lm_trainer {
    lm_train_model *model;
    lm_data_loader *data;
    lm_train_options o;
    lm_optimizer *opt;
    int32_t *ids, *targets; /* [batch * seq] host micro-batch */
    int64_t saves;          /* lm_trainer_save calls so far (LOOM_TEST_KILL_AT counts them) */
    lm_dist *dist;          /* borrowed; NULL: a single process */
    float *stage;           /* [numel] page-locked host copy of the gradients (device models with ranks, no NCCL) */
    lm__nccl *nccl;         /* the ranks' GPU communicator (CUDA models with ranks, when NCCL loads) */
    struct grad_buckets *buckets; /* NCCL at ZeRO stage 0: all-reduces overlapped with the backward */
    char collectives[320];  /* how the ranks' sums are taken (lm_trainer_collectives) */
    int zero;               /* ZeRO stage: 0 = replicated optimizer state, 1 = sharded over the ranks */
    int64_t *bounds;        /* [ranks + 1] ZeRO-1 slices of the flat parameters, rank r's
                             * [bounds[r], bounds[r + 1]); NULL at stage 0 */
    /* one rank on a GPU: the step keeps its statistics on the device (step_device) and,
     * from its second step, runs as one captured graph */
    lm_tensor **d_ids, **d_targets; /* [grad_accum] micro-batches: [batch, seq] and [batch * seq] i32 */
    lm_tensor *d_stats;             /* f32 [grad_accum + 1]: the micro-batches' losses, the sum of squares */
    float *h_stats;                 /* [grad_accum + 1]: d_stats read back */
    lm_tensor *d_dyn;               /* i64 [4]: the optimizer's values as doubles (lm__optimizer_dyn_values) */
    int64_t dev_steps;              /* steps taken by step_device */
    int64_t last_gen;               /* model->layout_gen after the last of them */
    lm_device_graph *graph;         /* the captured step; NULL: none (yet) */
    int64_t graph_gen;              /* model->layout_gen it was captured at */
    const lm_optimizer *graph_opt;  /* the optimizer it updates */
    int capture_off;                /* 1: steps run eagerly (capture_note says why) */
    char capture_note[320];
};

/* The gradient buffer cut into buckets of whole parameters, in flat order, of at least
 * 32 MiB each ($LOOM_NCCL_BUCKET_MB sets another size; the last bucket takes the
 * rest): during a step's last backward, a bucket is all-reduced on the communicator's
 * stream as soon as its last parameter's gradient is final, while the backward goes on
 * with the layers below (every rank finishes the parameters in the same order, so the
 * collectives match). */
typedef struct grad_buckets {
    lm_trainer *t;
    lm_ctx *ctx;    /* of the running step */
    int n;          /* buckets */
    int *of_param;  /* [nparams] each parameter's bucket */
    int *count;     /* [n] parameters in each bucket */
    int *left;      /* [n] of them not final yet in this backward */
    int64_t *lo;    /* [n + 1] bucket b covers flat elements [lo[b], lo[b + 1]) */
} grad_buckets;

static void buckets_destroy(grad_buckets *b) {
    if (!b) return;
    lm__free(b->of_param), lm__free(b->count), lm__free(b->left), lm__free(b->lo);
    lm__free(b);
}

static lm_status buckets_create(lm_trainer *t, grad_buckets **out) {
    const lm_train_model *m = t->model;
    size_t np = (size_t)(m->nparams > 0 ? m->nparams : 1);
    grad_buckets *b = lm__calloc(1, sizeof *b);
    if (!b) return LM_OUT_OF_MEMORY;
    b->t = t;
    b->of_param = lm__calloc(np, sizeof *b->of_param);
    b->count = lm__calloc(np, sizeof *b->count), b->left = lm__calloc(np, sizeof *b->left);
    b->lo = lm__calloc(np + 1, sizeof *b->lo);
    if (!b->of_param || !b->count || !b->left || !b->lo) {
        buckets_destroy(b);
        return LM_OUT_OF_MEMORY;
    }
    const char *env = getenv("LOOM_NCCL_BUCKET_MB");
    double mb = env && *env ? strtod(env, NULL) : 32.0;
    if (!(mb > 0 && mb < 1e6)) {
        buckets_destroy(b);
        return lm__error(LM_INVALID_ARGUMENT, "LOOM_NCCL_BUCKET_MB='%s' is not a size in MiB (e.g. 32 or 0.5)", env);
    }
    int64_t cap = LM_MAX((int64_t)(mb * 1024 * 1024 / sizeof(float)), 1);
    for (int i = 0; i < m->nparams; i++) { /* parameters lie in flat order, back to back */
        if (b->n == 0 || m->params[i].offset - b->lo[b->n - 1] >= cap) b->lo[b->n++] = m->params[i].offset;
        b->of_param[i] = b->n - 1;
        b->count[b->n - 1]++;
    }
    b->lo[0] = 0, b->lo[b->n] = m->numel;
    *out = b;
    return LM_OK;
}

static lm_status bucket_param_done(void *user, int param) {
    grad_buckets *b = user;
    int k = b->of_param[param];
    if (--b->left[k] > 0) return LM_OK;
    float *g = lm_tensor_data(b->t->model->flat_grad);
    return lm__nccl_allreduce_f32_overlapped(b->t->nccl, b->ctx, g + b->lo[k], b->lo[k + 1] - b->lo[k]);
}

/* Micro-batches per optimizer step over all ranks. */
static int64_t global_accum(const lm_trainer *t) { return (int64_t)lm_dist_size(t->dist) * t->o.grad_accum; }

void lm_train_options_default(lm_train_options *o) {
    *o = (lm_train_options){100, 8, 256, 1, LM_LR_COSINE, 3e-4, 3e-5, 10, 1.0, {0.9, 0.95, 1e-8, 0.1}, 1};
}

static lm_status check_options(const lm_train_options *o, const lm_train_model *m, const lm_data_loader *d) {
    if (o->steps < 1 || o->batch < 1 || o->seq < 1 || o->grad_accum < 1 || o->warmup < 0)
        return lm__error(LM_INVALID_ARGUMENT, "training options: steps %lld, batch %d, seq %lld, grad_accum %d and warmup "
                                              "%lld must be positive (warmup may be 0)",
                         (long long)o->steps, o->batch, (long long)o->seq, o->grad_accum, (long long)o->warmup);
    if (!(o->lr >= 0 && o->min_lr >= 0 && o->min_lr <= o->lr))
        return lm__error(LM_INVALID_ARGUMENT, "training options: need 0 <= min_lr (%g) <= lr (%g)", o->min_lr, o->lr);
    if (o->seq > m->cfg.max_position_embeddings)
        return lm__error(LM_INVALID_ARGUMENT, "training options: seq %lld exceeds max_position_embeddings %lld",
                         (long long)o->seq, (long long)m->cfg.max_position_embeddings);
    if (lm_data_loader_vocab(d) > m->cfg.vocab_size)
        return lm__error(LM_INVALID_ARGUMENT, "training data use a vocabulary of %lld ids but the model has %lld",
                         (long long)lm_data_loader_vocab(d), (long long)m->cfg.vocab_size);
    return LM_OK;
}

lm_status lm_trainer_create(lm_train_model *model, lm_data_loader *data, const lm_train_options *o, lm_trainer **out) {
    if (!model || !data || !o || !out) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_create: NULL argument");
    *out = NULL;
    LM_TRY(check_options(o, model, data));
    lm_trainer *t = lm__calloc(1, sizeof *t);
    if (!t) return LM_OUT_OF_MEMORY;
    t->model = model, t->data = data, t->o = *o;
    size_t n = (size_t)o->batch * (size_t)o->seq;
    t->ids = lm__calloc(n, sizeof *t->ids);
    t->targets = lm__calloc(n, sizeof *t->targets);
    /* the optimizer itself comes at the first need (ensure_opt) or with
     * lm_trainer_set_zero: a sharded run never holds the whole moments */
    lm_status st = t->ids && t->targets ? lm__adamw_config_check(&o->adamw) : LM_OUT_OF_MEMORY;
    if (st != LM_OK) {
        lm_trainer_destroy(t);
        return st;
    }
    *out = t;
    return LM_OK;
}

/* Forgets the captured step (its graph and the allocator's reservation for it). */
static void drop_graph(lm_trainer *t) {
    if (!t->graph) return;
    lm_device_graph_destroy(t->graph);
    lm__device_reserve_release(t->model->device);
    t->graph = NULL;
}

static void device_buffers_free(lm_trainer *t) {
    for (int a = 0; a < t->o.grad_accum && t->d_ids; a++) lm_tensor_destroy(t->d_ids[a]);
    for (int a = 0; a < t->o.grad_accum && t->d_targets; a++) lm_tensor_destroy(t->d_targets[a]);
    lm__free(t->d_ids), lm__free(t->d_targets), lm__free(t->h_stats);
    lm_tensor_destroy(t->d_stats), lm_tensor_destroy(t->d_dyn);
    t->d_ids = t->d_targets = NULL, t->d_stats = t->d_dyn = NULL, t->h_stats = NULL;
}

void lm_trainer_destroy(lm_trainer *t) {
    if (!t) return;
    drop_graph(t);
    device_buffers_free(t);
    lm__free(t->bounds);
    if (t->stage) lm_host_free(t->model->device, t->stage);
    buckets_destroy(t->buckets);
    lm__nccl_destroy(t->nccl);
    lm_optimizer_destroy(t->opt);
    lm__free(t->ids);
    lm__free(t->targets);
    lm__free(t);
}

int64_t lm_trainer_step_count(const lm_trainer *t) { return t->opt ? lm_optimizer_steps(t->opt) : 0; }

/* The optimizer over every parameter when lm_trainer_set_zero made none. */
static lm_status ensure_opt(lm_trainer *t) {
    return t->opt ? LM_OK : lm_optimizer_create(t->model, &t->o.adamw, &t->opt);
}

lm_status lm_trainer_set_dist(lm_trainer *t, lm_dist *d) {
    if (!t) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_set_dist: NULL trainer");
    if ((int64_t)lm_dist_size(d) * t->o.grad_accum > INT32_MAX)
        return lm__error(LM_INVALID_ARGUMENT, "data parallel: %d ranks x grad_accum %d micro-batches per step are too "
                                              "many",
                         lm_dist_size(d), t->o.grad_accum);
    if (t->zero && lm_trainer_step_count(t) > 0)
        return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_set_dist: the ZeRO-1 slices cannot change after the first "
                                              "step or a resume");
    t->dist = d;
    buckets_destroy(t->buckets);
    lm__nccl_destroy(t->nccl);
    t->nccl = NULL, t->buckets = NULL;
    if (lm_dist_size(d) == 1) {
        snprintf(t->collectives, sizeof t->collectives, "none (one rank)");
    } else if (lm__device_host_addressable(t->model->device)) {
        snprintf(t->collectives, sizeof t->collectives, "MPI in host memory");
    } else { /* a GPU per rank: NCCL when every rank can load it, else MPI through host memory */
        lm_status st = lm__dist_nccl_create(d, t->model->device, &t->nccl);
        if (st == LM_OK) st = buckets_create(t, &t->buckets);
        if (st == LM_OK)
            snprintf(t->collectives, sizeof t->collectives, "NCCL %d.%d.%d on the GPUs (%d bucket%s overlapped with "
                     "the backward)",
                     lm__nccl_version() / 10000, lm__nccl_version() / 100 % 100, lm__nccl_version() % 100,
                     t->buckets->n, t->buckets->n == 1 ? "" : "s");
        else if (st == LM_UNSUPPORTED)
            snprintf(t->collectives, sizeof t->collectives, "MPI through page-locked host memory (no NCCL: %s)",
                     lm_last_error());
        else
            return st;
    }
    return t->zero ? lm_trainer_set_zero(t, t->zero) : LM_OK;
}

const char *lm_trainer_collectives(const lm_trainer *t) {
    return t && t->collectives[0] ? t->collectives : "none (one rank)";
}

/* Slice boundaries of n elements over k ranks: r x n / k rounded down to 16 floats
 * (64 bytes), so the slices differ from n / k by less than 16 elements. */
static void zero_bounds(int64_t n, int k, int64_t *b) {
    for (int r = 0; r < k; r++) b[r] = r * (n / k) + (r * (n % k)) / k, b[r] &= ~(int64_t)15;
    b[k] = n;
}

lm_status lm_trainer_set_zero(lm_trainer *t, int stage) {
    if (!t) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_set_zero: NULL trainer");
    if (stage != 0 && stage != 1)
        return lm__error(LM_INVALID_ARGUMENT, "ZeRO stage %d is not supported (0: optimizer state replicated on every "
                                              "rank, 1: sharded over the ranks)",
                         stage);
    if (stage == 1 && lm_dist_size(t->dist) > 1 && !lm__device_host_addressable(t->model->device) && !t->nccl) {
        char dev[32];
        return lm__error(LM_UNSUPPORTED, "ZeRO stage 1 (sharded optimizer state) on %s needs NCCL, and the ranks sum "
                                         "through %s (train with ZeRO stage 0)",
                         lm_device_format(t->model->device, dev, sizeof dev), lm_trainer_collectives(t));
    }
    if (lm_trainer_step_count(t) > 0)
        return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_set_zero: call it before the first step and before a resume");
    int k = lm_dist_size(t->dist);
    int64_t *bounds = NULL, lo = 0, hi = t->model->numel;
    if (stage == 1) {
        if (!(bounds = lm__calloc((size_t)k + 1, sizeof *bounds))) return LM_OUT_OF_MEMORY;
        zero_bounds(t->model->numel, k, bounds);
        lo = bounds[lm_dist_rank(t->dist)], hi = bounds[lm_dist_rank(t->dist) + 1];
    }
    lm_optimizer *o = NULL;
    lm_status st = lm__optimizer_create_range(t->model, &t->o.adamw, lo, hi, &o);
    if (st != LM_OK) {
        lm__free(bounds);
        return st;
    }
    lm_optimizer_destroy(t->opt); /* the previous one, made before any step: nothing is lost */
    lm__free(t->bounds);
    t->opt = o, t->bounds = bounds, t->zero = stage;
    return LM_OK;
}

int lm_trainer_zero_stage(const lm_trainer *t) { return t ? t->zero : 0; }

int64_t lm_trainer_optimizer_state_bytes(const lm_trainer *t) {
    if (!t) return 0;
    return 2 * (int64_t)sizeof(float) * (t->opt ? t->opt->hi - t->opt->lo : t->model->numel);
}

/* ZeRO-1's reduction: each rank receives the sum of its slice of the gradients, and
 * the global norm comes from the per-slice sums of squares (double, summed over the
 * ranks, then rounded to f32 as lm_train_model_grad_norm's operator rounds). */
static lm_status zero_reduce(lm_trainer *t, lm_ctx *ctx, double *loss, double *norm) {
    float *grad = lm_tensor_data(t->model->flat_grad);
    if (t->nccl) LM_TRY(lm__nccl_reduce_scatter_f32(t->nccl, ctx, grad, t->bounds));
    else LM_TRY(lm__dist_reduce_scatter_f32(t->dist, grad, t->bounds));
    double sums[2] = {*loss, 0}; /* one all-reduce for the loss and the sum of squares */
    LM_TRY(lm__optimizer_grad_sumsq(t->opt, ctx, &sums[1]));
    LM_TRY(lm_dist_allreduce_sum_f64(t->dist, sums, 2));
    *loss = sums[0];
    *norm = sqrt((double)(float)sums[1]);
    return LM_OK;
}

/* The learning rate of the optimizer's next step under the run's schedule. */
static double lr_now(const lm_trainer *t) {
    const lm_train_options *o = &t->o;
    lm_lr_schedule s = {o->schedule, o->lr, o->min_lr, o->warmup, o->steps};
    return lm_lr_at(&s, lm_optimizer_steps(t->opt));
}

/* ---- one rank on a GPU: the step without host synchronization, captured ---------------------------- */

/* 1 when the step keeps its statistics on the device: a GPU, one rank. */
static int device_step(const lm_trainer *t) {
    return !lm__device_host_addressable(t->model->device) && lm_dist_size(t->dist) == 1 && !t->bounds;
}

static lm_status device_buffers(lm_trainer *t) {
    if (t->d_stats) return LM_OK;
    const lm_train_options *o = &t->o;
    lm_device d = t->model->device;
    int64_t ids[2] = {o->batch, o->seq}, tg = (int64_t)o->batch * o->seq, ns = o->grad_accum + 1, nd = 4;
    t->d_ids = lm__calloc((size_t)o->grad_accum, sizeof *t->d_ids);
    t->d_targets = lm__calloc((size_t)o->grad_accum, sizeof *t->d_targets);
    t->h_stats = lm__calloc((size_t)ns, sizeof *t->h_stats);
    lm_status st = t->d_ids && t->d_targets && t->h_stats ? LM_OK : LM_OUT_OF_MEMORY;
    for (int a = 0; st == LM_OK && a < o->grad_accum; a++) {
        st = lm_tensor_create(d, LM_I32, 2, ids, &t->d_ids[a]);
        if (st == LM_OK) st = lm_tensor_create(d, LM_I32, 1, &tg, &t->d_targets[a]);
    }
    if (st == LM_OK) st = lm_tensor_zeros(d, LM_F32, 1, &ns, &t->d_stats);
    if (st == LM_OK) st = lm_tensor_zeros(d, LM_I64, 1, &nd, &t->d_dyn);
    if (st != LM_OK) device_buffers_free(t);
    return st;
}

/* The step's device work: zero the gradients, forward and backward of every
 * micro-batch (losses into d_stats[0..A)), the sum of squares (d_stats[A]), the clipping
 * coefficient and AdamW reading d_dyn. Nothing waits for the device. */
static lm_status device_body(lm_trainer *t, lm_ctx *ctx) {
    const lm_train_options *o = &t->o;
    lm_train_model *m = t->model;
    float *stats = lm_tensor_data(t->d_stats);
    LM_TRY(lm_train_model_zero_grad(m, ctx));
    lm_ag_profile_mark(ctx, "step ", "zero_grad");
    for (int a = 0; a < o->grad_accum; a++)
        LM_TRY(lm__train_model_forward_backward_dev(m, ctx, t->d_ids[a], t->d_targets[a], o->batch, o->seq,
                                                    1.0f / (float)o->grad_accum, stats + a, a == 0));
    lm_tensor_view sumsq;
    LM_TRY(lm_tensor_view_init(&sumsq, stats + o->grad_accum, LM_F32, m->device, 0, NULL, NULL));
    LM_TRY(lm_sum_squares_out(ctx, 1, lm_tensor_as_view(m->flat_grad), &sumsq));
    LM_TRY(lm__clip_scale_out(ctx, &sumsq, o->clip, lm_tensor_as_view(t->d_dyn)));
    lm_ag_profile_mark(ctx, "step ", "grad_norm");
    LM_TRY(lm__optimizer_step_dyn(t->opt, ctx, lm_tensor_as_view(t->d_dyn)));
    lm_ag_profile_mark(ctx, "step ", "adamw");
    return LM_OK;
}

/* Why steps are not captured: LOOM_TRAIN_CAPTURE=0, a trace or profile (they time each
 * operation), or an earlier capture that failed; NULL when they may be. */
static const char *capture_blocked(const lm_trainer *t) {
    const char *e = getenv("LOOM_TRAIN_CAPTURE");
    if (e && strcmp(e, "0") == 0) return "LOOM_TRAIN_CAPTURE=0";
    if (lm_trace_enabled()) return "a trace is being written";
    if (lm_ag_profile_enabled()) return "LOOM_PROFILE is on";
    return t->capture_off ? t->capture_note : NULL;
}

/* Records the step's work as one graph (the allocator reserving what it allocates)
 * and launches it. On failure nothing has run: the step is left to the caller. */
static lm_status capture_step(lm_trainer *t, lm_ctx *ctx) {
    int64_t steps0 = t->opt->steps;
    lm_status st = lm__ctx_capture_begin_reserved(ctx);
    if (st != LM_OK) { /* e.g. another trainer's captured step holds this device's reservation */
        t->capture_off = 1;
        snprintf(t->capture_note, sizeof t->capture_note, "cannot capture: %s", lm_last_error());
        return st;
    }
    st = device_body(t, ctx);
    char why[200] = "";
    if (st != LM_OK) snprintf(why, sizeof why, "%s", lm_last_error());
    lm_device_graph *g = NULL;
    int64_t foreign = 0;
    lm_status end = lm__ctx_capture_end_reserved(ctx, &g, &foreign);
    if (st == LM_OK && end != LM_OK) st = end, snprintf(why, sizeof why, "%s", lm_last_error());
    if (st == LM_OK && foreign) {
        st = lm__error(LM_INTERNAL, "the captured step freed %lld blocks allocated before it", (long long)foreign);
        snprintf(why, sizeof why, "%s", lm_last_error());
    }
    if (st != LM_OK) {
        lm_device_graph_destroy(g);
        lm__device_reserve_release(t->model->device);
        t->opt->steps = steps0; /* nothing ran */
        t->capture_off = 1;
        snprintf(t->capture_note, sizeof t->capture_note, "the capture failed: %s", why);
        return st;
    }
    t->graph = g, t->graph_gen = t->model->layout_gen, t->graph_opt = t->opt;
    return lm_device_graph_launch(g, ctx);
}

static lm_status step_device(lm_trainer *t, lm_ctx *ctx, lm_train_step_info *info) {
    const lm_train_options *o = &t->o;
    lm_device d = t->model->device;
    LM_TRY(device_buffers(t));
    lm_ag_profile_mark(ctx, "step ", "(between steps)");
    int64_t tr = lm_trace_begin(), step_t0 = tr;
    for (int a = 0; a < o->grad_accum; a++) { /* pageable copies: the host arrays are free again on return */
        LM_TRY(lm_data_loader_next(t->data, o->batch, t->ids, t->targets));
        size_t bytes = (size_t)o->batch * (size_t)o->seq * sizeof(int32_t);
        LM_TRY(lm_ctx_copy(ctx, d, lm_tensor_data(t->d_ids[a]), lm_device_cpu(), t->ids, bytes));
        LM_TRY(lm_ctx_copy(ctx, d, lm_tensor_data(t->d_targets[a]), lm_device_cpu(), t->targets, bytes));
    }
    lm_trace_end(tr, "train", "data", NULL);
    int64_t step = lm_optimizer_steps(t->opt);
    double lr = lr_now(t), dyn[4];
    lm__optimizer_dyn_values(t->opt, lr, dyn);
    LM_TRY(lm_ctx_copy(ctx, d, lm_tensor_data(t->d_dyn), lm_device_cpu(), dyn, sizeof dyn));
    lm_ag_profile_mark(ctx, "step ", "data");
    if (t->graph && (t->graph_gen != t->model->layout_gen || t->graph_opt != t->opt)) drop_graph(t);
    tr = lm_trace_begin();
    if (t->graph) {
        LM_TRY(lm_device_graph_launch(t->graph, ctx));
        lm__optimizer_count_step(t->opt);
    } else if (t->dev_steps >= 1 && t->last_gen == t->model->layout_gen && !capture_blocked(t) &&
               capture_step(t, ctx) == LM_OK) {
        /* captured and launched (after an eager step of this layout: positions and the
         * GEMM plans exist, so the capture allocates and copies nothing from the host) */
    } else {
        lm_clear_error(); /* a failed capture ran nothing: the step runs eagerly */
        LM_TRY(device_body(t, ctx));
    }
    lm_trace_end(tr, "train", t->graph ? "captured step" : "step", NULL);
    t->dev_steps++;
    t->last_gen = t->model->layout_gen;
    int64_t every = o->log_every > 1 ? o->log_every : 1;
    int read = (step + 1) % every == 0 || step + 1 >= o->steps;
    double loss = NAN, norm = NAN;
    if (read) { /* the one wait for the device */
        LM_TRY(lm_tensor_view_read(ctx, lm_tensor_as_view(t->d_stats), t->h_stats));
        loss = 0;
        for (int a = 0; a < o->grad_accum; a++) loss += t->h_stats[a]; /* in order, in double, as step_host sums */
        loss /= (double)o->grad_accum;
        norm = sqrt((double)t->h_stats[o->grad_accum]);
    }
    lm_trace_end(step_t0, "train", "train step", NULL);
    lm_trace_memory();
    *info = (lm_train_step_info){step + 1, loss, lr, norm, (int64_t)o->grad_accum * o->batch * o->seq, read};
    return LM_OK;
}

int64_t lm_trainer_graph_kernels(const lm_trainer *t) { return t && t->graph ? lm_device_graph_kernels(t->graph) : 0; }

const char *lm_trainer_step_form(const lm_trainer *t) {
    if (!t || !device_step(t)) return "eager (statistics read by the host each step)";
    if (t->graph) return "one captured CUDA graph";
    const char *why = capture_blocked(t);
    if (why) {
        static _Thread_local char buf[400];
        snprintf(buf, sizeof buf, "eager on the device (not captured: %s)", why);
        return buf;
    }
    return "eager on the device (captured from the second step)";
}

lm_status lm_trainer_step(lm_trainer *t, lm_ctx *ctx, lm_train_step_info *info) {
    if (!t || !ctx || !info) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_step: NULL argument");
    if (device_step(t)) {
        LM_TRY(ensure_opt(t));
        return step_device(t, ctx, info);
    }
    LM_TRY(ensure_opt(t));
    const lm_train_options *o = &t->o;
    lm_ag_profile_mark(ctx, "step ", "(between steps)");
    int64_t step_t0 = lm_trace_begin(), tr = step_t0;
    LM_TRY(lm_train_model_zero_grad(t->model, ctx));
    lm_ag_profile_mark(ctx, "step ", "zero_grad");
    lm_trace_end(tr, "train", "zero grad", NULL);
    double loss = 0, norm = 0;
    int64_t G = global_accum(t), mine = (int64_t)lm_dist_rank(t->dist) * o->grad_accum; /* first of this rank's */
    for (int64_t a = 0; a < G; a++) {
        float l = 0;
        tr = lm_trace_begin();
        LM_TRY(lm_data_loader_next(t->data, o->batch, t->ids, t->targets));
        lm_ag_profile_mark(ctx, "step ", "data");
        lm_trace_end(tr, "train", "data", NULL);
        if (a < mine || a >= mine + o->grad_accum) continue; /* another rank's micro-batch */
        /* NCCL at stage 0: the last backward all-reduces each bucket as it completes */
        grad_buckets *b = t->nccl && !t->bounds && a == mine + o->grad_accum - 1 ? t->buckets : NULL;
        if (b) {
            b->ctx = ctx;
            memcpy(b->left, b->count, (size_t)b->n * sizeof *b->left);
        }
        LM_TRY(lm__train_model_forward_backward_notify(t->model, ctx, t->ids, t->targets, o->batch, o->seq,
                                                       1.0f / (float)G, &l, b ? bucket_param_done : NULL, b,
                                                       a == mine)); /* masters unchanged after the first */
        loss += l;
    }
    if (t->bounds) {
        tr = lm_trace_begin();
        LM_TRY(zero_reduce(t, ctx, &loss, &norm));
        lm_ag_profile_mark(ctx, "step ", "reduce_scatter");
        lm_trace_end(tr, "train", "reduce-scatter", NULL);
    } else {
        if (lm_dist_size(t->dist) > 1) {
            tr = lm_trace_begin();
            if (t->nccl) { /* every bucket went during the backward (each parameter's hook fires once) */
                for (int k = 0; k < t->buckets->n; k++)
                    if (t->buckets->left[k] != 0)
                        return lm__error(LM_INTERNAL, "gradient bucket %d of %d was not all-reduced (%d parameters "
                                                      "unfinished)",
                                         k, t->buckets->n, t->buckets->left[k]);
                LM_TRY(lm__nccl_join(t->nccl, ctx));
            } else
                LM_TRY(lm__dist_allreduce_tensor(t->dist, t->model->flat_grad, &t->stage));
            LM_TRY(lm_dist_allreduce_sum_f64(t->dist, &loss, 1));
            lm_ag_profile_mark(ctx, "step ", "allreduce");
            lm_trace_end(tr, "train", "allreduce", NULL);
        }
        tr = lm_trace_begin();
        LM_TRY(lm_train_model_grad_norm(t->model, ctx, &norm));
        lm_ag_profile_mark(ctx, "step ", "grad_norm");
        lm_trace_end(tr, "train", "grad norm", NULL);
    }
    /* torch.nn.utils.clip_grad_norm_: coefficient max / (norm + 1e-6), at most 1 */
    double scale = o->clip > 0 && isfinite(norm) ? LM_MIN(1.0, o->clip / (norm + 1e-6)) : 1.0;
    int64_t step = lm_optimizer_steps(t->opt);
    double lr = lr_now(t);
    tr = lm_trace_begin();
    LM_TRY(lm_optimizer_step(t->opt, ctx, lr, scale));
    lm_ag_profile_mark(ctx, "step ", "adamw");
    lm_trace_end(tr, "train", "optimizer", NULL);
    if (t->bounds && lm_dist_size(t->dist) > 1) { /* every rank's updated slice to every rank */
        tr = lm_trace_begin();
        if (t->nccl) LM_TRY(lm__nccl_allgather_f32(t->nccl, ctx, lm_tensor_data(t->model->flat), t->bounds));
        else LM_TRY(lm__dist_allgather_f32(t->dist, lm_tensor_data(t->model->flat), t->bounds));
        lm_ag_profile_mark(ctx, "step ", "allgather");
        lm_trace_end(tr, "train", "allgather", NULL);
    }
    lm_trace_end(step_t0, "train", "train step", NULL);
    lm_trace_memory();
    *info = (lm_train_step_info){step + 1, loss / (double)G, lr, norm, G * o->batch * o->seq, 1};
    return LM_OK;
}

lm_status lm_trainer_evaluate(lm_trainer *t, lm_ctx *ctx, lm_data_loader *val, int64_t batches, double *loss) {
    if (!t || !ctx || !val || batches < 1 || !loss) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_evaluate: bad arguments");
    lm_data_loader_rewind(val);
    int64_t tr = lm_trace_begin();
    double sum = 0;
    int n = lm_dist_size(t->dist), r = lm_dist_rank(t->dist);
    for (int64_t b = 0; b < batches; b++) {
        float l = 0;
        LM_TRY(lm_data_loader_next(val, t->o.batch, t->ids, t->targets));
        if (b % n != r) continue; /* another rank's batch */
        LM_TRY(lm_train_model_loss(t->model, ctx, t->ids, t->targets, t->o.batch, t->o.seq, &l));
        sum += l;
    }
    LM_TRY(lm_dist_allreduce_sum_f64(t->dist, &sum, 1));
    *loss = sum / (double)batches;
    lm_trace_end(tr, "train", "validation", NULL);
    return LM_OK;
}

/* ---- checkpoints (protocol at the top of the file) ------------------------------------------- */
static lm_status sys_fail(const char *what, const char *path) {
    return lm__error(LM_IO_ERROR, "%s '%s': %s", what, path, strerror(errno));
}

/* Removes the regular files of dir, then dir itself (a checkpoint has no subfolders).
 * A missing dir is not an error. */
static lm_status remove_dir(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? LM_OK : sys_fail("cannot open directory", dir);
    struct dirent *e;
    char path[4400];
    while ((e = readdir(d)) != NULL) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (unlink(path) != 0) {
            closedir(d);
            return sys_fail("cannot remove", path);
        }
    }
    closedir(d);
    return rmdir(dir) == 0 ? LM_OK : sys_fail("cannot remove directory", dir);
}

/* LOOM_TEST_KILL_AT=PHASE:N: dies here, as `kill -9` or a power cut would, when this
 * is PHASE of the Nth save. */
static void test_kill_point(const lm_trainer *t, const char *phase) {
    const char *e = getenv("LOOM_TEST_KILL_AT");
    size_t n = strlen(phase);
    if (e && !strncmp(e, phase, n) && e[n] == ':' && strtoll(e + n + 1, NULL, 10) == t->saves) raise(SIGKILL);
}

/* m1, m2: the whole [numel] moments (the optimizer's own, or gathered under ZeRO-1). */
static lm_status write_state(lm_trainer *t, lm_ctx *ctx, const char *dir, const lm_tensor *m1, const lm_tensor *m2) {
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    lm__train_state s = {lm_optimizer_steps(t->opt), t->model->numel, t->model->nparams, t->o.batch, t->o.seq,
                         global_accum(t), lm_data_loader_get_state(t->data)};
    return lm__train_state_write(ctx, path, &s, m1, m2);
}

/* The parent directory of dir, for the fsync after a rename. */
static void parent_of(const char *dir, char *buf, size_t size) {
    const char *slash = strrchr(dir, '/');
    if (!slash) snprintf(buf, size, ".");
    else if (slash == dir) snprintf(buf, size, "/");
    else snprintf(buf, size, "%.*s", (int)(slash - dir), dir);
}

/* Swaps the names a and b atomically (both must exist); -1 with errno ENOSYS where the
 * platform has no such call, EINVAL or EOPNOTSUPP where the filesystem refuses it. */
static int rename_exchange(const char *a, const char *b) {
    const char *off = getenv("LOOM_TEST_NO_RENAME_EXCHANGE");
    if (off && !strcmp(off, "1")) {
        errno = ENOSYS;
        return -1;
    }
#if defined(__linux__) && defined(RENAME_EXCHANGE)
    return renameat2(AT_FDCWD, a, AT_FDCWD, b, RENAME_EXCHANGE);
#else
    errno = ENOSYS;
    return -1;
#endif
}

static int exchange_unsupported(int err) {
    return err == EINVAL || err == ENOSYS || err == EOPNOTSUPP || err == ENOTSUP;
}

/* Step 2 of a save: the complete checkpoint tmp becomes dir. *replaced receives the
 * directory that now holds the previous checkpoint (tmp or old), or NULL when dir was
 * new. On failure dir is unchanged and tmp still holds the new checkpoint. */
static lm_status put_in_place(const lm_trainer *t, const char *tmp, const char *dir, const char *old,
                              const char **replaced) {
    struct stat sb;
    *replaced = NULL;
    if (lstat(dir, &sb) != 0) {
        if (errno != ENOENT) return sys_fail("cannot inspect", dir);
        if (rename(tmp, dir) != 0) return sys_fail("cannot rename the checkpoint into place", dir);
        test_kill_point(t, "after-swap");
        return LM_OK;
    }
    if (rename_exchange(tmp, dir) == 0) {
        test_kill_point(t, "after-swap");
        *replaced = tmp;
        return LM_OK;
    }
    if (!exchange_unsupported(errno)) return sys_fail("cannot exchange the checkpoint with", dir);
    if (rename(dir, old) != 0) return sys_fail("cannot move the previous checkpoint aside", dir);
    test_kill_point(t, "after-move-aside");
    if (rename(tmp, dir) != 0) {
        lm_status st = sys_fail("cannot rename the checkpoint into place", dir);
        /* if this fails too, recovery at the next start renames old back */
        if (rename(old, dir) != 0) lm__log(LM_LOG_WARN, "the previous checkpoint '%s' is now '%s'", dir, old);
        return st;
    }
    test_kill_point(t, "after-swap");
    *replaced = old;
    return LM_OK;
}

/* Removes a replaced checkpoint, train_state.bin first: from the first unlink on it
 * no longer passes for a complete checkpoint. */
static lm_status remove_replaced(const lm_trainer *t, const char *dir) {
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    if (unlink(path) != 0 && errno != ENOENT) return sys_fail("cannot remove", path);
    test_kill_point(t, "mid-remove-old");
    return remove_dir(dir);
}

static lm_status save(lm_trainer *t, lm_ctx *ctx, const char *dir, const char *tokenizer_path, const lm_tensor *m1,
                      const lm_tensor *m2);

/* ZeRO-1: every rank's moment slices gathered into whole [numel] moments in rank 0's
 * host memory (*m1, *m2; NULL elsewhere; 8 bytes a parameter there while the
 * checkpoint is written). A GPU's slices are copied to the host first. Whether every
 * rank allocated and staged what it needs is summed over the ranks first, so a
 * failure is every rank's before anyone enters the gathers. */
static lm_status gather_moments(lm_trainer *t, lm_ctx *ctx, lm_tensor **m1, lm_tensor **m2) {
    *m1 = *m2 = NULL;
    lm_status st = LM_OK;
    int rank0 = lm_dist_rank(t->dist) == 0;
    if (rank0) {
        st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &t->model->numel, m1);
        if (st == LM_OK) st = lm_tensor_create(lm_device_cpu(), LM_F32, 1, &t->model->numel, m2);
    }
    lm_tensor *own[2] = {t->opt->m1, t->opt->m2}, *host[2] = {NULL, NULL};
    for (int k = 0; k < 2 && st == LM_OK; k++)
        if (!lm__device_host_addressable(lm_tensor_device(own[k])))
            st = lm_tensor_to_device(ctx, own[k], lm_device_cpu(), &host[k]);
    double any = st != LM_OK; /* any rank's failure, so every rank skips the gathers together */
    lm_status bst = lm_dist_allreduce_sum_f64(t->dist, &any, 1);
    lm_tensor *full[2] = {*m1, *m2};
    for (int k = 0; k < 2 && bst == LM_OK && any == 0; k++)
        bst = lm__dist_gather_f32(t->dist, lm_tensor_data(host[k] ? host[k] : own[k]),
                                  rank0 ? lm_tensor_data(full[k]) : NULL, t->bounds);
    if (bst == LM_OK && any > 0 && st == LM_OK)
        bst = lm__error(LM_OUT_OF_MEMORY, "another rank cannot stage its optimizer moments for the checkpoint");
    if (bst == LM_OK) bst = st;
    lm_tensor_destroy(host[0]), lm_tensor_destroy(host[1]);
    if (bst != LM_OK) {
        lm_tensor_destroy(*m1), lm_tensor_destroy(*m2);
        *m1 = *m2 = NULL;
    }
    return bst;
}

lm_status lm_trainer_save(lm_trainer *t, lm_ctx *ctx, const char *dir, const char *tokenizer_path) {
    if (!t || !ctx || !dir) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_save: NULL argument");
    int64_t tr = lm_trace_begin();
    lm_status st = LM_OK;
    lm_tensor *full1 = NULL, *full2 = NULL; /* ZeRO-1: the gathered moments (rank 0) */
    LM_TRY(ensure_opt(t));
    if (lm_dist_size(t->dist) > 1) { /* under ZeRO-1 the weights alone are replicas; the moments are slices */
        const lm_tensor *bufs[3] = {t->model->flat, t->opt->m1, t->opt->m2};
        LM_TRY(lm__dist_check_replicas(t->dist, ctx, bufs, t->bounds ? 1 : 3));
    }
    if (t->bounds && lm_dist_size(t->dist) > 1) LM_TRY(gather_moments(t, ctx, &full1, &full2));
    if (lm_dist_rank(t->dist) == 0)
        st = save(t, ctx, dir, tokenizer_path, full1 ? full1 : t->opt->m1, full2 ? full2 : t->opt->m2);
    lm_tensor_destroy(full1);
    lm_tensor_destroy(full2);
    if (lm_dist_size(t->dist) > 1) { /* the others wait for rank 0's outcome and return it */
        int32_t code = (int32_t)st;
        LM_TRY(lm_dist_broadcast(t->dist, &code, sizeof code, 0));
        if (lm_dist_rank(t->dist) != 0 && code != LM_OK)
            st = lm__error((lm_status)code, "checkpoint '%s': rank 0 could not save it", dir);
    }
    lm_trace_end(tr, "train", "checkpoint save", dir);
    return st;
}

static lm_status save(lm_trainer *t, lm_ctx *ctx, const char *dir, const char *tokenizer_path, const lm_tensor *m1,
                      const lm_tensor *m2) {
    char tmp[4096], old[4096], parent[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp-%ld", dir, (long)getpid());
    snprintf(old, sizeof old, "%s.old-%ld", dir, (long)getpid());
    t->saves++;
    lm_status st = remove_dir(tmp); /* a leftover of an interrupted save by an earlier process of this id */
    if (st == LM_OK && mkdir(tmp, 0755) != 0) st = sys_fail("cannot create directory", tmp);
    if (st != LM_OK) return lm__error_context(st, "checkpoint '%s'", dir);
    st = lm_train_model_save(t->model, ctx, tmp, tokenizer_path);
    if (st == LM_OK) {
        test_kill_point(t, "after-weights");
        st = write_state(t, ctx, tmp, m1, m2); /* last: its presence marks the directory complete */
    }
    if (st == LM_OK) {
        test_kill_point(t, "after-state");
        st = lm_dir_sync(tmp);
    }
    const char *replaced = NULL;
    if (st == LM_OK) {
        test_kill_point(t, "before-swap");
        st = put_in_place(t, tmp, dir, old, &replaced);
    }
    if (st != LM_OK) {
        char keep[1024]; /* the size of the error buffer; remove_dir may record its own */
        snprintf(keep, sizeof keep, "%s", lm_last_error());
        remove_dir(tmp);
        lm__error(st, "%s", keep);
        return lm__error_context(st, "checkpoint '%s'", dir);
    }
    parent_of(dir, parent, sizeof parent);
    st = lm_dir_sync(parent); /* a leftover replaced checkpoint is removed at the next start */
    if (st != LM_OK) return lm__error_context(st, "checkpoint '%s'", dir);
    test_kill_point(t, "before-remove-old");
    /* the new checkpoint is in place: failing to remove the old one is only untidy */
    if (replaced && remove_replaced(t, replaced) != LM_OK)
        lm__log(LM_LOG_WARN, "checkpoint '%s' saved, but the previous one is left in '%s': %s", dir, replaced,
                lm_last_error());
    return LM_OK;
}

/* The files of a complete checkpoint are present (train_state.bin unchecked). */
static lm_status check_files(const char *dir) {
    struct stat sb;
    if (stat(dir, &sb) != 0) return sys_fail("cannot open checkpoint", dir);
    if (!S_ISDIR(sb.st_mode)) return lm__error(LM_INVALID_ARGUMENT, "checkpoint '%s' is not a directory", dir);
    static const char *const need[] = {"config.json", "model.safetensors", "train_state.bin"};
    char missing[256] = "", path[4200];
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, need[i]);
        if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode))
            snprintf(missing + strlen(missing), sizeof missing - strlen(missing), "%s%s", missing[0] ? ", " : "",
                     need[i]);
    }
    if (missing[0])
        return lm__error(LM_NOT_FOUND, "checkpoint '%s' is incomplete (missing %s): a directory left by an interrupted "
                                       "save?",
                         dir, missing);
    return LM_OK;
}

lm_status lm_train_checkpoint_check(const char *dir, int64_t *step) {
    if (!dir) return lm__error(LM_INVALID_ARGUMENT, "lm_train_checkpoint_check: NULL directory");
    LM_TRY(check_files(dir));
    char path[4200];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    lm__train_state s;
    LM_TRY(lm__train_state_check(path, &s));
    if (step) *step = s.step;
    return LM_OK;
}

/* name = BASE.tmp-PID or BASE.old-PID: returns PID and sets *is_old; 0 for any other name. */
static long leftover_pid(const char *name, int *is_old) {
    const char *dot = strrchr(name, '.');
    if (!dot || dot == name || (strncmp(dot, ".tmp-", 5) && strncmp(dot, ".old-", 5)) || !dot[5]) return 0;
    long pid = 0;
    for (const char *p = dot + 5; *p; p++) {
        if (*p < '0' || *p > '9' || pid > INT_MAX / 10) return 0;
        pid = pid * 10 + (*p - '0');
    }
    *is_old = dot[1] == 'o';
    return pid;
}

/* Whether a process of that id runs (EPERM: it does, under another user). */
static int process_runs(long pid) { return pid == (long)getpid() || kill((pid_t)pid, 0) == 0 || errno != ESRCH; }

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

static void report_line(lm_train_report_fn report, void *user, const char *fmt, ...) LM__PRINTF(3, 4);
static void report_line(lm_train_report_fn report, void *user, const char *fmt, ...) {
    if (!report) return;
    char line[9000];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    report(user, line);
}

/* The leftovers of dead processes among the entries of out, sorted (so recovery is
 * deterministic). Caller frees each name and the array. */
static lm_status list_leftovers(const char *out, char ***names, int64_t *n) {
    *names = NULL, *n = 0;
    DIR *d = opendir(out);
    if (!d) return errno == ENOENT ? LM_OK : sys_fail("cannot open directory", out);
    int64_t cap = 0;
    lm_status st = LM_OK;
    struct dirent *e;
    int is_old;
    while (st == LM_OK && (e = readdir(d)) != NULL) {
        long pid = leftover_pid(e->d_name, &is_old);
        if (pid <= 0 || process_runs(pid)) continue;
        char *copy = lm__strdup(e->d_name);
        st = copy ? LM__PUSH(*names, *n, cap, copy) : LM_OUT_OF_MEMORY;
        if (st != LM_OK) lm__free(copy);
    }
    closedir(d);
    if (*n > 1) qsort(*names, (size_t)*n, sizeof **names, cmp_names);
    return st;
}

lm_status lm_train_checkpoints_recover(const char *out, lm_train_report_fn report, void *user) {
    if (!out) return lm__error(LM_INVALID_ARGUMENT, "lm_train_checkpoints_recover: NULL directory");
    char **names = NULL;
    int64_t n = 0;
    lm_status st = list_leftovers(out, &names, &n);
    char path[4400], base[4400];
    struct stat sb;
    int is_old, changed = 0;
    /* first the restores, so that no removal can take the only copy of a checkpoint */
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        long pid = leftover_pid(names[i], &is_old);
        snprintf(path, sizeof path, "%s/%s", out, names[i]);
        snprintf(base, sizeof base, "%s/%.*s", out, (int)(strrchr(names[i], '.') - names[i]), names[i]);
        if (!is_old || lstat(base, &sb) == 0 || errno != ENOENT || lm_train_checkpoint_check(path, NULL) != LM_OK)
            continue;
        if (rename(path, base) != 0) st = sys_fail("cannot restore a checkpoint from", path);
        else {
            changed = 1;
            names[i][0] = '\0'; /* handled */
            report_line(report, user, "restored '%s' from '%s' (process %ld stopped between the renames of a save)",
                        base, path, pid);
        }
    }
    for (int64_t i = 0; st == LM_OK && i < n; i++) {
        if (!names[i][0]) continue;
        long pid = leftover_pid(names[i], &is_old);
        snprintf(path, sizeof path, "%s/%s", out, names[i]);
        if (lstat(path, &sb) != 0) continue; /* gone meanwhile */
        st = S_ISDIR(sb.st_mode) ? remove_dir(path) : unlink(path) == 0 ? LM_OK : sys_fail("cannot remove", path);
        if (st == LM_OK) {
            changed = 1;
            report_line(report, user, "removed '%s', left by process %ld (no longer running)", path, pid);
        }
    }
    if (st == LM_OK && changed) st = lm_dir_sync(out);
    for (int64_t i = 0; i < n; i++) lm__free(names[i]);
    lm__free(names);
    return st;
}

lm_status lm_trainer_resume(lm_trainer *t, lm_ctx *ctx, const char *dir) {
    if (!t || !ctx || !dir) return lm__error(LM_INVALID_ARGUMENT, "lm_trainer_resume: NULL argument");
    LM_TRY(check_files(dir));
    drop_graph(t); /* recaptured by the next steps (the state may land in new tensors) */
    t->dev_steps = 0;
    char path[4096];
    snprintf(path, sizeof path, "%s/train_state.bin", dir);
    lm_tensor *m1 = NULL, *m2 = NULL;
    lm__train_state s;
    const lm_train_model *m = t->model;
    LM_TRY(ensure_opt(t));
    /* the optimizer's range: everything, or under ZeRO-1 this rank's slice */
    int64_t lo = t->opt->lo, n_own = t->opt->hi - t->opt->lo;
    lm_status st = lm_tensor_create(m->device, LM_F32, 1, &n_own, &m1);
    if (st == LM_OK) st = lm_tensor_create(m->device, LM_F32, 1, &n_own, &m2);
    if (st == LM_OK) st = lm__train_state_read_range(path, m->numel, m->nparams, lo, &s, m1, m2);
    if (st == LM_OK && (s.batch != t->o.batch || s.seq != t->o.seq || s.grad_accum != global_accum(t)))
        st = lm__error(LM_INVALID_ARGUMENT, "training state '%s' was saved with batch %lld, seq %lld and %lld "
                                            "micro-batches per step (ranks x grad_accum); resuming with batch %d, seq "
                                            "%lld and %d x %d = %lld would not replay the same batches",
                       path, (long long)s.batch, (long long)s.seq, (long long)s.grad_accum, t->o.batch, (long long)t->o.seq,
                       lm_dist_size(t->dist), t->o.grad_accum, (long long)global_accum(t));
    if (st == LM_OK && s.data.cursor > lm_data_loader_windows(t->data))
        st = lm__error(LM_OUT_OF_RANGE, "training state '%s': data position %lld is beyond the %lld windows of this data "
                                        "set (was it saved for other data?)",
                       path, (long long)s.data.cursor, (long long)lm_data_loader_windows(t->data));
    if (st == LM_OK) { /* commit: copy the moments in, then the data position (cannot fail now) */
        lm_tensor *keep1 = t->opt->m1, *keep2 = t->opt->m2;
        size_t n = (size_t)n_own * sizeof(float);
        if (n) st = lm_device_copy(m->device, lm_tensor_data(keep1), m->device, lm_tensor_data(m1), n);
        if (st == LM_OK && n) st = lm_device_copy(m->device, lm_tensor_data(keep2), m->device, lm_tensor_data(m2), n);
        if (st == LM_OK) st = lm_data_loader_set_state(t->data, &s.data);
        if (st == LM_OK) t->opt->steps = s.step;
    }
    lm_tensor_destroy(m1);
    lm_tensor_destroy(m2);
    return st;
}
