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
#include "loom/graph.h"
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
    /* step.c: what one step builds and the next can reuse (the shape, compute dtype
     * and output it was made for; rebuilt when one changes): the prepared training
     * graph per output (loss, all logits) and the [B, T] positions on the device */
    struct lm__train_cached_graph {
        lm_graph *g;
        int B;
        int64_t T;
        lm_dtype dt;
    } graphs[2];
    lm_tensor *positions;
    /* bumped whenever positions, flat_low or the weights' storage are replaced: a
     * captured step recorded before reads the old addresses and must be recaptured */
    int64_t layout_gen;
};

/* The optimizer updates the elements [lo, hi) of the flat parameter space: all of it
 * (lo = 0, hi = numel), or under ZeRO-1 this rank's slice. The range is cut into
 * pieces, one per tensor it meets (a slice may start or end inside a tensor; weight
 * decay is per tensor), each piece a view over flat, flat_grad and the moments. */
struct lm_optimizer {
    lm_train_model *m;
    lm_adamw_config c;
    int64_t lo, hi;                /* the flat range updated, 0 <= lo <= hi <= numel */
    lm_tensor *m1, *m2;            /* [hi - lo] f32 first and second moments of that range */
    int npieces;
    /* [npieces] views per piece: a whole tensor keeps its shape, a cut one is 1-D */
    lm_tensor_view *pv, *gv, *mv, *vv;
    float *wd;                     /* [npieces] weight decay of each piece's tensor */
    int64_t steps;
};

/* ---- optimizer.c ---- */
/* LM_INVALID_ARGUMENT naming the values unless betas lie in [0, 1), eps > 0, decay >= 0. */
lm_status lm__adamw_config_check(const lm_adamw_config *c);
/* An optimizer over the flat elements [lo, hi) of m only (moments for those alone). */
lm_status lm__optimizer_create_range(lm_train_model *m, const lm_adamw_config *c, int64_t lo, int64_t hi,
                                     lm_optimizer **out);
/* *sumsq = sum of g^2 over the gradient elements of o's range, accumulated in double
 * (the unsharded norm's partial sum: summed over the ranks, then rounded to f32 as
 * lm_sum_squares_out rounds its result, it gives the same norm up to the order of the
 * double additions). */
lm_status lm__optimizer_grad_sumsq(const lm_optimizer *o, lm_ctx *ctx, double *sumsq);
/* A captured step's optimizer (CUDA): out = the device values of update steps + 1 at
 * learning rate lr ({lr, lr / (1 - beta1^step) and sqrt(1 - beta2^step) rounded to f32
 * as lm_adamw_update rounds them, 1 for the clipping coefficient, which the step's
 * lm__clip_scale_out writes}); lm__optimizer_step_dyn queues the update reading them
 * from dyn (lm__adamw_update_dyn) and counts it; lm__optimizer_count_step counts an
 * update a captured step's replay made. */
void lm__optimizer_dyn_values(const lm_optimizer *o, double lr, double out[4]);
lm_status lm__optimizer_step_dyn(lm_optimizer *o, lm_ctx *ctx, const lm_tensor_view *dyn);
void lm__optimizer_count_step(lm_optimizer *o);

/* ---- model.c ---- */
/* Index of the parameter called name, or -1. */
int lm__train_find(const lm_train_model *m, const char *name);
/* train/step.c: lm_train_model_forward_backward over ids [B, T] and targets [B * T]
 * (i32) already on the model's device, whose loss (f32) goes to the device address
 * loss: nothing waits for the device (a captured step may hold it). refresh_low: the
 * bf16 weight copies are refreshed from the masters first. */
lm_status lm__train_model_forward_backward_dev(lm_train_model *m, lm_ctx *ctx, lm_tensor *ids, lm_tensor *targets,
                                               int B, int64_t T, float grad_scale, void *loss, int refresh_low);
/* step.c: lm_train_model_forward_backward that also calls done(user, i) once per
 * parameter i during the backward, right after the last contribution to its gradient
 * was queued (in the order the backward finishes them; the buffer holds the final
 * gradient once the work queued so far has run). done NULL: none. A non-OK status
 * from done aborts the backward. refresh_low 0 skips refreshing the bf16 weight copies
 * from the f32 masters: only for a caller that knows the masters have not changed since
 * the last forward (the trainer's 2nd..A-th micro-batch of a step). */
typedef lm_status (*lm__param_done_fn)(void *user, int param);
lm_status lm__train_model_forward_backward_notify(lm_train_model *m, lm_ctx *ctx, const int32_t *ids,
                                                  const int32_t *targets, int B, int64_t T, float grad_scale,
                                                  float *loss, lm__param_done_fn done, void *user, int refresh_low);

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
/* The same, copying only the moments' elements [first, first + numel(m1)) into m1
 * and m2 (one ZeRO-1 rank's slice; the whole file is still validated). */
lm_status lm__train_state_read_range(const char *path, int64_t expect_numel, int64_t expect_nparams, int64_t first,
                                     lm__train_state *s, lm_tensor *m1, lm_tensor *m2);
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

/* ZeRO-1 collectives over a flat host f32 buffer split into the ranks' contiguous
 * slices: rank r owns [bounds[r], bounds[r + 1]) of [0, bounds[size]). Identities in a
 * world of one. Slices of up to 2^30 elements use one MPI_Reduce_scatter /
 * MPI_Allgatherv / MPI_Gatherv; larger ones go root by root in pieces of 2^30 (MPI
 * counts are int). */
/* buf[own slice] = its sum over the ranks; the rest of buf is left undefined. */
lm_status lm__dist_reduce_scatter_f32(lm_dist *d, float *buf, const int64_t *bounds);
/* Every rank's slice of buf is copied into every other rank's buf. */
lm_status lm__dist_allgather_f32(lm_dist *d, float *buf, const int64_t *bounds);
/* Rank 0's full[0, bounds[size]) = every rank's mine (its slice's elements); full is
 * only read on rank 0 (may be NULL elsewhere). */
lm_status lm__dist_gather_f32(lm_dist *d, const float *mine, float *full, const int64_t *bounds);

/* ---- dist_cuda.c (dist_nocuda.c without CUDA or nccl.h): collectives on GPU buffers ---- */
/* A NCCL communicator of n ranks, one GPU each (a rank's buffers live on its GPU).
 * NCCL is loaded at the first call (libnccl.so.2 or $LOOM_NCCL_LIBRARY); every entry
 * point answers LM_UNSUPPORTED, saying why, when it cannot be. Collectives are queued
 * on ctx's stream (ctx on the communicator's GPU) and return without waiting; every
 * rank must call them in the same order. */
typedef struct lm__nccl lm__nccl;
#define LM__NCCL_ID_BYTES 128
/* Loads NCCL (LM_OK when it can be used here). */
lm_status lm__nccl_load(void);
/* NCCL's version number (e.g. 22703 for 2.27.3), 0 when it is not loaded. */
int lm__nccl_version(void);
/* The id one rank makes and every rank passes to lm__nccl_create. */
lm_status lm__nccl_unique_id(unsigned char id[LM__NCCL_ID_BYTES]);
/* Joins the communicator as `rank` of `nranks` on GPU dev (collective: blocks until
 * every rank has joined). */
lm_status lm__nccl_create(int nranks, int rank, const unsigned char id[LM__NCCL_ID_BYTES], lm_device dev,
                          lm__nccl **out);
void lm__nccl_destroy(lm__nccl *c);
/* buf[0, n) = its sum over the ranks, in place, on the communicator's own stream after
 * the work queued on ctx's stream so far (so it overlaps what ctx queues next);
 * lm__nccl_join makes ctx's stream wait for every such all-reduce queued before it. */
lm_status lm__nccl_allreduce_f32_overlapped(lm__nccl *c, lm_ctx *ctx, float *buf, int64_t n);
lm_status lm__nccl_join(lm__nccl *c, lm_ctx *ctx);
/* The ZeRO-1 pair over slices (bounds as above, any sizes): this rank's slice of buf
 * becomes its sum over the ranks (the rest of buf is left as it was); then every
 * rank's slice is copied into every other rank's buf. */
lm_status lm__nccl_reduce_scatter_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds);
lm_status lm__nccl_allgather_f32(lm__nccl *c, lm_ctx *ctx, float *buf, const int64_t *bounds);
/* dist.c: the communicator of d's ranks on dev. Every rank first loads NCCL and they
 * agree: when any rank cannot, every rank returns LM_UNSUPPORTED (naming the rank and
 * the reason) and none is left waiting; then rank 0 makes the id and broadcasts it. */
lm_status lm__dist_nccl_create(lm_dist *d, lm_device dev, lm__nccl **out);

#endif
